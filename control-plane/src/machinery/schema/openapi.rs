//! The published forms of a CRD schema. OpenAPI v3 is the schema as given; OpenAPI v2
//! cannot say `nullable` or allOf/anyOf/oneOf/not, so Kubernetes leaves them out (and the
//! `type` of a nullable field, which v2 clients would otherwise enforce on a null).

use serde_json::Value;

/// The OpenAPI v2 form of a schema.
pub(super) fn v2(schema: &Value) -> Value {
    let mut out = schema.clone();
    strip(&mut out);
    out
}

fn strip(v: &mut Value) {
    let Value::Object(map) = v else {
        return;
    };
    for key in ["allOf", "anyOf", "oneOf", "not"] {
        map.remove(key);
    }
    if map.remove("nullable") == Some(Value::Bool(true)) {
        map.remove("type");
    }
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        props.values_mut().for_each(strip);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = map.get_mut(key) {
            strip(sub);
        }
    }
}
