//! TLS bootstrap against a real API server (in-process, TLS) and the real controllers
//! (csrapproving, csrsigning with the cluster CA): a node with only a bootstrap token gets
//! its own client certificate through a CertificateSigningRequest and is then
//! `system:node:<name>` in `system:nodes` (kubectl auth whoami with the kubeconfig it
//! wrote); its key is private; a restart reuses the kubeconfig without asking again; a wrong
//! token is refused with 401 and writes nothing.

use std::sync::Arc;
use std::time::Duration;

use control_plane::apiserver::auth::bootstrap as tokens;
use control_plane::apiserver::kubeconfig::{self, Credentials};
use control_plane::apiserver::{Config, RunningServer, Server, CONTROLLER_MANAGER_KUBECONFIG};
use control_plane::controllers::csrsigning::Signing;
use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
use control_plane::controllers::Settings;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};
use node::bootstrap::{ensure_kubeconfig, BootstrapConfig, BootstrapError};
use serde_json::Value;
use skiff_tests::kubectl::Kubectl;
use tokio_util::sync::CancellationToken;

struct Fixture {
    server: RunningServer,
    admin: kube::Client,
    controllers: (ControllerManager, CancellationToken),
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
        let server = Server::start(config).await.unwrap();
        let admin = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
            .await
            .unwrap();
        let pki = control_plane::apiserver::certs::pki_dir(server.data_dir());
        let signing = Signing::load(
            &pki.join("ca.crt"),
            &pki.join("ca.key"),
            Duration::from_secs(24 * 3600),
        )
        .unwrap();
        let settings = Settings {
            cluster_signing: Some(Arc::new(signing)),
            ..Settings::default()
        };
        let client = control_plane::runtime::client::from_kubeconfig(
            &server.component_kubeconfig(CONTROLLER_MANAGER_KUBECONFIG),
        )
        .await
        .unwrap();
        let token = CancellationToken::new();
        let manager = ControllerManager::start(
            client,
            ManagerConfig {
                settings,
                leader_election: None,
                ops_listen: Some("127.0.0.1:0".parse().unwrap()),
            },
            token.clone(),
        )
        .await
        .unwrap();
        Fixture {
            server,
            admin,
            controllers: (manager, token),
            dir,
        }
    }

    fn bootstrap_kubeconfig(&self, name: &str, token: &str) -> std::path::PathBuf {
        let ca = std::fs::read_to_string(
            control_plane::apiserver::certs::pki_dir(self.server.data_dir()).join("ca.crt"),
        )
        .unwrap();
        let path = self.dir.path().join(name);
        kubeconfig::write(
            &path,
            &self.server.url(),
            &ca,
            "kubelet-bootstrap",
            &Credentials::Token(token.to_string()),
        )
        .unwrap();
        path
    }

    fn config(&self, node: &str, bootstrap: std::path::PathBuf) -> BootstrapConfig {
        BootstrapConfig {
            kubeconfig: self.dir.path().join(format!("{node}.kubeconfig")),
            bootstrap_kubeconfig: Some(bootstrap),
            cert_dir: self.dir.path().join(format!("{node}-pki")),
            node_name: node.to_string(),
            timeout: Duration::from_secs(60),
        }
    }

    async fn csr_count(&self) -> usize {
        Api::<CertificateSigningRequest>::all(self.admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    }

    async fn shutdown(self) {
        self.controllers.1.cancel();
        self.controllers.0.stopped().await;
        self.server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_joins_with_a_bootstrap_token_and_restarts_with_its_own_certificate() {
    let f = Fixture::start().await;
    let token = tokens::create(
        &f.admin,
        Some(Duration::from_secs(600)),
        &[tokens::NODE_GROUP],
    )
    .await
    .unwrap();
    let config = f.config("n1", f.bootstrap_kubeconfig("bootstrap.kubeconfig", &token));
    let kubeconfig = ensure_kubeconfig(&config).await.unwrap();

    let out = Kubectl::new(&kubeconfig, f.dir.path()).ok(&["auth", "whoami", "-o", "json"]);
    let me = serde_json::from_str::<Value>(&out).unwrap()["status"]["userInfo"].clone();
    assert_eq!(me["username"], "system:node:n1");
    assert_eq!(
        me["groups"],
        serde_json::json!(["system:nodes", "system:authenticated"])
    );
    use std::os::unix::fs::PermissionsExt;
    for file in [
        config.cert_dir.join(node::bootstrap::KEY_FILE),
        config.kubeconfig.clone(),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    }
    assert_eq!(f.csr_count().await, 1);

    // A restart: the kubeconfig is valid, so no new request (even with the token gone).
    let mut again = config.clone();
    again.bootstrap_kubeconfig = None;
    assert_eq!(ensure_kubeconfig(&again).await.unwrap(), config.kubeconfig);
    assert_eq!(f.csr_count().await, 1);
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_is_refused_and_nothing_is_written() {
    let f = Fixture::start().await;
    let token = tokens::create(&f.admin, None, &[tokens::NODE_GROUP])
        .await
        .unwrap();
    let (id, _) = tokens::parse(&token).unwrap();
    let wrong = format!("{id}.0123456789abcdef");
    let config = f.config("n2", f.bootstrap_kubeconfig("wrong.kubeconfig", &wrong));
    match ensure_kubeconfig(&config).await {
        Err(BootstrapError::Api(kube::Error::Api(s))) => assert_eq!(s.code, 401, "{s:?}"),
        other => panic!("expected a 401, got {other:?}"),
    }
    assert!(!config.kubeconfig.exists());
    assert_eq!(f.csr_count().await, 0);

    // Without a kubeconfig or a bootstrap kubeconfig there is nothing to start with.
    let mut none = config.clone();
    none.bootstrap_kubeconfig = None;
    assert!(matches!(
        ensure_kubeconfig(&none).await,
        Err(BootstrapError::NoCredentials(_))
    ));
    f.shutdown().await;
}
