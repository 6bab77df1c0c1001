//! `cargo xtask bench api`'s security setup and figures: the two servers the table compares
//! (plain HTTP with `--authorization-mode AlwaysAllow` and a static token, the baseline; TLS
//! with a client certificate whose user RBAC authorizes through a ClusterRoleBinding, not the
//! `system:masters` bypass), and TLS handshakes per second: new connections, each a full
//! handshake (session resumption off) with and without a client certificate, from
//! [`HANDSHAKE_THREADS`] client threads on the same machine as the server.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use kube::Client;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use skiff_launcher::apiserver::ApiServerProcess;
use skiff_launcher::kubeconfig::KubeconfigAccess;

use crate::setup::run;

/// The bench's user on the TLS server (a client certificate, bound to cluster-admin by RBAC).
const BENCH_USER: &str = "skiff-bench";
/// The plain server's static token.
const PLAIN_TOKEN: &str = "skiff-bench-plain-token";
/// Client threads making handshakes (the machine's cores are shared with the server).
pub const HANDSHAKE_THREADS: usize = 2;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The server flags of the baseline: plain HTTP on loopback, a token file, no authorization.
pub fn plain_args(scratch: &Path) -> Result<Vec<String>> {
    let tokens = scratch.join("tokens.csv");
    std::fs::write(&tokens, format!("{PLAIN_TOKEN},{BENCH_USER},,\n"))?;
    Ok(vec![
        "--plain-http".into(),
        "--authorization-mode".into(),
        "AlwaysAllow".into(),
        "--token-auth-file".into(),
        tokens.display().to_string(),
    ])
}

/// A kubeconfig for the plain server with its token.
pub fn plain_kubeconfig(server: &ApiServerProcess, scratch: &Path) -> Result<PathBuf> {
    let path = scratch.join("plain.kubeconfig");
    let text = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "plain", "cluster": {"server": server.url()}}],
        "users": [{"name": BENCH_USER, "user": {"token": PLAIN_TOKEN}}],
        "contexts": [{"name": "plain", "context": {"cluster": "plain", "user": BENCH_USER}}],
        "current-context": "plain",
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&text)?)?;
    Ok(path)
}

/// A kubeconfig for the TLS server with a new client certificate for the bench user (from
/// `control-plane kubeconfig`), and the ClusterRoleBinding that lets RBAC allow it.
pub async fn rbac_kubeconfig(
    bin: &Path,
    server: &ApiServerProcess,
    data_dir: &Path,
    admin: &Client,
    scratch: &Path,
) -> Result<PathBuf> {
    let path = scratch.join("tls-rbac.kubeconfig");
    run(Command::new(bin)
        .arg("kubeconfig")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--user", BENCH_USER, "--server", server.url(), "--out"])
        .arg(&path))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": BENCH_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": BENCH_USER, "apiGroup": "rbac.authorization.k8s.io"}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(path)
}

/// Full TLS handshakes against one server.
pub struct Handshakes {
    pub client_cert: bool,
    pub threads: usize,
    pub count: usize,
    pub secs: f64,
    pub latencies: Vec<Duration>,
}

impl Handshakes {
    pub fn per_sec(&self) -> f64 {
        self.count as f64 / self.secs.max(1e-9)
    }
    pub fn pct(&self, p: f64) -> Duration {
        let mut v = self.latencies.clone();
        v.sort();
        v.get(((v.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or_default()
    }
}

/// Handshakes for `for_` from [`HANDSHAKE_THREADS`] threads, each: connect, full handshake,
/// then wait for the server to close after our end of stream (so the server has verified the
/// client's certificate and finished message before the next one starts).
pub fn handshakes(
    access: &KubeconfigAccess,
    client_cert: bool,
    for_: Duration,
) -> Result<Handshakes> {
    let config = Arc::new(client_config(access, client_cert)?);
    let addr: SocketAddr = access
        .server
        .strip_prefix("https://")
        .context("a TLS server")?
        .parse()
        .context("the server's address")?;
    let started = Instant::now();
    let workers: Vec<_> = (0..HANDSHAKE_THREADS)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let mut lat = Vec::new();
                while started.elapsed() < for_ {
                    let t0 = Instant::now();
                    one_handshake(&config, addr)?;
                    lat.push(t0.elapsed());
                }
                Ok(lat)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(
            w.join()
                .map_err(|_| anyhow::anyhow!("a handshake thread panicked"))??,
        );
    }
    Ok(Handshakes {
        client_cert,
        threads: HANDSHAKE_THREADS,
        count: latencies.len(),
        secs: started.elapsed().as_secs_f64(),
        latencies,
    })
}

fn client_config(access: &KubeconfigAccess, client_cert: bool) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = access.ca_pem.as_deref().context("the kubeconfig's CA")?;
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = if client_cert {
        let (cert, key) = access
            .client
            .as_ref()
            .context("the kubeconfig's client certificate")?;
        let chain =
            CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
        builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key.as_bytes())?)?
    } else {
        builder.with_no_client_auth()
    };
    // Every connection a full handshake, as a new client's first one.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

fn one_handshake(config: &Arc<rustls::ClientConfig>, addr: SocketAddr) -> Result<()> {
    let mut sock = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    sock.set_read_timeout(Some(IO_TIMEOUT))?;
    sock.set_write_timeout(Some(IO_TIMEOUT))?;
    sock.set_nodelay(true)?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut conn = rustls::ClientConnection::new(config.clone(), name)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    // Our handshake messages may still be buffered: send them, then end our side.
    while conn.wants_write() {
        conn.write_tls(&mut sock)?;
    }
    sock.shutdown(Shutdown::Write)?;
    let mut sink = [0u8; 4096];
    while sock.read(&mut sink).unwrap_or(0) > 0 {}
    Ok(())
}
