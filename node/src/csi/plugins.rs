//! The plugin watcher: the kubelet's plugin registration protocol over
//! `<root>/plugins_registry/`. A driver creates a `*.sock` there serving the Registration
//! service; the agent (told by inotify) asks it GetInfo, accepts a `CSIPlugin` of a 1.x
//! version, connects to the endpoint it names, asks NodeGetInfo and NodeGetCapabilities,
//! records the driver in CSINode `<node>` (created owned by the Node) and the topology
//! segment as the Node's labels, then answers NotifyRegistrationStatus. A socket removed
//! takes its driver off the node and out of CSINode (the labels stay, as the kubelet keeps
//! them).

use super::{Driver, Drivers};
use crate::cri::unix_channel;
use crate::layout::Layout;
use crate::names::NodeName;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use skiff_csi::proto::csi::v1 as csi;
use skiff_csi::proto::registration as reg;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The plugin type CSI drivers register as.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// How long one registration call may take (a driver that hangs does not hold the others).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a socket that refuses connections is tried again (a driver binds its socket a
/// moment before it serves on it), and how many times.
const CONNECT_RETRY: Duration = Duration::from_millis(200);
const CONNECT_ATTEMPTS: u32 = 25;

/// Whether a plugin's supported versions include a CSI 1.x (`1.0.0`, `v1.2`, ...).
pub fn supports_v1(versions: &[String]) -> bool {
    versions.iter().any(|v| {
        let v = v.trim().trim_start_matches('v');
        v.split('.').next() == Some("1")
    })
}

#[derive(Debug)]
enum Seen {
    Created(PathBuf),
    Removed(PathBuf),
}

fn is_socket_name(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "sock")
}

/// Watches the registration directory until `stop`. Sockets present at start are registered
/// first (a restarted agent finds its drivers' sockets in place).
pub async fn run(
    client: Client,
    node: NodeName,
    layout: Layout,
    drivers: Drivers,
    stop: CancellationToken,
) {
    let dir = layout.plugins_registry_dir();
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::create_dir_all(layout.plugins_dir()))
    {
        warn!(dir = %dir.display(), error = %e, "creating the plugin directories failed");
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let events = tx.clone();
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else { return };
        for p in ev.paths.into_iter().filter(|p| is_socket_name(p)) {
            let seen = match ev.kind {
                notify::EventKind::Create(_) => Seen::Created(p),
                notify::EventKind::Remove(_) => Seen::Removed(p),
                notify::EventKind::Modify(notify::event::ModifyKind::Name(_)) => {
                    if p.exists() {
                        Seen::Created(p)
                    } else {
                        Seen::Removed(p)
                    }
                }
                _ => continue,
            };
            let _ = events.send(seen);
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "starting the plugin watcher failed");
            return;
        }
    };
    use notify::Watcher as _;
    if let Err(e) = watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
        warn!(dir = %dir.display(), error = %e, "watching the plugin registry failed");
        return;
    }
    // After the watch is set up: a socket created meanwhile is seen twice, never missed.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if is_socket_name(&e.path()) {
                let _ = tx.send(Seen::Created(e.path()));
            }
        }
    }
    ensure_csi_node(&client, &node).await;
    let mut watch = PluginWatch {
        client,
        node,
        layout,
        drivers,
        sockets: HashMap::new(),
    };
    info!(dir = %dir.display(), "plugin watcher running");
    loop {
        let seen = tokio::select! {
            s = rx.recv() => s,
            _ = stop.cancelled() => break,
        };
        let Some(seen) = seen else { break };
        match seen {
            Seen::Created(p) => watch.register(&p).await,
            Seen::Removed(p) => watch.deregister(&p).await,
        }
    }
    drop(watcher);
}

struct PluginWatch {
    client: Client,
    node: NodeName,
    layout: Layout,
    drivers: Drivers,
    /// Registration socket -> the driver registered through it.
    sockets: HashMap<PathBuf, String>,
}

/// A failed registration: what the plugin is told.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RegistrationError(String);

async fn timed<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, RegistrationError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(s)) => Err(RegistrationError(format!(
            "{what}: rpc error: code = {:?} desc = {}",
            s.code(),
            s.message()
        ))),
        Err(_) => Err(RegistrationError(format!("{what}: timed out"))),
    }
}

impl PluginWatch {
    async fn register(&mut self, socket: &Path) {
        if self.sockets.contains_key(socket) {
            // Re-created: the old registration goes first.
            self.deregister(socket).await;
        }
        let mut registration =
            reg::registration_client::RegistrationClient::new(unix_channel(socket));
        let info = match get_info(&mut registration).await {
            Ok(i) => i,
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "a plugin socket does not answer GetInfo");
                return;
            }
        };
        let outcome = self.admit(socket, &info).await;
        let status = match &outcome {
            Ok(()) => reg::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            },
            Err(e) => {
                warn!(plugin = %info.name, socket = %socket.display(), error = %e, "plugin registration failed");
                reg::RegistrationStatus {
                    plugin_registered: false,
                    error: e.to_string(),
                }
            }
        };
        if let Err(e) = timed(
            "NotifyRegistrationStatus",
            registration.notify_registration_status(status),
        )
        .await
        {
            warn!(plugin = %info.name, error = %e, "telling the plugin its registration status failed");
        }
    }

    /// Validates the plugin, connects to its driver and records it on the node.
    async fn admit(
        &mut self,
        socket: &Path,
        info: &reg::PluginInfo,
    ) -> Result<(), RegistrationError> {
        if info.r#type != CSI_PLUGIN_TYPE {
            return Err(RegistrationError(format!(
                "plugin type {:?} is not supported (only {CSI_PLUGIN_TYPE})",
                info.r#type
            )));
        }
        if info.name.is_empty() {
            return Err(RegistrationError("the plugin has no name".into()));
        }
        if !supports_v1(&info.supported_versions) {
            return Err(RegistrationError(format!(
                "none of the versions {:?} of plugin {} is supported (CSI 1.x)",
                info.supported_versions, info.name
            )));
        }
        let endpoint = if info.endpoint.is_empty() {
            socket.to_path_buf()
        } else {
            self.layout.host_path(Path::new(&info.endpoint))
        };
        let channel = unix_channel(&endpoint);
        let mut node = csi::node_client::NodeClient::new(channel);
        let got = timed(
            "NodeGetInfo",
            node.node_get_info(csi::NodeGetInfoRequest {}),
        )
        .await?
        .into_inner();
        if got.node_id.is_empty() {
            return Err(RegistrationError(format!(
                "driver {} returned an empty node id",
                info.name
            )));
        }
        let caps = timed(
            "NodeGetCapabilities",
            node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
        )
        .await?
        .into_inner();
        let has = |t: csi::node_service_capability::rpc::Type| {
            caps.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(r)) if r.r#type == t as i32)
            })
        };
        let segments = got
            .accessible_topology
            .map(|t| t.segments)
            .unwrap_or_default();
        label_node(&self.client, &self.node, &segments)
            .await
            .map_err(|e| RegistrationError(format!("labelling node {}: {e}", self.node)))?;
        let mut keys: Vec<String> = segments.keys().cloned().collect();
        keys.sort();
        let entry = CSINodeDriver {
            name: info.name.clone(),
            node_id: got.node_id.clone(),
            topology_keys: (!keys.is_empty()).then_some(keys),
            allocatable: (got.max_volumes_per_node > 0).then_some(VolumeNodeResources {
                count: Some(got.max_volumes_per_node as i32),
            }),
        };
        set_csi_node_driver(&self.client, &self.node, &info.name, Some(entry))
            .await
            .map_err(|e| RegistrationError(format!("updating CSINode {}: {e}", self.node)))?;
        let driver = Driver {
            name: info.name.clone(),
            endpoint: endpoint.clone(),
            node_id: got.node_id,
            stage_unstage: has(csi::node_service_capability::rpc::Type::StageUnstageVolume),
            volume_stats: has(csi::node_service_capability::rpc::Type::GetVolumeStats),
            expand_volume: has(csi::node_service_capability::rpc::Type::ExpandVolume),
            node,
        };
        info!(driver = ?driver, socket = %socket.display(), "CSI driver registered");
        self.drivers.insert(driver);
        self.sockets.insert(socket.to_path_buf(), info.name.clone());
        Ok(())
    }

    async fn deregister(&mut self, socket: &Path) {
        let Some(name) = self.sockets.remove(socket) else {
            return;
        };
        // Another socket may have registered the same driver since: it stays.
        if self.sockets.values().any(|n| *n == name) {
            return;
        }
        self.drivers.remove(&name);
        info!(driver = %name, socket = %socket.display(), "CSI driver deregistered");
        if let Err(e) = set_csi_node_driver(&self.client, &self.node, &name, None).await {
            warn!(driver = %name, error = %e, "removing the driver from CSINode failed");
        }
    }
}

/// GetInfo, tried again while the socket refuses connections (bound, not yet served).
async fn get_info(
    client: &mut reg::registration_client::RegistrationClient<tonic::transport::Channel>,
) -> Result<reg::PluginInfo, RegistrationError> {
    let mut last = None;
    for _ in 0..CONNECT_ATTEMPTS {
        match tokio::time::timeout(CALL_TIMEOUT, client.get_info(reg::InfoRequest {})).await {
            Ok(Ok(info)) => return Ok(info.into_inner()),
            Ok(Err(s)) if s.code() == tonic::Code::Unavailable => {
                last = Some(s.message().to_string())
            }
            Ok(Err(s)) => return Err(RegistrationError(format!("GetInfo: {}", s.message()))),
            Err(_) => return Err(RegistrationError("GetInfo: timed out".into())),
        }
        tokio::time::sleep(CONNECT_RETRY).await;
    }
    Err(RegistrationError(format!(
        "GetInfo: {}",
        last.unwrap_or_else(|| "unavailable".into())
    )))
}

/// The driver's topology segment as labels of the Node (added or changed, never removed).
async fn label_node(
    client: &Client,
    node: &NodeName,
    segments: &HashMap<String, String>,
) -> kube::Result<()> {
    if segments.is_empty() {
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"labels": segments}});
    nodes
        .patch(
            node.as_str(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
}

/// Creates CSINode `<node>` (owned by its Node) when there is none, as the kubelet does at
/// start, so controllers see the node's CSI state even before a driver registers.
async fn ensure_csi_node(client: &Client, node: &NodeName) {
    let api: Api<CSINode> = Api::all(client.clone());
    match api.get_opt(node.as_str()).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            if let Err(e) = create_csi_node(client, node, Vec::new()).await {
                warn!(error = %e, "creating CSINode failed");
            }
        }
        Err(e) => warn!(error = %e, "reading CSINode failed"),
    }
}

async fn create_csi_node(
    client: &Client,
    node: &NodeName,
    drivers: Vec<CSINodeDriver>,
) -> kube::Result<CSINode> {
    let nodes: Api<Node> = Api::all(client.clone());
    let owner = nodes.get(node.as_str()).await?;
    let csinode = CSINode {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: owner.metadata.uid.unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: CSINodeSpec { drivers },
    };
    Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await
}

/// Sets (Some) or removes (None) driver `name`'s entry in CSINode `<node>`; read, change,
/// replace with its resourceVersion, again on a conflict.
async fn set_csi_node_driver(
    client: &Client,
    node: &NodeName,
    name: &str,
    entry: Option<CSINodeDriver>,
) -> kube::Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match api.get_opt(node.as_str()).await? {
            None => match entry.clone() {
                None => return Ok(()),
                Some(e) => create_csi_node(client, node, vec![e]).await.map(|_| ()),
            },
            Some(mut current) => {
                let before = current.spec.drivers.clone();
                current.spec.drivers.retain(|d| d.name != name);
                if let Some(e) = entry.clone() {
                    current.spec.drivers.push(e);
                    current.spec.drivers.sort_by(|a, b| a.name.cmp(&b.name));
                }
                if current.spec.drivers == before {
                    return Ok(());
                }
                api.replace(node.as_str(), &PostParams::default(), &current)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Err(kube::Error::Api(s)) if (s.code == 409) && attempt < 5 => continue,
            other => return other,
        }
    }
}
