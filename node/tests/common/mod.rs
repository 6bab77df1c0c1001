//! A real node runtime for tests: a containerd of its own (data dir, socket, cgroup parent,
//! bridge and CNI network all unique to the test), torn down on drop, also on failure.

#![allow(dead_code)] // each test binary uses a different part of the fixture

pub mod cluster;

use node::containerd::{Containerd, RuntimeSettings};
use node::cri::Cri;
use node::layout::Layout;
use node::names::NodeName;
use skiff_tests::registry::{self, PAUSE_IMAGE, REGISTRY};
use skiff_tests::subnet::{self, SubnetLease};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct TestRuntime {
    pub node: NodeName,
    pub layout: Layout,
    pub subnet: SubnetLease,
    pub containerd: Option<Containerd>,
    pub cri: Cri,
    dir: Option<tempfile::TempDir>,
}

impl TestRuntime {
    /// Starts containerd for a node named after `tag` and writes its CNI network.
    pub async fn start(tag: &str) -> TestRuntime {
        registry::require_images();
        static N: AtomicU32 = AtomicU32::new(0);
        let node = NodeName::new(format!(
            "t{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let dir = tempfile::Builder::new()
            .prefix("skn")
            .tempdir_in("/tmp")
            .unwrap();
        let layout = Layout::new(dir.path());
        let subnet = subnet::lease();
        node::cni::write_config(&layout, &node, subnet.cidr().parse().unwrap()).unwrap();
        let containerd = Containerd::start(layout.clone(), &settings())
            .await
            .unwrap();
        let cri = containerd.cri();
        TestRuntime {
            node,
            layout,
            subnet,
            containerd: Some(containerd),
            cri,
            dir: Some(dir),
        }
    }

    async fn teardown(&mut self) {
        node::agent::remove_all_pods(&self.cri).await;
        if let Some(c) = self.containerd.take() {
            c.stop().await;
        }
        node::agent::remove_node_traces(&self.node, &self.layout);
    }
}

pub fn settings() -> RuntimeSettings {
    RuntimeSettings {
        sandbox_image: PAUSE_IMAGE.into(),
        insecure_registries: vec![REGISTRY.into()],
        stream_address: std::net::Ipv4Addr::LOCALHOST.into(),
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        // Tests run on the multi-threaded runtime, so blocking here is allowed.
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(self.teardown()));
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus, Secret, Service};
use node::pod::backoff::BackOffPolicy;
use node::pod::events::PodEvent;
use node::pod::token::IssuedToken;
use node::pod::{NodeContext, Objects, PodHandle, PodRef, PodWorker, Reporter, Timing};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// ConfigMaps, Secrets and Services a test defines, keyed by (namespace, name); tokens
/// issued as `token-<n>-<namespace>-<account>` (the API's TokenRequest is tested against
/// the real API server in tests/tests/e2e.rs), each request kept.
#[derive(Default)]
pub struct TestObjects {
    pub config_maps: Mutex<HashMap<(String, String), ConfigMap>>,
    pub secrets: Mutex<HashMap<(String, String), Secret>>,
    pub services: Mutex<HashMap<(String, String), Service>>,
    pub token_requests: Mutex<Vec<TokenRequest>>,
}

impl Objects for TestObjects {
    fn config_map<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConfigMap>, String>> {
        let found = self
            .config_maps
            .lock()
            .unwrap()
            .get(&(ns.into(), name.into()))
            .cloned();
        Box::pin(async move { Ok(found) })
    }
    fn secret<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, String>> {
        let found = self
            .secrets
            .lock()
            .unwrap()
            .get(&(ns.into(), name.into()))
            .cloned();
        Box::pin(async move { Ok(found) })
    }
    fn service_account_token<'a>(
        &'a self,
        ns: &'a str,
        account: &'a str,
        request: TokenRequest,
    ) -> BoxFuture<'a, Result<IssuedToken, String>> {
        let life = request.spec.expiration_seconds.unwrap_or(3600) as u64;
        let mut requests = self.token_requests.lock().unwrap();
        requests.push(request);
        let token = format!("token-{}-{ns}-{account}", requests.len());
        Box::pin(async move {
            Ok(IssuedToken {
                token,
                expires: std::time::SystemTime::now() + Duration::from_secs(life),
            })
        })
    }
    fn service(&self, ns: &str, name: &str) -> Result<Option<Service>, String> {
        Ok(self
            .services
            .lock()
            .unwrap()
            .get(&(ns.into(), name.into()))
            .cloned())
    }
    fn services(&self, ns: &str) -> Result<Vec<Service>, String> {
        Ok(self
            .services
            .lock()
            .unwrap()
            .iter()
            .filter(|((n, _), _)| n == ns)
            .map(|(_, s)| s.clone())
            .collect())
    }
}

/// Collects what workers report, per pod uid.
#[derive(Default)]
pub struct Collector {
    pub statuses: Mutex<HashMap<String, PodStatus>>,
    pub events: Mutex<Vec<(String, PodEvent)>>,
    pub terminated: Mutex<HashSet<String>>,
}

impl Reporter for Collector {
    fn status(&self, pod: &PodRef, status: &PodStatus) {
        self.statuses
            .lock()
            .unwrap()
            .insert(pod.uid.clone(), status.clone());
    }
    fn event(&self, pod: &PodRef, event: PodEvent) {
        self.events.lock().unwrap().push((pod.uid.clone(), event));
    }
    fn terminated(&self, pod: &PodRef) {
        self.terminated.lock().unwrap().insert(pod.uid.clone());
    }
}

/// Short clocks so tests see back-offs and probes within seconds.
pub fn test_timing() -> Timing {
    let quick = BackOffPolicy {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(4),
        reset_after: Duration::from_secs(600),
    };
    Timing {
        restart_backoff: quick,
        image_backoff: quick,
        sync_interval: Duration::from_millis(200),
    }
}

/// A runtime plus what pod workers need.
pub struct TestNode {
    pub rt: TestRuntime,
    pub ctx: Arc<NodeContext>,
    pub collector: Arc<Collector>,
    pub objects: Arc<TestObjects>,
}

impl TestNode {
    pub async fn start(tag: &str) -> TestNode {
        TestNode::start_with_dns(tag, Default::default()).await
    }

    /// A node whose pods get their resolv.conf from `dns`.
    pub async fn start_with_dns(tag: &str, dns: node::pod::dns::DnsSettings) -> TestNode {
        let rt = TestRuntime::start(tag).await;
        let collector = Arc::new(Collector::default());
        let objects = Arc::new(TestObjects::default());
        let ctx = Arc::new(NodeContext {
            node: rt.node.clone(),
            layout: rt.layout.clone(),
            cri: rt.cri.clone(),
            host_ip: Some("127.0.0.1".into()),
            objects: objects.clone(),
            reporter: collector.clone(),
            timing: test_timing(),
            dns,
            csi: None,
        });
        TestNode {
            rt,
            ctx,
            collector,
            objects,
        }
    }

    pub fn spawn(&self, pod: &Pod) -> PodHandle {
        PodWorker::spawn(self.ctx.clone(), pod.clone())
    }

    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.collector.statuses.lock().unwrap().get(uid).cloned()
    }

    /// Waits until the pod's status satisfies `pred`; returns it.
    pub fn wait_status(
        &self,
        uid: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> PodStatus {
        skiff_tests::wait_until(what, timeout, || match self.status(uid) {
            Some(s) if pred(&s) => Ok(s),
            other => Err(other.map(|s| serde_json::to_string(&s).unwrap_or_default())),
        })
    }

    /// Waits until the pod worker has finished the pod (containers and sandbox removed).
    pub fn wait_terminated(&self, uid: &str, what: &str, timeout: Duration) {
        skiff_tests::wait_until(what, timeout, || {
            self.collector
                .terminated
                .lock()
                .unwrap()
                .contains(uid)
                .then_some(())
                .ok_or(())
        });
    }

    /// The reasons of the pod's events so far, in order.
    pub fn reasons(&self, uid: &str) -> Vec<String> {
        self.collector
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _)| u == uid)
            .map(|(_, e)| e.reason.as_str().to_string())
            .collect()
    }

    pub fn events(&self, uid: &str) -> Vec<PodEvent> {
        self.collector
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _)| u == uid)
            .map(|(_, e)| e.clone())
            .collect()
    }
}

/// A Pod from JSON with a fresh uid and the default namespace.
pub fn pod(mut json: serde_json::Value) -> Pod {
    static N: AtomicU32 = AtomicU32::new(0);
    let uid = format!(
        "uid-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    json["apiVersion"] = "v1".into();
    json["kind"] = "Pod".into();
    json["metadata"]["uid"] = uid.into();
    if json["metadata"]["namespace"].is_null() {
        json["metadata"]["namespace"] = "default".into();
    }
    serde_json::from_value(json).expect("a valid Pod")
}

pub fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

pub fn phase(s: &PodStatus) -> &str {
    s.phase.as_deref().unwrap_or_default()
}

pub fn condition(s: &PodStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

pub fn container<'a>(
    s: &'a PodStatus,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
}

pub fn waiting_reason(s: &PodStatus, name: &str) -> Option<String> {
    container(s, name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

/// Runs a command in a pod's container through CRI; returns (exit code, stdout).
pub async fn exec(node: &TestNode, s: &PodStatus, name: &str, cmd: &[&str]) -> (i32, String) {
    let id = container(s, name)
        .and_then(|c| c.container_id.clone())
        .expect("a created container");
    let id = id.trim_start_matches("containerd://");
    let out = node
        .rt
        .cri
        .exec_sync(
            id,
            cmd.iter().map(|s| s.to_string()).collect(),
            Duration::from_secs(10),
        )
        .await
        .expect("exec");
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// [`http_get`] of `/`, owning its address (for polling closures).
pub async fn http_get_owned(addr: String) -> Result<String, String> {
    http_get(&addr, "/").await
}

/// A minimal HTTP GET over a fresh connection; the body on 200.
pub async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(out),
    }
}

/// Controllers of a real controller manager (no leader election), stopped on drop.
pub struct Controllers {
    _manager: control_plane::controllers::manager::ControllerManager,
    _stop: tokio_util::sync::DropGuard,
}

/// Starts `enabled` controllers against the API server `client` reaches.
pub async fn controllers(
    client: kube::Client,
    settings: control_plane::controllers::Settings,
) -> Controllers {
    use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
    let token = tokio_util::sync::CancellationToken::new();
    let manager = ControllerManager::start(
        client,
        ManagerConfig {
            settings,
            leader_election: None,
            ops_listen: None,
        },
        token.clone(),
    )
    .await
    .unwrap();
    Controllers {
        _manager: manager,
        _stop: token.drop_guard(),
    }
}

/// The serviceaccount and root-ca-cert-publisher controllers, as a cluster runs them: every
/// namespace gets its `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap, which
/// the projected token volume the ServiceAccount admission plugin gives every pod reads.
pub async fn identity_controllers(
    client: kube::Client,
    kubeconfig: &std::path::Path,
) -> Controllers {
    use control_plane::controllers::{rootcacertpublisher, ControllerName, Settings};
    let root_ca = rootcacertpublisher::load(None, kubeconfig)
        .unwrap()
        .expect("the test API server serves TLS, so its kubeconfig names a CA");
    controllers(
        client,
        Settings {
            enabled: [
                ControllerName::ServiceAccount,
                ControllerName::RootCaCertPublisher,
            ]
            .into(),
            root_ca: Some(root_ca),
            ..Settings::default()
        },
    )
    .await
}
