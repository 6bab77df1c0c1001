//! The default profile's plugins, one room each, in kube-scheduler's semantics: filters say
//! whether a node can take a pod (and why not, in Kubernetes' words), scores rank the nodes
//! that can (0-100 after normalising), and queueing hints say whether a cluster event could
//! make a pod that a plugin rejected schedulable. [`volume_binding`] also runs before the
//! binding (PreBind): it selects the node for claims provisioned on first use.

pub mod balanced_allocation;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod volume_binding;

/// The highest score a node gets from one plugin.
pub const MAX_NODE_SCORE: i64 = 100;

/// kube-scheduler's `DefaultNormalizeScore`: scales scores so the highest becomes 100
/// (reversed: the highest becomes 0; all-zero scores become 100 when reversed).
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let v = MAX_NODE_SCORE * *s / max;
        *s = if reverse { MAX_NODE_SCORE - v } else { v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_normalize_scales_to_the_maximum() {
        let mut s = [0, 5, 10];
        default_normalize(&mut s, false);
        assert_eq!(s, [0, 50, 100]);
        let mut s = [0, 5, 10];
        default_normalize(&mut s, true);
        assert_eq!(s, [100, 50, 0]);
        let mut s = [0, 0];
        default_normalize(&mut s, true);
        assert_eq!(s, [100, 100]);
        let mut s = [0, 0];
        default_normalize(&mut s, false);
        assert_eq!(s, [0, 0]);
    }
}
