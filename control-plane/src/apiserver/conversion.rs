//! Resources served from another resource's storage: as in Kubernetes, one stored object can
//! have several API views (events.k8s.io/v1 Event is a view of the stored core/v1 Event), so
//! what either API writes, the other reads. Handlers work in the shape of the resource the
//! client named; the shape changes only at the storage boundary: objects read from the store
//! or the cache ([`served`], [`from_storage`]) and bytes written to the store ([`stored_bytes`]).
//! A view's field selectors name storage fields through [`Conversion::field`].

use bytes::Bytes;
use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::events::v1 as eventsv1;
use serde_json::Value;

use super::registry::Resource;
use crate::machinery::kinds::{events, hpa};
use crate::machinery::ApiError;
use crate::store::cache::CachedObject;

/// How a view maps onto its storage resource.
#[derive(Debug)]
pub struct Conversion {
    /// The resource whose storage holds the objects: (group, version, plural).
    pub storage: (&'static str, &'static str, &'static str),
    /// The view's object in the storage shape.
    pub to_storage: fn(Value) -> Result<Value, ApiError>,
    /// A stored object in the view's shape.
    pub from_storage: fn(Value) -> Result<Value, ApiError>,
    /// The storage field a field selector of the view names (None: not selectable).
    pub field: fn(&str) -> Option<&'static str>,
}

/// events.k8s.io/v1 Event over the stored core/v1 Event.
pub static EVENTS_V1: Conversion = Conversion {
    storage: ("", "v1", "events"),
    to_storage: |v| {
        let e: eventsv1::Event = decode(v)?;
        encode(events::as_core(e))
    },
    from_storage: |v| {
        let e: corev1::Event = decode(v)?;
        encode(events::as_events_v1(e))
    },
    field: events::core_field_label,
};

/// autoscaling/v1 HorizontalPodAutoscaler over the stored autoscaling/v2 one.
pub static HPA_V1: Conversion = Conversion {
    storage: (hpa::GROUP, "v2", "horizontalpodautoscalers"),
    to_storage: |v| hpa::v1_value_to_v2(v).map_err(conversion_error),
    from_storage: |v| hpa::v2_value_to_v1(v).map_err(conversion_error),
    field: |f| match f {
        "metadata.name" => Some("metadata.name"),
        "metadata.namespace" => Some("metadata.namespace"),
        _ => None,
    },
};

fn conversion_error(e: crate::machinery::FieldError) -> ApiError {
    ApiError::bad_request(format!("converting: {}: {}", e.field, e.message))
}

fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("converting: {e}")))
}

fn encode<T: serde::Serialize>(t: T) -> Result<Value, ApiError> {
    serde_json::to_value(t).map_err(ApiError::internal)
}

/// A stored object in the shape of `r`.
pub fn from_storage(r: &Resource, mut stored: Value) -> Result<Value, ApiError> {
    if r.custom().is_some() {
        // Conversion None: the same object at the requested version.
        if let Some(o) = stored.as_object_mut() {
            o.insert("apiVersion".into(), r.api_version().into());
        }
        return Ok(stored);
    }
    match r.stored_as() {
        None => Ok(stored),
        Some(c) => (c.from_storage)(stored),
    }
}

/// The bytes to store for `obj` (in the shape of `r`).
pub fn stored_bytes(r: &Resource, obj: &Value) -> Result<Bytes, ApiError> {
    if let Some(c) = r.custom() {
        let mut v = obj.clone();
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "apiVersion".into(),
                format!("{}/{}", r.group, c.storage_version).into(),
            );
        }
        return serde_json::to_vec(&v)
            .map(Bytes::from)
            .map_err(ApiError::internal);
    }
    let bytes = match r.stored_as() {
        None => serde_json::to_vec(obj),
        Some(c) => serde_json::to_vec(&(c.to_storage)(obj.clone())?),
    };
    bytes.map(Bytes::from).map_err(ApiError::internal)
}

/// A cached object's JSON in the shape of `r` (the cached bytes themselves when no
/// conversion applies).
pub fn served(r: &Resource, o: &CachedObject) -> Result<Bytes, ApiError> {
    match r.stored_as() {
        None if r.custom().is_some_and(|c| c.storage_version != r.version) => {
            let v = served_value(r, o)?;
            serde_json::to_vec(&v)
                .map(Bytes::from)
                .map_err(ApiError::internal)
        }
        None => Ok(o.json.clone()),
        Some(_) => {
            let v = served_value(r, o)?;
            serde_json::to_vec(&v)
                .map(Bytes::from)
                .map_err(ApiError::internal)
        }
    }
}

/// A cached object, parsed, in the shape of `r`.
pub fn served_value(r: &Resource, o: &CachedObject) -> Result<Value, ApiError> {
    from_storage(r, o.value().map_err(ApiError::internal)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_convert_both_ways_and_keep_metadata() {
        let core = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default", "resourceVersion": "9", "uid": "u"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Started", "message": "Started container c", "type": "Normal",
            "source": {"component": "kubelet", "host": "n1"}, "count": 3});
        let view = (EVENTS_V1.from_storage)(core.clone()).unwrap();
        assert_eq!(view["apiVersion"], "events.k8s.io/v1");
        assert_eq!(view["regarding"]["name"], "p");
        assert_eq!(view["note"], "Started container c");
        assert_eq!(view["deprecatedCount"], 3);
        assert_eq!(view["deprecatedSource"]["host"], "n1");
        assert_eq!(view["metadata"]["resourceVersion"], "9");
        assert_eq!((EVENTS_V1.to_storage)(view).unwrap(), core);
        assert_eq!(
            (EVENTS_V1.to_storage)(json!({"regarding": 5}))
                .unwrap_err()
                .code,
            400
        );
    }
}
