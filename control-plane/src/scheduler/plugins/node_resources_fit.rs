//! NodeResourcesFit: the pod's requests must fit in what the node has left (allocatable minus
//! what its pods request), pod count included (filter); with the default LeastAllocated
//! strategy, nodes with more cpu and memory left score higher (score, weights cpu 1 and
//! memory 1, on the non-zero view of requests so that pods without requests still spread).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Node;

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::super::resources::Resources;
use super::MAX_NODE_SCORE;

/// Every resource the pod lacks on the node, with Kubernetes' reasons.
pub fn insufficient(pod: &PodInfo, node: &NodeInfo) -> Vec<Cow<'static, str>> {
    let mut out = Vec::new();
    if node.pods().len() as i64 + 1 > node.allocatable.pods {
        out.push(Cow::Borrowed("Too many pods"));
    }
    let want = &pod.requests.requests;
    if want.is_empty_request() {
        return out;
    }
    let free = |have: i64, used: i64| have - used;
    let (a, r) = (&node.allocatable, &node.requested);
    if want.milli_cpu > 0 && want.milli_cpu > free(a.milli_cpu, r.milli_cpu) {
        out.push(Cow::Borrowed("Insufficient cpu"));
    }
    if want.memory > 0 && want.memory > free(a.memory, r.memory) {
        out.push(Cow::Borrowed("Insufficient memory"));
    }
    if want.ephemeral_storage > 0
        && want.ephemeral_storage > free(a.ephemeral_storage, r.ephemeral_storage)
    {
        out.push(Cow::Borrowed("Insufficient ephemeral-storage"));
    }
    for (name, v) in &want.scalar {
        if *v > 0 && *v > free(a.get(name), r.get(name)) {
            out.push(Cow::Owned(format!("Insufficient {name}")));
        }
    }
    out
}

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    let reasons = insufficient(pod, node);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(Rejection {
            plugin: Plugin::NodeResourcesFit,
            code: Code::Unschedulable,
            reasons,
        })
    }
}

fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// LeastAllocated: the mean over cpu and memory of the share left free after placing the pod.
pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let mut sum = 0;
    let mut weights = 0;
    for (alloc, req) in [
        (
            node.allocatable.milli_cpu,
            node.non_zero_milli_cpu + pod.requests.non_zero_milli_cpu,
        ),
        (
            node.allocatable.memory,
            node.non_zero_memory + pod.requests.non_zero_memory,
        ),
    ] {
        if alloc == 0 {
            continue;
        }
        sum += least_requested(req, alloc);
        weights += 1;
    }
    if weights == 0 {
        0
    } else {
        sum / weights
    }
}

/// Queueing hint: a new node, or a node whose allocatable grew, that could hold the pod on its
/// own (ignoring its current pods, as kube-scheduler's hint does).
pub fn node_could_help(pod: &PodInfo, old: Option<&Node>, new: &Node) -> bool {
    let allocatable =
        |n: &Node| Resources::from_list(n.status.as_ref().and_then(|s| s.allocatable.as_ref()));
    let now = allocatable(new);
    if let Some(o) = old {
        let before = allocatable(o);
        let grew = now.milli_cpu > before.milli_cpu
            || now.memory > before.memory
            || now.ephemeral_storage > before.ephemeral_storage
            || now.pods > before.pods
            || now.scalar.iter().any(|(k, v)| *v > before.get(k));
        if !grew {
            return false;
        }
    }
    let mut empty = NodeInfo::default();
    empty.set_node(std::sync::Arc::new(new.clone()));
    insufficient(pod, &empty).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, node_info, pod, pod_requesting};
    use serde_json::json;

    #[test]
    fn reasons_name_every_short_resource() {
        let n = node_info(
            node("n", "2", "1Gi", json!({}), json!({})),
            &[pod_requesting("a", "1500m", "512Mi")],
        );
        assert!(filter(&pod_requesting("b", "500m", "512Mi"), &n).is_ok());
        let r = filter(&pod_requesting("c", "600m", "600Mi"), &n).unwrap_err();
        assert_eq!(r.reasons, vec!["Insufficient cpu", "Insufficient memory"]);
        let gpu = pod(json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"example.com/gpu": "1"}}}]}}));
        assert_eq!(
            filter(&gpu, &n).unwrap_err().reasons,
            vec!["Insufficient example.com/gpu"]
        );
    }

    #[test]
    fn pod_count_is_a_resource_too() {
        let full = node("n", "2", "1Gi", json!({}), json!({}));
        let mut full = (*full).clone();
        full.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert(
                "pods".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
            );
        let n = node_info(
            std::sync::Arc::new(full),
            &[pod(json!({"metadata": {"name": "x"}}))],
        );
        let r = filter(&pod(json!({})), &n).unwrap_err();
        assert_eq!(r.reasons, vec!["Too many pods"]);
    }

    #[test]
    fn least_allocated_prefers_emptier_nodes() {
        let empty = node_info(node("a", "4", "8Gi", json!({}), json!({})), &[]);
        let busy = node_info(
            node("b", "4", "8Gi", json!({}), json!({})),
            &[pod_requesting("x", "2", "4Gi")],
        );
        let p = pod_requesting("p", "1", "2Gi");
        // cpu (4-1)/4 = 75, memory (8-2)/8 = 75
        assert_eq!(score(&p, &empty), 75);
        // cpu (4-3)/4 = 25, memory (8-6)/8 = 25
        assert_eq!(score(&p, &busy), 25);
        // No requests: scored as 100m and 200Mi.
        let be = pod(json!({}));
        assert_eq!(
            score(&be, &empty),
            (3900 * 100 / 4000 + (8192 - 200) * 100 / 8192) / 2
        );
    }

    #[test]
    fn hint_needs_a_node_big_enough_on_its_own() {
        let p = pod_requesting("p", "3", "");
        let small = node("n", "2", "1Gi", json!({}), json!({}));
        let big = node("n", "4", "1Gi", json!({}), json!({}));
        assert!(!node_could_help(&p, None, &small));
        assert!(node_could_help(&p, None, &big));
        assert!(node_could_help(&p, Some(&small), &big));
        assert!(
            !node_could_help(&p, Some(&big), &big),
            "allocatable did not grow"
        );
    }
}
