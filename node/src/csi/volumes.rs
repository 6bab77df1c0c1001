//! The CSI volumes of the node's pods: NodeStageVolume once per volume on the node (when the
//! driver stages), NodePublishVolume per pod, and their inverses when the pod goes (the
//! volume is unstaged when no pod on the node publishes it any more). One operation is in
//! flight per volume handle.
//!
//! What is published is kept in a table and on disk, as the kubelet keeps it: a
//! `vol_data.json` beside each publish target (`<root>/pods/<uid>/volumes/kubernetes.io~csi/
//! <pv>/mount`) and each staging target (`<root>/plugins/kubernetes.io/csi/<driver>/<sha256
//! of the handle>/globalmount`). After a restart the table is rebuilt from those files and
//! the mount table: nothing of a running pod is unmounted (stage and publish are idempotent,
//! and a volume already published is not published again); volumes of pods deleted while the
//! agent was down are unpublished and unstaged once the pods are listed ([`CsiVolumes::orphans`]).
//!
//! A volume whose driver must attach it (CSIDriver `attachRequired`, or no CSIDriver) is
//! staged only once its VolumeAttachment for this node says attached (the attach/detach
//! controller creates it, the driver's attacher attaches); its attachmentMetadata is the
//! publish_context of NodeStageVolume and NodePublishVolume. The volumes staged or published
//! here are the Node's `status.volumesInUse`, which the controller waits on to detach.
//!
//! NodeGetVolumeStats runs on its own timer for every published volume and feeds the
//! kubelet's `kubelet_volume_stats_*` metrics, labelled by namespace and claim.

use super::expand::{resize_target, ExpandApi, PodOf, RESIZE_FAILED, RESIZE_SUCCESSFUL};
use super::{driver_not_found, kubelet_form, mountinfo, Driver, Drivers};
use crate::layout::Layout;
use crate::metrics::Metrics;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use skiff_csi::proto::csi::v1 as csi;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a stage or publish call may take (formatting a new volume takes a moment).
const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an unpublish, unstage or stats call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often an orphaned volume's cleanup is tried again when its driver is absent or fails.
const ORPHAN_RETRY: Duration = Duration::from_secs(5);

const VOL_DATA: &str = "vol_data.json";

/// What the agent records beside a publish or staging target (the kubelet's `vol_data.json`
/// keys, plus the claim the metrics are labelled with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolData {
    pub driver_name: String,
    pub volume_handle: String,
    /// The PersistentVolume's name.
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    #[serde(rename = "podUID", default)]
    pub pod_uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub claim_name: String,
    /// The pod's name (its Events about the volume; absent in records of older agents).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
}

/// One volume published (or being published) into one pod.
#[derive(Debug, Clone)]
struct Published {
    data: VolData,
    /// NodePublishVolume succeeded (else it was attempted: teardown still unpublishes).
    mounted: bool,
}

/// One volume staged on the node.
#[derive(Debug, Clone)]
struct Staged {
    driver: String,
    /// NodeStageVolume succeeded (else it was attempted: it is asked again, and undone).
    done: bool,
}

#[derive(Default)]
struct State {
    /// (pod uid, PV name) -> what is published there.
    published: HashMap<(String, String), Published>,
    /// volume handle -> its staging.
    staged: HashMap<String, Staged>,
    /// Pods whose orphaned volumes a cleanup task is working on.
    cleaning: HashSet<String>,
    /// A cleanup task is unstaging volumes no pod publishes.
    sweeping: bool,
    /// (namespace, claim) series the volume metrics have.
    series: HashSet<(String, String)>,
    /// (pod uid, PV name) -> the last online expansion failure reported for it (one Warning
    /// per different failure, not one per pass).
    expand_warned: HashMap<(String, String), String>,
}

/// A claim volume of a pod to publish.
pub struct ClaimVolume<'a> {
    pub pod_uid: &'a str,
    pub pod_name: &'a str,
    pub namespace: &'a str,
    pub claim: &'a str,
    /// The claim as read for this setup: whether its volume must be grown first.
    pub pvc: Option<&'a PersistentVolumeClaim>,
    pub pv: &'a PersistentVolume,
    /// The pod's volume says readOnly: published read-only.
    pub readonly: bool,
}

/// The node's CSI volumes (one per agent, shared by every pod worker).
pub struct CsiVolumes {
    layout: Layout,
    drivers: Drivers,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    /// One lock per volume handle: stage, publish, unpublish and unstage of one volume
    /// never overlap.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    state: Mutex<State>,
    /// Claim status and Events of volume expansion, the attachments waited for and the
    /// Node's volumesInUse (none: volumes are never grown, attached or reported here).
    api: Option<ExpandApi>,
    /// The volumesInUse last written to the Node (none: not yet, or the write failed).
    in_use_reported: tokio::sync::Mutex<Option<Vec<String>>>,
}

/// The VolumeAttachment name of a volume on a node and the volume's unique name in
/// `Node.status.volumesInUse`: the attach/detach controller's own functions, so both sides
/// always agree.
pub use control_plane::controllers::attachdetach::{attachment_name, unique_volume_name};

/// A gRPC failure as the kubelet words it (Go's `rpc error: code = X desc = Y`).
fn rpc(op: &str, s: &tonic::Status) -> String {
    format!(
        "{op} failed: rpc error: code = {:?} desc = {}",
        s.code(),
        s.message()
    )
}

async fn call<T>(
    op: &str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(rpc(op, &s)),
        Err(_) => Err(format!("{op} failed: timed out after {limit:?}")),
    }
}

/// The volume capability of a PV: a mount with its fsType and mountOptions, the access mode
/// of its first access mode (as the kubelet takes it).
pub fn volume_capability(pv: &PersistentVolume) -> Result<csi::VolumeCapability, String> {
    use csi::volume_capability::access_mode::Mode;
    let spec = pv.spec.as_ref();
    if spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return Err("raw block volumes are not supported on this node".into());
    }
    let fs_type = spec
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| c.fs_type.clone())
        .unwrap_or_default();
    let mode = match spec
        .and_then(|s| s.access_modes.as_ref())
        .and_then(|m| m.first())
        .map(String::as_str)
    {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        // ReadWriteOnce, ReadWriteOncePod (SINGLE_NODE_SINGLE_WRITER needs a capability
        // skiff's client does not ask for), none.
        _ => Mode::SingleNodeWriter,
    };
    Ok(csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type,
                mount_flags: spec
                    .and_then(|s| s.mount_options.clone())
                    .unwrap_or_default(),
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    })
}

fn write_vol_data(dir: &Path, data: &VolData) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let json = serde_json::to_vec(data).map_err(|e| e.to_string())?;
    // Written whole or not at all: a restart mid-write must not lose the record.
    let tmp = dir.join(format!(".{VOL_DATA}.tmp"));
    std::fs::write(&tmp, json)
        .and_then(|_| std::fs::rename(&tmp, dir.join(VOL_DATA)))
        .map_err(|e| format!("writing {}: {e}", dir.join(VOL_DATA).display()))
}

fn read_vol_data(dir: &Path) -> Option<VolData> {
    let bytes = std::fs::read(dir.join(VOL_DATA)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes a target directory and its parent with its vol_data.json, once nothing is
/// mounted there (never recursively: a mount left behind keeps its data).
fn remove_target_dir(dir: &Path, target: &Path) {
    let _ = std::fs::remove_dir(target);
    let _ = std::fs::remove_file(dir.join(VOL_DATA));
    let _ = std::fs::remove_dir(dir);
}

impl CsiVolumes {
    pub fn new(
        layout: Layout,
        drivers: Drivers,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> CsiVolumes {
        CsiVolumes {
            layout,
            drivers,
            metrics,
            stop,
            locks: Mutex::new(HashMap::new()),
            state: Mutex::new(State::default()),
            api: None,
            in_use_reported: tokio::sync::Mutex::new(None),
        }
    }

    /// Volumes grown by the resizer are grown on this node too (NodeExpandVolume), the
    /// claims updated through `client` as the kubelet of `node`.
    pub fn with_api(mut self, client: kube::Client, node: impl Into<String>) -> CsiVolumes {
        self.api = Some(ExpandApi {
            client,
            node: node.into(),
        });
        self
    }

    pub fn drivers(&self) -> &Drivers {
        &self.drivers
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_of(&self, handle: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(handle.to_string())
            .or_default()
            .clone()
    }

    /// The (pod uid, PV name) pairs published (or being published) now.
    pub fn published(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self.state().published.keys().cloned().collect();
        v.sort();
        v
    }

    /// The node's volumes in use (staged, or published or being published for a pod), as
    /// `Node.status.volumesInUse` lists them: sorted unique names.
    pub fn in_use(&self) -> Vec<String> {
        let state = self.state();
        let mut v: Vec<String> = state
            .published
            .values()
            .map(|p| unique_volume_name(&p.data.driver_name, &p.data.volume_handle))
            .chain(
                state
                    .staged
                    .iter()
                    .map(|(h, s)| unique_volume_name(&s.driver, h)),
            )
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Writes [`Self::in_use`] to the Node's status when it differs from what was last
    /// written (only that field: the agent's status updates leave it alone). The attach/detach
    /// controller detaches a volume only once the node stops listing it, so a volume is
    /// listed before it is staged and until it is unstaged. A failed write is tried again by
    /// the next call (the volume timer calls it too).
    pub async fn report_in_use(&self) {
        let Some(api) = &self.api else { return };
        let mut last = self.in_use_reported.lock().await;
        let now = self.in_use();
        if last.as_ref() == Some(&now) {
            return;
        }
        let list = if now.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::json!(now)
        };
        let patch = serde_json::json!({"status": {"volumesInUse": list}});
        match Api::<Node>::all(api.client.clone())
            .patch_status(&api.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                debug!(volumes = ?now, "volumesInUse written");
                *last = Some(now);
            }
            Err(e) => {
                warn!(error = %e, "writing the node's volumesInUse failed");
                *last = None;
            }
        }
    }

    /// The publish_context of a volume on this node: when its driver must attach it (its
    /// CSIDriver says attachRequired, or it has none, as Kubernetes reads it), its
    /// VolumeAttachment must say attached, and its attachmentMetadata is the context; else
    /// empty. Not attached (yet): the kubelet's message, and the pod's setup is retried.
    async fn attachment(
        &self,
        driver: &str,
        handle: &str,
        pv: &str,
    ) -> Result<HashMap<String, String>, String> {
        let Some(api) = &self.api else {
            return Ok(HashMap::new());
        };
        let fail = |why: String| format!("AttachVolume.Attach failed for volume {pv:?} : {why}");
        let required = match Api::<CSIDriver>::all(api.client.clone())
            .get_opt(driver)
            .await
        {
            Ok(Some(d)) => d.spec.attach_required.unwrap_or(true),
            Ok(None) => true,
            Err(e) => return Err(fail(format!("reading CSIDriver {driver}: {e}"))),
        };
        if !required {
            return Ok(HashMap::new());
        }
        let name = attachment_name(handle, driver, &api.node);
        let va = Api::<VolumeAttachment>::all(api.client.clone())
            .get_opt(&name)
            .await
            .map_err(|e| fail(format!("reading volumeattachment {name}: {e}")))?;
        let Some(va) = va else {
            return Err(fail(format!(
                "volumeattachment {name} not found: volume {pv} is not attached yet"
            )));
        };
        let status = va.status.unwrap_or_default();
        if !status.attached {
            let why = status
                .attach_error
                .and_then(|e| e.message)
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Err(fail(format!(
                "volume {pv} is not attached yet (volumeattachment {name}){why}"
            )));
        }
        Ok(status
            .attachment_metadata
            .unwrap_or_default()
            .into_iter()
            .collect())
    }

    /// The volume handles staged now.
    pub fn staged(&self) -> Vec<String> {
        let mut v: Vec<_> = self.state().staged.keys().cloned().collect();
        v.sort();
        v
    }

    /// Rebuilds the table from the files beside the targets and the mount table (at start,
    /// before any pod worker runs).
    pub fn rebuild(&self) {
        let table = mountinfo::read();
        let mut state = self.state();
        let pods = self.layout.root().join("pods");
        for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let csi_dir = pod.path().join("volumes/kubernetes.io~csi");
            for vol in std::fs::read_dir(&csi_dir).into_iter().flatten().flatten() {
                let dir = vol.path();
                let target = dir.join("mount");
                let mounted = mountinfo::is_mount_point_in(&table, &target);
                let Some(data) = read_vol_data(&dir) else {
                    if mounted {
                        warn!(target = %target.display(), "a CSI mount without its vol_data.json: left to the pod's cleanup");
                    }
                    continue;
                };
                info!(pod_uid = %data.pod_uid, pv = %data.spec_vol_id, mounted, "CSI volume found published");
                state.published.insert(
                    (data.pod_uid.clone(), data.spec_vol_id.clone()),
                    Published { data, mounted },
                );
            }
        }
        let csi_plugins = self.layout.plugins_dir().join("kubernetes.io/csi");
        for driver in std::fs::read_dir(&csi_plugins)
            .into_iter()
            .flatten()
            .flatten()
        {
            for vol in std::fs::read_dir(driver.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Some(data) = read_vol_data(&vol.path()) {
                    let mounted =
                        mountinfo::is_mount_point_in(&table, &vol.path().join("globalmount"));
                    info!(handle = %data.volume_handle, mounted, "CSI volume found staged");
                    state.staged.insert(
                        data.volume_handle.clone(),
                        Staged {
                            driver: data.driver_name.clone(),
                            done: mounted,
                        },
                    );
                }
            }
        }
    }

    /// Stages (once per node) and publishes a claim's volume into a pod; the host directory
    /// its containers mount. Errors are the FailedMount message.
    pub async fn publish(&self, c: ClaimVolume<'_>) -> Result<PathBuf, String> {
        let pv_name = c.pv.metadata.name.clone().unwrap_or_default();
        let Some(src) = c.pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return Err(format!(
                "persistentvolume {pv_name:?} is not a CSI volume: only CSI persistent volumes \
                 are supported on this node"
            ));
        };
        let handle = src.volume_handle.clone();
        let dir = self.layout.csi_publish_dir(c.pod_uid, &pv_name);
        let target = dir.join("mount");
        let key = (c.pod_uid.to_string(), pv_name.clone());
        let lock = self.lock_of(&handle);
        let _held = lock.lock().await;
        // Published already (a token renewal, or a pod adopted after a restart, maybe before
        // its driver has registered again): nothing to ask the driver.
        let known = self.state().published.get(&key).is_some_and(|p| p.mounted);
        if known && mountinfo::is_mount_point(&target) {
            return Ok(target);
        }
        let driver = self
            .drivers
            .get(&src.driver)
            .ok_or_else(|| driver_not_found(&src.driver))?;
        let capability = volume_capability(c.pv)?;
        let context: HashMap<String, String> = src
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        // Attached first (drivers that need it): nothing recorded while it is not.
        let publish_context = self.attachment(&driver.name, &handle, &pv_name).await?;
        let staging = self.layout.csi_staging_dir(&driver.name, &handle);
        let staging_target = staging.join("globalmount");
        // Recorded before any call: the pod's teardown undoes whatever was half done (the
        // driver's unpublish and unstage are idempotent).
        let data = VolData {
            driver_name: driver.name.clone(),
            volume_handle: handle.clone(),
            spec_vol_id: pv_name.clone(),
            pod_uid: c.pod_uid.to_string(),
            namespace: c.namespace.to_string(),
            claim_name: c.claim.to_string(),
            pod_name: c.pod_name.to_string(),
        };
        write_vol_data(&dir, &data)?;
        std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
        self.state().published.insert(
            key.clone(),
            Published {
                data,
                mounted: false,
            },
        );
        // In use before it is staged (the attachment is not pulled from under the mount).
        self.report_in_use().await;
        let staged = self.state().staged.get(&handle).is_some_and(|s| s.done);
        if driver.stage_unstage && !staged {
            let data = VolData {
                driver_name: driver.name.clone(),
                volume_handle: handle.clone(),
                spec_vol_id: pv_name.clone(),
                pod_uid: String::new(),
                namespace: String::new(),
                claim_name: String::new(),
                pod_name: String::new(),
            };
            write_vol_data(&staging, &data)?;
            std::fs::create_dir_all(&staging_target).map_err(|e| e.to_string())?;
            self.state().staged.insert(
                handle.clone(),
                Staged {
                    driver: driver.name.clone(),
                    done: false,
                },
            );
            let req = csi::NodeStageVolumeRequest {
                volume_id: handle.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: kubelet_form(&self.layout, &staging_target),
                volume_capability: Some(capability.clone()),
                volume_context: context.clone(),
            };
            let mut node = driver.node.clone();
            call(
                "NodeStageVolume",
                MOUNT_TIMEOUT,
                node.node_stage_volume(req),
            )
            .await
            .map_err(|e| format!("MountVolume.MountDevice {e}"))?;
            if let Some(s) = self.state().staged.get_mut(&handle) {
                s.done = true;
            }
            info!(driver = %driver.name, %handle, pv = %pv_name, "volume staged");
        }
        if let (Some(pvc), Some(api)) = (c.pvc, &self.api) {
            if let Some((bytes, quantity)) = resize_target(c.pv, pvc) {
                let pod = PodOf {
                    namespace: c.namespace,
                    name: c.pod_name,
                    uid: c.pod_uid,
                };
                // Staged, not yet published for this pod: the driver's offline expansion
                // (the staging path when it stages, else the publish path).
                let path = if driver.stage_unstage {
                    &staging_target
                } else {
                    &target
                };
                let others = self
                    .state()
                    .published
                    .iter()
                    .any(|(k, p)| *k != key && p.mounted && p.data.volume_handle == handle);
                match self
                    .node_expand(&driver, &handle, path, &staging_target, bytes, &capability)
                    .await
                {
                    Ok(()) => {
                        api.mark_resized(pvc, &quantity).await?;
                        info!(pv = %pv_name, %quantity, "volume's filesystem expanded");
                        api.event(&pod, false, RESIZE_SUCCESSFUL, api.succeeded(&pv_name))
                            .await;
                    }
                    // Published for another pod already: a driver growing offline only
                    // refuses; this pod uses the volume as it is (the online pass tries
                    // again, the claim keeps its condition).
                    Err((tonic::Code::FailedPrecondition, e)) if others => {
                        api.event(&pod, true, RESIZE_FAILED, api.failed(&pv_name, &e))
                            .await;
                    }
                    Err((_, e)) => {
                        let message = api.failed(&pv_name, &e);
                        api.event(&pod, true, RESIZE_FAILED, message.clone()).await;
                        return Err(message);
                    }
                }
            }
        }
        let req = csi::NodePublishVolumeRequest {
            volume_id: handle.clone(),
            publish_context,
            staging_target_path: if driver.stage_unstage {
                kubelet_form(&self.layout, &staging_target)
            } else {
                String::new()
            },
            target_path: kubelet_form(&self.layout, &target),
            volume_capability: Some(capability),
            readonly: c.readonly,
            volume_context: context,
        };
        let mut node = driver.node.clone();
        call(
            "NodePublishVolume",
            MOUNT_TIMEOUT,
            node.node_publish_volume(req),
        )
        .await
        .map_err(|e| format!("MountVolume.SetUp {e}"))?;
        if let Some(p) = self.state().published.get_mut(&key) {
            p.mounted = true;
        }
        info!(driver = %driver.name, %handle, pv = %pv_name, pod_uid = %c.pod_uid, "volume published");
        Ok(target)
    }

    /// Unpublishes every CSI volume of a pod, and unstages each that no other pod on the
    /// node publishes. Every volume is tried; the first failure is returned (call again).
    pub async fn unpublish_pod(&self, pod_uid: &str) -> Result<(), String> {
        let mine: Vec<Published> = self
            .state()
            .published
            .iter()
            .filter(|((uid, _), _)| uid == pod_uid)
            .map(|(_, p)| p.clone())
            .collect();
        let mut first_error = None;
        for p in mine {
            if let Err(e) = self.unpublish(&p.data).await {
                warn!(pod_uid, pv = %p.data.spec_vol_id, error = %e, "unpublishing a volume failed");
                first_error.get_or_insert(e);
            }
        }
        self.report_in_use().await;
        first_error.map_or(Ok(()), Err)
    }

    async fn unpublish(&self, data: &VolData) -> Result<(), String> {
        let handle = &data.volume_handle;
        let lock = self.lock_of(handle);
        let _held = lock.lock().await;
        let key = (data.pod_uid.clone(), data.spec_vol_id.clone());
        if !self.state().published.contains_key(&key) {
            return Ok(()); // done by someone else meanwhile
        }
        let dir = self
            .layout
            .csi_publish_dir(&data.pod_uid, &data.spec_vol_id);
        let target = dir.join("mount");
        let driver = self.drivers.get(&data.driver_name);
        match &driver {
            Some(d) => {
                let req = csi::NodeUnpublishVolumeRequest {
                    volume_id: handle.clone(),
                    target_path: kubelet_form(&self.layout, &target),
                };
                let mut node = d.node.clone();
                call(
                    "NodeUnpublishVolume",
                    CALL_TIMEOUT,
                    node.node_unpublish_volume(req),
                )
                .await
                .map_err(|e| format!("UnmountVolume.TearDown {e}"))?;
            }
            // Nothing mounted: nothing for a driver to do.
            None if !mountinfo::is_mount_point(&target) => {}
            None => return Err(driver_not_found(&data.driver_name)),
        }
        if mountinfo::is_mount_point(&target) {
            return Err(format!(
                "UnmountVolume.TearDown: {} is still mounted after NodeUnpublishVolume",
                target.display()
            ));
        }
        remove_target_dir(&dir, &target);
        let still_used = {
            let mut state = self.state();
            state.published.remove(&key);
            state.expand_warned.remove(&key);
            state
                .published
                .values()
                .any(|p| p.data.volume_handle == *handle)
        };
        info!(pod_uid = %data.pod_uid, pv = %data.spec_vol_id, %handle, "volume unpublished");
        self.forget_series(&data.namespace, &data.claim_name);
        if !still_used {
            self.unstage_locked(handle).await?;
        }
        Ok(())
    }

    /// Unstages a volume no pod publishes (its lock held by the caller).
    async fn unstage_locked(&self, handle: &str) -> Result<(), String> {
        let Some(staged) = self.state().staged.get(handle).cloned() else {
            return Ok(());
        };
        let staging = self.layout.csi_staging_dir(&staged.driver, handle);
        let staging_target = staging.join("globalmount");
        match self.drivers.get(&staged.driver) {
            Some(d) => {
                let req = csi::NodeUnstageVolumeRequest {
                    volume_id: handle.to_string(),
                    staging_target_path: kubelet_form(&self.layout, &staging_target),
                };
                let mut node = d.node.clone();
                call(
                    "NodeUnstageVolume",
                    CALL_TIMEOUT,
                    node.node_unstage_volume(req),
                )
                .await
                .map_err(|e| format!("UnmountDevice {e}"))?;
            }
            None if !mountinfo::is_mount_point(&staging_target) => {}
            None => return Err(driver_not_found(&staged.driver)),
        }
        if mountinfo::is_mount_point(&staging_target) {
            return Err(format!(
                "UnmountDevice: {} is still mounted after NodeUnstageVolume",
                staging_target.display()
            ));
        }
        remove_target_dir(&staging, &staging_target);
        self.state().staged.remove(handle);
        info!(driver = %staged.driver, %handle, "volume unstaged");
        Ok(())
    }

    /// Unstages every staged volume no pod publishes (a stage whose publish never came).
    async fn unstage_unused(&self) -> Result<(), String> {
        let unused: Vec<String> = {
            let state = self.state();
            state
                .staged
                .keys()
                .filter(|h| {
                    !state
                        .published
                        .values()
                        .any(|p| p.data.volume_handle == **h)
                })
                .cloned()
                .collect()
        };
        let mut first_error = None;
        for handle in unused {
            let lock = self.lock_of(&handle);
            let _held = lock.lock().await;
            let used = self
                .state()
                .published
                .values()
                .any(|p| p.data.volume_handle == handle);
            if !used {
                if let Err(e) = self.unstage_locked(&handle).await {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.report_in_use().await;
        first_error.map_or(Ok(()), Err)
    }

    /// A pod's worker is done with it: its volumes are unpublished (and unstaged when no
    /// other pod publishes them). Only this pod's volumes: another's trouble never holds it.
    pub async fn tear_down_pod(&self, pod_uid: &str) -> Result<(), String> {
        self.unpublish_pod(pod_uid).await
    }

    /// The pods listed on the node are `live`: volumes of every other pod (deleted while the
    /// agent was down) are unpublished and unstaged by a task of their own, tried again until
    /// their driver is back and agrees.
    pub fn orphans(self: &Arc<Self>, live: &HashSet<String>) {
        let orphans: Vec<String> = {
            let mut state = self.state();
            let mut found: Vec<String> = state
                .published
                .keys()
                .map(|(uid, _)| uid.clone())
                .filter(|uid| !live.contains(uid))
                .collect();
            found.sort();
            found.dedup();
            found.retain(|uid| !state.cleaning.contains(uid));
            state.cleaning.extend(found.iter().cloned());
            found
        };
        let stale_stages = {
            let mut state = self.state();
            let stale = !state.sweeping
                && state
                    .staged
                    .keys()
                    .any(|h| !state.published.values().any(|p| p.data.volume_handle == *h));
            state.sweeping |= stale;
            stale
        };
        if orphans.is_empty() && !stale_stages {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut changes = me.drivers.subscribe();
            for uid in orphans {
                info!(pod_uid = %uid, "cleaning up the CSI volumes of a pod that is gone");
                loop {
                    match me.unpublish_pod(&uid).await {
                        Ok(()) => break,
                        Err(e) => {
                            debug!(pod_uid = %uid, error = %e, "orphaned volume cleanup; trying again")
                        }
                    }
                    tokio::select! {
                        _ = changes.changed() => {}
                        _ = tokio::time::sleep(ORPHAN_RETRY) => {}
                        _ = me.stop.cancelled() => return,
                    }
                }
                me.state().cleaning.remove(&uid);
            }
            if !stale_stages {
                return; // unpublishing the orphans unstaged what they alone used
            }
            loop {
                match me.unstage_unused().await {
                    Ok(()) => break,
                    Err(e) => debug!(error = %e, "unstaging unused volumes; trying again"),
                }
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep(ORPHAN_RETRY) => {}
                    _ = me.stop.cancelled() => return,
                }
            }
            me.state().sweeping = false;
        });
    }

    fn forget_series(&self, namespace: &str, claim: &str) {
        let mut state = self.state();
        let used = state
            .published
            .values()
            .any(|p| p.data.namespace == namespace && p.data.claim_name == claim);
        if !used
            && state
                .series
                .remove(&(namespace.to_string(), claim.to_string()))
        {
            self.metrics.volume_stats.remove(namespace, claim);
        }
    }

    /// NodeGetVolumeStats for every published volume (one per claim), into the metrics.
    pub async fn collect_stats(&self) {
        let mut seen: HashSet<(String, String)> = HashSet::new();
        let volumes: Vec<VolData> = {
            let state = self.state();
            let mut v: Vec<VolData> = state
                .published
                .values()
                .filter(|p| p.mounted)
                .map(|p| p.data.clone())
                .collect();
            v.sort_by(|a, b| (&a.namespace, &a.claim_name).cmp(&(&b.namespace, &b.claim_name)));
            v
        };
        for data in volumes {
            let series = (data.namespace.clone(), data.claim_name.clone());
            if !seen.insert(series.clone()) {
                continue;
            }
            let Some(driver) = self.drivers.get(&data.driver_name) else {
                continue;
            };
            if !driver.volume_stats {
                continue;
            }
            let target = self
                .layout
                .csi_publish_dir(&data.pod_uid, &data.spec_vol_id)
                .join("mount");
            let staging = self
                .layout
                .csi_staging_dir(&driver.name, &data.volume_handle)
                .join("globalmount");
            let req = csi::NodeGetVolumeStatsRequest {
                volume_id: data.volume_handle.clone(),
                volume_path: kubelet_form(&self.layout, &target),
                staging_target_path: if driver.stage_unstage {
                    kubelet_form(&self.layout, &staging)
                } else {
                    String::new()
                },
            };
            let mut node = driver.node.clone();
            match call(
                "NodeGetVolumeStats",
                CALL_TIMEOUT,
                node.node_get_volume_stats(req),
            )
            .await
            {
                Ok(resp) => {
                    let usage = VolumeUsage::from_response(&resp);
                    // Unpublished meanwhile: no series for a volume that is gone.
                    let mut state = self.state();
                    let still = state.published.values().any(|p| {
                        p.mounted && p.data.namespace == series.0 && p.data.claim_name == series.1
                    });
                    if still {
                        self.metrics.volume_stats.set(&series.0, &series.1, &usage);
                        state.series.insert(series);
                    }
                }
                Err(e) => debug!(pv = %data.spec_vol_id, error = %e, "volume stats"),
            }
        }
    }

    /// Collects volume stats (and grows the filesystems of published volumes whose claims
    /// wait for it) every `every` until the agent stops.
    pub async fn stats_loop(self: Arc<Self>, every: Duration) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.stop.cancelled() => return,
            }
            self.collect_stats().await;
            self.expand_published().await;
            self.report_in_use().await;
        }
    }

    /// NodeExpandVolume, `capacity` bytes required; errors with their gRPC code.
    async fn node_expand(
        &self,
        driver: &Driver,
        handle: &str,
        volume_path: &Path,
        staging_target: &Path,
        capacity: i64,
        capability: &csi::VolumeCapability,
    ) -> Result<(), (tonic::Code, String)> {
        if !driver.expand_volume {
            return Ok(()); // nothing for the node to do: the volume has its size
        }
        let req = csi::NodeExpandVolumeRequest {
            volume_id: handle.to_string(),
            volume_path: kubelet_form(&self.layout, volume_path),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: capacity,
                limit_bytes: 0,
            }),
            staging_target_path: if driver.stage_unstage {
                kubelet_form(&self.layout, staging_target)
            } else {
                String::new()
            },
            volume_capability: Some(capability.clone()),
        };
        let mut node = driver.node.clone();
        match tokio::time::timeout(MOUNT_TIMEOUT, node.node_expand_volume(req)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) => Err((s.code(), rpc("NodeExpandVolume", &s))),
            Err(_) => Err((
                tonic::Code::DeadlineExceeded,
                format!("NodeExpandVolume failed: timed out after {MOUNT_TIMEOUT:?}"),
            )),
        }
    }

    /// Online expansion: every volume published for a pod whose claim waits for its
    /// filesystem to grow is offered to its driver. A refusal (FailedPrecondition from a
    /// driver growing offline only) leaves the claim as it is, until the pod is started
    /// again; each different failure is reported once.
    pub async fn expand_published(&self) {
        let Some(api) = &self.api else { return };
        let volumes: Vec<VolData> = {
            let state = self.state();
            let mut v: Vec<VolData> = state
                .published
                .values()
                .filter(|p| p.mounted && !p.data.pod_name.is_empty())
                .map(|p| p.data.clone())
                .collect();
            v.sort_by(|a, b| (&a.pod_uid, &a.spec_vol_id).cmp(&(&b.pod_uid, &b.spec_vol_id)));
            v
        };
        for data in volumes {
            let key = (data.pod_uid.clone(), data.spec_vol_id.clone());
            let pvc = match api.claim(&data.namespace, &data.claim_name).await {
                Ok(Some(pvc)) => pvc,
                Ok(None) => continue,
                Err(e) => {
                    debug!(claim = %data.claim_name, error = %e, "reading a claim to expand");
                    continue;
                }
            };
            let pv = match api.volume(&data.spec_vol_id).await {
                Ok(Some(pv)) => pv,
                Ok(None) => continue,
                Err(e) => {
                    debug!(pv = %data.spec_vol_id, error = %e, "reading a volume to expand");
                    continue;
                }
            };
            let Some((bytes, quantity)) = resize_target(&pv, &pvc) else {
                self.state().expand_warned.remove(&key);
                continue;
            };
            let Some(driver) = self.drivers.get(&data.driver_name) else {
                continue;
            };
            let Ok(capability) = volume_capability(&pv) else {
                continue;
            };
            let lock = self.lock_of(&data.volume_handle);
            let _held = lock.lock().await;
            if !self.state().published.get(&key).is_some_and(|p| p.mounted) {
                continue; // unpublished meanwhile
            }
            let target = self
                .layout
                .csi_publish_dir(&data.pod_uid, &data.spec_vol_id)
                .join("mount");
            let staging = self
                .layout
                .csi_staging_dir(&driver.name, &data.volume_handle)
                .join("globalmount");
            let pod = PodOf {
                namespace: &data.namespace,
                name: &data.pod_name,
                uid: &data.pod_uid,
            };
            match self
                .node_expand(
                    &driver,
                    &data.volume_handle,
                    &target,
                    &staging,
                    bytes,
                    &capability,
                )
                .await
            {
                Ok(()) => {
                    if let Err(e) = api.mark_resized(&pvc, &quantity).await {
                        warn!(claim = %data.claim_name, error = %e, "marking a claim resized");
                        continue;
                    }
                    self.state().expand_warned.remove(&key);
                    info!(pv = %data.spec_vol_id, %quantity, "published volume's filesystem expanded");
                    api.event(
                        &pod,
                        false,
                        RESIZE_SUCCESSFUL,
                        api.succeeded(&data.spec_vol_id),
                    )
                    .await;
                }
                Err((code, e)) => {
                    let message = api.failed(&data.spec_vol_id, &e);
                    let new = self
                        .state()
                        .expand_warned
                        .insert(key.clone(), message.clone())
                        .is_none_or(|old| old != message);
                    debug!(pv = %data.spec_vol_id, ?code, error = %e, "online expansion");
                    if new {
                        api.event(&pod, true, RESIZE_FAILED, message).await;
                    }
                }
            }
        }
    }
}

/// A volume's usage from NodeGetVolumeStats (bytes and inodes; absent units are None).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    pub capacity_bytes: Option<i64>,
    pub available_bytes: Option<i64>,
    pub used_bytes: Option<i64>,
    pub inodes: Option<i64>,
    pub inodes_free: Option<i64>,
    pub inodes_used: Option<i64>,
}

impl VolumeUsage {
    pub fn from_response(r: &csi::NodeGetVolumeStatsResponse) -> VolumeUsage {
        use csi::volume_usage::Unit;
        let mut u = VolumeUsage::default();
        for x in &r.usage {
            if x.unit == Unit::Bytes as i32 {
                u.capacity_bytes = Some(x.total);
                u.available_bytes = Some(x.available);
                u.used_bytes = Some(x.used);
            } else if x.unit == Unit::Inodes as i32 {
                u.inodes = Some(x.total);
                u.inodes_free = Some(x.available);
                u.inodes_used = Some(x.used);
            }
        }
        u
    }
}
