//! The agent's API, HTTPS only (the kubelet's port, 10250): /healthz, /metrics (Prometheus),
//! and the kubelet API the API server proxies to for `kubectl logs` and `kubectl exec`.
//! Its serving certificate comes from the cluster CA (`--tls-cert-file`,
//! `--tls-private-key-file`); client certificates are checked against `--client-ca-file`;
//! every request is authenticated and authorized first (`api_auth`), /healthz included, as
//! on the kubelet's port:
//!
//! - `GET /stats/summary` (nodes/stats): CPU and memory of the node, its pods and
//!   containers as the kubelet's Summary API JSON; `GET /metrics/resource` (nodes/metrics):
//!   the same as the kubelet's resource metrics in Prometheus text. Both from the last
//!   sample of [`crate::stats`]; 503 until the first one.
//! - `GET /containerLogs/{namespace}/{pod}/{container}?follow=&previous=&tailLines=&timestamps=`
//!   streams the container's log (text/plain), from the CRI log files under the data dir.
//! - `GET|POST /exec/{namespace}/{pod}/{container}?command=..&stdin=&stdout=&stderr=&tty=`
//!   answers 302 with the runtime's streaming URL for that exec session (CRI Exec); the caller
//!   follows it and upgrades there (the kubelet's redirect-container-streaming mode).
//! - `GET|POST /attach/{namespace}/{pod}/{container}?stdin=&stdout=&stderr=&tty=`: the same
//!   for attaching to the container's own stdio (CRI Attach).
//! - `GET|POST /portForward/{namespace}/{pod}?port=..`: the same for a port-forward session
//!   into the pod's sandbox (CRI PortForward; the ports travel in the streams' headers).
//! - `GET /podTunnel/{namespace}/{pod}/{port}` with `Connection: Upgrade`, `Upgrade: tcp`:
//!   a TCP connection from this node to that port of the pod (which must run here), spliced
//!   to the upgraded request once the pod accepted it. The API server's pods/proxy and
//!   services/proxy speak HTTP (or TLS) through it, so the control plane needs no route to
//!   pod networks (the role Kubernetes gives Konnectivity).

use crate::agent::pods::PodIndex;
use crate::api_auth::{self, Gate, Peer, User};
use crate::cri::Cri;
use crate::layout::Layout;
use crate::metrics::Metrics;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use control_plane::pki::{ClientVerifier, PkiError};
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The TLS material of the node agent's API: its serving certificate and key, and the CA
/// that client certificates must come from (PEM).
#[derive(Clone)]
pub struct ApiTls {
    pub cert_pem: String,
    pub key_pem: String,
    pub client_ca_pem: String,
}

impl std::fmt::Debug for ApiTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTls").finish_non_exhaustive()
    }
}

impl ApiTls {
    /// Reads the three files (`--tls-cert-file`, `--tls-private-key-file`,
    /// `--client-ca-file`).
    pub fn read(cert: &FsPath, key: &FsPath, client_ca: &FsPath) -> Result<ApiTls, PkiError> {
        use control_plane::pki::files::read_text;
        Ok(ApiTls {
            cert_pem: read_text(cert)?,
            key_pem: read_text(key)?,
            client_ca_pem: read_text(client_ca)?,
        })
    }

    /// The server's TLS configuration and the client-certificate check.
    pub fn server(&self) -> Result<(Arc<rustls::ServerConfig>, ClientVerifier), PkiError> {
        let config = control_plane::pki::tls::server_config(&self.cert_pem, &self.key_pem)?;
        let ca = control_plane::pki::tls::certs_from_pem(&self.client_ca_pem)?
            .into_iter()
            .next()
            .ok_or_else(|| PkiError::Invalid("the client CA file has no certificate".into()))?;
        Ok((config, ClientVerifier::new(&ca)?))
    }
}

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open connections (log streams, tunnels) to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` over TLS on `listener` until `shutdown`, then drains. Each connection's
/// client certificate is verified once, after the handshake, and its identity (or why it was
/// rejected) goes with each of its requests to [`api_auth::guard`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Arc<rustls::ServerConfig>,
    clients: ClientVerifier,
    shutdown: CancellationToken,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, addr): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, clients, app, watcher) = (
            acceptor.clone(),
            clients.clone(),
            app.clone(),
            graceful.watcher(),
        );
        // The handshake runs on the connection's own task: a slow client never holds up the
        // accept loop.
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%addr, "TLS handshake timed out");
                    return;
                }
            };
            let peer = Arc::new(match tls.get_ref().1.peer_certificates() {
                Some(chain) if !chain.is_empty() => match clients.verify(chain) {
                    Ok(c) => Peer::Certificate(User::of_certificate(&c.subject)),
                    Err(why) => Peer::Rejected(why),
                },
                _ => Peer::Anonymous,
            });
            let service = hyper::service::service_fn(
                move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer.clone());
                    tower::ServiceExt::oneshot(app.clone(), req)
                },
            );
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%addr, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("API connections still open after {DRAIN:?}; closing them");
    }
}

#[derive(Clone)]
pub struct ApiState {
    pub metrics: Arc<Metrics>,
    pub pods: PodIndex,
    pub layout: Layout,
    pub cri: Cri,
    pub stats: crate::stats::StatsCache,
}

/// Every route, behind authentication and authorization (`gate`), unknown paths included.
pub fn router(state: ApiState, gate: Gate) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/metrics/resource", get(resource_metrics))
        .route("/stats/summary", get(summary))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(logs))
        .route("/exec/{namespace}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach).post(attach),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route("/podTunnel/{namespace}/{pod}/{port}", get(pod_tunnel))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(gate, api_auth::guard))
}

async fn metrics(State(s): State<ApiState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

/// The last resource sample, if one was taken yet.
fn last_sample(s: &ApiState) -> Option<Arc<control_plane::resource_metrics::summary::Summary>> {
    s.stats.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Before the first sample: 503.
fn no_sample_yet() -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "no resource usage sampled yet",
    )
}

/// `GET /stats/summary` (`?only_cpu_and_memory=true` is what it always answers).
async fn summary(State(s): State<ApiState>) -> Response {
    match last_sample(&s) {
        Some(summary) => axum::Json(summary.as_ref()).into_response(),
        None => no_sample_yet(),
    }
}

/// `GET /metrics/resource`.
async fn resource_metrics(State(s): State<ApiState>) -> Response {
    match last_sample(&s) {
        Some(summary) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            crate::stats::resource_metrics(&summary),
        )
            .into_response(),
        None => no_sample_yet(),
    }
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], msg.into()).into_response()
}

/// Query parameters as (key, value) pairs, repeated keys kept (exec's `command`).
fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs
        .iter()
        .any(|(k, v)| k == name && (v == "true" || v == "1"))
}

/// The log files of a container, oldest attempt first.
fn attempts(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let n = p.file_stem()?.to_str()?.parse().ok()?;
            Some((n, p))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// CRI log lines (`<time> <stream> <P|F> <text>`) as the text a user wrote, joining partial
/// lines; with `timestamps` each line keeps its time prefix.
pub fn parse_cri_log(raw: &str, timestamps: bool, flush_partial: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut partial = String::new();
    for line in raw.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(time), Some(_stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let content = parts.next().unwrap_or_default();
        if partial.is_empty() && timestamps {
            partial.push_str(time);
            partial.push(' ');
        }
        partial.push_str(content);
        if tag != "P" {
            out.push(std::mem::take(&mut partial));
        }
    }
    // Output that ended without a newline (`cat` of a file that has none) is the runtime's
    // last partial line: shown, as the kubelet does; a follower waits for the rest instead.
    if !partial.is_empty() && flush_partial {
        out.push(partial);
    }
    out
}

/// Whether the container's output so far ended without a newline (its last CRI record is a
/// partial one): the log then ends without one too, as the kubelet writes it, so `cat` of a
/// file with no final newline (`/proc/1/cmdline`) reads back byte for byte.
fn ends_unterminated(raw: &str) -> bool {
    raw.lines().next_back().and_then(|l| l.split(' ').nth(2)) == Some("P")
}

async fn logs(
    State(s): State<ApiState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let q = query_pairs(query.as_deref());
    let uid = match on_this_node(&s, &namespace, &pod, |p| p.metadata.uid.clone()) {
        Ok(uid) => uid.unwrap_or_default(),
        Err((status, msg)) => return text(status, msg),
    };
    let dir = s
        .layout
        .pod_log_dir(&namespace, &pod, &uid)
        .join(&container);
    let files = attempts(&dir);
    let previous = flag(&q, "previous");
    let file = if previous {
        files.len().checked_sub(2).map(|i| files[i].clone())
    } else {
        files.last().cloned()
    };
    let Some(file) = file else {
        let what = if previous {
            "previous terminated container"
        } else {
            "container"
        };
        return text(
            StatusCode::BAD_REQUEST,
            format!("{what} \"{container}\" in pod \"{pod}\" has no logs"),
        );
    };
    let timestamps = flag(&q, "timestamps");
    let tail: Option<usize> = q
        .iter()
        .find(|(k, _)| k == "tailLines")
        .and_then(|(_, v)| v.parse().ok());
    let raw = tokio::fs::read_to_string(&file).await.unwrap_or_default();
    let lines = parse_cri_log(&raw, timestamps, true);
    let start = tail.map_or(0, |n| lines.len().saturating_sub(n));
    let mut first = String::new();
    for l in &lines[start..] {
        first.push_str(l);
        first.push('\n');
    }
    if start < lines.len() && ends_unterminated(&raw) {
        first.pop();
    }
    if !flag(&q, "follow") || previous {
        return text(StatusCode::OK, first);
    }
    // Follow: send new complete lines as they are written, until a newer attempt starts,
    // the pod leaves this node, or the client goes away.
    let offset = raw.rfind('\n').map_or(0, |i| i + 1) as u64;
    let attempts_now = files.len();
    let stream = futures::stream::unfold((Some(first), offset), move |(pending, mut offset)| {
        let (file, dir, pods, key) = (
            file.clone(),
            dir.clone(),
            s.pods.clone(),
            (namespace.clone(), pod.clone()),
        );
        async move {
            if let Some(first) = pending {
                return Some((Ok::<_, std::io::Error>(first), (None, offset)));
            }
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let raw = tokio::fs::read(&file).await.ok()?;
                if (raw.len() as u64) > offset {
                    let new = String::from_utf8_lossy(&raw[offset as usize..]).into_owned();
                    if let Some(end) = new.rfind('\n') {
                        offset += end as u64 + 1;
                        let mut chunk = String::new();
                        for l in parse_cri_log(&new[..=end], timestamps, false) {
                            chunk.push_str(&l);
                            chunk.push('\n');
                        }
                        return Some((Ok(chunk), (None, offset)));
                    }
                }
                let gone = !pods
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&key);
                if gone || attempts(&dir).len() > attempts_now {
                    return None;
                }
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

async fn exec(
    State(s): State<ApiState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let q = query_pairs(query.as_deref());
    let id = match container_id(&s, &namespace, &pod, &container) {
        Ok(id) => id,
        Err((status, msg)) => return text(status, msg),
    };
    let cmd: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if cmd.is_empty() {
        return text(StatusCode::BAD_REQUEST, "no command given");
    }
    let io = Stdio::of(&q);
    let req = k8s_cri::v1::ExecRequest {
        container_id: id,
        cmd,
        tty: io.tty,
        stdin: io.stdin,
        stdout: io.stdout,
        stderr: io.stderr,
    };
    redirect(s.cri.exec(req).await)
}

async fn attach(
    State(s): State<ApiState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let q = query_pairs(query.as_deref());
    let id = match container_id(&s, &namespace, &pod, &container) {
        Ok(id) => id,
        Err((status, msg)) => return text(status, msg),
    };
    let io = Stdio::of(&q);
    let req = k8s_cri::v1::AttachRequest {
        container_id: id,
        stdin: io.stdin,
        tty: io.tty,
        stdout: io.stdout,
        stderr: io.stderr,
    };
    redirect(s.cri.attach(req).await)
}

/// The streams an exec or attach session asked for (stdout unless said otherwise).
struct Stdio {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl Stdio {
    fn of(q: &[(String, String)]) -> Stdio {
        Stdio {
            stdin: flag(q, "stdin"),
            stdout: flag(q, "stdout") || !q.iter().any(|(k, _)| k == "stdout"),
            stderr: flag(q, "stderr"),
            tty: flag(q, "tty"),
        }
    }
}

/// Reads what `f` takes from the pod `namespace/pod` if it is on this node, else the 404
/// saying so.
fn on_this_node<T>(
    s: &ApiState,
    namespace: &str,
    pod: &str,
    f: impl FnOnce(&k8s_openapi::api::core::v1::Pod) -> T,
) -> Result<T, (StatusCode, String)> {
    let pods = s.pods.read().unwrap_or_else(|e| e.into_inner());
    pods.get(&(namespace.to_string(), pod.to_string()))
        .map(f)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("pod {namespace}/{pod} is not on this node"),
            )
        })
}

/// The runtime's id of a container of a pod on this node, or the response saying why not.
fn container_id(
    s: &ApiState,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<String, (StatusCode, String)> {
    on_this_node(s, namespace, pod, |p| {
        p.status
            .iter()
            .flat_map(|st| {
                st.container_statuses
                    .iter()
                    .flatten()
                    .chain(st.init_container_statuses.iter().flatten())
                    .chain(st.ephemeral_container_statuses.iter().flatten())
            })
            .find(|c| c.name == container)
            .and_then(|c| c.container_id.as_deref())
            .map(|id| id.trim_start_matches("containerd://").to_string())
    })?
    .ok_or_else(|| {
        (
            StatusCode::BAD_REQUEST,
            format!("container {container} is not running in pod {pod}"),
        )
    })
}

async fn port_forward(
    State(s): State<ApiState>,
    Path((namespace, pod)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let q = query_pairs(query.as_deref());
    let uid = match on_this_node(&s, &namespace, &pod, |p| p.metadata.uid.clone()) {
        Ok(uid) => uid.unwrap_or_default(),
        Err((status, msg)) => return text(status, msg),
    };
    let labels = [(crate::pod::spec::POD_UID.to_string(), uid)].into();
    let sandbox = match s.cri.list_pod_sandboxes(labels).await {
        Ok(found) => found
            .into_iter()
            .filter(|b| b.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32)
            .max_by_key(|b| b.created_at),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.message()),
    };
    let Some(sandbox) = sandbox else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("pod {namespace}/{pod} has no running sandbox"),
        );
    };
    // `port=8080` (or the WebSocket protocol's `ports=8080,9090`).
    let ports = q
        .iter()
        .filter(|(k, _)| k == "port" || k == "ports")
        .flat_map(|(_, v)| v.split(','))
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    redirect(s.cri.port_forward(&sandbox.id, ports).await)
}

/// The protocol a pod tunnel switches to: raw TCP bytes.
const TUNNEL_PROTOCOL: &str = "tcp";

/// `GET /podTunnel/{namespace}/{pod}/{port}`: connects to the pod's IP at `port` from this
/// node, then answers 101 and splices the upgraded connection to it until either side
/// closes. Only pods on this node, and only addresses a pod may have: a loopback, link-local
/// or unspecified podIP (a host-network pod on a loopback node) is refused, as Kubernetes'
/// proxy refuses them, so the tunnel cannot reach the node's own local services.
async fn pod_tunnel(
    State(s): State<ApiState>,
    Path((namespace, pod, port)): Path<(String, String, u16)>,
    mut req: axum::extract::Request,
) -> Response {
    let wants_tcp = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(TUNNEL_PROTOCOL));
    if !wants_tcp {
        return text(
            StatusCode::BAD_REQUEST,
            format!("a pod tunnel needs Connection: Upgrade and Upgrade: {TUNNEL_PROTOCOL}"),
        );
    }
    let ip = match on_this_node(&s, &namespace, &pod, |p| {
        p.status.as_ref().and_then(|st| st.pod_ip.clone())
    }) {
        Ok(Some(ip)) => ip,
        Ok(None) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("pod {namespace}/{pod} has no IP address yet"),
            )
        }
        Err((status, msg)) => return text(status, msg),
    };
    let ip: std::net::IpAddr = match ip.parse() {
        Ok(ip) if proxyable(ip) => ip,
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("address not allowed: pod {namespace}/{pod} has IP {ip}"),
            )
        }
    };
    let addr = std::net::SocketAddr::new(ip, port);
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("dial tcp {addr}: {e}")),
    };
    let _ = stream.set_nodelay(true);
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut near = hyper_util::rt::TokioIo::new(upgraded);
        let mut far = stream;
        if let Err(e) = tokio::io::copy_bidirectional(&mut near, &mut far).await {
            tracing::debug!(error = %e, %addr, "pod tunnel ended with an error");
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, TUNNEL_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

/// Whether a pod's address may be connected to (Kubernetes' `IsProxyableIP`).
fn proxyable(ip: std::net::IpAddr) -> bool {
    let link_local = match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || link_local)
}

/// 302 to the runtime's streaming URL for a session, or the runtime's error.
fn redirect(url: Result<String, crate::cri::CriError>) -> Response {
    match url {
        Ok(url) => Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, url)
            .body(Body::empty())
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response")),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines() {
        let raw = "2024-01-01T00:00:00.1Z stdout F hello\n2024-01-01T00:00:00.2Z stderr P par\n2024-01-01T00:00:00.3Z stderr F tial\n2024-01-01T00:00:00.4Z stdout F \n";
        assert_eq!(parse_cri_log(raw, false, true), ["hello", "partial", ""]);
        assert_eq!(
            parse_cri_log(raw, true, true)[0],
            "2024-01-01T00:00:00.1Z hello"
        );
        let unterminated = "2024-01-01T00:00:00.1Z stdout P /echo\0serve\0\n";
        assert_eq!(parse_cri_log(unterminated, false, true), ["/echo\0serve\0"]);
        assert!(parse_cri_log(unterminated, false, false).is_empty());
        assert!(ends_unterminated(unterminated));
        assert!(!ends_unterminated(raw));
        assert!(!ends_unterminated(""));
    }

    #[test]
    fn tunnels_reach_only_pod_addresses() {
        let ok = |s: &str| proxyable(s.parse().unwrap());
        assert!(ok("10.244.1.5"));
        assert!(ok("fd00::5"));
        assert!(!ok("127.0.0.1"));
        assert!(!ok("::1"));
        assert!(!ok("169.254.169.254"));
        assert!(!ok("fe80::1"));
        assert!(!ok("0.0.0.0"));
        assert!(!ok("224.0.0.1"));
    }

    #[test]
    fn queries() {
        let q = query_pairs(Some("command=%2Fecho&command=cat+x&tty=true&bad=%zz"));
        assert_eq!(q[0], ("command".to_string(), "/echo".to_string()));
        assert_eq!(q[1].1, "cat x");
        assert!(flag(&q, "tty"));
        assert_eq!(q[3].1, "%zz");
    }
}
