//! The scheduler's writes, all through the API: the binding (`POST pods/{name}/binding`,
//! kube-scheduler's DefaultBinder); for a pod no node fits, the PodScheduled=False
//! condition with the reason (what `kubectl describe` and `kubectl get pods` show) and the
//! node preemption nominated it to; and the preemption of a victim (its DisruptionTarget
//! condition, then a graceful delete).

use k8s_openapi::api::core::v1::{Binding, ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use serde_json::json;
use std::sync::{Arc, RwLock};

use super::pod_info::PodInfo;
use super::preemption::{DISRUPTION_TARGET, REASON_PREEMPTION};

/// What a failed cycle does to the pod's `status.nominatedNodeName`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nomination {
    Keep,
    /// Preemption made room on this node.
    Set(String),
    /// Preemption can no longer help; a nomination is withdrawn.
    Clear,
}

fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Writes bindings and pod conditions.
#[derive(Clone)]
pub struct Binder {
    /// Replaced at each leader-election term by a client fenced by that term's lease.
    client: Arc<RwLock<Client>>,
}

impl Binder {
    pub fn new(client: Client) -> Binder {
        Binder {
            client: Arc::new(RwLock::new(client)),
        }
    }

    /// Writes from now on go through `client` (a term's lease-fenced client: a deposed
    /// scheduler's bindings and preemptions are refused before they are sent).
    pub fn use_client(&self, client: Client) {
        *self.client.write().unwrap_or_else(|e| e.into_inner()) = client;
    }

    fn client(&self) -> Client {
        self.client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn api(&self, pod: &PodInfo) -> Api<Pod> {
        Api::namespaced(self.client(), pod.namespace())
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

    /// Sets `volume.kubernetes.io/selected-node` on a claim (VolumeBinding's PreBind), on
    /// the version read, so a claim bound meanwhile is not annotated behind its back.
    pub async fn select_node(
        &self,
        claim: &PersistentVolumeClaim,
        node: &str,
    ) -> Result<(), kube::Error> {
        use kube::ResourceExt;
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client(), &claim.namespace().unwrap_or_default());
        let patch = json!({"metadata": {
            "resourceVersion": claim.resource_version(),
            "annotations": {crate::controllers::persistentvolume::ANN_SELECTED_NODE: node},
        }});
        api.patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// Sets PodScheduled=False, reason Unschedulable, with `message`, and the nomination,
    /// unless the pod already says exactly that (a retry that fails the same way writes
    /// nothing).
    pub async fn mark_unschedulable(
        &self,
        pod: &PodInfo,
        message: &str,
        nomination: &Nomination,
    ) -> Result<(), kube::Error> {
        let status = pod.pod.status.as_ref();
        let current = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
        let nominated = status
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        let nomination_holds = match nomination {
            Nomination::Keep => true,
            Nomination::Set(n) => nominated == Some(n.as_str()),
            Nomination::Clear => nominated.is_none(),
        };
        if nomination_holds
            && current.is_some_and(|c| {
                c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref() == Some(message)
            })
        {
            return Ok(());
        }
        let mut patch = json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
        }]}});
        match nomination {
            Nomination::Keep => {}
            Nomination::Set(n) => patch["status"]["nominatedNodeName"] = json!(n),
            Nomination::Clear => patch["status"]["nominatedNodeName"] = json!(null),
        }
        self.api(pod)
            .patch_status(
                pod.name(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map(|_| ())
    }

    /// Withdraws the pod's nomination (it bound elsewhere, or a more important pod took
    /// the node).
    pub async fn clear_nomination(&self, pod: &PodInfo) -> Result<(), kube::Error> {
        let patch = json!({"status": {"nominatedNodeName": null}});
        match self
            .api(pod)
            .patch_status(
                pod.name(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Err(e) if !gone(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Preempts `victim` as kube-scheduler does: the DisruptionTarget condition first (so
    /// the pod's controller and the disruption controller know why it goes), then a
    /// graceful delete (the pod's own terminationGracePeriodSeconds), guarded by its uid.
    /// A victim already gone is no error.
    pub async fn preempt(&self, victim: &PodInfo, scheduler_name: &str) -> Result<(), kube::Error> {
        let patch = json!({"status": {"conditions": [{
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION,
            "message": format!("{scheduler_name}: preempting to accommodate a higher priority pod"),
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
        }]}});
        let api = self.api(victim);
        match api
            .patch_status(
                victim.name(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(victim.uid.0.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(victim.name(), &dp).await {
            Err(e) if !gone(&e) => Err(e),
            _ => Ok(()),
        }
    }
}
