//! The per-kind rules the handlers apply (defaulting, validation, field-selector values,
//! selectors), taken from `machinery`. This file is the one seam between the server and the
//! machinery modules.
//!
//! TEMPORARY GAP: until `machinery::{kinds, selectors}` land, the functions marked
//! `machinery gap` below stand in with the least the server needs (no defaulting, no
//! validation, dotted-path field values, equality-only selectors). They are replaced, not
//! extended, when the machinery commits arrive.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::registry::Resource;
use crate::machinery::{ApiError, FieldError};
use crate::store::cache::{CachedObject, Filter};

/// Kubernetes' defaulting for the resource's kind. (machinery gap: nothing yet)
pub fn default(_r: &Resource, _obj: &mut Value) {}

/// Validation of a create (`old` None) or an update. (machinery gap: names only)
pub fn validate(_r: &Resource, new: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    let mut out = Vec::new();
    if super::meta::name(new).is_none() {
        out.push(FieldError::required("metadata.name"));
    }
    out
}

/// The value of a field-selector field. (machinery gap: a dotted path into the object)
pub fn field(obj: &Value, path: &str) -> Option<String> {
    let v = path.split('.').try_fold(obj, |v, k| v.get(k))?;
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// One `key=value` / `key!=value` requirement. (machinery gap)
#[derive(Clone, Debug)]
struct Requirement {
    key: String,
    value: String,
    equal: bool,
}

fn parse_requirements(s: &str, what: &str) -> Result<Vec<Requirement>, ApiError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v, equal) = if let Some((k, v)) = p.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement {p:?} of {what}"
                )));
            };
            Ok(Requirement {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
                equal,
            })
        })
        .collect()
}

/// The filter of a list or watch: namespace, label selector, field selector; and the
/// indexed field value the filter pins, if any (for O(changed) watch fan-out).
pub struct Selection {
    pub filter: Filter,
    pub index: Option<(&'static str, String)>,
}

pub fn selection(
    r: &'static Resource,
    namespace: Option<&str>,
    label_selector: Option<&str>,
    field_selector: Option<&str>,
) -> Result<Selection, ApiError> {
    let labels = parse_requirements(label_selector.unwrap_or(""), "label selector")?;
    let fields = parse_requirements(field_selector.unwrap_or(""), "field selector")?;
    let selectable = r.selectable_fields();
    let mut field_idx = Vec::new();
    for f in &fields {
        let Some(i) = selectable.iter().position(|s| *s == f.key) else {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                f.key
            )));
        };
        field_idx.push((i, f.clone()));
    }
    let mut index = None;
    for (i, f) in &field_idx {
        if f.equal && r.indexed.contains(&selectable[*i]) {
            index = Some((selectable[*i], f.value.clone()));
        }
    }
    let ns = namespace.map(str::to_string);
    if index.is_none() && r.indexed.contains(&"metadata.namespace") {
        if let Some(ns) = &ns {
            index = Some(("metadata.namespace", ns.clone()));
        }
    }
    let filter: Filter = Arc::new(move |o: &CachedObject| {
        if ns.is_some() && o.namespace != ns {
            return false;
        }
        labels.iter().all(|l| matches_label(&o.labels, l))
            && field_idx.iter().all(|(i, f)| {
                let v = o.fields.get(*i).cloned().flatten().unwrap_or_default();
                (v == f.value) == f.equal
            })
    });
    Ok(Selection { filter, index })
}

fn matches_label(labels: &BTreeMap<String, String>, r: &Requirement) -> bool {
    (labels.get(&r.key) == Some(&r.value)) == r.equal
}

/// The value of each selectable field of an object, computed once when the cache takes it.
pub fn cache_field(obj: &Value, name: &str) -> Option<String> {
    match name {
        "metadata.name" => super::meta::name(obj).map(str::to_string),
        "metadata.namespace" => super::meta::namespace(obj).map(str::to_string),
        _ => field(obj, name),
    }
}

/// Paths of fields the kind does not define (`fieldValidation=Strict`). (machinery gap: none)
pub fn unknown_fields(_r: &Resource, _obj: &Value) -> Vec<String> {
    Vec::new()
}

/// The patch formats. (machinery gap: JSON patch and JSON merge patch only)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
}

pub fn patch_type(content_type: &str) -> Option<PatchType> {
    match super::negotiate::media_type(content_type).as_str() {
        "application/json-patch+json" => Some(PatchType::Json),
        "application/merge-patch+json" => Some(PatchType::Merge),
        _ => None,
    }
}

/// Whether the patch is a server-side apply (which creates a missing object).
pub fn is_apply(_t: PatchType) -> bool {
    false
}

/// Applies a patch to the current object. (machinery gap)
pub fn patch(_r: &Resource, cur: &Value, t: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    let mut out = cur.clone();
    match t {
        PatchType::Merge => {
            let p: Value =
                serde_json::from_slice(body).map_err(|e| ApiError::malformed("merge patch", e))?;
            json_patch::merge(&mut out, &p);
        }
        PatchType::Json => {
            let p: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| ApiError::malformed("json patch", e))?;
            json_patch::patch(&mut out, &p).map_err(|e| {
                ApiError::new(422, crate::machinery::Reason::Invalid, e.to_string())
            })?;
        }
    }
    Ok(out)
}

/// The Table columns of the kind. (machinery gap: NAME and CREATED AT, Kubernetes' default)
pub fn columns(_r: &Resource) -> Value {
    serde_json::json!([
        {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
        {"name": "Created At", "type": "date", "format": "", "description": "Creation timestamp", "priority": 0},
    ])
}

/// One row's cells. (machinery gap)
pub fn cells(_r: &Resource, obj: &Value) -> Vec<Value> {
    vec![
        serde_json::json!(super::meta::name(obj).unwrap_or_default()),
        obj.pointer("/metadata/creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    ]
}
