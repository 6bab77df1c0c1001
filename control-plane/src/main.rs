//! `control-plane`: the control plane's binary, a thin shell over the library.
//!
//! `control-plane apiserver --data-dir DIR --listen ADDR --write-kubeconfig PATH
//!  [--audit-log-path PATH|- --audit-log-maxsize MB --audit-log-maxbackup N]`
//! `control-plane controller-manager --kubeconfig PATH`
//! `control-plane scheduler --kubeconfig PATH`
//! `control-plane server --data-dir DIR --listen ADDR --write-kubeconfig PATH [--disable ...]`
//! `control-plane kubeconfig --data-dir DIR --user NAME [--group G] --out PATH`
//! `control-plane token create --kubeconfig PATH [--ttl 24h] [--write-kubeconfig OUT [--server URL]]`
//! `control-plane kubelet-serving-cert --data-dir DIR --node NAME --san ADDR... --out-dir DIR`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use control_plane::apiserver::{admission, audit, Config, Server};
use control_plane::controllers::flags::ControllerArgs;
use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
use control_plane::controllers::ControllerName;
use control_plane::runtime::flags::{parse_duration, LeaderElectionArgs};
use control_plane::store::etcd::{EtcdConfig, EtcdTls, StoreLocation};
use control_plane::store::Backend;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "control-plane", about = "skiff's control plane", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; the size of the arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve the Kubernetes API from a durable embedded store.
    Apiserver(ApiserverArgs),
    /// Run the controllers against an API server (leader-elected).
    ControllerManager(ControllerManagerArgs),
    /// Assign pending pods to nodes through an API server (leader-elected).
    Scheduler(SchedulerArgs),
    /// All in one: the API server, the controllers and the scheduler in one process.
    Server(Box<ServerArgs>),
    /// Back up the cluster's state, or restore it (see README: backups).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Write a kubeconfig for a user with a new client certificate from the cluster CA
    /// (CN = the user, O = the group), as `kubeadm kubeconfig user` does.
    Kubeconfig(KubeconfigArgs),
    /// Bootstrap tokens, with which node agents join (`kubeadm token`).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Write a node agent's serving certificate for its API from the cluster CA (CN
    /// system:node:NAME, O system:nodes, the SANs given) with its key, and the CA certificate
    /// it checks client certificates against: OUT_DIR/kubelet.crt, kubelet.key, ca.crt
    /// (0600), for `node run --tls-cert-file --tls-private-key-file --client-ca-file`.
    KubeletServingCert(KubeletServingCertArgs),
    /// Write an etcd cluster's certificates into DIR (0600): its own CA (ca.crt, ca.key;
    /// kept when present), each member's NAME.crt/.key (server and client: peers and
    /// clients both check them) and the API server's apiserver-etcd-client.crt/.key, for
    /// etcd's --cert-file/--peer-cert-file... and `--etcd-cafile --etcd-certfile
    /// --etcd-keyfile` (kubeadm's `certs etcd-*` phases).
    EtcdCerts(EtcdCertsArgs),
}

#[derive(Args)]
struct EtcdCertsArgs {
    #[arg(long)]
    dir: PathBuf,
    /// A member: `NAME` or `NAME=SAN,SAN...` (its addresses and host names beyond loopback);
    /// repeatable.
    #[arg(long = "member", required = true)]
    members: Vec<String>,
    /// How long the certificates are valid (a Go duration).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    validity: Duration,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a bootstrap token (a `kube-system/bootstrap-token-<id>` Secret) and print it,
    /// `<id>.<secret>`, or write a node agent's bootstrap kubeconfig with it. Its user is in
    /// `system:bootstrappers` and, by default, kubeadm's node group, whose node client
    /// certificate requests are approved automatically.
    Create {
        /// An administrator's kubeconfig.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Write a bootstrap kubeconfig with the token (0600; for `node run
        /// --bootstrap-kubeconfig`) to this path and print only the path: the secret never
        /// reaches the terminal or a log.
        #[arg(long)]
        write_kubeconfig: Option<PathBuf>,
        /// With --write-kubeconfig: the API server's URL as nodes reach it (default: the
        /// administrator's kubeconfig's server).
        #[arg(long, requires = "write_kubeconfig")]
        server: Option<String>,
        /// How long the token is valid (0: forever).
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: Duration,
        /// Extra groups of the token's user (each `system:bootstrappers:...`).
        #[arg(long, value_delimiter = ',',
            default_value = control_plane::apiserver::auth::bootstrap::NODE_GROUP)]
        groups: Vec<String>,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Save a consistent snapshot of the store to FILE: the embedded store of --data-dir
    /// (through its running server, or directly when none runs), or etcd's (--store etcd://).
    Save {
        file: PathBuf,
        /// The data directory of the embedded store.
        #[arg(long, required_unless_present = "store")]
        data_dir: Option<PathBuf>,
        /// An etcd cluster to snapshot (`etcd://host:port[,...]`).
        #[arg(long)]
        store: Option<StoreLocation>,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Restore FILE: as the embedded store of an empty --data-dir, or (with --etcd-data-dir)
    /// as one etcd member's fresh data directory (run it for each member).
    Restore {
        file: PathBuf,
        /// The data directory to restore the embedded store into (it must have no store).
        #[arg(
            long,
            required_unless_present = "etcd_data_dir",
            conflicts_with = "etcd_data_dir"
        )]
        data_dir: Option<PathBuf>,
        #[command(flatten)]
        member: EtcdMemberArgs,
    },
}

/// One etcd member of the restored cluster (etcdctl snapshot restore's flags).
#[derive(Args)]
struct EtcdMemberArgs {
    /// The member's new data directory (it must not exist).
    #[arg(long, requires_all = ["name", "initial_cluster", "initial_advertise_peer_urls"])]
    etcd_data_dir: Option<PathBuf>,
    /// The member's name.
    #[arg(long)]
    name: Option<String>,
    /// Every member of the restored cluster: `name=http://host:peer-port,...`.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// This member's peer URL.
    #[arg(long)]
    initial_advertise_peer_urls: Option<String>,
    /// The restored cluster's token (a new one, so it never joins the old cluster).
    #[arg(long, default_value = "skiff-restored")]
    initial_cluster_token: String,
}

#[derive(Args)]
struct KubeconfigArgs {
    /// The control plane's data directory (its `pki/` holds the CA).
    #[arg(long)]
    data_dir: PathBuf,
    /// The user name (the certificate's CN).
    #[arg(long)]
    user: String,
    /// The user's group (the certificate's O).
    #[arg(long)]
    group: Option<String>,
    /// The API server's URL as the user reaches it.
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    server: String,
    /// How long the certificate is valid (a Go duration).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    validity: Duration,
    /// Where to write the kubeconfig (0600).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct KubeletServingCertArgs {
    /// The control plane's data directory (its `pki/` holds the CA).
    #[arg(long)]
    data_dir: PathBuf,
    /// The node's name.
    #[arg(long)]
    node: String,
    /// The node's addresses and host names the API server and others dial (repeatable).
    #[arg(long = "san", required = true)]
    sans: Vec<control_plane::pki::San>,
    /// How long the certificate is valid (a Go duration).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    validity: Duration,
    /// Where to write kubelet.crt, kubelet.key and ca.crt.
    #[arg(long)]
    out_dir: PathBuf,
}

#[derive(Args)]
struct ApiserverArgs {
    /// Directory of the embedded store, the cluster CA and keys (pki/), and the kubeconfigs.
    #[arg(long)]
    data_dir: PathBuf,
    /// Where the cluster's state lives: `embedded` (DATA_DIR/store.redb) or an etcd cluster,
    /// `etcd://host:port[,host:port...]`.
    #[arg(long, default_value = "embedded")]
    store: StoreLocation,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Address to serve on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write the admin kubeconfig (default DATA_DIR/kubeconfig).
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,
    /// ClusterIP range of Services.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// NodePort range, as FIRST-LAST.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Watch events kept per resource for resuming watches (older: 410 Expired).
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,
    /// Seconds between bookmarks on idle watches that allow them.
    #[arg(long, default_value_t = 30)]
    bookmark_interval: u64,
    /// Seconds the watch cache may fail to follow the store before /livez fails (/readyz
    /// fails at once).
    #[arg(long, default_value_t = 120)]
    watch_cache_liveness_grace: u64,
    /// Kubernetes' AdmissionConfiguration file (PodSecurity defaults and exemptions).
    #[arg(long)]
    admission_control_config_file: Option<PathBuf>,
    /// Admission plugins to leave out of the chain, by name (e.g. `PodSecurity`).
    #[arg(long, value_delimiter = ',')]
    disable_admission_plugins: Vec<String>,
    /// Serve plain HTTP instead of TLS: for debugging, on a loopback address only, and
    /// still authenticated (bearer tokens, e.g. from --token-auth-file).
    #[arg(long)]
    plain_http: bool,
    /// The address nodes reach this server at (added to the serving certificate's SANs).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// More subject alternative names (IPs or DNS names) for the serving certificate.
    #[arg(long = "tls-san", value_delimiter = ',')]
    tls_sans: Vec<control_plane::pki::San>,
    /// Static bearer tokens: a CSV file of `token,user,uid,"group1,group2"` lines.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// The issuer (`iss`) of service account tokens.
    #[arg(long, default_value = control_plane::apiserver::auth::serviceaccount::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// Audiences the API accepts tokens for (default: the issuer).
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// The longest lifetime a TokenRequest is given (a Go duration such as 24h; default:
    /// as requested).
    #[arg(long, value_parser = parse_duration)]
    service_account_max_token_expiration: Option<Duration>,
    /// Write the audit log (audit.k8s.io/v1 Events at Metadata level, one JSON line per
    /// request) to this file; `-` for standard output.
    #[arg(long)]
    audit_log_path: Option<control_plane::apiserver::audit::log_file::Destination>,
    /// Rotate the audit log file before it grows past this many megabytes (0: never).
    #[arg(long, default_value_t = 0)]
    audit_log_maxsize: u64,
    /// Rotated audit log files to keep (0: all).
    #[arg(long, default_value_t = 0)]
    audit_log_maxbackup: usize,
    /// Which authorizers decide: `Node,RBAC`, or `AlwaysAllow` (every authenticated request
    /// allowed: a baseline for benchmarks and debugging, on a loopback address only).
    #[arg(long, default_value = "Node,RBAC")]
    authorization_mode: control_plane::apiserver::authz::Mode,
    /// Seconds between scrapes of the node agents for metrics.k8s.io (`kubectl top`);
    /// 0: not scraped (the group is served empty).
    #[arg(long, default_value_t = 15)]
    metric_resolution: u64,
}

/// How to reach an etcd cluster (kube-apiserver's flags).
#[derive(Args)]
struct EtcdArgs {
    /// CA certificate of the etcd members' serving certificates (TLS on when given).
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate presented to etcd.
    #[arg(long, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// Key of the client certificate.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// Prepended to every key in etcd (several clusters can share one etcd).
    #[arg(long, default_value = "")]
    etcd_prefix: String,
    /// How often etcd's history is compacted (to where it was one interval earlier); 0: never.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    etcd_compaction_interval: Duration,
}

impl EtcdArgs {
    /// The store the flags describe.
    fn backend(&self, location: &StoreLocation) -> Result<Backend> {
        let endpoints = match location {
            StoreLocation::Embedded => {
                if self.etcd_cafile.is_some()
                    || self.etcd_certfile.is_some()
                    || self.etcd_keyfile.is_some()
                {
                    anyhow::bail!("--etcd-* TLS flags need --store etcd://...");
                }
                return Ok(Backend::Embedded);
            }
            StoreLocation::Etcd(endpoints) => endpoints.clone(),
        };
        let mut config = EtcdConfig::new(endpoints);
        config.prefix = self.etcd_prefix.trim_end_matches('/').to_string();
        config.compaction_interval = self.etcd_compaction_interval;
        // A certificate without its key (or a key alone) is an error, never dropped: the
        // server would connect without a client certificate and fail later, less clearly.
        let identity = match (&self.etcd_certfile, &self.etcd_keyfile) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            (Some(_), None) => anyhow::bail!("--etcd-certfile needs --etcd-keyfile"),
            (None, Some(_)) => anyhow::bail!("--etcd-keyfile needs --etcd-certfile"),
        };
        config.tls = match (&self.etcd_cafile, identity) {
            (None, None) => None,
            (Some(ca), identity) => Some(EtcdTls {
                ca: ca.clone(),
                identity,
            }),
            (None, Some(_)) => anyhow::bail!("--etcd-certfile needs --etcd-cafile"),
        };
        Ok(Backend::Etcd(config))
    }
}

#[derive(Args)]
struct ControllerManagerArgs {
    /// The API server and credentials to use.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Address of /healthz and /metrics (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:10257")]
    bind_address: SocketAddr,
    #[command(flatten)]
    controllers: ControllerArgs,
    #[command(flatten)]
    leader: LeaderElectionArgs,
}

#[derive(Args)]
struct SchedulerArgs {
    /// The API server and credentials to use.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Address of /healthz, /readyz and /metrics (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:10259")]
    bind_address: SocketAddr,
    /// Pods whose spec.schedulerName is this are scheduled.
    #[arg(long, default_value = "default-scheduler")]
    scheduler_name: String,
    /// Share of nodes searched for feasible ones, 1-100 (0: adapt to the cluster's size as
    /// kube-scheduler does).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    percentage_of_nodes_to_score: u8,
    #[command(flatten)]
    leader: LeaderElectionArgs,
}

#[derive(Args)]
struct ServerArgs {
    #[command(flatten)]
    api: ApiserverArgs,
    /// Components to switch off: `scheduler`, `controllers`, or a controller's name
    /// (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    disable: Vec<String>,
    /// Address of the controllers' /healthz and /metrics (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:10257")]
    controller_manager_bind_address: SocketAddr,
    /// Address of the scheduler's /healthz and /metrics (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:10259")]
    scheduler_bind_address: SocketAddr,
    #[command(flatten)]
    controllers: ControllerArgs,
    #[command(flatten)]
    leader: LeaderElectionArgs,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    match cli.command {
        Command::Apiserver(a) => rt.block_on(apiserver(a)),
        Command::ControllerManager(a) => rt.block_on(controller_manager(a)),
        Command::Scheduler(a) => rt.block_on(scheduler(a)),
        Command::Server(a) => rt.block_on(server(*a)),
        Command::Snapshot(c) => rt.block_on(snapshot(c)),
        Command::Kubeconfig(a) => user_kubeconfig(a),
        Command::Token(TokenCommand::Create {
            kubeconfig,
            write_kubeconfig,
            server,
            ttl,
            groups,
        }) => {
            let out = write_kubeconfig.map(|path| (path, server));
            rt.block_on(token_create(&kubeconfig, out, ttl, &groups))
        }
        Command::KubeletServingCert(a) => kubelet_serving_cert(a),
        Command::EtcdCerts(a) => etcd_certs(a),
    }
}

/// The API server's configuration from its flags.
fn apiserver_config(a: ApiserverArgs) -> Result<Config> {
    let mut config = Config::new(a.data_dir, a.listen);
    config.store = a.etcd.backend(&a.store)?;
    config.kubeconfig = a.write_kubeconfig;
    config.service_cidr = a
        .service_cluster_ip_range
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))
        .context("--service-cluster-ip-range")?;
    let (first, last) = a
        .service_node_port_range
        .split_once('-')
        .context("--service-node-port-range must be FIRST-LAST")?;
    config.node_ports = first.parse()?..=last.parse()?;
    config.watch_history = a.watch_history;
    config.bookmark_interval = Duration::from_secs(a.bookmark_interval.max(1));
    config.cache_liveness_grace = Duration::from_secs(a.watch_cache_liveness_grace);
    if let Some(path) = &a.admission_control_config_file {
        config.admission = admission::Config::from_file(path)?;
    }
    config.admission.disabled = a.disable_admission_plugins.into_iter().collect();
    if a.plain_http {
        config.transport = control_plane::apiserver::TransportMode::PlainHttp;
    }
    config.advertise_address = a.advertise_address;
    config.tls_sans = a.tls_sans;
    config.token_auth_file = a.token_auth_file;
    config.service_account_issuer = a.service_account_issuer;
    config.api_audiences = a.api_audiences;
    config.service_account_max_token_expiration = a.service_account_max_token_expiration;
    config.authorization = a.authorization_mode;
    config.metric_resolution =
        (a.metric_resolution > 0).then(|| Duration::from_secs(a.metric_resolution));
    config.audit = a.audit_log_path.map(|destination| audit::Config {
        destination,
        rotation: audit::log_file::Rotation {
            max_bytes: (a.audit_log_maxsize > 0).then(|| a.audit_log_maxsize * 1024 * 1024),
            max_backups: a.audit_log_maxbackup,
        },
    });
    Ok(config)
}

async fn apiserver(a: ApiserverArgs) -> Result<()> {
    let config = apiserver_config(a)?;
    let mut server = Server::start(config).await?;
    let stop = server.shutdown_token();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        _ = server.stopped() => anyhow::bail!("the server stopped unexpectedly"),
    }
    stop.cancel();
    server.shutdown().await;
    Ok(())
}

fn user_kubeconfig(a: KubeconfigArgs) -> Result<()> {
    use control_plane::apiserver::kubeconfig::{self, Credentials};
    use control_plane::pki::{Ca, CertSpec};
    let pki = control_plane::apiserver::certs::pki_dir(&a.data_dir);
    let ca = Ca::load(&pki.join("ca.crt"), &pki.join("ca.key"))
        .context("the cluster CA (run the control plane once first)")?;
    let issued = ca.issue(&CertSpec::client(&a.user, a.group.as_deref(), a.validity))?;
    kubeconfig::write(
        &a.out,
        &a.server,
        ca.cert_pem(),
        &a.user,
        &Credentials::Certificate(issued),
    )
    .with_context(|| format!("writing {}", a.out.display()))?;
    println!("{}", a.out.display());
    Ok(())
}

/// `token create`: `out` is where to write a bootstrap kubeconfig instead of printing the
/// token, and the server URL to put in it.
async fn token_create(
    kubeconfig: &std::path::Path,
    out: Option<(PathBuf, Option<String>)>,
    ttl: Duration,
    groups: &[String],
) -> Result<()> {
    use control_plane::apiserver::kubeconfig::{self as kc, Credentials};
    let client = control_plane::runtime::client::from_kubeconfig(kubeconfig).await?;
    // What the bootstrap kubeconfig needs is read before the token exists: a failure here
    // leaves no unused token behind.
    let target = match out {
        None => None,
        Some((path, server)) => {
            let ca = control_plane::controllers::rootcacertpublisher::load(None, kubeconfig)
                .map_err(anyhow::Error::msg)?
                .with_context(|| {
                    format!("{} names no certificate authority", kubeconfig.display())
                })?;
            let server = match server {
                Some(s) => s,
                None => {
                    let admin = kube::config::Kubeconfig::read_from(kubeconfig)?;
                    kube::Config::from_custom_kubeconfig(admin, &Default::default())
                        .await?
                        .cluster_url
                        .to_string()
                }
            };
            Some((path, server, ca))
        }
    };
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let ttl = (!ttl.is_zero()).then_some(ttl);
    let token = control_plane::apiserver::auth::bootstrap::create(&client, ttl, &groups).await?;
    match target {
        None => println!("{token}"),
        Some((path, server, ca)) => {
            kc::write(
                &path,
                server.trim_end_matches('/'),
                &ca.0,
                "kubelet-bootstrap",
                &Credentials::Token(token),
            )
            .with_context(|| format!("writing {}", path.display()))?;
            println!("{}", path.display());
        }
    }
    Ok(())
}

fn kubelet_serving_cert(a: KubeletServingCertArgs) -> Result<()> {
    use control_plane::pki::{files::write_private, Ca};
    let pki = control_plane::apiserver::certs::pki_dir(&a.data_dir);
    let ca = Ca::load(&pki.join("ca.crt"), &pki.join("ca.key"))
        .context("the cluster CA (run the control plane once first)")?;
    let issued =
        control_plane::apiserver::certs::kubelet_serving(&ca, &a.node, a.sans, a.validity)?;
    issued.write(&a.out_dir, "kubelet")?;
    let ca_path = a.out_dir.join("ca.crt");
    write_private(&ca_path, ca.cert_pem().as_bytes())
        .with_context(|| format!("writing {}", ca_path.display()))?;
    println!("{}", a.out_dir.display());
    Ok(())
}

fn etcd_certs(a: EtcdCertsArgs) -> Result<()> {
    let members: Vec<(String, Vec<control_plane::pki::San>)> = a
        .members
        .iter()
        .map(|m| match m.split_once('=') {
            None => (m.clone(), Vec::new()),
            Some((name, sans)) => (
                name.to_string(),
                sans.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().expect("a SAN parses (an IP, else a name)"))
                    .collect(),
            ),
        })
        .collect();
    if let Some((bad, _)) = members
        .iter()
        .find(|(n, _)| n.is_empty() || n.contains('/'))
    {
        anyhow::bail!("--member {bad:?}: a member needs a name without '/'");
    }
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    control_plane::apiserver::certs::etcd_certificates(&a.dir, &members, a.validity)?;
    println!("{}", a.dir.display());
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() -> Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    Ok(())
}

async fn controller_manager(a: ControllerManagerArgs) -> Result<()> {
    let client = control_plane::runtime::client::from_kubeconfig(&a.kubeconfig).await?;
    let mut settings = a
        .controllers
        .settings(&[])
        .map_err(anyhow::Error::msg)
        .context("--controllers")?;
    settings.root_ca = control_plane::controllers::rootcacertpublisher::load(
        a.controllers.root_ca_file.as_deref(),
        &a.kubeconfig,
    )
    .map_err(anyhow::Error::msg)
    .context("--root-ca-file")?;
    settings.cluster_signing = a
        .controllers
        .cluster_signing(None)
        .context("--cluster-signing-cert-file")?;
    let config = ManagerConfig {
        settings,
        leader_election: a.leader.config("kube-controller-manager"),
        ops_listen: Some(a.bind_address),
    };
    let token = CancellationToken::new();
    let manager = ControllerManager::start(client, config, token.clone()).await?;
    terminated().await?;
    token.cancel();
    manager.stopped().await;
    tracing::info!("controller-manager stopped");
    Ok(())
}

async fn scheduler(a: SchedulerArgs) -> Result<()> {
    let client = control_plane::runtime::client::from_kubeconfig(&a.kubeconfig).await?;
    let config = control_plane::scheduler::Config {
        scheduler_name: a.scheduler_name,
        percentage_of_nodes_to_score: Some(a.percentage_of_nodes_to_score).filter(|p| *p > 0),
        leader_election: a.leader.config("kube-scheduler"),
        ops_listen: Some(a.bind_address),
        ..Default::default()
    };
    let token = CancellationToken::new();
    let mut task = tokio::spawn(control_plane::scheduler::run(client, config, token.clone()));
    tokio::select! {
        r = terminated() => r?,
        r = &mut task => {
            r??;
            anyhow::bail!("the scheduler stopped unexpectedly");
        }
    }
    token.cancel();
    task.await??;
    tracing::info!("scheduler stopped");
    Ok(())
}

/// What `--disable` switched off.
struct Disabled {
    scheduler: bool,
    controllers: bool,
    some: Vec<ControllerName>,
}

fn parse_disabled(items: &[String]) -> Result<Disabled> {
    let mut d = Disabled {
        scheduler: false,
        controllers: false,
        some: Vec::new(),
    };
    for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match item {
            "scheduler" => d.scheduler = true,
            "controllers" | "controller-manager" => d.controllers = true,
            name => d.some.push(
                name.parse()
                    .map_err(anyhow::Error::msg)
                    .context("--disable")?,
            ),
        }
    }
    Ok(d)
}

async fn server(a: ServerArgs) -> Result<()> {
    let disabled = parse_disabled(&a.disable)?;
    let mut settings = a
        .controllers
        .settings(&disabled.some)
        .map_err(anyhow::Error::msg)
        .context("--controllers")?;
    let mut api = Server::start(apiserver_config(a.api)?).await?;
    let stop_api = api.shutdown_token();
    // Each component with its own identity, as when they run as processes of their own.
    let client_of = |file: &str| {
        let path = api.component_kubeconfig(file);
        async move { control_plane::runtime::client::from_kubeconfig(&path).await }
    };
    // The controller manager's kubeconfig carries the cluster CA: the bundle the
    // root-ca-cert-publisher puts in every namespace.
    settings.root_ca = control_plane::controllers::rootcacertpublisher::load(
        a.controllers.root_ca_file.as_deref(),
        &api.component_kubeconfig(control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG),
    )
    .map_err(anyhow::Error::msg)
    .context("--root-ca-file")?;
    // The controllers sign with the cluster CA of the data directory unless told otherwise.
    let pki = control_plane::apiserver::certs::pki_dir(api.data_dir());
    settings.cluster_signing = a
        .controllers
        .cluster_signing(Some((pki.join("ca.crt"), pki.join("ca.key"))))
        .context("--cluster-signing-cert-file")?;
    let controllers_client =
        client_of(control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG).await?;
    let scheduler_client = client_of(control_plane::apiserver::SCHEDULER_KUBECONFIG).await?;
    let token = CancellationToken::new();
    let manager = if disabled.controllers {
        tracing::info!("controllers disabled");
        None
    } else {
        let config = ManagerConfig {
            settings,
            leader_election: a.leader.config("kube-controller-manager"),
            ops_listen: Some(a.controller_manager_bind_address),
        };
        Some(ControllerManager::start(controllers_client, config, token.clone()).await?)
    };
    let scheduler = if disabled.scheduler {
        tracing::info!("scheduler disabled");
        None
    } else {
        let config = control_plane::scheduler::Config {
            leader_election: a.leader.config("kube-scheduler"),
            ops_listen: Some(a.scheduler_bind_address),
            ..Default::default()
        };
        let token = token.clone();
        Some(tokio::spawn(control_plane::scheduler::run(
            scheduler_client,
            config,
            token,
        )))
    };
    tokio::select! {
        r = terminated() => r?,
        _ = api.stopped() => anyhow::bail!("the API server stopped unexpectedly"),
    }
    // Controllers and scheduler first: they release their leases through the API.
    token.cancel();
    if let Some(m) = manager {
        m.stopped().await;
    }
    if let Some(s) = scheduler {
        match s.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the scheduler stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "the scheduler task failed"),
            Ok(Ok(())) => {}
        }
    }
    stop_api.cancel();
    api.shutdown().await;
    Ok(())
}

async fn snapshot(command: SnapshotCommand) -> Result<()> {
    use control_plane::store::snapshot::{self, EtcdMember};
    let saved = match command {
        SnapshotCommand::Save {
            file,
            data_dir,
            store,
            etcd,
        } => match (store, data_dir) {
            (Some(location @ StoreLocation::Etcd(_)), _) => {
                let Backend::Etcd(config) = etcd.backend(&location)? else {
                    unreachable!("an etcd location makes an etcd backend")
                };
                snapshot::save_etcd(&config, &file).await?
            }
            (_, Some(dir)) => snapshot::save_embedded(&dir, &file).await?,
            (_, None) => anyhow::bail!("--data-dir (embedded store) or --store etcd://..."),
        },
        SnapshotCommand::Restore {
            file,
            data_dir,
            member,
        } => match (data_dir, member.etcd_data_dir) {
            (Some(dir), _) => snapshot::restore_embedded(&file, &dir)?,
            (None, Some(etcd_dir)) => {
                let member = EtcdMember {
                    name: member.name.context("--name")?,
                    initial_cluster: member.initial_cluster.context("--initial-cluster")?,
                    initial_advertise_peer_url: member
                        .initial_advertise_peer_urls
                        .context("--initial-advertise-peer-urls")?,
                    initial_cluster_token: member.initial_cluster_token,
                    data_dir: etcd_dir,
                };
                snapshot::restore_etcd(&file, &member)?;
                println!(
                    "restored etcd member {} in {}",
                    member.name,
                    member.data_dir.display()
                );
                return Ok(());
            }
            (None, None) => anyhow::bail!("--data-dir or --etcd-data-dir"),
        },
    };
    match saved.revision {
        Some(r) => println!("{} bytes, revision {r}", saved.bytes),
        None => println!("{} bytes", saved.bytes),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        etcd: EtcdArgs,
    }

    fn etcd() -> StoreLocation {
        StoreLocation::Etcd(vec!["https://127.0.0.1:2379".into()])
    }

    #[test]
    fn an_etcd_client_certificate_without_its_key_or_a_key_alone_is_refused() {
        for (flag, missing) in [
            ("--etcd-certfile", "--etcd-keyfile"),
            ("--etcd-keyfile", "--etcd-certfile"),
        ] {
            let args = ["control-plane", "--etcd-cafile", "ca.crt", flag, "x.pem"];
            let err = Flags::try_parse_from(args).err().expect("refused");
            assert!(err.to_string().contains(missing), "{flag}: {err}");
        }
        // The same when the flags are built otherwise than by parsing.
        let parsed = |cert: Option<&str>, key: Option<&str>| EtcdArgs {
            etcd_cafile: Some("ca.crt".into()),
            etcd_certfile: cert.map(PathBuf::from),
            etcd_keyfile: key.map(PathBuf::from),
            etcd_prefix: String::new(),
            etcd_compaction_interval: Duration::ZERO,
        };
        let err = parsed(Some("c.pem"), None).backend(&etcd()).err().unwrap();
        assert!(err.to_string().contains("--etcd-keyfile"), "{err}");
        let err = parsed(None, Some("k.pem")).backend(&etcd()).err().unwrap();
        assert!(err.to_string().contains("--etcd-certfile"), "{err}");
        let err = parsed(None, Some("k.pem"))
            .backend(&StoreLocation::Embedded)
            .err()
            .unwrap();
        assert!(err.to_string().contains("--store etcd://"), "{err}");
        // Both, or neither: TLS with or without a client identity.
        let both = Flags::try_parse_from([
            "control-plane",
            "--etcd-cafile",
            "ca.crt",
            "--etcd-certfile",
            "c.pem",
            "--etcd-keyfile",
            "k.pem",
        ])
        .unwrap();
        let Backend::Etcd(c) = both.etcd.backend(&etcd()).unwrap() else {
            panic!("not etcd")
        };
        let tls = c.tls.expect("TLS");
        assert_eq!(
            tls.identity,
            Some((PathBuf::from("c.pem"), PathBuf::from("k.pem")))
        );
        let Backend::Etcd(c) = parsed(None, None).backend(&etcd()).unwrap() else {
            panic!("not etcd")
        };
        assert_eq!(c.tls.expect("TLS").identity, None);
    }
}
