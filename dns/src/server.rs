//! The server: the API watch feeding the records, hickory-server answering on UDP and TCP
//! (one port), the metrics endpoint, and a graceful stop.

use crate::handler::Handler;
use crate::metrics::{self, Metrics};
use crate::records::{NameError, Records, Zone};
use crate::watch::Watch;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A TCP connection that sends nothing for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Where names outside the cluster domain go.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// The nameservers of a resolv.conf file (the host's: /etc/resolv.conf).
    ResolvConf(PathBuf),
    /// These servers (UDP, then TCP on truncation).
    Servers(Vec<SocketAddr>),
    /// Nothing is forwarded: other names are refused.
    None,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// UDP and TCP, the same port (port 0: one chosen for both).
    pub listen: SocketAddr,
    pub cluster_domain: String,
    /// None: in-cluster configuration (or $KUBECONFIG, ~/.kube/config).
    pub kubeconfig: Option<PathBuf>,
    pub upstream: Upstream,
    /// /metrics, /healthz, /readyz.
    pub metrics_listen: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cluster domain: {0}")]
    Domain(#[from] NameError),
    #[error("binding {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("API client: {0}")]
    Client(String),
    #[error("upstream resolvers: {0}")]
    Upstream(String),
}

/// A running server.
pub struct RunningDns {
    /// Where it answers (UDP and TCP).
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    watch: Watch,
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningDns {
    /// Whether the first listing is in the records.
    pub fn synced(&self) -> bool {
        self.watch.synced()
    }

    pub async fn wait_synced(&self) {
        self.watch.wait_synced().await
    }

    /// Stops accepting, finishes the queries in flight, stops the watch.
    pub async fn shutdown(self) {
        self.token.cancel();
        let _ = self.task.await;
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, ServerError> {
    match kubeconfig {
        Some(path) => control_plane::runtime::client::from_kubeconfig(path)
            .await
            .map_err(|e| ServerError::Client(e.to_string())),
        None => kube::Client::try_default()
            .await
            .map_err(|e| ServerError::Client(e.to_string())),
    }
}

fn name_server(addr: SocketAddr) -> NameServerConfig {
    let mut udp = ConnectionConfig::udp();
    udp.port = addr.port();
    let mut tcp = ConnectionConfig::tcp();
    tcp.port = addr.port();
    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
}

/// Whether a resolv.conf has a `nameserver` line (hickory's parser refuses one without).
fn names_a_server(text: &[u8]) -> bool {
    String::from_utf8_lossy(text)
        .lines()
        .any(|l| l.split_whitespace().next() == Some("nameserver"))
}

/// The resolver for forwarded names; `own` is left out of the servers (no loop to itself).
fn resolver(upstream: &Upstream, own: SocketAddr) -> Result<Option<TokioResolver>, ServerError> {
    let (config, mut opts) = match upstream {
        Upstream::None => return Ok(None),
        Upstream::Servers(servers) => (
            ResolverConfig::from_name_servers(servers.iter().map(|a| name_server(*a)).collect()),
            Default::default(),
        ),
        Upstream::ResolvConf(path) => {
            let text = std::fs::read(path)
                .map_err(|e| ServerError::Upstream(format!("{}: {e}", path.display())))?;
            if !names_a_server(&text) {
                // A node whose resolver configuration names no server (a cluster kept
                // off every outside network): the cluster's names only, others refused.
                tracing::warn!(path = %path.display(), "no nameserver: nothing is forwarded");
                return Ok(None);
            }
            let (c, o) = hickory_resolver::system_conf::parse_resolv_conf(text)
                .map_err(|e| ServerError::Upstream(format!("{}: {e}", path.display())))?;
            // Only its nameservers: the names asked are already absolute.
            let (_, _, servers) = c.into_parts();
            (ResolverConfig::from_name_servers(servers), o)
        }
    };
    let (domain, search, mut servers) = config.into_parts();
    servers.retain(|s| !(s.ip == own.ip() && s.connections.iter().any(|c| c.port == own.port())));
    if servers.is_empty() {
        return Err(ServerError::Upstream("no upstream nameserver".into()));
    }
    let config = ResolverConfig::from_parts(domain, search, servers);
    opts.use_hosts_file = ResolveHosts::Never;
    opts.preserve_intermediates = true;
    opts.ndots = 0;
    let mut builder = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    *builder.options_mut() = opts;
    builder
        .build()
        .map(Some)
        .map_err(|e| ServerError::Upstream(e.to_string()))
}

/// Starts the watch, the DNS listeners and the metrics endpoint. Queries are answered from
/// the start (names not yet listed are NXDOMAIN); /readyz turns ready after the first sync.
pub async fn start(config: Config) -> Result<RunningDns, ServerError> {
    let zone = Zone::new(&config.cluster_domain)?;
    let records = Arc::new(Records::new(zone));
    let metrics = Arc::new(Metrics::new());
    let client = client(config.kubeconfig.as_ref()).await?;
    let watch = Watch::new(client, records.clone());
    let token = CancellationToken::new();

    let udp = tokio::net::UdpSocket::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            what: "udp",
            addr: config.listen,
            source,
        })?;
    let addr = udp.local_addr().map_err(|source| ServerError::Bind {
        what: "udp",
        addr: config.listen,
        source,
    })?;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            what: "tcp",
            addr,
            source,
        })?;
    let upstream = resolver(&config.upstream, addr)?;
    let ready_watch = watch.clone();
    let metrics_addr = metrics::serve(
        config.metrics_listen,
        metrics.clone(),
        records.clone(),
        move || ready_watch.synced(),
        token.clone(),
    )
    .await
    .map_err(|source| ServerError::Bind {
        what: "metrics",
        addr: config.metrics_listen,
        source,
    })?;
    {
        let (records, metrics) = (records.clone(), metrics.clone());
        // The services gauge follows the records (cheap: a length under a read lock).
        let token = token.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => { metrics.services.set(records.services() as i64); }
                }
            }
        });
    }
    let mut server = hickory_server::Server::new(Handler::new(records, upstream, metrics));
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE, 64);
    let task = {
        let token = token.clone();
        let watch = watch.clone();
        tokio::spawn(async move {
            let watching = tokio::spawn(watch.run(token.clone()));
            token.cancelled().await;
            if let Err(error) = server.shutdown_gracefully().await {
                tracing::warn!(%error, "DNS listeners stopped with an error");
            }
            let _ = watching.await;
        })
    };
    tracing::info!(%addr, %metrics_addr, domain = %config.cluster_domain, "serving DNS");
    Ok(RunningDns {
        addr,
        metrics_addr,
        watch,
        token,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_resolv_conf_without_nameserver_forwards_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, "# no servers\nsearch example.org\noptions ndots:5\n").unwrap();
        let own: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let r = resolver(&Upstream::ResolvConf(path.clone()), own).unwrap();
        assert!(r.is_none());
        std::fs::write(&path, "nameserver 127.0.0.1\n").unwrap();
        // Its only server is this DNS itself: no loop, an error.
        assert!(resolver(&Upstream::ResolvConf(path.clone()), own).is_err());
        std::fs::write(&path, "nameserver 127.0.0.2\n").unwrap();
        assert!(resolver(&Upstream::ResolvConf(path), own)
            .unwrap()
            .is_some());
    }
}
