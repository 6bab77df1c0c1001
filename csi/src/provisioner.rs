//! The provisioner: external-provisioner's `--node-deployment` mode, run by the node plugin
//! of every node. It watches claims, volumes and classes (shared informers over kube-runtime's
//! watcher), and
//! - provisions a claim that the PV binder handed to this driver
//!   (`volume.kubernetes.io/storage-provisioner`) and that was placed on this node
//!   (`volume.kubernetes.io/selected-node`: by the scheduler for WaitForFirstConsumer
//!   classes, by [`crate::placement`] for Immediate ones): CreateVolume on this node's own
//!   Controller service, then a PersistentVolume pre-bound to the claim, pinned to the node;
//! - deletes the volume of a Released PersistentVolume of this driver on this node whose
//!   reclaim policy is Delete: DeleteVolume, then its finalizer and the object go.
//!
//! Every node's provisioner sees every claim, but only claims placed on its node (and
//! volumes pinned to it) are ever queued: the per-event cost is a few annotation lookups, and
//! nothing is relisted per event. The work (a claim or a volume) is reconciled by the control
//! plane's controller runtime (`control_plane::runtime::Controller`, controller name
//! `provisioner`): failures are retried per object with exponential back-off (1 s doubling to
//! 5 min); final CreateVolume errors instead give the claim back to the scheduler by removing
//! its selected-node annotation, as external-provisioner does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use control_plane::machinery::quantity::Format;
use control_plane::machinery::Quantity;
use control_plane::runtime::controller::{api_code, involved};
use control_plane::runtime::queue::Backoff;
use control_plane::runtime::{
    Action, Change, Controller, EventSink, EventType, Informer, ObjectKey, ReconcileError,
    Reconciler, Recorder, WorkQueue,
};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::proto::csi::v1 as csi;
use crate::runtime::StopOnDrop;
use csi::controller_client::ControllerClient;

/// Set by the scheduler (or [`crate::placement`]) on a claim: the node to provision on.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set by the PV binder on a claim that needs dynamic provisioning: the provisioner's name.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The legacy spelling of [`STORAGE_PROVISIONER`], still set by binders.
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// On the PVs a provisioner creates: which one (only it deletes them).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On the PVs a provisioner creates: kept until the storage behind them is deleted.
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The topology key of this driver's volumes (value: the node name).
pub use crate::TOPOLOGY_KEY;

/// The class parameter naming the filesystem (external-provisioner's reserved prefix).
const FSTYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// Class parameters under this prefix are for the provisioner, never passed to the driver.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";
const DEFAULT_FSTYPE: &str = "ext4";

/// Retries of one object: 1 s doubling up to 5 min (external-provisioner's defaults).
const RETRY: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(300),
};
/// How many objects are worked on at once.
const WORKERS: usize = 4;
/// The controller's name in the runtime's metrics and logs.
const NAME: &str = "provisioner";
/// A CSI call that takes longer is abandoned and retried (the calls are idempotent).
const CSI_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a PV create that failed after CreateVolume is tried again within one attempt.
const PV_CREATE_TRIES: u32 = 5;

/// What the provisioner of one node needs.
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

/// The counters external-provisioner's controller library exports (by class).
struct Counters {
    provisioned: Family<Vec<(String, String)>, Counter>,
    provision_failed: Family<Vec<(String, String)>, Counter>,
    deleted: Family<Vec<(String, String)>, Counter>,
    delete_failed: Family<Vec<(String, String)>, Counter>,
}

static COUNTERS: LazyLock<Counters> = LazyLock::new(|| Counters {
    provisioned: Family::default(),
    provision_failed: Family::default(),
    deleted: Family::default(),
    delete_failed: Family::default(),
});

fn class_label(class: &str) -> Vec<(String, String)> {
    vec![("class".to_string(), class.to_string())]
}

/// Registers the provisioner's counters (`controller_persistentvolumeclaim_provision_total`,
/// `..._provision_failed_total`, `controller_persistentvolume_delete_total`,
/// `..._delete_failed_total`, labelled by class) in the registry the binary serves.
pub fn register_metrics(registry: &mut Registry) {
    let c = &*COUNTERS;
    registry.register(
        "controller_persistentvolumeclaim_provision",
        "Volumes provisioned for claims",
        c.provisioned.clone(),
    );
    registry.register(
        "controller_persistentvolumeclaim_provision_failed",
        "Provisioning attempts that failed",
        c.provision_failed.clone(),
    );
    registry.register(
        "controller_persistentvolume_delete",
        "Provisioned volumes deleted",
        c.deleted.clone(),
    );
    registry.register(
        "controller_persistentvolume_delete_failed",
        "Volume deletions that failed",
        c.delete_failed.clone(),
    );
}

/// One unit of work: a claim to provision or a volume to reclaim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Work {
    Claim(ObjectKey),
    Volume(String),
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Work::Claim(k) => write!(f, "claim {}/{}", k.namespace_or_empty(), k.name),
            Work::Volume(n) => write!(f, "volume {n}"),
        }
    }
}

/// A volume the driver created whose PV is not written yet: deleted again if its claim goes.
struct Created {
    claim_uid: String,
    volume_id: String,
}

/// Whether `claim` is still the claim with `uid` and not being deleted (a claim that goes
/// never gets the volume made for it).
fn still_there(claim: &PersistentVolumeClaim, uid: &str) -> bool {
    claim.uid().as_deref() == Some(uid) && claim.meta().deletion_timestamp.is_none()
}

struct Provisioner {
    client: kube::Client,
    csi: ControllerClient<Channel>,
    driver: String,
    node: String,
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    classes: Informer<StorageClass>,
    recorder: Recorder,
    /// Volumes created for claims whose PV could not be written yet, by claim.
    created: Mutex<HashMap<ObjectKey, Created>>,
    /// Uids of volumes whose storage DeleteVolume removed, until the object is gone.
    reclaimed: Arc<Mutex<HashSet<String>>>,
}

/// The annotation `key` of `o`, if set.
fn annotation<'a, K: Resource>(o: &'a K, key: &str) -> Option<&'a str> {
    o.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The provisioner the binder named for a claim (current or legacy annotation).
fn claim_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, STORAGE_PROVISIONER).or_else(|| annotation(claim, BETA_STORAGE_PROVISIONER))
}

/// Whether `claim` waits for this driver to provision it on `node`.
fn claim_is_ours(claim: &PersistentVolumeClaim, driver: &str, node: &str) -> bool {
    claim.meta().deletion_timestamp.is_none()
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
        && claim_provisioner(claim) == Some(driver)
        && annotation(claim, SELECTED_NODE) == Some(node)
}

/// The node a volume is pinned to: the value of [`TOPOLOGY_KEY`] in its required node
/// affinity (`In` with one value, as this provisioner writes it).
pub fn volume_node(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|e| e.key == TOPOLOGY_KEY && e.operator == "In")
        .and_then(|e| e.values.as_ref()?.first())
        .map(String::as_str)
}

fn phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn reclaim_policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

fn has_finalizer<K: Resource>(o: &K) -> bool {
    o.finalizers().iter().any(|f| f == FINALIZER)
}

/// What the provisioner of a node has to do with a volume.
#[derive(Debug, PartialEq, Eq)]
enum Reclaim {
    Nothing,
    /// DeleteVolume, then the finalizer and the object.
    Delete,
    /// Only the finalizer: the object is being deleted and its data stays.
    Release,
}

fn reclaim_action(pv: &PersistentVolume, driver: &str, node: &str) -> Reclaim {
    if annotation(pv, PROVISIONED_BY) != Some(driver) || volume_node(pv) != Some(node) {
        return Reclaim::Nothing;
    }
    let deleting = pv.meta().deletion_timestamp.is_some();
    match (reclaim_policy(pv), phase(pv)) {
        ("Delete", "Released") if !deleting || has_finalizer(pv) => Reclaim::Delete,
        // Deleted by hand before it was ever bound: its storage goes with it.
        ("Delete", "Available" | "Pending" | "Failed") if deleting && has_finalizer(pv) => {
            Reclaim::Delete
        }
        ("Retain", "Released" | "Available") if deleting && has_finalizer(pv) => Reclaim::Release,
        _ => Reclaim::Nothing,
    }
}

/// A byte count as a quantity in Kubernetes' binary form (`1Gi`, `1536Mi`, `1000`).
pub fn bytes_quantity(bytes: i64) -> String {
    Quantity::from_value(bytes, Format::BinarySI).to_string()
}

/// Bytes of a quantity (rounded up); None when it does not parse or is negative.
pub fn quantity_bytes(q: &str) -> Option<i64> {
    Quantity::parse(q)
        .ok()
        .map(|q| q.value())
        .filter(|v| *v >= 0)
}

/// The request and limit of a claim's storage, in bytes.
fn claim_size(claim: &PersistentVolumeClaim) -> Result<(i64, i64), String> {
    let resources = claim.spec.as_ref().and_then(|s| s.resources.as_ref());
    let get = |m: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get("storage")).map(|q| q.0.clone()) };
    let request = match get(resources.and_then(|r| r.requests.as_ref())) {
        None => return Err("claim requests no storage".into()),
        Some(q) => quantity_bytes(&q).ok_or_else(|| format!("invalid storage request {q:?}"))?,
    };
    let limit = match get(resources.and_then(|r| r.limits.as_ref())) {
        None => 0,
        Some(q) => quantity_bytes(&q).ok_or_else(|| format!("invalid storage limit {q:?}"))?,
    };
    Ok((request, limit))
}

/// The CSI access mode of a Kubernetes access mode.
fn access_mode(mode: &str) -> Option<csi::volume_capability::access_mode::Mode> {
    use csi::volume_capability::access_mode::Mode;
    Some(match mode {
        "ReadWriteOnce" => Mode::SingleNodeWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        _ => return None,
    })
}

/// The filesystem a class asks for (ext4 unless its parameters say).
fn fs_type(class: &StorageClass) -> String {
    class
        .parameters
        .as_ref()
        .and_then(|p| p.get(FSTYPE_PARAMETER))
        .filter(|f| !f.is_empty())
        .cloned()
        .unwrap_or_else(|| DEFAULT_FSTYPE.to_string())
}

fn topology(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_string(), node.to_string())]),
    }
}

/// CreateVolume for `claim` of `class` on `node`; Err names what is wrong with the claim.
fn create_request(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
) -> Result<csi::CreateVolumeRequest, String> {
    let (request, limit) = claim_size(claim)?;
    let modes = claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    if modes.is_empty() {
        return Err("claim has no access modes".into());
    }
    let fs_type = fs_type(class);
    let mount_flags = class.mount_options.clone().unwrap_or_default();
    let mut capabilities = Vec::new();
    for m in &modes {
        let mode = access_mode(m).ok_or_else(|| format!("unsupported access mode {m:?}"))?;
        capabilities.push(csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume {
                    fs_type: fs_type.clone(),
                    mount_flags: mount_flags.clone(),
                    ..Default::default()
                },
            )),
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        });
    }
    let parameters = class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(csi::CreateVolumeRequest {
        name: format!("pvc-{}", claim.uid().unwrap_or_default()),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: request,
            limit_bytes: limit,
        }),
        volume_capabilities: capabilities,
        parameters,
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![topology(node)],
            preferred: vec![topology(node)],
        }),
    })
}

/// The PersistentVolume for `volume`, created for `claim` of `class` on `node`.
fn build_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    volume: &csi::Volume,
    driver: &str,
    node: &str,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    // Each returned segment is one way to reach the volume (terms are ORed, a segment's keys
    // ANDed); a driver that returns none still made the volume on the node it was asked for.
    let mut segments: Vec<BTreeMap<String, String>> = volume
        .accessible_topology
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            t.segments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect();
    if segments.is_empty() {
        segments.push(BTreeMap::from([(
            TOPOLOGY_KEY.to_string(),
            node.to_string(),
        )]));
    }
    let terms = segments
        .into_iter()
        .map(|s| NodeSelectorTerm {
            match_expressions: Some(
                s.into_iter()
                    .map(|(key, value)| NodeSelectorRequirement {
                        key,
                        operator: "In".into(),
                        values: Some(vec![value]),
                    })
                    .collect(),
            ),
            ..Default::default()
        })
        .collect();
    let attributes: BTreeMap<String, String> = volume
        .volume_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pvc-{}", claim.uid().unwrap_or_default())),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY.to_string(),
                driver.to_string(),
            )])),
            finalizers: Some(vec![FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(bytes_quantity(
                    volume.capacity_bytes,
                )),
            )])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: claim.uid(),
                ..Default::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.to_string(),
                volume_handle: volume.volume_id.clone(),
                fs_type: Some(fs_type(class)),
                volume_attributes: (!attributes.is_empty()).then_some(attributes),
                ..Default::default()
            }),
            mount_options: class.mount_options.clone(),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
            }),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            storage_class_name: spec.storage_class_name.clone(),
            volume_mode: Some(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
            ..Default::default()
        }),
        status: None,
    }
}

/// Errors after which retrying the same request on the same node cannot help: the claim goes
/// back to the scheduler (external-provisioner's final errors).
fn is_final(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        InvalidArgument
            | ResourceExhausted
            | OutOfRange
            | FailedPrecondition
            | NotFound
            | AlreadyExists
            | Unimplemented
    )
}

/// A gRPC status as Go's grpc prints it (what Kubernetes' Events show).
fn rpc_error(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

fn class_name(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

impl Provisioner {
    fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn claims_api(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn sync(&self, work: &Work) -> Result<(), ReconcileError> {
        match work {
            Work::Claim(key) => self.sync_claim(key).await,
            Work::Volume(name) => self.sync_volume(name).await,
        }
    }

    /// Provisions the claim `key` if it is ours and has no volume yet.
    async fn sync_claim(&self, key: &ObjectKey) -> Result<(), ReconcileError> {
        let claim = self.claims.get(key);
        self.delete_orphan(key, claim.as_deref()).await?;
        let Some(claim) = claim else {
            return Ok(());
        };
        if !claim_is_ours(&claim, &self.driver, &self.node) {
            return Ok(());
        }
        let pv_name = format!("pvc-{}", claim.uid().unwrap_or_default());
        // Done before (the cache, then the API: our own create may not be back yet).
        if self.volumes.get(&ObjectKey::cluster(&pv_name)).is_some()
            || self.pvs().get_opt(&pv_name).await?.is_some()
        {
            return Ok(());
        }
        let class_name = class_name(&claim).to_string();
        let Some(class) = self.classes.get(&ObjectKey::cluster(&class_name)) else {
            let message = format!(
                "failed to provision volume with StorageClass {class_name:?}: storageclass.storage.k8s.io {class_name:?} not found"
            );
            self.failed(&claim, &class_name, message.clone());
            return Err(ReconcileError::Retry(message));
        };
        if class.provisioner != self.driver {
            // Another provisioner's class: not ours to act on (as external-provisioner).
            return Ok(());
        }
        let block = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        let request = if block {
            Err(format!(
                "{} supports filesystem volumes only, not volumeMode Block",
                self.driver
            ))
        } else {
            create_request(&claim, &class, &self.node)
        };
        let request = match request {
            Ok(r) => r,
            Err(why) => {
                self.failed(
                    &claim,
                    &class_name,
                    format!("failed to provision volume with StorageClass {class_name:?}: {why}"),
                );
                return self.unselect(&claim).await;
            }
        };
        self.recorder.event(
            claim.as_ref(),
            EventType::Normal,
            "Provisioning",
            format!(
                "External provisioner is provisioning volume for claim \"{}/{}\"",
                key.namespace_or_empty(),
                key.name
            ),
        );
        tracing::info!(claim = %Work::Claim(key.clone()), volume = %request.name, "provisioning");
        let mut csi = self.csi.clone();
        let response = match tokio::time::timeout(CSI_TIMEOUT, csi.create_volume(request)).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "CreateVolume took more than {CSI_TIMEOUT:?}"
            ))),
        };
        let volume = match response.map(|r| r.into_inner().volume) {
            Ok(Some(v)) => v,
            Ok(None) => {
                let message = format!(
                    "failed to provision volume with StorageClass {class_name:?}: CreateVolume returned no volume"
                );
                self.failed(&claim, &class_name, message.clone());
                return Err(ReconcileError::Retry(message));
            }
            Err(status) => {
                let message = format!(
                    "failed to provision volume with StorageClass {class_name:?}: {}",
                    rpc_error(&status)
                );
                self.failed(&claim, &class_name, message.clone());
                if is_final(status.code()) {
                    return self.unselect(&claim).await;
                }
                return Err(ReconcileError::Retry(message));
            }
        };
        let pv = build_volume(&claim, &class, &volume, &self.driver, &self.node);
        self.lock_created().insert(
            key.clone(),
            Created {
                claim_uid: claim.uid().unwrap_or_default(),
                volume_id: volume.volume_id.clone(),
            },
        );
        self.write_volume(key, &claim, &class_name, pv).await
    }

    fn lock_created(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Created>> {
        lock(&self.created)
    }

    /// Creates the PV of a volume the driver made, retrying a few times; a claim that went
    /// meanwhile gets its volume deleted again.
    async fn write_volume(
        &self,
        key: &ObjectKey,
        claim: &PersistentVolumeClaim,
        class_name: &str,
        pv: PersistentVolume,
    ) -> Result<(), ReconcileError> {
        let pv_name = pv.name_any();
        let mut delay = Duration::from_millis(100);
        for attempt in 0..PV_CREATE_TRIES {
            let error = match self.pvs().create(&PostParams::default(), &pv).await {
                // 409: written by an earlier attempt whose answer was lost.
                Ok(_) => break,
                Err(e) if api_code(&e) == Some(409) => break,
                Err(e) => e.to_string(),
            };
            tracing::warn!(volume = %pv_name, attempt, %error, "creating the PersistentVolume failed");
            let current = self
                .claims_api(key.namespace_or_empty())
                .get_opt(&key.name)
                .await;
            if let Ok(current) = current {
                let uid = claim.uid().unwrap_or_default();
                if !current.as_ref().is_some_and(|c| still_there(c, &uid)) {
                    return self.delete_orphan(key, current.as_ref()).await;
                }
            }
            if attempt + 1 == PV_CREATE_TRIES {
                let message = format!(
                    "failed to create PersistentVolume {pv_name} for claim \"{}/{}\": {error}",
                    key.namespace_or_empty(),
                    key.name
                );
                self.failed(claim, class_name, message.clone());
                return Err(ReconcileError::Retry(message));
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        self.lock_created().remove(key);
        COUNTERS
            .provisioned
            .get_or_create(&class_label(class_name))
            .inc();
        self.recorder.event(
            claim,
            EventType::Normal,
            "ProvisioningSucceeded",
            format!("Successfully provisioned volume {pv_name}"),
        );
        tracing::info!(claim = %Work::Claim(key.clone()), volume = %pv_name, "provisioned");
        Ok(())
    }

    /// Deletes the volume created for the claim `key` whose PV was never written, once that
    /// claim is gone (or replaced by another of the same name).
    async fn delete_orphan(
        &self,
        key: &ObjectKey,
        claim: Option<&PersistentVolumeClaim>,
    ) -> Result<(), ReconcileError> {
        let volume_id = {
            let created = self.lock_created();
            match created.get(key) {
                Some(c) if !claim.is_some_and(|claim| still_there(claim, &c.claim_uid)) => {
                    c.volume_id.clone()
                }
                _ => return Ok(()),
            }
        };
        tracing::info!(claim = %Work::Claim(key.clone()), volume = %volume_id, "claim gone before its PersistentVolume was written: deleting the volume");
        self.delete_volume(&volume_id)
            .await
            .map_err(|s| ReconcileError::Retry(rpc_error(&s)))?;
        self.lock_created().remove(key);
        Ok(())
    }

    /// DeleteVolume; a volume the driver does not know is deleted already.
    async fn delete_volume(&self, volume_id: &str) -> Result<(), tonic::Status> {
        let mut csi = self.csi.clone();
        let request = csi::DeleteVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        match tokio::time::timeout(CSI_TIMEOUT, csi.delete_volume(request)).await {
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "DeleteVolume took more than {CSI_TIMEOUT:?}"
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => Ok(()),
            Ok(Err(s)) => Err(s),
        }
    }

    /// Warning ProvisioningFailed on the claim, counted.
    fn failed(&self, claim: &PersistentVolumeClaim, class_name: &str, message: String) {
        tracing::warn!(claim = %claim.name_any(), namespace = %claim.namespace().unwrap_or_default(), %message, "provisioning failed");
        COUNTERS
            .provision_failed
            .get_or_create(&class_label(class_name))
            .inc();
        self.recorder
            .event(claim, EventType::Warning, "ProvisioningFailed", message);
    }

    /// Gives a claim back to the scheduler: removes its selected-node annotation.
    async fn unselect(&self, claim: &PersistentVolumeClaim) -> Result<(), ReconcileError> {
        let patch = json!({"metadata": {"annotations": {SELECTED_NODE: null}}});
        match self
            .claims_api(&claim.namespace().unwrap_or_default())
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reclaims the volume `name` if it is ours and released.
    async fn sync_volume(&self, name: &str) -> Result<(), ReconcileError> {
        let Some(pv) = self.volumes.get(&ObjectKey::cluster(name)) else {
            return Ok(());
        };
        let class = pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        match reclaim_action(&pv, &self.driver, &self.node) {
            Reclaim::Nothing => Ok(()),
            Reclaim::Release => self.remove_finalizer(&pv).await,
            Reclaim::Delete => {
                let handle = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|c| c.volume_handle.clone())
                    .unwrap_or_default();
                let uid = pv.uid().unwrap_or_default();
                // A later event of the same volume (our own finalizer patch, the deletion)
                // finishes the object's part without deleting the storage twice.
                let done = lock(&self.reclaimed).contains(&uid);
                if !done {
                    if let Err(status) = self.delete_volume(&handle).await {
                        let message = rpc_error(&status);
                        COUNTERS
                            .delete_failed
                            .get_or_create(&class_label(&class))
                            .inc();
                        tracing::warn!(volume = %name, %message, "deleting the volume failed");
                        self.recorder.event(
                            pv.as_ref(),
                            EventType::Warning,
                            "VolumeFailedDelete",
                            message.clone(),
                        );
                        return Err(ReconcileError::Retry(message));
                    }
                    lock(&self.reclaimed).insert(uid);
                    COUNTERS.deleted.get_or_create(&class_label(&class)).inc();
                    tracing::info!(volume = %name, handle = %handle, "volume deleted");
                }
                self.remove_finalizer(&pv).await?;
                if pv.meta().deletion_timestamp.is_none() {
                    match self.pvs().delete(name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if api_code(&e) == Some(404) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            }
        }
    }

    /// Takes [`FINALIZER`] out of `pv`'s finalizers (conditional on the version read: a
    /// finalizer added meanwhile is never dropped; a conflict is retried).
    async fn remove_finalizer(&self, pv: &PersistentVolume) -> Result<(), ReconcileError> {
        if !has_finalizer(pv) {
            return Ok(());
        }
        let kept: Vec<&String> = pv.finalizers().iter().filter(|f| *f != FINALIZER).collect();
        let patch =
            json!({"metadata": {"finalizers": kept, "resourceVersion": pv.resource_version()}});
        match self
            .pvs()
            .patch(
                &pv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Reconciler for Provisioner {
    type Key = Work;

    async fn reconcile(&self, work: &Work) -> Result<Action, ReconcileError> {
        self.sync(work).await.map(|()| Action::AwaitChange)
    }

    fn involved_object(&self, work: &Work) -> Option<(Recorder, ObjectReference)> {
        match work {
            Work::Claim(key) => involved(&self.claims, key, &self.recorder),
            Work::Volume(name) => {
                involved(&self.volumes, &ObjectKey::cluster(name), &self.recorder)
            }
        }
    }
}

/// Runs the provisioner of `cfg.node` until the returned future is dropped.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let token = CancellationToken::new();
    let queue: WorkQueue<Work> = WorkQueue::with_backoff(RETRY);
    let _stop = StopOnDrop {
        token: token.clone(),
        queue: queue.clone(),
    };
    let claims: Informer<PersistentVolumeClaim> =
        Informer::new(Api::all(cfg.client.clone()), watcher::Config::default());
    let volumes: Informer<PersistentVolume> =
        Informer::new(Api::all(cfg.client.clone()), watcher::Config::default());
    let classes: Informer<StorageClass> =
        Informer::new(Api::all(cfg.client.clone()), watcher::Config::default());
    let events = EventSink::start(cfg.client.clone(), cfg.node.clone(), token.clone());
    // One component name per process: the driver and the node, as external-provisioner
    // names itself in node-deployment mode.
    let component: &'static str =
        Box::leak(format!("{}_{}", cfg.driver, cfg.node).into_boxed_str());
    let p = Arc::new(Provisioner {
        client: cfg.client,
        csi: ControllerClient::new(cfg.csi),
        driver: cfg.driver,
        node: cfg.node,
        claims: claims.clone(),
        volumes: volumes.clone(),
        classes: classes.clone(),
        recorder: events.recorder(component),
        created: Mutex::new(HashMap::new()),
        reclaimed: Arc::default(),
    });

    let (q, driver, node) = (queue.clone(), p.driver.clone(), p.node.clone());
    claims.on_change(move |c| {
        let claim = c.object();
        let ours = |c: &PersistentVolumeClaim| claim_is_ours(c, &driver, &node);
        let relevant = match c {
            Change::Added(c) => ours(c),
            // Also when it stops being ours: an orphaned volume may wait for that.
            Change::Updated { old, new } => ours(new) || ours(old),
            Change::Deleted(c) => ours(c),
        };
        if relevant {
            q.add(Work::Claim(ObjectKey::of(claim.as_ref())));
        }
    });
    let (q, driver, node) = (queue.clone(), p.driver.clone(), p.node.clone());
    let reclaimed = p.reclaimed.clone();
    volumes.on_change(move |c| {
        if let Change::Deleted(pv) = c {
            lock(&reclaimed).remove(&pv.uid().unwrap_or_default());
            return;
        }
        if reclaim_action(c.object(), &driver, &node) != Reclaim::Nothing {
            q.add(Work::Volume(c.object().name_any()));
        }
    });

    let informers = async {
        tokio::join!(
            claims.clone().run(token.clone()),
            volumes.clone().run(token.clone()),
            classes.clone().run(token.clone()),
        );
    };
    let controller = Controller::new(NAME, p.clone(), queue.clone(), WORKERS, cfg.metrics);
    let workers = async {
        // Classes and volumes first: a claim is only judged against both.
        classes.wait_synced().await;
        volumes.wait_synced().await;
        claims.wait_synced().await;
        tracing::info!(driver = %p.driver, node = %p.node, "provisioner started");
        controller.run(token.clone()).await;
    };
    tokio::join!(informers, workers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::access_mode::Mode;

    const DRIVER: &str = "local.csi.skiff.io";

    /// A JSON merge patch (RFC 7386) of `patch` onto `doc`.
    fn merge(doc: &mut serde_json::Value, patch: &serde_json::Value) {
        match (doc.as_object_mut(), patch.as_object()) {
            (Some(d), Some(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        d.remove(k);
                    } else {
                        merge(d.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            _ => *doc = patch.clone(),
        }
    }

    fn claim(extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut v = json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "1234",
                "annotations": {STORAGE_PROVISIONER: DRIVER, SELECTED_NODE: "n1"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                "resources": {"requests": {"storage": "1Gi"}}}
        });
        merge(&mut v, &extra);
        serde_json::from_value(v).unwrap()
    }

    fn class() -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "fast"},
            "provisioner": DRIVER,
            "reclaimPolicy": "Retain",
            "mountOptions": ["noatime"],
            "parameters": {"csi.storage.k8s.io/fstype": "ext4", "tier": "gold",
                "csi.storage.k8s.io/provisioner-secret-name": "s"}
        }))
        .unwrap()
    }

    fn volume(extra: serde_json::Value) -> PersistentVolume {
        let mut v = json!({
            "metadata": {"name": "pvc-1234", "annotations": {PROVISIONED_BY: DRIVER},
                "finalizers": ["kubernetes.io/pv-protection", FINALIZER]},
            "spec": {"persistentVolumeReclaimPolicy": "Delete",
                "capacity": {"storage": "1Gi"},
                "csi": {"driver": DRIVER, "volumeHandle": "pvc-1234"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}]}]}}},
            "status": {"phase": "Released"}
        });
        merge(&mut v, &extra);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_unbound_claims_handed_to_this_driver_on_this_node_are_ours() {
        assert!(claim_is_ours(&claim(json!({})), DRIVER, "n1"));
        assert!(!claim_is_ours(&claim(json!({})), DRIVER, "n2"));
        assert!(!claim_is_ours(&claim(json!({})), "other.csi", "n1"));
        let beta = claim(json!({"metadata": {"annotations": {
            STORAGE_PROVISIONER: null, BETA_STORAGE_PROVISIONER: DRIVER}}}));
        assert!(claim_is_ours(&beta, DRIVER, "n1"));
        let unhanded = claim(json!({"metadata": {"annotations": {STORAGE_PROVISIONER: null}}}));
        assert!(!claim_is_ours(&unhanded, DRIVER, "n1"));
        let bound = claim(json!({"spec": {"volumeName": "pv-1"}}));
        assert!(!claim_is_ours(&bound, DRIVER, "n1"));
        let deleting = claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert!(!claim_is_ours(&deleting, DRIVER, "n1"));
    }

    #[test]
    fn the_request_carries_size_modes_filesystem_parameters_and_the_node() {
        let c = claim(json!({"spec": {
            "accessModes": ["ReadWriteOncePod"],
            "resources": {"requests": {"storage": "1536Mi"}, "limits": {"storage": "2Gi"}}}}));
        let r = create_request(&c, &class(), "n1").unwrap();
        assert_eq!(r.name, "pvc-1234");
        let range = r.capacity_range.unwrap();
        assert_eq!(range.required_bytes, 1536 << 20);
        assert_eq!(range.limit_bytes, 2 << 30);
        assert_eq!(r.volume_capabilities.len(), 1);
        let cap = &r.volume_capabilities[0];
        assert_eq!(
            cap.access_mode.as_ref().unwrap().mode,
            Mode::SingleNodeSingleWriter as i32
        );
        match &cap.access_type {
            Some(csi::volume_capability::AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "ext4");
                assert_eq!(m.mount_flags, ["noatime"]);
            }
            other => panic!("not a mount: {other:?}"),
        }
        assert_eq!(
            r.parameters,
            HashMap::from([("tier".to_string(), "gold".to_string())])
        );
        let want = vec![topology("n1")];
        let topo = r.accessibility_requirements.unwrap();
        assert_eq!((topo.requisite, topo.preferred), (want.clone(), want));
    }

    #[test]
    fn every_access_mode_maps_and_a_claim_without_size_is_refused() {
        let modes = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"];
        let c = claim(json!({"spec": {"accessModes": modes}}));
        let r = create_request(&c, &class(), "n1").unwrap();
        let got: Vec<i32> = r
            .volume_capabilities
            .iter()
            .map(|c| c.access_mode.as_ref().unwrap().mode)
            .collect();
        let want = [
            Mode::SingleNodeWriter,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeMultiWriter,
        ];
        assert_eq!(got, want.map(|m| m as i32));
        assert_eq!(r.capacity_range.unwrap().limit_bytes, 0);
        let no_size = claim(json!({"spec": {"resources": null}}));
        assert!(create_request(&no_size, &class(), "n1").is_err());
        let mut xfs = class();
        xfs.parameters
            .as_mut()
            .unwrap()
            .insert(FSTYPE_PARAMETER.into(), "xfs".into());
        assert_eq!(fs_type(&xfs), "xfs");
        xfs.parameters = None;
        assert_eq!(fs_type(&xfs), "ext4");
    }

    #[test]
    fn the_volume_is_pre_bound_pinned_and_finalized() {
        let c = claim(json!({}));
        let v = csi::Volume {
            capacity_bytes: 1 << 30,
            volume_id: "pvc-1234".into(),
            volume_context: HashMap::from([("k".to_string(), "v".to_string())]),
            accessible_topology: vec![topology("n1")],
        };
        let pv = build_volume(&c, &class(), &v, DRIVER, "n1");
        assert_eq!(pv.name_any(), "pvc-1234");
        assert_eq!(annotation(&pv, PROVISIONED_BY), Some(DRIVER));
        assert_eq!(pv.finalizers(), [FINALIZER]);
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.mount_options.as_deref(),
            Some(&["noatime".to_string()][..])
        );
        let r = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (
                Some("PersistentVolumeClaim"),
                Some("ns"),
                Some("data"),
                Some("1234")
            )
        );
        let s = spec.csi.as_ref().unwrap();
        assert_eq!(
            (s.driver.as_str(), s.volume_handle.as_str()),
            (DRIVER, "pvc-1234")
        );
        assert_eq!(s.fs_type.as_deref(), Some("ext4"));
        assert_eq!(s.volume_attributes.as_ref().unwrap()["k"], "v");
        assert_eq!(volume_node(&pv), Some("n1"));
        // A driver that names no topology: the node it was asked for.
        let bare = csi::Volume {
            accessible_topology: vec![],
            ..v
        };
        assert_eq!(
            volume_node(&build_volume(&c, &class(), &bare, DRIVER, "n2")),
            Some("n2")
        );
    }

    #[test]
    fn released_volumes_of_this_node_are_deleted_retained_ones_only_released() {
        assert_eq!(
            reclaim_action(&volume(json!({})), DRIVER, "n1"),
            Reclaim::Delete
        );
        assert_eq!(
            reclaim_action(&volume(json!({})), DRIVER, "n2"),
            Reclaim::Nothing
        );
        assert_eq!(
            reclaim_action(&volume(json!({})), "other.csi", "n1"),
            Reclaim::Nothing
        );
        let bound = volume(json!({"status": {"phase": "Bound"}}));
        assert_eq!(reclaim_action(&bound, DRIVER, "n1"), Reclaim::Nothing);
        let retain = volume(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}));
        assert_eq!(reclaim_action(&retain, DRIVER, "n1"), Reclaim::Nothing);
        let retain_deleted = volume(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"},
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert_eq!(
            reclaim_action(&retain_deleted, DRIVER, "n1"),
            Reclaim::Release
        );
        let available_deleted = volume(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Available"}}),
        );
        assert_eq!(
            reclaim_action(&available_deleted, DRIVER, "n1"),
            Reclaim::Delete
        );
        // Being deleted without our finalizer any more: done.
        let done = volume(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["kubernetes.io/pv-protection"]}}),
        );
        assert_eq!(reclaim_action(&done, DRIVER, "n1"), Reclaim::Nothing);
    }

    #[test]
    fn final_codes_and_go_style_messages() {
        assert!(is_final(tonic::Code::ResourceExhausted));
        assert!(is_final(tonic::Code::InvalidArgument));
        assert!(!is_final(tonic::Code::Unavailable));
        assert!(!is_final(tonic::Code::DeadlineExceeded));
        assert!(!is_final(tonic::Code::Internal));
        let s = tonic::Status::resource_exhausted("no room");
        assert_eq!(
            rpc_error(&s),
            "rpc error: code = ResourceExhausted desc = no room"
        );
        assert_eq!(bytes_quantity(1 << 30), "1Gi");
        assert_eq!(bytes_quantity(1536 << 20), "1536Mi");
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("x"), None);
    }
}
