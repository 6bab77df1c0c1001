//! A real API server (in-process) and a real node agent with its own containerd, for tests
//! that drive the whole node through the API (kube-rs or the real kubectl). Torn down on
//! drop, also on failure.

use super::{settings, test_timing};
use control_plane::apiserver::{Config, RunningServer, Server};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use node::agent::{AgentConfig, RunningAgent};
use node::names::NodeName;
use serde_json::json;
use skiff_tests::wait_until_async;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const T: Duration = Duration::from_secs(40);

pub struct Cluster {
    server: Option<RunningServer>,
    pub client: Client,
    agent: Option<RunningAgent>,
    pub config: AgentConfig,
    subnet: skiff_tests::subnet::SubnetLease,
    _identity: super::Controllers,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(tag: &str) -> Cluster {
        Cluster::start_with(tag, |_| {}).await
    }

    /// [`Cluster::start`] with the agent's config changed by `adjust` first.
    pub async fn start_with(tag: &str, adjust: impl FnOnce(&mut AgentConfig)) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("node=info")
            .try_init();
        skiff_tests::registry::require_images();
        let dir = tempfile::Builder::new()
            .prefix("ska")
            .tempdir_in("/tmp")
            .unwrap();
        let server = Server::start(Config::new(
            dir.path().join("api"),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .await
        .unwrap();
        let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
            .await
            .unwrap();
        let identity = super::identity_controllers(client.clone(), server.kubeconfig_path()).await;
        let name = NodeName::new(format!("a{}-{tag}", std::process::id()));
        let api_tls = serving_tls(&dir.path().join("api"), name.as_str());
        let mut config = AgentConfig::new(name, dir.path().join("node"), settings(), api_tls);
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.node_ip = Some(std::net::Ipv4Addr::LOCALHOST);
        config.timing = test_timing();
        config.lease_interval = Duration::from_secs(1);
        adjust(&mut config);
        let agent = RunningAgent::start(config.clone(), client.clone())
            .await
            .unwrap();
        Cluster {
            server: Some(server),
            client,
            agent: Some(agent),
            config,
            subnet: skiff_tests::subnet::lease(),
            _identity: identity,
            dir,
        }
    }

    pub fn node_name(&self) -> String {
        self.config.name.to_string()
    }

    /// The admin kubeconfig of the API server (for the real kubectl).
    pub fn kubeconfig(&self) -> PathBuf {
        self.server
            .as_ref()
            .expect("a running server")
            .kubeconfig_path()
            .to_path_buf()
    }

    /// A directory of the test's own, removed with the cluster.
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub async fn restart_agent(&mut self) {
        self.agent.take().unwrap().shutdown().await;
        self.agent = Some(
            RunningAgent::start(self.config.clone(), self.client.clone())
                .await
                .unwrap(),
        );
    }

    pub fn agent(&self) -> &RunningAgent {
        self.agent.as_ref().unwrap()
    }

    /// GET `path` on the node agent's API over HTTPS as the cluster's admin (a client
    /// certificate of the cluster CA); the whole answer, head and body.
    pub async fn kubelet_get(&self, path: &str) -> String {
        self.kubelet_get_as(path, "kubernetes-admin", Some("system:masters"))
            .await
    }

    /// GET `path` on the node agent's API over HTTPS with a client certificate of the
    /// cluster CA for `user` in `group`; the whole answer, head and body.
    pub async fn kubelet_get_as(&self, path: &str, user: &str, group: Option<&str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let pki = control_plane::apiserver::certs::pki_dir(&self.dir.path().join("api"));
        let ca = control_plane::pki::Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).unwrap();
        let admin = ca
            .issue(&control_plane::pki::CertSpec::client(
                user,
                group,
                Duration::from_secs(600),
            ))
            .unwrap();
        let tls = control_plane::pki::tls::client_config(
            ca.cert_pem(),
            Some((&admin.cert_pem, &admin.key_pem)),
        )
        .unwrap();
        let stream = tokio::net::TcpStream::connect(self.agent().addr())
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut s = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await
            .unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        // A TLS peer may close without close_notify after the answer: keep what came.
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Gives the node its pod CIDR, as node IPAM would.
    pub async fn assign_pod_cidr(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch =
            json!({"spec": {"podCIDR": self.subnet.cidr(), "podCIDRs": [self.subnet.cidr()]}});
        nodes
            .patch(
                &self.node_name(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    pub async fn create_pod(&self, name: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["nodeName"] = self.node_name().into();
        let pod: Pod = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
        )
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    pub async fn wait_pod(&self, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
        let api = self.pods();
        wait_until_async(what, T, || {
            let api = api.clone();
            let name = name.to_string();
            let ok = &pred;
            async move {
                let p = api.get(&name).await.map_err(|e| e.to_string())?;
                if ok(&p) {
                    Ok(p)
                } else {
                    Err(serde_json::to_string(&p.status).unwrap_or_default())
                }
            }
        })
        .await
    }
}

/// The node agent's serving certificate (127.0.0.1 and the node's name) from the cluster CA
/// of the API server in `api_dir`, and that CA for client certificates.
fn serving_tls(api_dir: &Path, node: &str) -> node::server::ApiTls {
    serving_tls_for(api_dir, node, &["127.0.0.1", node])
}

/// The node agent's serving certificate with `sans` as its SANs, from the cluster CA of the
/// API server in `api_dir`, and that CA for client certificates.
pub fn serving_tls_for(api_dir: &Path, node: &str, sans: &[&str]) -> node::server::ApiTls {
    let pki = control_plane::apiserver::certs::pki_dir(api_dir);
    let ca = control_plane::pki::Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).unwrap();
    let issued = control_plane::apiserver::certs::kubelet_serving(
        &ca,
        node,
        sans.iter().map(|s| s.parse().unwrap()).collect(),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    node::server::ApiTls {
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
        client_ca_pem: ca.cert_pem().to_string(),
    }
}

/// [`serving_tls_for`] written as `control-plane kubelet-serving-cert` writes it for a node
/// agent process (`kubelet.crt`, `kubelet.key`, `ca.crt`, 0600) into `dir`; the flags
/// `node run` takes them with.
pub fn serving_tls_files(
    api_dir: &Path,
    node: &str,
    sans: &[&str],
    dir: &Path,
) -> Vec<std::ffi::OsString> {
    use control_plane::pki::files::write_private;
    let tls = serving_tls_for(api_dir, node, sans);
    for (file, pem) in [
        ("kubelet.crt", &tls.cert_pem),
        ("kubelet.key", &tls.key_pem),
        ("ca.crt", &tls.client_ca_pem),
    ] {
        write_private(&dir.join(file), pem.as_bytes()).unwrap();
    }
    skiff_tests::cluster::kubelet_tls_args(dir)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let agent = self.agent.take();
        let server = self.server.take();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                if let Some(a) = agent {
                    a.remove_everything().await;
                }
                if let Some(s) = server {
                    s.shutdown().await;
                }
            })
        });
    }
}

pub fn running_ready(p: &Pod) -> bool {
    let s = p.status.clone().unwrap_or_default();
    s.phase.as_deref() == Some("Running")
        && s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}
