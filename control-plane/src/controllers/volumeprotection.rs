//! The storage-object-in-use protection controllers (kube-controller-manager's
//! `pvc-protection` and `pv-protection`): admission gives every new claim the finalizer
//! `kubernetes.io/pvc-protection` and every new volume `kubernetes.io/pv-protection`, so
//! neither goes while in use; these remove the finalizer from a claim being deleted once
//! no pod that has not finished uses it, and from a volume being deleted once it is not
//! Bound.
//!
//! Scale: pods are indexed by the claims they mount (`namespace/claim`), so a claim is
//! checked in O(its pods), and a pod that finishes or goes enqueues only its own claims.
//! Only objects being deleted with the finalizer are ever reconciled.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::Context;
use crate::apiserver::admission::plugins::storage::{PVC_PROTECTION, PV_PROTECTION};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const PVC_NAME: &str = "pvc-protection";
pub const PV_NAME: &str = "pv-protection";
/// Pods by `namespace/claim` of every claim they mount.
const BY_CLAIM: &str = "volumeprotection.claims";

/// `namespace/claim` of each claim `pod` mounts.
fn claims_of(pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| format!("{ns}/{}", c.claim_name))
        .collect()
}

/// A pod that still may use its volumes: not Succeeded or Failed.
fn uses_volumes(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn deleting_with<K: Resource>(o: &K, finalizer: &str) -> bool {
    o.meta().deletion_timestamp.is_some() && o.finalizers().iter().any(|f| f == finalizer)
}

/// The merge patch that takes `finalizer` out of `o`'s finalizers, conditional on the
/// resourceVersion read (a finalizer added meanwhile is never dropped).
fn without_finalizer<K: Resource>(o: &K, finalizer: &str) -> serde_json::Value {
    let kept: Vec<&String> = o.finalizers().iter().filter(|f| *f != finalizer).collect();
    json!({"metadata": {"finalizers": kept, "resourceVersion": o.resource_version()}})
}

pub struct PvcProtection {
    client: Client,
    claims: Informer<PersistentVolumeClaim>,
    pods: Informer<Pod>,
}

pub fn build_pvc(ctx: &Context) -> Controller<PvcProtection> {
    let claims = ctx.informers.get::<PersistentVolumeClaim>();
    let pods = ctx.informers.get::<Pod>();
    pods.add_index(BY_CLAIM, claims_of);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    claims.on_change(move |c| {
        if deleting_with(c.object().as_ref(), PVC_PROTECTION) {
            q.add(ObjectKey::of(c.object().as_ref()));
        }
    });
    let q = queue.clone();
    pods.on_change(move |c| {
        // A pod that finished or went may free its claims.
        let pod = c.object();
        let gone = matches!(c, crate::runtime::Change::Deleted(_));
        if gone || !uses_volumes(pod) {
            for key in claims_of(pod) {
                if let Some((ns, name)) = key.split_once('/') {
                    q.add(ObjectKey::namespaced(ns, name));
                }
            }
        }
    });
    Controller::new(
        PVC_NAME,
        Arc::new(PvcProtection {
            client: ctx.client.clone(),
            claims,
            pods,
        }),
        queue,
        2,
        ctx.metrics.clone(),
    )
}

impl Reconciler for PvcProtection {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if !deleting_with(claim.as_ref(), PVC_PROTECTION) {
            return Ok(Action::AwaitChange);
        }
        let index = format!("{}/{}", key.namespace_or_empty(), key.name);
        if let Some(user) = self
            .pods
            .by_index(BY_CLAIM, &index)
            .into_iter()
            .find(|p| uses_volumes(p))
        {
            tracing::debug!(claim = %key, pod = %user.name_any(), "claim in use; finalizer kept");
            return Ok(Action::AwaitChange);
        }
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), key.namespace_or_empty());
        let patch = without_finalizer(claim.as_ref(), PVC_PROTECTION);
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(claim = %key, "claim no longer in use: protection removed");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            // 409: changed since the cache saw it; the change comes back through the watch.
            Err(e) => Err(e.into()),
        }
    }
}

pub struct PvProtection {
    client: Client,
    volumes: Informer<PersistentVolume>,
}

pub fn build_pv(ctx: &Context) -> Controller<PvProtection> {
    let volumes = ctx.informers.get::<PersistentVolume>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    volumes.on_change(move |c| {
        if deleting_with(c.object().as_ref(), PV_PROTECTION) {
            q.add(ObjectKey::of(c.object().as_ref()));
        }
    });
    Controller::new(
        PV_NAME,
        Arc::new(PvProtection {
            client: ctx.client.clone(),
            volumes,
        }),
        queue,
        2,
        ctx.metrics.clone(),
    )
}

/// A volume is in use while Bound to a claim.
fn bound(pv: &PersistentVolume) -> bool {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

impl Reconciler for PvProtection {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(pv) = self.volumes.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if !deleting_with(pv.as_ref(), PV_PROTECTION) || bound(&pv) {
            return Ok(Action::AwaitChange);
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let patch = without_finalizer(pv.as_ref(), PV_PROTECTION);
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(volume = %key.name, "volume not bound: protection removed");
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

    fn pod(phase: &str, claims: &[&str]) -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "volumes": volumes},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_indexed_by_the_claims_they_mount_until_they_finish() {
        assert_eq!(claims_of(&pod("Running", &["a", "b"])), ["ns/a", "ns/b"]);
        assert!(claims_of(&pod("Running", &[])).is_empty());
        assert!(uses_volumes(&pod("Running", &["a"])));
        assert!(uses_volumes(&pod("Pending", &["a"])));
        assert!(!uses_volumes(&pod("Succeeded", &["a"])));
        assert!(!uses_volumes(&pod("Failed", &["a"])));
    }

    #[test]
    fn only_our_finalizer_goes_with_the_version_read() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "7",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["example.com/keep", PVC_PROTECTION]}
        }))
        .unwrap();
        assert!(deleting_with(&claim, PVC_PROTECTION));
        assert!(!deleting_with(&claim, PV_PROTECTION));
        assert_eq!(
            without_finalizer(&claim, PVC_PROTECTION),
            json!({"metadata": {"finalizers": ["example.com/keep"], "resourceVersion": "7"}})
        );
    }
}
