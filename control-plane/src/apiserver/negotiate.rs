//! Content negotiation: how a request body is encoded (JSON, YAML, Kubernetes protobuf) and
//! what shape the client accepts back (plain JSON, a meta.k8s.io Table, aggregated discovery).

use serde_json::Value;

use super::protobuf;
use crate::machinery::ApiError;

/// Largest request body accepted (Kubernetes' limit for one object is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The encoding of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    Json,
    Yaml,
    Protobuf,
}

/// The media type without parameters, lower-cased.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

impl BodyFormat {
    /// The format of an object body from its Content-Type (JSON when absent).
    pub fn of(content_type: Option<&str>) -> Result<BodyFormat, ApiError> {
        let Some(ct) = content_type else {
            return Ok(BodyFormat::Json);
        };
        match media_type(ct).as_str() {
            "" | "application/json" | "*/*" => Ok(BodyFormat::Json),
            "application/yaml" | "application/x-yaml" | "text/yaml" => Ok(BodyFormat::Yaml),
            "application/vnd.kubernetes.protobuf" => Ok(BodyFormat::Protobuf),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// Decodes an object body into JSON.
pub fn decode_object(format: BodyFormat, body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = match format {
        BodyFormat::Json => {
            serde_json::from_slice(body).map_err(|e| ApiError::malformed("json", e))?
        }
        BodyFormat::Yaml => {
            serde_saphyr::from_slice(body).map_err(|e| ApiError::malformed("yaml", e))?
        }
        BodyFormat::Protobuf => protobuf::decode(body)?,
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a single JSON object",
        ));
    }
    Ok(v)
}

/// One media range of an Accept header, with its parameters.
struct MediaRange<'a> {
    kind: String,
    params: Vec<(String, &'a str)>,
}

fn ranges(accept: &str) -> impl Iterator<Item = MediaRange<'_>> {
    accept.split(',').map(|r| {
        let mut parts = r.split(';');
        let kind = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let params = parts
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                Some((k.trim().to_ascii_lowercase(), v.trim()))
            })
            .collect();
        MediaRange { kind, params }
    })
}

impl MediaRange<'_> {
    fn param(&self, k: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| n == k).map(|(_, v)| *v)
    }
}

/// What a read answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Object,
    Table(IncludeObject),
}

/// `includeObject` of a Table request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// The output a read should use: a Table when the first acceptable media range asks for
/// `as=Table;g=meta.k8s.io` (v1 or v1beta1), the object otherwise.
pub fn output(accept: Option<&str>, include_object: Option<&str>) -> Output {
    let accept = accept.unwrap_or("");
    for r in ranges(accept) {
        if r.param("as") == Some("Table")
            && r.param("g") == Some("meta.k8s.io")
            && matches!(r.param("v"), Some("v1") | Some("v1beta1"))
        {
            let inc = match include_object {
                Some("None") => IncludeObject::None,
                Some("Object") => IncludeObject::Object,
                _ => IncludeObject::Metadata,
            };
            return Output::Table(inc);
        }
        let plain = r.kind.starts_with("application/json")
            || r.kind == "*/*"
            || r.kind.starts_with("application/vnd.kubernetes.protobuf")
            || r.kind.starts_with("application/yaml");
        if plain && r.param("as").is_none() {
            return Output::Object;
        }
    }
    Output::Object
}

/// The aggregated discovery version the client accepts first, if any (`v2` or `v2beta1`).
pub fn aggregated_discovery(accept: Option<&str>) -> Option<&'static str> {
    for r in ranges(accept.unwrap_or("")) {
        if r.param("g") == Some("apidiscovery.k8s.io")
            && r.param("as") == Some("APIGroupDiscoveryList")
        {
            match r.param("v") {
                Some("v2") => return Some("v2"),
                Some("v2beta1") => return Some("v2beta1"),
                _ => {}
            }
        } else if r.param("as").is_none() {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL_GET: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    const KUBECTL_DISCOVERY: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    #[test]
    fn negotiates_like_kubectl_expects() {
        assert_eq!(
            output(Some(KUBECTL_GET), None),
            Output::Table(IncludeObject::Metadata)
        );
        assert_eq!(
            output(Some(KUBECTL_GET), Some("Object")),
            Output::Table(IncludeObject::Object)
        );
        assert_eq!(output(Some("application/json"), None), Output::Object);
        assert_eq!(output(None, None), Output::Object);
        assert_eq!(aggregated_discovery(Some(KUBECTL_DISCOVERY)), Some("v2"));
        assert_eq!(aggregated_discovery(Some("application/json")), None);
    }

    #[test]
    fn body_formats() {
        assert_eq!(
            BodyFormat::of(Some("application/json; charset=utf-8")).unwrap(),
            BodyFormat::Json
        );
        assert_eq!(
            BodyFormat::of(Some("application/vnd.kubernetes.protobuf")).unwrap(),
            BodyFormat::Protobuf
        );
        assert_eq!(BodyFormat::of(Some("text/plain")).unwrap_err().code, 415);
        assert_eq!(
            decode_object(BodyFormat::Json, b"{bad").unwrap_err().code,
            400
        );
        assert_eq!(
            decode_object(BodyFormat::Json, b"[1]").unwrap_err().code,
            400
        );
        let v = decode_object(BodyFormat::Yaml, b"kind: Pod\nmetadata:\n  name: a\n").unwrap();
        assert_eq!(v["metadata"]["name"], "a");
        assert_eq!(
            decode_object(BodyFormat::Yaml, b"a: [").unwrap_err().code,
            400
        );
    }
}
