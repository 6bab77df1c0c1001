//! The per-kind rules the handlers apply (defaulting, validation, field-selector values,
//! selectors), taken from `machinery`. This file is the one seam between the server and the
//! machinery modules.
//!

use std::sync::Arc;

use serde_json::Value;

use super::registry::{Resource, Subresource};
use super::request::WriteOptions;
use k8s_openapi::jiff::Timestamp;

use crate::machinery::fieldmanager::{self, Operation, Writer};
use crate::machinery::kinds::{self, KindRules};
use crate::machinery::patch::{self, PatchType};
use crate::machinery::{strict, ApiError, FieldError, FieldSelector, GroupKind, LabelSelector};
use crate::store::cache::{CachedObject, Filter};

fn kind_rules(r: &Resource) -> Option<&'static KindRules> {
    kinds::rules_at(r.group, r.version, r.kind)
}

/// Kubernetes' defaulting for the resource's kind. A custom resource's body is pruned of
/// fields its schema does not know, then defaulted from the schema.
pub fn default(r: &Resource, obj: &mut Value) {
    if let Some(c) = r.custom() {
        c.schema.prune(obj);
        c.schema.apply_defaults(obj);
        return;
    }
    if let Some(k) = kind_rules(r) {
        (k.default)(obj);
    }
}

/// Validation of a create (`old` None) or an update.
pub fn validate(r: &Resource, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    if let Some(c) = r.custom() {
        return validate_custom(r, c, new, old);
    }
    match kind_rules(r) {
        Some(k) => (k.validate)(new, old),
        None => vec![FieldError::invalid(
            "kind",
            r.kind,
            "has no validation rules",
        )],
    }
}

/// A custom object: ObjectMeta as for every kind, then the definition's schema.
fn validate_custom(
    r: &Resource,
    c: &crate::apiserver::crd::Custom,
    new: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    use crate::machinery::validation::{
        validate_object_meta, validate_object_meta_update, NameRule, Scope,
    };
    let meta = |v: &Value| {
        serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(
            v.get("metadata").cloned().unwrap_or(Value::Null),
        )
    };
    let mut errs = Vec::new();
    match meta(new) {
        Ok(m) => {
            let scope = if r.namespaced() {
                Scope::Namespaced
            } else {
                Scope::Cluster
            };
            errs.extend(validate_object_meta(&m, scope, NameRule::Dns1123Subdomain));
            if let Some(Ok(o)) = old.map(meta) {
                errs.extend(validate_object_meta_update(&m, &o));
            }
        }
        Err(e) => errs.push(FieldError::invalid("metadata", "", &e.to_string())),
    }
    errs.extend(c.schema.validate(new, old));
    errs
}

/// Validation of a write through `pods/ephemeralcontainers`.
pub fn validate_ephemeral(new: &Value, old: &Value) -> Vec<FieldError> {
    kinds::validate_ephemeral_update(new, old)
}

/// The value of a field-selector field.
pub fn field(r: &Resource, obj: &Value, path: &str) -> Option<String> {
    if r.custom().is_some() {
        return kinds::meta_field(obj, path);
    }
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
        let f = match r.stored_as() {
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

/// Why a body does not decode into the kind (a 400 naming the field), if it does not.
pub fn decode_error(r: &Resource, obj: &Value) -> Option<String> {
    if r.custom().is_some() {
        return match obj.get("metadata") {
            None | Some(Value::Object(_)) => None,
            Some(_) => Some(format!(
                "{} in version \"{}\" cannot be handled as a {}: metadata: expected an object",
                r.kind, r.version, r.kind
            )),
        };
    }
    strict::decode_error(r.group, r.kind, r.version, obj)
}

/// The body decoded as its kind once: the 400 message when it does not decode
/// ([`decode_error`]), else its unknown fields ([`unknown_fields`]).
pub fn decode(r: &Resource, obj: &Value) -> Result<Vec<String>, String> {
    if r.custom().is_some() {
        return match decode_error(r, obj) {
            Some(why) => Err(why),
            None => Ok(unknown_fields(r, obj)),
        };
    }
    strict::decode(r.group, r.kind, r.version, obj)
}

/// Paths of fields the kind does not define (`fieldValidation=Strict`); for a custom
/// resource, the fields its schema would prune.
pub fn unknown_fields(r: &Resource, obj: &Value) -> Vec<String> {
    if let Some(c) = r.custom() {
        return c.schema.prune(&mut obj.clone());
    }
    strict::unknown_fields(r.group, r.kind, r.version, obj)
}

/// The PATCH format of a Content-Type.
pub fn patch_type(content_type: &str) -> Option<PatchType> {
    PatchType::from_content_type(content_type)
}

/// Whether the patch is a server-side apply (which creates a missing object).
pub fn is_apply(t: PatchType) -> bool {
    t == PatchType::Apply
}

/// Applies a JSON, merge or strategic-merge patch to the current object.
/// A strategic merge patch of a custom resource is a 415, as in Kubernetes (its schema
/// carries no patch strategies).
pub fn patch(r: &Resource, cur: &Value, t: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    if r.custom().is_some() && t == PatchType::StrategicMerge {
        return Err(ApiError::new(
            415,
            crate::machinery::status::Reason::UnsupportedMediaType,
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, \
             application/apply-patch+yaml",
        ));
    }
    patch::apply(&GroupKind::new(r.group, r.kind), cur, t, body)
}

/// Who writes, for managedFields: `subresource` is empty for the main resource, whose
/// writes do not own `.status` when status is a subresource (Kubernetes' reset fields).
fn writer<'a>(
    r: &Resource,
    opts: &'a WriteOptions,
    operation: Operation,
    subresource: &'a str,
    api_version: &'a str,
    now: &'a str,
) -> Writer<'a> {
    Writer {
        manager: opts.field_manager.as_deref().unwrap_or(""),
        operation,
        subresource,
        api_version,
        now,
        ignored: (subresource.is_empty() && r.has(Subresource::Status)).then_some("status"),
    }
}

fn managed_type(r: &Resource) -> Arc<fieldmanager::Type> {
    if let Some(c) = r.custom() {
        return c.managed.clone();
    }
    fieldmanager::type_of(&GroupKind::new(r.group, r.kind), r.schema.build)
}

/// What Kubernetes' typed decoding leaves of an object: no empty maps or lists in optional
/// fields, no null fields.
pub fn normalize(r: &Resource, obj: &mut Value) {
    if r.custom().is_some() {
        return;
    }
    fieldmanager::drop_empty(&managed_type(r), obj);
}

/// Whether the kind has a `metadata.generation` (Kubernetes sets it only where a controller
/// observes the spec: workloads, pods, EndpointSlices).
pub fn tracks_generation(r: &Resource) -> bool {
    if r.custom().is_some() {
        return true;
    }
    kinds::tracks_generation(r.group, r.kind)
}

/// Records a create (`live` None) or an update in `new`'s managedFields.
pub fn record_update(
    r: &Resource,
    live: Option<&Value>,
    new: &mut Value,
    opts: &WriteOptions,
    subresource: &str,
) {
    let (api_version, now) = (r.api_version(), super::meta::now());
    let w = writer(r, opts, Operation::Update, subresource, &api_version, &now);
    fieldmanager::record_update(&managed_type(r), live, new, &w);
}

/// Server-side apply of `body` onto `live` (None: create), with conflicts per field.
pub fn apply(
    r: &Resource,
    live: Option<&Value>,
    body: &[u8],
    opts: &WriteOptions,
) -> Result<Value, ApiError> {
    let (api_version, now) = (r.api_version(), super::meta::now());
    let w = writer(r, opts, Operation::Apply, "", &api_version, &now);
    patch::server_side_apply(
        &GroupKind::new(r.group, r.kind),
        &managed_type(r),
        live,
        body,
        &w,
        opts.force,
    )
}

/// The Table columns of the kind (wide ones at priority 1).
pub fn columns(r: &Resource) -> Value {
    if let Some(c) = r.custom() {
        return serde_json::to_value(crate::apiserver::crd::columns(c)).unwrap_or(Value::Null);
    }
    match kind_rules(r) {
        Some(k) => serde_json::to_value((k.columns)()).unwrap_or(Value::Null),
        None => serde_json::json!([
            {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
        ]),
    }
}

/// One row's cells, ages relative to now.
pub fn cells(r: &Resource, obj: &Value) -> Vec<Value> {
    if let Some(c) = r.custom() {
        return crate::apiserver::crd::cells(c, obj, now());
    }
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
