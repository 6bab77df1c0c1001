//! The scheduler's cache: every node with the aggregates of its pods, every bound pod, the
//! cluster-wide image counts ImageLocality needs, and namespace labels for affinity terms'
//! namespaceSelector. Informer events update it one object at a time (O(changed)).
//!
//! Assumed pods: once the scheduler picks a node it adds the pod to that node here at once,
//! before the binding is written, so the next decision (microseconds later) already sees the
//! resources as taken. The watch later confirms the pod (same uid, now bound); a failed
//! binding forgets it. An assumption that the watch never confirms (the pod was deleted and
//! the deletion missed) expires a while after its binding finished.
//!
//! Nodes are iterated in kube-scheduler's zone-interleaved order (one node of each zone in
//! turn), rebuilt lazily after nodes come or go, so that sampling a fraction of a large
//! cluster still spreads over zones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use super::node_info::NodeInfo;
use super::plugins::volume_binding;
use super::pod_info::{PodInfo, PodUid};
use super::preemption::Budget;

/// How many nodes hold an image and how large it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSummary {
    pub size: i64,
    pub nodes: usize,
}

#[derive(Debug)]
struct PodState {
    node: Arc<str>,
    assumed: bool,
    binding_finished: Option<Instant>,
}

/// Nodes grouped by zone, listed one zone at a time in turn (kube-scheduler's NodeTree).
#[derive(Debug, Default)]
struct NodeTree {
    zones: Vec<(String, Vec<Arc<str>>)>,
    list: Vec<Arc<str>>,
    dirty: bool,
}

/// kube-scheduler's zone key: region and zone (topology or legacy failure-domain labels).
fn zone_key(node: &Node) -> String {
    let Some(l) = node.metadata.labels.as_ref() else {
        return String::new();
    };
    let get = |a: &str, b: &str| l.get(a).or_else(|| l.get(b)).cloned().unwrap_or_default();
    let zone = get(
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/zone",
    );
    let region = get(
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/region",
    );
    if zone.is_empty() && region.is_empty() {
        String::new()
    } else {
        format!("{region}:\0:{zone}")
    }
}

impl NodeTree {
    fn add(&mut self, zone: &str, name: Arc<str>) {
        match self.zones.iter_mut().find(|(z, _)| z == zone) {
            Some((_, nodes)) => nodes.push(name),
            None => self.zones.push((zone.to_string(), vec![name])),
        }
        self.dirty = true;
    }

    fn remove(&mut self, zone: &str, name: &str) {
        if let Some(zi) = self.zones.iter().position(|(z, _)| z == zone) {
            let nodes = &mut self.zones[zi].1;
            if let Some(i) = nodes.iter().position(|n| &**n == name) {
                nodes.remove(i);
            }
            if nodes.is_empty() {
                self.zones.remove(zi);
            }
        }
        self.dirty = true;
    }

    fn refresh(&mut self) {
        if !self.dirty {
            return;
        }
        self.list.clear();
        let longest = self.zones.iter().map(|(_, n)| n.len()).max().unwrap_or(0);
        for i in 0..longest {
            for (_, nodes) in &self.zones {
                if let Some(n) = nodes.get(i) {
                    self.list.push(n.clone());
                }
            }
        }
        self.dirty = false;
    }
}

/// The scheduler's view of the cluster.
#[derive(Debug, Default)]
pub struct Cache {
    nodes: HashMap<Arc<str>, NodeInfo>,
    /// Zone of each node with a Node object (to find it in the tree when it changes).
    zones: HashMap<Arc<str>, String>,
    tree: NodeTree,
    pods: HashMap<PodUid, PodState>,
    assumed: HashSet<PodUid>,
    images: HashMap<String, ImageSummary>,
    namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Nodes hosting a pod with (anti-)affinity terms, and with required anti-affinity terms.
    affinity_nodes: HashSet<Arc<str>>,
    anti_affinity_nodes: HashSet<Arc<str>>,
    /// PodDisruptionBudgets by namespace, then name (preemption spares the pods they protect).
    budgets: HashMap<String, BTreeMap<String, Arc<Budget>>>,
    /// Pending pods that preemption nominated to a node, per node, and each one's node
    /// (kube-scheduler's nominator): their resources count when pods of lower or equal
    /// priority are tried on that node.
    nominated: HashMap<Arc<str>, Vec<Arc<PodInfo>>>,
    nominations: HashMap<PodUid, Arc<str>>,
    /// Claims, volumes and classes (VolumeBinding); None in tests without them.
    volumes: Option<volume_binding::Listers>,
}

impl Cache {
    pub fn new() -> Cache {
        Cache::default()
    }

    /// Where VolumeBinding reads claims, volumes and classes.
    pub fn set_volume_listers(&mut self, listers: volume_binding::Listers) {
        self.volumes = Some(listers);
    }

    pub fn volume_listers(&self) -> Option<&volume_binding::Listers> {
        self.volumes.as_ref()
    }

    fn entry(&mut self, name: &str) -> (Arc<str>, &mut NodeInfo) {
        let key: Arc<str> = match self.nodes.get_key_value(name) {
            Some((k, _)) => k.clone(),
            None => Arc::from(name),
        };
        let info = self.nodes.entry(key.clone()).or_default();
        (key, info)
    }

    fn drop_if_unused(&mut self, name: &str) {
        if self.nodes.get(name).is_some_and(NodeInfo::is_unused) {
            self.nodes.remove(name);
        }
    }

    fn count_images(&mut self, old: HashMap<String, i64>, new: &HashMap<String, i64>) {
        for name in old.keys().filter(|n| !new.contains_key(*n)) {
            if let Some(s) = self.images.get_mut(name) {
                s.nodes -= 1;
                if s.nodes == 0 {
                    self.images.remove(name);
                }
            }
        }
        for (name, size) in new {
            if !old.contains_key(name) {
                let s = self.images.entry(name.clone()).or_insert(ImageSummary {
                    size: *size,
                    nodes: 0,
                });
                s.nodes += 1;
                s.size = *size;
            }
        }
    }

    /// Adds or replaces a Node; returns the previous object.
    pub fn upsert_node(&mut self, node: Arc<Node>) -> Option<Arc<Node>> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let zone = zone_key(&node);
        let (key, info) = self.entry(&name);
        let previous = info.node().cloned();
        let old_images = info.set_node(node);
        let new_images = info.images().clone();
        if old_images != new_images {
            self.count_images(old_images, &new_images);
        }
        match self.zones.get(&key) {
            Some(z) if *z == zone => {}
            Some(z) => {
                let z = z.clone();
                self.tree.remove(&z, &key);
                self.tree.add(&zone, key.clone());
                self.zones.insert(key, zone);
            }
            None => {
                self.tree.add(&zone, key.clone());
                self.zones.insert(key, zone);
            }
        }
        previous
    }

    /// Removes a Node (its pods stay accounted until they are deleted themselves).
    pub fn remove_node(&mut self, name: &str) -> Option<Arc<Node>> {
        let info = self.nodes.get_mut(name)?;
        let previous = info.node().cloned();
        let old_images = info.clear_node();
        self.count_images(old_images, &HashMap::new());
        if let Some(zone) = self.zones.remove(name) {
            self.tree.remove(&zone, name);
        }
        self.drop_if_unused(name);
        previous
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str) -> Arc<str> {
        let affinity = pod.has_affinity();
        let anti = !pod.required_anti_affinity.is_empty();
        let (key, info) = self.entry(node);
        info.add_pod(pod);
        if affinity {
            self.affinity_nodes.insert(key.clone());
        }
        if anti {
            self.anti_affinity_nodes.insert(key.clone());
        }
        key
    }

    fn unplace(&mut self, uid: &PodUid, node: &str) -> Option<Arc<PodInfo>> {
        let info = self.nodes.get_mut(node)?;
        let pod = info.remove_pod(uid);
        if info.pods_with_affinity().is_empty() {
            self.affinity_nodes.remove(node);
        }
        if info.pods_with_required_anti_affinity().is_empty() {
            self.anti_affinity_nodes.remove(node);
        }
        self.drop_if_unused(node);
        pod
    }

    /// A bound pod seen by the watch (new, updated, or confirming an assumption); returns the
    /// previous version of it, if the cache held one.
    pub fn upsert_pod(&mut self, pod: Arc<PodInfo>) -> Option<Arc<PodInfo>> {
        let uid = pod.uid.clone();
        let node = pod.node_name().to_string();
        let previous = match self.pods.remove(&uid) {
            Some(state) => {
                self.assumed.remove(&uid);
                self.unplace(&uid, &state.node)
            }
            None => None,
        };
        let key = self.place(pod, &node);
        self.pods.insert(
            uid,
            PodState {
                node: key,
                assumed: false,
                binding_finished: None,
            },
        );
        previous
    }

    /// A bound pod deleted (or finished); returns what the cache held for it.
    pub fn remove_pod(&mut self, uid: &PodUid) -> Option<Arc<PodInfo>> {
        let state = self.pods.remove(uid)?;
        self.assumed.remove(uid);
        self.unplace(uid, &state.node)
    }

    /// Counts `pod` on `node` before its binding is written.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        let uid = pod.uid.clone();
        if let Some(state) = self.pods.remove(&uid) {
            self.unplace(&uid, &state.node);
        }
        let key = self.place(pod, node);
        self.assumed.insert(uid.clone());
        self.pods.insert(
            uid,
            PodState {
                node: key,
                assumed: true,
                binding_finished: None,
            },
        );
    }

    /// The binding was written: the assumption now waits for the watch to confirm it.
    pub fn finish_binding(&mut self, uid: &PodUid, now: Instant) {
        if let Some(s) = self.pods.get_mut(uid).filter(|s| s.assumed) {
            s.binding_finished = Some(now);
        }
    }

    /// The binding failed: undo the assumption (a confirmed pod is left alone).
    pub fn forget(&mut self, uid: &PodUid) {
        if self.assumed.contains(uid) {
            self.remove_pod(uid);
        }
    }

    /// Drops assumptions whose binding finished more than `ttl` ago without the watch
    /// confirming them; returns how many.
    pub fn expire_assumed(&mut self, now: Instant, ttl: Duration) -> usize {
        let expired: Vec<PodUid> = self
            .assumed
            .iter()
            .filter(|u| {
                self.pods
                    .get(*u)
                    .and_then(|s| s.binding_finished)
                    .is_some_and(|t| now.duration_since(t) > ttl)
            })
            .cloned()
            .collect();
        for u in &expired {
            self.remove_pod(u);
        }
        expired.len()
    }

    pub fn is_assumed(&self, uid: &PodUid) -> bool {
        self.assumed.contains(uid)
    }

    /// The node a pod is counted on (bound or assumed).
    pub fn pod_node(&self, uid: &PodUid) -> Option<&str> {
        self.pods.get(uid).map(|s| &*s.node)
    }

    pub fn set_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        self.namespaces.insert(name.to_string(), labels);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(name)
    }

    /// Rebuilds the zone-interleaved node order if nodes came or went.
    pub fn refresh_order(&mut self) {
        self.tree.refresh();
    }

    /// Nodes with a Node object, zone-interleaved (call [`Cache::refresh_order`] first).
    pub fn node_order(&self) -> &[Arc<str>] {
        &self.tree.list
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.get(name).filter(|n| n.node().is_some())
    }

    /// Every node with a Node object.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values().filter(|n| n.node().is_some())
    }

    /// Nodes hosting pods with inter-pod (anti-)affinity terms.
    pub fn nodes_with_affinity_pods(&self) -> impl Iterator<Item = &NodeInfo> {
        self.affinity_nodes.iter().filter_map(|n| self.node(n))
    }

    /// Nodes hosting pods with required anti-affinity terms.
    pub fn nodes_with_anti_affinity_pods(&self) -> impl Iterator<Item = &NodeInfo> {
        self.anti_affinity_nodes.iter().filter_map(|n| self.node(n))
    }

    pub fn node_count(&self) -> usize {
        self.zones.len()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn assumed_count(&self) -> usize {
        self.assumed.len()
    }

    pub fn image(&self, name: &str) -> Option<ImageSummary> {
        self.images.get(name).copied()
    }

    /// Adds or replaces a PodDisruptionBudget.
    pub fn upsert_budget(&mut self, budget: Budget) {
        self.budgets
            .entry(budget.namespace.clone())
            .or_default()
            .insert(budget.name.clone(), Arc::new(budget));
    }

    pub fn remove_budget(&mut self, namespace: &str, name: &str) {
        if let Some(m) = self.budgets.get_mut(namespace) {
            m.remove(name);
            if m.is_empty() {
                self.budgets.remove(namespace);
            }
        }
    }

    /// The budgets of one namespace.
    pub fn budgets_in(&self, namespace: &str) -> impl Iterator<Item = &Arc<Budget>> {
        self.budgets
            .get(namespace)
            .into_iter()
            .flat_map(|m| m.values())
    }

    /// Nominates pending `pod` to `node` (replacing an earlier nomination and the pod's older
    /// version).
    pub fn nominate(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.clear_nomination(&pod.uid);
        let key: Arc<str> = match self.nodes.get_key_value(node) {
            Some((k, _)) => k.clone(),
            None => Arc::from(node),
        };
        self.nominations.insert(pod.uid.clone(), key.clone());
        self.nominated.entry(key).or_default().push(pod);
    }

    /// Drops the pod's nomination; returns the node it was nominated to.
    pub fn clear_nomination(&mut self, uid: &PodUid) -> Option<Arc<str>> {
        let node = self.nominations.remove(uid)?;
        if let Some(list) = self.nominated.get_mut(&node) {
            list.retain(|p| &p.uid != uid);
            if list.is_empty() {
                self.nominated.remove(&node);
            }
        }
        Some(node)
    }

    /// The node `uid` is nominated to.
    pub fn nominated_node(&self, uid: &PodUid) -> Option<&str> {
        self.nominations.get(uid).map(|n| &**n)
    }

    /// Pods nominated to `node`.
    pub fn nominated_on(&self, node: &str) -> &[Arc<PodInfo>] {
        self.nominated.get(node).map_or(&[], |v| v.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::pod;
    use proptest::prelude::*;
    use serde_json::json;

    pub fn node(name: &str, zone: Option<&str>, images: &[(&str, i64)]) -> Arc<Node> {
        let mut labels = json!({"kubernetes.io/hostname": name});
        if let Some(z) = zone {
            labels["topology.kubernetes.io/zone"] = json!(z);
        }
        let images: Vec<_> = images
            .iter()
            .map(|(n, s)| json!({"names": [n], "sizeBytes": s}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "images": images},
            }))
            .unwrap(),
        )
    }

    fn bound(name: &str, node: &str, cpu: &str) -> Arc<PodInfo> {
        pod(
            json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
    }

    #[test]
    fn nodes_are_listed_one_zone_at_a_time() {
        let mut c = Cache::new();
        for (n, z) in [
            ("a1", "a"),
            ("a2", "a"),
            ("a3", "a"),
            ("b1", "b"),
            ("c1", "c"),
            ("c2", "c"),
        ] {
            c.upsert_node(node(n, Some(z), &[]));
        }
        c.refresh_order();
        let order: Vec<&str> = c.node_order().iter().map(|n| &**n).collect();
        assert_eq!(order, ["a1", "b1", "c1", "a2", "c2", "a3"]);
        c.upsert_node(node("b1", Some("c"), &[]));
        c.remove_node("a2");
        c.refresh_order();
        let order: Vec<&str> = c.node_order().iter().map(|n| &**n).collect();
        assert_eq!(order, ["a1", "c1", "a3", "c2", "b1"]);
        assert_eq!(c.node_count(), 5);
    }

    #[test]
    fn image_counts_follow_nodes() {
        let mut c = Cache::new();
        c.upsert_node(node("n1", None, &[("web:v1", 100), ("db:v1", 50)]));
        c.upsert_node(node("n2", None, &[("web:v1", 100)]));
        assert_eq!(
            c.image("web:v1"),
            Some(ImageSummary {
                size: 100,
                nodes: 2
            })
        );
        c.upsert_node(node("n2", None, &[("db:v1", 50)]));
        assert_eq!(c.image("web:v1").unwrap().nodes, 1);
        assert_eq!(c.image("db:v1").unwrap().nodes, 2);
        c.remove_node("n1");
        assert_eq!(c.image("web:v1"), None);
        assert_eq!(c.image("db:v1").unwrap().nodes, 1);
    }

    #[test]
    fn assumed_pods_are_confirmed_forgotten_or_expired() {
        let mut c = Cache::new();
        c.upsert_node(node("n1", None, &[]));
        c.upsert_node(node("n2", None, &[]));
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}}));
        c.assume(p.clone(), "n1");
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 1000);
        assert!(c.is_assumed(&p.uid));
        c.forget(&p.uid);
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 0);
        assert_eq!(c.pod_count(), 0);

        // Confirmed on another node than assumed: the watch wins.
        c.assume(p.clone(), "n1");
        c.upsert_pod(bound("p", "n2", "1"));
        assert!(!c.is_assumed(&p.uid));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 0);
        assert_eq!(c.node("n2").unwrap().requested.milli_cpu, 1000);
        c.forget(&p.uid);
        assert_eq!(
            c.pod_node(&p.uid),
            Some("n2"),
            "forget leaves confirmed pods alone"
        );

        let q = bound("q", "n1", "2");
        c.assume(q.clone(), "n1");
        let t0 = Instant::now();
        c.finish_binding(&q.uid, t0);
        assert_eq!(
            c.expire_assumed(t0 + Duration::from_secs(1), Duration::from_secs(30)),
            0
        );
        assert_eq!(
            c.expire_assumed(t0 + Duration::from_secs(31), Duration::from_secs(30)),
            1
        );
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 0);
    }

    #[test]
    fn pods_on_unknown_nodes_are_kept_until_both_are_gone() {
        let mut c = Cache::new();
        let p = bound("p", "later", "500m");
        c.upsert_pod(p.clone());
        assert!(c.node("later").is_none(), "no Node object yet");
        c.upsert_node(node("later", None, &[]));
        assert_eq!(c.node("later").unwrap().requested.milli_cpu, 500);
        c.remove_node("later");
        c.upsert_node(node("later", None, &[]));
        assert_eq!(c.node("later").unwrap().requested.milli_cpu, 500);
        c.remove_node("later");
        c.remove_pod(&p.uid);
        assert!(c.nodes.is_empty());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add(u8, u8, u16),
        Assume(u8, u8, u16),
        Remove(u8),
        Forget(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12, 0u8..4, 0u16..2000).prop_map(|(p, n, c)| Op::Add(p, n, c)),
            (0u8..12, 0u8..4, 0u16..2000).prop_map(|(p, n, c)| Op::Assume(p, n, c)),
            (0u8..12).prop_map(Op::Remove),
            (0u8..12).prop_map(Op::Forget),
        ]
    }

    proptest! {
        /// Whatever the order of watch events and assumptions, each node's totals equal the
        /// sum over the pods the cache places on it.
        #[test]
        fn node_totals_always_equal_the_sum_of_their_pods(ops in prop::collection::vec(op(), 1..60)) {
            let mut c = Cache::new();
            for n in 0..4 {
                c.upsert_node(node(&format!("n{n}"), None, &[]));
            }
            for o in ops {
                match o {
                    Op::Add(p, n, cpu) => {
                        c.upsert_pod(bound(&format!("p{p}"), &format!("n{n}"), &format!("{cpu}m")));
                    }
                    Op::Assume(p, n, cpu) => {
                        let uid = PodUid(Arc::from(format!("uid-p{p}").as_str()));
                        if c.pod_node(&uid).is_none() {
                            c.assume(bound(&format!("p{p}"), "", &format!("{cpu}m")), &format!("n{n}"));
                        }
                    }
                    Op::Remove(p) => { c.remove_pod(&PodUid(Arc::from(format!("uid-p{p}").as_str()))); }
                    Op::Forget(p) => c.forget(&PodUid(Arc::from(format!("uid-p{p}").as_str()))),
                }
            }
            let mut placed = 0;
            for n in c.nodes() {
                let sum: i64 = n.pods().iter().map(|p| p.requests.requests.milli_cpu).sum();
                prop_assert_eq!(n.requested.milli_cpu, sum);
                let nz: i64 = n.pods().iter().map(|p| p.requests.non_zero_milli_cpu).sum();
                prop_assert_eq!(n.non_zero_milli_cpu, nz);
                placed += n.pods().len();
            }
            prop_assert_eq!(placed, c.pod_count());
        }
    }
}
