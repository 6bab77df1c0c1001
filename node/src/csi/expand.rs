//! Volume expansion on the node, the kubelet's half of it: once the resizer has grown a
//! volume (ControllerExpandVolume, the PV's capacity) and marked its claim
//! `FileSystemResizePending`, the node grows the filesystem with NodeExpandVolume and records
//! the claim as resized (status.capacity = the PV's, the condition gone), with the kubelet's
//! `FileSystemResizeSuccessful` / `FileSystemResizeFailed` Events on the pod.
//!
//! Offline (a volume staged for a pod, before it is published) is done by
//! [`super::CsiVolumes::publish`]; online (a volume published for a running pod) by the
//! periodic volume pass, which drivers growing offline only refuse with FailedPrecondition
//! while the volume is published: the claim then waits for its pod to be started again.

use control_plane::machinery::quantity::Quantity;
use k8s_openapi::api::core::v1::{
    Event, EventSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

/// The claim condition the resizer sets when the node must grow the filesystem.
pub const RESIZE_PENDING: &str = "FileSystemResizePending";
/// The annotation the resizer handling a claim sets on it (Kubernetes' name).
pub const RESIZER_ANNOTATION: &str = "volume.kubernetes.io/storage-resizer";
pub const RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
pub const RESIZE_FAILED: &str = "FileSystemResizeFailed";

fn storage(
    q: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Option<(i64, String)> {
    let s = q?.get("storage")?;
    Quantity::parse(&s.0).ok().map(|v| (v.value(), s.0.clone()))
}

/// The size (bytes, and the PV's quantity as written) the node must grow a claim's volume to,
/// when it must: the claim has `FileSystemResizePending`, or a resizer handles it and the PV
/// is larger than the claim's status.capacity (as the kubelet decides).
pub fn resize_target(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Option<(i64, String)> {
    let (bytes, quantity) = storage(pv.spec.as_ref()?.capacity.as_ref())?;
    let status = pvc.status.as_ref();
    let pending = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == RESIZE_PENDING && c.status == "True")
        });
    let resizer = pvc
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(RESIZER_ANNOTATION));
    let smaller = storage(status.and_then(|s| s.capacity.as_ref())).is_none_or(|(b, _)| b < bytes);
    (pending || (resizer && smaller)).then_some((bytes, quantity))
}

/// The node's writes for expansion: the claim's status and the pod's Events.
#[derive(Clone)]
pub struct ExpandApi {
    pub client: Client,
    pub node: String,
}

/// The pod an expansion is done for (its Events' involved object).
#[derive(Debug, Clone)]
pub struct PodOf<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

impl ExpandApi {
    pub async fn claim(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())
    }

    pub async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, String> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())
    }

    /// The filesystem has the PV's size: status.capacity = `quantity`, the
    /// FileSystemResizePending condition and the storage entry of allocatedResourceStatuses
    /// removed (Kubernetes' MarkFSResizeFinished).
    pub async fn mark_resized(
        &self,
        pvc: &PersistentVolumeClaim,
        quantity: &str,
    ) -> Result<(), String> {
        let ns = pvc.metadata.namespace.as_deref().unwrap_or("default");
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        let status = pvc.status.as_ref();
        let conditions: Vec<_> = status
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ != RESIZE_PENDING)
            .collect();
        let mut patch = json!({"status": {
            "capacity": {"storage": quantity},
            "conditions": if conditions.is_empty() { serde_json::Value::Null } else { json!(conditions) },
        }});
        if status
            .and_then(|s| s.allocated_resource_statuses.as_ref())
            .is_some_and(|a| a.contains_key("storage"))
        {
            patch["status"]["allocatedResourceStatuses"] = json!({"storage": null});
        }
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("updating the status of claim {ns}/{name}: {e}"))
    }

    /// Records an Event about the pod from the kubelet of this node (a failure is logged:
    /// Events are best effort).
    pub async fn event(&self, pod: &PodOf<'_>, warning: bool, reason: &str, message: String) {
        let t = crate::pod::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:x}", pod.name, t.0.as_nanosecond())),
                namespace: Some(pod.namespace.to_string()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.to_string()),
                namespace: Some(pod.namespace.to_string()),
                uid: Some(pod.uid.to_string()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node.clone()),
            first_timestamp: Some(t.clone()),
            last_timestamp: Some(t),
            count: Some(1),
            ..Default::default()
        };
        if let Err(e) = Api::<Event>::namespaced(self.client.clone(), pod.namespace)
            .create(&PostParams::default(), &event)
            .await
        {
            tracing::warn!(pod = pod.name, reason, error = %e, "recording an event failed");
        }
    }

    pub fn succeeded(&self, pv: &str) -> String {
        format!(
            "MountVolume.NodeExpandVolume succeeded for volume \"{pv}\" {}",
            self.node
        )
    }

    pub fn failed(&self, pv: &str, error: &str) -> String {
        format!(
            "MountVolume.NodeExpandVolume failed for volume \"{pv}\" {} : {error}",
            self.node
        )
    }
}
