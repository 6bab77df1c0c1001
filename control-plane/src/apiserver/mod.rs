//! The Kubernetes-compatible API server: [`Server::start`] opens the store in a data
//! directory, loads the watch cache, restores allocations, creates the system namespaces,
//! loads or makes the cluster CA and its certificates, writes the admin's and the
//! components' kubeconfigs and serves HTTPS until [`RunningServer::shutdown`].
//!
//! Rooms: `http` (connections, TLS, routing), `auth` (authentication: who is calling),
//! `certs` (the server's certificates and kubeconfigs), `request` (paths and query options),
//! `negotiate` (content types in and out), `protobuf` (kubectl's protobuf bodies), `handlers`
//! (get/list/watch/create/update/patch/delete and subresources), `admission` (the admission
//! chain every write passes), `allocation` (ClusterIP and NodePort allocation), `warning`
//! (Warning headers for the client), `rules` (the seam to the machinery: defaulting,
//! validation, selectors, patches, table cells), `registry` (the served resources),
//! `discovery`, `table`, `meta`, `output`, `kubeconfig`, `metrics`, `audit` (the audit log:
//! one audit.k8s.io/v1 Event per request, written off the request path).

// ApiError carries a full Status (message, details, causes); it is the cold path of every
// handler, so returning it unboxed is simpler and costs nothing that matters.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod allocation;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod certs;
mod conversion;
mod crd;
mod discovery;
mod handlers;
mod health;
mod http;
pub mod kubeconfig;
pub mod kubernetes_service;
mod meta;
pub mod metrics;
mod negotiate;
mod openapi_v2;
mod output;
mod protobuf;
mod proxy_url;
pub mod registry;
mod request;
mod rules;
mod table;
mod warning;

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::allocation::cluster_ip::Cidr;
use self::allocation::Allocator;
use self::auth::serviceaccount::{self as sa, ServiceAccountTokens};
use self::auth::token_file::{TokenFile, TokenFileError};
use self::auth::Authenticator;
use self::certs::ServerCerts;
use self::handlers::Ctx;
use self::metrics::Metrics;
use crate::pki::{ClientVerifier, PkiError, San};
use crate::store::cache::{Cache, CacheOptions, CacheSpec};
use crate::store::redb::RedbOptions;
use crate::store::{Backend, OpenStore, Precondition, Store, StoreError, WriteOp};

/// How the server is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the embedded store, the cluster CA and keys (`pki/`) and (by default) the
    /// kubeconfigs live.
    pub data_dir: PathBuf,
    /// The store: embedded in `data_dir` (default) or an etcd cluster.
    pub store: Backend,
    /// Address to listen on; port 0 picks a free port (see [`RunningServer::addr`]).
    pub listen: SocketAddr,
    /// Where to write the admin kubeconfig (default `<data_dir>/kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    /// Service ClusterIP range.
    pub service_cidr: Cidr,
    /// NodePort range.
    pub node_ports: RangeInclusive<u16>,
    /// Store history kept for watch resumption (revisions).
    pub store_history: u64,
    /// Watch cache history per resource (events); older resumes get 410 Expired.
    pub watch_history: usize,
    /// How often idle watches with allowWatchBookmarks get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How often the ClusterIP and NodePort claims are checked against the Services (leaks
    /// freed, missing claims written).
    pub allocation_repair_interval: Duration,
    /// How long the watch cache may fail to follow the store (while it retries) before
    /// /livez fails too (/readyz fails at once).
    pub cache_liveness_grace: Duration,
    /// The admission plugins' configuration.
    pub admission: admission::Config,
    /// TLS (the default) or, for debugging on loopback only, plain HTTP.
    pub transport: TransportMode,
    /// The address nodes reach this server at (a SAN of the serving certificate).
    pub advertise_address: Option<IpAddr>,
    /// More subject alternative names for the serving certificate.
    pub tls_sans: Vec<San>,
    /// Static bearer tokens (`--token-auth-file`, Kubernetes' CSV format).
    pub token_auth_file: Option<PathBuf>,
    /// The `iss` of service account tokens.
    pub service_account_issuer: String,
    /// The audiences the API accepts tokens for (empty: the issuer).
    pub api_audiences: Vec<String>,
    /// The longest lifetime a TokenRequest gets (None: as asked).
    pub service_account_max_token_expiration: Option<Duration>,
    /// The audit log (None: no audit log).
    pub audit: Option<audit::Config>,
    /// Which authorizers decide (AlwaysAllow only on a loopback address).
    pub authorization: authz::Mode,
    /// How often the node agents are scraped for metrics.k8s.io (metrics-server's
    /// `--metric-resolution`; None: the group is served empty).
    pub metric_resolution: Option<Duration>,
}

/// How the server accepts connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportMode {
    /// HTTPS with the cluster CA's serving certificate (client certificates accepted).
    Tls,
    /// Plain HTTP, for debugging: only on a loopback address, and still authenticated
    /// (bearer tokens; no client certificates without TLS).
    PlainHttp,
}

impl Config {
    /// Defaults as Kubernetes has them: services 10.96.0.0/12, node ports 30000-32767.
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Config {
        Config {
            data_dir: data_dir.into(),
            store: Backend::Embedded,
            listen,
            kubeconfig: None,
            service_cidr: "10.96.0.0/12".parse().expect("valid default CIDR"),
            node_ports: 30000..=32767,
            store_history: RedbOptions::default().history_limit,
            watch_history: CacheOptions::default().history_per_resource,
            bookmark_interval: Duration::from_secs(30),
            allocation_repair_interval: Duration::from_secs(60),
            cache_liveness_grace: Duration::from_secs(120),
            admission: admission::Config::default(),
            transport: TransportMode::Tls,
            advertise_address: None,
            tls_sans: Vec::new(),
            token_auth_file: None,
            service_account_issuer: sa::DEFAULT_ISSUER.to_string(),
            api_audiences: Vec::new(),
            service_account_max_token_expiration: None,
            audit: None,
            authorization: authz::Mode::default(),
            metric_resolution: Some(Duration::from_secs(15)),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("watch cache: {0}")]
    Cache(#[from] crate::store::cache::CacheError),
    #[error("snapshots: {0}")]
    Snapshot(#[from] crate::store::snapshot::SnapshotError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("certificates: {0}")]
    Pki(#[from] PkiError),
    #[error("--token-auth-file: {0}")]
    TokenFile(#[from] TokenFileError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Audit(#[from] audit::OpenError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// The API server (see [`Server::start`]).
pub struct Server;

/// A started server.
pub struct RunningServer {
    addr: SocketAddr,
    scheme: &'static str,
    data_dir: PathBuf,
    kubeconfig: PathBuf,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    /// Keeps the `kubernetes` Service's endpoints (stopped before the store closes).
    reconciler: JoinHandle<()>,
    /// Repairs the ClusterIP and NodePort claims now and then.
    repairer: JoinHandle<()>,
    /// Scrapes the node agents for metrics.k8s.io.
    scraper: Option<JoinHandle<()>>,
    store: OpenStore,
    audit: audit::Sink,
}

impl Server {
    /// Opens the store, loads the cache and starts serving.
    pub async fn start(config: Config) -> Result<RunningServer, StartError> {
        if config.transport == TransportMode::PlainHttp && !config.listen.ip().is_loopback() {
            return Err(StartError::Config(format!(
                "plain HTTP is for debugging on a loopback address only, not {}",
                config.listen
            )));
        }
        if config.authorization == authz::Mode::AlwaysAllow && !config.listen.ip().is_loopback() {
            return Err(StartError::Config(format!(
                "--authorization-mode AlwaysAllow is for benchmarks and debugging on a loopback \
                 address only, not {}",
                config.listen
            )));
        }
        std::fs::create_dir_all(&config.data_dir)
            .map_err(io(format!("creating {}", config.data_dir.display())))?;
        let store = OpenStore::open(&config.store, &config.data_dir, config.store_history).await?;
        let shared = store.shared();
        let mut specs: Vec<CacheSpec> = registry::RESOURCES
            .iter()
            .filter(|r| r.cached())
            .map(|r| CacheSpec {
                prefix: r.prefix(),
                fields: r.selectable_fields(),
                indexed: r.indexed.to_vec(),
                field_fn: Arc::new(move |v: &serde_json::Value, f: &str| rules::field(r, v, f)),
            })
            .collect();
        specs.push(crd::cache_spec());
        let cache = Cache::start(
            shared.clone(),
            specs,
            CacheOptions {
                history_per_resource: config.watch_history,
                ..Default::default()
            },
        )
        .await?;
        // Definitions stored before a restart are served before the server listens.
        crd::controller::load(&cache);
        let allocator = Allocator::new(
            shared.clone(),
            config.service_cidr,
            config.node_ports.clone(),
        );
        repair_allocations(shared.as_ref(), &cache, &allocator).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(io(format!("listening on {}", config.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the listen address"))?;
        let sans = certs::serving_sans(
            addr,
            config.advertise_address,
            config.service_cidr.first_host(),
            &config.tls_sans,
        );
        let pki = ServerCerts::prepare(&config.data_dir, sans)?;
        let service_accounts = Arc::new(ServiceAccountTokens::load_or_create(
            &certs::pki_dir(&config.data_dir),
            &config.service_account_issuer,
            config.api_audiences.clone(),
            config.service_account_max_token_expiration,
        )?);
        let token_file = match &config.token_auth_file {
            Some(path) => TokenFile::load(path)?,
            None => TokenFile::default(),
        };
        let authenticator = Authenticator::new(token_file, service_accounts, cache.clone());
        let shutdown = CancellationToken::new();
        authz::bootstrap::reconcile(shared.as_ref()).await?;
        let authz = authz::Authorizer::new(&cache, config.authorization);
        if let OpenStore::Embedded(s) = &store {
            // Only this process may open the database: backups are made through it.
            crate::store::snapshot::serve(s.clone(), &config.data_dir, shutdown.clone())?;
        }
        let env = admission::Env {
            store: shared.clone(),
            cache: cache.clone(),
        };
        let metrics = Metrics::new();
        let audit = match &config.audit {
            Some(c) => audit::Sink::start(c, metrics.clone())?,
            None => audit::Sink::disabled(metrics.clone()),
        };
        let ctx = Arc::new(Ctx {
            admission: admission::Chain::new(env, &config.admission),
            store: shared.clone(),
            cache: cache.clone(),
            allocator,
            authz,
            shutdown: shutdown.clone(),
            metrics,
            bookmark_interval: config.bookmark_interval,
            cache_liveness_grace: config.cache_liveness_grace,
            authenticator,
            audit: audit.clone(),
            kubelet_tls: crate::pki::tls::client_config(
                pki.ca.cert_pem(),
                Some((&pki.kubelet_client.cert_pem, &pki.kubelet_client.key_pem)),
            )?,
            metrics_api: Default::default(),
        });
        ensure_namespaces(shared.as_ref()).await?;
        ensure_priority_classes(shared.as_ref()).await?;
        let scheme = match config.transport {
            TransportMode::Tls => "https",
            TransportMode::PlainHttp => "http",
        };
        let server_url = format!("{scheme}://{}", client_addr(addr));
        let kubeconfig_path = config
            .kubeconfig
            .clone()
            .unwrap_or_else(|| config.data_dir.join("kubeconfig"));
        pki.write_kubeconfig(
            &kubeconfig_path,
            &server_url,
            certs::ADMIN_USER,
            Some(certs::MASTERS_GROUP),
        )?;
        for (file, user) in [
            (
                CONTROLLER_MANAGER_KUBECONFIG,
                certs::CONTROLLER_MANAGER_USER,
            ),
            (SCHEDULER_KUBECONFIG, certs::SCHEDULER_USER),
        ] {
            pki.write_kubeconfig(&config.data_dir.join(file), &server_url, user, None)?;
        }
        let transport = match config.transport {
            TransportMode::Tls => http::Transport::Tls {
                config: crate::pki::tls::server_config(
                    &pki.serving.cert_pem,
                    &pki.serving.key_pem,
                )?,
                clients: ClientVerifier::new(pki.ca.cert_der())?,
            },
            TransportMode::PlainHttp => http::Transport::Plain,
        };
        let reconciler = kubernetes_service::start(
            ctx.clone(),
            config.service_cidr.first_host().into(),
            addr.port(),
            kubernetes_service::published_endpoint(addr, config.advertise_address),
        )
        .await;
        let scraper = config.metric_resolution.map(|every| {
            tokio::spawn(handlers::metrics_api::run(
                ctx.clone(),
                ctx.metrics_api.clone(),
                every,
                shutdown.clone(),
            ))
        });
        tokio::spawn(crd::controller::run(
            shared.clone(),
            cache.clone(),
            shutdown.clone(),
        ));
        let repairer = tokio::spawn(keep_allocations_repaired(
            ctx.clone(),
            config.allocation_repair_interval,
        ));
        let task = tokio::spawn(http::serve(listener, ctx, transport));
        tracing::info!(%addr, %scheme, kubeconfig = %kubeconfig_path.display(), "API server serving");
        Ok(RunningServer {
            addr,
            scheme,
            data_dir: config.data_dir.clone(),
            kubeconfig: kubeconfig_path,
            shutdown,
            task,
            reconciler,
            repairer,
            scraper,
            store,
            audit,
        })
    }
}

/// The controller manager's kubeconfig in the data directory.
pub const CONTROLLER_MANAGER_KUBECONFIG: &str = "controller-manager.kubeconfig";
/// The scheduler's kubeconfig in the data directory.
pub const SCHEDULER_KUBECONFIG: &str = "scheduler.kubeconfig";

/// The address clients should dial: a wildcard listen address is reached over loopback.
fn client_addr(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

impl RunningServer {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<addr>` (`http://` with plain HTTP).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, client_addr(self.addr))
    }

    /// The data directory (its `pki/` holds the CA, for tests that make credentials).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The kubeconfig `control-plane server` runs a component with.
    pub fn component_kubeconfig(&self, file: &str) -> PathBuf {
        self.data_dir.join(file)
    }

    /// The admin kubeconfig the server wrote.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Resolves when the server stops (after [`RunningServer::shutdown`] or a fatal error).
    pub async fn stopped(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Stops accepting, ends watches, drains connections, writes out the audit log and
    /// closes the store.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.reconciler.await;
        let _ = self.repairer.await;
        if let Some(scraper) = self.scraper {
            let _ = scraper.await;
        }
        let _ = self.task.await;
        let audit = self.audit;
        let _ = tokio::task::spawn_blocking(move || audit.flush()).await;
        let store = self.store;
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
        tracing::info!("API server stopped");
    }

    /// A token that stops the server when cancelled (for signal handlers).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Every stored Service, from the cache once it has every write acknowledged so far.
async fn stored_services(store: &dyn Store, cache: &Cache) -> Result<Vec<Value>, StoreError> {
    let services = registry::find("", "v1", "services").expect("services are registered");
    let rev = store.latest_revision().await?;
    cache
        .wait_for(rev, Duration::from_secs(10))
        .await
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
    let rc = cache
        .resource(&services.prefix())
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    let everything: crate::store::cache::Filter = Arc::new(|_| true);
    let page = rc.list(&services.prefix(), &everything, None, None);
    Ok(page.items.iter().filter_map(|o| o.value().ok()).collect())
}

/// One repair pass of the Service allocations (see [`allocation`]).
async fn repair_allocations(
    store: &dyn Store,
    cache: &Cache,
    allocator: &Allocator,
) -> Result<(), StoreError> {
    let report = allocator.repair(|| stored_services(store, cache)).await?;
    tracing::info!(
        created = report.created,
        freed = report.freed,
        suspects = report.suspects,
        "service allocations repaired"
    );
    Ok(())
}

/// Repairs the allocations every `every` until shutdown (every API server does: the
/// preconditions make their passes safe together).
async fn keep_allocations_repaired(ctx: Arc<Ctx>, every: Duration) {
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = repair_allocations(ctx.store.as_ref(), &ctx.cache, &ctx.allocator).await {
            tracing::warn!(error = %e, "repairing the service allocations failed; retried at the next pass");
        }
    }
}

/// Creates the built-in priority classes (system-node-critical, system-cluster-critical) when
/// missing, as Kubernetes' scheduling post-start hook does.
async fn ensure_priority_classes(store: &dyn Store) -> Result<(), StartError> {
    use crate::machinery::kinds::scheduling;
    let classes = registry::find(scheduling::GROUP, "v1", "priorityclasses")
        .expect("priorityclasses are registered");
    for (name, value, description) in scheduling::SYSTEM_CLASSES {
        let mut obj = scheduling::system_class(name, *value, description);
        obj["metadata"]["uid"] = json!(meta::new_uid());
        obj["metadata"]["creationTimestamp"] = json!(meta::now());
        create_if_missing(store, classes.key(None, name), &obj).await?;
    }
    Ok(())
}

/// Stores `obj` at `key` unless something is there already (the built-in objects a server
/// ensures at start: idempotent across restarts and servers).
async fn create_if_missing(
    store: &dyn Store,
    key: String,
    obj: &serde_json::Value,
) -> Result<(), StartError> {
    let op = WriteOp::Put {
        key,
        value: serde_json::to_vec(obj).unwrap_or_default().into(),
        precondition: Precondition::MustNotExist,
    };
    match store.write(op).await {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the namespaces every cluster has (idempotent).
async fn ensure_namespaces(store: &dyn Store) -> Result<(), StartError> {
    let namespaces = registry::find("", "v1", "namespaces").expect("namespaces are registered");
    for name in handlers::SYSTEM_NAMESPACES {
        let obj = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "uid": meta::new_uid(),
                "creationTimestamp": meta::now(),
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        create_if_missing(store, namespaces.key(None, name), &obj).await?;
    }
    Ok(())
}
