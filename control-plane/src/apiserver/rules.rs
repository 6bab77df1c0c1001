//! The per-kind rules the handlers apply (defaulting, validation, field-selector values,
//! selectors), taken from `machinery`. This file is the one seam between the server and the
//! machinery modules.
//!
//! TEMPORARY GAP: until `machinery::kinds` lands, the functions marked `machinery gap` below
//! stand in with the least the server needs (no defaulting, names-only validation,
//! dotted-path field values, NAME/CREATED AT tables). They are replaced, not extended, when
//! the machinery commit arrives.

use std::sync::Arc;

use serde_json::Value;

use super::registry::Resource;
use crate::machinery::patch::{self, PatchType};
use crate::machinery::{strict, ApiError, FieldError, FieldSelector, GroupKind, LabelSelector};
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
    let labels = LabelSelector::parse(label_selector.unwrap_or(""))?;
    let fields = FieldSelector::parse(field_selector.unwrap_or(""))?;
    let selectable = r.selectable_fields();
    for req in fields.requirements() {
        if !selectable.contains(&req.field.as_str()) {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                req.field
            )));
        }
    }
    let index = r
        .indexed
        .iter()
        .find_map(|f| fields.required_value(f).map(|v| (*f, v.to_string())))
        .or_else(|| {
            let ns = namespace?;
            r.indexed
                .contains(&"metadata.namespace")
                .then(|| ("metadata.namespace", ns.to_string()))
        });
    let ns = namespace.map(str::to_string);
    let filter: Filter = Arc::new(move |o: &CachedObject| {
        if ns.is_some() && o.namespace != ns {
            return false;
        }
        (labels.is_everything() || labels.matches(&o.labels))
            && (fields.is_everything()
                || fields.matches(|f| {
                    let i = selectable.iter().position(|s| *s == f)?;
                    o.fields.get(i).cloned().flatten()
                }))
    });
    Ok(Selection { filter, index })
}

/// The value of each selectable field of an object, computed once when the cache takes it.
pub fn cache_field(obj: &Value, name: &str) -> Option<String> {
    match name {
        "metadata.name" => super::meta::name(obj).map(str::to_string),
        "metadata.namespace" => super::meta::namespace(obj).map(str::to_string),
        _ => field(obj, name),
    }
}

/// Paths of fields the kind does not define (`fieldValidation=Strict`).
pub fn unknown_fields(r: &Resource, obj: &Value) -> Vec<String> {
    strict::unknown_fields(r.group, r.kind, obj)
}

/// The PATCH format of a Content-Type.
pub fn patch_type(content_type: &str) -> Option<PatchType> {
    PatchType::from_content_type(content_type)
}

/// Whether the patch is a server-side apply (which creates a missing object).
pub fn is_apply(t: PatchType) -> bool {
    t == PatchType::Apply
}

/// Applies a patch to the current object.
pub fn patch(r: &Resource, cur: &Value, t: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    patch::apply(&GroupKind::new(r.group, r.kind), cur, t, body)
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
