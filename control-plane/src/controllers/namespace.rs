//! The Namespace controller: a namespace being deleted (deletionTimestamp set, `kubernetes`
//! still in spec.finalizers) is emptied of every namespaced resource the server serves
//! (deletecollection where supported, else delete one by one); while content remains (pods
//! in their grace period, objects with finalizers) its status conditions say what, and it
//! looks again when that content goes or its estimated grace period passes; once empty the
//! `kubernetes` finalizer is removed through the `finalize` subresource and the server
//! deletes the namespace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition, NamespaceStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::discovery::verbs;
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::discovery::{self, Resources, Served};
use super::{pods, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "namespace";
const FINALIZER: &str = "kubernetes";

pub struct NamespaceController {
    client: Client,
    namespaces: Informer<Namespace>,
    /// Discovered on first use (and again after a failure).
    resources: Mutex<Option<Resources>>,
}

pub fn build(ctx: &Context) -> Controller<NamespaceController> {
    let namespaces = ctx.informers.get::<Namespace>();
    let pods = ctx.informers.get::<Pod>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    namespaces.on_change(move |c| {
        if c.object().metadata.deletion_timestamp.is_some() {
            q.add(ObjectKey::of(c.object().as_ref()));
        }
    });
    // The last pods of a terminating namespace going away: look again now.
    let (q, nss) = (queue.clone(), namespaces.clone());
    pods.on_change(move |c| {
        if let Change::Deleted(p) = c {
            let ns = ObjectKey::cluster(p.namespace().unwrap_or_default());
            if nss
                .get(&ns)
                .is_some_and(|n| n.metadata.deletion_timestamp.is_some())
            {
                q.add(ns);
            }
        }
    });
    let reconciler = NamespaceController {
        client: ctx.client.clone(),
        namespaces,
        resources: Mutex::new(None),
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_namespace_syncs,
        ctx.metrics.clone(),
    )
}

fn dynamic(client: &Client, served: &Served, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &served.resource)
}

/// What is left in a namespace after a deletion pass.
#[derive(Default)]
struct Remaining {
    /// resource plural -> count
    content: BTreeMap<String, usize>,
    /// finalizer -> count
    finalizers: BTreeMap<String, usize>,
    /// The longest grace period among terminating pods (when to look again).
    grace: Duration,
}

impl Reconciler for NamespaceController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let finalizers = ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.clone())
            .unwrap_or_default();
        if ns.metadata.deletion_timestamp.is_none() || !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(Action::AwaitChange);
        }
        let resources = self.resources().await?;
        let name = ns.name_any();
        let mut failures = Vec::new();
        for served in resources
            .all()
            .filter(|s| s.namespaced && s.supports(verbs::LIST) && s.supports(verbs::DELETE))
        {
            if let Err(e) = self.delete_all(served, &name).await {
                failures.push(format!("{}: {e}", served.resource.plural));
            }
        }
        let remaining = self.remaining(&resources, &name).await?;
        self.write_conditions(&ns, &failures, &remaining).await?;
        if !failures.is_empty() {
            return Err(ReconcileError::Retry(format!(
                "deleting the content of namespace {name}: {}",
                failures.join("; ")
            )));
        }
        if !remaining.content.is_empty() {
            let wait = remaining
                .grace
                .clamp(Duration::from_secs(1), Duration::from_secs(15));
            tracing::debug!(namespace = %name, remaining = ?remaining.content, "namespace content remains");
            return Ok(Action::RequeueAfter(wait));
        }
        self.finalize(&ns).await?;
        tracing::info!(namespace = %name, "namespace emptied and finalized");
        Ok(Action::AwaitChange)
    }
}

impl NamespaceController {
    async fn resources(&self) -> Result<Resources, ReconcileError> {
        if let Some(r) = self
            .resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(r);
        }
        // One attempt per reconcile: a failure is retried with the key's back-off.
        let token = CancellationToken::new();
        token.cancel();
        let found = discovery::discover(&self.client, &token)
            .await
            .ok_or_else(|| ReconcileError::Retry("API discovery failed".into()))?;
        *self.resources.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        Ok(found)
    }

    async fn delete_all(&self, served: &Served, ns: &str) -> Result<(), kube::Error> {
        let api = dynamic(&self.client, served, ns);
        if served.supports(verbs::DELETE_COLLECTION) {
            return match api
                .delete_collection(&DeleteParams::background(), &ListParams::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if api_code(&e) == Some(404) => Ok(()),
                Err(e) => Err(e),
            };
        }
        for o in api.list_metadata(&ListParams::default()).await? {
            match api.delete(&o.name_any(), &DeleteParams::background()).await {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn remaining(
        &self,
        resources: &Resources,
        ns: &str,
    ) -> Result<Remaining, ReconcileError> {
        let mut r = Remaining::default();
        for served in resources
            .all()
            .filter(|s| s.namespaced && s.supports(verbs::LIST) && s.supports(verbs::DELETE))
        {
            let api = dynamic(&self.client, served, ns);
            let items: Vec<PartialObjectMeta<DynamicObject>> =
                api.list_metadata(&ListParams::default()).await?.items;
            if items.is_empty() {
                continue;
            }
            r.content
                .insert(served.resource.plural.clone(), items.len());
            for o in &items {
                for f in o.finalizers() {
                    *r.finalizers.entry(f.clone()).or_default() += 1;
                }
            }
            if served.resource.plural == "pods" && served.resource.group.is_empty() {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                for p in pods.list(&ListParams::default()).await? {
                    if pods::is_terminating(&p) {
                        let g = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
                        r.grace = r
                            .grace
                            .max(Duration::from_secs(u64::try_from(g).unwrap_or(0)));
                    }
                }
            }
        }
        Ok(r)
    }

    /// Kubernetes' deletion conditions, written only when they change.
    async fn write_conditions(
        &self,
        ns: &Namespace,
        failures: &[String],
        remaining: &Remaining,
    ) -> Result<(), ReconcileError> {
        let now = Time(Timestamp::now());
        let cond = |type_: &str, on: bool, reason_on: &str, reason_off: &str, message: String| {
            NamespaceCondition {
                type_: type_.into(),
                status: if on { "True" } else { "False" }.into(),
                reason: Some(if on { reason_on } else { reason_off }.into()),
                message: Some(message).filter(|m| !m.is_empty()),
                last_transition_time: Some(now.clone()),
            }
        };
        let content: Vec<String> = remaining
            .content
            .iter()
            .map(|(k, v)| format!("{k} has {v} resource instances"))
            .collect();
        let finalizers: Vec<String> = remaining
            .finalizers
            .iter()
            .map(|(k, v)| format!("{k} in {v} resource instances"))
            .collect();
        let wanted = vec![
            cond(
                "NamespaceDeletionDiscoveryFailure",
                false,
                "DiscoveryFailed",
                "ResourcesDiscovered",
                "All resources successfully discovered".into(),
            ),
            cond(
                "NamespaceDeletionGroupVersionParsingFailure",
                false,
                "GroupVersionParsingFailed",
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed".into(),
            ),
            cond(
                "NamespaceDeletionContentFailure",
                !failures.is_empty(),
                "ContentDeletionFailed",
                "ContentDeleted",
                if failures.is_empty() {
                    "All content successfully deleted, may be waiting on finalization".into()
                } else {
                    format!(
                        "Failed to delete all resource types, {} remaining: {}",
                        failures.len(),
                        failures.join(", ")
                    )
                },
            ),
            cond(
                "NamespaceContentRemaining",
                !content.is_empty(),
                "SomeResourcesRemain",
                "ContentRemoved",
                if content.is_empty() {
                    "All content successfully removed".into()
                } else {
                    format!("Some resources are remaining: {}", content.join(", "))
                },
            ),
            cond(
                "NamespaceFinalizersRemaining",
                !finalizers.is_empty(),
                "SomeFinalizersRemain",
                "ContentHasNoFinalizers",
                if finalizers.is_empty() {
                    "All content-preserving finalizers finished".into()
                } else {
                    format!(
                        "Some content in the namespace has finalizers remaining: {}",
                        finalizers.join(", ")
                    )
                },
            ),
        ];
        let mut status = ns.status.clone().unwrap_or_default();
        let current = status.conditions.clone().unwrap_or_default();
        let same = |a: &NamespaceCondition, b: &NamespaceCondition| {
            a.status == b.status && a.reason == b.reason && a.message == b.message
        };
        let changed = wanted
            .iter()
            .any(|w| !current.iter().any(|c| c.type_ == w.type_ && same(c, w)));
        if !changed {
            return Ok(());
        }
        let merged: Vec<NamespaceCondition> = wanted
            .into_iter()
            .map(|w| {
                match current
                    .iter()
                    .find(|c| c.type_ == w.type_ && c.status == w.status)
                {
                    Some(c) => NamespaceCondition {
                        last_transition_time: c.last_transition_time.clone(),
                        ..w
                    },
                    None => w,
                }
            })
            .collect();
        status.conditions = Some(merged);
        let mut updated = ns.clone();
        updated.status = Some(NamespaceStatus { ..status });
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api
            .replace_status(&ns.name_any(), &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404) | Some(409)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the `kubernetes` finalizer through `namespaces/<name>/finalize`.
    async fn finalize(&self, ns: &Namespace) -> Result<(), ReconcileError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let mut current = match api.get_opt(&ns.name_any()).await? {
            Some(c) => c,
            None => return Ok(()),
        };
        let spec = current.spec.get_or_insert_with(Default::default);
        let rest: Vec<String> = spec
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FINALIZER)
            .collect();
        spec.finalizers = Some(rest);
        match api
            .replace_subresource("finalize", &ns.name_any(), &PostParams::default(), &current)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
