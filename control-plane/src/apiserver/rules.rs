//! The per-kind rules the handlers apply (defaulting, validation, field-selector values,
//! selectors), taken from `machinery`. This file is the one seam between the server and the
//! machinery modules.
//!

use std::sync::Arc;

use serde_json::Value;

use super::registry::Resource;
use k8s_openapi::jiff::Timestamp;

use crate::machinery::kinds::{self, KindRules};
use crate::machinery::patch::{self, PatchType};
use crate::machinery::{strict, ApiError, FieldError, FieldSelector, GroupKind, LabelSelector};
use crate::store::cache::{CachedObject, Filter};

fn kind_rules(r: &Resource) -> Option<&'static KindRules> {
    kinds::rules(r.group, r.kind)
}

/// Kubernetes' defaulting for the resource's kind.
pub fn default(r: &Resource, obj: &mut Value) {
    if let Some(k) = kind_rules(r) {
        (k.default)(obj);
    }
}

/// Validation of a create (`old` None) or an update.
pub fn validate(r: &Resource, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    match kind_rules(r) {
        Some(k) => (k.validate)(new, old),
        None => vec![FieldError::invalid(
            "kind",
            r.kind,
            "has no validation rules",
        )],
    }
}

/// The value of a field-selector field.
pub fn field(r: &Resource, obj: &Value, path: &str) -> Option<String> {
    kind_rules(r).and_then(|k| (k.field)(obj, path))
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
    // The cache holds the storage resource's field values: a view's fields are renamed.
    let stored = r.storage();
    let stored_fields = stored.selectable_fields();
    let view_fields = r.selectable_fields();
    let position = move |f: &str| -> Option<usize> {
        let f = match r.stored_as {
            None => f,
            Some(c) => view_fields.contains(&f).then(|| (c.field)(f)).flatten()?,
        };
        stored_fields.iter().position(|s| *s == f)
    };
    for req in fields.requirements() {
        if position(&req.field).is_none() {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                req.field
            )));
        }
    }
    let index = stored
        .indexed
        .iter()
        .find_map(|f| {
            let i = stored.selectable_fields().iter().position(|s| s == f)?;
            let pinned = fields
                .requirements()
                .iter()
                .filter(|req| position(&req.field) == Some(i))
                .find_map(|req| fields.required_value(&req.field))?;
            Some((*f, pinned.to_string()))
        })
        .or_else(|| {
            let ns = namespace?;
            stored
                .indexed
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
                || fields.matches(|f| o.fields.get(position(f)?).cloned().flatten()))
    });
    Ok(Selection { filter, index })
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

/// The Table columns of the kind (wide ones at priority 1).
pub fn columns(r: &Resource) -> Value {
    match kind_rules(r) {
        Some(k) => serde_json::to_value((k.columns)()).unwrap_or(Value::Null),
        None => serde_json::json!([
            {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
        ]),
    }
}

/// One row's cells, ages relative to now.
pub fn cells(r: &Resource, obj: &Value) -> Vec<Value> {
    match kind_rules(r) {
        Some(k) => (k.row)(obj, now()),
        None => vec![serde_json::json!(super::meta::name(obj).unwrap_or_default())],
    }
}

fn now() -> Timestamp {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH)
}
