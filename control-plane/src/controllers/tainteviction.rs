//! The taint-eviction controller (Kubernetes' NoExecuteTaintManager): a pod on a node with
//! NoExecute taints it does not tolerate is deleted at once; one that tolerates them for a
//! while (`tolerationSeconds`, 300 s by default for not-ready and unreachable) is deleted
//! when the shortest such toleration, counted from the taint's timeAdded, runs out; one that
//! tolerates them forever stays. Before deleting, the pod gets the DisruptionTarget
//! condition (reason DeletionByTaintManager) and a TaintManagerEviction Event. Keyed by pod:
//! a node's taint change enqueues only the pods on that node.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use super::{pods, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "taint-eviction-controller";

/// Kubernetes' Toleration.ToleratesTaint.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// When the pod must go given the node's NoExecute taints: None to stay, Some(deadline)
/// (already passed for an untolerated taint).
pub fn eviction_deadline(
    taints: &[Taint],
    tolerations: &[Toleration],
    now: Timestamp,
) -> Option<Timestamp> {
    let mut deadline: Option<Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let matching: Vec<&Toleration> =
            tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        if matching.is_empty() {
            return Some(now);
        }
        // Tolerated forever if any matching toleration has no limit.
        if matching.iter().any(|t| t.toleration_seconds.is_none()) {
            continue;
        }
        let secs = matching
            .iter()
            .filter_map(|t| t.toleration_seconds)
            .min()
            .unwrap_or(0)
            .max(0);
        let from = taint.time_added.as_ref().map_or(now, |t| t.0);
        let at =
            Timestamp::from_nanosecond(from.as_nanosecond() + i128::from(secs) * 1_000_000_000)
                .unwrap_or(now);
        deadline = Some(deadline.map_or(at, |d| d.min(at)));
    }
    deadline
}

fn no_execute(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.effect == "NoExecute")
        .collect()
}

pub struct TaintEvictionController {
    client: Client,
    pods: Informer<Pod>,
    nodes: Informer<Node>,
    recorder: Recorder,
}

pub fn build(ctx: &Context) -> Controller<TaintEvictionController> {
    let pods = ctx.informers.get::<Pod>();
    let nodes = ctx.informers.get::<Node>();
    super::index_pods(&pods);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    pods.on_change(move |c| match c {
        Change::Added(p) => {
            if pods::node_name(p).is_some() {
                q.add(ObjectKey::of(p.as_ref()));
            }
        }
        Change::Updated { old, new } => {
            let tol = |p: &Pod| p.spec.as_ref().map(|s| s.tolerations.clone());
            if pods::node_name(old) != pods::node_name(new) || tol(old) != tol(new) {
                q.add(ObjectKey::of(new.as_ref()));
            }
        }
        Change::Deleted(_) => {}
    });
    let (q, ps) = (queue.clone(), pods.clone());
    nodes.on_change(move |c| {
        let changed = match c {
            Change::Added(n) => !no_execute(n).is_empty(),
            Change::Updated { old, new } => no_execute(old) != no_execute(new),
            Change::Deleted(_) => false,
        };
        if changed {
            for p in ps.by_index(pods::BY_NODE, &c.object().name_any()) {
                q.add(ObjectKey::of(p.as_ref()));
            }
        }
    });
    let reconciler = TaintEvictionController {
        client: ctx.client.clone(),
        pods,
        nodes,
        recorder: ctx.events.recorder("taint-eviction-controller"),
    };
    Controller::new(NAME, Arc::new(reconciler), queue, 4, ctx.metrics.clone())
}

impl Reconciler for TaintEvictionController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if pods::is_terminating(&pod) {
            return Ok(Action::AwaitChange);
        }
        let Some(node) = pods::node_name(&pod).and_then(|n| self.nodes.get(&ObjectKey::cluster(n)))
        else {
            return Ok(Action::AwaitChange);
        };
        let taints = no_execute(&node);
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let now = Timestamp::now();
        let Some(deadline) = eviction_deadline(&taints, &tolerations, now) else {
            return Ok(Action::AwaitChange);
        };
        if deadline > now {
            return Ok(Action::RequeueAfter(
                pods::elapsed(now, deadline) + Duration::from_millis(10),
            ));
        }
        self.evict(&pod).await?;
        Ok(Action::AwaitChange)
    }
}

impl TaintEvictionController {
    async fn evict(&self, pod: &Pod) -> Result<(), ReconcileError> {
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let mut p = pod.clone();
        let conditions = p
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new);
        if !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
            conditions.push(PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("DeletionByTaintManager".into()),
                message: Some("Taint manager: deleting due to NoExecute taint".into()),
                last_transition_time: Some(Time(Timestamp::now())),
                ..Default::default()
            });
            match api
                .replace_status(&pod.name_any(), &PostParams::default(), &p)
                .await
            {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        self.recorder.event(
            pod,
            EventType::Normal,
            "TaintManagerEviction",
            format!("Marking for deletion Pod {ns}/{}", pod.name_any()),
        );
        tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), node = pods::node_name(pod).unwrap_or_default(), "evicting a pod from a NoExecute-tainted node");
        match api.delete(&pod.name_any(), &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, added: i64) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            value: None,
            time_added: Some(Time(Timestamp::from_second(added).unwrap())),
        }
    }

    fn toleration(key: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn deadline_is_the_shortest_toleration_from_the_taint() {
        let now = Timestamp::from_second(1000).unwrap();
        let t = [taint("node.kubernetes.io/unreachable", 990)];
        assert_eq!(eviction_deadline(&t, &[], now), Some(now));
        let tol = [
            toleration("node.kubernetes.io/unreachable", Some(300)),
            toleration("node.kubernetes.io/unreachable", Some(30)),
        ];
        assert_eq!(
            eviction_deadline(&t, &tol, now),
            Some(Timestamp::from_second(1020).unwrap())
        );
        let forever = [toleration("node.kubernetes.io/unreachable", None)];
        assert_eq!(eviction_deadline(&t, &forever, now), None);
        let everything = [Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        assert_eq!(eviction_deadline(&t, &everything, now), None);
    }

    #[test]
    fn equal_tolerations_need_the_same_value() {
        let mut t = taint("dedicated", 0);
        t.value = Some("gpu".into());
        let eq = Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("gpu".into()),
            ..Default::default()
        };
        assert!(tolerates(&eq, &t));
        let other = Toleration {
            value: Some("cpu".into()),
            ..eq.clone()
        };
        assert!(!tolerates(&other, &t));
    }
}
