//! VolumeBinding: a pod's PersistentVolumeClaims decide where it may run, as kube-scheduler's
//! plugin of that name, with the provisioning flow of skiff's CSI design.
//!
//! - PreFilter (once per pod): a claim that does not exist or is being deleted, or an
//!   unbound claim of an Immediate class (the binder or provisioner binds those without
//!   waiting for a pod), makes the pod unschedulable on every node.
//! - Filter (per node): a bound claim's volume must admit the node (its required node
//!   affinity); an unbound claim of a WaitForFirstConsumer class that already carries
//!   `volume.kubernetes.io/selected-node` admits only that node; one without admits any node
//!   if its class has a provisioner, else only nodes some free static volume of its class
//!   reaches.
//! - PreBind (after the node is chosen, in the binding task): unbound WaitForFirstConsumer
//!   claims get `selected-node` set to the node, and the pod is not bound but waits,
//!   quietly, until its claims change (the queue is woken by claim and volume events of its
//!   own claims); once every claim is Bound the pod binds as usual.
//!
//! The claims, volumes and classes are read from the scheduler's informers (lock-free
//! snapshots per object); free volumes are indexed by class, so a claim looks only at the
//! free volumes of its own class.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use crate::controllers::persistentvolume::{
    self as pvb, claim_class, delays_binding, free_volumes_of_class, node_affinity_admits,
    volume_name, volume_satisfies, ANN_SELECTED_NODE, NO_PROVISIONER,
};
use crate::runtime::{Informer, ObjectKey};

pub const CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const NO_VOLUMES: &str = "node(s) didn't find available persistent volumes to bind";
pub const SELECTED_ELSEWHERE: &str =
    "node(s) didn't match the node selected for a PersistentVolumeClaim";
pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";

/// The scheduler's caches of claims, volumes (with the binder's indexes) and classes.
#[derive(Clone)]
pub struct Listers {
    pub claims: Informer<PersistentVolumeClaim>,
    pub volumes: Informer<PersistentVolume>,
    pub classes: Informer<StorageClass>,
}

impl fmt::Debug for Listers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listers")
            .field("claims", &self.claims.len())
            .field("volumes", &self.volumes.len())
            .field("classes", &self.classes.len())
            .finish()
    }
}

/// `namespace/name` of every claim the pod's volumes use (generic ephemeral volumes
/// included: their claim is `<pod>-<volume>`).
pub fn claims_of(pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(format!("{ns}/{}", c.claim_name))
            } else if v.ephemeral.is_some() {
                Some(format!("{ns}/{pod_name}-{}", v.name))
            } else {
                None
            }
        })
        .collect()
}

fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// What one pod's claims ask of each node.
#[derive(Debug, Default)]
pub struct FilterState {
    /// Volumes of bound claims: each must admit the node.
    bound: Vec<Arc<PersistentVolume>>,
    /// Nodes selected for unbound claims: the node must be each of them.
    selected: Vec<String>,
    /// Per unbound claim of a class without a provisioner: the free volumes that could serve
    /// it; one of them must admit the node.
    static_only: Vec<Vec<Arc<PersistentVolume>>>,
}

/// Whether `class` has a provisioner that creates volumes on demand.
fn provisions(class: &StorageClass) -> bool {
    !class.provisioner.is_empty() && class.provisioner != NO_PROVISIONER
}

fn unresolvable(reason: String) -> Rejection {
    Rejection::new(
        Plugin::VolumeBinding,
        Code::UnschedulableAndUnresolvable,
        reason,
    )
}

/// The pod's claims, checked once per cycle. Ok(None): the pod uses no claims.
pub fn pre_filter(pod: &PodInfo, listers: &Listers) -> Result<Option<FilterState>, Rejection> {
    let keys = claims_of(&pod.pod);
    if keys.is_empty() {
        return Ok(None);
    }
    let mut state = FilterState::default();
    let mut immediate = false;
    for key in &keys {
        let (ns, name) = split(key);
        let Some(claim) = listers.claims.get_namespaced(ns, name) else {
            return Err(unresolvable(format!(
                "persistentvolumeclaim {name:?} not found"
            )));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(unresolvable(format!(
                "persistentvolumeclaim {name:?} is being deleted"
            )));
        }
        if let Some(v) = volume_name(&claim) {
            match listers.volumes.get(&ObjectKey::cluster(v)) {
                Some(pv) => state.bound.push(pv),
                None => {
                    return Err(unresolvable(format!(
                        "persistentvolume {v:?} bound to persistentvolumeclaim {name:?} not found"
                    )))
                }
            }
            continue;
        }
        let class_name = claim_class(&claim);
        let class = (!class_name.is_empty())
            .then(|| listers.classes.get(&ObjectKey::cluster(&class_name)))
            .flatten();
        match class {
            Some(c) if delays_binding(&c) => {
                if let Some(n) = claim
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_SELECTED_NODE))
                    .filter(|n| !n.is_empty())
                {
                    state.selected.push(n.clone());
                } else if !provisions(&c) {
                    let free: Vec<_> = free_volumes_of_class(&listers.volumes, &class_name)
                        .into_iter()
                        .filter(|pv| pvb::is_free(pv) && volume_satisfies(pv, &claim).is_ok())
                        .collect();
                    state.static_only.push(free);
                }
            }
            None if !class_name.is_empty() => {
                return Err(unresolvable(format!(
                    "storageclass.storage.k8s.io {class_name:?} not found"
                )));
            }
            _ => immediate = true,
        }
    }
    if immediate {
        return Err(unresolvable(UNBOUND_IMMEDIATE.to_string()));
    }
    Ok(Some(state))
}

/// Whether `node` can serve the pod's claims.
pub fn filter(state: &FilterState, node: &NodeInfo) -> Result<(), Rejection> {
    let Some(n) = node.node() else {
        return Ok(());
    };
    if state.bound.iter().any(|pv| !node_affinity_admits(pv, n)) {
        return Err(unresolvable(CONFLICT.to_string()));
    }
    if state.selected.iter().any(|s| s != node.name()) {
        return Err(unresolvable(SELECTED_ELSEWHERE.to_string()));
    }
    if state
        .static_only
        .iter()
        .any(|free| !free.iter().any(|pv| node_affinity_admits(pv, n)))
    {
        return Err(unresolvable(NO_VOLUMES.to_string()));
    }
    Ok(())
}

/// The pod's unbound claims of WaitForFirstConsumer classes with a provisioner (those
/// PreBind hands to the provisioner by selecting a node), and whether any claim of the pod
/// is still unbound (the pod then waits instead of binding).
pub fn unbound_claims(pod: &Pod, listers: &Listers) -> (Vec<Arc<PersistentVolumeClaim>>, bool) {
    let mut to_select = Vec::new();
    let mut unbound = false;
    for key in claims_of(pod) {
        let (ns, name) = split(&key);
        let Some(claim) = listers.claims.get_namespaced(ns, name) else {
            unbound = true;
            continue;
        };
        if volume_name(&claim).is_some() {
            continue;
        }
        unbound = true;
        let class_name = claim_class(&claim);
        if listers
            .classes
            .get(&ObjectKey::cluster(&class_name))
            .is_some_and(|c| delays_binding(&c))
        {
            to_select.push(claim);
        }
    }
    (to_select, unbound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_of_a_pod_include_ephemeral_ones() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "tmp", "emptyDir": {}}
            ]}
        }))
        .unwrap();
        assert_eq!(claims_of(&pod), ["ns/data-web-0", "ns/web-0-scratch"]);
    }
}
