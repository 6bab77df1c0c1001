//! The node plugin process's servers: Identity, Controller and Node on the CSI socket,
//! Registration on the registration socket, both unix sockets; started and stopped together.

use crate::controller::Controller;
use crate::driver::Driver;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::proto::csi::v1 as csi;
use crate::proto::registration as reg;
use crate::registration::Registration;
use crate::volumes::Store;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server};

#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub node: String,
    /// The CSI socket to serve on.
    pub endpoint: PathBuf,
    /// The registration socket to serve on (in the node agent's registration directory).
    pub registration_socket: Option<PathBuf>,
    /// The CSI socket's path as the node agent sees it, answered by GetInfo.
    pub kubelet_endpoint: String,
    pub data_dir: PathBuf,
    /// Bytes all volumes of this node may take together.
    pub capacity: u64,
}

/// The parsed path of a `unix://` endpoint (or a plain absolute path).
pub fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    anyhow::ensure!(
        path.starts_with('/'),
        "endpoint {endpoint:?} is not unix:///absolute/path"
    );
    Ok(PathBuf::from(path))
}

/// Binds a unix socket at `path`, replacing a stale socket file a previous run left.
pub fn listen(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    tokio::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// A lazy gRPC channel to a unix socket: it dials on first use and after a broken
/// connection.
pub fn unix_channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    // tonic wants a URI; the connector ignores it and dials the socket.
    Endpoint::from_static("http://[::1]:1")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
}

/// The running servers.
pub struct Plugin {
    pub driver: Arc<Driver>,
    token: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    sockets: Vec<PathBuf>,
    refused: mpsc::UnboundedReceiver<String>,
}

fn serve(
    router: tonic::transport::server::Router,
    listener: tokio::net::UnixListener,
    what: &'static str,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "{what} server failed");
        }
    })
}

/// Starts the servers; they listen when this returns.
pub async fn start(cfg: PluginConfig, metrics: Arc<Metrics>) -> anyhow::Result<Plugin> {
    let store = Store::new(&cfg.data_dir, cfg.capacity)
        .with_context(|| format!("data dir {}", cfg.data_dir.display()))?;
    let driver = Arc::new(Driver::new(cfg.node.clone(), store, metrics));
    driver.update_gauges();
    let token = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut sockets = Vec::new();

    let listener = listen(&cfg.endpoint)?;
    sockets.push(cfg.endpoint.clone());
    let router = Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(Identity))
        .add_service(csi::controller_server::ControllerServer::new(Controller {
            driver: driver.clone(),
        }))
        .add_service(csi::node_server::NodeServer::new(Node {
            driver: driver.clone(),
        }));
    tasks.push(serve(router, listener, "CSI", token.clone()));
    tracing::info!(socket = %cfg.endpoint.display(), node = %cfg.node, "CSI services listening");

    let (tx, refused) = mpsc::unbounded_channel();
    if let Some(path) = &cfg.registration_socket {
        let listener = listen(path)?;
        sockets.push(path.clone());
        let router = Server::builder().add_service(
            reg::registration_server::RegistrationServer::new(Registration {
                name: crate::DRIVER_NAME.to_string(),
                endpoint: cfg.kubelet_endpoint.clone(),
                refused: tx,
            }),
        );
        tasks.push(serve(router, listener, "registration", token.clone()));
        tracing::info!(socket = %path.display(), "registration service listening");
    }
    Ok(Plugin {
        driver,
        token,
        tasks,
        sockets,
        refused,
    })
}

impl Plugin {
    /// Resolves when the node agent refused the registration, with its error.
    pub async fn refused(&mut self) -> String {
        match self.refused.recv().await {
            Some(e) => e,
            None => std::future::pending().await,
        }
    }

    /// Stops serving (calls in flight finish) and removes the sockets. Mounts stay: pods
    /// keep their volumes while the driver restarts.
    pub async fn shutdown(self) {
        self.token.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}
