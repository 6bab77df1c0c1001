//! The HTTP front: accepting connections (TLS with the cluster CA's serving certificate;
//! plain HTTP only when asked for, on loopback), authentication of every request but the
//! health and version paths, routing of non-resource paths (health, version, metrics,
//! discovery, OpenAPI) and of resource paths to the handlers, request metrics, logs and the
//! audit event of each request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

use super::audit::{self, event};
use super::auth::{AuthnError, ClientCert, UserInfo};
use super::authz::{self, attributes::Attributes};
use super::handlers::{self, Call, Ctx};
use super::negotiate::{self, MAX_BODY_BYTES};
use super::output::{self, Resp};
use super::registry;
use super::request::{self, ApiPath};
use super::warning;
use super::{discovery, health};
use crate::machinery::ApiError;
use crate::pki::ClientVerifier;

/// How long shutdown waits for open connections to finish.
const DRAIN: Duration = Duration::from_secs(5);
/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How connections are accepted.
#[derive(Clone)]
pub enum Transport {
    /// TLS with this configuration; client certificates checked against the CA.
    Tls {
        config: Arc<rustls::ServerConfig>,
        clients: ClientVerifier,
    },
    /// Plain HTTP (a debugging flag, on loopback only): bearer tokens only.
    Plain,
}

/// Serves connections until `ctx.shutdown` fires, then drains them.
pub async fn serve(listener: TcpListener, ctx: Arc<Ctx>, transport: Transport) {
    let graceful = GracefulShutdown::new();
    let acceptor = match &transport {
        Transport::Tls { config, .. } => Some(tokio_rustls::TlsAcceptor::from(config.clone())),
        Transport::Plain => None,
    };
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = ctx.shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (ctx, watcher) = (ctx.clone(), graceful.watcher());
        match (&acceptor, &transport) {
            (Some(acceptor), Transport::Tls { clients, .. }) => {
                let (acceptor, clients) = (acceptor.clone(), clients.clone());
                // The handshake runs on the connection's own task: a slow client never
                // holds up the accept loop.
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            ctx.metrics.handshake("failed");
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            ctx.metrics.handshake("timeout");
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    ctx.metrics.handshake("ok");
                    let cert = match tls.get_ref().1.peer_certificates() {
                        Some(chain) if !chain.is_empty() => match clients.verify(chain) {
                            Ok(c) => ClientCert::Verified(c),
                            Err(why) => ClientCert::Rejected(why),
                        },
                        _ => ClientCert::None,
                    };
                    connection(ctx, watcher, tls, peer, cert).await;
                });
            }
            _ => {
                tokio::spawn(connection(ctx, watcher, stream, peer, ClientCert::None));
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN:?}; closing them");
    }
}

/// Serves one connection (HTTP/1.1 with upgrades, or HTTP/2) until it closes.
async fn connection<S>(
    ctx: Arc<Ctx>,
    watcher: hyper_util::server::graceful::Watcher,
    stream: S,
    peer: SocketAddr,
    cert: ClientCert,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cert = Arc::new(cert);
    let service = service_fn(move |req| {
        let (ctx, cert) = (ctx.clone(), cert.clone());
        async move { Ok::<_, std::convert::Infallible>(handle(ctx, &cert, peer, req).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// One request, logged, counted and audited.
async fn handle(
    ctx: Arc<Ctx>,
    cert: &ClientCert,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Resp {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = request::parse_query(req.uri().query());
    let verb = verb_of(&method, &path, &query);
    let audit_id = audit::audit_id(req.headers());
    let pending = (ctx.audit.enabled() && !is_probe(&path))
        .then(|| audit_event(&req, &path, &query, peer, audit_id.clone()));
    let warnings = warning::Recorder::default();
    let routed = warnings.scope(route(&ctx, cert, peer, req, &query));
    let result = match &pending {
        Some(p) => p.trail.scope(routed).await,
        None => routed.await,
    };
    let (mut resp, status) = match result {
        Ok(r) => {
            let code = r.status().as_u16();
            (r, event::ResponseStatus::code(code))
        }
        Err(e) => (output::error(&e), event::ResponseStatus::error(&e)),
    };
    warnings.apply(&mut resp);
    if let Ok(v) = HeaderValue::from_str(&audit_id) {
        resp.headers_mut().insert(audit::AUDIT_ID_HEADER, v);
    }
    let code = resp.status().as_u16();
    let secs = started.elapsed().as_secs_f64();
    ctx.metrics.request(verb, code, secs);
    tracing::debug!(%method, %path, code, verb, ms = secs * 1e3, %audit_id, "request");
    match pending {
        Some(p) => p.finish(&ctx.audit, status, resp),
        None => resp,
    }
}

/// The health probes, which are not audited (kube-apiserver's usual policy leaves them out:
/// they would be most of the log).
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz")
}

/// The audit event of a request as it arrives (the caller anonymous until authenticated).
fn audit_event(
    req: &Request<Incoming>,
    path: &str,
    query: &HashMap<String, String>,
    peer: SocketAddr,
    audit_id: String,
) -> audit::Pending {
    let attributes = Attributes::of_request(req.method(), path, query);
    let object_ref = event::ObjectRef::of(&attributes);
    let subresource = object_ref.as_ref().map_or("", |o| o.subresource.as_str());
    let long_running = audit::long_running(&attributes.verb, subresource)
        || req.headers().contains_key(header::UPGRADE);
    let request_uri = req
        .uri()
        .path_and_query()
        .map_or_else(|| path.to_string(), |pq| pq.as_str().to_string());
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|ua| ua.chars().take(MAX_USER_AGENT).collect());
    let now = event::micro_time();
    audit::Pending {
        event: event::Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: "Metadata",
            audit_id,
            stage: event::Stage::ResponseComplete,
            request_uri,
            verb: attributes.verb,
            user: event::User::anonymous(),
            impersonated_user: None,
            source_ips: vec![peer.ip().to_string()],
            user_agent,
            object_ref,
            response_status: event::ResponseStatus::code(0),
            request_received_timestamp: now.clone(),
            stage_timestamp: now,
            annotations: Default::default(),
        },
        trail: audit::Trail::default(),
        long_running,
    }
}

/// A user agent longer than this is cut in the audit log (it is the client's to choose).
const MAX_USER_AGENT: usize = 1024;

/// The Kubernetes verb of a request, for metrics.
fn verb_of(m: &Method, path: &str, q: &HashMap<String, String>) -> &'static str {
    let named = matches!(
        request::parse_path(path),
        Some(ApiPath::Resource(request::ResourcePath {
            name: Some(_),
            ..
        }))
    );
    match *m {
        Method::GET if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large(MAX_BODY_BYTES))
        }
        Err(e) => Err(ApiError::bad_request(format!("reading the body: {e}"))),
    }
}

async fn route(
    ctx: &Arc<Ctx>,
    cert: &ClientCert,
    peer: SocketAddr,
    mut req: Request<Incoming>,
    query: &HashMap<String, String>,
) -> Result<Resp, ApiError> {
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/healthz" | "/livez" => return Ok(health::livez(ctx, query)),
        "/readyz" => return Ok(health::readyz(ctx, query)),
        "/version" | "/version/" => return Ok(output::ok(&discovery::version())),
        _ => {}
    }
    let user = authenticate(ctx, req.headers(), cert, peer)?;
    audit::authenticated(&user);
    let user = authz::impersonation::impersonate(ctx, user, req.headers()).await?;
    if req.headers().contains_key(authz::impersonation::USER) {
        audit::impersonating(&user);
    }
    let attributes = Attributes::of_request(req.method(), &path, query);
    match authz::allowed(ctx, &user, &attributes).await? {
        None => audit::decision(true, ""),
        Some(reason) => {
            audit::decision(false, &reason);
            return Err(authz::forbidden(&user, &attributes, &reason));
        }
    }
    if path == "/metrics" {
        // Kubernetes' system:monitoring role grants it.
        return Ok(output::bytes(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ctx.metrics.render(),
        ));
    }
    if req.method() == Method::GET {
        if path == "/openapi/v2" || path == "/openapi/v2/" {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            return Ok(super::openapi_v2::answer(accept));
        }
        if path == "/openapi/v3" || path == "/openapi/v3/" {
            return Ok(output::ok(&discovery::openapi_index()));
        }
        if let Some(gv) = path.strip_prefix("/openapi/v3/") {
            return discovery::openapi_group_version(gv.trim_end_matches('/'))
                .map(|d| output::ok(&d))
                .ok_or_else(|| ApiError::path_not_found(&path));
        }
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (api_path, proxy_path) = request::split_proxy(&path).unwrap_or((&path, ""));
    let api = request::parse_path(api_path).ok_or_else(|| ApiError::path_not_found(&path))?;
    let get_only = |m: &Method| {
        if m != Method::GET {
            Err(ApiError::method_not_allowed(format!(
                "{m} is not allowed on {path}"
            )))
        } else {
            Ok(())
        }
    };
    match api {
        ApiPath::CoreVersions => {
            get_only(req.method())?;
            Ok(match negotiate::aggregated_discovery(accept.as_deref()) {
                Some(v) => discovery::answer_aggregated(&discovery::aggregated(true, v), v),
                None => discovery::answer(&discovery::core_versions(&host(&req))),
            })
        }
        ApiPath::Groups => {
            get_only(req.method())?;
            Ok(match negotiate::aggregated_discovery(accept.as_deref()) {
                Some(v) => discovery::answer_aggregated(&discovery::aggregated(false, v), v),
                None => discovery::answer(&discovery::groups()),
            })
        }
        ApiPath::Group(g) => {
            get_only(req.method())?;
            discovery::group(&g)
                .map(|v| discovery::answer(&v))
                .ok_or_else(|| ApiError::path_not_found(&path))
        }
        ApiPath::GroupVersion { group, version } => {
            get_only(req.method())?;
            if !registry::serves(&group, &version) {
                return Err(ApiError::path_not_found(&path));
            }
            Ok(discovery::answer(&discovery::resource_list(
                &group, &version,
            )))
        }
        ApiPath::Resource(rp) => {
            let legacy_binding = rp.group.is_empty()
                && rp.resource == "bindings"
                && rp.name.is_none()
                && rp.namespace.is_some()
                && req.method() == Method::POST;
            let resource = if legacy_binding {
                registry::find("", "v1", "pods")
            } else {
                registry::find(&rp.group, &rp.version, &rp.resource)
            }
            .ok_or_else(|| ApiError::path_not_found(&path))?;
            let method = req.method().clone();
            let headers = req.headers().clone();
            let query_string = req.uri().query().unwrap_or_default().to_string();
            let upgrade = headers
                .contains_key(header::UPGRADE)
                .then(|| hyper::upgrade::on(&mut req));
            let body = read_body(req.into_body()).await?;
            let call = Call {
                method: &method,
                path: &rp,
                resource,
                query,
                headers: &headers,
                body,
                query_string: &query_string,
                upgrade,
                user: &user,
                proxy_path,
            };
            if legacy_binding {
                handlers::legacy_binding(ctx, call).await
            } else {
                handlers::dispatch(ctx, call).await
            }
        }
    }
}

/// The address the client used, for APIVersions.
fn host(req: &Request<Incoming>) -> String {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The caller, or 401 (the reason logged, not told: Kubernetes answers every failed
/// authentication with the same Status).
fn authenticate(
    ctx: &Ctx,
    headers: &http::HeaderMap,
    cert: &ClientCert,
    peer: SocketAddr,
) -> Result<UserInfo, ApiError> {
    match ctx.authenticator.authenticate(headers, cert) {
        Ok(user) => {
            ctx.metrics.authentication("ok");
            Ok(user)
        }
        Err(e) => {
            ctx.metrics.authentication("unauthorized");
            match &e {
                AuthnError::NoCredentials => tracing::debug!(%peer, "anonymous request refused"),
                AuthnError::Rejected(_) => tracing::info!(%peer, error = %e, "unauthorized"),
            }
            Err(ApiError::unauthorized())
        }
    }
}
