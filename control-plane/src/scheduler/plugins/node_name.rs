//! NodeName: a pod that names its node fits only there. (A pod with spec.nodeName set never
//! reaches the scheduler's queue; the filter matters for pods evaluated against a node they
//! name, as in kube-scheduler.)

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;

pub const REASON: &str = "node(s) didn't match the requested node name";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    let wanted = pod.node_name();
    if wanted.is_empty() || wanted == node.name() {
        Ok(())
    } else {
        Err(Rejection::new(
            Plugin::NodeName,
            Code::UnschedulableAndUnresolvable,
            REASON,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node_info, plain_node, pod};
    use serde_json::json;

    #[test]
    fn only_the_named_node_fits() {
        let n = node_info(plain_node("n1"), &[]);
        assert!(filter(&pod(json!({})), &n).is_ok());
        assert!(filter(&pod(json!({"spec": {"nodeName": "n1"}})), &n).is_ok());
        let r = filter(&pod(json!({"spec": {"nodeName": "n2"}})), &n).unwrap_err();
        assert_eq!(r.reasons, vec![REASON]);
    }
}
