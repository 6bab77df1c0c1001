//! scheduling.k8s.io/v1 PriorityClass: the built-in system classes, validation (reserved
//! `system-` names, the highest value a user may define, immutable value and preemption
//! policy), defaulting and kubectl's columns (NAME VALUE GLOBAL-DEFAULT AGE PREEMPTIONPOLICY).

use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::common::{age_cell, decode, default_row, meta_errors, name_cell, validate_typed};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{NameRule, Scope};

pub const GROUP: &str = "scheduling.k8s.io";

/// Names starting with this are reserved for the built-in classes.
pub const SYSTEM_PREFIX: &str = "system-";

/// The highest value a class that is not a system class may have.
pub const HIGHEST_USER_DEFINABLE: i32 = 1_000_000_000;

/// What a pod without a class and without a global default gets.
pub const DEFAULT_PRIORITY: i32 = 0;

pub const PREEMPT_LOWER_PRIORITY: &str = "PreemptLowerPriority";
const PREEMPTION_POLICIES: &[&str] = &[PREEMPT_LOWER_PRIORITY, "Never"];

/// The classes every cluster has (Kubernetes' SystemPriorityClasses): name, value,
/// description.
pub const SYSTEM_CLASSES: &[(&str, i32, &str)] = &[
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// A built-in class as the API server creates it at start.
pub fn system_class(name: &str, value: i32, description: &str) -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": description,
        "preemptionPolicy": PREEMPT_LOWER_PRIORITY,
    })
}

pub fn is_system_class(name: &str) -> bool {
    SYSTEM_CLASSES.iter().any(|(n, _, _)| *n == name)
}

pub fn default(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        o.entry("preemptionPolicy")
            .or_insert_with(|| json!(PREEMPT_LOWER_PRIORITY));
    }
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &PriorityClass, old: Option<&PriorityClass>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            let name = new.metadata.name.as_deref().unwrap_or_default();
            if name.starts_with(SYSTEM_PREFIX) {
                if let Err(why) = known_system_class(name, new.value, new.global_default) {
                    errs.push(FieldError::forbidden(
                        "metadata.name",
                        &format!(
                            "priority class names with '{SYSTEM_PREFIX}' prefix are reserved for system use only. error: {why}"
                        ),
                    ));
                }
            } else if new.value > HIGHEST_USER_DEFINABLE {
                errs.push(FieldError::forbidden(
                    "value",
                    &format!(
                        "maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE}"
                    ),
                ));
            }
            if let Some(p) = new
                .preemption_policy
                .as_deref()
                .filter(|p| !PREEMPTION_POLICIES.contains(p))
            {
                errs.push(FieldError::not_supported(
                    "preemptionPolicy",
                    p,
                    PREEMPTION_POLICIES,
                ));
            }
            if let Some(old) = old {
                if new.value != old.value {
                    errs.push(FieldError::forbidden(
                        "value",
                        "may not be changed in an update.",
                    ));
                }
                if new.preemption_policy != old.preemption_policy {
                    errs.push(FieldError::invalid(
                        "preemptionPolicy",
                        new.preemption_policy.as_deref().unwrap_or_default(),
                        "field is immutable",
                    ));
                }
            }
            errs
        },
    )
}

/// Kubernetes' IsKnownSystemPriorityClass.
fn known_system_class(name: &str, value: i32, global_default: Option<bool>) -> Result<(), String> {
    let Some((_, want, _)) = SYSTEM_CLASSES.iter().find(|(n, _, _)| *n == name) else {
        return Err(format!("{name} is not a known system priority class"));
    };
    if value != *want {
        return Err(format!("value of {name} PriorityClass must be {want}"));
    }
    if global_default.unwrap_or(false) {
        return Err(format!(
            "globalDefault of {name} PriorityClass must be false"
        ));
    }
    Ok(())
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Value",
            ColumnType::Integer,
            "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
        ),
        TableColumnDefinition::new(
            "Global-Default",
            ColumnType::Boolean,
            "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
        ),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new(
            "PreemptionPolicy",
            ColumnType::String,
            "preemptionPolicy is the Policy for preempting pods with lower priority.",
        ),
    ]
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(pc) = decode::<PriorityClass>(v) else {
        return default_row(v, now);
    };
    vec![
        name_cell(&pc.metadata),
        Value::from(pc.value),
        Value::from(pc.global_default.unwrap_or(false)),
        age_cell(&pc.metadata, now),
        Value::from(pc.preemption_policy.unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, value: i64) -> Value {
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name, "creationTimestamp": "2025-01-01T11:00:00Z"},
            "value": value})
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn user_classes_and_their_limit() {
        let mut v = class("high", 1000);
        default(&mut v);
        assert_eq!(v["preemptionPolicy"], PREEMPT_LOWER_PRIORITY);
        assert!(validate(&v, None).is_empty());
        assert_eq!(
            messages(&validate(&class("huge", 1_000_000_001), None)),
            vec![
                "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"
            ]
        );
        let mut bad = v.clone();
        bad["preemptionPolicy"] = json!("Always");
        assert_eq!(
            messages(&validate(&bad, None)),
            vec![
                "preemptionPolicy: Unsupported value: \"Always\": supported values: \"PreemptLowerPriority\", \"Never\""
            ]
        );
    }

    #[test]
    fn system_names_are_reserved() {
        for (name, value, description) in SYSTEM_CLASSES {
            assert!(validate(&system_class(name, *value, description), None).is_empty());
        }
        assert_eq!(
            messages(&validate(&class("system-mine", 5), None)),
            vec!["metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority class"]
        );
        assert_eq!(
            messages(&validate(&class("system-node-critical", 5), None)),
            vec!["metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: value of system-node-critical PriorityClass must be 2000001000"]
        );
    }

    #[test]
    fn value_and_policy_never_change() {
        let mut old = class("high", 1000);
        default(&mut old);
        let mut new = old.clone();
        new["value"] = json!(2000);
        new["preemptionPolicy"] = json!("Never");
        new["description"] = json!("may change");
        assert_eq!(
            messages(&validate(&new, Some(&old))),
            vec![
                "value: Forbidden: may not be changed in an update.",
                "preemptionPolicy: Invalid value: \"Never\": field is immutable"
            ]
        );
    }

    #[test]
    fn rows() {
        let mut v = class("high", 1000);
        v["globalDefault"] = json!(true);
        default(&mut v);
        let now = "2025-01-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            row(&v, now),
            vec![
                json!("high"),
                json!(1000),
                json!(true),
                json!("60m"),
                json!("PreemptLowerPriority")
            ]
        );
    }
}
