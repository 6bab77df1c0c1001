//! Relaying a node agent's kubelet API to the client. The kubelet API is HTTPS: the API
//! server verifies the node agent's serving certificate against the cluster CA and presents
//! its own kubelet-client certificate (`kube-apiserver-kubelet-client`), which the node agent
//! authorizes with a SubjectAccessReview ([`dial`], with `Ctx::kubelet_tls`).
//!
//! - [`stream_get`]: an answer streamed back frame by frame (pods/log).
//! - [`upgrade`]: an HTTP upgrade (pods/exec): the client's handshake goes to the kubelet,
//!   which answers with a redirect to the runtime's streaming server (containerd's CRI
//!   streaming URL for the session); the handshake follows it there, and once that server
//!   switches protocols the two connections are spliced byte for byte, both directions.
//!   The streaming server (containerd's, on the node's address) speaks plain HTTP: its
//!   session URL is the credential, single use and short-lived, as the CRI defines it.
//!   Neither protocol is interpreted here: SPDY/3.1 and the WebSocket channel protocols pass
//!   through unchanged. A handshake the far end refuses goes back to the client as a Status
//!   with that answer's code and text: kubectl 1.33 tries WebSocket `v5.channel.k8s.io`
//!   first, which containerd 1.6 refuses (403), and then falls back to SPDY.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderMap, HeaderName, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::apiserver::output::{self, Resp};
use crate::machinery::{ApiError, Reason};

/// GETs `url` on a node agent and relays status, content type and body as they come.
pub async fn stream_get(tls: &Arc<rustls::ClientConfig>, url: &str) -> Result<Resp, ApiError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| ApiError::internal(format!("kubelet URL {url}: {e}")))?;
    let (io, authority) = dial(&uri, tls).await?;
    let unreachable = |e: hyper::Error| {
        ApiError::unavailable(format!("the node agent did not answer ({url}): {e}"))
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(unreachable)?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "kubelet connection ended with an error");
        }
    });
    let req = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(format!("kubelet request: {e}")))?;
    let resp = sender.send_request(req).await.map_err(unreachable)?;
    let status = resp.status();
    if !status.is_success() {
        return Err(kubelet_error(status, &read_limited(resp).await));
    }
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut out = Response::new(streamed(resp.into_body()));
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(out)
}

/// GETs `url` on a node agent and returns the whole body (at most `limit` bytes); an
/// answer other than 2xx is the error it says.
pub async fn get_body(
    tls: &Arc<rustls::ClientConfig>,
    url: &str,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| ApiError::internal(format!("kubelet URL {url}: {e}")))?;
    let (io, authority) = dial(&uri, tls).await?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::unavailable(format!("the node agent did not answer ({url}): {e}"))
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| unreachable(&e))?;
    let conn = tokio::spawn(conn);
    let req = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(format!("kubelet request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = resp.status();
    if !status.is_success() {
        conn.abort();
        return Err(kubelet_error(status, &read_limited(resp).await));
    }
    let body = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| unreachable(&e));
    conn.abort();
    body
}

/// A byte stream to a node agent, or to the streaming server it redirects to.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// How long connecting (and the TLS handshake) to a node agent may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to `uri`'s host and port: `https` over TLS with `tls` (the node agent's serving
/// certificate checked against the cluster CA for the host the Node reports; the API
/// server's kubelet-client certificate presented), `http` over plain TCP (the runtime's
/// streaming server). Returns the stream and the authority, for the Host header.
pub async fn dial(
    uri: &Uri,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<(Box<dyn Io>, String), ApiError> {
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::unavailable(format!("connecting to {uri}: {e}"));
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(ApiError::internal(format!("not an http(s) URL: {uri}"))),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| ApiError::internal(format!("no host in {uri}")))?;
    let host = authority.host().trim_matches(['[', ']']).to_string();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let connect = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| unreachable(&e))?;
        let _ = stream.set_nodelay(true);
        if !https {
            return Ok::<Box<dyn Io>, ApiError>(Box::new(stream));
        }
        let name =
            rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| unreachable(&e))?;
        let tls = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, stream)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Box::new(tls) as Box<dyn Io>)
    };
    let io = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| unreachable(&"i/o timeout"))??;
    Ok((io, authority.to_string()))
}

/// A far end's body relayed frame by frame as it comes (data frames only).
pub fn streamed(mut body: Incoming) -> output::Body {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Ok(data) = frame.into_data() {
                if tx.send(data).await.is_err() {
                    break;
                }
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    StreamBody::new(stream).boxed_unsync()
}

/// A kubelet's error answer as a Status for the client, its text as the message (as
/// Kubernetes' generic response checker makes it).
fn kubelet_error(status: StatusCode, body: &[u8]) -> ApiError {
    let reason = match status {
        StatusCode::BAD_REQUEST => Reason::BadRequest,
        StatusCode::FORBIDDEN => Reason::Forbidden,
        StatusCode::NOT_FOUND => Reason::NotFound,
        StatusCode::SERVICE_UNAVAILABLE => Reason::ServiceUnavailable,
        _ => Reason::InternalError,
    };
    let text = String::from_utf8_lossy(body).trim().to_string();
    ApiError::new(status.as_u16(), reason, text)
}

/// At most [`ERROR_BYTES`] of a body (error answers are short).
async fn read_limited(resp: Response<Incoming>) -> Bytes {
    match Limited::new(resp.into_body(), ERROR_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    }
}

/// The headers of an upgrade handshake, passed on in both directions (hop-by-hop ones
/// included: they are the handshake).
const HANDSHAKE: &[&str] = &[
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
    "sec-websocket-accept",
    "x-stream-protocol-version",
];

/// Redirects followed from the kubelet to the streaming server (the node agent sends one).
const MAX_REDIRECTS: usize = 3;

/// The most of an error answer's body relayed to the client.
const ERROR_BYTES: usize = 64 * 1024;

/// Whether a request asks to switch protocols (`Connection: Upgrade` and an `Upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Relays the client's upgrade handshake (`method`, `headers`) to `url` on the kubelet,
/// following its redirect on the same host, and once the far end switches protocols splices
/// the client's connection (`client`) to it until either side closes or the server stops.
pub async fn upgrade(
    tls: &Arc<rustls::ClientConfig>,
    method: &Method,
    url: &str,
    headers: &HeaderMap,
    client: OnUpgrade,
    shutdown: CancellationToken,
) -> Result<Resp, ApiError> {
    let mut target: Uri = url
        .parse()
        .map_err(|e| ApiError::internal(format!("kubelet URL {url}: {e}")))?;
    let kubelet_host = target.host().unwrap_or_default().to_string();
    for _ in 0..=MAX_REDIRECTS {
        let resp = handshake(tls, method, &target, headers).await?;
        let status = resp.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(splice(resp, client, shutdown));
        }
        if !status.is_redirection() {
            return Err(kubelet_error(status, &read_limited(resp).await));
        }
        let location = resp
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok());
        target = redirect_target(&target, location, &kubelet_host)?;
    }
    Err(ApiError::internal(format!(
        "the node agent redirected more than {MAX_REDIRECTS} times ({url})"
    )))
}

/// Where a redirect points. Only to the kubelet's own host: a node agent must not be able to
/// send the API server's connections elsewhere (Kubernetes' fix for CVE-2020-8559).
fn redirect_target(
    from: &Uri,
    location: Option<&str>,
    kubelet_host: &str,
) -> Result<Uri, ApiError> {
    let location = location
        .ok_or_else(|| ApiError::internal("the node agent redirected without a Location"))?;
    let mut next: Uri = location.parse().map_err(|e| {
        ApiError::internal(format!("the node agent redirected to {location:?}: {e}"))
    })?;
    if next.authority().is_none() {
        // A relative redirect stays on the same server.
        let mut parts = from.clone().into_parts();
        parts.path_and_query = next.path_and_query().cloned();
        next = Uri::from_parts(parts).map_err(ApiError::internal)?;
    }
    if next.host() != Some(kubelet_host) {
        return Err(ApiError::internal(format!(
            "the node agent redirected to {location}, not on its own host {kubelet_host}"
        )));
    }
    Ok(next)
}

/// Sends the handshake to `uri` on a connection of its own; returns the far end's answer.
async fn handshake(
    tls: &Arc<rustls::ClientConfig>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response<Incoming>, ApiError> {
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::unavailable(format!("connecting to {uri}: {e}"));
    let (stream, authority) = dial(uri, tls).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming connection ended with an error");
        }
    });
    let mut req = Request::builder()
        .method(method.clone())
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(header::HOST, authority.as_str());
    for name in HANDSHAKE {
        for v in headers.get_all(*name) {
            req = req.header(*name, v);
        }
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(ApiError::internal)?;
    sender.send_request(req).await.map_err(|e| unreachable(&e))
}

/// Answers the client with the far end's 101 and splices the two connections once both
/// have switched.
fn splice(mut far: Response<Incoming>, client: OnUpgrade, shutdown: CancellationToken) -> Resp {
    let mut out = Response::new(output::full(Bytes::new()));
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for name in HANDSHAKE {
        for v in far.headers().get_all(*name) {
            out.headers_mut()
                .append(HeaderName::from_static(name), v.clone());
        }
    }
    let far_upgrade = hyper::upgrade::on(&mut far);
    tokio::spawn(async move {
        let (near, far) = match tokio::try_join!(client, far_upgrade) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, "a streaming upgrade did not complete");
                return;
            }
        };
        let (mut near, mut far) = (TokioIo::new(near), TokioIo::new(far));
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut near, &mut far) => match copied {
                Ok((up, down)) => tracing::debug!(up, down, "streaming session ended"),
                Err(e) => tracing::debug!(error = %e, "streaming session ended with an error"),
            },
            _ = shutdown.cancelled() => {}
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_requests_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_upgrade(&h));
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(!is_upgrade(&h), "no Upgrade header");
        h.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_upgrade(&h));
        h.insert(header::CONNECTION, "close".parse().unwrap());
        assert!(!is_upgrade(&h));
    }

    #[test]
    fn redirects_stay_on_the_kubelets_host() {
        let from: Uri = "https://10.0.0.5:10250/exec/ns/p/c?command=ls"
            .parse()
            .unwrap();
        let to = |l| redirect_target(&from, Some(l), "10.0.0.5");
        assert_eq!(
            to("http://10.0.0.5:41234/exec/tok").unwrap().to_string(),
            "http://10.0.0.5:41234/exec/tok"
        );
        assert_eq!(
            to("/exec/tok").unwrap().to_string(),
            "https://10.0.0.5:10250/exec/tok"
        );
        assert_eq!(to("http://10.0.0.6:41234/exec/tok").unwrap_err().code, 500);
        assert_eq!(to("http://127.0.0.1:41234/exec/tok").unwrap_err().code, 500);
        assert!(redirect_target(&from, None, "10.0.0.5").is_err());
    }
}
