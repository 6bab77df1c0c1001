//! NodeAffinity: the pod's nodeSelector and required node affinity must match the node
//! (filter); each preferred term the node matches adds its weight (score). A pod whose
//! required terms all pin `metadata.name` (as DaemonSet pods do) is only evaluated against
//! those nodes, which makes placing a DaemonSet pod O(1) instead of O(nodes).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, NodeSelector, PreferredSchedulingTerm};

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::default_normalize;
use crate::machinery::{node_selector_matches, node_selector_term_matches};

pub const REASON: &str = "node(s) didn't match Pod's node affinity/selector";
pub const CONFLICT: &str = "pod affinity terms conflict";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn required(pod: &PodInfo) -> Option<&NodeSelector> {
    pod.pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

fn preferred(pod: &PodInfo) -> &[PreferredSchedulingTerm] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_deref()
        })
        .unwrap_or(&[])
}

/// Whether `node` satisfies the pod's nodeSelector and required node affinity (what
/// PodTopologySpread's nodeAffinityPolicy Honor also uses).
pub fn required_matches(pod: &PodInfo, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
    let name = node.metadata.name.as_deref().unwrap_or("");
    let spec = pod.pod.spec.as_ref();
    if let Some(sel) = spec.and_then(|s| s.node_selector.as_ref()) {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    match required(pod) {
        Some(r) => node_selector_matches(r, labels, name),
        None => true,
    }
}

/// The nodes a pod can only go to, when every required term names them through
/// `matchFields metadata.name In`. `Ok(None)`: any node; `Err`: the terms exclude every node.
pub fn pre_filter(pod: &PodInfo) -> Result<Option<BTreeSet<String>>, Rejection> {
    let Some(r) = required(pod).filter(|r| !r.node_selector_terms.is_empty()) else {
        return Ok(None);
    };
    let mut names: BTreeSet<String> = BTreeSet::new();
    for term in &r.node_selector_terms {
        let mut term_names: Option<BTreeSet<String>> = None;
        for f in term.match_fields.iter().flatten() {
            if f.key == "metadata.name" && f.operator == "In" {
                let s: BTreeSet<String> = f.values.iter().flatten().cloned().collect();
                term_names = Some(match term_names {
                    None => s,
                    Some(t) => t.intersection(&s).cloned().collect(),
                });
            }
        }
        match term_names {
            // The terms are ORed: one without a name pin lets every node through.
            None => return Ok(None),
            Some(t) => names.extend(t),
        }
    }
    if names.is_empty() {
        return Err(Rejection::new(
            Plugin::NodeAffinity,
            Code::UnschedulableAndUnresolvable,
            CONFLICT,
        ));
    }
    Ok(Some(names))
}

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    match node.node() {
        Some(n) if required_matches(pod, n) => Ok(()),
        _ => Err(Rejection::new(
            Plugin::NodeAffinity,
            Code::UnschedulableAndUnresolvable,
            REASON,
        )),
    }
}

/// Whether scoring applies (the pod has preferred terms).
pub fn has_preferences(pod: &PodInfo) -> bool {
    !preferred(pod).is_empty()
}

/// The summed weights of the preferred terms the node matches.
pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    preferred(pod)
        .iter()
        .filter(|t| {
            t.weight != 0 && node_selector_term_matches(&t.preference, node.labels(), node.name())
        })
        .map(|t| i64::from(t.weight))
        .sum()
}

pub fn normalize(scores: &mut [i64]) {
    default_normalize(scores, false);
}

/// Queueing hint: a new node, or a node whose labels now match where they did not.
pub fn node_could_help(pod: &PodInfo, old: Option<&Node>, new: &Node) -> bool {
    required_matches(pod, new) && !old.is_some_and(|o| required_matches(pod, o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, node_info, pod};
    use serde_json::json;

    #[test]
    fn node_selector_and_required_affinity_must_both_match() {
        let ssd_a = node_info(
            node(
                "a",
                "1",
                "1Gi",
                json!({"disk": "ssd", "zone": "z1"}),
                json!({}),
            ),
            &[],
        );
        let ssd_b = node_info(
            node(
                "b",
                "1",
                "1Gi",
                json!({"disk": "ssd", "zone": "z2"}),
                json!({}),
            ),
            &[],
        );
        let hdd = node_info(
            node(
                "c",
                "1",
                "1Gi",
                json!({"disk": "hdd", "zone": "z1"}),
                json!({}),
            ),
            &[],
        );
        let p = pod(
            json!({"spec": {"nodeSelector": {"disk": "ssd"}, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}}}}}),
        );
        assert!(filter(&p, &ssd_a).is_ok());
        assert_eq!(filter(&p, &ssd_b).unwrap_err().reasons, vec![REASON]);
        assert!(filter(&p, &hdd).is_err());
    }

    #[test]
    fn name_pinned_terms_restrict_the_candidates() {
        let ds = pod(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]}}}}}));
        assert_eq!(
            pre_filter(&ds).unwrap(),
            Some(BTreeSet::from(["n7".to_string()]))
        );
        let mixed = pod(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}}}}}));
        assert_eq!(pre_filter(&mixed).unwrap(), None);
        let conflict = pod(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]},
                                 {"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}}));
        assert_eq!(pre_filter(&conflict).unwrap_err().reasons, vec![CONFLICT]);
        assert_eq!(pre_filter(&pod(json!({}))).unwrap(), None);
    }

    #[test]
    fn preferred_terms_add_their_weights() {
        let p = pod(
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
            {"weight": 30, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}}]}}}}),
        );
        let both = node_info(
            node(
                "a",
                "1",
                "1Gi",
                json!({"disk": "ssd", "zone": "z1"}),
                json!({}),
            ),
            &[],
        );
        let one = node_info(
            node("b", "1", "1Gi", json!({"disk": "ssd"}), json!({})),
            &[],
        );
        let none = node_info(node("c", "1", "1Gi", json!({}), json!({})), &[]);
        assert!(has_preferences(&p));
        let mut s = [score(&p, &both), score(&p, &one), score(&p, &none)];
        assert_eq!(s, [40, 10, 0]);
        normalize(&mut s);
        assert_eq!(s, [100, 25, 0]);
    }

    #[test]
    fn hint_queues_when_labels_start_matching() {
        let p = pod(json!({"spec": {"nodeSelector": {"disk": "ssd"}}}));
        let before = node("a", "1", "1Gi", json!({}), json!({}));
        let after = node("a", "1", "1Gi", json!({"disk": "ssd"}), json!({}));
        assert!(node_could_help(&p, Some(&before), &after));
        assert!(!node_could_help(&p, Some(&after), &after));
        assert!(!node_could_help(&p, None, &before));
    }
}
