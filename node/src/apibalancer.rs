//! The node's client-side balancer in front of several API servers (as k3s' agent has one):
//! a TCP listener on the node's loopback (`--api-balancer-listen`, 127.0.0.1:6444) that every
//! client on the node uses (the agent itself, and the service proxy in the node's network
//! namespace), each connection relayed to one API server of `--api-servers`.
//!
//! It relays bytes, so TLS runs end to end between the client and the API server (the
//! servers' certificates carry 127.0.0.1 among their SANs, as every skiff API server's does)
//! and the balancer holds no credential. A connection goes to the server that took the last
//! one; when that one refuses or does not answer within [`CONNECT_TIMEOUT`], the next in the
//! list is tried, and so on round the list. A server that dies closes its connections (its
//! kernel resets them), so watches and pooled connections reconnect through the balancer and
//! land on a live server; nothing on the node needs restarting.
//!
//! Why not the nodes' eBPF translation of the `kubernetes` Service: the agent starts (and
//! registers its node) before the proxy runs on it, and the proxy itself needs the API to
//! learn that Service's endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// How long a connection attempt to one API server may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the balancer has done, for logs and tests.
#[derive(Default, Debug)]
pub struct Counters {
    /// Connections relayed.
    pub relayed: AtomicU64,
    /// Connection attempts to a server that failed (refused, unreachable, timed out).
    pub failed_attempts: AtomicU64,
    /// Client connections closed because no server answered.
    pub unserved: AtomicU64,
}

/// A running balancer; it stops when dropped.
pub struct Balancer {
    /// The address it listens on (port 0 resolved).
    pub local: SocketAddr,
    pub counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Balancer {
    /// Listens on `listen` and relays to `servers` (at least one).
    pub async fn start(listen: SocketAddr, servers: Vec<SocketAddr>) -> std::io::Result<Balancer> {
        if servers.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the API balancer needs at least one server",
            ));
        }
        let listener = TcpListener::bind(listen).await?;
        let local = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let shared = Arc::new(Upstreams {
            servers,
            current: AtomicUsize::new(0),
            counters: counters.clone(),
        });
        tracing::info!(%local, servers = ?shared.servers, "API balancer listening");
        let task = tokio::spawn(async move {
            loop {
                let (inbound, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // EMFILE and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "API balancer accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let up = shared.clone();
                tokio::spawn(async move { up.relay(inbound, peer).await });
            }
        });
        Ok(Balancer {
            local,
            counters,
            task,
        })
    }
}

struct Upstreams {
    servers: Vec<SocketAddr>,
    /// The index of the server that took the last connection.
    current: AtomicUsize,
    counters: Arc<Counters>,
}

impl Upstreams {
    /// A connection to the first server that takes one, starting with the current one.
    async fn connect(&self) -> Option<TcpStream> {
        let n = self.servers.len();
        let start = self.current.load(Ordering::Relaxed);
        for k in 0..n {
            let i = (start + k) % n;
            let server = self.servers[i];
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(server)).await {
                Ok(Ok(s)) => {
                    if i != start
                        && self
                            .current
                            .compare_exchange(start, i, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                    {
                        tracing::warn!(from = %self.servers[start], to = %server,
                            "API balancer: failing over");
                    }
                    let _ = s.set_nodelay(true);
                    return Some(s);
                }
                Ok(Err(e)) => tracing::debug!(%server, error = %e, "API server refused"),
                Err(_) => tracing::debug!(%server, "API server did not answer in time"),
            }
            self.counters
                .failed_attempts
                .fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    async fn relay(&self, mut inbound: TcpStream, peer: SocketAddr) {
        let Some(mut outbound) = self.connect().await else {
            self.counters.unserved.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, servers = ?self.servers, "API balancer: no server answered");
            return;
        };
        self.counters.relayed.fetch_add(1, Ordering::Relaxed);
        let _ = inbound.set_nodelay(true);
        // Ends when either side closes (a dead server's reset included): the client then
        // reconnects through the balancer.
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every connection with its name.
    async fn named_server(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(name.as_bytes()).await;
            }
        });
        (addr, task)
    }

    async fn answer(b: &Balancer) -> String {
        let mut c = TcpStream::connect(b.local).await.unwrap();
        let mut s = String::new();
        let _ = c.read_to_string(&mut s).await;
        s
    }

    /// A port nothing listens on.
    async fn closed_port() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    }

    #[tokio::test]
    async fn sticks_to_one_server_and_fails_over_when_it_goes() {
        let (a, a_task) = named_server("a").await;
        let (b, _b_task) = named_server("b").await;
        let bal = Balancer::start("127.0.0.1:0".parse().unwrap(), vec![a, b])
            .await
            .unwrap();
        assert_eq!(answer(&bal).await, "a");
        assert_eq!(answer(&bal).await, "a");
        a_task.abort();
        let _ = a_task.await;
        assert_eq!(answer(&bal).await, "b");
        // It stays on b (no return to a on every connection).
        assert_eq!(answer(&bal).await, "b");
        assert!(bal.counters.failed_attempts.load(Ordering::Relaxed) >= 1);
        assert_eq!(bal.counters.relayed.load(Ordering::Relaxed), 4);
    }

    #[tokio::test]
    async fn a_client_is_closed_when_no_server_answers() {
        let bal = Balancer::start("127.0.0.1:0".parse().unwrap(), vec![closed_port().await])
            .await
            .unwrap();
        assert_eq!(answer(&bal).await, "");
        assert_eq!(bal.counters.unserved.load(Ordering::Relaxed), 1);
        assert!(Balancer::start("127.0.0.1:0".parse().unwrap(), vec![])
            .await
            .is_err());
    }
}
