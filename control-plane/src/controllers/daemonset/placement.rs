//! Where a DaemonSet's pods belong, pure (Kubernetes' NodeShouldRunDaemonPod and the pod it
//! would make): the daemon pod is the template plus the default DaemonSet tolerations and a
//! required node affinity on `metadata.name` (matchFields) so the scheduler places it on
//! exactly that node. A node should run it when nodeSelector and required affinity match and
//! no NoSchedule/NoExecute taint is untolerated; a pod already there may keep running unless
//! a NoExecute taint is untolerated.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Taint, Toleration,
};
use kube::ResourceExt;

use crate::controllers::tainteviction::tolerates;
use crate::machinery::LabelSelector;

const NAME_FIELD: &str = "metadata.name";

/// The tolerations every daemon pod gets (AddOrUpdateDaemonPodTolerations).
pub fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        value: None,
        toleration_seconds: None,
    };
    let mut v = vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        v.push(t("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    v
}

/// Adds `extra` tolerations, replacing ones with the same key, operator and effect.
pub fn add_tolerations(spec: &mut PodSpec, extra: Vec<Toleration>) {
    let list = spec.tolerations.get_or_insert_with(Vec::new);
    for t in extra {
        list.retain(|x| !(x.key == t.key && x.effect == t.effect && x.operator == t.operator));
        list.push(t);
    }
}

/// Replaces the required node affinity with "metadata.name In [node]"
/// (ReplaceDaemonSetPodNodeNameNodeAffinity).
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let selector = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: NAME_FIELD.into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let na = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(selector);
}

/// The node a daemon pod is for: its nodeName, or the node its affinity pins it to.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|r| {
            (r.key == NAME_FIELD && r.operator == "In")
                .then(|| {
                    r.values
                        .as_ref()
                        .filter(|v| v.len() == 1)
                        .map(|v| v[0].clone())
                })
                .flatten()
        })
    })
}

/// Whether a node matches the pod's nodeSelector and required node affinity.
pub fn fits_affinity(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.labels();
    if let Some(sel) = spec.node_selector.as_ref() {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    let fields: BTreeMap<String, String> = [(NAME_FIELD.to_string(), node.name_any())].into();
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fs = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fs.is_empty() {
            return false;
        }
        let ok = |reqs: &[NodeSelectorRequirement], map: &BTreeMap<String, String>| {
            reqs.is_empty()
                || LabelSelector::from_node_selector_requirements(reqs)
                    .is_ok_and(|s| s.matches(map))
        };
        ok(exprs, labels) && ok(fs, &fields)
    })
}

fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// (should run, may keep running) for the daemon pod `spec` (tolerations already added).
pub fn should_run(spec: &PodSpec, node: &Node) -> (bool, bool) {
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name_any())
    {
        return (false, false);
    }
    if !fits_affinity(spec, node) {
        return (false, false);
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    if untolerated(&taints, &tolerations, &["NoSchedule", "NoExecute"]).is_some() {
        return (
            false,
            untolerated(&taints, &tolerations, &["NoExecute"]).is_none(),
        );
    }
    (true, true)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    fn daemon_spec() -> PodSpec {
        let mut s = PodSpec::default();
        add_tolerations(&mut s, default_tolerations(false));
        s
    }

    #[test]
    fn pinned_pods_name_their_node() {
        let mut s = daemon_spec();
        pin_to_node(&mut s, "n2");
        let pod = Pod {
            spec: Some(s.clone()),
            ..Default::default()
        };
        assert_eq!(target_node(&pod).as_deref(), Some("n2"));
        assert!(fits_affinity(&s, &node("n2", &[], vec![])));
        assert!(!fits_affinity(&s, &node("n1", &[], vec![])));
    }

    #[test]
    fn taints_and_selectors_decide_eligibility() {
        let s = daemon_spec();
        assert_eq!(should_run(&s, &node("n", &[], vec![])), (true, true));
        // Default tolerations cover cordoned and unreachable nodes.
        assert_eq!(
            should_run(
                &s,
                &node(
                    "n",
                    &[],
                    vec![taint("node.kubernetes.io/unschedulable", "NoSchedule")]
                )
            ),
            (true, true)
        );
        assert_eq!(
            should_run(
                &s,
                &node(
                    "n",
                    &[],
                    vec![taint("node.kubernetes.io/unreachable", "NoExecute")]
                )
            ),
            (true, true)
        );
        // A foreign NoSchedule taint: no new pod, an existing one stays.
        assert_eq!(
            should_run(&s, &node("n", &[], vec![taint("dedicated", "NoSchedule")])),
            (false, true)
        );
        assert_eq!(
            should_run(&s, &node("n", &[], vec![taint("dedicated", "NoExecute")])),
            (false, false)
        );
        let mut sel = s.clone();
        sel.node_selector = Some([("role".to_string(), "edge".to_string())].into());
        assert_eq!(
            should_run(&sel, &node("n", &[("role", "edge")], vec![])),
            (true, true)
        );
        assert_eq!(should_run(&sel, &node("n", &[], vec![])), (false, false));
    }
}
