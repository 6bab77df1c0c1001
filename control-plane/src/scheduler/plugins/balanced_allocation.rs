//! NodeResourcesBalancedAllocation: nodes whose cpu and memory would be used in equal shares
//! after placing the pod score higher (100 x (1 - the standard deviation of the shares)).
//! Skipped for pods that request nothing, as kube-scheduler does since 1.32, so that
//! BestEffort pods are not piled onto one node.

use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::MAX_NODE_SCORE;

/// Whether scoring applies (the pod requests cpu or memory).
pub fn applies(pod: &PodInfo) -> bool {
    pod.requests.requests.milli_cpu != 0 || pod.requests.requests.memory != 0
}

pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let want = &pod.requests.requests;
    let mut fractions = [0f64; 2];
    let mut n = 0;
    for (alloc, req) in [
        (
            node.allocatable.milli_cpu,
            node.requested.milli_cpu + want.milli_cpu,
        ),
        (node.allocatable.memory, node.requested.memory + want.memory),
    ] {
        if alloc == 0 {
            continue;
        }
        fractions[n] = (req as f64 / alloc as f64).min(1.0);
        n += 1;
    }
    let std = if n == 2 {
        ((fractions[0] - fractions[1]) / 2.0).abs()
    } else {
        0.0
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, node_info, pod, pod_requesting};
    use serde_json::json;

    #[test]
    fn balanced_use_scores_higher() {
        let n = node_info(node("a", "4", "4Gi", json!({}), json!({})), &[]);
        // cpu 2/4 = 0.5, memory 2/4 = 0.5: perfectly balanced
        assert_eq!(score(&pod_requesting("p", "2", "2Gi"), &n), 100);
        // cpu 0.75, memory 0.25: std 0.25
        assert_eq!(score(&pod_requesting("q", "3", "1Gi"), &n), 75);
        // over-committed shares are capped at 1
        assert_eq!(score(&pod_requesting("r", "8", "0"), &n), 50);
        assert!(!applies(&pod(json!({}))));
        assert!(applies(&pod_requesting("s", "1m", "")));
    }
}
