//! Building responses: objects, lists assembled from the cache's JSON bytes without re-parsing
//! them, Status errors, and the boxed body type every handler returns.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use serde_json::Value;

use crate::machinery::ApiError;
use crate::store::Revision;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;
pub type Resp = Response<Body>;

pub const JSON: &str = "application/json";

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

pub fn bytes(code: StatusCode, content_type: &str, b: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(full(b));
    *r.status_mut() = code;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

pub fn json(code: StatusCode, v: &Value) -> Resp {
    // Serialising a Value cannot fail.
    bytes(code, JSON, serde_json::to_vec(v).unwrap_or_default())
}

pub fn ok(v: &Value) -> Resp {
    json(StatusCode::OK, v)
}

pub fn text(code: StatusCode, s: &str) -> Resp {
    bytes(code, "text/plain; charset=utf-8", s.to_string())
}

/// The Status body of an error, with its HTTP code.
pub fn error(e: &ApiError) -> Resp {
    let mut v = serde_json::to_value(e.to_status()).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), "Status".into());
        o.insert("apiVersion".into(), "v1".into());
        o.entry("metadata").or_insert_with(|| serde_json::json!({}));
    }
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json(code, &v);
    if let Some(s) = e.retry_after_seconds {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// A `<Kind>List` whose items are already-serialised objects.
pub fn list_bytes<'a>(
    api_version: &str,
    list_kind: &str,
    revision: Revision,
    continue_token: Option<&str>,
    items: impl Iterator<Item = &'a [u8]>,
) -> Bytes {
    let mut meta = serde_json::json!({ "resourceVersion": revision.to_string() });
    if let Some(c) = continue_token {
        meta["continue"] = Value::String(c.to_string());
    }
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"kind\":");
    out.extend_from_slice(&serde_json::to_vec(list_kind).unwrap_or_default());
    out.extend_from_slice(b",\"apiVersion\":");
    out.extend_from_slice(&serde_json::to_vec(api_version).unwrap_or_default());
    out.extend_from_slice(b",\"metadata\":");
    out.extend_from_slice(&serde_json::to_vec(&meta).unwrap_or_default());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_is_valid_json() {
        let items = [br#"{"a":1}"#.as_slice(), br#"{"b":2}"#.as_slice()];
        let b = list_bytes("v1", "PodList", Revision(7), Some("tok"), items.into_iter());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["metadata"]["continue"], "tok");
        assert_eq!(v["items"][1]["b"], 2);
    }
}
