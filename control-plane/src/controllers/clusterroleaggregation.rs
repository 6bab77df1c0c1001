//! ClusterRole aggregation (Kubernetes' clusterrole-aggregation controller): a ClusterRole
//! with an `aggregationRule` gets, as its rules, the rules of every other ClusterRole whose
//! labels match one of its selectors (in name order, each rule once). So `admin`, `edit` and
//! `view` grow when a role labelled `rbac.authorization.k8s.io/aggregate-to-view: "true"`
//! appears. A change to any ClusterRole re-queues only the aggregating roles (an index).

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::Context;
use crate::machinery::LabelSelector;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "clusterrole-aggregation";
const AGGREGATING: &str = "aggregating";

pub struct AggregationController {
    client: Client,
    roles: Informer<ClusterRole>,
}

pub fn build(ctx: &Context) -> Controller<AggregationController> {
    let roles = ctx.informers.get::<ClusterRole>();
    roles.add_index(AGGREGATING, |r: &ClusterRole| {
        if r.aggregation_rule.is_some() {
            vec![String::new()]
        } else {
            vec![]
        }
    });
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let (q, rs) = (queue.clone(), roles.clone());
    roles.on_change(move |_: &Change<ClusterRole>| {
        // Any role may now match (or stop matching) a selector: every aggregating role looks
        // again; there are few of them.
        for r in rs.by_index(AGGREGATING, "") {
            q.add(ObjectKey::of(r.as_ref()));
        }
    });
    let c = AggregationController {
        client: ctx.client.clone(),
        roles,
    };
    Controller::new(NAME, Arc::new(c), queue, 1, ctx.metrics.clone())
}

/// The rules `role` should have: those of every other role matching its selectors, by name,
/// each once (None: it does not aggregate).
pub fn aggregated_rules(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let selectors: Vec<LabelSelector> = role
        .aggregation_rule
        .as_ref()?
        .cluster_role_selectors
        .iter()
        .flatten()
        .filter_map(|s| LabelSelector::from_meta(s).ok())
        .collect();
    let mut sources: Vec<&Arc<ClusterRole>> = all
        .iter()
        .filter(|r| r.name_any() != role.name_any())
        .filter(|r| {
            let labels = r.metadata.labels.clone().unwrap_or_default();
            selectors.iter().any(|s| s.matches(&labels))
        })
        .collect();
    sources.sort_by_key(|r| r.name_any());
    let mut rules: Vec<PolicyRule> = vec![];
    for r in sources {
        for rule in r.rules.iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    Some(rules)
}

impl Reconciler for AggregationController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(role) = self.roles.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let Some(rules) = aggregated_rules(&role, &self.roles.list()) else {
            return Ok(Action::AwaitChange);
        };
        if role.rules.as_deref().unwrap_or_default() == rules.as_slice() {
            return Ok(Action::AwaitChange);
        }
        let api: Api<ClusterRole> = Api::all(self.client.clone());
        let patch = serde_json::json!({"rules": rules});
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(role = %key.name, rules = rules.len(), "aggregated cluster role updated");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(v: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn aggregated_rules_are_the_matching_roles_rules_by_name_once() {
        let view = role(json!({"metadata": {"name": "view"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "true"}}]}}));
        let b = role(json!({"metadata": {"name": "b", "labels": {"agg": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}));
        let a = role(json!({"metadata": {"name": "a", "labels": {"agg": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]}]}));
        let other = role(json!({"metadata": {"name": "c"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}));
        let rules = aggregated_rules(&view, &[view.clone(), b, other.clone(), a]).unwrap();
        let resources: Vec<String> = rules
            .iter()
            .map(|r| r.resources.clone().unwrap().join(","))
            .collect();
        assert_eq!(resources, vec!["pods", "deployments"]);
        assert!(aggregated_rules(&other, &[]).is_none());
    }
}
