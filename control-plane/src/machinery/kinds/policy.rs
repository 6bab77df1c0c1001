//! policy/v1 PodDisruptionBudget: validation as Kubernetes' (minAvailable and maxUnavailable
//! not both set, each a non-negative int or a percentage of at most 100%, a valid selector,
//! a known unhealthyPodEvictionPolicy; the status counts non-negative) and kubectl's columns
//! (NAME MIN AVAILABLE MAX UNAVAILABLE ALLOWED DISRUPTIONS AGE).

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::apps::{int_or_percent, non_negative};
use super::common::{age_cell, decode, default_row, meta_errors, name_cell, validate_typed};
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{FieldPath, NameRule, Scope};

pub const GROUP: &str = "policy";

/// The unhealthy pod eviction policies (Kubernetes' UnhealthyPodEvictionPolicyType).
pub const IF_HEALTHY_BUDGET: &str = "IfHealthyBudget";
pub const ALWAYS_ALLOW: &str = "AlwaysAllow";
const EVICTION_POLICIES: &[&str] = &[IF_HEALTHY_BUDGET, ALWAYS_ALLOW];

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &PodDisruptionBudget, old: Option<&PodDisruptionBudget>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            let path = FieldPath::new("spec");
            let spec = new.spec.clone().unwrap_or_default();
            if spec.min_available.is_some() && spec.max_unavailable.is_some() {
                errs.push(FieldError::invalid_unquoted(
                    &path,
                    "spec",
                    "minAvailable and maxUnavailable cannot be both set",
                ));
            }
            for (field, value) in [
                ("minAvailable", &spec.min_available),
                ("maxUnavailable", &spec.max_unavailable),
            ] {
                if let Some(v) = value {
                    errs.extend(int_or_percent(v, &path.child(field), true).0);
                }
            }
            if let Some(sel) = &spec.selector {
                if let Err(e) = LabelSelector::from_meta(sel) {
                    errs.push(FieldError::invalid_unquoted(
                        path.child("selector"),
                        super::format_selector(Some(sel)),
                        &e.message,
                    ));
                }
            }
            if let Some(p) = spec
                .unhealthy_pod_eviction_policy
                .as_deref()
                .filter(|p| !EVICTION_POLICIES.contains(p))
            {
                errs.push(FieldError::not_supported(
                    path.child("unhealthyPodEvictionPolicy"),
                    p,
                    EVICTION_POLICIES,
                ));
            }
            if let Some(s) = &new.status {
                let sp = FieldPath::new("status");
                for (field, v) in [
                    ("disruptionsAllowed", s.disruptions_allowed),
                    ("currentHealthy", s.current_healthy),
                    ("desiredHealthy", s.desired_healthy),
                    ("expectedPods", s.expected_pods),
                ] {
                    non_negative(&mut errs, sp.child(field), Some(v));
                }
            }
            errs
        },
    )
}

/// The condition the disruption controller and the eviction handler keep.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
pub const SUFFICIENT_PODS: &str = "SufficientPods";
pub const INSUFFICIENT_PODS: &str = "InsufficientPods";

/// Kubernetes' UpdateDisruptionAllowedCondition on a status object: DisruptionAllowed True
/// (SufficientPods) while `disruptionsAllowed` > 0, else False (InsufficientPods); the
/// transition time moves only when the status does.
pub fn set_disruption_allowed(status: &mut Value, now: &str) {
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0) > 0;
    let generation = status["observedGeneration"].as_i64().unwrap_or(0);
    let (state, reason) = if allowed {
        ("True", SUFFICIENT_PODS)
    } else {
        ("False", INSUFFICIENT_PODS)
    };
    if !status["conditions"].is_array() {
        status["conditions"] = Value::Array(vec![]);
    }
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return;
    };
    let at = conditions
        .iter()
        .position(|c| c["type"] == DISRUPTION_ALLOWED);
    let transition = match at.map(|i| &conditions[i]) {
        Some(c) if c["status"] == state => c["lastTransitionTime"].clone(),
        _ => Value::from(now),
    };
    let condition = serde_json::json!({
        "type": DISRUPTION_ALLOWED, "status": state, "reason": reason, "message": "",
        "observedGeneration": generation, "lastTransitionTime": transition,
    });
    match at {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// kubectl's rendering of an IntOrString: `2`, `50%`, or `N/A` when unset.
fn int_or_string_cell(v: Option<&IntOrString>) -> Value {
    Value::from(match v {
        None => "N/A".to_string(),
        Some(IntOrString::Int(n)) => n.to_string(),
        Some(IntOrString::String(s)) => s.clone(),
    })
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Min Available",
            ColumnType::String,
            "The minimum number of pods that must be available.",
        ),
        TableColumnDefinition::new(
            "Max Unavailable",
            ColumnType::String,
            "The maximum number of pods that may be unavailable.",
        ),
        TableColumnDefinition::new(
            "Allowed Disruptions",
            ColumnType::Integer,
            "Calculated number of pods that may be disrupted at this time.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(pdb) = decode::<PodDisruptionBudget>(v) else {
        return default_row(v, now);
    };
    let spec = pdb.spec.clone().unwrap_or_default();
    vec![
        name_cell(&pdb.metadata),
        int_or_string_cell(spec.min_available.as_ref()),
        int_or_string_cell(spec.max_unavailable.as_ref()),
        Value::from(pdb.status.map_or(0, |s| s.disruptions_allowed)),
        age_cell(&pdb.metadata, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget(spec: Value) -> Value {
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default",
                "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": spec})
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn one_of_min_and_max_each_int_or_percent() {
        let sel = json!({"matchLabels": {"app": "web"}});
        assert!(validate(&budget(json!({"minAvailable": 2, "selector": sel})), None).is_empty());
        assert!(validate(
            &budget(json!({"maxUnavailable": "25%", "selector": sel})),
            None
        )
        .is_empty());
        assert_eq!(
            messages(&validate(
                &budget(json!({"minAvailable": 1, "maxUnavailable": 1})),
                None
            )),
            vec!["spec: Invalid value: spec: minAvailable and maxUnavailable cannot be both set"]
        );
        assert_eq!(
            messages(&validate(&budget(json!({"minAvailable": -1})), None)),
            vec!["spec.minAvailable: Invalid value: -1: must be greater than or equal to 0"]
        );
        assert_eq!(
            messages(&validate(&budget(json!({"maxUnavailable": "120%"})), None)),
            vec!["spec.maxUnavailable: Invalid value: \"120%\": must not be greater than 100%"]
        );
        assert_eq!(
            messages(&validate(&budget(json!({"minAvailable": "half"})), None)).len(),
            1
        );
        let bad_sel = budget(json!({"minAvailable": 1, "selector": {"matchExpressions":
            [{"key": "app", "operator": "Near", "values": ["x"]}]}}));
        assert_eq!(validate(&bad_sel, None)[0].field, "spec.selector");
        assert_eq!(
            messages(&validate(
                &budget(json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"})),
                None
            )),
            vec!["spec.unhealthyPodEvictionPolicy: Unsupported value: \"Sometimes\": supported values: \"IfHealthyBudget\", \"AlwaysAllow\""]
        );
    }

    #[test]
    fn the_condition_follows_disruptions_allowed() {
        let mut status = json!({"disruptionsAllowed": 1, "observedGeneration": 2});
        set_disruption_allowed(&mut status, "2025-01-01T12:00:00Z");
        assert_eq!(status["conditions"][0]["reason"], SUFFICIENT_PODS);
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["conditions"][0]["observedGeneration"], 2);
        set_disruption_allowed(&mut status, "2025-01-01T12:05:00Z");
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            "2025-01-01T12:00:00Z"
        );
        status["disruptionsAllowed"] = json!(0);
        set_disruption_allowed(&mut status, "2025-01-01T12:06:00Z");
        assert_eq!(status["conditions"].as_array().unwrap().len(), 1);
        assert_eq!(status["conditions"][0]["reason"], INSUFFICIENT_PODS);
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            "2025-01-01T12:06:00Z"
        );
    }

    #[test]
    fn rows_as_kubectl_prints_them() {
        let now = "2025-01-01T12:00:00Z".parse().unwrap();
        let mut v = budget(json!({"minAvailable": "50%"}));
        v["status"] = json!({"disruptionsAllowed": 1, "currentHealthy": 3,
            "desiredHealthy": 2, "expectedPods": 3});
        assert_eq!(
            row(&v, now),
            vec![
                json!("web"),
                json!("50%"),
                json!("N/A"),
                json!(1),
                json!("60m")
            ]
        );
    }
}
