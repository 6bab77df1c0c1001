//! PodTopologySpread: pods matching a constraint's selector must stay spread over the
//! topology domains (nodes, zones, ...) so that no domain has more than maxSkew above the
//! least loaded one (DoNotSchedule: a filter), or should (ScheduleAnyway: a score favouring
//! domains with fewer matching pods). Domains are the values of the topology key on the nodes
//! that honour the pod's node affinity (nodeAffinityPolicy Honor, the default) and, if asked,
//! tolerate its taints (nodeTaintsPolicy Honor).
//!
//! Counting visits every node's pods once per scheduling cycle of a pod that has
//! constraints, as kube-scheduler does; pods without constraints skip the plugin entirely.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::Node;

use super::super::cache::Cache;
use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::{InclusionPolicy, PodInfo, SpreadConstraint, WhenUnsatisfiable};
use super::{node_affinity, taint_toleration, MAX_NODE_SCORE};
use crate::machinery::LabelSelector;

pub const REASON: &str = "node(s) didn't match pod topology spread constraints";
pub const REASON_MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";
const HOSTNAME: &str = "kubernetes.io/hostname";

fn constraints(pod: &PodInfo, when: WhenUnsatisfiable) -> Vec<&SpreadConstraint> {
    pod.spread.iter().filter(|c| c.when == when).collect()
}

fn has_all_keys(node: &NodeInfo, cs: &[&SpreadConstraint]) -> bool {
    cs.iter()
        .all(|c| node.labels().contains_key(&c.topology_key))
}

/// Whether `node` counts as a domain of `c` for `pod` (the node inclusion policies).
fn included(c: &SpreadConstraint, pod: &PodInfo, node: &NodeInfo) -> bool {
    let Some(n) = node.node() else {
        return false;
    };
    if c.node_affinity_policy == InclusionPolicy::Honor && !node_affinity::required_matches(pod, n)
    {
        return false;
    }
    if c.node_taints_policy == InclusionPolicy::Honor
        && taint_toleration::untolerated(node.taints(), &pod.tolerations).is_some()
    {
        return false;
    }
    true
}

/// Pods on `node` in `namespace` that `selector` matches (terminating pods do not count).
fn count_matching(node: &NodeInfo, selector: &LabelSelector, namespace: &str) -> i64 {
    node.pods()
        .iter()
        .filter(|p| !p.terminating() && p.namespace() == namespace && selector.matches(p.labels()))
        .count() as i64
}

/// Matching pods per domain for each DoNotSchedule constraint, and each one's global minimum.
#[derive(Debug)]
pub struct FilterState {
    counts: Vec<HashMap<String, i64>>,
    min: Vec<i64>,
}

/// Counts matching pods per domain; None when the pod has no DoNotSchedule constraint.
pub fn pre_filter(pod: &PodInfo, cache: &Cache) -> Option<FilterState> {
    let cs = constraints(pod, WhenUnsatisfiable::DoNotSchedule);
    if cs.is_empty() {
        return None;
    }
    let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); cs.len()];
    for node in cache.nodes() {
        if !has_all_keys(node, &cs) {
            continue;
        }
        for (i, c) in cs.iter().enumerate() {
            if !included(c, pod, node) {
                continue;
            }
            let value = &node.labels()[&c.topology_key];
            let n = count_matching(node, &c.selector, pod.namespace());
            *counts[i].entry(value.clone()).or_default() += n;
        }
    }
    let min = cs
        .iter()
        .zip(&counts)
        .map(|(c, m)| {
            if (m.len() as i64) < i64::from(c.min_domains) {
                0
            } else {
                m.values().copied().min().unwrap_or(0)
            }
        })
        .collect();
    Some(FilterState { counts, min })
}

pub fn filter(state: &FilterState, pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    let cs = constraints(pod, WhenUnsatisfiable::DoNotSchedule);
    for (i, c) in cs.iter().enumerate() {
        let Some(value) = node.labels().get(&c.topology_key) else {
            return Err(Rejection::new(
                Plugin::PodTopologySpread,
                Code::UnschedulableAndUnresolvable,
                REASON_MISSING_LABEL,
            ));
        };
        let self_match = i64::from(c.selector.matches(pod.labels()));
        let matching = state.counts[i].get(value).copied().unwrap_or(0);
        if matching + self_match - state.min[i] > i64::from(c.max_skew) {
            return Err(Rejection::new(
                Plugin::PodTopologySpread,
                Code::Unschedulable,
                REASON,
            ));
        }
    }
    Ok(())
}

/// What scoring the ScheduleAnyway constraints needs.
#[derive(Debug)]
pub struct ScoreState {
    ignored: HashSet<String>,
    /// Per constraint: domain -> matching pods (hostname domains are counted per node).
    counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
}

/// Prepares scoring over the feasible nodes; None when the pod has no ScheduleAnyway
/// constraint (the plugin then adds nothing).
pub fn pre_score(pod: &PodInfo, feasible: &[&NodeInfo], cache: &Cache) -> Option<ScoreState> {
    let cs = constraints(pod, WhenUnsatisfiable::ScheduleAnyway);
    if cs.is_empty() {
        return None;
    }
    let mut ignored = HashSet::new();
    let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); cs.len()];
    for node in feasible {
        if !has_all_keys(node, &cs) {
            ignored.insert(node.name().to_string());
            continue;
        }
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key != HOSTNAME {
                counts[i]
                    .entry(node.labels()[&c.topology_key].clone())
                    .or_default();
            }
        }
    }
    let weights = cs
        .iter()
        .zip(&counts)
        .map(|(c, m)| {
            let size = if c.topology_key == HOSTNAME {
                feasible.len() - ignored.len()
            } else {
                m.len()
            };
            ((size + 2) as f64).ln()
        })
        .collect();
    for node in cache.nodes() {
        if !has_all_keys(node, &cs) {
            continue;
        }
        for (i, c) in cs.iter().enumerate() {
            if c.topology_key == HOSTNAME || !included(c, pod, node) {
                continue;
            }
            if let Some(n) = counts[i].get_mut(&node.labels()[&c.topology_key]) {
                *n += count_matching(node, &c.selector, pod.namespace());
            }
        }
    }
    Some(ScoreState {
        ignored,
        counts,
        weights,
    })
}

/// The node's weighted count of matching pods (lower is better; normalised below).
pub fn score(state: &ScoreState, pod: &PodInfo, node: &NodeInfo) -> i64 {
    if state.ignored.contains(node.name()) {
        return 0;
    }
    let cs = constraints(pod, WhenUnsatisfiable::ScheduleAnyway);
    let mut sum = 0f64;
    for (i, c) in cs.iter().enumerate() {
        let Some(value) = node.labels().get(&c.topology_key) else {
            continue;
        };
        let count = if c.topology_key == HOSTNAME {
            count_matching(node, &c.selector, pod.namespace())
        } else {
            state.counts[i].get(value).copied().unwrap_or(0)
        };
        sum += count as f64 * state.weights[i] + f64::from(c.max_skew - 1);
    }
    sum.round() as i64
}

/// Fewer matching pods score higher; ignored nodes (missing a key) score 0.
pub fn normalize(state: &ScoreState, nodes: &[&NodeInfo], scores: &mut [i64]) {
    let mut min = i64::MAX;
    let mut max = 0;
    for (n, s) in nodes.iter().zip(scores.iter()) {
        if !state.ignored.contains(n.name()) {
            min = min.min(*s);
            max = max.max(*s);
        }
    }
    for (n, s) in nodes.iter().zip(scores.iter_mut()) {
        *s = if state.ignored.contains(n.name()) {
            0
        } else if max == 0 {
            MAX_NODE_SCORE
        } else {
            MAX_NODE_SCORE * (max + min - *s) / max
        };
    }
}

/// Queueing hint: an assigned pod that a constraint of `pod` counts came, went or changed.
pub fn pod_could_help(pod: &PodInfo, changed: &PodInfo) -> bool {
    changed.namespace() == pod.namespace()
        && pod
            .spread
            .iter()
            .any(|c| c.selector.matches(changed.labels()))
}

/// Queueing hint: a node with every topology key of the pod came, went, or changed labels.
pub fn node_could_help(pod: &PodInfo, old: Option<&Node>, new: &Node) -> bool {
    if pod.spread.is_empty() {
        return false;
    }
    let has_keys = |n: &Node| {
        let l = n.metadata.labels.as_ref();
        pod.spread
            .iter()
            .all(|c| l.is_some_and(|l| l.contains_key(&c.topology_key)))
    };
    match old {
        None => has_keys(new),
        Some(o) => o.metadata.labels != new.metadata.labels && (has_keys(o) || has_keys(new)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{cache, node, pod};
    use serde_json::json;
    use std::sync::Arc;

    fn web(name: &str) -> Arc<PodInfo> {
        pod(json!({"metadata": {"name": name, "labels": {"app": "web"}}}))
    }

    fn spread_pod(when: &str, max_skew: i32, key: &str) -> Arc<PodInfo> {
        pod(
            json!({"metadata": {"name": "new", "labels": {"app": "web"}}, "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "topologySpreadConstraints": [{"maxSkew": max_skew, "topologyKey": key,
                "whenUnsatisfiable": when, "labelSelector": {"matchLabels": {"app": "web"}}}]}}),
        )
    }

    fn zoned(name: &str, zone: &str) -> Arc<Node> {
        node(name, "4", "8Gi", json!({"zone": zone}), json!({}))
    }

    #[test]
    fn do_not_schedule_keeps_skew_within_max_skew() {
        // zone a: 2 web pods, zone b: 0 -> a new web pod must go to b.
        let c = cache(
            &[
                zoned("a1", "a"),
                zoned("a2", "a"),
                zoned("b1", "b"),
                node("x", "4", "8Gi", json!({}), json!({})),
            ],
            &[(web("w1"), "a1"), (web("w2"), "a2")],
        );
        let p = spread_pod("DoNotSchedule", 1, "zone");
        let s = pre_filter(&p, &c).unwrap();
        assert_eq!(
            filter(&s, &p, c.node("a1").unwrap()).unwrap_err().reasons,
            vec![REASON]
        );
        assert!(filter(&s, &p, c.node("b1").unwrap()).is_ok());
        assert_eq!(
            filter(&s, &p, c.node("x").unwrap()).unwrap_err().reasons,
            vec![REASON_MISSING_LABEL]
        );
        let lax = spread_pod("DoNotSchedule", 3, "zone");
        let s = pre_filter(&lax, &c).unwrap();
        assert!(filter(&s, &lax, c.node("a1").unwrap()).is_ok());
        assert!(pre_filter(&pod(json!({})), &c).is_none());
    }

    #[test]
    fn nodes_the_pod_cannot_use_are_not_domains() {
        // Zone b is excluded by the pod's nodeSelector, so its emptiness does not hold zone a
        // back (nodeAffinityPolicy Honor).
        let c = cache(
            &[
                node(
                    "a1",
                    "4",
                    "8Gi",
                    json!({"zone": "a", "pool": "web"}),
                    json!({}),
                ),
                node("b1", "4", "8Gi", json!({"zone": "b"}), json!({})),
            ],
            &[(web("w1"), "a1")],
        );
        let p = pod(
            json!({"metadata": {"name": "new", "labels": {"app": "web"}}, "spec": {
            "containers": [{"name": "c", "image": "i"}], "nodeSelector": {"pool": "web"},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}}),
        );
        let s = pre_filter(&p, &c).unwrap();
        assert!(filter(&s, &p, c.node("a1").unwrap()).is_ok());
    }

    #[test]
    fn schedule_anyway_prefers_emptier_domains() {
        let c = cache(
            &[zoned("a1", "a"), zoned("b1", "b"), zoned("b2", "b")],
            &[(web("w1"), "a1"), (web("w2"), "a1"), (web("w3"), "b1")],
        );
        let p = spread_pod("ScheduleAnyway", 1, "kubernetes.io/hostname");
        let nodes: Vec<&NodeInfo> = ["a1", "b1", "b2"]
            .iter()
            .map(|n| c.node(n).unwrap())
            .collect();
        let st = pre_score(&p, &nodes, &c).unwrap();
        let mut scores: Vec<i64> = nodes.iter().map(|n| score(&st, &p, n)).collect();
        normalize(&st, &nodes, &mut scores);
        assert!(scores[2] > scores[1] && scores[1] > scores[0], "{scores:?}");
        assert_eq!(scores[2], MAX_NODE_SCORE);
        assert!(pre_score(&pod(json!({})), &nodes, &c).is_none());
    }

    #[test]
    fn hints_follow_selected_pods_and_topology_nodes() {
        let p = spread_pod("DoNotSchedule", 1, "zone");
        assert!(pod_could_help(&p, &web("w")));
        assert!(!pod_could_help(
            &p,
            &pod(json!({"metadata": {"name": "db", "labels": {"app": "db"}}}))
        ));
        assert!(node_could_help(&p, None, &zoned("n", "a")));
        assert!(!node_could_help(
            &p,
            None,
            &node("n", "1", "1Gi", json!({}), json!({}))
        ));
        assert!(!node_could_help(
            &p,
            Some(&zoned("n", "a")),
            &zoned("n", "a")
        ));
        assert!(node_could_help(
            &p,
            Some(&zoned("n", "a")),
            &zoned("n", "b")
        ));
    }
}
