//! pods/proxy, services/proxy and nodes/proxy: any HTTP request under
//! `.../<name>/proxy/<path>` relayed to a backend and its answer relayed back.
//!
//! - pods: `[scheme:]pod[:port]`, the port given or the first container port.
//! - services: `[scheme:]service[:port]`, the port by name or number; a ready address of the
//!   service's Endpoints with that port, picked at random (Kubernetes' ResourceLocation).
//! - nodes: `[scheme:]node[:port]`, the node agent's own API when no port (or its port) is
//!   given (over HTTPS as `kube-apiserver-kubelet-client`, as every call to a node agent);
//!   another port of the node's address otherwise.
//!
//! The API server reaches pods through the node agent that runs them (`/podTunnel`, a TCP
//! connection from the node spliced to an HTTP upgrade), never by routing to the pod
//! network itself: the control plane needs no route to any pod CIDR, and the node agent
//! only connects to addresses of pods it runs. The request goes on without the caller's
//! credentials or hop-by-hop headers; the backend's redirects within itself are rewritten to
//! stay under the proxy path, its CORS grants dropped (see `proxy_url`). `.../proxy`
//! without a path is redirected to `.../proxy/`, as Kubernetes does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::kubelet::{kubelet_of, kubelet_of_pod};
use super::{Call, Ctx};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::proxy_url::{self, ProxyName, Scheme};
use crate::apiserver::registry;
use crate::machinery::ApiError;

/// How long connecting to a backend may take.
const CONNECT_TIMEOUT: Duration = super::proxy::CONNECT_TIMEOUT;

/// The most of a refused tunnel's answer kept for the error message.
const ERROR_BYTES: usize = 16 * 1024;

/// Where a proxied request goes.
enum Backend {
    /// A pod's port, through the node agent running it.
    Pod {
        kubelet: String,
        namespace: String,
        pod: String,
        port: u16,
    },
    /// The node agent's own API (`https://host:port`), reached from the API server itself.
    Kubelet(String),
    /// `host:port` reached from the API server itself (another port of a node).
    Direct(String),
}

impl Backend {
    /// The authority the request names (Host), and that redirects may name.
    fn authority(&self, pod_ip: &str) -> String {
        match self {
            Backend::Pod { port, .. } => join_host_port(pod_ip, *port),
            Backend::Kubelet(url) => url.trim_start_matches("https://").to_string(),
            Backend::Direct(a) => a.clone(),
        }
    }
}

/// Which kind's proxy subresource a call is.
pub async fn proxy(ctx: &Arc<Ctx>, call: &Call<'_>, id: &str) -> Result<Resp, ApiError> {
    let prefix = prefix_of(call, id);
    if call.proxy_path.is_empty() {
        let query = if call.query_string.is_empty() {
            String::new()
        } else {
            format!("?{}", call.query_string)
        };
        return Ok(redirect(&format!("{prefix}/{query}")));
    }
    let invalid =
        || ApiError::bad_request(format!("invalid {} request {id:?}", call.resource.singular));
    let target = ProxyName::parse(id).ok_or_else(invalid)?;
    admit(ctx, call, id).await?;
    let (scheme, backend, pod_ip) = match call.resource.kind {
        "Pod" => pod_backend(ctx, call, &target).await?,
        "Service" => service_backend(ctx, call, &target).await?,
        _ => node_backend(ctx, &target).await?,
    };
    relay(ctx, call, &prefix, scheme, &backend, &pod_ip).await
}

/// A proxy request is a CONNECT to admission (as in Kubernetes), with PodProxyOptions,
/// ServiceProxyOptions or NodeProxyOptions naming the path.
async fn admit(ctx: &Ctx, call: &Call<'_>, id: &str) -> Result<(), ApiError> {
    let options = serde_json::json!({
        "kind": format!("{}ProxyOptions", call.resource.kind),
        "apiVersion": "v1",
        "path": call.proxy_path,
    });
    let req = crate::apiserver::admission::Request::new(
        crate::apiserver::admission::Operation::Connect,
        call.resource,
        call.namespace(),
        id,
        call.user,
    )
    .subresource(Some("proxy"))
    .options(options);
    ctx.admission.admit_without_object(&req).await
}

/// `/api/v1/[namespaces/<ns>/]<resource>/<id>/proxy`
fn prefix_of(call: &Call<'_>, id: &str) -> String {
    let ns = call
        .namespace()
        .map(|n| format!("namespaces/{n}/"))
        .unwrap_or_default();
    format!("/api/v1/{ns}{}/{id}/proxy", call.resource.plural)
}

fn redirect(location: &str) -> Resp {
    let mut out = Response::new(output::full(Bytes::new()));
    *out.status_mut() = StatusCode::MOVED_PERMANENTLY;
    if let Ok(l) = HeaderValue::from_str(location) {
        out.headers_mut().insert(header::LOCATION, l);
    }
    out
}

/// An object from the watch cache by resource and key parts.
async fn cached(
    ctx: &Ctx,
    plural: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Value>, ApiError> {
    let r = registry::find("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
    ctx.cached(r, &r.key(namespace, name))
        .await?
        .map(|o| o.value().map_err(ApiError::internal))
        .transpose()
}

fn parse_port(port: &str, what: &str) -> Result<u16, ApiError> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?} for {what}")))
}

async fn pod_backend(
    ctx: &Ctx,
    call: &Call<'_>,
    target: &ProxyName<'_>,
) -> Result<(Scheme, Backend, String), ApiError> {
    let ns = call.namespace().unwrap_or_default();
    let pod = cached(ctx, "pods", Some(ns), target.name)
        .await?
        .ok_or_else(|| call.not_found(target.name))?;
    let scheme = target.scheme.unwrap_or(Scheme::Http);
    let port = if target.port.is_empty() {
        // Kubernetes: the first port of the first container that declares one.
        pod.pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|c| c.pointer("/ports/0/containerPort").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(scheme.default_port())
    } else {
        parse_port(target.port, &format!("pod {}", target.name))?
    };
    let ip = pod_ip(&pod).ok_or_else(|| {
        ApiError::unavailable(format!("pod {} has no IP address yet", target.name))
    })?;
    let kubelet = kubelet_of_pod(ctx, &pod, target.name).await?;
    let backend = Backend::Pod {
        kubelet,
        namespace: ns.to_string(),
        pod: target.name.to_string(),
        port,
    };
    Ok((scheme, backend, ip))
}

fn pod_ip(pod: &Value) -> Option<String> {
    pod.pointer("/status/podIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .map(str::to_string)
}

async fn service_backend(
    ctx: &Ctx,
    call: &Call<'_>,
    target: &ProxyName<'_>,
) -> Result<(Scheme, Backend, String), ApiError> {
    let ns = call.namespace().unwrap_or_default();
    let svc = cached(ctx, "services", Some(ns), target.name)
        .await?
        .ok_or_else(|| call.not_found(target.name))?;
    // A port number means the service port with that number, by its name.
    let mut port_name = target.port.to_string();
    if let Ok(number) = target.port.parse::<i64>() {
        port_name = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_i64() == Some(number))
            .map(|p| p["name"].as_str().unwrap_or_default().to_string())
            .ok_or_else(|| {
                ApiError::unavailable(format!(
                    "no service port {number} found for service {:?}",
                    target.name
                ))
            })?;
    }
    let none = || {
        ApiError::unavailable(format!(
            "no endpoints available for service {:?}",
            target.name
        ))
    };
    let eps = cached(ctx, "endpoints", Some(ns), target.name)
        .await?
        .ok_or_else(none)?;
    let subsets: Vec<&Value> = eps
        .get("subsets")
        .and_then(Value::as_array)
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    // Start at a random subset and address, as Kubernetes does, so that load spreads.
    let start = rand::random::<u32>() as usize;
    for i in 0..subsets.len() {
        let ss = subsets[(start + i) % subsets.len()];
        let Some(port) = ss
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        let addresses: Vec<&Value> = ss
            .get("addresses")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        for j in 0..addresses.len() {
            let a = addresses[(start + j) % addresses.len()];
            // Only addresses that are a pod's, whose IP it still has (Kubernetes'
            // isValidAddress); the pod's node agent carries the connection.
            let (Some(ip), Some("Pod"), Some(pod_name)) = (
                a["ip"].as_str(),
                a.pointer("/targetRef/kind").and_then(Value::as_str),
                a.pointer("/targetRef/name").and_then(Value::as_str),
            ) else {
                continue;
            };
            let pod_ns = a
                .pointer("/targetRef/namespace")
                .and_then(Value::as_str)
                .unwrap_or(ns);
            let Some(pod) = cached(ctx, "pods", Some(pod_ns), pod_name).await? else {
                continue;
            };
            if pod_ip(&pod).as_deref() != Some(ip) {
                continue;
            }
            let Ok(kubelet) = kubelet_of_pod(ctx, &pod, pod_name).await else {
                continue;
            };
            let backend = Backend::Pod {
                kubelet,
                namespace: pod_ns.to_string(),
                pod: pod_name.to_string(),
                port,
            };
            return Ok((
                target.scheme.unwrap_or(Scheme::Http),
                backend,
                ip.to_string(),
            ));
        }
    }
    Err(none())
}

async fn node_backend(
    ctx: &Ctx,
    target: &ProxyName<'_>,
) -> Result<(Scheme, Backend, String), ApiError> {
    let node = cached(ctx, "nodes", None, target.name)
        .await?
        .ok_or_else(|| ApiError::not_found("", "nodes", target.name))?;
    let kubelet = kubelet_of(&node)
        .ok_or_else(|| ApiError::bad_request(format!("node {} reports no address", target.name)))?;
    let kubelet_authority = kubelet
        .strip_prefix("https://")
        .ok_or_else(|| ApiError::internal(format!("kubelet address {kubelet}")))?;
    let kubelet_port = kubelet_authority.rsplit(':').next().unwrap_or_default();
    if target.port.is_empty() || target.port == kubelet_port {
        // The node agent's API, spoken as the node agent speaks it.
        return Ok((Scheme::Https, Backend::Kubelet(kubelet), String::new()));
    }
    let port = parse_port(target.port, &format!("node {}", target.name))?;
    let host = kubelet_authority
        .rsplit_once(':')
        .map(|(h, _)| h.trim_matches(['[', ']']))
        .unwrap_or_default();
    let ip: std::net::IpAddr = host
        .parse()
        .map_err(|_| ApiError::bad_request(format!("node {} has no IP address", target.name)))?;
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return Err(ApiError::bad_request(format!(
            "address not allowed: node {} has address {ip}",
            target.name
        )));
    }
    Ok((
        target.scheme.unwrap_or(Scheme::Http),
        Backend::Direct(join_host_port(host, port)),
        String::new(),
    ))
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

use super::proxy::Io;

fn unreachable(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!("error trying to reach service: {e}"))
}

async fn connect(addr: &str) -> Result<tokio::net::TcpStream, ApiError> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(format!("dial tcp {addr}: i/o timeout")))?
        .map_err(|e| unreachable(format!("dial tcp {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Opens the byte stream: directly, to the node agent, or through the pod's node agent.
async fn open(ctx: &Ctx, backend: &Backend) -> Result<Box<dyn Io>, ApiError> {
    let (kubelet, namespace, pod, port) = match backend {
        Backend::Direct(addr) => return Ok(Box::new(connect(addr).await?)),
        Backend::Kubelet(url) => return Ok(dial_kubelet(ctx, url).await?.0),
        Backend::Pod {
            kubelet,
            namespace,
            pod,
            port,
        } => (kubelet, namespace, pod, port),
    };
    let (stream, authority) = dial_kubelet(ctx, kubelet).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(unreachable)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "pod tunnel connection ended with an error");
        }
    });
    let req = Request::get(format!("/podTunnel/{namespace}/{pod}/{port}"))
        .header(header::HOST, authority.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "tcp")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(ApiError::internal)?;
    let mut resp = sender.send_request(req).await.map_err(unreachable)?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        let body = Limited::new(resp.into_body(), ERROR_BYTES)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim().to_string();
        return Err(
            if status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND {
                ApiError::bad_request(text)
            } else {
                unreachable(text)
            },
        );
    }
    let upgraded = hyper::upgrade::on(&mut resp).await.map_err(unreachable)?;
    Ok(Box::new(TokioIo::new(upgraded)))
}

/// A connection to a node agent's API (`https://host:port`), its authority.
async fn dial_kubelet(ctx: &Ctx, url: &str) -> Result<(Box<dyn Io>, String), ApiError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| ApiError::internal(format!("kubelet URL {url}: {e}")))?;
    super::proxy::dial(&uri, &ctx.kubelet_tls).await
}

/// Sends the client's request to the backend and streams the answer back.
async fn relay(
    ctx: &Ctx,
    call: &Call<'_>,
    prefix: &str,
    scheme: Scheme,
    backend: &Backend,
    pod_ip: &str,
) -> Result<Resp, ApiError> {
    let authority = backend.authority(pod_ip);
    let mut io = open(ctx, backend).await?;
    if scheme == Scheme::Https && !matches!(backend, Backend::Kubelet(_)) {
        io = Box::new(tls_to_backend(io, &authority).await?);
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(unreachable)?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "proxied connection ended with an error");
        }
    });
    let path_and_query = if call.query_string.is_empty() {
        call.proxy_path.to_string()
    } else {
        format!("{}?{}", call.proxy_path, call.query_string)
    };
    let mut req = Request::builder()
        .method(call.method.clone())
        .uri(path_and_query)
        .header(header::HOST, &authority);
    for (name, value) in call.headers {
        if !proxy_url::drop_request_header(name.as_str()) {
            req = req.header(name, value);
        }
    }
    // Kubernetes' proxy transport tells the backend the path the client used.
    req = req.header("x-forwarded-uri", format!("{prefix}{}", call.proxy_path));
    let req = req
        .body(Full::new(call.body.clone()))
        .map_err(|e| ApiError::bad_request(format!("proxied request: {e}")))?;
    let resp = sender.send_request(req).await.map_err(unreachable)?;
    let request_host = call.header(header::HOST).unwrap_or_default();
    Ok(answer(resp, &authority, request_host, prefix))
}

/// TLS to an `https:` pod or service backend over `io` (the pod tunnel, or a direct
/// connection), its certificate not verified as Kubernetes' proxy transport does not; the
/// server name sent is the backend's host (an IP address: no SNI).
async fn tls_to_backend(
    io: Box<dyn super::proxy::Io>,
    authority: &str,
) -> Result<impl super::proxy::Io, ApiError> {
    let config = crate::pki::tls::unverified_backend_config().map_err(ApiError::internal)?;
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| ApiError::bad_request(format!("backend name {host:?}: {e}")))?;
    tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_rustls::TlsConnector::from(config).connect(name, io),
    )
    .await
    .map_err(|_| unreachable("the TLS handshake timed out"))?
    .map_err(unreachable)
}

/// The backend's answer for the client: its status, its headers but the hop-by-hop and
/// CORS ones, a redirect within the backend kept under the proxy path, the body streamed.
fn answer(resp: Response<Incoming>, backend: &str, request_host: &str, prefix: &str) -> Resp {
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(super::proxy::streamed(body));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if proxy_url::drop_response_header(name.as_str()) {
            continue;
        }
        if name == header::LOCATION {
            if let Some(l) = value.to_str().ok().and_then(|l| {
                HeaderValue::from_str(&proxy_url::rewrite_location(
                    l,
                    backend,
                    request_host,
                    prefix,
                ))
                .ok()
            }) {
                out.headers_mut().append(name, l);
                continue;
            }
        }
        out.headers_mut().append(name, value.clone());
    }
    out
}
