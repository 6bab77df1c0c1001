//! NodePorts: a pod's host ports must be free on the node (a wildcard address clashes with
//! every address).

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;

pub const REASON: &str = "node(s) didn't have free ports for the requested pod ports";

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    if pod.host_ports.iter().any(|p| node.used_ports.conflicts(p)) {
        Err(Rejection::new(
            Plugin::NodePorts,
            Code::Unschedulable,
            REASON,
        ))
    } else {
        Ok(())
    }
}

/// Queueing hint: a deleted pod freed a port this pod wants.
pub fn deleted_pod_could_help(pod: &PodInfo, deleted: &PodInfo) -> bool {
    pod.host_ports.iter().any(|want| {
        deleted.host_ports.iter().any(|had| {
            had.port == want.port
                && had.protocol == want.protocol
                && (had.ip == want.ip || had.ip == "0.0.0.0" || want.ip == "0.0.0.0")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node_info, plain_node, pod};
    use serde_json::json;

    fn with_port(name: &str, ip: &str, port: i32) -> std::sync::Arc<PodInfo> {
        pod(
            json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip}]}]}}),
        )
    }

    #[test]
    fn host_ports_in_use_reject_the_node() {
        let holder = with_port("a", "", 8080);
        let n = node_info(plain_node("n"), std::slice::from_ref(&holder));
        let r = filter(&with_port("b", "10.0.0.1", 8080), &n).unwrap_err();
        assert_eq!(r.reasons, vec![REASON]);
        assert!(filter(&with_port("c", "", 8081), &n).is_ok());
        assert!(filter(&pod(json!({})), &n).is_ok());
        assert!(deleted_pod_could_help(
            &with_port("b", "10.0.0.1", 8080),
            &holder
        ));
        assert!(!deleted_pod_could_help(&with_port("c", "", 9090), &holder));
    }
}
