//! A Job's podFailurePolicy applied to one failed pod (Kubernetes' `matchPodFailurePolicy`):
//! the first rule whose exit codes or pod conditions match decides whether the failure fails
//! the Job, fails only its index, is ignored (not counted against backoffLimit) or counts.

use k8s_openapi::api::batch::v1::{PodFailurePolicy, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// What a matching rule does with the failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The Job fails now (FailureTarget, reason PodFailurePolicy) with this message.
    FailJob(String),
    /// The pod's index fails (backoffLimitPerIndex), with this message.
    FailIndex(String),
    /// Not counted against the backoff limit; the pod is replaced.
    Ignore,
    /// Counted as usual (a Count rule, or no rule matched).
    Count,
}

/// Judges a failed pod. `None` policy: every failure counts.
pub fn judge(policy: Option<&PodFailurePolicy>, pod: &Pod) -> Verdict {
    let Some(policy) = policy else {
        return Verdict::Count;
    };
    for (i, rule) in policy.rules.iter().enumerate() {
        if let Some(message) = matches(rule, i, pod) {
            return match rule.action.as_str() {
                "FailJob" => Verdict::FailJob(message),
                "FailIndex" => Verdict::FailIndex(message),
                "Ignore" => Verdict::Ignore,
                _ => Verdict::Count,
            };
        }
    }
    Verdict::Count
}

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or(&[])
        .iter()
        .chain(
            status
                .and_then(|s| s.container_statuses.as_deref())
                .unwrap_or(&[])
                .iter(),
        )
}

/// The rule's message (Kubernetes' wording) if it matches the pod.
fn matches(rule: &PodFailurePolicyRule, index: usize, pod: &Pod) -> Option<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(req) = &rule.on_exit_codes {
        for cs in statuses(pod) {
            if req.container_name.as_ref().is_some_and(|n| *n != cs.name) {
                continue;
            }
            let Some(code) = cs
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code)
            else {
                continue;
            };
            // Exit code 0 never matches: the container did not fail.
            if code == 0 {
                continue;
            }
            let listed = req.values.contains(&code);
            let hit = match req.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            };
            if hit {
                return Some(format!(
                    "Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                    cs.name, rule.action
                ));
            }
        }
        return None;
    }
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    for pattern in rule.on_pod_conditions.iter().flatten() {
        let want = if pattern.status.is_empty() {
            "True"
        } else {
            pattern.status.as_str()
        };
        if conditions
            .iter()
            .any(|c| c.type_ == pattern.type_ && c.status == want)
        {
            return Some(format!(
                "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                pattern.type_, rule.action
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(rules: serde_json::Value) -> PodFailurePolicy {
        serde_json::from_value(json!({ "rules": rules })).unwrap()
    }

    fn failed_pod(code: i32, conditions: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "pi-x", "namespace": "default"},
            "status": {"phase": "Failed", "conditions": conditions,
                "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": code}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = policy(json!([
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1, 42]}},
        ]));
        assert_eq!(
            judge(Some(&p), &failed_pod(42, json!([]))),
            Verdict::FailJob("Container main for pod default/pi-x failed with exit code 42 matching FailJob rule at index 1".into())
        );
        assert_eq!(
            judge(
                Some(&p),
                &failed_pod(42, json!([{"type": "DisruptionTarget", "status": "True"}]))
            ),
            Verdict::Ignore
        );
        assert_eq!(judge(Some(&p), &failed_pod(1, json!([]))), Verdict::Count);
        assert_eq!(judge(Some(&p), &failed_pod(3, json!([]))), Verdict::Count);
        assert_eq!(judge(None, &failed_pod(42, json!([]))), Verdict::Count);
        let other = policy(json!([
            {"action": "FailJob", "onExitCodes": {"containerName": "side", "operator": "In", "values": [42]}},
        ]));
        assert_eq!(
            judge(Some(&other), &failed_pod(42, json!([]))),
            Verdict::Count
        );
    }
}
