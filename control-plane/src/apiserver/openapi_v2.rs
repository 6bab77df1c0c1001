//! `/openapi/v2`: the Swagger 2.0 document (`discovery::openapi_v2`) as JSON, or as the
//! protobuf kubectl asks for (gnostic's `openapi.v2.Document`, Accept
//! `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`). kubectl reads it where
//! OpenAPI v3 does not name a kind (its client-side validation and field-validation check),
//! so an unknown kind reaches the mapping step and gets "no matches for kind".
//!
//! The encoder is written here: it covers the part of gnostic's OpenAPIv2.proto the
//! document uses (field numbers from that file); no crate carries those messages.

use std::sync::OnceLock;

use http::StatusCode;
use serde_json::{Map, Value};

use super::discovery;
use super::output::{self, Resp};

/// The media type kubectl asks for (and the one the answer carries).
const PROTOBUF_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2";
const PROTOBUF_CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(discovery::openapi_v2)
}

fn protobuf() -> &'static [u8] {
    static PB: OnceLock<Vec<u8>> = OnceLock::new();
    PB.get_or_init(|| encode_document(document()))
}

/// Answers `/openapi/v2` in the format the Accept header asks for.
pub fn answer(accept: Option<&str>) -> Resp {
    if accept.is_some_and(|a| a.contains(PROTOBUF_ACCEPT)) {
        output::bytes(StatusCode::OK, PROTOBUF_CONTENT_TYPE, protobuf().to_vec())
    } else {
        output::ok(document())
    }
}

/// A protobuf message being written.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn key(&mut self, field: u32, wire: u8) {
        prost::encoding::encode_varint(u64::from(field) << 3 | u64::from(wire), &mut self.0);
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        prost::encoding::encode_varint(b.len() as u64, &mut self.0);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }

    fn message(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn boolean(&mut self, field: u32, b: bool) {
        if b {
            self.key(field, 0);
            self.0.push(1);
        }
    }

    fn varint(&mut self, field: u32, v: i64) {
        self.key(field, 0);
        prost::encoding::encode_varint(v as u64, &mut self.0);
    }

    fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

fn str_of<'v>(v: &'v Value, k: &str) -> &'v str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// `Any { yaml }`: gnostic keeps free-form values as YAML text (JSON is YAML).
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(2, &v.to_string());
    m
}

/// `NamedAny` entries for the `x-` keys of an object.
fn vendor_extensions(m: &mut Msg, field: u32, obj: &Map<String, Value>) {
    for (k, v) in obj.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Msg::default();
        named.string(1, k);
        named.message(2, any(v));
        m.message(field, named);
    }
}

fn encode_document(doc: &Value) -> Vec<u8> {
    let mut d = Msg::default();
    d.string(1, str_of(doc, "swagger"));
    let mut info = Msg::default();
    info.string(1, str_of(&doc["info"], "title"));
    info.string(2, str_of(&doc["info"], "version"));
    d.message(2, info);
    let mut paths = Msg::default();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        let mut named = Msg::default();
        named.string(1, path);
        named.message(2, path_item(item));
        paths.message(2, named);
    }
    d.message(8, paths);
    let mut defs = Msg::default();
    for (name, schema) in doc["definitions"].as_object().into_iter().flatten() {
        let mut named = Msg::default();
        named.string(1, name);
        named.message(2, encode_schema(schema));
        defs.message(1, named);
    }
    d.message(9, defs);
    d.0
}

fn path_item(item: &Value) -> Msg {
    let mut m = Msg::default();
    for (verb, field) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("patch", 8),
    ] {
        if let Some(op) = item.get(verb) {
            m.message(field, operation(op));
        }
    }
    m
}

fn operation(op: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(3, str_of(op, "description"));
    m.string(5, str_of(op, "operationId"));
    for p in op["parameters"].as_array().into_iter().flatten() {
        let mut query = Msg::default();
        query.boolean(1, p["required"].as_bool().unwrap_or(false));
        query.string(2, str_of(p, "in"));
        query.string(3, str_of(p, "description"));
        query.string(4, str_of(p, "name"));
        query.string(6, str_of(p, "type"));
        query.boolean(20, p["uniqueItems"].as_bool().unwrap_or(false));
        let mut non_body = Msg::default();
        non_body.message(3, query);
        let mut parameter = Msg::default();
        parameter.message(2, non_body);
        let mut item = Msg::default();
        item.message(1, parameter);
        m.message(8, item);
    }
    let mut responses = Msg::default();
    for (code, r) in op["responses"].as_object().into_iter().flatten() {
        let mut response = Msg::default();
        response.string(1, str_of(r, "description"));
        let mut value = Msg::default();
        value.message(1, response);
        let mut named = Msg::default();
        named.string(1, code);
        named.message(2, value);
        responses.message(1, named);
    }
    m.message(9, responses);
    if let Some(o) = op.as_object() {
        vendor_extensions(&mut m, 13, o);
    }
    m
}

fn encode_schema(s: &Value) -> Msg {
    let mut m = Msg::default();
    let Some(o) = s.as_object() else {
        return m;
    };
    // A reference with a description of its own is `allOf: [{$ref}]` in OpenAPI v3; Swagger
    // 2.0 (and Kubernetes' own v2 document) puts the two side by side.
    let all_of = o.get("allOf").and_then(Value::as_array);
    let single_ref = match all_of.map(Vec::as_slice) {
        Some([only]) => only.get("$ref").and_then(Value::as_str),
        _ => None,
    };
    m.string(1, single_ref.unwrap_or(str_of(s, "$ref")));
    m.string(2, str_of(s, "format"));
    m.string(3, str_of(s, "title"));
    m.string(4, str_of(s, "description"));
    if let Some(d) = o.get("default") {
        m.message(5, any(d));
    }
    if let Some(x) = o.get("maximum").and_then(Value::as_f64) {
        m.double(7, x);
    }
    if let Some(x) = o.get("minimum").and_then(Value::as_f64) {
        m.double(9, x);
    }
    for (key, field) in [
        ("maxLength", 11),
        ("minLength", 12),
        ("maxItems", 14),
        ("minItems", 15),
    ] {
        if let Some(x) = o.get(key).and_then(Value::as_i64) {
            m.varint(field, x);
        }
    }
    m.string(13, str_of(s, "pattern"));
    for r in o
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.string(19, r.as_str().unwrap_or(""));
    }
    for e in o
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(20, any(e));
    }
    match o.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Msg::default();
            a.key(2, 0);
            a.0.push(u8::from(*b));
            m.message(21, a);
        }
        Some(schema @ Value::Object(_)) => {
            let mut a = Msg::default();
            a.message(1, encode_schema(schema));
            m.message(21, a);
        }
        _ => {}
    }
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    if !types.is_empty() {
        let mut t = Msg::default();
        for ty in types {
            t.string(1, ty);
        }
        m.message(22, t);
    }
    if let Some(items) = o.get("items") {
        let mut i = Msg::default();
        i.message(1, encode_schema(items));
        m.message(23, i);
    }
    if single_ref.is_none() {
        for a in all_of.into_iter().flatten() {
            m.message(24, encode_schema(a));
        }
    }
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        let mut p = Msg::default();
        for (name, schema) in props {
            let mut named = Msg::default();
            named.string(1, name);
            named.message(2, encode_schema(schema));
            p.message(1, named);
        }
        m.message(25, p);
    }
    m.boolean(
        27,
        o.get("readOnly").and_then(Value::as_bool).unwrap_or(false),
    );
    vendor_extensions(&mut m, 31, o);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    // The part of gnostic's messages the checks below read back (tags from OpenAPIv2.proto).
    #[derive(Clone, PartialEq, Message)]
    struct Document {
        #[prost(string, tag = "1")]
        swagger: String,
        #[prost(message, optional, tag = "8")]
        paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        definitions: Option<Definitions>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Paths {
        #[prost(message, repeated, tag = "2")]
        path: Vec<NamedPathItem>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct NamedPathItem {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, optional, tag = "2")]
        value: Option<PathItem>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct PathItem {
        #[prost(message, optional, tag = "8")]
        patch: Option<Operation>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Operation {
        #[prost(message, repeated, tag = "8")]
        parameters: Vec<ParametersItem>,
        #[prost(message, repeated, tag = "13")]
        vendor_extension: Vec<NamedAny>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct ParametersItem {
        #[prost(message, optional, tag = "1")]
        parameter: Option<Parameter>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Parameter {
        #[prost(message, optional, tag = "2")]
        non_body_parameter: Option<NonBodyParameter>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct NonBodyParameter {
        #[prost(message, optional, tag = "3")]
        query: Option<Query>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Query {
        #[prost(string, tag = "4")]
        name: String,
    }
    #[derive(Clone, PartialEq, Message)]
    struct NamedAny {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, optional, tag = "2")]
        value: Option<Any>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Any {
        #[prost(string, tag = "2")]
        yaml: String,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Definitions {
        #[prost(message, repeated, tag = "1")]
        additional_properties: Vec<NamedSchema>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct NamedSchema {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(message, optional, tag = "2")]
        value: Option<Schema>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct Schema {
        #[prost(string, tag = "1")]
        reference: String,
        #[prost(message, optional, tag = "22")]
        r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "25")]
        properties: Option<Definitions>,
        #[prost(message, repeated, tag = "31")]
        vendor_extension: Vec<NamedAny>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        value: Vec<String>,
    }

    #[test]
    fn protobuf_reads_back_as_gnostic_messages() {
        let doc = Document::decode(protobuf()).unwrap();
        assert_eq!(doc.swagger, "2.0");
        let paths = doc.paths.unwrap().path;
        let deploy = paths
            .iter()
            .find(|p| p.name == "/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            .unwrap();
        let patch = deploy.value.clone().unwrap().patch.unwrap();
        let gvk = patch
            .vendor_extension
            .iter()
            .find(|e| e.name == "x-kubernetes-group-version-kind")
            .unwrap();
        let yaml: Value = serde_json::from_str(&gvk.value.clone().unwrap().yaml).unwrap();
        assert_eq!(yaml["kind"], "Deployment");
        let param = patch.parameters[0].parameter.clone().unwrap();
        assert_eq!(
            param.non_body_parameter.unwrap().query.unwrap().name,
            "fieldValidation"
        );
        let defs = doc.definitions.unwrap().additional_properties;
        let d = defs
            .iter()
            .find(|d| d.name == "io.k8s.api.apps.v1.Deployment")
            .unwrap()
            .value
            .clone()
            .unwrap();
        assert_eq!(d.r#type.unwrap().value, vec!["object"]);
        let spec = d
            .properties
            .unwrap()
            .additional_properties
            .into_iter()
            .find(|p| p.name == "spec")
            .unwrap();
        assert_eq!(
            spec.value.unwrap().reference,
            "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"
        );
        assert!(d
            .vendor_extension
            .iter()
            .any(|e| e.name == "x-kubernetes-group-version-kind"));
    }

    #[test]
    fn json_unless_protobuf_is_asked_for() {
        assert_eq!(document()["swagger"], "2.0");
        assert!(document()["definitions"]["io.k8s.api.core.v1.Pod"].is_object());
    }
}
