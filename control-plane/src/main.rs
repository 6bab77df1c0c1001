//! `control-plane`: the control plane's binary, a thin shell over the library.
//!
//! `control-plane apiserver --data-dir DIR --listen ADDR --write-kubeconfig PATH`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use control_plane::apiserver::{Config, Server};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser)]
#[command(name = "control-plane", about = "skiff's control plane", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Kubernetes API from a durable embedded store.
    Apiserver(ApiserverArgs),
}

#[derive(Args)]
struct ApiserverArgs {
    /// Directory of the store, the admin token and the default kubeconfig.
    #[arg(long)]
    data_dir: PathBuf,
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
    }
}

async fn apiserver(a: ApiserverArgs) -> Result<()> {
    let mut config = Config::new(a.data_dir, a.listen);
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
