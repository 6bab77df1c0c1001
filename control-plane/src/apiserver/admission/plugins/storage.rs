//! DefaultStorageClass and StorageObjectInUseProtection, as Kubernetes' plugins of those
//! names: a claim created without `spec.storageClassName` gets the default StorageClass (the
//! newest of several marked default; none when no class is marked), and every new claim and
//! volume carries the protection finalizer that the protection controllers remove once
//! nothing uses the object.
//!
//! Classes are read from the watch cache: a cluster has a handful.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::super::{Env, Operation, Plugin, Request};
use crate::machinery::kinds::storage::{self, is_default_class};
use crate::machinery::ApiError;

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// The annotation that named a claim's class before `spec.storageClassName`.
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

pub struct DefaultStorageClass {
    env: Env,
}

impl DefaultStorageClass {
    pub fn new(env: Env) -> DefaultStorageClass {
        DefaultStorageClass { env }
    }

    /// The default class's name: of the classes marked default, the newest (by creation
    /// time, then name), as Kubernetes 1.33 picks.
    async fn default_class(&self) -> Result<Option<String>, ApiError> {
        let mut classes: Vec<(String, String)> = vec![];
        for o in self
            .env
            .list(storage::GROUP, "storageclasses", None)
            .await?
        {
            let v = o.value().map_err(ApiError::internal)?;
            if !is_default_class(&v) {
                continue;
            }
            let created = v["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let name = v["metadata"]["name"].as_str().unwrap_or_default();
            classes.push((created, name.to_string()));
        }
        Ok(newest(classes))
    }
}

/// The newest of (creationTimestamp, name) pairs; the first name on a tie.
fn newest(mut classes: Vec<(String, String)>) -> Option<String> {
    classes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    classes.into_iter().next().map(|(_, n)| n)
}

#[async_trait]
impl Plugin for DefaultStorageClass {
    fn name(&self) -> &'static str {
        "DefaultStorageClass"
    }

    async fn admit(&self, req: &Request<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if !req.is("", "PersistentVolumeClaim") || req.operation != Operation::Create {
            return Ok(());
        }
        let Some(claim) = obj else {
            return Ok(());
        };
        // An explicit class, even "" (no class), is kept.
        if claim
            .pointer("/spec/storageClassName")
            .is_some_and(|c| !c.is_null())
            || claim
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(BETA_CLASS_ANNOTATION))
                .is_some()
        {
            return Ok(());
        }
        let Some(class) = self.default_class().await? else {
            return Ok(());
        };
        if let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("storageClassName".into(), json!(class));
        }
        Ok(())
    }
}

pub struct StorageObjectInUseProtection;

#[async_trait]
impl Plugin for StorageObjectInUseProtection {
    fn name(&self) -> &'static str {
        "StorageObjectInUseProtection"
    }

    async fn admit(&self, req: &Request<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        if req.operation != Operation::Create {
            return Ok(());
        }
        let finalizer = if req.is("", "PersistentVolumeClaim") {
            PVC_PROTECTION
        } else if req.is("", "PersistentVolume") {
            PV_PROTECTION
        } else {
            return Ok(());
        };
        let Some(meta) = obj
            .and_then(|o| o.get_mut("metadata"))
            .and_then(Value::as_object_mut)
        else {
            return Ok(());
        };
        let list = meta.entry("finalizers").or_insert_with(|| json!([]));
        if list.is_null() {
            *list = json!([]);
        }
        if !list.is_array() {
            // Validation reports what does not decode.
            return Ok(());
        }
        if let Some(items) = list.as_array_mut() {
            if !items.iter().any(|f| f == finalizer) {
                items.push(json!(finalizer));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_default_wins() {
        assert_eq!(newest(vec![]), None);
        let pick = newest(vec![
            ("2025-01-01T00:00:00Z".into(), "old".into()),
            ("2025-02-01T00:00:00Z".into(), "b".into()),
            ("2025-02-01T00:00:00Z".into(), "a".into()),
        ]);
        assert_eq!(pick.as_deref(), Some("a"));
    }
}
