//! `skiff-csi`: the CSI driver's binary. `plugin` is the node plugin (DaemonSet: CSI services,
//! registration, provisioner), `controller` the placement controller (Deployment).

use anyhow::Context;
use clap::{Parser, Subcommand};
use skiff_csi::metrics::{self, Metrics};
use skiff_csi::plugin::{self, PluginConfig};
use skiff_csi::{placement, provisioner, resizer, volumes, DRIVER_NAME};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "skiff-csi",
    version,
    about = "skiff's CSI driver, local.csi.skiff.io"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The node plugin: CSI Identity/Controller/Node services, plugin registration, the
    /// provisioner for claims selected for this node and the resizer of its volumes.
    Plugin(PluginArgs),
    /// The controller: places claims of Immediate classes on a node.
    Controller(ControllerArgs),
}

#[derive(clap::Args, Debug)]
struct PluginArgs {
    /// This node's name (the topology value and NodeGetInfo's node_id).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The CSI socket to serve.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// The registration socket to serve (in the node agent's plugins_registry directory).
    #[arg(long)]
    registration_socket: Option<PathBuf>,
    /// The CSI socket as the node agent sees it (answered by registration GetInfo).
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins/local.csi.skiff.io/csi.sock"
    )]
    kubelet_endpoint: String,
    /// Where the volumes' image files live.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins/local.csi.skiff.io/volumes"
    )]
    data_dir: PathBuf,
    /// What this node's volumes may take together (bytes or a quantity: 20Gi).
    #[arg(long, default_value = "20Gi", value_parser = volumes::parse_size)]
    capacity: u64,
    /// Address for /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:9808")]
    metrics_addr: SocketAddr,
    /// Do not run the provisioner and the resizer (no API server needed; tests).
    #[arg(long)]
    no_provisioner: bool,
    /// A kubeconfig; without it the in-cluster configuration (service account) is used.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ControllerArgs {
    /// The driver whose claims it places (the StorageClasses' provisioner).
    #[arg(long, default_value = DRIVER_NAME)]
    driver: String,
    /// Address for /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:9809")]
    metrics_addr: SocketAddr,
    /// A kubeconfig; without it the in-cluster configuration (service account) is used.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// The API client, as skiff-dns makes it: a kubeconfig when given, else in-cluster.
async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    match kubeconfig {
        Some(path) => control_plane::runtime::client::from_kubeconfig(path)
            .await
            .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display())),
        None => kube::Client::try_default()
            .await
            .context("in-cluster API client"),
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn terminated() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
    Ok(())
}

async fn run_plugin(a: PluginArgs) -> anyhow::Result<()> {
    let endpoint = plugin::socket_path(&a.endpoint)?;
    let metrics = Arc::new(Metrics::new());
    let token = CancellationToken::new();
    let (addr, http) = metrics::serve(a.metrics_addr, metrics.clone(), token.clone())
        .await
        .with_context(|| format!("metrics on {}", a.metrics_addr))?;
    tracing::info!(%addr, "metrics and health listening");
    let controllers = metrics.controllers.clone();
    let mut running = plugin::start(
        PluginConfig {
            node: a.node_name.clone(),
            endpoint: endpoint.clone(),
            registration_socket: a.registration_socket,
            kubelet_endpoint: a.kubelet_endpoint,
            data_dir: a.data_dir,
            capacity: a.capacity,
        },
        metrics,
    )
    .await?;
    let (provisioner, resizer) = match a.no_provisioner {
        true => (None, None),
        false => {
            let client = client(a.kubeconfig.as_ref()).await?;
            let resizer = tokio::spawn(resizer::run(resizer::Config {
                client: client.clone(),
                csi: plugin::unix_channel(&endpoint),
                driver: DRIVER_NAME.to_string(),
                node: a.node_name.clone(),
                metrics: controllers.clone(),
            }));
            let provisioner = tokio::spawn(provisioner::run(provisioner::Config {
                client,
                csi: plugin::unix_channel(&endpoint),
                driver: DRIVER_NAME.to_string(),
                node: a.node_name,
                metrics: controllers,
            }));
            (Some(provisioner), Some(resizer))
        }
    };
    let provisioned = async {
        match provisioner {
            Some(t) => t.await,
            None => std::future::pending().await,
        }
    };
    let resized = async {
        match resizer {
            Some(t) => t.await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = terminated() => r,
        e = running.refused() => Err(anyhow::anyhow!("the node agent refused the registration: {e}")),
        r = provisioned => match r {
            Ok(Ok(())) => Err(anyhow::anyhow!("the provisioner stopped")),
            Ok(Err(e)) => Err(e.context("provisioner")),
            Err(e) => Err(anyhow::anyhow!("the provisioner panicked: {e}")),
        },
        r = resized => match r {
            Ok(Ok(())) => Err(anyhow::anyhow!("the resizer stopped")),
            Ok(Err(e)) => Err(e.context("resizer")),
            Err(e) => Err(anyhow::anyhow!("the resizer panicked: {e}")),
        },
    };
    running.shutdown().await;
    token.cancel();
    let _ = http.await;
    tracing::info!("stopped");
    result
}

async fn run_controller(a: ControllerArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let token = CancellationToken::new();
    let (addr, http) = metrics::serve(a.metrics_addr, metrics.clone(), token.clone())
        .await
        .with_context(|| format!("metrics on {}", a.metrics_addr))?;
    tracing::info!(%addr, "metrics and health listening");
    let client = client(a.kubeconfig.as_ref()).await?;
    let placing = tokio::spawn(placement::run(
        client,
        a.driver,
        metrics.controllers.clone(),
    ));
    let result = tokio::select! {
        r = terminated() => r,
        r = placing => match r {
            Ok(Ok(())) => Err(anyhow::anyhow!("the placement controller stopped")),
            Ok(Err(e)) => Err(e.context("placement controller")),
            Err(e) => Err(anyhow::anyhow!("the placement controller panicked: {e}")),
        },
    };
    token.cancel();
    let _ = http.await;
    tracing::info!("stopped");
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Args::parse().command {
        Command::Plugin(a) => run_plugin(a).await,
        Command::Controller(a) => run_controller(a).await,
    }
}
