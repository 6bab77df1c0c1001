//! coordination.k8s.io/v1 Lease: validation (durations and transition counts) and kubectl's
//! columns (NAME HOLDER AGE).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{age_cell, decode, default_row, meta_errors, name_cell, validate_typed};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{FieldPath, NameRule, Scope};

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Lease, old: Option<&Lease>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let spec = new.spec.clone().unwrap_or_default();
        let path = FieldPath::new("spec");
        if let Some(d) = spec.lease_duration_seconds.filter(|d| *d <= 0) {
            errs.push(FieldError::invalid_number(
                path.child("leaseDurationSeconds"),
                d.into(),
                "must be greater than 0",
            ));
        }
        if let Some(t) = spec.lease_transitions.filter(|t| *t < 0) {
            errs.push(FieldError::invalid_number(
                path.child("leaseTransitions"),
                t.into(),
                "must be greater than or equal to 0",
            ));
        }
        errs
    })
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Holder",
            ColumnType::String,
            "holderIdentity contains the identity of the holder of a current lease.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(l) = decode::<Lease>(v) else {
        return default_row(v, now);
    };
    let holder = l
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    vec![
        name_cell(&l.metadata),
        Value::from(holder),
        age_cell(&l.metadata, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lease_rows_and_validation() {
        let v = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-1", "namespace": "kube-node-lease", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2025-01-01T11:59:58.000000Z"}});
        assert!(validate(&v, None).is_empty());
        let now = "2025-01-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            row(&v, now),
            vec![json!("node-1"), json!("node-1"), json!("60m")]
        );
        let mut bad = v.clone();
        bad["spec"]["leaseDurationSeconds"] = json!(0);
        assert_eq!(validate(&bad, None)[0].field, "spec.leaseDurationSeconds");
    }
}
