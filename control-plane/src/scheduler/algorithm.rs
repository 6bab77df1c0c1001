//! One scheduling decision (kube-scheduler's `schedulePod`): pre-filter, filter the nodes
//! (stopping once enough feasible nodes are found), score the feasible ones with every score
//! plugin, normalise, weight, and pick the best, ties broken at random. Pure: it reads the
//! cache and returns a node or the reasons no node fits.
//!
//! percentageOfNodesToScore: left unset, the share of nodes searched for feasible ones adapts
//! to the cluster as kube-scheduler's does: all nodes below 100, then 50% minus 1% per 125
//! nodes, never under 5% nor under 100 nodes (10%, i.e. 500 nodes, at 5,000 nodes). The
//! search starts where the previous one stopped, so successive pods look at different nodes
//! and every node is considered in turn. A pod no node fits still visits every node, so its
//! FailedScheduling message accounts for all of them.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use super::cache::Cache;
use super::framework::{Diagnosis, FitError, Plugin, Rejection};
use super::node_info::NodeInfo;
use super::plugins::{
    balanced_allocation, image_locality, inter_pod_affinity, node_affinity, node_name, node_ports,
    node_resources_fit, node_unschedulable, pod_topology_spread, taint_toleration, volume_binding,
};
use super::pod_info::PodInfo;

/// kube-scheduler's minFeasibleNodesToFind.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// kube-scheduler's minFeasibleNodesPercentageToFind.
const MIN_FEASIBLE_PERCENTAGE: usize = 5;

/// How many feasible nodes to look for among `all` nodes; `percentage` None adapts.
pub fn feasible_nodes_to_find(all: usize, percentage: Option<u8>) -> usize {
    if all < MIN_FEASIBLE_NODES_TO_FIND {
        return all;
    }
    let pct = match percentage {
        Some(p) if p > 0 => usize::from(p.min(100)),
        _ => 50usize
            .saturating_sub(all / 125)
            .max(MIN_FEASIBLE_PERCENTAGE),
    };
    (all * pct / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// A node chosen for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub node: String,
    /// Nodes run through the filters.
    pub evaluated: usize,
    /// Nodes that passed them.
    pub feasible: usize,
}

/// Why a pod got no node.
#[derive(Clone, Debug)]
pub enum Failure {
    /// The cluster has no nodes at all.
    NoNodes,
    /// Every node was rejected.
    Unfit(FitError),
}

impl Failure {
    /// The plugins that rejected the pod (empty: retry on any event).
    pub fn rejected_by(&self) -> super::framework::PluginSet {
        match self {
            Failure::NoNodes => Default::default(),
            Failure::Unfit(e) => e.diagnosis.plugins,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NoNodes => f.write_str("no nodes available to schedule pods"),
            Failure::Unfit(e) => e.fmt(f),
        }
    }
}

/// The per-cycle results of the pre-filters.
pub(super) struct Cycle<'a> {
    pub(super) pod: &'a PodInfo,
    pub(super) cache: &'a Cache,
    spread: Option<pod_topology_spread::FilterState>,
    affinity: Option<inter_pod_affinity::FilterState>,
    volumes: Option<volume_binding::FilterState>,
}

impl<'a> Cycle<'a> {
    /// Runs the pre-filters that look at the whole cluster (topology spread, inter-pod
    /// affinity) once for `pod`.
    pub(super) fn new(pod: &'a PodInfo, cache: &'a Cache) -> Cycle<'a> {
        Cycle {
            pod,
            cache,
            spread: pod_topology_spread::pre_filter(pod, cache),
            affinity: inter_pod_affinity::pre_filter(pod, cache),
            volumes: None,
        }
    }

    /// The filters in kube-scheduler's order; the first rejection ends the node's evaluation.
    fn filter_alone(&self, node: &NodeInfo) -> Result<(), Rejection> {
        let pod = self.pod;
        node_unschedulable::filter(pod, node)?;
        node_name::filter(pod, node)?;
        taint_toleration::filter(pod, node)?;
        node_affinity::filter(pod, node)?;
        node_ports::filter(pod, node)?;
        node_resources_fit::filter(pod, node)?;
        if let Some(s) = &self.volumes {
            volume_binding::filter(s, node)?;
        }
        if let Some(s) = &self.spread {
            pod_topology_spread::filter(s, pod, node)?;
        }
        if let Some(s) = &self.affinity {
            inter_pod_affinity::filter(s, pod, node, self.cache)?;
        }
        Ok(())
    }

    /// The filters with the pods nominated to the node counted as if they ran there, then
    /// without them (kube-scheduler's RunFilterPluginsWithNominatedPods): a pod that
    /// preemption made room for keeps that room against pods of lower or equal priority,
    /// and a pod must fit whether or not the nominated ones arrive. Only nodes with
    /// nominations pay for the copy.
    pub(super) fn filter(&self, node: &NodeInfo) -> Result<(), Rejection> {
        let pod = self.pod;
        let mut nominated = self
            .cache
            .nominated_on(node.name())
            .iter()
            .filter(|p| p.priority >= pod.priority && p.uid != pod.uid)
            .peekable();
        if nominated.peek().is_none() {
            return self.filter_alone(node);
        }
        let mut with = node.clone();
        for p in nominated {
            with.add_pod(p.clone());
        }
        self.filter_alone(&with)?;
        self.filter_alone(node)
    }
}

/// Time spent in each phase of the last decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    pub filter: Duration,
    pub score: Duration,
}

/// The scheduling algorithm with its rotating start position.
#[derive(Debug, Default)]
pub struct Algorithm {
    percentage: Option<u8>,
    next_start: usize,
    last: PhaseTimes,
}

impl Algorithm {
    /// `percentage_of_nodes_to_score`: None (or 0) adapts to the cluster's size.
    pub fn new(percentage_of_nodes_to_score: Option<u8>) -> Algorithm {
        Algorithm {
            percentage: percentage_of_nodes_to_score,
            next_start: 0,
            last: PhaseTimes::default(),
        }
    }

    /// The phase times of the last call to [`Algorithm::schedule`].
    pub fn last_phase_times(&self) -> PhaseTimes {
        self.last
    }

    /// Picks a node for `pod`.
    pub fn schedule(&mut self, cache: &mut Cache, pod: &PodInfo) -> Result<Decision, Failure> {
        let started = Instant::now();
        self.last = PhaseTimes::default();
        cache.refresh_order();
        let cache: &Cache = cache;
        let order = cache.node_order();
        let all = order.len();
        if all == 0 {
            return Err(Failure::NoNodes);
        }
        let mut diagnosis = Diagnosis::default();
        let pinned = match node_affinity::pre_filter(pod) {
            Ok(p) => p,
            Err(r) => {
                diagnosis.plugins.insert(r.plugin);
                diagnosis.pre_filter = Some(r.reasons.join(", "));
                return Err(Failure::Unfit(FitError {
                    nodes: all,
                    diagnosis,
                }));
            }
        };
        let volumes = match cache.volume_listers() {
            Some(l) => match volume_binding::pre_filter(pod, l) {
                Ok(v) => v,
                Err(r) => {
                    diagnosis.plugins.insert(r.plugin);
                    diagnosis.pre_filter = Some(r.reasons.join(", "));
                    return Err(Failure::Unfit(FitError {
                        nodes: all,
                        diagnosis,
                    }));
                }
            },
            None => None,
        };
        let mut cycle = Cycle::new(pod, cache);
        cycle.volumes = volumes;
        // A pod preemption nominated to a node tries that node first and takes it if it
        // fits (kube-scheduler's evaluateNominatedNode).
        if let Some(name) = nominated_node(cache, pod) {
            let allowed = pinned.as_ref().is_none_or(|names| names.contains(name));
            if let Some(node) = cache.node(name).filter(|_| allowed) {
                if cycle.filter(node).is_ok() {
                    self.last.filter = started.elapsed();
                    return Ok(Decision {
                        node: name.to_string(),
                        evaluated: 1,
                        feasible: 1,
                    });
                }
            }
        }
        let mut feasible: Vec<&NodeInfo> = Vec::new();
        let evaluated;
        match pinned {
            Some(names) => {
                let candidates: Vec<&NodeInfo> =
                    names.iter().filter_map(|n| cache.node(n)).collect();
                diagnosis.record_many(
                    Plugin::NodeAffinity,
                    Cow::Borrowed("node(s) didn't satisfy plugin(s) [NodeAffinity]"),
                    all - candidates.len(),
                );
                evaluated = candidates.len();
                for node in candidates {
                    match cycle.filter(node) {
                        Ok(()) => feasible.push(node),
                        Err(r) => diagnosis.record(r),
                    }
                }
            }
            None => {
                let want = feasible_nodes_to_find(all, self.percentage);
                let start = self.next_start % all;
                let mut processed = 0;
                for i in 0..all {
                    let Some(node) = cache.node(&order[(start + i) % all]) else {
                        continue;
                    };
                    processed += 1;
                    match cycle.filter(node) {
                        Ok(()) => {
                            feasible.push(node);
                            if feasible.len() >= want {
                                break;
                            }
                        }
                        Err(r) => diagnosis.record(r),
                    }
                }
                self.next_start = (start + processed) % all;
                evaluated = processed;
            }
        }
        let filtered = Instant::now();
        self.last.filter = filtered - started;
        if feasible.is_empty() {
            return Err(Failure::Unfit(FitError {
                nodes: all,
                diagnosis,
            }));
        }
        let chosen = if feasible.len() == 1 {
            0
        } else {
            select(&score(pod, &feasible, cache))
        };
        self.last.score = filtered.elapsed();
        Ok(Decision {
            node: feasible[chosen].name().to_string(),
            evaluated,
            feasible: feasible.len(),
        })
    }
}

/// The node preemption nominated `pod` to: the scheduler's own record, else the pod's
/// status (a nomination made before this scheduler started).
pub fn nominated_node<'a>(cache: &'a Cache, pod: &'a PodInfo) -> Option<&'a str> {
    cache.nominated_node(&pod.uid).or_else(|| {
        pod.pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty())
    })
}

/// Weighted, normalised totals of every score plugin for each feasible node.
pub fn score(pod: &PodInfo, nodes: &[&NodeInfo], cache: &Cache) -> Vec<i64> {
    let n = nodes.len();
    let mut total = vec![0i64; n];
    let mut buf = vec![0i64; n];
    let mut add = |plugin: Plugin, buf: &[i64]| {
        for (t, s) in total.iter_mut().zip(buf) {
            *t += s * plugin.weight();
        }
    };

    for (s, node) in buf.iter_mut().zip(nodes) {
        *s = taint_toleration::score(pod, node);
    }
    taint_toleration::normalize(&mut buf);
    add(Plugin::TaintToleration, &buf);

    if node_affinity::has_preferences(pod) {
        for (s, node) in buf.iter_mut().zip(nodes) {
            *s = node_affinity::score(pod, node);
        }
        node_affinity::normalize(&mut buf);
        add(Plugin::NodeAffinity, &buf);
    }

    for (s, node) in buf.iter_mut().zip(nodes) {
        *s = node_resources_fit::score(pod, node);
    }
    add(Plugin::NodeResourcesFit, &buf);

    if let Some(st) = pod_topology_spread::pre_score(pod, nodes, cache) {
        for (s, node) in buf.iter_mut().zip(nodes) {
            *s = pod_topology_spread::score(&st, pod, node);
        }
        pod_topology_spread::normalize(&st, nodes, &mut buf);
        add(Plugin::PodTopologySpread, &buf);
    }

    if let Some(st) = inter_pod_affinity::pre_score(pod, cache) {
        for (s, node) in buf.iter_mut().zip(nodes) {
            *s = inter_pod_affinity::score(&st, node);
        }
        inter_pod_affinity::normalize(&mut buf);
        add(Plugin::InterPodAffinity, &buf);
    }

    if balanced_allocation::applies(pod) {
        for (s, node) in buf.iter_mut().zip(nodes) {
            *s = balanced_allocation::score(pod, node);
        }
        add(Plugin::NodeResourcesBalancedAllocation, &buf);
    }

    if !pod.images.is_empty() {
        let all = cache.node_count();
        for (s, node) in buf.iter_mut().zip(nodes) {
            *s = image_locality::score(pod, node, cache, all);
        }
        add(Plugin::ImageLocality, &buf);
    }
    total
}

/// The index of a highest score, chosen uniformly at random among ties.
pub fn select(scores: &[i64]) -> usize {
    let mut best = 0;
    let mut ties = 0u32;
    for (i, s) in scores.iter().enumerate() {
        if i == 0 || *s > scores[best] {
            best = i;
            ties = 1;
        } else if *s == scores[best] {
            // Reservoir sampling: the k-th tie replaces the pick with probability 1/k.
            ties += 1;
            if rand::random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{cache, node, plain_node, pod, pod_requesting};
    use serde_json::json;
    use std::collections::HashMap;

    #[test]
    fn adaptive_percentage_matches_kube_scheduler() {
        assert_eq!(feasible_nodes_to_find(50, None), 50);
        assert_eq!(feasible_nodes_to_find(100, None), 100);
        assert_eq!(feasible_nodes_to_find(1000, None), 420);
        assert_eq!(feasible_nodes_to_find(5000, None), 500);
        assert_eq!(feasible_nodes_to_find(6000, None), 300);
        assert_eq!(feasible_nodes_to_find(20000, None), 1000, "never under 5%");
        assert_eq!(feasible_nodes_to_find(5000, Some(100)), 5000);
        assert_eq!(
            feasible_nodes_to_find(5000, Some(1)),
            100,
            "never under 100 nodes"
        );
    }

    #[test]
    fn ties_are_broken_at_random() {
        let mut seen = HashMap::new();
        for _ in 0..600 {
            *seen.entry(select(&[5, 9, 9, 1, 9])).or_insert(0) += 1;
        }
        assert_eq!(
            seen.keys()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            [1, 2, 4].into()
        );
        assert!(seen.values().all(|n| *n > 100), "{seen:?}");
        assert_eq!(select(&[3]), 0);
    }

    #[test]
    fn the_emptiest_node_wins_and_assumptions_spread_pods() {
        let mut c = cache(&[plain_node("a"), plain_node("b"), plain_node("c")], &[]);
        let mut alg = Algorithm::new(None);
        let mut used = std::collections::BTreeSet::new();
        for i in 0..3 {
            let p = pod_requesting(&format!("p{i}"), "1", "1Gi");
            let d = alg.schedule(&mut c, &p).unwrap();
            assert_eq!(d.feasible, 3);
            c.assume(p, &d.node);
            used.insert(d.node);
        }
        assert_eq!(
            used.len(),
            3,
            "each pod saw the others and took an empty node"
        );
    }

    #[test]
    fn failure_message_counts_every_node() {
        let tainted = node(
            "t",
            "8",
            "8Gi",
            json!({}),
            json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}),
        );
        let mut c = cache(
            &[
                tainted,
                node("s1", "1", "8Gi", json!({}), json!({})),
                node("s2", "1", "8Gi", json!({}), json!({})),
            ],
            &[],
        );
        let err = Algorithm::new(None)
            .schedule(&mut c, &pod_requesting("big", "2", ""))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu."
        );
        assert!(err.rejected_by().contains(Plugin::TaintToleration));
        assert!(err.rejected_by().contains(Plugin::NodeResourcesFit));
        let mut empty = Cache::new();
        let none = Algorithm::new(None)
            .schedule(&mut empty, &pod(json!({})))
            .unwrap_err();
        assert_eq!(none.to_string(), "no nodes available to schedule pods");
    }

    #[test]
    fn daemonset_style_pods_only_visit_their_node() {
        let mut c = cache(&[plain_node("a"), plain_node("b"), plain_node("c")], &[]);
        let ds = pod(
            json!({"spec": {"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}}),
        );
        let d = Algorithm::new(None).schedule(&mut c, &ds).unwrap();
        assert_eq!((d.node.as_str(), d.evaluated), ("b", 1));
        let gone = pod(
            json!({"spec": {"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["zz"]}]}]}}}}}),
        );
        let err = Algorithm::new(None).schedule(&mut c, &gone).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 3 node(s) didn't satisfy plugin(s) [NodeAffinity]."
        );
    }

    #[test]
    fn sampling_rotates_through_a_large_cluster() {
        let nodes: Vec<_> = (0..400).map(|i| plain_node(&format!("n{i:03}"))).collect();
        let mut c = cache(&nodes, &[]);
        let mut alg = Algorithm::new(None);
        let want = feasible_nodes_to_find(400, None);
        assert_eq!(want, 188);
        let d1 = alg.schedule(&mut c, &pod(json!({}))).unwrap();
        assert_eq!((d1.evaluated, d1.feasible), (want, want));
        assert_eq!(alg.next_start, want);
        alg.schedule(&mut c, &pod(json!({}))).unwrap();
        assert_eq!(alg.next_start, 2 * want);
    }

    #[test]
    fn preferences_and_taints_weigh_in() {
        let soft = node(
            "soft",
            "4",
            "8Gi",
            json!({}),
            json!({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}),
        );
        let mut c = cache(&[soft, plain_node("clean")], &[]);
        for _ in 0..20 {
            let d = Algorithm::new(None)
                .schedule(&mut c, &pod(json!({})))
                .unwrap();
            assert_eq!(d.node, "clean");
        }
        let ssd = node("ssd", "4", "8Gi", json!({"disk": "ssd"}), json!({}));
        let mut c = cache(&[ssd, plain_node("other")], &[]);
        let p = pod(
            json!({"spec": {"containers": [{"name": "c", "image": "i"}], "affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                "matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}}),
        );
        for _ in 0..20 {
            assert_eq!(
                Algorithm::new(None).schedule(&mut c, &p).unwrap().node,
                "ssd"
            );
        }
    }
}
