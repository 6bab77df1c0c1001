//! The node's client-side balancer in front of several API servers (as k3s' agent has one):
//! a TCP listener on the node's loopback (`--api-balancer-listen`, 127.0.0.1:6444) that every
//! client on the node uses (the agent itself, and the service proxy in the node's network
//! namespace), each connection relayed to one API server of `--api-servers`.
//!
//! It relays bytes, so TLS runs end to end between the client and the API server (the
//! servers' certificates carry 127.0.0.1 among their SANs, as every skiff API server's does)
//! and the balancer holds no credential.
//!
//! Which server: a health check ([`HealthCheck`], as k3s' load balancer has one) asks every
//! server's `/readyz` every [`HealthCheck::interval`] over HTTPS, the server verified against
//! the cluster CA under the name the node's clients verify through the balancer (127.0.0.1).
//! `/readyz` needs no credential (skiff's API server answers the health endpoints before
//! authentication, as `system:public-info-viewer` grants them to anyone in Kubernetes), so
//! the probe presents none. A server is not ready after [`HealthCheck::failures`] probes in a
//! row failed (an answer other than 200: its watch cache not following the store, say; no
//! answer within [`HealthCheck::timeout`]: a stopped process whose kernel still completes
//! connections), and ready again after one probe that passed. A new connection goes to the
//! server that took the last one, else the next in the list, and so on round the list,
//! ready servers first: the ones not ready are tried only when no ready one takes the
//! connection, so a cluster whose only server is degraded still works. A server that refuses
//! or does not answer within [`CONNECT_TIMEOUT`] is passed over at once.
//!
//! Connections already relayed to a server that is not ready are closed while another server
//! is ready (k3s does the same), so watches and pooled connections reconnect through the
//! balancer and land on a ready server; a server that dies closes its connections itself (its
//! kernel resets them). Nothing on the node needs restarting. Each change of readiness is
//! logged, and `skiff_node_api_server_ready{server}` (1 ready, 0 not) shows it.
//!
//! Why not the nodes' eBPF translation of the `kubernetes` Service: the agent starts (and
//! registers its node) before the proxy runs on it, and the proxy itself needs the API to
//! learn that Service's endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a connection attempt to one API server may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The labels of the readiness gauge: the server's address.
pub type ServerLabels = Vec<(String, String)>;

/// How the balancer asks the API servers whether they are ready.
#[derive(Clone)]
pub struct HealthCheck {
    /// Trusts the cluster CA only; no client certificate.
    pub tls: Arc<rustls::ClientConfig>,
    /// The name the servers' certificates are verified for.
    pub server_name: ServerName<'static>,
    /// Between two rounds of probes.
    pub interval: Duration,
    /// How long one probe (connect, handshake, answer) may take.
    pub timeout: Duration,
    /// Failed probes in a row that make a server not ready.
    pub failures: u32,
}

impl HealthCheck {
    /// Probes every 2 s, each given 1 s, a server not ready after 2 failures in a row: a
    /// server that stops answering is passed over within about 5 s, and one slow answer
    /// does not close every watch on a busy server.
    pub fn new(cluster_ca_pem: &str) -> Result<HealthCheck, control_plane::pki::PkiError> {
        Ok(HealthCheck {
            tls: control_plane::pki::tls::client_config(cluster_ca_pem, None)?,
            server_name: ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            failures: 2,
        })
    }

    /// One probe: `GET /readyz` over TLS; Ok when it answers 200.
    async fn probe(&self, server: SocketAddr) -> Result<(), String> {
        let ask = async {
            let tcp = TcpStream::connect(server)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let mut tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            let request = format!(
                "GET /readyz HTTP/1.1\r\nHost: {server}\r\nUser-Agent: skiff-node-apibalancer\r\n\
                 Connection: close\r\n\r\n"
            );
            tls.write_all(request.as_bytes())
                .await
                .map_err(|e| format!("writing: {e}"))?;
            // The status line's first 12 bytes ("HTTP/1.1 200") are all it needs.
            let mut head = [0u8; 12];
            let mut got = 0;
            while got < head.len() {
                match tls.read(&mut head[got..]).await {
                    Ok(0) => return Err("closed before answering".to_string()),
                    Ok(n) => got += n,
                    Err(e) => return Err(format!("reading: {e}")),
                }
            }
            match (&head[..9], &head[9..]) {
                (b"HTTP/1.1 " | b"HTTP/1.0 ", b"200") => Ok(()),
                (b"HTTP/1.1 " | b"HTTP/1.0 ", code) => Err(format!(
                    "/readyz answered {}",
                    String::from_utf8_lossy(code)
                )),
                _ => Err("not an HTTP answer".to_string()),
            }
        };
        match tokio::time::timeout(self.timeout, ask).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

/// What the balancer has done, for logs and tests.
#[derive(Default, Debug)]
pub struct Counters {
    /// Connections relayed.
    pub relayed: AtomicU64,
    /// Connection attempts to a server that failed (refused, unreachable, timed out).
    pub failed_attempts: AtomicU64,
    /// Client connections closed because no server answered.
    pub unserved: AtomicU64,
    /// Relayed connections closed because their server turned not ready.
    pub closed_not_ready: AtomicU64,
    /// Rounds of probes done.
    pub probe_rounds: AtomicU64,
}

/// A running balancer; it stops when dropped (connections already relayed carry on).
pub struct Balancer {
    /// The address it listens on (port 0 resolved).
    pub local: SocketAddr,
    pub counters: Arc<Counters>,
    upstreams: Arc<Upstreams>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Balancer {
    /// Listens on `listen` and relays to `servers` (at least one), probing them with
    /// `health` (None: every server counts as ready, and only whether it takes a
    /// connection matters).
    pub async fn start(
        listen: SocketAddr,
        servers: Vec<SocketAddr>,
        health: Option<HealthCheck>,
    ) -> std::io::Result<Balancer> {
        if servers.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the API balancer needs at least one server",
            ));
        }
        let listener = TcpListener::bind(listen).await?;
        let local = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let ready_gauge = Family::<ServerLabels, Gauge>::default();
        let shared = Arc::new(Upstreams {
            servers: servers
                .into_iter()
                .map(|addr| {
                    ready_gauge.get_or_create(&labels(addr)).set(1);
                    Server {
                        addr,
                        // Ready until a probe says otherwise: the agent's start is not held
                        // up by the first round.
                        ready: AtomicBool::new(true),
                        open: AtomicUsize::new(0),
                        close: watch::channel(0).0,
                    }
                })
                .collect(),
            current: AtomicUsize::new(0),
            counters: counters.clone(),
            ready_gauge,
        });
        let addrs: Vec<SocketAddr> = shared.servers.iter().map(|s| s.addr).collect();
        tracing::info!(%local, servers = ?addrs, health_check = health.is_some(),
            "API balancer listening");
        let up = shared.clone();
        let mut tasks = vec![tokio::spawn(async move {
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
                let up = up.clone();
                tokio::spawn(async move { up.relay(inbound, peer).await });
            }
        })];
        if let Some(health) = health {
            let up = shared.clone();
            tasks.push(tokio::spawn(async move { up.check(health).await }));
        }
        Ok(Balancer {
            local,
            counters,
            upstreams: shared,
            tasks,
        })
    }

    /// Whether each server (in `--api-servers` order) counts as ready now.
    pub fn ready(&self) -> Vec<bool> {
        self.upstreams
            .servers
            .iter()
            .map(|s| s.ready.load(Ordering::Relaxed))
            .collect()
    }

    /// The gauge of each server's readiness (1 ready, 0 not), labelled `server`, for the
    /// agent's metrics registry.
    pub fn ready_gauge(&self) -> Family<ServerLabels, Gauge> {
        self.upstreams.ready_gauge.clone()
    }
}

fn labels(server: SocketAddr) -> ServerLabels {
    vec![("server".to_string(), server.to_string())]
}

struct Server {
    addr: SocketAddr,
    ready: AtomicBool,
    /// Connections relayed to it and still open.
    open: AtomicUsize,
    /// Bumped to close the connections relayed to it.
    close: watch::Sender<u64>,
}

struct Upstreams {
    servers: Vec<Server>,
    /// The index of the server that took the last connection.
    current: AtomicUsize,
    counters: Arc<Counters>,
    ready_gauge: Family<ServerLabels, Gauge>,
}

/// Counts a relayed connection as open while it lives.
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Upstreams {
    /// A connection to the first server that takes one, starting with the current one:
    /// ready servers first, then (none of them taking it) the others.
    async fn connect(&self) -> Option<(usize, TcpStream)> {
        let n = self.servers.len();
        let start = self.current.load(Ordering::Relaxed);
        for want_ready in [true, false] {
            for k in 0..n {
                let i = (start + k) % n;
                let server = &self.servers[i];
                if server.ready.load(Ordering::Relaxed) != want_ready {
                    continue;
                }
                match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(server.addr)).await {
                    Ok(Ok(s)) => {
                        if i != start
                            && self
                                .current
                                .compare_exchange(start, i, Ordering::Relaxed, Ordering::Relaxed)
                                .is_ok()
                        {
                            tracing::warn!(from = %self.servers[start].addr, to = %server.addr,
                                ready = want_ready, "API balancer: failing over");
                        }
                        let _ = s.set_nodelay(true);
                        return Some((i, s));
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(server = %server.addr, error = %e, "API server refused")
                    }
                    Err(_) => {
                        tracing::debug!(server = %server.addr, "API server did not answer in time")
                    }
                }
                self.counters
                    .failed_attempts
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        None
    }

    async fn relay(&self, mut inbound: TcpStream, peer: SocketAddr) {
        let Some((i, mut outbound)) = self.connect().await else {
            self.counters.unserved.fetch_add(1, Ordering::Relaxed);
            let servers: Vec<SocketAddr> = self.servers.iter().map(|s| s.addr).collect();
            tracing::warn!(%peer, ?servers, "API balancer: no server answered");
            return;
        };
        let server = &self.servers[i];
        // Subscribed before counted: a close sent once the count shows it reaches it.
        let mut close = server.close.subscribe();
        server.open.fetch_add(1, Ordering::Relaxed);
        let _open = Open(&server.open);
        self.counters.relayed.fetch_add(1, Ordering::Relaxed);
        let _ = inbound.set_nodelay(true);
        // Ends when either side closes (a dead server's reset included), or when the server
        // turns not ready: the client then reconnects through the balancer.
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            Ok(()) = close.changed() => {
                self.counters.closed_not_ready.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, server = %server.addr,
                    "API balancer: closing a connection to a server not ready");
            }
        }
    }

    /// Probes every server each `health.interval`, concurrently, and acts on the answers.
    async fn check(&self, health: HealthCheck) {
        let mut failures = vec![0u32; self.servers.len()];
        let mut tick = tokio::time::interval(health.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let answers =
                futures::future::join_all(self.servers.iter().map(|s| health.probe(s.addr))).await;
            for ((server, answer), failed) in self.servers.iter().zip(answers).zip(&mut failures) {
                let was = server.ready.load(Ordering::Relaxed);
                let now = match answer {
                    Ok(()) => {
                        *failed = 0;
                        if !was {
                            tracing::info!(server = %server.addr, "API server ready again");
                        }
                        true
                    }
                    Err(why) => {
                        *failed = failed.saturating_add(1);
                        let now = *failed < health.failures;
                        if was && !now {
                            tracing::warn!(server = %server.addr, reason = %why,
                                "API server not ready: new connections go to the others");
                        } else {
                            tracing::debug!(server = %server.addr, reason = %why,
                                failures = *failed, "API server readiness probe failed");
                        }
                        now
                    }
                };
                if now != was {
                    server.ready.store(now, Ordering::Relaxed);
                    self.ready_gauge
                        .get_or_create(&labels(server.addr))
                        .set(i64::from(now));
                }
            }
            // Connections stay on a server not ready only while no server is ready (the
            // fallback); otherwise they are closed, and their clients reconnect to a ready one.
            if self.servers.iter().any(|s| s.ready.load(Ordering::Relaxed)) {
                for s in &self.servers {
                    let open = s.open.load(Ordering::Relaxed);
                    if open > 0 && !s.ready.load(Ordering::Relaxed) {
                        tracing::info!(server = %s.addr, connections = open,
                            "API balancer: closing the connections to a server not ready");
                        s.close.send_modify(|g| *g += 1);
                    }
                }
            }
            self.counters.probe_rounds.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU8;
    use std::sync::Mutex;
    use std::time::Instant;

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

    fn any_port() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[tokio::test]
    async fn sticks_to_one_server_and_fails_over_when_it_goes() {
        let (a, a_task) = named_server("a").await;
        let (b, _b_task) = named_server("b").await;
        let bal = Balancer::start(any_port(), vec![a, b], None).await.unwrap();
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
        let bal = Balancer::start(any_port(), vec![closed_port().await], None)
            .await
            .unwrap();
        assert_eq!(answer(&bal).await, "");
        assert_eq!(bal.counters.unserved.load(Ordering::Relaxed), 1);
        assert!(Balancer::start(any_port(), vec![], None).await.is_err());
    }

    // An HTTPS server standing for an API server: its certificate from the test's cluster
    // CA for 127.0.0.1, `/readyz` answered as `mode` says, any other request answered with
    // its one-letter name (the connection then kept open until the client closes it).
    const READY: u8 = 0;
    const NOT_READY: u8 = 1;
    /// Connections accepted and never answered, as a stopped process's kernel does.
    const STALLED: u8 = 2;

    struct TestServer {
        addr: SocketAddr,
        mode: Arc<AtomicU8>,
        _task: tokio::task::JoinHandle<()>,
    }

    impl TestServer {
        async fn start(ca: &skiff_tests::tls::TestCa, name: &'static str, mode: u8) -> TestServer {
            let issued = ca.issue(&["127.0.0.1"]);
            TestServer::serving(&issued.cert_pem, &issued.key_pem, name, mode).await
        }

        async fn serving(
            cert_pem: &str,
            key_pem: &str,
            name: &'static str,
            mode: u8,
        ) -> TestServer {
            let config = control_plane::pki::tls::server_config(cert_pem, key_pem).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let mode = Arc::new(AtomicU8::new(mode));
            let m = mode.clone();
            let held = Arc::new(Mutex::new(Vec::new()));
            let task = tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    if m.load(Ordering::Relaxed) == STALLED {
                        held.lock().unwrap().push(s);
                        continue;
                    }
                    let (acceptor, m) = (acceptor.clone(), m.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(s).await else {
                            return;
                        };
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match tls.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        if head.starts_with(b"GET /readyz ") {
                            let status = match m.load(Ordering::Relaxed) {
                                READY => "200 OK",
                                _ => "500 Internal Server Error",
                            };
                            let _ = tls
                                .write_all(
                                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n")
                                        .as_bytes(),
                                )
                                .await;
                            let _ = tls.shutdown().await;
                            return;
                        }
                        let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n{name}");
                        if tls.write_all(reply.as_bytes()).await.is_ok() {
                            // Open until the client goes (a watch, say), echoing what it sends.
                            while let Ok(n @ 1..) = tls.read(&mut buf).await {
                                if tls.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    });
                }
            });
            TestServer {
                addr,
                mode,
                _task: task,
            }
        }

        fn set(&self, mode: u8) {
            self.mode.store(mode, Ordering::Relaxed);
        }
    }

    /// Probes fast enough for a test, a server not ready at its first failed probe.
    fn quick_check(ca: &skiff_tests::tls::TestCa) -> HealthCheck {
        HealthCheck {
            interval: Duration::from_millis(50),
            failures: 1,
            ..HealthCheck::new(&ca.cert_pem()).unwrap()
        }
    }

    type Tls = tokio_rustls::client::TlsStream<TcpStream>;

    /// An HTTPS request through the balancer, verified as the node's clients verify the
    /// servers; the name of the server that answered, and the connection, still open.
    async fn ask(bal: &Balancer, ca: &skiff_tests::tls::TestCa) -> (String, Tls) {
        let tls = control_plane::pki::tls::client_config(&ca.cert_pem(), None).unwrap();
        let tcp = TcpStream::connect(bal.local).await.unwrap();
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut c = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_rustls::TlsConnector::from(tls).connect(name, tcp),
        )
        .await
        .expect("a TLS handshake in time")
        .expect("a server verified against the cluster CA");
        c.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut reply = [0u8; 39];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut reply))
            .await
            .expect("an answer in time")
            .unwrap();
        let reply = String::from_utf8_lossy(&reply).to_string();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        (reply[reply.len() - 1..].to_string(), c)
    }

    async fn wait_ready(bal: &Balancer, want: &[bool]) {
        let rounds = bal.counters.probe_rounds.load(Ordering::Relaxed);
        skiff_tests::wait_until_async(
            &format!("readiness {want:?}"),
            Duration::from_secs(20),
            || async {
                // At least one full round after the change, so the state is the probes'.
                let done = bal.counters.probe_rounds.load(Ordering::Relaxed) > rounds;
                match bal.ready() {
                    r if done && r == want => Ok(()),
                    r => Err(r),
                }
            },
        )
        .await
    }

    fn gauge(bal: &Balancer, server: SocketAddr) -> i64 {
        bal.ready_gauge().get_or_create(&labels(server)).get()
    }

    #[tokio::test]
    async fn new_connections_go_to_the_ready_server_and_move_when_readiness_does() {
        let ca = skiff_tests::tls::TestCa::new("cluster");
        let a = TestServer::start(&ca, "a", NOT_READY).await;
        let b = TestServer::start(&ca, "b", READY).await;
        // a comes first: only its /readyz keeps connections off it (it takes them).
        let bal = Balancer::start(any_port(), vec![a.addr, b.addr], Some(quick_check(&ca)))
            .await
            .unwrap();
        wait_ready(&bal, &[false, true]).await;
        assert_eq!((gauge(&bal, a.addr), gauge(&bal, b.addr)), (0, 1));
        // As the agent serves it at /metrics.
        let metrics = crate::metrics::Metrics::default();
        metrics.register("api_server_ready", "readiness", bal.ready_gauge());
        let text = metrics.render();
        for (server, v) in [(a.addr, 0), (b.addr, 1)] {
            let line = format!("skiff_node_api_server_ready{{server=\"{server}\"}} {v}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        for _ in 0..3 {
            assert_eq!(ask(&bal, &ca).await.0, "b");
        }
        // a recovers: connections stay with b, which took the last one.
        a.set(READY);
        wait_ready(&bal, &[true, true]).await;
        assert_eq!(ask(&bal, &ca).await.0, "b");
        // b fails its readiness (it still takes connections): they go to a.
        b.set(NOT_READY);
        wait_ready(&bal, &[true, false]).await;
        assert_eq!((gauge(&bal, a.addr), gauge(&bal, b.addr)), (1, 0));
        for _ in 0..3 {
            assert_eq!(ask(&bal, &ca).await.0, "a");
        }
    }

    #[tokio::test]
    async fn a_stalled_server_is_passed_over_and_its_connections_closed() {
        let ca = skiff_tests::tls::TestCa::new("cluster");
        let a = TestServer::start(&ca, "a", READY).await;
        let b = TestServer::start(&ca, "b", READY).await;
        let check = HealthCheck {
            timeout: Duration::from_millis(500),
            ..quick_check(&ca)
        };
        let bal = Balancer::start(any_port(), vec![a.addr, b.addr], Some(check))
            .await
            .unwrap();
        wait_ready(&bal, &[true, true]).await;
        // A long-lived connection (a watch) on a.
        let (first, mut watch) = ask(&bal, &ca).await;
        assert_eq!(first, "a");
        // a stops answering: connections still complete (its listener is open), nothing
        // answers them, its probes time out.
        a.set(STALLED);
        let stalled_at = Instant::now();
        wait_ready(&bal, &[false, true]).await;
        // The watch on a is closed by the balancer, so its client reconnects...
        let mut buf = [0u8; 16];
        let end = tokio::time::timeout(Duration::from_secs(10), watch.read(&mut buf))
            .await
            .expect("the connection to the stalled server closed");
        assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
        assert!(bal.counters.closed_not_ready.load(Ordering::Relaxed) >= 1);
        // ... and lands on b.
        assert_eq!(ask(&bal, &ca).await.0, "b");
        assert!(stalled_at.elapsed() < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn with_no_ready_server_connections_still_go_through() {
        let ca = skiff_tests::tls::TestCa::new("cluster");
        let a = TestServer::start(&ca, "a", NOT_READY).await;
        let bal = Balancer::start(any_port(), vec![a.addr], Some(quick_check(&ca)))
            .await
            .unwrap();
        wait_ready(&bal, &[false]).await;
        let (name, mut conn) = ask(&bal, &ca).await;
        assert_eq!(name, "a");
        // Not closed while no server is ready: a few more rounds, the connection still up.
        let rounds = bal.counters.probe_rounds.load(Ordering::Relaxed);
        skiff_tests::wait_until_async("3 more probe rounds", Duration::from_secs(20), || {
            let done = bal.counters.probe_rounds.load(Ordering::Relaxed);
            async move { (done >= rounds + 3).then_some(()).ok_or(done) }
        })
        .await;
        conn.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut echo))
            .await
            .expect("the echo in time")
            .expect("the connection still open");
        assert_eq!(&echo, b"ping");
        assert_eq!(bal.counters.closed_not_ready.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_server_with_a_certificate_of_another_ca_is_not_ready() {
        let ca = skiff_tests::tls::TestCa::new("cluster");
        let other = skiff_tests::tls::TestCa::new("another");
        let a = TestServer::start(&other, "a", READY).await;
        let b = TestServer::start(&ca, "b", READY).await;
        let bal = Balancer::start(any_port(), vec![a.addr, b.addr], Some(quick_check(&ca)))
            .await
            .unwrap();
        wait_ready(&bal, &[false, true]).await;
        assert_eq!(ask(&bal, &ca).await.0, "b");
    }

    /// Against a real skiff API server: its /readyz answers the probe without a credential,
    /// its certificate verifies against its cluster CA as 127.0.0.1, and a kube client
    /// through the balancer reaches it past a server (first in the list) that is not ready.
    #[tokio::test]
    async fn a_real_api_server_is_probed_and_reached_past_one_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let server = control_plane::apiserver::Server::start(
            control_plane::apiserver::Config::new(dir.path().join("api"), any_port()),
        )
        .await
        .unwrap();
        let pki = server.data_dir().join("pki");
        let ca = control_plane::pki::Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).unwrap();
        let issued = ca
            .issue(&control_plane::pki::CertSpec::server(
                "not-ready",
                vec![control_plane::pki::San::Ip(
                    std::net::Ipv4Addr::LOCALHOST.into(),
                )],
                Duration::from_secs(3600),
            ))
            .unwrap();
        let not_ready =
            TestServer::serving(&issued.cert_pem, &issued.key_pem, "a", NOT_READY).await;
        let check = HealthCheck {
            interval: Duration::from_millis(50),
            failures: 1,
            ..HealthCheck::new(ca.cert_pem()).unwrap()
        };
        let bal = Balancer::start(any_port(), vec![not_ready.addr, server.addr()], Some(check))
            .await
            .unwrap();
        wait_ready(&bal, &[false, true]).await;
        let mut kc = kube::config::Kubeconfig::read_from(server.kubeconfig_path()).unwrap();
        for c in &mut kc.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(format!("https://{}", bal.local));
            }
        }
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(kube::Client::try_from(config).unwrap());
        namespaces
            .list(&Default::default())
            .await
            .expect("a list through the balancer, answered by the real server");
        assert!(bal.counters.relayed.load(Ordering::Relaxed) >= 1);
        drop(bal);
        server.shutdown().await;
    }
}
