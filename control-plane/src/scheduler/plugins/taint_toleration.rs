//! TaintToleration: a node's NoSchedule and NoExecute taints keep off every pod that does not
//! tolerate them (filter); PreferNoSchedule taints a pod does not tolerate lower the node's
//! score (fewer is better).

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use super::super::framework::{Code, Plugin, Rejection};
use super::super::node_info::NodeInfo;
use super::super::pod_info::PodInfo;
use super::default_normalize;

/// Kubernetes' `Toleration.ToleratesTaint`.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("") {
        "" | "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

fn blocks_scheduling(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

/// The first NoSchedule/NoExecute taint in `taints` that `tolerations` do not tolerate.
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|t| blocks_scheduling(t) && !tolerated(tolerations, t))
}

pub fn filter(pod: &PodInfo, node: &NodeInfo) -> Result<(), Rejection> {
    match untolerated(node.taints(), &pod.tolerations) {
        None => Ok(()),
        Some(t) => Err(Rejection::new(
            Plugin::TaintToleration,
            Code::UnschedulableAndUnresolvable,
            format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or("")
            ),
        )),
    }
}

/// How many PreferNoSchedule taints the pod does not tolerate (only its PreferNoSchedule or
/// effect-less tolerations count).
pub fn score(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let prefer: Vec<&Toleration> = pod
        .tolerations
        .iter()
        .filter(|t| {
            matches!(
                t.effect.as_deref(),
                None | Some("") | Some("PreferNoSchedule")
            )
        })
        .collect();
    node.taints()
        .iter()
        .filter(|t| t.effect == "PreferNoSchedule")
        .filter(|t| !prefer.iter().any(|tol| tolerates(tol, t)))
        .count() as i64
}

/// Fewer intolerable taints score higher.
pub fn normalize(scores: &mut [i64]) {
    default_normalize(scores, true);
}

/// Queueing hint: a new or changed node whose blocking taints the pod tolerates.
pub fn node_could_help(pod: &PodInfo, old: Option<&Node>, new: &Node) -> bool {
    let taints = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
    };
    let now_ok = untolerated(&taints(new), &pod.tolerations).is_none();
    let was_ok = old.is_some_and(|o| untolerated(&taints(o), &pod.tolerations).is_none());
    now_ok && !was_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::{node, node_info, pod};
    use serde_json::json;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()).filter(|v: &String| !v.is_empty()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn tol(v: serde_json::Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn toleration_matching_follows_kubernetes() {
        let t = taint("k", "v", "NoSchedule");
        assert!(tolerates(
            &tol(json!({"key": "k", "value": "v", "effect": "NoSchedule"})),
            &t
        ));
        assert!(tolerates(
            &tol(json!({"key": "k", "operator": "Equal", "value": "v"})),
            &t
        ));
        assert!(!tolerates(&tol(json!({"key": "k", "value": "w"})), &t));
        assert!(tolerates(
            &tol(json!({"key": "k", "operator": "Exists"})),
            &t
        ));
        assert!(
            tolerates(&tol(json!({"operator": "Exists"})), &t),
            "empty key + Exists tolerates all"
        );
        assert!(!tolerates(
            &tol(json!({"key": "k", "operator": "Exists", "effect": "NoExecute"})),
            &t
        ));
        assert!(!tolerates(
            &tol(json!({"key": "k", "operator": "Lt", "value": "v"})),
            &t
        ));
    }

    #[test]
    fn untolerated_taint_is_named_in_the_reason() {
        let n = node_info(
            node(
                "n",
                "1",
                "1Gi",
                json!({}),
                json!({"taints": [
                {"key": "soft", "effect": "PreferNoSchedule"},
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}),
            ),
            &[],
        );
        let r = filter(&pod(json!({})), &n).unwrap_err();
        assert_eq!(
            r.reasons,
            vec!["node(s) had untolerated taint {dedicated: gpu}"]
        );
        assert_eq!(r.code, Code::UnschedulableAndUnresolvable);
        let tolerant =
            pod(json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}));
        assert!(filter(&tolerant, &n).is_ok());
        let no_value = node_info(
            node(
                "m",
                "1",
                "1Gi",
                json!({}),
                json!({"taints": [
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}),
            ),
            &[],
        );
        assert_eq!(
            filter(&pod(json!({})), &no_value).unwrap_err().reasons,
            vec!["node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"]
        );
    }

    #[test]
    fn prefer_no_schedule_taints_lower_the_score() {
        let spec = json!({"taints": [{"key": "a", "effect": "PreferNoSchedule"}, {"key": "b", "effect": "PreferNoSchedule"}]});
        let n = node_info(node("n", "1", "1Gi", json!({}), spec), &[]);
        let clean = node_info(node("c", "1", "1Gi", json!({}), json!({})), &[]);
        let p = pod(
            json!({"spec": {"tolerations": [{"key": "a", "operator": "Exists", "effect": "PreferNoSchedule"},
            {"key": "b", "operator": "Exists", "effect": "NoSchedule"}]}}),
        );
        let mut scores = [score(&p, &n), score(&p, &clean)];
        assert_eq!(
            scores,
            [1, 0],
            "a NoSchedule toleration does not soften PreferNoSchedule"
        );
        normalize(&mut scores);
        assert_eq!(scores, [0, 100]);
    }

    #[test]
    fn hint_queues_when_a_blocking_taint_goes() {
        let tainted = node(
            "n",
            "1",
            "1Gi",
            json!({}),
            json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}),
        );
        let clean = node("n", "1", "1Gi", json!({}), json!({}));
        let p = pod(json!({}));
        assert!(node_could_help(&p, Some(&tainted), &clean));
        assert!(
            !node_could_help(&p, Some(&clean), &clean),
            "nothing changed for this pod"
        );
        assert!(!node_could_help(&p, None, &tainted));
        assert!(node_could_help(&p, None, &clean));
    }
}
