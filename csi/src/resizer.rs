//! The resizer: external-resizer, run by the node plugin of every node (like the
//! provisioner, distributed: each node's resizer grows the volumes pinned to its node, through
//! its own Controller service).
//!
//! The PV binder marks a bound claim whose class allows expansion and whose request grew
//! beyond its capacity with `volume.kubernetes.io/storage-resizer` = the volume's driver.
//! For such a claim of this driver whose volume lives on this node and has less than the
//! request, the resizer does what external-resizer does:
//! 1. claim condition `Resizing`, Event `Resizing`;
//! 2. ControllerExpandVolume(request);
//! 3. the PV's `spec.capacity` becomes the size the driver answered; when the driver needs
//!    the node to grow the filesystem (this driver always does), the PV also gets
//!    `volume.alpha.kubernetes.io/pre-resize-capacity` = the claim's capacity before (so the
//!    binder keeps reporting the old size), the claim `FileSystemResizePending` and the Event
//!    `FileSystemResizeRequired`; the node agent finishes (NodeExpandVolume, then the claim's
//!    `status.capacity` and conditions), after which this resizer removes the annotation;
//!    without node expansion the claim's `status.capacity` is set here (`VolumeResizeSuccessful`).
//!
//! Failures: Event Warning `VolumeResizeFailed` with the driver's gRPC status, the `Resizing`
//! condition replaced by `ControllerResizeError`, `allocatedResourceStatuses.storage` =
//! `ControllerResizeInfeasible` for errors that retrying the same size cannot fix
//! (InvalidArgument, OutOfRange) and `ControllerResizeInProgress` otherwise; retried per
//! claim with exponential back-off (1 s doubling to 5 min) either way, so a lowered request
//! or freed space is picked up. The claims are reconciled by the control plane's controller
//! runtime (`control_plane::runtime::Controller`, controller name `resizer`).
//!
//! Every step is recomputed from the objects: a claim still `Resizing` whose volume already
//! has the request (its status update was lost to a conflict or a crash) gets the state that
//! follows from the PV (pre-resize annotation: node expansion pending, else done), so the
//! claim never stays `Resizing`. Claim status patches carry the resourceVersion read (a
//! concurrent writer makes them conflict and retry rather than drop its conditions).
//!
//! Work is per changed object: claim events queue that claim, volume events queue the claim
//! their claimRef names; nothing is relisted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use control_plane::runtime::controller::{api_code, involved};
use control_plane::runtime::queue::Backoff;
use control_plane::runtime::{
    Change, Controller, EventSink, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::proto::csi::v1 as csi;
use crate::provisioner::{bytes_quantity, quantity_bytes, volume_node};
use crate::runtime::StopOnDrop;
use csi::controller_client::ControllerClient;

/// Set by the PV binder on a claim to expand: the resizer that should (the CSI driver).
pub const STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";
/// Set on a PV whose filesystem still has to grow on the node: the claim's capacity before
/// the expansion (what the binder reports as the claim's capacity meanwhile).
pub const PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// Claim conditions (Kubernetes' PersistentVolumeClaimConditionType values).
pub const RESIZING: &str = "Resizing";
pub const FS_RESIZE_PENDING: &str = "FileSystemResizePending";
pub const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
/// The resize conditions this resizer and the node agent manage; others are kept.
const RESIZE_CONDITIONS: [&str; 4] = [
    RESIZING,
    FS_RESIZE_PENDING,
    CONTROLLER_RESIZE_ERROR,
    "NodeResizeError",
];
/// The message of FileSystemResizePending (Kubernetes' text).
pub const FS_RESIZE_PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// Retries of one claim: 1 s doubling up to 5 min.
const RETRY: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(300),
};
const WORKERS: usize = 2;
/// The controller's name in the runtime's metrics and logs.
const NAME: &str = "resizer";
/// A CSI call that takes longer is abandoned and retried (ControllerExpandVolume is
/// idempotent).
const CSI_TIMEOUT: Duration = Duration::from_secs(60);

/// What the resizer of one node needs.
pub struct Config {
    pub client: kube::Client,
    /// This node's plugin (its Controller service).
    pub csi: Channel,
    /// The driver's name (`local.csi.skiff.io`).
    pub driver: String,
    /// This node's name.
    pub node: String,
    /// The controller runtime's metrics (the plugin's [`crate::metrics::Metrics::controllers`]).
    pub metrics: control_plane::runtime::Metrics,
}

struct Resizer {
    client: kube::Client,
    csi: ControllerClient<Channel>,
    driver: String,
    node: String,
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    recorder: Recorder,
}

fn annotation<'a, K: Resource>(o: &'a K, key: &str) -> Option<&'a str> {
    o.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn storage(
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Option<i64> {
    m.and_then(|m| m.get("storage"))
        .and_then(|q| quantity_bytes(&q.0))
}

/// The claim's requested bytes.
fn claim_request(claim: &PersistentVolumeClaim) -> Option<i64> {
    storage(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    )
}

/// The claim's `status.capacity` in bytes.
fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<i64> {
    storage(claim.status.as_ref().and_then(|s| s.capacity.as_ref()))
}

/// The volume's `spec.capacity` in bytes.
fn volume_capacity(pv: &PersistentVolume) -> Option<i64> {
    storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref()))
}

/// Whether this node's resizer of `driver` handles `claim` at all (the cheap test done for
/// every claim event).
fn claim_is_ours(claim: &PersistentVolumeClaim, driver: &str) -> bool {
    annotation(claim, STORAGE_RESIZER) == Some(driver)
}

/// The claim key a volume of `driver` on `node` belongs to (its claimRef).
fn volume_claim(pv: &PersistentVolume, driver: &str, node: &str) -> Option<ObjectKey> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.as_ref()?.driver != driver || volume_node(pv) != Some(node) {
        return None;
    }
    let r = spec.claim_ref.as_ref()?;
    Some(ObjectKey::namespaced(r.namespace.clone()?, r.name.clone()?))
}

/// What a claim needs from this resizer.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Nothing,
    /// ControllerExpandVolume from the volume's capacity to the request.
    Expand {
        from: i64,
        to: i64,
    },
    /// The volume grew but the claim still says Resizing (the claim update after the PV's
    /// failed, or a crash came between them): the claim gets the state that follows, from
    /// the PV (its pre-resize annotation records that the node must grow the filesystem).
    Finish {
        node_expansion: bool,
        size: i64,
    },
    /// The node finished the filesystem: the volume's pre-resize annotation goes.
    ClearPreResize,
}

/// Whether the claim has the condition `type_`.
fn has_condition(claim: &PersistentVolumeClaim, type_: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_))
}

fn action(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    driver: &str,
    node: &str,
) -> Action {
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let ours = claim_is_ours(claim, driver)
        && bound
        && claim.meta().deletion_timestamp.is_none()
        && volume_claim(pv, driver, node).is_some()
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            == claim.uid().as_deref();
    if !ours {
        return Action::Nothing;
    }
    let (Some(request), Some(has)) = (claim_request(claim), volume_capacity(pv)) else {
        return Action::Nothing;
    };
    if request > has {
        return Action::Expand {
            from: has,
            to: request,
        };
    }
    let pending = annotation(pv, PRE_RESIZE_CAPACITY).is_some();
    let finished = claim_capacity(claim).is_some_and(|c| c >= has);
    if has_condition(claim, RESIZING) {
        return Action::Finish {
            node_expansion: pending,
            size: has,
        };
    }
    if finished && pending {
        return Action::ClearPreResize;
    }
    Action::Nothing
}

/// The volume capability of a PV (mount, its filesystem and options, its first access mode)
/// for ControllerExpandVolume.
fn capability(pv: &PersistentVolume) -> csi::VolumeCapability {
    use csi::volume_capability::access_mode::Mode;
    let spec = pv.spec.clone().unwrap_or_default();
    let mode = match spec
        .access_modes
        .as_ref()
        .and_then(|m| m.first())
        .map(String::as_str)
    {
        Some("ReadWriteOncePod") => Mode::SingleNodeSingleWriter,
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    };
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: spec
                    .csi
                    .as_ref()
                    .and_then(|c| c.fs_type.clone())
                    .unwrap_or_default(),
                mount_flags: spec.mount_options.unwrap_or_default(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// A gRPC status as Go's grpc prints it (what Kubernetes' Events show).
fn rpc_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

/// Errors after which the same request cannot succeed (external-resizer's infeasible ones).
fn infeasible(code: tonic::Code) -> bool {
    matches!(code, tonic::Code::InvalidArgument | tonic::Code::OutOfRange)
}

/// The claim's conditions without the resize ones, plus `add`.
fn conditions(claim: &PersistentVolumeClaim, add: Option<(&str, String)>) -> Value {
    let mut out: Vec<PersistentVolumeClaimCondition> = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    if let Some((type_, message)) = add {
        out.push(PersistentVolumeClaimCondition {
            type_: type_.to_string(),
            status: "True".into(),
            last_transition_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
            message: (!message.is_empty()).then_some(message),
            ..Default::default()
        });
    }
    serde_json::to_value(out).unwrap_or(Value::Array(Vec::new()))
}

impl Resizer {
    fn claims_api(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Merge-patches the claim's status, conditional on the version `claim` was read at (a
    /// conflict is retried with the next version).
    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        status: Value,
    ) -> Result<PersistentVolumeClaim, ReconcileError> {
        let patch = json!({
            "metadata": {"resourceVersion": claim.resource_version()},
            "status": status,
        });
        Ok(self
            .claims_api(&claim.namespace().unwrap_or_default())
            .patch_status(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?)
    }

    async fn sync(&self, key: &ObjectKey) -> Result<(), ReconcileError> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(());
        };
        if !claim_is_ours(&claim, &self.driver) {
            return Ok(());
        }
        let Some(pv_name) = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty())
        else {
            return Ok(());
        };
        let Some(mut pv) = self.volumes.get(&ObjectKey::cluster(&pv_name)) else {
            return Ok(());
        };
        let mut todo = action(&claim, &pv, &self.driver, &self.node);
        if matches!(todo, Action::Expand { .. }) {
            // The cache may not have our own PV update yet when the claim's next event comes
            // (two watches): asking the driver again would find the volume big enough and
            // answer "no node expansion needed", ending the resize before the filesystem grew.
            match self.pvs().get_opt(&pv_name).await? {
                Some(fresh) => pv = Arc::new(fresh),
                None => return Ok(()),
            }
            todo = action(&claim, &pv, &self.driver, &self.node);
        }
        match todo {
            Action::Nothing => Ok(()),
            Action::ClearPreResize => {
                let patch = json!({"metadata": {"annotations": {PRE_RESIZE_CAPACITY: null}}});
                match self
                    .pvs()
                    .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if api_code(&e) == Some(404) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            Action::Expand { from, to } => self.expand(key, &claim, &pv, from, to).await,
            Action::Finish {
                node_expansion,
                size,
            } => {
                self.finish(key, &claim, &pv_name, node_expansion, size)
                    .await
            }
        }
    }

    async fn expand(
        &self,
        key: &ObjectKey,
        claim: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        from: i64,
        to: i64,
    ) -> Result<(), ReconcileError> {
        let pv_name = pv.name_any();
        tracing::info!(claim = %key, volume = %pv_name, from, to, "resizing");
        let claim = self
            .patch_claim_status(
                claim,
                json!({
                    "conditions": conditions(claim, Some((RESIZING, String::new()))),
                    "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                }),
            )
            .await?;
        self.recorder.event(
            &claim,
            EventType::Normal,
            "Resizing",
            format!("External resizer is resizing volume {pv_name}"),
        );
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        let request = csi::ControllerExpandVolumeRequest {
            volume_id: handle,
            capacity_range: Some(csi::CapacityRange {
                required_bytes: to,
                limit_bytes: 0,
            }),
            volume_capability: Some(capability(pv)),
        };
        let mut client = self.csi.clone();
        let response =
            match tokio::time::timeout(CSI_TIMEOUT, client.controller_expand_volume(request)).await
            {
                Ok(r) => r.map(|r| r.into_inner()),
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "ControllerExpandVolume took more than {CSI_TIMEOUT:?}"
                ))),
            };
        let response = match response {
            Ok(r) => r,
            Err(status) => {
                let message = format!(
                    "resize volume {pv_name:?} by resizer {:?} failed: {}",
                    self.driver,
                    rpc_error(&status)
                );
                tracing::warn!(claim = %key, volume = %pv_name, %message, "resize failed");
                self.recorder.event(
                    &claim,
                    EventType::Warning,
                    "VolumeResizeFailed",
                    message.clone(),
                );
                let state = match infeasible(status.code()) {
                    true => "ControllerResizeInfeasible",
                    false => "ControllerResizeInProgress",
                };
                self.patch_claim_status(
                    &claim,
                    json!({
                        "conditions": conditions(&claim, Some((CONTROLLER_RESIZE_ERROR, message.clone()))),
                        "allocatedResourceStatuses": {"storage": state},
                    }),
                )
                .await?;
                return Err(ReconcileError::Retry(message));
            }
        };
        let size = response.capacity_bytes.max(to);
        // The PV first: a crash after it leaves a claim whose volume is big enough, which
        // the next sync does not expand again; the claim's state is written below.
        let mut pv_patch = json!({"spec": {"capacity": {"storage": bytes_quantity(size)}}});
        if response.node_expansion_required && annotation(pv, PRE_RESIZE_CAPACITY).is_none() {
            let before = claim
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .map(|q| q.0.clone())
                .unwrap_or_else(|| bytes_quantity(from));
            pv_patch["metadata"] = json!({"annotations": {PRE_RESIZE_CAPACITY: before}});
        }
        self.pvs()
            .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&pv_patch))
            .await?;
        self.finish(
            key,
            &claim,
            &pv_name,
            response.node_expansion_required,
            size,
        )
        .await
    }

    /// The claim's state after its volume grew to `size`: FileSystemResizePending when the
    /// node must grow the filesystem, else the new capacity.
    async fn finish(
        &self,
        key: &ObjectKey,
        claim: &PersistentVolumeClaim,
        pv_name: &str,
        node_expansion: bool,
        size: i64,
    ) -> Result<(), ReconcileError> {
        if node_expansion {
            let claim = self
                .patch_claim_status(
                    claim,
                    json!({
                        "conditions": conditions(claim, Some((FS_RESIZE_PENDING, FS_RESIZE_PENDING_MESSAGE.to_string()))),
                        "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                    }),
                )
                .await?;
            self.recorder.event(
                &claim,
                EventType::Normal,
                "FileSystemResizeRequired",
                "Require file system resize of volume on node",
            );
            tracing::info!(claim = %key, volume = %pv_name, bytes = size, "volume expanded; the node grows the filesystem");
        } else {
            let claim = self
                .patch_claim_status(
                    claim,
                    json!({
                        "capacity": {"storage": bytes_quantity(size)},
                        "conditions": conditions(claim, None),
                        "allocatedResourceStatuses": {"storage": null},
                    }),
                )
                .await?;
            self.recorder.event(
                &claim,
                EventType::Normal,
                "VolumeResizeSuccessful",
                "Resize volume succeeded",
            );
            tracing::info!(claim = %key, volume = %pv_name, bytes = size, "volume expanded");
        }
        Ok(())
    }
}

impl Reconciler for Resizer {
    type Key = ObjectKey;

    async fn reconcile(
        &self,
        key: &ObjectKey,
    ) -> Result<control_plane::runtime::Action, ReconcileError> {
        self.sync(key)
            .await
            .map(|()| control_plane::runtime::Action::AwaitChange)
    }

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        involved(&self.claims, key, &self.recorder)
    }
}

/// Runs the resizer of `cfg.node` until the returned future is dropped.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let token = CancellationToken::new();
    let queue: WorkQueue<ObjectKey> = WorkQueue::with_backoff(RETRY);
    let _stop = StopOnDrop {
        token: token.clone(),
        queue: queue.clone(),
    };
    let claims: Informer<PersistentVolumeClaim> =
        Informer::new(Api::all(cfg.client.clone()), watcher::Config::default());
    let volumes: Informer<PersistentVolume> =
        Informer::new(Api::all(cfg.client.clone()), watcher::Config::default());
    let events = EventSink::start(cfg.client.clone(), cfg.node.clone(), token.clone());
    let component: &'static str =
        Box::leak(format!("external-resizer {}", cfg.driver).into_boxed_str());
    let r = Arc::new(Resizer {
        client: cfg.client,
        csi: ControllerClient::new(cfg.csi),
        driver: cfg.driver,
        node: cfg.node,
        claims: claims.clone(),
        volumes: volumes.clone(),
        recorder: events.recorder(component),
    });

    let (q, driver) = (queue.clone(), r.driver.clone());
    claims.on_change(move |c| {
        if let Change::Deleted(_) = c {
            return;
        }
        if claim_is_ours(c.object(), &driver) {
            q.add(ObjectKey::of(c.object().as_ref()));
        }
    });
    let (q, driver, node) = (queue.clone(), r.driver.clone(), r.node.clone());
    volumes.on_change(move |c| {
        if let Change::Deleted(_) = c {
            return;
        }
        if let Some(key) = volume_claim(c.object(), &driver, &node) {
            q.add(key);
        }
    });

    let informers = async {
        tokio::join!(
            claims.clone().run(token.clone()),
            volumes.clone().run(token.clone()),
        );
    };
    let controller = Controller::new(NAME, r.clone(), queue.clone(), WORKERS, cfg.metrics);
    let workers = async {
        volumes.wait_synced().await;
        claims.wait_synced().await;
        tracing::info!(driver = %r.driver, node = %r.node, "resizer started");
        controller.run(token.clone()).await;
    };
    tokio::join!(informers, workers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "local.csi.skiff.io";

    fn claim(
        request: &str,
        capacity: &str,
        extra_ann: Option<(&str, &str)>,
    ) -> PersistentVolumeClaim {
        let mut ann = serde_json::Map::new();
        ann.insert(STORAGE_RESIZER.into(), json!(DRIVER));
        if let Some((k, v)) = extra_ann {
            ann.insert(k.into(), json!(v));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "u1", "annotations": ann},
            "spec": {"volumeName": "pvc-u1", "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity},
                "conditions": [{"type": "Other", "status": "True"}]}
        }))
        .unwrap()
    }

    fn volume(capacity: &str, node: &str, pre: Option<&str>) -> PersistentVolume {
        let ann = pre.map(|p| json!({PRE_RESIZE_CAPACITY: p}));
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-u1", "annotations": ann},
            "spec": {"capacity": {"storage": capacity}, "accessModes": ["ReadWriteOncePod"],
                "mountOptions": ["noatime"],
                "csi": {"driver": DRIVER, "volumeHandle": "pvc-u1", "fsType": "ext4"},
                "claimRef": {"namespace": "ns", "name": "data", "uid": "u1"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": crate::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn only_grown_bound_claims_of_this_driver_on_this_node_are_expanded() {
        let c = claim("128Mi", "64Mi", None);
        assert_eq!(
            action(&c, &volume("64Mi", "n1", None), DRIVER, "n1"),
            Action::Expand {
                from: 64 << 20,
                to: 128 << 20
            }
        );
        assert_eq!(
            action(&c, &volume("64Mi", "n2", None), DRIVER, "n1"),
            Action::Nothing
        );
        assert_eq!(
            action(&c, &volume("64Mi", "n1", None), "other", "n1"),
            Action::Nothing
        );
        // 128Mi == 134217728: the volume has what is asked
        assert_eq!(
            action(&c, &volume("134217728", "n1", None), DRIVER, "n1"),
            Action::Nothing
        );
        let mut pending = c.clone();
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(
            action(&pending, &volume("64Mi", "n1", None), DRIVER, "n1"),
            Action::Nothing
        );
        let mut other_uid = c.clone();
        other_uid.metadata.uid = Some("u2".into());
        assert_eq!(
            action(&other_uid, &volume("64Mi", "n1", None), DRIVER, "n1"),
            Action::Nothing
        );
        let mut unmarked = c;
        unmarked.metadata.annotations = None;
        assert_eq!(
            action(&unmarked, &volume("64Mi", "n1", None), DRIVER, "n1"),
            Action::Nothing
        );
    }

    #[test]
    fn the_pre_resize_annotation_goes_once_the_claim_reports_the_new_size() {
        let waiting = claim("128Mi", "64Mi", None);
        assert_eq!(
            action(&waiting, &volume("128Mi", "n1", Some("64Mi")), DRIVER, "n1"),
            Action::Nothing
        );
        let done = claim("128Mi", "128Mi", None);
        assert_eq!(
            action(&done, &volume("128Mi", "n1", Some("64Mi")), DRIVER, "n1"),
            Action::ClearPreResize
        );
        assert_eq!(
            action(&done, &volume("128Mi", "n1", None), DRIVER, "n1"),
            Action::Nothing
        );
    }

    #[test]
    fn a_claim_left_resizing_after_its_volume_grew_gets_the_state_that_follows() {
        let mut c = claim("128Mi", "64Mi", None);
        c.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(PersistentVolumeClaimCondition {
                type_: RESIZING.into(),
                status: "True".into(),
                ..Default::default()
            });
        assert_eq!(
            action(&c, &volume("128Mi", "n1", Some("64Mi")), DRIVER, "n1"),
            Action::Finish {
                node_expansion: true,
                size: 128 << 20
            }
        );
        assert_eq!(
            action(&c, &volume("128Mi", "n1", None), DRIVER, "n1"),
            Action::Finish {
                node_expansion: false,
                size: 128 << 20
            }
        );
        // and the conditions replaced keep the others
        let v = conditions(
            &c,
            Some((FS_RESIZE_PENDING, FS_RESIZE_PENDING_MESSAGE.into())),
        );
        let types: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Other", FS_RESIZE_PENDING]);
    }

    #[test]
    fn the_capability_comes_from_the_volume_and_resize_conditions_are_replaced() {
        use csi::volume_capability::access_mode::Mode;
        let cap = capability(&volume("64Mi", "n1", None));
        assert_eq!(
            cap.access_mode.unwrap().mode,
            Mode::SingleNodeSingleWriter as i32
        );
        match cap.access_type {
            Some(csi::volume_capability::AccessType::Mount(m)) => {
                assert_eq!(
                    (m.fs_type.as_str(), m.mount_flags),
                    ("ext4", vec!["noatime".to_string()])
                );
            }
            other => panic!("not a mount: {other:?}"),
        }
        let c = claim("128Mi", "64Mi", None);
        let v = conditions(
            &c,
            Some((FS_RESIZE_PENDING, FS_RESIZE_PENDING_MESSAGE.into())),
        );
        let types: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Other", FS_RESIZE_PENDING]);
        assert_eq!(v[1]["message"], FS_RESIZE_PENDING_MESSAGE);
        assert_eq!(v[1]["status"], "True");
        assert!(v[1]["lastTransitionTime"].is_string());
        assert_eq!(conditions(&c, None).as_array().unwrap().len(), 1);
        assert!(infeasible(tonic::Code::OutOfRange));
        assert!(!infeasible(tonic::Code::ResourceExhausted));
    }
}
