//! The node agent: registers its Node, renews its Lease, watches the pods bound to it and
//! runs them through its pod workers, caches Services for their containers' variables,
//! routes to other nodes' pods, and serves the kubelet API.
//! Everything it knows comes from watches on the API server; everything it says goes back
//! through the API.

mod events;
mod node_status;
pub mod pods;
pub mod pressure;
mod report;
mod routes;
mod services;

use crate::cni::{self, Cidr};
use crate::containerd::{Containerd, ContainerdError, RuntimeSettings};
use crate::cri::Cri;
use crate::layout::Layout;
use crate::metrics::Metrics;
use crate::names::NodeName;
use crate::pod::{NodeContext, Timing};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use kube::{Api, Client};
use node_status::NodeFacts;
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use node_status::LEASE_NAMESPACE;

/// How an agent is set up.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: NodeName,
    pub data_dir: PathBuf,
    /// Use this runtime instead of starting a containerd of our own.
    pub cri_socket: Option<PathBuf>,
    /// The node's InternalIP (default: the first global IPv4 address here, else 127.0.0.1).
    pub node_ip: Option<Ipv4Addr>,
    /// The kubelet API, /healthz and /metrics (HTTPS).
    pub listen: SocketAddr,
    /// The API's serving certificate and the CA of its clients' certificates.
    pub api_tls: crate::server::ApiTls,
    pub runtime: RuntimeSettings,
    pub timing: Timing,
    pub lease_interval: Duration,
    pub lease_duration_secs: i32,
    pub status_interval: Duration,
    /// Hard eviction thresholds that raise the Memory/Disk/PID pressure conditions.
    pub eviction_hard: pressure::Thresholds,
    /// How often the machine is sampled for them (the kubelet's housekeeping: 10 s).
    pub pressure_interval: Duration,
    /// The pods' DNS: cluster DNS servers and domain, the host's resolv.conf.
    pub dns: crate::pod::dns::DnsSettings,
    /// How often CPU and memory are read from cgroups for /stats/summary and
    /// /metrics/resource (the kubelet's housekeeping: 10 s).
    pub stats_interval: Duration,
    /// How often NodeGetVolumeStats is asked for every published CSI volume (the kubelet's
    /// volume stats period: 1 min).
    pub volume_stats_interval: Duration,
}

impl AgentConfig {
    /// Kubernetes' defaults: Lease every 10 s (40 s duration), status at least every minute.
    pub fn new(
        name: NodeName,
        data_dir: impl Into<PathBuf>,
        runtime: RuntimeSettings,
        api_tls: crate::server::ApiTls,
    ) -> AgentConfig {
        AgentConfig {
            name,
            data_dir: data_dir.into(),
            cri_socket: None,
            node_ip: None,
            listen: SocketAddr::from(([0, 0, 0, 0], 10250)),
            api_tls,
            runtime,
            timing: Timing::default(),
            lease_interval: Duration::from_secs(10),
            lease_duration_secs: 40,
            status_interval: Duration::from_secs(60),
            eviction_hard: pressure::Thresholds::default(),
            pressure_interval: Duration::from_secs(10),
            stats_interval: Duration::from_secs(10),
            volume_stats_interval: Duration::from_secs(60),
            dns: crate::pod::dns::DnsSettings {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Runtime(#[from] ContainerdError),
    #[error("the runtime does not answer: {0}")]
    Cri(#[from] crate::cri::CriError),
    #[error("registering the node: {0}")]
    Register(#[source] kube::Error),
    #[error("the API's TLS configuration: {0}")]
    Tls(#[from] control_plane::pki::PkiError),
    #[error("making the root dir a shared mount: {0}")]
    RootDir(#[source] std::io::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running agent.
pub struct RunningAgent {
    addr: SocketAddr,
    name: NodeName,
    layout: Layout,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    pods: Arc<tokio::sync::Mutex<pods::Pods>>,
    routes: Arc<Mutex<routes::Routes>>,
    containerd: Option<Containerd>,
    cri: Cri,
    metrics: Arc<Metrics>,
}

/// The node's address when none is configured: its first global IPv4 address, else loopback.
fn default_ip() -> Ipv4Addr {
    let found = crate::netlink::Netlink::open()
        .map_err(|e| e.to_string())
        .and_then(|mut nl| nl.first_global_ipv4().map_err(|e| e.to_string()));
    match found {
        Ok(Some(ip)) => ip,
        Ok(None) => Ipv4Addr::LOCALHOST,
        Err(e) => {
            warn!(error = %e, "finding the node's address");
            Ipv4Addr::LOCALHOST
        }
    }
}

fn pod_cidr(node: &Node) -> Option<Cidr> {
    node.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()
}

impl RunningAgent {
    /// Starts the runtime (unless given one), registers the node and starts every loop.
    pub async fn start(config: AgentConfig, client: Client) -> Result<RunningAgent, AgentError> {
        let layout = Layout::new(&config.data_dir);
        // Mounts drivers make under the root dir reach the pods (kubelet: rshared root dir).
        crate::csi::make_root_shared(layout.root()).map_err(AgentError::RootDir)?;
        let (containerd, cri) = match &config.cri_socket {
            Some(socket) => (None, Cri::new(socket)),
            None => {
                let c = Containerd::start(layout.clone(), &config.runtime).await?;
                let cri = c.cri();
                (Some(c), cri)
            }
        };
        let version = cri.version().await?;
        // Bad TLS material fails the start, before anything is registered.
        let (tls, clients) = config.api_tls.server()?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| AgentError::Listen {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| AgentError::Listen {
            addr: config.listen,
            source,
        })?;
        let ip = config.node_ip.unwrap_or_else(default_ip);
        let mut facts = NodeFacts {
            name: config.name.clone(),
            ip: ip.to_string(),
            runtime_version: format!("{}://{}", version.runtime_name, version.runtime_version),
            kubelet_port: addr.port(),
            network_unavailable: Some("network not ready: no podCIDR assigned".into()),
            pressure: pressure::evaluate(&config.eviction_hard, &pressure::observe(layout.root())),
        };
        let node = node_status::register(&client, &facts)
            .await
            .map_err(AgentError::Register)?;
        if let Some(cidr) = pod_cidr(&node) {
            configure_network(&layout, &config.name, cidr, &mut facts);
        }
        let node = node_status::update_status(&client, &facts, Some(&node))
            .await
            .map_err(AgentError::Register)?;
        info!(node = %config.name, ip = %ip, runtime = %facts.runtime_version, "node registered");

        let metrics = Arc::new(Metrics::default());
        let starts = Arc::new(report::StartTimes::default());
        let reporter = report::start(
            client.clone(),
            config.name.clone(),
            metrics.clone(),
            starts.clone(),
        );
        let services = services::ServiceCache::default();
        let shutdown = CancellationToken::new();
        let drivers = crate::csi::Drivers::default();
        let csi = Arc::new(
            crate::csi::CsiVolumes::new(
                layout.clone(),
                drivers.clone(),
                metrics.clone(),
                shutdown.clone(),
            )
            .with_api(client.clone(), config.name.to_string()),
        );
        // Before any pod worker: what is published stays published (restart takeover).
        csi.rebuild();
        let ctx = Arc::new(NodeContext {
            node: config.name.clone(),
            layout: layout.clone(),
            cri: cri.clone(),
            host_ip: Some(ip.to_string()),
            objects: Arc::new(report::ApiObjects {
                client: client.clone(),
                services: services.clone(),
            }),
            reporter: Arc::new(reporter),
            timing: config.timing.clone(),
            dns: config.dns.clone(),
            csi: Some(csi.clone()),
        });
        let index: pods::PodIndex = Default::default();
        let pods = Arc::new(tokio::sync::Mutex::new(pods::Pods::new(
            ctx,
            index.clone(),
            metrics.clone(),
            starts,
        )));
        let routes = Arc::new(Mutex::new(routes::Routes::new(
            config.name.clone(),
            Some(ip),
        )));
        let (facts_tx, facts_rx) = watch::channel(facts);

        let gate =
            crate::api_auth::Gate::new(config.name.to_string(), client.clone(), metrics.clone());
        let stats = crate::stats::StatsCache::default();
        let sampler = crate::stats::Sampler::new(
            crate::stats::CgroupFs::detect(),
            config.name.clone(),
            index.clone(),
        );
        let app = crate::server::router(
            crate::server::ApiState {
                metrics: metrics.clone(),
                pods: index,
                layout: layout.clone(),
                cri: cri.clone(),
                stats: stats.clone(),
            },
            gate,
        );
        let mut tasks = vec![tokio::spawn(crate::server::serve(
            listener,
            app,
            tls,
            clients,
            shutdown.clone(),
        ))];
        tasks.push(tokio::spawn(crate::stats::run(
            sampler,
            stats,
            config.stats_interval,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(crate::csi::plugins::run(
            client.clone(),
            config.name.clone(),
            layout.clone(),
            drivers,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(csi.stats_loop(config.volume_stats_interval)));
        tasks.push(tokio::spawn(lease_loop(
            client.clone(),
            node.clone(),
            config.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(status_loop(
            client.clone(),
            node.clone(),
            facts_rx,
            config.status_interval,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(pressure_loop(
            layout.root().to_path_buf(),
            config.eviction_hard.clone(),
            config.pressure_interval,
            facts_tx.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(node_watch(
            client.clone(),
            layout.clone(),
            config.name.clone(),
            facts_tx,
            routes.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(
            services.watch(client.clone(), shutdown.clone()),
        ));
        tasks.push(tokio::spawn(pod_watch(
            client,
            config.name.clone(),
            pods.clone(),
            shutdown.clone(),
        )));
        info!(node = %config.name, %addr, "node agent running");
        Ok(RunningAgent {
            addr,
            name: config.name,
            layout,
            shutdown,
            tasks,
            pods,
            routes,
            containerd,
            cri,
            metrics,
        })
    }

    /// The kubelet API address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn cri(&self) -> Cri {
        self.cri.clone()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Stops every loop and the runtime the agent started, removes its routes; pods keep
    /// running (in the runtime's shims) for the next agent to adopt.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        self.pods.lock().await.detach_all();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if let Some(c) = self.containerd.take() {
            c.stop().await;
        }
        info!(node = %self.name, "node agent stopped");
    }

    /// Removes every pod and the node's network from this machine (tests, `xtask down`).
    pub async fn remove_everything(self) {
        remove_all_pods(&self.cri).await;
        let (name, layout) = (self.name.clone(), self.layout.clone());
        self.shutdown().await;
        remove_node_traces(&name, &layout);
    }
}

/// Stops and removes every sandbox (and so every container) the runtime has.
pub async fn remove_all_pods(cri: &Cri) {
    if let Ok(sandboxes) = cri.list_pod_sandboxes(Default::default()).await {
        for s in sandboxes {
            let _ = cri.stop_pod_sandbox(&s.id).await;
            let _ = cri.remove_pod_sandbox(&s.id).await;
        }
    }
}

/// What a node leaves on the machine besides its runtime: its bridge, its cgroups, and
/// its pods' volume directories.
pub fn remove_node_traces(name: &NodeName, layout: &Layout) {
    cni::remove_bridge(name);
    crate::cgroups::remove_tree(&name.cgroup_root());
    crate::pod::volumes::remove_pod_dir(&layout.root().join("pods"));
    // Staged CSI volumes, then the root dir's own bind mount (made shared at start).
    crate::csi::unmount_root(layout.root());
}

/// Removes everything an agent of `name` left under `layout` and on the machine: every
/// sandbox in its containerd (started here for the purpose), its bridge and cgroups.
pub async fn reset(
    name: &NodeName,
    layout: &Layout,
    runtime: &RuntimeSettings,
) -> Result<(), AgentError> {
    let containerd = Containerd::start(layout.clone(), runtime).await?;
    remove_all_pods(&containerd.cri()).await;
    containerd.stop().await;
    remove_node_traces(name, layout);
    Ok(())
}

fn configure_network(layout: &Layout, name: &NodeName, cidr: Cidr, facts: &mut NodeFacts) {
    match cni::write_config(layout, name, cidr) {
        Ok(changed) => {
            if changed {
                info!(node = %name, %cidr, "pod network configured");
            }
            facts.network_unavailable = None;
        }
        Err(e) => warn!(error = %e, "writing the CNI configuration failed"),
    }
}

async fn lease_loop(client: Client, node: Node, config: AgentConfig, stop: CancellationToken) {
    loop {
        if let Err(e) = node_status::renew_lease(&client, &node, config.lease_duration_secs).await {
            warn!(error = %e, "renewing the node lease failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(config.lease_interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn status_loop(
    client: Client,
    mut last: Node,
    mut facts: watch::Receiver<NodeFacts>,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            changed = facts.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
        let f = facts.borrow_and_update().clone();
        match node_status::update_status(&client, &f, Some(&last)).await {
            Ok(written) => last = written,
            Err(e) => warn!(error = %e, "updating the node status failed"),
        }
    }
}

/// Samples the machine every `every`; a pressure condition that changes is written at once.
async fn pressure_loop(
    data_dir: PathBuf,
    thresholds: pressure::Thresholds,
    every: Duration,
    facts: watch::Sender<NodeFacts>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let seen = pressure::observe(&data_dir);
        let now = pressure::evaluate(&thresholds, &seen);
        facts.send_if_modified(|f| {
            if f.pressure == now {
                return false;
            }
            info!(
                memory = now.memory,
                disk = now.disk,
                pid = now.pid,
                ?seen,
                "node pressure changed"
            );
            f.pressure = now;
            true
        });
    }
}

/// Nodes: our own podCIDR configures the pod network; others' give routes to their pods.
async fn node_watch(
    client: Client,
    layout: Layout,
    me: NodeName,
    facts: watch::Sender<NodeFacts>,
    routes: Arc<Mutex<routes::Routes>>,
    stop: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    // The names of a (re)list in progress: at its end, routes of nodes not in it go.
    let mut listed: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = stop.cancelled() => return,
        };
        let Some(event) = event else { return };
        if let Ok(watcher::Event::InitApply(n)) = &event {
            listed.insert(n.metadata.name.clone().unwrap_or_default());
        }
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitDone) => routes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .resync(&std::mem::take(&mut listed)),
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                if n.metadata.name.as_deref() == Some(me.as_str()) {
                    if let Some(cidr) = pod_cidr(&n) {
                        let mut f = facts.borrow().clone();
                        configure_network(&layout, &me, cidr, &mut f);
                        facts.send_if_modified(|old| {
                            let changed = *old != f;
                            *old = f;
                            changed
                        });
                    }
                } else {
                    routes.lock().unwrap_or_else(|e| e.into_inner()).apply(&n);
                }
            }
            Ok(watcher::Event::Delete(n)) => {
                routes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(n.metadata.name.as_deref().unwrap_or_default());
            }
            Err(e) => warn!(error = %e, "node watch"),
        }
    }
}

/// The pods bound to this node, each to its worker.
async fn pod_watch(
    client: Client,
    me: NodeName,
    pods: Arc<tokio::sync::Mutex<pods::Pods>>,
    stop: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={me}"));
    let mut stream = watcher(api, config).boxed();
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = stop.cancelled() => return,
        };
        let Some(event) = event else { return };
        let mut pods = pods.lock().await;
        match event {
            Ok(watcher::Event::Init) => seen.clear(),
            Ok(watcher::Event::InitApply(p)) => {
                seen.insert(p.metadata.uid.clone().unwrap_or_default());
                pods.apply(p);
            }
            Ok(watcher::Event::InitDone) => pods.listed(&seen).await,
            Ok(watcher::Event::Apply(p)) => pods.apply(p),
            Ok(watcher::Event::Delete(p)) => pods.delete(&p),
            Err(e) => warn!(error = %e, "pod watch"),
        }
    }
}
