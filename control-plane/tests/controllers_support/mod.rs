//! Fixtures for the controller tests: a real in-process API server, the controllers
//! in-process (or as processes), and, since these tests run no node agent, nodes played
//! through the API the way a node agent plays them: Node objects with Ready conditions,
//! Leases renewed every 500 ms, pods bound to them reported Running and Ready with a pod IP,
//! and graceful deletions finished. A node can be stopped (it stops renewing and reporting)
//! and started again.
//!
//! Pods are bound by the real scheduler (`control_plane::scheduler::run`), in-process too.
//!
//! Every component acts with its own identity, as in a cluster: the controllers as
//! `system:kube-controller-manager`, the scheduler as `system:kube-scheduler` (the kubeconfigs
//! the server writes), each played node as `system:node:<name>` with a client certificate
//! from the cluster CA, so the tests pass only if RBAC and the Node authorizer let each do
//! its work. The test's own client is the admin.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use control_plane::apiserver::{Config, RunningServer, Server};
use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
use control_plane::controllers::{ControllerName, Settings};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Pod, PodCondition, PodIP,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A pod annotation that keeps the stand-in node agent from reporting the pod Ready.
pub const NEVER_READY: &str = "skiff.test/never-ready";

/// A pod annotation: once Running, the stand-in node agent reports its containers exited
/// with this code, as a kubelet would: under restartPolicy Never (and OnFailure with 0) the
/// pod ends Succeeded or Failed; under OnFailure with another code the containers restart,
/// the restart count growing every 200 ms.
pub const EXIT_CODE: &str = "skiff.test/exit-code";

pub struct Cluster {
    server: Option<RunningServer>,
    /// The admin's (system:masters).
    pub client: Client,
    controllers_client: Client,
    scheduler_client: Client,
    pub dir: tempfile::TempDir,
    pub nodes: Option<Nodes>,
    controllers: Option<(ControllerManager, CancellationToken)>,
    scheduler: Option<(tokio::task::JoinHandle<()>, CancellationToken)>,
}

/// Settings for fast tests: short node grace period and monitor period.
pub fn fast_settings() -> Settings {
    Settings {
        node_monitor_period: Duration::from_millis(500),
        node_monitor_grace_period: Duration::from_secs(3),
        eviction_rates: control_plane::controllers::disruption::Rates {
            node_eviction_rate: 1000.0,
            ..Default::default()
        },
        ..Settings::default()
    }
}

pub async fn client_for(server: &RunningServer) -> Client {
    control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .expect("a client for the test server")
}

/// A client with the identity of a component the server wrote a kubeconfig for
/// (`CONTROLLER_MANAGER_KUBECONFIG`, `SCHEDULER_KUBECONFIG`).
pub async fn component_client(server: &RunningServer, file: &str) -> Client {
    control_plane::runtime::client::from_kubeconfig(&server.component_kubeconfig(file))
        .await
        .expect("a component's client")
}

/// Where played nodes get their identities: the control plane's data directory (its CA)
/// and the admin kubeconfig (the server's URL).
#[derive(Clone)]
pub struct NodeCredentials {
    pub data_dir: PathBuf,
    pub admin_kubeconfig: PathBuf,
}

impl NodeCredentials {
    pub fn of(server: &RunningServer) -> NodeCredentials {
        NodeCredentials {
            data_dir: server.data_dir().to_path_buf(),
            admin_kubeconfig: server.kubeconfig_path().to_path_buf(),
        }
    }

    /// A client as `system:node:<name>` in `system:nodes`: a certificate from the cluster
    /// CA, as a node agent holds once its client CSR is signed.
    pub async fn client(&self, name: &str) -> Client {
        use control_plane::apiserver::kubeconfig::{self, Credentials};
        use control_plane::pki::{Ca, CertSpec};
        let pki = control_plane::apiserver::certs::pki_dir(&self.data_dir);
        let ca = Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).expect("the cluster CA");
        let user = format!("system:node:{name}");
        let issued = ca
            .issue(&CertSpec::client(
                &user,
                Some("system:nodes"),
                Duration::from_secs(24 * 3600),
            ))
            .expect("a node certificate");
        let admin = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)
            .expect("the admin kubeconfig");
        let server = admin
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .expect("a server in the admin kubeconfig");
        let path = self.data_dir.join(format!("node-{name}.kubeconfig"));
        kubeconfig::write(
            &path,
            &server,
            ca.cert_pem(),
            &user,
            &Credentials::Certificate(issued),
        )
        .expect("writing the node's kubeconfig");
        control_plane::runtime::client::from_kubeconfig(&path)
            .await
            .expect("a node's client")
    }
}

impl Cluster {
    /// An API server alone. Logs go to the test output when RUST_LOG is set.
    pub async fn api_only() -> Cluster {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
        let server = Server::start(config).await.unwrap();
        let client = client_for(&server).await;
        let controllers_client = component_client(
            &server,
            control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG,
        )
        .await;
        let scheduler_client =
            component_client(&server, control_plane::apiserver::SCHEDULER_KUBECONFIG).await;
        Cluster {
            server: Some(server),
            client,
            controllers_client,
            scheduler_client,
            dir,
            nodes: None,
            controllers: None,
            scheduler: None,
        }
    }

    /// An API server, the controllers with `settings`, `nodes` played nodes, and the
    /// scheduler.
    pub async fn start(settings: Settings, nodes: &[&str]) -> Cluster {
        let mut c = Cluster::api_only().await;
        if !nodes.is_empty() {
            c.nodes = Some(Nodes::start(c.client.clone(), &c.node_credentials(), nodes).await);
        }
        c.start_scheduler();
        c.start_controllers(settings).await;
        c
    }

    pub async fn start_controllers(&mut self, settings: Settings) {
        let token = CancellationToken::new();
        let config = ManagerConfig {
            settings,
            leader_election: None,
            ops_listen: Some("127.0.0.1:0".parse().unwrap()),
        };
        let m = ControllerManager::start(self.controllers_client.clone(), config, token.clone())
            .await
            .unwrap();
        self.controllers = Some((m, token));
    }

    pub async fn stop_controllers(&mut self) {
        if let Some((m, token)) = self.controllers.take() {
            token.cancel();
            m.stopped().await;
        }
    }

    pub fn controllers(&self) -> &ControllerManager {
        &self.controllers.as_ref().expect("controllers running").0
    }

    pub fn start_scheduler(&mut self) {
        self.start_scheduler_with(control_plane::scheduler::Config::default());
    }

    /// The scheduler with `config` (a test keeps a clone of `config.metrics` to read them).
    pub fn start_scheduler_with(&mut self, config: control_plane::scheduler::Config) {
        let token = CancellationToken::new();
        let (client, t) = (self.scheduler_client.clone(), token.clone());
        let task = tokio::spawn(async move {
            control_plane::scheduler::run(client, config, t)
                .await
                .expect("the scheduler runs");
        });
        self.scheduler = Some((task, token));
    }

    pub async fn stop_scheduler(&mut self) {
        if let Some((task, token)) = self.scheduler.take() {
            token.cancel();
            let _ = task.await;
        }
    }

    pub fn server(&self) -> &RunningServer {
        self.server.as_ref().expect("the server runs")
    }

    pub fn node_credentials(&self) -> NodeCredentials {
        NodeCredentials::of(self.server())
    }

    pub fn nodes(&self) -> &Nodes {
        self.nodes.as_ref().expect("nodes started")
    }

    pub fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    pub async fn shutdown(mut self) {
        self.stop_controllers().await;
        self.stop_scheduler().await;
        if let Some(n) = self.nodes.take() {
            n.stop_all();
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

impl Drop for Cluster {
    /// A test that panics never reaches `shutdown`: stop what runs on threads of its own
    /// (the scheduler's loop), or the runtime would wait for it forever.
    fn drop(&mut self) {
        if let Some((_, token)) = &self.controllers {
            token.cancel();
        }
        if let Some((_, token)) = &self.scheduler {
            token.cancel();
        }
    }
}

/// Played nodes, each with its own identity.
pub struct Nodes {
    /// The admin's, for what the test (not a node) does.
    admin: Client,
    /// Each node's own.
    clients: HashMap<String, Client>,
    names: Vec<String>,
    stopped: Arc<Mutex<HashSet<String>>>,
    token: CancellationToken,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

fn node_object(name: &str, index: usize) -> Node {
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), Quantity("4".into()));
    capacity.insert("memory".to_string(), Quantity("8Gi".into()));
    capacity.insert("pods".to_string(), Quantity("110".into()));
    capacity.insert("ephemeral-storage".to_string(), Quantity("100Gi".into()));
    let now = Time(Timestamp::now());
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [
                    ("kubernetes.io/hostname".to_string(), name.to_string()),
                    ("kubernetes.io/os".to_string(), "linux".to_string()),
                    (
                        "topology.kubernetes.io/zone".to_string(),
                        format!("zone-{}", index % 2),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            capacity: Some(capacity.clone()),
            allocatable: Some(capacity),
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: format!("192.0.2.{}", index + 1),
            }]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                message: Some("kubelet is posting ready status".into()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(now),
            }]),
            ..Default::default()
        }),
    }
}

async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = api.create(&PostParams::default(), &ns).await;
}

impl Nodes {
    pub async fn start(admin: Client, credentials: &NodeCredentials, names: &[&str]) -> Nodes {
        ensure_namespace(&admin, "kube-node-lease").await;
        let mut clients = HashMap::new();
        for name in names {
            clients.insert(name.to_string(), credentials.client(name).await);
        }
        let nodes = Nodes {
            admin,
            clients,
            names: names.iter().map(|s| s.to_string()).collect(),
            stopped: Arc::default(),
            token: CancellationToken::new(),
        };
        for (index, name) in nodes.names.iter().enumerate() {
            nodes.register(name).await;
            let client = nodes.client(name);
            tokio::spawn(renew_lease(
                client.clone(),
                name.clone(),
                nodes.stopped.clone(),
                nodes.token.clone(),
            ));
            tokio::spawn(run_pods(
                client,
                name.clone(),
                index,
                nodes.stopped.clone(),
                nodes.token.clone(),
            ));
        }
        nodes
    }

    /// The client of node `name`.
    fn client(&self, name: &str) -> Client {
        self.clients
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not a played node"))
    }

    async fn register(&self, name: &str) {
        let index = self.names.iter().position(|n| n == name).unwrap_or(0);
        let api: Api<Node> = Api::all(self.client(name));
        api.create(&PostParams::default(), &node_object(name, index))
            .await
            .unwrap();
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The node agent of `name` stops: no more Lease renewals, status or pod handling.
    pub fn stop(&self, name: &str) {
        self.stopped.lock().unwrap().insert(name.to_string());
    }

    /// It comes back, reports Ready again and, like a restarted node agent, finishes the
    /// deletions of its pods that happened while it was away.
    pub async fn resume(&self, name: &str) {
        self.stopped.lock().unwrap().remove(name);
        let client = self.client(name);
        let pods: Api<Pod> = Api::all(client.clone());
        let mine = pods
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={name}")))
            .await
            .unwrap();
        for p in mine
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
        {
            let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace().unwrap_or_default());
            let _ = api
                .delete(&p.name_any(), &DeleteParams::default().grace_period(0))
                .await;
        }
        let api: Api<Node> = Api::all(client);
        let now = Time(Timestamp::now());
        let patch = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub fn stop_all(&self) {
        self.token.cancel();
    }

    /// Sets a pod's Ready condition, as its node's agent would after a readiness probe.
    pub async fn set_ready(&self, ns: &str, pod: &str, ready: bool) {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), ns);
        let node = api
            .get(pod)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .expect("the pod is bound");
        set_ready(&self.client(&node), ns, pod, ready).await;
    }
}

pub async fn set_ready(client: &Client, ns: &str, pod: &str, ready: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut p = api.get(pod).await.unwrap();
    let now = Time(Timestamp::now());
    let status = if ready { "True" } else { "False" };
    if let Some(cs) = p.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        for c in cs
            .iter_mut()
            .filter(|c| c.type_ == "Ready" || c.type_ == "ContainersReady")
        {
            if c.status != status {
                c.status = status.into();
                c.last_transition_time = Some(now.clone());
            }
        }
    }
    api.replace_status(pod, &PostParams::default(), &p)
        .await
        .unwrap();
}

/// Renews node `name`'s Lease every 500 ms while it is up.
async fn renew_lease(
    client: Client,
    name: String,
    stopped: Arc<Mutex<HashSet<String>>>,
    token: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        if !stopped.lock().unwrap().contains(&name) {
            let spec = LeaseSpec {
                holder_identity: Some(name.clone()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            };
            match api.get_opt(&name).await {
                Ok(Some(mut lease)) => {
                    lease.spec = Some(spec);
                    let _ = api.replace(&name, &PostParams::default(), &lease).await;
                }
                Ok(None) => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        spec: Some(spec),
                    };
                    let _ = api.create(&PostParams::default(), &lease).await;
                }
                Err(_) => {}
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Reports the pods bound to node `node` Running (and Ready unless annotated otherwise) and
/// finishes their graceful deletions while it is up; it watches only its own pods, as a
/// node may.
async fn run_pods(
    client: Client,
    node: String,
    index: usize,
    stopped: Arc<Mutex<HashSet<String>>>,
    token: CancellationToken,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut next_ip = 1u32;
    let mine = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = watcher(pods, mine).default_backoff().applied_objects();
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::select! {
            _ = token.cancelled() => return,
            n = stream.next() => n,
        };
        let Some(Ok(pod)) = next else { continue };
        if stopped.lock().unwrap().contains(&node) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            let _ = api
                .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                .await;
            continue;
        }
        let started = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_ref())
            .is_some();
        if started {
            if let Some(code) = pod
                .annotations()
                .get(EXIT_CODE)
                .and_then(|c| c.parse().ok())
            {
                exit(&api, &pod, code).await;
            }
            continue;
        }
        next_ip += 1;
        let ip = format!("10.{}.{}.{}", 200 + index, next_ip / 250, next_ip % 250 + 1);
        let ready = !pod.annotations().contains_key(NEVER_READY);
        let now = Time(Timestamp::now());
        let cond = |t: &str, ok: bool| PodCondition {
            type_: t.into(),
            status: if ok { "True" } else { "False" }.into(),
            last_transition_time: Some(now.clone()),
            ..Default::default()
        };
        let mut p = pod.clone();
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip }]),
            host_ip: Some(format!("192.0.2.{}", index + 1)),
            start_time: Some(now.clone()),
            conditions: Some(vec![
                cond("PodScheduled", true),
                cond("Initialized", true),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ]),
            ..Default::default()
        });
        let _ = api
            .replace_status(&pod.name_any(), &PostParams::default(), &p)
            .await;
    }
}

/// Reports a running pod's containers exited with `code` (see [`EXIT_CODE`]).
async fn exit(api: &Api<Pod>, pod: &Pod, code: i32) {
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref() != Some("Running") {
        return;
    }
    let restart = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_default();
    let restarts = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count);
    let now = Time(Timestamp::now());
    let terminated = json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": now, "finishedAt": now}});
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let patch = if code != 0 && restart == "OnFailure" {
        // The kubelet restarts the container: the pod stays Running, its count grows.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let statuses: Vec<_> = names
            .iter()
            .map(|n| {
                json!({"name": n, "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts + 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": terminated})
            })
            .collect();
        json!({"status": {"containerStatuses": statuses}})
    } else {
        let statuses: Vec<_> = names
            .iter()
            .map(|n| {
                json!({"name": n, "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts, "state": terminated})
            })
            .collect();
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        json!({"status": {"phase": phase, "containerStatuses": statuses, "conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": now, "reason": "PodCompleted"},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": now, "reason": "PodCompleted"}]}})
    };
    let _ = api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await;
}

/// Names of the controllers, for settings that leave some out.
pub fn without(names: &[ControllerName]) -> Settings {
    let mut s = fast_settings();
    for n in names {
        s.enabled.remove(n);
    }
    s
}

/// A `control-plane` process of a test, killed on Drop; its output (the logs) in a file.
pub struct Process {
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl Process {
    pub fn spawn(args: &[&str], log: &std::path::Path) -> Process {
        let file = std::fs::File::create(log).expect("creating the process log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_control-plane"))
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            // The logs go to stdout (tracing's default writer); panics to stderr.
            .stdout(file.try_clone().expect("cloning the log file"))
            .stderr(file)
            .spawn()
            .expect("starting control-plane");
        Process {
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The log so far, without terminal colour codes.
    pub fn log(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The value of `field=` on the first log line containing `message`, once logged.
    pub async fn wait_log_field(&self, message: &str, field: &str) -> String {
        skiff_tests::wait_until_async(
            &format!("{message:?} in the log"),
            Duration::from_secs(60),
            || async {
                let log = self.log();
                log.lines()
                    .find(|l| l.contains(message))
                    .and_then(|l| {
                        l.split_whitespace()
                            .find_map(|w| w.strip_prefix(&format!("{field}=")).map(str::to_string))
                    })
                    .ok_or_else(|| log.lines().rev().take(5).collect::<Vec<_>>().join("\n"))
            },
        )
        .await
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for the exit; true if it exited successfully.
    pub async fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let status =
            skiff_tests::wait_until_async("the process to exit", Duration::from_secs(30), || {
                let r = c
                    .try_wait()
                    .map_err(|e| e.to_string())
                    .and_then(|s| s.ok_or_else(|| "running".to_string()));
                async move { r }
            })
            .await;
        status.success()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// GET `path` from `addr` over plain HTTP/1.0; the body.
pub async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = buf.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    Ok(body.to_string())
}

/// The value of a metric line (`name{labels} value`) in Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

/// A Deployment of `replicas` nginx pods labelled `app: <name>`.
pub fn deployment(name: &str, replicas: i32) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    }))
    .unwrap()
}
