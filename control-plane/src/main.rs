//! `control-plane`: the control plane's binary, a thin shell over the library.
//!
//! `control-plane apiserver --data-dir DIR --listen ADDR --write-kubeconfig PATH`
//! `control-plane controller-manager --kubeconfig PATH`
//! `control-plane scheduler --kubeconfig PATH`
//! `control-plane server --data-dir DIR --listen ADDR --write-kubeconfig PATH [--disable ...]`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use control_plane::apiserver::{Config, Server};
use control_plane::controllers::flags::ControllerArgs;
use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
use control_plane::controllers::ControllerName;
use control_plane::runtime::flags::LeaderElectionArgs;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

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
    /// Run the controllers against an API server (leader-elected).
    ControllerManager(ControllerManagerArgs),
    /// Assign pending pods to nodes through an API server (leader-elected).
    Scheduler(SchedulerArgs),
    /// All in one: the API server, the controllers and the scheduler in one process.
    Server(ServerArgs),
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
        Command::Server(a) => rt.block_on(server(a)),
    }
}

/// The API server's configuration from its flags.
fn apiserver_config(a: ApiserverArgs) -> Result<Config> {
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
    let settings = a
        .controllers
        .settings(&[])
        .map_err(anyhow::Error::msg)
        .context("--controllers")?;
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
    let settings = a
        .controllers
        .settings(&disabled.some)
        .map_err(anyhow::Error::msg)
        .context("--controllers")?;
    let mut api = Server::start(apiserver_config(a.api)?).await?;
    let stop_api = api.shutdown_token();
    let client = control_plane::runtime::client::from_kubeconfig(api.kubeconfig_path()).await?;
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
        Some(ControllerManager::start(client.clone(), config, token.clone()).await?)
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
            client, config, token,
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
