//! The node agent's CSI client, as the kubelet has it:
//!
//! - `plugins`: the plugin watcher. Drivers put a registration socket in
//!   `<root>/plugins_registry/`; the agent asks it GetInfo, connects to the driver's endpoint,
//!   keeps CSINode `<node>` and the Node's topology labels current, and answers
//!   NotifyRegistrationStatus. Known drivers live in [`Drivers`], shared with the volume code.
//! - `volumes`: NodeStageVolume / NodePublishVolume for the PersistentVolumeClaims of the
//!   node's pods (one operation in flight per volume handle) and their inverses, the table of
//!   published volumes rebuilt from the mount table after a restart, orphan cleanup,
//!   NodeGetVolumeStats into the kubelet's volume metrics, the wait for a VolumeAttachment
//!   of drivers that attach, and the Node's `status.volumesInUse`.
//! - `expand`: the node's half of volume expansion (NodeExpandVolume, the claim marked resized).
//! - `mountinfo`: the mount table parser.
//!
//! Paths handed to drivers and endpoints registered by them are in the kubelet's form
//! (`/var/lib/kubelet/...`) and mapped to the agent's data dir by [`Layout::host_path`] and
//! [`Layout::kubelet_path`]: several agents share one machine, and drivers run in containers
//! that mount the agent's root dir at `/var/lib/kubelet`.

pub mod expand;
pub mod mountinfo;
pub mod plugins;
pub mod volumes;

use crate::layout::Layout;
use skiff_csi::proto::csi::v1 as csi;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio::sync::watch;
use tonic::transport::Channel;

pub use volumes::CsiVolumes;

/// A registered CSI driver: how to reach its Node service and what it can do.
#[derive(Clone)]
pub struct Driver {
    pub name: String,
    /// Its CSI socket on this machine.
    pub endpoint: PathBuf,
    /// NodeGetInfo's node_id.
    pub node_id: String,
    /// NODE_STAGE_UNSTAGE_VOLUME: volumes are staged once per node before publishing.
    pub stage_unstage: bool,
    /// GET_VOLUME_STATS: NodeGetVolumeStats is served.
    pub volume_stats: bool,
    /// EXPAND_VOLUME: NodeExpandVolume grows a volume's filesystem on the node (else a grown
    /// volume's claim is marked resized without asking the driver, as the kubelet does).
    pub expand_volume: bool,
    pub node: csi::node_client::NodeClient<Channel>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("node_id", &self.node_id)
            .field("stage_unstage", &self.stage_unstage)
            .field("volume_stats", &self.volume_stats)
            .field("expand_volume", &self.expand_volume)
            .finish()
    }
}

/// The drivers registered on this node by name, shared by the plugin watcher (which writes
/// it) and the volume code (which reads it); a watch counter tells waiters of changes.
#[derive(Clone)]
pub struct Drivers {
    map: Arc<RwLock<HashMap<String, Driver>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for Drivers {
    fn default() -> Self {
        Drivers {
            map: Default::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl Drivers {
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    pub fn insert(&self, driver: Driver) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(driver.name.clone(), driver);
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn remove(&self, name: &str) -> Option<Driver> {
        let gone = self
            .map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.changed.send_modify(|n| *n += 1);
        gone
    }

    /// A receiver that sees every change of the set.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// The kubelet's message when a pod's volume names a driver this node does not have.
pub fn driver_not_found(name: &str) -> String {
    format!(
        "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {name} not \
         found in the list of registered CSI drivers"
    )
}

/// `path` (under the agent's root) in the kubelet's form, as drivers are told paths.
pub fn kubelet_form(layout: &Layout, path: &Path) -> String {
    layout
        .kubelet_path(path)
        .unwrap_or_else(|| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// Makes the agent's root dir a shared mount with its subtree (bind on itself first if it is
/// not a mount point), as the kubelet does with /var/lib/kubelet: mounts a driver makes
/// under it from its container (Bidirectional propagation) then reach this namespace, the
/// runtime and the pods. As the kubelet, nothing is done when the mount the root dir is on
/// is shared already. Idempotent: an agent restarted finds it shared.
pub fn make_root_shared(root: &Path) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir_all(root)?;
    let root = root.canonicalize()?;
    let table = mountinfo::read();
    // The mount the root dir is on (the last one mounted at the longest prefix): when it
    // propagates already (a systemd host's `/`), a bind would only double every mount.
    let containing = table
        .iter()
        .enumerate()
        .filter(|(_, m)| root.starts_with(&m.mount_point))
        .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))
        .map(|(_, m)| m);
    if containing.is_some_and(mountinfo::MountInfo::is_shared) {
        return Ok(());
    }
    if containing.is_none_or(|m| m.mount_point != root) {
        mount(
            Some(&root),
            &root,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(std::io::Error::from)?;
    }
    mount(
        None::<&str>,
        &root,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(std::io::Error::from)
}

/// Undoes [`make_root_shared`]'s bind mount (the machine's teardown: `launcher down`, tests),
/// detaching everything below first. Nothing happens when the root dir is not a mount point.
pub fn unmount_root(root: &Path) {
    let Ok(root) = root.canonicalize() else {
        return;
    };
    crate::pod::volumes::unmount_below(&root);
}
