//! The scheduler's writes, all through the API: the binding (`POST pods/{name}/binding`,
//! kube-scheduler's DefaultBinder) and, for a pod no node fits, the PodScheduled=False
//! condition with the reason (what `kubectl describe` and `kubectl get pods` show).

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use super::pod_info::PodInfo;

/// Writes bindings and pod conditions.
#[derive(Clone)]
pub struct Binder {
    client: Client,
}

impl Binder {
    pub fn new(client: Client) -> Binder {
        Binder { client }
    }

    fn api(&self, pod: &PodInfo) -> Api<Pod> {
        Api::namespaced(self.client.clone(), pod.namespace())
    }

    /// Binds `pod` to `node`; the uid guards against a pod deleted and re-created under the
    /// same name meanwhile.
    pub async fn bind(&self, pod: &PodInfo, node: &str) -> Result<(), kube::Error> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod.name().to_string()),
                namespace: Some(pod.namespace().to_string()),
                uid: Some(pod.uid.0.to_string()),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            },
        };
        self.api(pod)
            .create_subresource::<_, Status>(
                "binding",
                pod.name(),
                &PostParams::default(),
                &binding,
            )
            .await
            .map(|_| ())
    }

    /// Sets PodScheduled=False, reason Unschedulable, with `message`, unless the pod already
    /// says exactly that (a retry that fails the same way writes nothing).
    pub async fn mark_unschedulable(
        &self,
        pod: &PodInfo,
        message: &str,
    ) -> Result<(), kube::Error> {
        let current = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        if current.is_some_and(|c| {
            c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
                && c.message.as_deref() == Some(message)
        }) {
            return Ok(());
        }
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
        }]}});
        self.api(pod)
            .patch_status(
                pod.name(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map(|_| ())
    }
}
