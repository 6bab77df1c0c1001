//! Cluster events and queueing hints: when a node or an assigned pod changes, the queue asks,
//! for each pod parked as unschedulable, whether the change could make it fit, and only the
//! plugins that rejected that pod answer (kube-scheduler's QueueingHint). Hints may say yes
//! when unsure (a wasted retry); they never say no when a change could help (a pod stuck).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::framework::{Plugin, PluginSet};
use super::plugins::{
    inter_pod_affinity, node_affinity, node_ports, node_resources_fit, node_unschedulable,
    pod_topology_spread, taint_toleration, volume_binding,
};
use super::pod_info::PodInfo;

/// A change in the cluster that may make pending pods schedulable.
#[derive(Clone, Debug)]
pub enum ClusterEvent {
    NodeAdded(Arc<Node>),
    /// Only updates that change what scheduling reads (see [`node_update_matters`]).
    NodeUpdated {
        old: Arc<Node>,
        new: Arc<Node>,
    },
    NodeDeleted(Arc<Node>),
    /// An assigned pod appeared (bound, or seen bound at start-up).
    PodAdded(Arc<PodInfo>),
    PodUpdated {
        old: Arc<PodInfo>,
        new: Arc<PodInfo>,
    },
    /// An assigned pod was deleted or finished.
    PodDeleted(Arc<PodInfo>),
    /// Namespace labels changed (affinity terms' namespaceSelector).
    NamespaceChanged,
    /// The PersistentVolumeClaim `namespace/name` (or a volume bound to it) changed.
    ClaimChanged(Arc<str>),
    /// A free PersistentVolume or a StorageClass appeared or changed.
    StorageChanged,
}

impl ClusterEvent {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            ClusterEvent::NodeAdded(_) => "NodeAdd",
            ClusterEvent::NodeUpdated { .. } => "NodeUpdate",
            ClusterEvent::NodeDeleted(_) => "NodeDelete",
            ClusterEvent::PodAdded(_) => "AssignedPodAdd",
            ClusterEvent::PodUpdated { .. } => "AssignedPodUpdate",
            ClusterEvent::PodDeleted(_) => "AssignedPodDelete",
            ClusterEvent::NamespaceChanged => "NamespaceUpdate",
            ClusterEvent::ClaimChanged(_) => "PvcChange",
            ClusterEvent::StorageChanged => "PvOrStorageClassChange",
        }
    }
}

/// Whether a Node update changes anything the plugins read: allocatable, labels, taints,
/// cordon, images. Heartbeats (conditions, timestamps) do not.
pub fn node_update_matters(old: &Node, new: &Node) -> bool {
    let spec = |n: &Node| {
        n.spec
            .as_ref()
            .map(|s| (s.taints.clone(), s.unschedulable))
            .unwrap_or_default()
    };
    let status = |n: &Node| {
        n.status
            .as_ref()
            .map(|s| (s.allocatable.clone(), s.images.clone()))
            .unwrap_or_default()
    };
    old.metadata.labels != new.metadata.labels
        || spec(old) != spec(new)
        || status(old) != status(new)
}

fn node_hint(plugin: Plugin, pod: &PodInfo, old: Option<&Node>, new: &Node) -> bool {
    match plugin {
        Plugin::NodeUnschedulable => node_unschedulable::node_could_help(old, new),
        Plugin::NodeName => old.is_none() && new.metadata.name.as_deref() == Some(pod.node_name()),
        Plugin::TaintToleration => taint_toleration::node_could_help(pod, old, new),
        Plugin::NodeAffinity => node_affinity::node_could_help(pod, old, new),
        Plugin::NodePorts => old.is_none(),
        Plugin::NodeResourcesFit => node_resources_fit::node_could_help(pod, old, new),
        Plugin::PodTopologySpread => pod_topology_spread::node_could_help(pod, old, new),
        Plugin::InterPodAffinity | Plugin::VolumeBinding => {
            old.is_none_or(|o| o.metadata.labels != new.metadata.labels)
        }
        Plugin::NodeResourcesBalancedAllocation | Plugin::ImageLocality => false,
    }
}

const FILTERS: [Plugin; 9] = [
    Plugin::NodeUnschedulable,
    Plugin::NodeName,
    Plugin::TaintToleration,
    Plugin::NodeAffinity,
    Plugin::NodePorts,
    Plugin::NodeResourcesFit,
    Plugin::VolumeBinding,
    Plugin::PodTopologySpread,
    Plugin::InterPodAffinity,
];

fn requests_shrank(old: &PodInfo, new: &PodInfo) -> bool {
    let (o, n) = (&old.requests.requests, &new.requests.requests);
    n.milli_cpu < o.milli_cpu
        || n.memory < o.memory
        || n.ephemeral_storage < o.ephemeral_storage
        || o.scalar.iter().any(|(k, v)| n.get(k) < *v)
}

/// Whether `event` could make `pod`, rejected by `rejected_by`, schedulable. A pod no plugin
/// rejected (no nodes at all, an internal error) is retried on any event.
pub fn could_help(pod: &PodInfo, rejected_by: PluginSet, event: &ClusterEvent) -> bool {
    if rejected_by.is_empty() {
        return true;
    }
    let by = |p: Plugin| rejected_by.contains(p);
    match event {
        ClusterEvent::NodeAdded(n) => FILTERS
            .iter()
            .any(|p| by(*p) && node_hint(*p, pod, None, n)),
        ClusterEvent::NodeUpdated { old, new } => FILTERS
            .iter()
            .any(|p| by(*p) && node_hint(*p, pod, Some(old), new)),
        ClusterEvent::NodeDeleted(n) => {
            by(Plugin::PodTopologySpread) && pod_topology_spread::node_could_help(pod, None, n)
        }
        ClusterEvent::PodAdded(p) => {
            (by(Plugin::PodTopologySpread) && pod_topology_spread::pod_could_help(pod, p))
                || (by(Plugin::InterPodAffinity)
                    && inter_pod_affinity::added_pod_could_help(pod, p))
        }
        ClusterEvent::PodUpdated { old, new } => {
            let relabelled = old.labels() != new.labels();
            (by(Plugin::NodeResourcesFit) && requests_shrank(old, new))
                || (relabelled
                    && ((by(Plugin::PodTopologySpread)
                        && (pod_topology_spread::pod_could_help(pod, old)
                            || pod_topology_spread::pod_could_help(pod, new)))
                        || (by(Plugin::InterPodAffinity)
                            && (inter_pod_affinity::added_pod_could_help(pod, new)
                                || inter_pod_affinity::deleted_pod_could_help(pod, old)))))
        }
        ClusterEvent::PodDeleted(p) => {
            by(Plugin::NodeResourcesFit)
                || (by(Plugin::NodePorts) && node_ports::deleted_pod_could_help(pod, p))
                || (by(Plugin::PodTopologySpread) && pod_topology_spread::pod_could_help(pod, p))
                || (by(Plugin::InterPodAffinity)
                    && inter_pod_affinity::deleted_pod_could_help(pod, p))
        }
        ClusterEvent::NamespaceChanged => by(Plugin::InterPodAffinity),
        ClusterEvent::ClaimChanged(key) => {
            by(Plugin::VolumeBinding)
                && volume_binding::claims_of(&pod.pod)
                    .iter()
                    .any(|k| k.as_str() == &**key)
        }
        ClusterEvent::StorageChanged => by(Plugin::VolumeBinding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, plain_node, pod, pod_requesting};
    use serde_json::json;

    #[test]
    fn only_the_rejecting_plugins_are_asked() {
        let p = pod_requesting("p", "8", "");
        let fit = PluginSet::of(&[Plugin::NodeResourcesFit]);
        let taint = PluginSet::of(&[Plugin::TaintToleration]);
        let big = node("big", "16", "8Gi", json!({}), json!({}));
        let small = node("small", "2", "8Gi", json!({}), json!({}));
        assert!(could_help(&p, fit, &ClusterEvent::NodeAdded(big.clone())));
        assert!(!could_help(&p, fit, &ClusterEvent::NodeAdded(small)));
        assert!(
            could_help(&p, taint, &ClusterEvent::NodeAdded(big)),
            "an untainted node"
        );
        let freed = ClusterEvent::PodDeleted(pod(json!({"metadata": {"name": "gone"}})));
        assert!(could_help(&p, fit, &freed));
        assert!(!could_help(&p, taint, &freed));
        assert!(
            could_help(&p, PluginSet::default(), &freed),
            "unknown cause: retry"
        );
    }

    #[test]
    fn heartbeats_do_not_matter_but_taints_and_capacity_do() {
        let a = plain_node("n");
        let mut beat = (*a).clone();
        beat.status.as_mut().unwrap().conditions = Some(vec![serde_json::from_value(
            json!({"type": "Ready", "status": "True", "lastHeartbeatTime": "2024-01-01T00:00:00Z"}),
        )
        .unwrap()]);
        assert!(!node_update_matters(&a, &beat));
        let tainted = node(
            "n",
            "4",
            "8Gi",
            json!({}),
            json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}),
        );
        assert!(node_update_matters(&a, &tainted));
        let bigger = node("n", "8", "8Gi", json!({}), json!({}));
        assert!(node_update_matters(&a, &bigger));
    }

    #[test]
    fn relabelled_pods_matter_to_spreading() {
        let p = pod(
            json!({"metadata": {"name": "new", "labels": {"app": "web"}}, "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}}),
        );
        let by = PluginSet::of(&[Plugin::PodTopologySpread]);
        let old = pod(json!({"metadata": {"name": "x", "labels": {"app": "web"}}}));
        let new = pod(json!({"metadata": {"name": "x", "labels": {"app": "db"}}}));
        assert!(could_help(
            &p,
            by,
            &ClusterEvent::PodUpdated {
                old: old.clone(),
                new
            }
        ));
        assert!(!could_help(
            &p,
            by,
            &ClusterEvent::PodUpdated {
                old: old.clone(),
                new: old
            }
        ));
    }
}
