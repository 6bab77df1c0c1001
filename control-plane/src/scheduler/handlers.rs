//! Informer events into the cache and the queue. One watch of every pod that has not
//! finished feeds both sides, as in kube-scheduler: a pod with an empty spec.nodeName is
//! pending (the queue, if it names this scheduler), a pod with one is bound (the cache). A
//! binding arrives as one ordered update, so the queue drops the pod in the same step as the
//! cache confirms it. Node, assigned-pod and namespace changes become cluster events that may
//! move parked pods back to the queue. A pending pod's `status.nominatedNodeName` is the
//! nominator's (kube-scheduler keeps it in the queue; here the cache, read under the same
//! lock as the nodes); binding or deletion ends the nomination. PodDisruptionBudgets are kept
//! for preemption.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use super::binder::Nomination;
use super::cycle::Scheduler;
use super::hints::{node_update_matters, ClusterEvent};
use super::plugins::volume_binding::claims_of;
use super::pod_info::{PodInfo, PodUid};
use super::preemption::Budget;
use crate::controllers::persistentvolume::{self as pvb, ANN_SELECTED_NODE};
use crate::runtime::Change;
use crate::runtime::EventType;

fn assigned(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

fn finished(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

fn uid(p: &Pod) -> PodUid {
    PodUid(Arc::from(
        p.metadata
            .uid
            .as_deref()
            .unwrap_or_else(|| p.metadata.name.as_deref().unwrap_or("")),
    ))
}

impl Scheduler {
    fn event(&self, event: ClusterEvent) {
        let label = event.label();
        let moved = self.queue.on_event(event);
        self.metrics.moved(label, moved);
    }

    fn ours(&self, info: &PodInfo) -> bool {
        info.scheduler_name() == self.scheduler_name
    }

    fn pending(&self, pod: &Arc<Pod>) {
        let info = Arc::new(PodInfo::new(pod.clone()));
        if finished(pod) || !self.ours(&info) {
            self.track_claims(&info.uid, &claims_of(pod), false);
            self.queue.delete(&info.uid);
            self.cache().clear_nomination(&info.uid);
        } else {
            self.track_claims(&info.uid, &claims_of(pod), true);
            self.nominate(&info);
            self.queue.add(info);
        }
    }

    /// Records the nomination the pod's status names, or refreshes the pod a nomination the
    /// cache holds already (preemption records it before its status write comes back).
    fn nominate(&self, info: &Arc<PodInfo>) {
        let named = info
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        let mut cache = self.cache();
        let node = match named {
            Some(n) => n.to_string(),
            None => match cache.nominated_node(&info.uid) {
                Some(n) => n.to_string(),
                None => return,
            },
        };
        cache.nominate(info.clone(), &node);
    }

    fn bound(&self, pod: &Arc<Pod>) {
        let info = Arc::new(PodInfo::new(pod.clone()));
        let (previous, was_assumed) = {
            let mut cache = self.cache();
            cache.clear_nomination(&info.uid);
            let was_assumed = cache.is_assumed(&info.uid);
            (cache.upsert_pod(info.clone()), was_assumed)
        };
        match previous {
            // Our own binding confirmed: new to everyone else, as in kube-scheduler.
            Some(_) if was_assumed => self.event(ClusterEvent::PodAdded(info)),
            Some(old) if old.labels() == info.labels() && old.requests == info.requests => {}
            Some(old) => self.event(ClusterEvent::PodUpdated { old, new: info }),
            None => self.event(ClusterEvent::PodAdded(info)),
        }
    }

    fn gone(&self, pod: &Pod) {
        let uid = uid(pod);
        self.track_claims(&uid, &claims_of(pod), false);
        self.queue.delete(&uid);
        let removed = {
            let mut cache = self.cache();
            cache.clear_nomination(&uid);
            cache.remove_pod(&uid)
        };
        if let Some(info) = removed {
            self.event(ClusterEvent::PodDeleted(info));
        }
    }

    /// A change to a pod that has not finished (the watch's field selector).
    pub fn on_pod(&self, change: &Change<Pod>) {
        match change {
            Change::Added(p) | Change::Updated { new: p, .. } => {
                if !assigned(p) {
                    self.pending(p);
                } else if finished(p) {
                    self.gone(p);
                } else {
                    // Bound: no longer pending (a no-op unless it just got bound).
                    self.track_claims(&uid(p), &claims_of(p), false);
                    self.queue.delete(&uid(p));
                    self.bound(p);
                }
            }
            Change::Deleted(p) => self.gone(p),
        }
    }

    pub fn on_node(&self, change: &Change<Node>) {
        match change {
            Change::Added(n) => {
                self.cache().upsert_node(n.clone());
                self.event(ClusterEvent::NodeAdded(n.clone()));
            }
            Change::Updated { old, new } => {
                self.cache().upsert_node(new.clone());
                if node_update_matters(old, new) {
                    self.event(ClusterEvent::NodeUpdated {
                        old: old.clone(),
                        new: new.clone(),
                    });
                }
            }
            Change::Deleted(n) => {
                self.cache().remove_node(&n.name_any());
                self.event(ClusterEvent::NodeDeleted(n.clone()));
            }
        }
    }

    pub fn on_budget(&self, change: &Change<PodDisruptionBudget>) {
        match change {
            Change::Added(b) | Change::Updated { new: b, .. } => {
                self.cache().upsert_budget(Budget::new(b));
            }
            Change::Deleted(b) => self
                .cache()
                .remove_budget(&b.namespace().unwrap_or_default(), &b.name_any()),
        }
    }

    pub fn on_namespace(&self, change: &Change<Namespace>) {
        match change {
            Change::Added(ns) => {
                self.cache()
                    .set_namespace(&ns.name_any(), ns.labels().clone());
            }
            Change::Updated { old, new } => {
                self.cache()
                    .set_namespace(&new.name_any(), new.labels().clone());
                if old.labels() != new.labels() {
                    self.event(ClusterEvent::NamespaceChanged);
                }
            }
            Change::Deleted(ns) => self.cache().remove_namespace(&ns.name_any()),
        }
    }

    /// A claim changed: the pending pods using it may go on. A selected node that
    /// disappeared from a claim still unbound means its provisioner gave up: its pods fail
    /// (FailedScheduling, back-off) and the next attempt selects a node again.
    pub fn on_claim(self: &Arc<Self>, change: &Change<PersistentVolumeClaim>) {
        let claim = change.object();
        let key = pvb::claim_key(claim);
        let users = self.users_of(&key);
        if users.is_empty() {
            return;
        }
        let gave_up = match change {
            Change::Updated { old, new } => {
                let selected = |c: &PersistentVolumeClaim| {
                    c.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(ANN_SELECTED_NODE))
                };
                selected(old)
                    && !selected(new)
                    && pvb::volume_name(new).is_none()
                    && new.metadata.deletion_timestamp.is_none()
            }
            _ => false,
        };
        if gave_up {
            let message = format!(
                "running PreBind plugin \"VolumeBinding\": binding volumes: provisioning failed for PVC {:?}",
                claim.name_any()
            );
            for uid in &users {
                let Some(info) = self.queue.fail_parked(uid) else {
                    continue;
                };
                tracing::info!(pod = %info.key(), claim = %key, "provisioning failed; retrying");
                self.recorder.event(
                    info.pod.as_ref(),
                    EventType::Warning,
                    "FailedScheduling",
                    message.clone(),
                );
                let (me, msg) = (self.clone(), message.clone());
                tokio::spawn(async move {
                    if let Err(e) = me
                        .binder
                        .mark_unschedulable(&info, &msg, &Nomination::Keep)
                        .await
                    {
                        tracing::debug!(pod = %info.key(), error = %e, "setting PodScheduled=False failed");
                    }
                });
            }
        }
        let moved = self
            .queue
            .on_event_for(&users, ClusterEvent::ClaimChanged(Arc::from(key.as_str())));
        self.metrics.moved("PvcChange", moved);
    }

    /// A volume changed: the pods of the claim it is bound to may go on; a free one may
    /// serve any pod VolumeBinding rejected.
    pub fn on_volume(&self, change: &Change<PersistentVolume>) {
        if matches!(change, Change::Deleted(_)) {
            return;
        }
        let pv = change.object();
        match pvb::claim_ref_key(pv) {
            Some(key) => {
                let users = self.users_of(&key);
                if !users.is_empty() {
                    let moved = self
                        .queue
                        .on_event_for(&users, ClusterEvent::ClaimChanged(Arc::from(key.as_str())));
                    self.metrics.moved("PvcChange", moved);
                }
            }
            None => self.event(ClusterEvent::StorageChanged),
        }
    }

    pub fn on_class(&self, change: &Change<StorageClass>) {
        if !matches!(change, Change::Deleted(_)) {
            self.event(ClusterEvent::StorageChanged);
        }
    }
}
