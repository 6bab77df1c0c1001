//! `skiff-dns`: the cluster DNS daemon (flags, logs, signals); the server is in the library.

use anyhow::Context;
use clap::Parser;
use dns::{Config, Upstream};
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(
    name = "skiff-dns",
    about = "Cluster DNS: Services and pods from the API, other names forwarded"
)]
struct Args {
    /// Address for DNS over UDP and TCP.
    #[arg(long, default_value = "0.0.0.0:53")]
    listen: SocketAddr,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// A kubeconfig; without it the in-cluster configuration (service account) is used.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Upstream resolvers (IP or IP:port, repeatable); default: the nameservers of
    /// --resolv-conf.
    #[arg(long, value_delimiter = ',')]
    upstream: Vec<String>,
    /// The resolv.conf whose nameservers are the upstreams when --upstream is not given.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9153")]
    metrics_listen: SocketAddr,
    /// The benchmark's baseline instead of the cluster DNS: A records from this file of
    /// `name address` lines on --listen (UDP), nothing else (`cargo xtask bench dns`).
    #[arg(long)]
    static_zone: Option<PathBuf>,
}

fn upstream_addr(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: std::net::IpAddr = s.parse().with_context(|| format!("--upstream {s}"))?;
    Ok(SocketAddr::new(ip, 53))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let upstream = match args.upstream.is_empty() {
        true => Upstream::ResolvConf(args.resolv_conf),
        false => Upstream::Servers(
            args.upstream
                .iter()
                .map(|s| upstream_addr(s))
                .collect::<anyhow::Result<_>>()?,
        ),
    };
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    if let Some(path) = &args.static_zone {
        let zone = dns::baseline::StaticZone::load(path)?;
        let token = tokio_util::sync::CancellationToken::new();
        let serving = tokio::spawn(dns::baseline::serve(zone, args.listen, token.clone()));
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
            r = serving => return Ok(r??),
        }
        token.cancel();
        return Ok(());
    }
    let running = dns::start(Config {
        listen: args.listen,
        cluster_domain: args.cluster_domain,
        kubeconfig: args.kubeconfig,
        upstream,
        metrics_listen: args.metrics_listen,
    })
    .await?;
    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
    }
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}
