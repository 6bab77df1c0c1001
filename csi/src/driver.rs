//! What the node plugin's three CSI services share: the node, its volumes, the metrics, and
//! the checks of volume capabilities and topology every service applies the same way.

use crate::metrics::Metrics;
use crate::proto::csi::v1 as csi;
use crate::volumes::Store;
use crate::TOPOLOGY_KEY;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::AccessType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tonic::Status;

/// The driver's state on this node.
pub struct Driver {
    pub node: String,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Serialises the capacity check and the change (create, grow, delete) it guards.
    pub capacity_lock: Mutex<()>,
    /// One lock per volume for the node operations (stage, unstage, expand) on it.
    volume_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Filesystem sizes (in 4 KiB blocks) that gave a volume of a capacity its exact usable
    /// bytes here, so formatting the next volume of that capacity takes one mkfs.
    pub fs_blocks: Mutex<HashMap<u64, u64>>,
}

impl Driver {
    pub fn new(node: String, store: Store, metrics: Arc<Metrics>) -> Driver {
        Driver {
            node,
            store,
            metrics,
            capacity_lock: Mutex::new(()),
            volume_locks: Mutex::new(HashMap::new()),
            fs_blocks: Mutex::new(HashMap::new()),
        }
    }

    pub async fn lock_volume(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut locks = self.volume_locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(id.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }

    /// This node's topology segment.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), self.node.clone())]),
        }
    }

    /// Whether a topology of a request names this node.
    pub fn is_here(&self, t: &csi::Topology) -> bool {
        t.segments.get(TOPOLOGY_KEY) == Some(&self.node)
    }

    /// Refreshes the volume and capacity gauges (best effort).
    pub fn update_gauges(&self) {
        if let Ok(list) = self.store.list() {
            self.metrics.volumes.set(list.len() as i64);
            self.metrics
                .allocated_bytes
                .set(list.iter().map(|(_, c)| *c as i64).sum());
        }
        if let Ok(a) = self.store.available() {
            self.metrics.available_bytes.set(a as i64);
        }
    }
}

/// The access modes of a node-local volume: those of a single node.
fn supported_mode(mode: i32) -> bool {
    matches!(
        Mode::try_from(mode),
        Ok(Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter)
    )
}

/// Checks a volume capability: a single-node access mode and a mounted ext4 filesystem.
pub fn check_capability(c: &csi::VolumeCapability) -> Result<(), Status> {
    let mode = c
        .access_mode
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume capability without access_mode"))?
        .mode;
    if !supported_mode(mode) {
        let name = Mode::try_from(mode)
            .map(|m| m.as_str_name().to_string())
            .unwrap_or_else(|_| mode.to_string());
        return Err(Status::invalid_argument(format!(
            "access mode {name} is not supported: {} volumes live on one node \
             (SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, \
             SINGLE_NODE_MULTI_WRITER)",
            crate::DRIVER_NAME
        )));
    }
    match &c.access_type {
        Some(AccessType::Mount(m)) if m.fs_type.is_empty() || m.fs_type == "ext4" => Ok(()),
        Some(AccessType::Mount(m)) => Err(Status::invalid_argument(format!(
            "filesystem {:?} is not supported (ext4 only)",
            m.fs_type
        ))),
        Some(AccessType::Block(_)) => Err(Status::invalid_argument(
            "block volumes are not supported (mount only)",
        )),
        None => Err(Status::invalid_argument(
            "volume capability without access_type",
        )),
    }
}

/// Whether the capability asks for a read-only volume.
pub fn read_only_mode(c: Option<&csi::VolumeCapability>) -> bool {
    c.and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32)
}

pub fn io_status(what: &str, e: std::io::Error) -> Status {
    Status::internal(format!("{what}: {e}"))
}

/// Runs blocking work on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}
