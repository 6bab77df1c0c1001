//! Reading and writing an API object's metadata on its JSON form (`serde_json::Value`), the
//! shape the handlers and the machinery work on.

use serde_json::{Map, Value};

use crate::machinery::ApiError;
use crate::store::Revision;

/// The object's `metadata`, created if missing. Errors if the object is not a JSON object.
pub fn metadata_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let o = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the object is not a JSON object"))?;
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(m.as_object_mut().expect("checked above"))
}

pub fn str_field<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(obj, |v, k| v.get(k))?.as_str()
}

pub fn name(obj: &Value) -> Option<&str> {
    str_field(obj, &["metadata", "name"]).filter(|s| !s.is_empty())
}

pub fn uid(obj: &Value) -> Option<&str> {
    str_field(obj, &["metadata", "uid"])
}

pub fn resource_version(obj: &Value) -> Option<&str> {
    str_field(obj, &["metadata", "resourceVersion"]).filter(|s| !s.is_empty())
}

/// Parses a resourceVersion as the store revision it is.
pub fn parse_revision(rv: &str) -> Result<Revision, ApiError> {
    rv.parse()
        .map(Revision)
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))
}

pub fn set_resource_version(obj: &mut Value, rev: Revision) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
}

pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    str_field(obj, &["metadata", "deletionTimestamp"])
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Now as an RFC 3339 timestamp with second precision (metav1.Time).
pub fn now() -> String {
    now_plus(0)
}

/// Now plus `seconds`, as metav1.Time.
pub fn now_plus(seconds: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(now.saturating_add(seconds))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Everything but metadata and status: what a spec change is measured on.
pub fn without_meta_and_status(obj: &Value) -> Map<String, Value> {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "apiVersion", "kind"] {
        m.remove(k);
    }
    m
}

/// A random suffix as Kubernetes makes them for generateName (no vowels, no look-alikes).
pub fn random_suffix(len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..len)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A random RFC 4122 version 4 UID.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_and_suffixes_have_kubernetes_shape() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        let s = random_suffix(5);
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
        assert!(now().ends_with('Z') && now().len() == 20);
    }

    #[test]
    fn metadata_mut_rejects_non_objects() {
        assert!(metadata_mut(&mut Value::Null).is_err());
        assert!(metadata_mut(&mut serde_json::json!({"metadata": 3})).is_err());
        let mut v = serde_json::json!({});
        metadata_mut(&mut v)
            .unwrap()
            .insert("name".into(), "x".into());
        assert_eq!(name(&v), Some("x"));
    }
}
