//! The ReplicaSet controller: keeps `spec.replicas` active pods for each ReplicaSet.
//!
//! Per key: claim pods (adopt matching orphans, release owned pods whose labels no longer
//! match), then, unless creations or deletions from an earlier pass are still expected to show
//! up in the cache, create the missing pods in slow-start batches or delete the surplus in
//! Kubernetes' preference order, and write status (replicas, fullyLabeledReplicas,
//! readyReplicas, availableReplicas with minReadySeconds, observedGeneration, the
//! ReplicaFailure condition). Pod events reach their ReplicaSet through the controller
//! reference (or, for orphans, through the selectors of the ReplicaSets in the namespace).

pub mod ranking;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use super::pods;
use super::Context;
use crate::machinery::LabelSelector;
use crate::runtime::owner::{self, controller_of, BY_CONTROLLER_UID, ORPHANS_BY_NAMESPACE};
use crate::runtime::{
    Action, Change, Controller, Expectations, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

/// The most pods created or deleted in one pass (kube-controller-manager's burstReplicas).
const BURST_REPLICAS: usize = 500;

pub const NAME: &str = "replicaset";

pub struct ReplicaSetController {
    client: Client,
    sets: Informer<ReplicaSet>,
    pods: Informer<Pod>,
    expectations: Arc<Expectations<ObjectKey, ObjectKey>>,
    recorder: Recorder,
}

/// Registers the controller's informers and handlers; run the result after the informers
/// have synced.
pub fn build(ctx: &Context) -> Controller<ReplicaSetController> {
    let sets = ctx.informers.get::<ReplicaSet>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    sets.add_index(
        BY_CONTROLLER_UID,
        owner::index_by_controller_uid::<ReplicaSet>,
    );
    sets.add_index(
        ORPHANS_BY_NAMESPACE,
        owner::index_orphans_by_namespace::<ReplicaSet>,
    );
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let expectations: Arc<Expectations<ObjectKey, ObjectKey>> = Arc::default();

    let (q, exp) = (queue.clone(), expectations.clone());
    sets.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        if let Change::Deleted(_) = c {
            exp.forget(&key);
        }
        q.add(key);
    });

    let (q, exp, s) = (queue.clone(), expectations.clone(), sets.clone());
    pods.on_change(move |c| on_pod_change(c, &s, &q, &exp));

    let reconciler = ReplicaSetController {
        client: ctx.client.clone(),
        sets,
        pods,
        expectations,
        recorder: ctx.events.recorder("replicaset-controller"),
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_replicaset_syncs,
        ctx.metrics.clone(),
    )
}

/// The ReplicaSets in the pod's namespace whose selector matches it (for orphans).
fn matching_sets(sets: &Informer<ReplicaSet>, pod: &Pod) -> Vec<ObjectKey> {
    let ns = pod.namespace().unwrap_or_default();
    sets.in_namespace(&ns)
        .iter()
        .filter(|rs| {
            LabelSelector::from_optional_meta(rs.spec.as_ref().map(|s| &s.selector))
                .is_ok_and(|sel| !sel.is_everything() && sel.matches(pod.labels()))
        })
        .map(|rs| ObjectKey::of(rs.as_ref()))
        .collect()
}

fn on_pod_change(
    c: &Change<Pod>,
    sets: &Informer<ReplicaSet>,
    queue: &WorkQueue<ObjectKey>,
    exp: &Expectations<ObjectKey, ObjectKey>,
) {
    let deleted = |pod: &Pod| {
        let ns = pod.namespace().unwrap_or_default();
        if let Some(key) = controller_of(pod.meta()).and_then(|r| owner::resolve(sets, &ns, r)) {
            exp.deletion_observed(&key, &ObjectKey::of(pod));
            queue.add(key);
        }
    };
    match c {
        Change::Added(pod) => {
            if pods::is_terminating(pod) {
                // Seen for the first time already being deleted (e.g. after a relist).
                return deleted(pod);
            }
            let ns = pod.namespace().unwrap_or_default();
            match controller_of(pod.meta()) {
                Some(r) => {
                    if let Some(key) = owner::resolve(sets, &ns, r) {
                        exp.creation_observed(&key);
                        queue.add(key);
                    }
                }
                None => matching_sets(sets, pod)
                    .into_iter()
                    .for_each(|k| queue.add(k)),
            }
        }
        Change::Updated { old, new } => {
            let labels_changed = old.labels() != new.labels();
            if pods::is_terminating(new) && !pods::is_terminating(old) {
                // Graceful deletion started: the pod no longer counts, act now rather than
                // when the node finally removes it.
                deleted(new);
                if labels_changed {
                    deleted(old);
                }
                return;
            }
            let ns = new.namespace().unwrap_or_default();
            let (old_ref, new_ref) = (controller_of(old.meta()), controller_of(new.meta()));
            if old_ref != new_ref {
                if let Some(key) = old_ref.and_then(|r| owner::resolve(sets, &ns, r)) {
                    queue.add(key);
                }
            }
            match new_ref {
                Some(r) => {
                    if let Some(key) = owner::resolve(sets, &ns, r) {
                        let min_ready = sets
                            .get(&key)
                            .and_then(|rs| rs.spec.as_ref().and_then(|s| s.min_ready_seconds))
                            .unwrap_or(0);
                        if min_ready > 0 && !pods::is_ready(old) && pods::is_ready(new) {
                            // Becomes available only after minReadySeconds: look again then.
                            queue.add_after(key.clone(), secs(min_ready) + Duration::from_secs(1));
                        }
                        queue.add(key);
                    }
                }
                None => {
                    if labels_changed || old_ref != new_ref {
                        matching_sets(sets, new)
                            .into_iter()
                            .for_each(|k| queue.add(k));
                    }
                }
            }
        }
        Change::Deleted(pod) => deleted(pod),
    }
}

fn secs(s: i32) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

impl Reconciler for ReplicaSetController {
    type Key = ObjectKey;

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        crate::runtime::controller::involved(&self.sets, key, &self.recorder)
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(rs) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::AwaitChange);
        };
        let spec = rs.spec.clone().unwrap_or_default();
        let selector = match LabelSelector::from_meta(&spec.selector) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(replicaset = %key, error = %e.message, "invalid selector; not syncing");
                return Ok(Action::AwaitChange);
            }
        };
        let needs_sync =
            self.expectations.satisfied(key) && rs.metadata.deletion_timestamp.is_none();
        let claimed = owner::claim(&self.client, rs.as_ref(), &selector, &self.pods).await?;
        let active: Vec<Arc<Pod>> = claimed.into_iter().filter(|p| pods::is_active(p)).collect();
        let manage = if needs_sync {
            self.manage_replicas(key, &rs, &active).await
        } else {
            Ok(())
        };
        let now = Timestamp::now();
        let status = calculate_status(&rs, &active, manage.as_ref().err(), now);
        let status = self.update_status(&rs, status).await?;
        manage?;
        let min_ready = spec.min_ready_seconds.unwrap_or(0);
        if min_ready > 0
            && status.ready_replicas.unwrap_or(0) == spec.replicas.unwrap_or(1)
            && status.available_replicas.unwrap_or(0) != spec.replicas.unwrap_or(1)
        {
            return Ok(Action::RequeueAfter(secs(min_ready)));
        }
        Ok(Action::AwaitChange)
    }
}

impl ReplicaSetController {
    async fn manage_replicas(
        &self,
        key: &ObjectKey,
        rs: &ReplicaSet,
        active: &[Arc<Pod>],
    ) -> Result<(), ReconcileError> {
        let want =
            usize::try_from(rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)).unwrap_or(0);
        let have = active.len();
        let reference = rs.object_ref(&());
        if have < want {
            let n = (want - have).min(BURST_REPLICAS);
            self.expectations.expect_creations(key, n);
            let spec = rs.spec.clone().unwrap_or_default();
            let template = spec.template.unwrap_or_default();
            let pod = pods::from_template(
                &template,
                key.namespace_or_empty(),
                &rs.name_any(),
                owner::controller_ref(rs),
                &Default::default(),
            );
            tracing::debug!(replicaset = %key, want, have, creating = n, "too few replicas");
            let (created, err) = pods::slow_start_batch(n, || async {
                pods::create(&self.client, &self.recorder, &reference, &pod)
                    .await
                    .map(|_| ())
            })
            .await;
            // Creations that failed or were never tried will not show up in the cache.
            for _ in created..n {
                self.expectations.creation_observed(key);
            }
            if let Some(e) = err {
                return Err(e);
            }
        } else if have > want {
            let n = (have - want).min(BURST_REPLICAS);
            let related = self.related_pods(rs);
            let doomed = ranking::pods_to_delete(active.to_vec(), &related, n, Timestamp::now());
            let keys: Vec<ObjectKey> = doomed.iter().map(|p| ObjectKey::of(p.as_ref())).collect();
            self.expectations.expect_deletions(key, keys.clone());
            tracing::debug!(replicaset = %key, want, have, deleting = n, "too many replicas");
            let results =
                futures::future::join_all(doomed.iter().zip(&keys).map(|(p, k)| {
                    pods::delete(&self.client, &self.recorder, &reference, k, p.uid())
                }))
                .await;
            let mut first = None;
            for (r, k) in results.into_iter().zip(&keys) {
                if let Err(e) = r {
                    self.expectations.deletion_observed(key, k);
                    first.get_or_insert(e);
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The active pods of every ReplicaSet with the same controller as `rs` (its Deployment's
    /// other revisions), or of `rs` alone.
    fn related_pods(&self, rs: &ReplicaSet) -> Vec<Arc<Pod>> {
        let ns = rs.namespace().unwrap_or_default();
        let siblings: Vec<Arc<ReplicaSet>> = match controller_of(rs.meta()) {
            Some(owner) => self
                .sets
                .by_index(BY_CONTROLLER_UID, &owner.uid)
                .into_iter()
                .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
                .collect(),
            None => vec![Arc::new(rs.clone())],
        };
        siblings
            .iter()
            .flat_map(|s| {
                self.pods
                    .by_index(BY_CONTROLLER_UID, &s.uid().unwrap_or_default())
            })
            .filter(|p| pods::is_active(p))
            .collect()
    }

    /// Writes `status` unless it is what the ReplicaSet already has; on a conflict, retries
    /// once against the current object (as the Kubernetes controller does).
    async fn update_status(
        &self,
        rs: &ReplicaSet,
        status: ReplicaSetStatus,
    ) -> Result<ReplicaSetStatus, ReconcileError> {
        if rs.status.as_ref() == Some(&status) {
            return Ok(status);
        }
        let api: Api<ReplicaSet> =
            Api::namespaced(self.client.clone(), &rs.namespace().unwrap_or_default());
        let mut current = rs.clone();
        for attempt in 0..2 {
            current.status = Some(status.clone());
            match api
                .replace_status(&current.name_any(), &PostParams::default(), &current)
                .await
            {
                Ok(_) => return Ok(status),
                Err(e) if attempt == 0 => {
                    tracing::debug!(replicaset = %rs.name_any(), error = %e, "status update failed; retrying with the current object");
                    match api.get_opt(&rs.name_any()).await? {
                        Some(fresh) => current = fresh,
                        None => return Ok(status),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(status)
    }
}

/// The status `rs` should have with `active` pods.
fn calculate_status(
    rs: &ReplicaSet,
    active: &[Arc<Pod>],
    manage_error: Option<&ReconcileError>,
    now: Timestamp,
) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = secs(spec.min_ready_seconds.unwrap_or(0));
    let mut status = rs.status.clone().unwrap_or_default();
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(active.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let fully_labeled = count(&|p| {
        template_labels
            .iter()
            .all(|(k, v)| p.labels().get(k) == Some(v))
    });
    let ready = count(&|p| pods::is_ready(p));
    let available = count(&|p| pods::is_available(p, min_ready, now));
    let mut conditions = status.conditions.take().unwrap_or_default();
    let has_failure = conditions.iter().any(|c| c.type_ == "ReplicaFailure");
    match manage_error {
        Some(e) if !has_failure => {
            let want = spec.replicas.unwrap_or(1);
            let have = i32::try_from(active.len()).unwrap_or(i32::MAX);
            let reason = match have.cmp(&want) {
                std::cmp::Ordering::Less => "FailedCreate",
                std::cmp::Ordering::Greater => "FailedDelete",
                std::cmp::Ordering::Equal => "",
            };
            conditions.push(ReplicaSetCondition {
                type_: "ReplicaFailure".into(),
                status: "True".into(),
                reason: Some(reason.into()).filter(|r: &String| !r.is_empty()),
                message: Some(e.to_string()),
                last_transition_time: Some(Time(now)),
            });
        }
        None if has_failure => conditions.retain(|c| c.type_ != "ReplicaFailure"),
        _ => {}
    }
    status.conditions = Some(conditions).filter(|c| !c.is_empty());
    status.replicas = i32::try_from(active.len()).unwrap_or(i32::MAX);
    status.fully_labeled_replicas = Some(fully_labeled);
    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.observed_generation = rs.metadata.generation;
    status
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(labels: &[(&str, &str)], ready_at: Option<i64>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: ready_at.map(|t| {
                vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(Timestamp::from_second(t).unwrap())),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        Arc::new(p)
    }

    #[test]
    fn status_counts_labels_readiness_and_availability() {
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                generation: Some(4),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(3),
                min_ready_seconds: Some(10),
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(
                            [
                                ("app".to_string(), "web".to_string()),
                                ("tier".to_string(), "fe".to_string()),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    spec: None,
                }),
                ..Default::default()
            }),
            status: None,
        };
        let now = Timestamp::from_second(1000).unwrap();
        let active = vec![
            pod(&[("app", "web"), ("tier", "fe")], Some(900)),
            pod(&[("app", "web"), ("tier", "fe")], Some(995)),
            pod(&[("app", "web")], None),
        ];
        let s = calculate_status(&rs, &active, None, now);
        assert_eq!(s.replicas, 3);
        assert_eq!(s.fully_labeled_replicas, Some(2));
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(s.available_replicas, Some(1));
        assert_eq!(s.observed_generation, Some(4));
        assert!(s.conditions.is_none());

        let err = ReconcileError::Retry("quota exceeded".into());
        let failed = calculate_status(&rs, &active[..1], Some(&err), now);
        let c = &failed.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.reason.as_deref()),
            ("ReplicaFailure", Some("FailedCreate"))
        );
        let mut rs2 = rs.clone();
        rs2.status = Some(failed);
        assert!(calculate_status(&rs2, &active, None, now)
            .conditions
            .is_none());
    }
}
