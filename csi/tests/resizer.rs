//! The resizer against skiff's real API server (in-process) and the real driver (its CSI
//! servers in-process on a unix socket, volumes as sparse files on real loop devices with
//! ext4). The provisioner makes the volumes; no PV binder and no node agent run here: the
//! tests play their parts (binding the claim, the storage-resizer annotation and
//! allocatedResources on a grown claim; stage/publish and finishing the node expansion) and
//! watch what the resizer does through the API, the Events, the driver and statvfs.

mod support;
use support::eventually;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use control_plane::apiserver::{Config as ApiConfig, RunningServer, Server as ApiServer};
use csi::node_client::NodeClient;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use skiff_csi::plugin::{self, Plugin, PluginConfig};
use skiff_csi::proto::csi::v1 as csi;
use skiff_csi::provisioner::{self, SELECTED_NODE, STORAGE_PROVISIONER};
use skiff_csi::resizer::{
    self, CONTROLLER_RESIZE_ERROR, FS_RESIZE_PENDING, FS_RESIZE_PENDING_MESSAGE,
    PRE_RESIZE_CAPACITY, RESIZING, STORAGE_RESIZER,
};
use skiff_csi::DRIVER_NAME;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
const NODE: &str = "n1";

/// An API server, the driver of [`NODE`] and its provisioner and resizer.
struct Setup {
    _dir: tempfile::TempDir,
    _api: RunningServer,
    client: Client,
    plugin: Option<Plugin>,
    socket: PathBuf,
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
    /// The controller runtime's metrics of the provisioner and the resizer.
    controllers: control_plane::runtime::Metrics,
}

impl Setup {
    async fn start(capacity: u64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let api = ApiServer::start(ApiConfig::new(dir.path(), "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let client = control_plane::runtime::client::from_kubeconfig(api.kubeconfig_path())
            .await
            .unwrap();
        let socket = dir.path().join("csi.sock");
        let plugin = plugin::start(
            PluginConfig {
                node: NODE.into(),
                endpoint: socket.clone(),
                registration_socket: None,
                kubelet_endpoint: socket.display().to_string(),
                data_dir: dir.path().join("volumes"),
                capacity,
            },
            Arc::new(skiff_csi::metrics::Metrics::new()),
        )
        .await
        .unwrap();
        let classes: Api<StorageClass> = Api::all(client.clone());
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "local"},
            "provisioner": DRIVER_NAME,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": true,
        }))
        .unwrap();
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let controllers = control_plane::runtime::Metrics::new();
        let tasks = vec![
            tokio::spawn(provisioner::run(provisioner::Config {
                client: client.clone(),
                csi: plugin::unix_channel(&socket),
                driver: DRIVER_NAME.into(),
                node: NODE.into(),
                metrics: controllers.clone(),
            })),
            tokio::spawn(resizer::run(resizer::Config {
                client: client.clone(),
                csi: plugin::unix_channel(&socket),
                driver: DRIVER_NAME.into(),
                node: NODE.into(),
                metrics: controllers.clone(),
            })),
        ];
        Setup {
            _dir: dir,
            _api: api,
            client,
            plugin: Some(plugin),
            socket,
            tasks,
            controllers,
        }
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(plugin::unix_channel(&self.socket))
    }

    /// A claim of `size` provisioned on [`NODE`] and bound to its volume (the binder's part
    /// played by hand): (claim, PV name).
    async fn bound_claim(&self, name: &str, size: &str) -> (PersistentVolumeClaim, String) {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {
                STORAGE_PROVISIONER: DRIVER_NAME, SELECTED_NODE: NODE}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "resources": {"requests": {"storage": size}}},
        }))
        .unwrap();
        let claim = self
            .claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
        let pv_name = format!("pvc-{}", claim.uid().unwrap());
        let pv = eventually(&format!("PV {pv_name}"), || async {
            self.volumes()
                .get_opt(&pv_name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not there".to_string())
        })
        .await;
        assert_eq!(capacity(&pv), size);
        self.claims()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"volumeName": pv_name}})),
            )
            .await
            .unwrap();
        let claim = self
            .claims()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound",
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}})),
            )
            .await
            .unwrap();
        (claim, pv_name)
    }

    /// The user grows the claim; the binder marks it for this driver's resizer.
    async fn grow(&self, name: &str, size: &str) {
        self.claims()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"annotations": {STORAGE_RESIZER: DRIVER_NAME}},
                    "spec": {"resources": {"requests": {"storage": size}}},
                })),
            )
            .await
            .unwrap();
        self.claims()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"allocatedResources": {"storage": size}}})),
            )
            .await
            .unwrap();
    }

    /// The Events about the object with `uid`: (type, reason, message).
    async fn events(&self, uid: &str) -> Vec<(String, String, String)> {
        support::events(&self.client, uid).await
    }

    async fn wait_event(&self, uid: &str, reason: &str) -> (String, String) {
        support::wait_event(&self.client, uid, reason).await
    }

    async fn stop(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(p) = self.plugin.take() {
            p.shutdown().await;
        }
    }
}

fn capacity(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"]
        .0
        .clone()
}

/// The claim's conditions: (type, status, message).
fn conditions(claim: &PersistentVolumeClaim) -> Vec<(String, String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.message.unwrap_or_default()))
        .collect()
}

fn status(claim: &PersistentVolumeClaim) -> Value {
    serde_json::to_value(claim.status.clone().unwrap_or_default()).unwrap()
}

fn cap() -> Option<csi::VolumeCapability> {
    Some(csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

/// NodeStageVolume + NodePublishVolume, as the node agent calls them.
async fn stage_and_publish(
    node: &mut NodeClient<Channel>,
    id: &str,
    staging: &Path,
    target: &Path,
) {
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: cap(),
        ..Default::default()
    })
    .await
    .unwrap();
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: cap(),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn unpublish_and_unstage(
    node: &mut NodeClient<Channel>,
    id: &str,
    staging: &Path,
    target: &Path,
) {
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
}

/// Bytes a pod can still write at `path` (statvfs f_bavail).
fn available(path: &Path) -> u64 {
    skiff_csi::sys::usage(path).unwrap().available_bytes
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grown_claim_gets_a_bigger_volume_and_its_filesystem_grows_at_the_next_stage() {
    let s = Setup::start(512 * MIB).await;
    let (claim, pv_name) = s.bound_claim("data", "64Mi").await;
    let uid = claim.uid().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let staging = scratch.path().join("globalmount");
    let target = scratch.path().join("mount");
    let mut node = s.node();
    stage_and_publish(&mut node, &pv_name, &staging, &target).await;
    let before = available(&target);
    assert!(
        (64 * MIB..65 * MIB).contains(&before),
        "a 64Mi claim gets 64 MiB usable: {before}"
    );
    s.grow("data", "128Mi").await;

    let pv = eventually("the PV grows to 128Mi", || async {
        let pv = s.volumes().get(&pv_name).await.map_err(|e| e.to_string())?;
        match capacity(&pv).as_str() {
            "128Mi" => Ok(pv),
            other => Err(format!("capacity {other}")),
        }
    })
    .await;
    assert_eq!(
        pv.annotations()
            .get(PRE_RESIZE_CAPACITY)
            .map(String::as_str),
        Some("64Mi"),
        "the claim's capacity before, for the binder"
    );
    let claim = eventually("FileSystemResizePending", || async {
        let c = s.claims().get("data").await.map_err(|e| e.to_string())?;
        match conditions(&c).iter().any(|c| c.0 == FS_RESIZE_PENDING) {
            true => Ok(c),
            false => Err(format!("conditions {:?}", conditions(&c))),
        }
    })
    .await;
    assert_eq!(
        conditions(&claim),
        [(
            FS_RESIZE_PENDING.to_string(),
            "True".to_string(),
            FS_RESIZE_PENDING_MESSAGE.to_string()
        )],
        "Resizing was replaced"
    );
    let st = status(&claim);
    assert_eq!(
        st["capacity"]["storage"], "64Mi",
        "the filesystem is not grown yet"
    );
    assert_eq!(
        st["allocatedResourceStatuses"]["storage"],
        "NodeResizePending"
    );
    let (kind, message) = s.wait_event(&uid, "Resizing").await;
    assert_eq!(
        (kind.as_str(), message),
        (
            "Normal",
            format!("External resizer is resizing volume {pv_name}")
        )
    );
    let (kind, message) = s.wait_event(&uid, "FileSystemResizeRequired").await;
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("Normal", "Require file system resize of volume on node")
    );
    // Still published: the filesystem keeps its size until the volume is staged again.
    assert!(available(&target) < 65 * MIB);

    // The node agent's part: the pod goes, a new one comes (unstage, stage: the driver grows
    // the filesystem at stage), then the claim reports the new size.
    unpublish_and_unstage(&mut node, &pv_name, &staging, &target).await;
    stage_and_publish(&mut node, &pv_name, &staging, &target).await;
    let after = available(&target);
    assert!(
        after >= 128 * MIB,
        "statvfs after the restage: {after} bytes available"
    );
    s.claims()
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"storage": "128Mi"},
                "conditions": [], "allocatedResourceStatuses": null}})),
        )
        .await
        .unwrap();
    eventually("the pre-resize annotation goes", || async {
        let pv = s.volumes().get(&pv_name).await.map_err(|e| e.to_string())?;
        match pv.annotations().get(PRE_RESIZE_CAPACITY) {
            None => Ok(()),
            Some(v) => Err(format!("still {v}")),
        }
    })
    .await;
    let pv = s.volumes().get(&pv_name).await.unwrap();
    assert_eq!(capacity(&pv), "128Mi");
    unpublish_and_unstage(&mut node, &pv_name, &staging, &target).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_grown_beyond_the_node_gets_volume_resize_failed() {
    let s = Setup::start(256 * MIB).await;
    let (claim, pv_name) = s.bound_claim("big", "64Mi").await;
    let uid = claim.uid().unwrap();
    s.grow("big", "1Gi").await;
    let (kind, message) = s.wait_event(&uid, "VolumeResizeFailed").await;
    assert_eq!(kind, "Warning");
    assert!(
        message.starts_with(&format!(
            "resize volume \"{pv_name}\" by resizer \"{DRIVER_NAME}\" failed: rpc error: code = ResourceExhausted desc = not enough capacity on node {NODE}"
        )),
        "{message}"
    );
    let claim = eventually("ControllerResizeError", || async {
        let c = s.claims().get("big").await.map_err(|e| e.to_string())?;
        match conditions(&c)
            .iter()
            .any(|c| c.0 == CONTROLLER_RESIZE_ERROR)
        {
            true => Ok(c),
            false => Err(format!("conditions {:?}", conditions(&c))),
        }
    })
    .await;
    let conds = conditions(&claim);
    assert!(
        !conds.iter().any(|c| c.0 == RESIZING),
        "Resizing is removed: {conds:?}"
    );
    assert!(conds.iter().any(|c| c.2 == message), "{conds:?}");
    let st = status(&claim);
    assert_eq!(st["capacity"]["storage"], "64Mi");
    // Not enough space now may be enough later: still in progress, retried.
    assert_eq!(
        st["allocatedResourceStatuses"]["storage"],
        "ControllerResizeInProgress"
    );
    let pv = s.volumes().get(&pv_name).await.unwrap();
    assert_eq!(capacity(&pv), "64Mi");
    assert!(pv.annotations().get(PRE_RESIZE_CAPACITY).is_none());
    // Retried with back-off: the driver is asked again (a second Resizing event, counted).
    eventually("a retry", || async {
        let events = s.events(&uid).await;
        let resizing = events.iter().find(|e| e.1 == "Resizing");
        let count = {
            let api: Api<Event> = Api::namespaced(s.client.clone(), "default");
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .filter(|e| {
                    e.involved_object.uid.as_deref() == Some(uid.as_str())
                        && e.reason.as_deref() == Some("VolumeResizeFailed")
                })
                .map(|e| e.count.unwrap_or(1))
                .sum::<i32>()
        };
        match (resizing, count) {
            (Some(_), n) if n >= 2 => Ok(()),
            _ => Err(format!(
                "VolumeResizeFailed {count} times; events {events:?}"
            )),
        }
    })
    .await;
    // The retries are the controller runtime's: its failed reconciles of the resizer.
    let errors = support::series_value(
        &s.controllers.render(),
        "skiff_controller_reconcile_errors_total{controller=\"resizer\"}",
    );
    assert!(errors >= 2.0, "{}", s.controllers.render());
    s.stop().await;
}
