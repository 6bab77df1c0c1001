//! InterPodAffinity: required pod affinity (the node's topology domain must already hold a pod
//! matching every term, unless no pod anywhere does and the pod matches its own terms),
//! required anti-affinity (the domain must hold no pod matching a term), and the symmetric
//! rule that existing pods' required anti-affinity keeps the incoming pod out of their domains
//! (filter). Preferred terms of the incoming pod and of existing pods, and existing pods'
//! required affinity (weight 1), add or subtract per domain (score, min-max normalised).
//!
//! The pre-filter visits the pods with anti-affinity terms (kept per node by the cache) and,
//! only for a pod that has required terms of its own, every pod; pods without any term pay
//! nothing when no existing pod has anti-affinity.

use std::collections::{BTreeMap, HashMap};

use super::super::cache::Cache;
use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::{AffinityTerm, PodInfo};
use super::MAX_NODE_SCORE;

pub const REASON_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const REASON_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const REASON_EXISTING_ANTI_AFFINITY: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

/// kube-scheduler's default hardPodAffinityWeight.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// Counts per topology pair: key -> value -> n.
#[derive(Debug, Default)]
struct PairCounts(HashMap<String, HashMap<String, i64>>);

impl PairCounts {
    fn add(&mut self, node: &NodeInfo, key: &str, delta: i64) {
        if let Some(v) = node.labels().get(key) {
            *self
                .0
                .entry(key.to_string())
                .or_default()
                .entry(v.clone())
                .or_default() += delta;
        }
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .get(key)
            .and_then(|m| m.get(value))
            .copied()
            .unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.0.values().all(|m| m.values().all(|n| *n == 0))
    }
}

fn ns_labels<'a>(cache: &'a Cache, pod: &PodInfo) -> Option<&'a BTreeMap<String, String>> {
    cache.namespace_labels(pod.namespace())
}

fn matches_all(
    terms: &[AffinityTerm],
    pod: &PodInfo,
    ns: Option<&BTreeMap<String, String>>,
) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, ns))
}

/// The topology pairs the filter checks.
#[derive(Debug, Default)]
pub struct FilterState {
    existing_anti_affinity: PairCounts,
    affinity: PairCounts,
    anti_affinity: PairCounts,
}

/// None when neither the pod nor any existing pod has a required term to check.
pub fn pre_filter(pod: &PodInfo, cache: &Cache) -> Option<FilterState> {
    let own_terms = !pod.required_affinity.is_empty() || !pod.required_anti_affinity.is_empty();
    let mut existing = cache.nodes_with_anti_affinity_pods().peekable();
    if !own_terms && existing.peek().is_none() {
        return None;
    }
    let mut s = FilterState::default();
    let own_ns = ns_labels(cache, pod);
    for node in existing {
        for ep in node.pods_with_required_anti_affinity() {
            for t in &ep.required_anti_affinity {
                if t.matches(pod, own_ns) {
                    s.existing_anti_affinity.add(node, &t.topology_key, 1);
                }
            }
        }
    }
    if own_terms {
        for node in cache.nodes() {
            for ep in node.pods() {
                let ns = ns_labels(cache, ep);
                if matches_all(&pod.required_affinity, ep, ns) {
                    for t in &pod.required_affinity {
                        s.affinity.add(node, &t.topology_key, 1);
                    }
                }
                for t in &pod.required_anti_affinity {
                    if t.matches(ep, ns) {
                        s.anti_affinity.add(node, &t.topology_key, 1);
                    }
                }
            }
        }
    }
    Some(s)
}

pub fn filter(
    state: &FilterState,
    pod: &PodInfo,
    node: &NodeInfo,
    cache: &Cache,
) -> Result<(), Rejection> {
    let labels = node.labels();
    if !pod.required_affinity.is_empty() {
        let mut pods_exist = true;
        for t in &pod.required_affinity {
            match labels.get(&t.topology_key) {
                Some(v) if state.affinity.get(&t.topology_key, v) > 0 => {}
                Some(_) => pods_exist = false,
                None => {
                    return Err(Rejection::new(
                        Plugin::InterPodAffinity,
                        Code::UnschedulableAndUnresolvable,
                        REASON_AFFINITY,
                    ))
                }
            }
        }
        // The first pod of a group with affinity to itself may go anywhere.
        let first_of_group = state.affinity.is_empty()
            && matches_all(&pod.required_affinity, pod, ns_labels(cache, pod));
        if !pods_exist && !first_of_group {
            return Err(Rejection::new(
                Plugin::InterPodAffinity,
                Code::UnschedulableAndUnresolvable,
                REASON_AFFINITY,
            ));
        }
    }
    for t in &pod.required_anti_affinity {
        if let Some(v) = labels.get(&t.topology_key) {
            if state.anti_affinity.get(&t.topology_key, v) > 0 {
                return Err(Rejection::new(
                    Plugin::InterPodAffinity,
                    Code::Unschedulable,
                    REASON_ANTI_AFFINITY,
                ));
            }
        }
    }
    if !state.existing_anti_affinity.is_empty()
        && labels
            .iter()
            .any(|(k, v)| state.existing_anti_affinity.get(k, v) > 0)
    {
        return Err(Rejection::new(
            Plugin::InterPodAffinity,
            Code::Unschedulable,
            REASON_EXISTING_ANTI_AFFINITY,
        ));
    }
    Ok(())
}

/// Per-domain preference totals.
#[derive(Debug)]
pub struct ScoreState {
    scores: PairCounts,
}

/// None when no term, of the pod or of an existing pod, expresses a preference.
pub fn pre_score(pod: &PodInfo, cache: &Cache) -> Option<ScoreState> {
    let own = !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
    let own_ns = ns_labels(cache, pod);
    let mut scores = PairCounts::default();
    let mut visit = |node: &NodeInfo, ep: &PodInfo| {
        if node.labels().is_empty() {
            return;
        }
        let ns = ns_labels(cache, ep);
        for w in &pod.preferred_affinity {
            if w.term.matches(ep, ns) {
                scores.add(node, &w.term.topology_key, i64::from(w.weight));
            }
        }
        for w in &pod.preferred_anti_affinity {
            if w.term.matches(ep, ns) {
                scores.add(node, &w.term.topology_key, -i64::from(w.weight));
            }
        }
        for t in &ep.required_affinity {
            if t.matches(pod, own_ns) {
                scores.add(node, &t.topology_key, HARD_POD_AFFINITY_WEIGHT);
            }
        }
        for w in &ep.preferred_affinity {
            if w.term.matches(pod, own_ns) {
                scores.add(node, &w.term.topology_key, i64::from(w.weight));
            }
        }
        for w in &ep.preferred_anti_affinity {
            if w.term.matches(pod, own_ns) {
                scores.add(node, &w.term.topology_key, -i64::from(w.weight));
            }
        }
    };
    if own {
        for node in cache.nodes() {
            for ep in node.pods() {
                visit(node, ep);
            }
        }
    } else {
        for node in cache.nodes_with_affinity_pods() {
            for ep in node.pods_with_affinity() {
                visit(node, ep);
            }
        }
    }
    if scores.0.is_empty() {
        return None;
    }
    Some(ScoreState { scores })
}

pub fn score(state: &ScoreState, node: &NodeInfo) -> i64 {
    let labels = node.labels();
    state
        .scores
        .0
        .iter()
        .filter_map(|(k, values)| labels.get(k).and_then(|v| values.get(v)))
        .sum()
}

/// Min-max normalisation to 0-100.
pub fn normalize(scores: &mut [i64]) {
    let (Some(min), Some(max)) = (scores.iter().min().copied(), scores.iter().max().copied())
    else {
        return;
    };
    let diff = max - min;
    for s in scores.iter_mut() {
        *s = if diff > 0 {
            (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / diff as f64)) as i64
        } else {
            0
        };
    }
}

/// Queueing hint: an assigned pod appeared (or changed) that the pod's required affinity
/// selects.
pub fn added_pod_could_help(pod: &PodInfo, added: &PodInfo) -> bool {
    pod.required_affinity.iter().any(|t| t.may_match(added))
}

/// Queueing hint: an assigned pod went that blocked the pod through anti-affinity (its own
/// terms or the pod's).
pub fn deleted_pod_could_help(pod: &PodInfo, deleted: &PodInfo) -> bool {
    pod.required_anti_affinity
        .iter()
        .any(|t| t.may_match(deleted))
        || deleted
            .required_anti_affinity
            .iter()
            .any(|t| t.may_match(pod))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{cache, node, pod};
    use serde_json::json;
    use std::sync::Arc;

    fn zoned(name: &str, zone: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
        node(name, "4", "8Gi", json!({"zone": zone}), json!({}))
    }

    fn labelled(name: &str, app: &str) -> Arc<PodInfo> {
        pod(json!({"metadata": {"name": name, "labels": {"app": app}}}))
    }

    fn with_affinity(
        name: &str,
        app: &str,
        kind: &str,
        mode: &str,
        selector_app: &str,
        key: &str,
    ) -> Arc<PodInfo> {
        let term =
            json!({"labelSelector": {"matchLabels": {"app": selector_app}}, "topologyKey": key});
        let body = if mode == "required" {
            json!({"requiredDuringSchedulingIgnoredDuringExecution": [term]})
        } else {
            json!({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": term}]})
        };
        pod(
            json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {
            "containers": [{"name": "c", "image": "i"}], "affinity": {kind: body}}}),
        )
    }

    #[test]
    fn required_anti_affinity_keeps_replicas_apart() {
        let c = cache(
            &[zoned("n1", "a"), zoned("n2", "a"), zoned("n3", "b")],
            &[(
                with_affinity(
                    "w1",
                    "web",
                    "podAntiAffinity",
                    "required",
                    "web",
                    "kubernetes.io/hostname",
                ),
                "n1",
            )],
        );
        let p = with_affinity(
            "w2",
            "web",
            "podAntiAffinity",
            "required",
            "web",
            "kubernetes.io/hostname",
        );
        let s = pre_filter(&p, &c).unwrap();
        let r = filter(&s, &p, c.node("n1").unwrap(), &c).unwrap_err();
        assert_eq!(r.reasons, vec![REASON_ANTI_AFFINITY]);
        assert!(filter(&s, &p, c.node("n2").unwrap(), &c).is_ok());

        // A pod without terms is still kept away by the existing pod's anti-affinity.
        let plain = labelled("w3", "web");
        let s = pre_filter(&plain, &c).unwrap();
        assert_eq!(
            filter(&s, &plain, c.node("n1").unwrap(), &c)
                .unwrap_err()
                .reasons,
            vec![REASON_EXISTING_ANTI_AFFINITY]
        );
        assert!(filter(&s, &plain, c.node("n2").unwrap(), &c).is_ok());
        let other = labelled("db", "db");
        let s = pre_filter(&other, &c).unwrap();
        assert!(filter(&s, &other, c.node("n1").unwrap(), &c).is_ok());
    }

    #[test]
    fn required_affinity_needs_a_matching_pod_in_the_domain() {
        let c = cache(
            &[zoned("n1", "a"), zoned("n2", "a"), zoned("n3", "b")],
            &[(labelled("db", "db"), "n1")],
        );
        let p = with_affinity("web", "web", "podAffinity", "required", "db", "zone");
        let s = pre_filter(&p, &c).unwrap();
        assert!(
            filter(&s, &p, c.node("n2").unwrap(), &c).is_ok(),
            "same zone as db"
        );
        assert_eq!(
            filter(&s, &p, c.node("n3").unwrap(), &c)
                .unwrap_err()
                .reasons,
            vec![REASON_AFFINITY]
        );
        // The first pod of a self-affine group goes anywhere.
        let empty = cache(&[zoned("n1", "a")], &[]);
        let first = with_affinity("w1", "web", "podAffinity", "required", "web", "zone");
        let s = pre_filter(&first, &empty).unwrap();
        assert!(filter(&s, &first, empty.node("n1").unwrap(), &empty).is_ok());
        assert!(pre_filter(&labelled("x", "x"), &empty).is_none());
    }

    #[test]
    fn preferences_score_by_domain() {
        let c = cache(
            &[zoned("n1", "a"), zoned("n2", "a"), zoned("n3", "b")],
            &[(labelled("db", "db"), "n1")],
        );
        let p = with_affinity("web", "web", "podAffinity", "preferred", "db", "zone");
        let st = pre_score(&p, &c).unwrap();
        let mut s: Vec<i64> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| score(&st, c.node(n).unwrap()))
            .collect();
        assert_eq!(s, [10, 10, 0]);
        normalize(&mut s);
        assert_eq!(s, [100, 100, 0]);
        let anti = with_affinity("web", "web", "podAntiAffinity", "preferred", "db", "zone");
        let st = pre_score(&anti, &c).unwrap();
        let mut s: Vec<i64> = ["n1", "n3"]
            .iter()
            .map(|n| score(&st, c.node(n).unwrap()))
            .collect();
        normalize(&mut s);
        assert_eq!(s, [0, 100]);
        assert!(pre_score(&labelled("x", "x"), &c).is_none());
    }

    #[test]
    fn hints() {
        let p = with_affinity("web", "web", "podAffinity", "required", "db", "zone");
        assert!(added_pod_could_help(&p, &labelled("db", "db")));
        assert!(!added_pod_could_help(&p, &labelled("x", "x")));
        let anti = with_affinity("w", "web", "podAntiAffinity", "required", "web", "zone");
        assert!(deleted_pod_could_help(&anti, &labelled("w0", "web")));
        assert!(deleted_pod_could_help(&labelled("w", "web"), &anti));
        assert!(!deleted_pod_could_help(
            &labelled("x", "x"),
            &labelled("y", "y")
        ));
    }
}
