//! NodeUnschedulable: a cordoned node (spec.unschedulable) takes only pods that tolerate the
//! `node.kubernetes.io/unschedulable:NoSchedule` taint.

use k8s_openapi::api::core::v1::{Node, Taint};

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::taint_toleration::tolerated;

pub const REASON: &str = "node(s) were unschedulable";

fn tolerates_cordon(pod: &PodInfo) -> bool {
    let taint = Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    };
    tolerated(&pod.tolerations, &taint)
}

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    if !node.unschedulable() || tolerates_cordon(pod) {
        Ok(())
    } else {
        Err(Rejection::new(
            Plugin::NodeUnschedulable,
            Code::UnschedulableAndUnresolvable,
            REASON,
        ))
    }
}

/// Queueing hint: a node that is (now) schedulable.
pub fn node_could_help(old: Option<&Node>, new: &Node) -> bool {
    let cordoned = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
    };
    !cordoned(new) && old.is_none_or(cordoned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, node_info, pod};
    use serde_json::json;

    #[test]
    fn cordoned_nodes_take_only_tolerating_pods() {
        let cordoned = node("n", "1", "1Gi", json!({}), json!({"unschedulable": true}));
        let n = node_info(cordoned.clone(), &[]);
        assert_eq!(
            filter(&pod(json!({})), &n).unwrap_err().reasons,
            vec![REASON]
        );
        let ds = pod(json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert!(filter(&ds, &n).is_ok());
        let open = node("n", "1", "1Gi", json!({}), json!({}));
        assert!(filter(&pod(json!({})), &node_info(open.clone(), &[])).is_ok());
        assert!(node_could_help(Some(&cordoned), &open));
        assert!(!node_could_help(Some(&open), &open));
        assert!(!node_could_help(None, &cordoned));
    }
}
