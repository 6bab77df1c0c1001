//! PATCH bodies applied to a live object: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch (kubectl apply/edit/label/annotate) and server-side apply.
//!
//! Server-side apply parses and checks the applied configuration here; the merge, the
//! ownership of fields and the conflicts are `fieldmanager`'s.

mod strategic;
mod strategy;

use serde_json::{Map, Value};

use super::fieldmanager::{self, Type, Writer};
use super::status::ApiError;
use super::GroupKind;
pub use strategic::SmpError;
pub use strategy::{schema_for, FieldStrategy, Schema, EMPTY};

/// Kubernetes' cap on the operations of one JSON patch.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The four PATCH content types Kubernetes accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    StrategicMerge,
    /// `application/apply-patch+yaml` (server-side apply; JSON is valid YAML)
    Apply,
}

impl PatchType {
    /// From a Content-Type header; parameters such as `; charset=utf-8` are ignored.
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next()?.trim().to_ascii_lowercase();
        Some(match media.as_str() {
            "application/json-patch+json" => PatchType::Json,
            "application/merge-patch+json" => PatchType::Merge,
            "application/strategic-merge-patch+json" => PatchType::StrategicMerge,
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchType::Apply,
            _ => return None,
        })
    }

    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Json => "application/json-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::StrategicMerge => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }
}

/// Applies a JSON, merge or strategic-merge PATCH body to `original` (server-side apply is
/// [`server_side_apply`]). The result is not validated here: the caller runs defaulting and
/// validation on it as on any update.
pub fn apply(
    kind: &GroupKind,
    original: &Value,
    patch_type: PatchType,
    body: &[u8],
) -> Result<Value, ApiError> {
    let patched = match patch_type {
        PatchType::Json => json_patch(original, body)?,
        PatchType::Merge => merge_patch(original, body)?,
        PatchType::StrategicMerge => strategic_merge_patch(kind, original, body)?,
        PatchType::Apply => {
            return Err(ApiError::internal(
                "server-side apply needs its field manager (patch::server_side_apply)",
            ))
        }
    };
    if !patched.is_object() {
        return Err(unprocessable(format!(
            "the patched {kind} is not an object: {patched}"
        )));
    }
    Ok(patched)
}

fn unprocessable(message: String) -> ApiError {
    ApiError::new(422, super::Reason::Invalid, message)
}

fn json_patch(original: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let ops: json_patch::Patch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::new(
            413,
            super::Reason::RequestEntityTooLarge,
            format!(
                "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                ops.0.len()
            ),
        ));
    }
    let mut doc = original.clone();
    json_patch::patch(&mut doc, &ops).map_err(|e| unprocessable(e.to_string()))?;
    Ok(doc)
}

fn object_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::bad_request(format!(
            "the patch must be a JSON object, got: {}",
            kind_of(&other)
        ))),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON in patch: {e}"))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn merge_patch(original: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let patch = Value::Object(object_body(body)?);
    let mut doc = original.clone();
    json_patch::merge(&mut doc, &patch);
    Ok(doc)
}

fn original_object(kind: &GroupKind, original: &Value) -> Result<Map<String, Value>, ApiError> {
    match original {
        Value::Object(m) => Ok(m.clone()),
        Value::Null => Ok(Map::new()),
        other => Err(ApiError::internal(format!(
            "the live {kind} is not an object: {}",
            kind_of(other)
        ))),
    }
}

fn schema_or_unsupported(kind: &GroupKind) -> Result<&'static Schema, ApiError> {
    schema_for(kind).ok_or_else(|| {
        ApiError::new(
            415,
            super::Reason::UnsupportedMediaType,
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for {kind})"),
        )
    })
}

fn smp_error(e: SmpError) -> ApiError {
    match e {
        SmpError::BadRequest(m) => ApiError::bad_request(m),
        SmpError::Invalid(m) => unprocessable(m),
    }
}

fn strategic_merge_patch(
    kind: &GroupKind,
    original: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    let schema = schema_or_unsupported(kind)?;
    let patch = object_body(body)?;
    let original = original_object(kind, original)?;
    strategic::merge_map(original, patch, schema)
        .map(Value::Object)
        .map_err(smp_error)
}

/// Server-side apply of the configuration in `body` (YAML or JSON) by `writer` onto `live`
/// (None: the object does not exist yet), with `t` the kind's shape. Returns the merged
/// object with its managedFields; a field another manager owns that the apply would change
/// is a 409 Conflict unless `force`.
pub fn server_side_apply(
    kind: &GroupKind,
    t: &Type,
    live: Option<&Value>,
    body: &[u8],
    writer: &Writer<'_>,
    force: bool,
) -> Result<Value, ApiError> {
    let applied: Value = serde_saphyr::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let Value::Object(applied) = applied else {
        return Err(ApiError::bad_request(format!(
            "the applied configuration must be an object, got {}",
            kind_of(&applied)
        )));
    };
    let api_version = applied.get("apiVersion").and_then(Value::as_str);
    let applied_kind = applied.get("kind").and_then(Value::as_str);
    match (api_version, applied_kind) {
        (Some(v), Some(k)) if GroupKind::group_of(v) == kind.group && k == kind.kind => {}
        (Some(v), Some(k)) => {
            return Err(ApiError::bad_request(format!(
                "the applied configuration is a {} ({v}), but the request is for {kind}",
                GroupKind::new(GroupKind::group_of(v), k)
            )))
        }
        _ => {
            return Err(ApiError::bad_request(
                "the applied configuration must set apiVersion and kind",
            ))
        }
    }
    let name_of = |m: Option<&Value>| {
        m.and_then(|m| m.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let applied = Value::Object(applied);
    if let (Some(live_name), Some(wanted)) = (name_of(live), name_of(Some(&applied))) {
        if live_name != wanted {
            return Err(ApiError::bad_request(format!(
                "the name of the applied configuration ({wanted}) does not match the name of the object ({live_name})"
            )));
        }
    }
    if let Some(l) = live {
        original_object(kind, l)?;
    }
    Ok(fieldmanager::apply(t, live, &applied, writer, force)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gk(kind: &str) -> GroupKind {
        match kind {
            "Deployment" | "ReplicaSet" => GroupKind::new("apps", kind),
            "Widget" => GroupKind::new("example.com", kind),
            _ => GroupKind::new("", kind),
        }
    }

    fn pod() -> Value {
        json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"1"}},
               "spec":{"containers":[{"name":"c","image":"i:1"}]}})
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json"),
            Some(PatchType::Json)
        );
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json"),
            Some(PatchType::StrategicMerge)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        for t in [
            PatchType::Json,
            PatchType::Merge,
            PatchType::StrategicMerge,
            PatchType::Apply,
        ] {
            assert_eq!(PatchType::from_content_type(t.content_type()), Some(t));
        }
    }

    #[test]
    fn json_patch_ops() {
        let out = apply(&gk("Pod"), &pod(), PatchType::Json,
            br#"[{"op":"replace","path":"/spec/containers/0/image","value":"i:2"},{"op":"add","path":"/metadata/labels/b","value":"2"}]"#).unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "i:2");
        assert_eq!(out["metadata"]["labels"]["b"], "2");
        let e = apply(
            &gk("Pod"),
            &pod(),
            PatchType::Json,
            br#"[{"op":"test","path":"/metadata/name","value":"q"}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        let e = apply(
            &gk("Pod"),
            &pod(),
            PatchType::Json,
            br#"[{"op":"remove","path":"/nope"}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        let e = apply(&gk("Pod"), &pod(), PatchType::Json, br#"{"op":"add"}"#).unwrap_err();
        assert_eq!(e.code, 400);
        let e = apply(
            &gk("Pod"),
            &pod(),
            PatchType::Json,
            br#"[{"op":"replace","path":"","value":1}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422, "a patch that leaves no object is refused");
    }

    #[test]
    fn merge_patch_rfc7386() {
        let out = apply(
            &gk("Deployment"),
            &json!({"spec":{"replicas":3,"paused":true}}),
            PatchType::Merge,
            br#"{"spec":{"replicas":5,"paused":null}}"#,
        )
        .unwrap();
        assert_eq!(out, json!({"spec":{"replicas":5}}));
        // Lists are replaced whole by a merge patch.
        let out = apply(
            &gk("Pod"),
            &pod(),
            PatchType::Merge,
            br#"{"spec":{"containers":[{"name":"d"}]}}"#,
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name":"d"}]));
        for bad in [&b"[1]"[..], b"nope", b"\"x\""] {
            assert_eq!(
                apply(&gk("Pod"), &pod(), PatchType::Merge, bad)
                    .unwrap_err()
                    .code,
                400
            );
        }
    }

    #[test]
    fn strategic_merge_and_unknown_kinds() {
        let out = apply(
            &gk("Pod"),
            &pod(),
            PatchType::StrategicMerge,
            br#"{"spec":{"containers":[{"name":"c","image":"i:2"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name":"c","image":"i:2"}])
        );
        let e = apply(&gk("Widget"), &json!({}), PatchType::StrategicMerge, b"{}").unwrap_err();
        assert_eq!(e.code, 415);
        assert_eq!(
            apply(&gk("Pod"), &pod(), PatchType::StrategicMerge, b"{")
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn server_side_apply_keeps_other_fields() {
        use k8s_openapi::api::core::v1::Pod;
        use schemars::JsonSchema;
        let t = fieldmanager::type_of(&gk("Pod"), Pod::json_schema);
        let w = Writer {
            manager: "m",
            operation: fieldmanager::Operation::Apply,
            subresource: "",
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
            ignored: Some("status"),
        };
        // Forced: the live pod predates field management, so a placeholder manager owns it.
        let ssa = |live: Option<&Value>, body: &[u8]| {
            server_side_apply(&gk("Pod"), &t, live, body, &w, true)
        };
        let body = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels:\n    b: \"2\"\nspec:\n  containers:\n  - name: c\n    image: i:3\n";
        let out = ssa(Some(&pod()), body).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"a":"1","b":"2"}));
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name":"c","image":"i:3"}])
        );
        // Creating through apply: no live object yet.
        let created = ssa(None, body).unwrap();
        assert_eq!(created["metadata"]["name"], "p");
        assert_eq!(created["metadata"]["managedFields"][0]["manager"], "m");
        // JSON is YAML too.
        let out = ssa(
            Some(&pod()),
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}"#,
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "i:1");
        for bad in [
            &b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: p}\n"[..],
            b"kind: Pod\n",
            b"- a\n",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: other}\n",
            b"{{{",
        ] {
            assert_eq!(
                ssa(Some(&pod()), bad).unwrap_err().code,
                400,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            apply(&gk("Pod"), &pod(), PatchType::Apply, b"{}")
                .unwrap_err()
                .code,
            500
        );
    }
}
