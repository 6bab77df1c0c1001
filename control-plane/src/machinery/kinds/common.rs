//! Helpers every kind's rules share: typed decoding of JSON objects, metadata access,
//! defaulting and validation through the k8s-openapi structs, and the cells kubectl's
//! printers format the same way for every kind.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::machinery::duration;
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::TableColumnDefinition;
use crate::machinery::validation::{
    validate_object_meta, validate_object_meta_update, NameRule, Scope,
};

/// Decodes `v` into the kind's typed struct.
pub fn decode<T: DeserializeOwned>(v: &Value) -> Result<T, FieldError> {
    T::deserialize(v).map_err(|e| {
        FieldError::new(
            CauseType::TypeInvalid,
            "",
            format!("Invalid value: the object does not decode: {e}"),
        )
    })
}

/// Runs a typed defaulter over `v`; a body that does not decode is left alone (validation
/// then reports it).
pub fn default_typed<T: DeserializeOwned + Serialize>(v: &mut Value, f: impl FnOnce(&mut T)) {
    if let Ok(mut t) = T::deserialize(&*v) {
        f(&mut t);
        if let Ok(out) = serde_json::to_value(&t) {
            *v = out;
        }
    }
}

/// Runs a typed validator: create when `old` is None, update otherwise.
pub fn validate_typed<T: DeserializeOwned>(
    new: &Value,
    old: Option<&Value>,
    f: impl FnOnce(&T, Option<&T>) -> Vec<FieldError>,
) -> Vec<FieldError> {
    let new: T = match decode(new) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    match old.map(decode::<T>) {
        None => f(&new, None),
        Some(Ok(old)) => f(&new, Some(&old)),
        // The stored object always decoded once; treat an undecodable one as a create.
        Some(Err(_)) => f(&new, None),
    }
}

/// Object metadata checks on create and, on update, the identity fields that never change.
pub fn meta_errors(
    new: &metav1::ObjectMeta,
    old: Option<&metav1::ObjectMeta>,
    scope: Scope,
    rule: NameRule,
) -> Vec<FieldError> {
    let mut errs = validate_object_meta(new, scope, rule);
    if let Some(old) = old {
        errs.extend(validate_object_meta_update(new, old));
    }
    errs
}

/// `metadata.name` and `metadata.namespace`, the field selectors every kind supports.
pub fn meta_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(str_at(v, "/metadata/name").to_string()),
        "metadata.namespace" => Some(str_at(v, "/metadata/namespace").to_string()),
        _ => None,
    }
}

/// The string at a JSON pointer, or "" when absent.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A scalar at a JSON pointer as a field-selector value (`true`, `3`, `Running`, or "").
pub fn scalar_at(v: &Value, pointer: &str) -> String {
    match v.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

pub fn name_cell(meta: &metav1::ObjectMeta) -> Value {
    Value::from(meta.name.clone().unwrap_or_default())
}

pub fn age_cell(meta: &metav1::ObjectMeta, now: Timestamp) -> Value {
    Value::from(duration::age(
        meta.creation_timestamp.as_ref().map(|t| t.0),
        now,
    ))
}

/// `k1=v1,k2=v2` sorted by key, or `<none>`: kubectl's `labels.FormatLabels`.
pub fn format_labels(labels: Option<&BTreeMap<String, String>>) -> String {
    match labels {
        Some(l) if !l.is_empty() => l
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".to_string(),
    }
}

/// kubectl's `metav1.FormatLabelSelector`: `<none>` for an absent or empty selector.
pub fn format_selector(selector: Option<&metav1::LabelSelector>) -> String {
    match selector.map(LabelSelector::from_meta) {
        Some(Ok(s)) if !s.is_everything() => s.to_string(),
        Some(Err(_)) => "<error>".to_string(),
        _ => "<none>".to_string(),
    }
}

/// The NAME, AGE and the rest of a kind without a printer of its own: kubectl then shows
/// NAME and CREATED AT, as Kubernetes' default table convertor does.
pub fn default_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Created At",
            crate::machinery::table::ColumnType::Date,
            "CreationTimestamp is a timestamp representing the server time when this object was created.",
        ),
    ]
}

pub fn default_row(v: &Value, _now: Timestamp) -> Vec<Value> {
    vec![
        Value::from(str_at(v, "/metadata/name")),
        Value::from(str_at(v, "/metadata/creationTimestamp")),
    ]
}

/// `[a-zA-Z0-9._-]+`, up to 253 characters: keys of ConfigMap and Secret data.
pub fn config_key_errors(key: &str) -> Vec<String> {
    let mut errs = vec![];
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        errs.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string());
    }
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if key == "." || key == ".." {
        errs.push(format!("must not be '{key}'"));
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

/// An IANA service name (a named port): up to 15 lowercase letters, digits and single
/// hyphens, with at least one letter.
pub fn port_name_errors(name: &str) -> Vec<String> {
    let mut errs = vec![];
    if name.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

pub const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";
pub const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

/// A valid IPv4 or IPv6 address, as Kubernetes' `IsValidIP` checks it.
pub fn is_ip(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

pub const IP_MSG: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_and_selector_formatting() {
        assert_eq!(format_labels(None), "<none>");
        let l: BTreeMap<String, String> =
            [("b".into(), "2".into()), ("a".into(), "1".into())].into();
        assert_eq!(format_labels(Some(&l)), "a=1,b=2");
        assert_eq!(format_selector(None), "<none>");
        assert_eq!(format_selector(Some(&Default::default())), "<none>");
        let sel = metav1::LabelSelector {
            match_labels: Some(l),
            ..Default::default()
        };
        assert_eq!(format_selector(Some(&sel)), "a=1,b=2");
    }

    #[test]
    fn names_and_keys() {
        assert!(port_name_errors("http").is_empty());
        assert!(port_name_errors("web-80").is_empty());
        assert!(!port_name_errors("80").is_empty());
        assert!(!port_name_errors("a--b").is_empty());
        assert!(!port_name_errors("sixteen-chars-xx").is_empty());
        assert!(config_key_errors("app.conf").is_empty());
        assert!(!config_key_errors("a b").is_empty());
        assert!(!config_key_errors("..x").is_empty());
    }
}
