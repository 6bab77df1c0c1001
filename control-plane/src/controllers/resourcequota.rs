//! The resource quota controller: keeps every ResourceQuota's `status.hard` (its spec) and
//! `status.used` (what the namespace holds) current. Usage is kept incrementally: each
//! informer event adds and removes one object's usage to its namespace's tally (pods by the
//! scope facts that decide which quotas they fall under), so a quota's sync is a sum over a
//! handful of pod classes, never a list of the namespace.
//!
//! As in Kubernetes, admission charges creates to `status.used` before they are persisted;
//! this controller gives usage back ("replenishment"): when an object goes away or a pod
//! finishes, the namespace's quotas are recomputed; when a quota's spec changes, it is
//! recomputed; and every quota every `RESYNC` (what a create that admission charged but the
//! store then refused still holds is given back there).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ResourceQuota, ResourceQuotaStatus, Secret, Service,
    ServiceAccount,
};
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Context;
use crate::machinery::quota::{self, PodScopes, Usage};
use crate::runtime::informer::Cached;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "resourcequota";
/// Kubernetes' --resource-quota-sync-period default.
const RESYNC: Duration = Duration::from_secs(300);
const BY_NAMESPACE: &str = "namespace";

/// What one namespace holds, by what quotas can ask of it.
#[derive(Default, Debug)]
struct Tally {
    /// Pods' usage by scope class (quotas with scopes count only the classes they cover).
    pods: HashMap<PodScopes, Usage>,
    /// Everything else (services, object counts).
    other: Usage,
}

impl Tally {
    fn is_empty(&self) -> bool {
        self.pods.values().all(Usage::is_empty) && self.other.values().all(|q| q.is_zero())
    }
}

type Tallies = Arc<Mutex<HashMap<String, Tally>>>;

fn lock(t: &Tallies) -> std::sync::MutexGuard<'_, HashMap<String, Tally>> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct QuotaController {
    client: Client,
    quotas: Informer<ResourceQuota>,
    tallies: Tallies,
}

/// One object's contribution to its namespace.
fn contribution<K: Serialize + Resource<DynamicType = ()>>(
    obj: &K,
) -> Option<(String, Option<PodScopes>, Usage)> {
    let ns = obj.meta().namespace.clone()?;
    let group = K::group(&());
    let plural = K::plural(&());
    let v = serde_json::to_value(obj).ok()?;
    let usage = quota::usage(&group, &plural, &v);
    let scopes = (group.is_empty() && plural == "pods")
        .then(|| {
            serde_json::from_value::<Pod>(v)
                .ok()
                .map(|p| PodScopes::of(&p))
        })
        .flatten();
    Some((ns, scopes, usage))
}

fn apply(tallies: &Tallies, c: Option<(String, Option<PodScopes>, Usage)>, sign: i8) {
    let Some((ns, scopes, usage)) = c else { return };
    let mut all = lock(tallies);
    let tally = all.entry(ns.clone()).or_default();
    let target = match scopes {
        Some(s) => tally.pods.entry(s).or_default(),
        None => &mut tally.other,
    };
    if sign > 0 {
        quota::add(target, &usage);
    } else {
        quota::subtract(target, &usage);
        target.retain(|_, q| !q.is_zero());
    }
    tally.pods.retain(|_, u| !u.is_empty());
    if tally.is_empty() {
        all.remove(&ns);
    }
}

/// Keeps the tallies of one kind and queues the namespace's quotas when usage goes down.
fn follow<K>(
    informer: &Informer<K>,
    tallies: &Tallies,
    quotas: &Informer<ResourceQuota>,
    queue: &WorkQueue<ObjectKey>,
) where
    K: Cached + Serialize + Resource<DynamicType = ()>,
{
    let (t, qs, q) = (tallies.clone(), quotas.clone(), queue.clone());
    informer.on_change(move |c| {
        let (old, new) = match c {
            Change::Added(o) => (None, Some(contribution(o.as_ref()))),
            Change::Updated { old, new } => (
                Some(contribution(old.as_ref())),
                Some(contribution(new.as_ref())),
            ),
            Change::Deleted(o) => (Some(contribution(o.as_ref())), None),
        };
        let ns = old
            .as_ref()
            .or(new.as_ref())
            .and_then(|c| c.as_ref().map(|(ns, _, _)| ns.clone()));
        let went_down = match (&old, &new) {
            (Some(_), None) => true,
            (Some(Some(o)), Some(Some(n))) => {
                !quota::positive_delta(&o.2, &n.2).is_empty() || o.1 != n.1
            }
            _ => false,
        };
        if old == new {
            return;
        }
        apply(&t, old.flatten(), -1);
        apply(&t, new.flatten(), 1);
        if went_down {
            if let Some(ns) = ns {
                for quota in qs.by_index(BY_NAMESPACE, &ns) {
                    q.add(ObjectKey::of(quota.as_ref()));
                }
            }
        }
    });
}

pub fn build(ctx: &Context, token: CancellationToken) -> futures::future::BoxFuture<'static, ()> {
    let quotas = ctx.informers.get::<ResourceQuota>();
    quotas.add_index(BY_NAMESPACE, |q: &ResourceQuota| {
        q.namespace().into_iter().collect()
    });
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let tallies: Tallies = Default::default();
    follow(&ctx.informers.get::<Pod>(), &tallies, &quotas, &queue);
    follow(&ctx.informers.get::<Service>(), &tallies, &quotas, &queue);
    follow(&ctx.informers.get::<ConfigMap>(), &tallies, &quotas, &queue);
    follow(&ctx.informers.get::<Secret>(), &tallies, &quotas, &queue);
    follow(
        &ctx.informers.get::<ServiceAccount>(),
        &tallies,
        &quotas,
        &queue,
    );
    follow(&quotas, &tallies, &quotas, &queue);
    follow(
        &ctx.informers.get::<Deployment>(),
        &tallies,
        &quotas,
        &queue,
    );
    follow(
        &ctx.informers.get::<ReplicaSet>(),
        &tallies,
        &quotas,
        &queue,
    );
    follow(&ctx.informers.get::<DaemonSet>(), &tallies, &quotas, &queue);
    follow(
        &ctx.informers.get::<StatefulSet>(),
        &tallies,
        &quotas,
        &queue,
    );
    follow(&ctx.informers.get::<Job>(), &tallies, &quotas, &queue);
    follow(&ctx.informers.get::<CronJob>(), &tallies, &quotas, &queue);
    follow(
        &ctx.informers.get::<PersistentVolumeClaim>(),
        &tallies,
        &quotas,
        &queue,
    );
    let q = queue.clone();
    quotas.on_change(move |c| match c {
        Change::Added(o) | Change::Updated { new: o, .. } => {
            if needs_sync(o) {
                q.add(ObjectKey::of(o.as_ref()));
            }
        }
        Change::Deleted(_) => {}
    });
    let controller = Arc::new(QuotaController {
        client: ctx.client.clone(),
        quotas: quotas.clone(),
        tallies,
    });
    let c = Controller::new(NAME, controller, queue.clone(), 5, ctx.metrics.clone());
    Box::pin(async move {
        let resync = async {
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(RESYNC) => {}
                }
                for quota in quotas.list() {
                    queue.add(ObjectKey::of(quota.as_ref()));
                }
            }
        };
        futures::future::join(c.run(token.clone()), resync).await;
    })
}

/// A quota whose status does not yet reflect its spec (new, or its hard limits changed).
fn needs_sync(q: &ResourceQuota) -> bool {
    let spec_hard = quota::from_api(q.spec.as_ref().and_then(|s| s.hard.as_ref()));
    let status = q.status.clone().unwrap_or_default();
    let hard = quota::from_api(status.hard.as_ref());
    let used = quota::from_api(status.used.as_ref());
    spec_hard != hard || spec_hard.keys().any(|k| !used.contains_key(k))
}

impl QuotaController {
    /// What the namespace uses of the quota's resources, under its scopes.
    fn used(&self, q: &ResourceQuota) -> Usage {
        let spec = q.spec.clone().unwrap_or_default();
        let hard = quota::from_api(spec.hard.as_ref());
        let all = lock(&self.tallies);
        let mut sum = Usage::new();
        if let Some(t) = q.namespace().and_then(|ns| all.get(&ns)) {
            for (scopes, usage) in &t.pods {
                if quota::matches_scopes(&spec, Some(scopes)) {
                    quota::add(&mut sum, usage);
                }
            }
            if quota::matches_scopes(&spec, None) {
                quota::add(&mut sum, &t.other);
            }
        }
        hard.iter()
            .map(|(k, h)| {
                let zero = crate::machinery::quantity::Quantity::from_value(0, h.format());
                (k.clone(), sum.get(k).cloned().unwrap_or(zero))
            })
            .collect::<BTreeMap<_, _>>()
    }
}

impl Reconciler for QuotaController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(q) = self.quotas.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let hard = quota::from_api(q.spec.as_ref().and_then(|s| s.hard.as_ref()));
        let used = self.used(&q);
        let status = q.status.clone().unwrap_or_default();
        if quota::from_api(status.hard.as_ref()) == hard
            && quota::from_api(status.used.as_ref()) == used
        {
            return Ok(Action::AwaitChange);
        }
        let mut new = (*q).clone();
        new.status = Some(ResourceQuotaStatus {
            hard: Some(quota::to_api(&hard)),
            used: Some(quota::to_api(&used)),
        });
        let api: Api<ResourceQuota> =
            Api::namespaced(self.client.clone(), key.namespace_or_empty());
        // The informer's resourceVersion makes this a compare-and-swap: a charge admission
        // made meanwhile is not overwritten; the conflict retries from the newer quota.
        api.replace_status(&key.name, &PostParams::default(), &new)
            .await?;
        tracing::debug!(quota = %key, used = %quota::pretty(&used), "quota status updated");
        Ok(Action::AwaitChange)
    }
}
