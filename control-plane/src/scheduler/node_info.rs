//! One node as the scheduler sees it: the Node object and the running totals of the pods on it
//! (requested resources, the non-zero view scoring uses, host ports in use, pods with
//! affinity terms), kept current pod by pod so that a filter or score reads them in O(1).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Taint};

use super::pod_info::{HostPort, PodInfo, PodUid};
use super::resources::Resources;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Host ports in use on a node, with kube-scheduler's conflict rule: a wildcard address
/// (0.0.0.0) conflicts with every address for the same protocol and port.
#[derive(Clone, Debug, Default)]
pub struct HostPorts {
    /// (protocol, port) -> address -> how many pods bind it.
    used: HashMap<(String, i32), HashMap<String, u32>>,
}

const ANY_IP: &str = "0.0.0.0";

impl HostPorts {
    pub fn add(&mut self, p: &HostPort) {
        *self
            .used
            .entry((p.protocol.clone(), p.port))
            .or_default()
            .entry(p.ip.clone())
            .or_default() += 1;
    }

    pub fn remove(&mut self, p: &HostPort) {
        let key = (p.protocol.clone(), p.port);
        if let Some(ips) = self.used.get_mut(&key) {
            if let Some(n) = ips.get_mut(&p.ip) {
                *n -= 1;
                if *n == 0 {
                    ips.remove(&p.ip);
                }
            }
            if ips.is_empty() {
                self.used.remove(&key);
            }
        }
    }

    /// Whether binding `p` would clash with a port in use.
    pub fn conflicts(&self, p: &HostPort) -> bool {
        let Some(ips) = self.used.get(&(p.protocol.clone(), p.port)) else {
            return false;
        };
        p.ip == ANY_IP || ips.contains_key(ANY_IP) || ips.contains_key(&p.ip)
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

/// The map inside `images`, copied only if a simulation still holds it.
fn unshare(images: Arc<HashMap<String, i64>>) -> HashMap<String, i64> {
    Arc::try_unwrap(images).unwrap_or_else(|shared| (*shared).clone())
}

/// A node and the aggregates of its pods. Cloned only to simulate a change (nominated pods
/// added, preemption victims removed); the image list is shared between clones.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    /// None while pods name a node the cache has not seen (yet, or any more).
    node: Option<Arc<Node>>,
    pub allocatable: Resources,
    pub requested: Resources,
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
    pods: Vec<Arc<PodInfo>>,
    pods_with_affinity: Vec<Arc<PodInfo>>,
    pods_with_required_anti_affinity: Vec<Arc<PodInfo>>,
    pub used_ports: HostPorts,
    /// Image name -> size in bytes, from node.status.images.
    images: Arc<HashMap<String, i64>>,
}

impl NodeInfo {
    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.as_ref()
    }

    pub fn name(&self) -> &str {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.name.as_deref())
            .unwrap_or("")
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.node
            .as_ref()
            .and_then(|n| n.metadata.labels.as_ref())
            .unwrap_or(&NO_LABELS)
    }

    pub fn taints(&self) -> &[Taint] {
        self.node
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    pub fn unschedulable(&self) -> bool {
        self.node
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
    }

    pub fn pods(&self) -> &[Arc<PodInfo>] {
        &self.pods
    }

    /// Pods with any inter-pod affinity or anti-affinity term.
    pub fn pods_with_affinity(&self) -> &[Arc<PodInfo>] {
        &self.pods_with_affinity
    }

    pub fn pods_with_required_anti_affinity(&self) -> &[Arc<PodInfo>] {
        &self.pods_with_required_anti_affinity
    }

    pub fn images(&self) -> &HashMap<String, i64> {
        &self.images
    }

    /// Sets (or replaces) the Node object; returns the images it had before, so the cache can
    /// keep its cluster-wide image counts.
    pub fn set_node(&mut self, node: Arc<Node>) -> HashMap<String, i64> {
        let status = node.status.as_ref();
        self.allocatable = Resources::from_list(status.and_then(|s| s.allocatable.as_ref()));
        let mut images = HashMap::new();
        for img in status.and_then(|s| s.images.as_ref()).into_iter().flatten() {
            for name in img.names.iter().flatten() {
                images.insert(name.clone(), img.size_bytes.unwrap_or(0));
            }
        }
        self.node = Some(node);
        unshare(std::mem::replace(&mut self.images, Arc::new(images)))
    }

    /// Forgets the Node object (pods may still name it); returns its images.
    pub fn clear_node(&mut self) -> HashMap<String, i64> {
        self.node = None;
        self.allocatable = Resources::default();
        unshare(std::mem::take(&mut self.images))
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests.requests);
        self.non_zero_milli_cpu += pod.requests.non_zero_milli_cpu;
        self.non_zero_memory += pod.requests.non_zero_memory;
        for p in &pod.host_ports {
            self.used_ports.add(p);
        }
        if pod.has_affinity() {
            self.pods_with_affinity.push(pod.clone());
        }
        if !pod.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity.push(pod.clone());
        }
        self.pods.push(pod);
    }

    /// Removes the pod with `uid`; returns it if it was here.
    pub fn remove_pod(&mut self, uid: &PodUid) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| &p.uid == uid)?;
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests.requests);
        self.non_zero_milli_cpu -= pod.requests.non_zero_milli_cpu;
        self.non_zero_memory -= pod.requests.non_zero_memory;
        for p in &pod.host_ports {
            self.used_ports.remove(p);
        }
        for list in [
            &mut self.pods_with_affinity,
            &mut self.pods_with_required_anti_affinity,
        ] {
            if let Some(i) = list.iter().position(|p| &p.uid == uid) {
                list.swap_remove(i);
            }
        }
        Some(pod)
    }

    /// Whether nothing refers to this entry any more (no Node object, no pods).
    pub fn is_unused(&self) -> bool {
        self.node.is_none() && self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::pod;
    use serde_json::json;

    fn hp(ip: &str, port: i32) -> HostPort {
        HostPort {
            ip: ip.into(),
            protocol: "TCP".into(),
            port,
        }
    }

    #[test]
    fn wildcard_host_ports_conflict_with_every_address() {
        let mut used = HostPorts::default();
        used.add(&hp("10.0.0.1", 80));
        assert!(used.conflicts(&hp("10.0.0.1", 80)));
        assert!(used.conflicts(&hp("0.0.0.0", 80)));
        assert!(!used.conflicts(&hp("10.0.0.2", 80)));
        assert!(!used.conflicts(&hp("10.0.0.1", 81)));
        let udp = HostPort {
            protocol: "UDP".into(),
            ..hp("10.0.0.1", 80)
        };
        assert!(!used.conflicts(&udp));
        used.add(&hp("0.0.0.0", 443));
        assert!(used.conflicts(&hp("10.0.0.9", 443)));
        used.remove(&hp("0.0.0.0", 443));
        used.remove(&hp("10.0.0.1", 80));
        assert!(used.is_empty());
    }

    #[test]
    fn pods_add_and_remove_keep_totals() {
        let mut n = NodeInfo::default();
        let a = pod(
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
            "ports": [{"containerPort": 80, "hostPort": 80}]}],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}}}),
        );
        let b = pod(json!({"metadata": {"name": "b"}}));
        n.add_pod(a.clone());
        n.add_pod(b.clone());
        assert_eq!(n.requested.milli_cpu, 250);
        assert_eq!(n.non_zero_milli_cpu, 350);
        assert_eq!(n.pods().len(), 2);
        assert_eq!(n.pods_with_required_anti_affinity().len(), 1);
        assert!(n.used_ports.conflicts(&hp("0.0.0.0", 80)));
        n.remove_pod(&a.uid).unwrap();
        assert_eq!(n.requested, Resources::default());
        assert_eq!(n.non_zero_milli_cpu, 100);
        assert!(n.pods_with_affinity().is_empty());
        assert!(n.used_ports.is_empty());
        assert!(n.remove_pod(&a.uid).is_none());
        n.remove_pod(&b.uid).unwrap();
        assert!(n.is_unused());
    }
}
