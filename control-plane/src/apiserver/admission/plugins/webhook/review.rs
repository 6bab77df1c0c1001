//! AdmissionReview v1 (admission.k8s.io/v1) on the wire: the request a webhook receives and
//! the response it returns, with the checks Kubernetes makes of a response (kind, uid,
//! patch type) and the JSONPatch a mutating webhook sends applied to the object.

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::apiserver::admission::Request;

/// `{"group":"","version":"v1","kind":"Pod"}`
fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn gvr(group: &str, version: &str, resource: &str) -> Value {
    json!({"group": group, "version": version, "resource": resource})
}

/// The AdmissionReview sent for `req` about `object`.
pub fn request(uid: &str, req: &Request<'_>, object: Option<&Value>) -> Value {
    let r = req.resource;
    let kind = gvk(r.group, r.version, r.kind);
    let resource = gvr(r.group, r.version, r.plural);
    let u = req.user;
    let mut body = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": req.name,
        "operation": req.operation.as_str(),
        "userInfo": {
            "username": u.name,
            "uid": u.uid,
            "groups": u.groups,
            "extra": u.extra,
        },
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": req.old.cloned().unwrap_or(Value::Null),
        "dryRun": req.dry_run,
        "options": req.options,
    });
    if let Some(sub) = req.subresource {
        body["subResource"] = json!(sub);
        body["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = req.namespace {
        body["namespace"] = json!(ns);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body})
}

/// metav1.Status as a webhook reports a refusal.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Status {
    pub code: u16,
    pub message: String,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub allowed: bool,
    #[serde(default)]
    pub status: Option<Status>,
    #[serde(default)]
    pub patch: Option<ByteString>,
    #[serde(default)]
    pub patch_type: Option<String>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<Value>,
}

/// Reads a webhook's answer to the review with `uid`; an error says what is wrong with it.
pub fn response(body: &[u8], uid: &str) -> Result<Response, String> {
    let e: Envelope =
        serde_json::from_slice(body).map_err(|e| format!("failed to decode the response: {e}"))?;
    if e.api_version != "admission.k8s.io/v1" || e.kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            e.api_version, e.kind
        ));
    }
    let r: Response = serde_json::from_value(e.response.ok_or("webhook response was absent")?)
        .map_err(|e| format!("failed to decode the response: {e}"))?;
    if r.uid != uid {
        return Err(format!(
            "expected response.uid=\"{uid}\", got \"{}\"",
            r.uid
        ));
    }
    Ok(r)
}

/// Applies a JSONPatch response to `obj`.
pub fn apply_patch(obj: &mut Value, r: &Response) -> Result<bool, String> {
    let Some(patch) = r.patch.as_ref().filter(|p| !p.0.is_empty()) else {
        return Ok(false);
    };
    match r.patch_type.as_deref() {
        Some("JSONPatch") => {}
        other => {
            return Err(format!(
                "unsupported patch type {:?}",
                other.unwrap_or_default()
            ))
        }
    }
    let p: json_patch::Patch =
        serde_json::from_slice(&patch.0).map_err(|e| format!("invalid JSONPatch: {e}"))?;
    let before = obj.clone();
    json_patch::patch(obj, &p).map_err(|e| format!("JSONPatch failed: {e}"))?;
    Ok(*obj != before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_checked() {
        let ok = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true,"warnings":["w"]}}"#;
        let r = response(ok, "u1").unwrap();
        assert!(r.allowed);
        assert_eq!(r.warnings, vec!["w"]);
        assert_eq!(
            response(ok, "u2").unwrap_err(),
            "expected response.uid=\"u2\", got \"u1\""
        );
        let wrong =
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{}}"#;
        assert!(response(wrong, "u")
            .unwrap_err()
            .starts_with("expected webhook response"));
        assert!(response(b"not json", "u").is_err());
    }

    #[test]
    fn patches_apply() {
        let patch =
            br#"[{"op":"add","path":"/spec/containers/-","value":{"name":"side","image":"i"}}]"#;
        let body = json!({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{
            "uid":"u","allowed":true,"patchType":"JSONPatch","patch": ByteString(patch.to_vec())}});
        let r = response(body.to_string().as_bytes(), "u").unwrap();
        let mut pod = json!({"spec":{"containers":[{"name":"web"}]}});
        assert!(apply_patch(&mut pod, &r).unwrap());
        assert_eq!(pod["spec"]["containers"][1]["name"], "side");
    }
}
