//! `node run`: the skiff node agent (see the library for everything it does).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use node::agent::{AgentConfig, RunningAgent};
use node::containerd::RuntimeSettings;
use node::layout::Layout;
use node::names::NodeName;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "skiff node agent: runs the pods bound to this node through containerd's CRI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; the size of the arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Register the node and run its pods until SIGTERM (pods keep running after it).
    Run {
        /// The node's kubeconfig; written by TLS bootstrap when missing or expired.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// A kubeconfig with a bootstrap token, to get the node's client certificate through
        /// a CertificateSigningRequest when --kubeconfig has none (TLS bootstrap).
        #[arg(long)]
        bootstrap_kubeconfig: Option<PathBuf>,
        /// Where the node's client key and certificate live (default DATA_DIR/pki).
        #[arg(long)]
        cert_dir: Option<PathBuf>,
        /// The node name (default: the host name).
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value = "/var/lib/skiff/node")]
        data_dir: PathBuf,
        /// Use this CRI runtime instead of starting a containerd of our own.
        #[arg(long)]
        cri_socket: Option<PathBuf>,
        /// The node's InternalIP (default: the first global IPv4 address).
        #[arg(long)]
        node_ip: Option<Ipv4Addr>,
        /// Hard eviction thresholds that raise the pressure conditions, as the kubelet's
        /// flag: memory.available, nodefs.available, nodefs.inodesFree, pid.available.
        #[arg(long, default_value = node::agent::pressure::KUBELET_DEFAULTS)]
        eviction_hard: node::agent::pressure::Thresholds,
        /// The kubelet API, /healthz and /metrics (HTTPS, every request authenticated and
        /// authorized).
        #[arg(long, default_value = "0.0.0.0:10250")]
        listen: SocketAddr,
        /// The API's serving certificate (PEM), from the cluster CA: CN system:node:NAME,
        /// SANs the node's addresses (`control-plane kubelet-serving-cert` writes one).
        #[arg(long)]
        tls_cert_file: PathBuf,
        /// Its private key (PEM).
        #[arg(long)]
        tls_private_key_file: PathBuf,
        /// The CA whose client certificates authenticate callers (the cluster CA).
        #[arg(long)]
        client_ca_file: PathBuf,
        /// The sandbox (pause) image.
        #[arg(long, default_value = "127.0.0.1:5000/skiff/pause:latest")]
        pause_image: String,
        /// Registries reached over plain HTTP (`host:port`, or `registry=http://endpoint`
        /// to reach it at another address, the only one: `docker.io=http://<local registry>`
        /// makes `busybox` pull from the local registry and never from docker.io).
        #[arg(long, default_value = "127.0.0.1:5000")]
        insecure_registry: Vec<String>,
        /// The cluster DNS servers pods with dnsPolicy ClusterFirst use (comma-separated;
        /// none: they get the host's resolv.conf, as the kubelet).
        #[arg(long, value_delimiter = ',')]
        cluster_dns: Vec<IpAddr>,
        /// The cluster domain of the pods' search path.
        #[arg(long, default_value = "cluster.local")]
        cluster_domain: String,
        /// The host's resolver configuration, for dnsPolicy Default and hostNetwork pods
        /// ("" for none).
        #[arg(long, default_value = "/etc/resolv.conf")]
        resolv_conf: PathBuf,
        /// Several API servers (`host:port`, comma-separated): the agent runs a balancer on
        /// --api-balancer-listen that relays each connection to one that answers, failing
        /// over when it dies; the kubeconfigs on the node then name that address.
        #[arg(long, value_delimiter = ',')]
        api_servers: Vec<SocketAddr>,
        /// Where the API balancer listens (with --api-servers).
        #[arg(long, default_value = "127.0.0.1:6444")]
        api_balancer_listen: SocketAddr,
    },
    /// Remove everything a stopped agent left on this machine: its pods, its containerd's
    /// state, its bridge and cgroups (the agent itself leaves pods running on exit).
    Reset {
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "/var/lib/skiff/node")]
        data_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:5000/skiff/pause:latest")]
        pause_image: String,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Run {
            kubeconfig,
            bootstrap_kubeconfig,
            cert_dir,
            name,
            data_dir,
            cri_socket,
            node_ip,
            eviction_hard,
            listen,
            tls_cert_file,
            tls_private_key_file,
            client_ca_file,
            pause_image,
            insecure_registry,
            cluster_dns,
            cluster_domain,
            resolv_conf,
            api_servers,
            api_balancer_listen,
        } => {
            // First: TLS bootstrap may already go through it. Lives as long as the agent.
            // It probes the servers' /readyz, verifying them against the cluster CA.
            let balancer = match api_servers.is_empty() {
                true => None,
                false => {
                    let ca = std::fs::read_to_string(&client_ca_file)
                        .with_context(|| format!("reading {}", client_ca_file.display()))?;
                    let health = node::apibalancer::HealthCheck::new(&ca)
                        .context("the API balancer's health check")?;
                    Some(
                        node::apibalancer::Balancer::start(
                            api_balancer_listen,
                            api_servers,
                            Some(health),
                        )
                        .await
                        .with_context(|| format!("the API balancer on {api_balancer_listen}"))?,
                    )
                }
            };
            let api_tls =
                node::server::ApiTls::read(&tls_cert_file, &tls_private_key_file, &client_ca_file)?;
            let name = match name {
                Some(n) => n,
                None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .context("reading the host name")?
                    .trim()
                    .to_string(),
            };
            let kubeconfig =
                node::bootstrap::ensure_kubeconfig(&node::bootstrap::BootstrapConfig {
                    kubeconfig,
                    bootstrap_kubeconfig,
                    cert_dir: cert_dir.unwrap_or_else(|| data_dir.join("pki")),
                    node_name: name.clone(),
                    timeout: std::time::Duration::from_secs(300),
                })
                .await
                .context("TLS bootstrap")?;
            let kc = kube::config::Kubeconfig::read_from(&kubeconfig)
                .with_context(|| format!("reading {}", kubeconfig.display()))?;
            let client_config =
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let client = kube::Client::try_from(client_config)?;
            let runtime = RuntimeSettings {
                sandbox_image: pause_image,
                insecure_registries: insecure_registry,
                stream_address: node_ip.map_or(Ipv4Addr::LOCALHOST, |ip| ip).into(),
            };
            let mut config = AgentConfig::new(NodeName::new(name), data_dir, runtime, api_tls);
            config.cri_socket = cri_socket;
            config.node_ip = node_ip;
            config.eviction_hard = eviction_hard;
            config.listen = listen;
            config.dns = node::pod::dns::DnsSettings {
                cluster_dns,
                cluster_domain,
                host: node::pod::dns::ResolvConf::read(&resolv_conf)
                    .with_context(|| format!("reading {}", resolv_conf.display()))?,
            };
            let agent = RunningAgent::start(config, client).await?;
            if let Some(b) = &balancer {
                agent.metrics().register(
                    "api_server_ready",
                    "Whether the API balancer counts the API server as ready (its /readyz)",
                    b.ready_gauge(),
                );
            }
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            agent.shutdown().await;
        }
        Command::Reset {
            name,
            data_dir,
            pause_image,
        } => {
            let runtime = RuntimeSettings {
                sandbox_image: pause_image,
                insecure_registries: vec![],
                stream_address: Ipv4Addr::LOCALHOST.into(),
            };
            node::agent::reset(&NodeName::new(name), &Layout::new(data_dir), &runtime).await?;
        }
    }
    Ok(())
}
