//! Every host-global name a node agent uses, derived from its node name, so several agents
//! run side by side on one machine (and alongside tests) without colliding.

use std::fmt;

/// A Kubernetes node name (a DNS subdomain).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeName(String);

impl NodeName {
    pub fn new(name: impl Into<String>) -> NodeName {
        NodeName(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Linux bridge that joins this node's pods: at most 15 bytes (IFNAMSIZ - 1), so a
    /// short stable hash of the node name rather than the name itself.
    pub fn bridge(&self) -> String {
        format!("skb{:010x}", fnv1a(self.0.as_bytes()) & 0xff_ffff_ffff)
    }

    /// The CNI network name (also the key of containerd's CNI result cache).
    pub fn cni_network(&self) -> String {
        format!("skiff-{}", self.0)
    }

    /// The cgroup under which every pod of this node gets its own cgroup.
    pub fn cgroup_root(&self) -> String {
        format!("/skiff-{}", self.0)
    }

    /// The cgroup parent of one pod (cgroupfs driver paths, as the kubelet's `pod<uid>`).
    pub fn pod_cgroup(&self, pod_uid: &str) -> String {
        format!("{}/pod{pod_uid}", self.cgroup_root())
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// FNV-1a: tiny, stable across releases and platforms (std's hasher is neither promised).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_fit_ifnamsiz_and_differ() {
        let a = NodeName::new("node-a.example.com").bridge();
        let b = NodeName::new("node-b.example.com").bridge();
        assert_eq!(a.len(), 13);
        assert_ne!(a, b);
        assert_eq!(a, NodeName::new("node-a.example.com").bridge(), "stable");
    }

    #[test]
    fn cgroups_nest_under_the_node() {
        let n = NodeName::new("n1");
        assert_eq!(n.pod_cgroup("u-1"), "/skiff-n1/podu-1");
        assert!(n.pod_cgroup("x").starts_with(&n.cgroup_root()));
    }
}
