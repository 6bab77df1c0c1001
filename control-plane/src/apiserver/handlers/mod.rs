//! The resource handlers: one request on one resource path becomes a get, list, watch,
//! create, update, patch, delete or deletecollection, on the main resource or a subresource.
//! Shared here: the server state the handlers use ([`Ctx`]) and the dispatch by method.

mod authentication;
mod certificates;
mod delete;
mod eviction;
pub(super) mod kubelet;
pub(super) mod metrics_api;
pub(super) mod proxy;
mod proxy_subresource;
mod read;
mod reviews;
mod subresources;
mod watch;
mod write;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use hyper::upgrade::OnUpgrade;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::admission::Chain;
use super::allocation::Allocator;
use super::auth::UserInfo;
use super::authz::Authorizer;
use super::metrics::Metrics;
use super::output::Resp;
use super::registry::{self, Resource, Storage, Subresource};
use super::request::{ListOptions, ResourcePath};
use crate::machinery::ApiError;
use crate::store::cache::{Cache, CachedObject, ResourceCache};
use crate::store::{Revision, Store, StoreError};

/// How long a read waits for the watch cache to catch up with the store.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Server state shared by every request.
pub struct Ctx {
    pub store: Arc<dyn Store>,
    pub cache: Arc<Cache>,
    /// ClusterIPs and NodePorts of Services.
    pub allocator: Allocator,
    /// Who may do what (RBAC and the Node authorizer over the cache).
    pub authz: Authorizer,
    /// Every write passes it before it is persisted.
    pub admission: Chain,
    pub shutdown: CancellationToken,
    pub metrics: Metrics,
    /// How often an idle watch with allowWatchBookmarks gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// How long the watch cache may fail to follow the store before /livez fails.
    pub cache_liveness_grace: Duration,
    /// Who is calling: the authenticators (also TokenReview's and TokenRequest's).
    pub authenticator: super::auth::Authenticator,
    /// The audit log's queue (disabled without `--audit-log-path`).
    pub audit: super::audit::Sink,
    /// How the API server calls node agents: their serving certificates checked against the
    /// cluster CA, its own `kube-apiserver-kubelet-client` certificate presented.
    pub kubelet_tls: Arc<rustls::ClientConfig>,
    /// metrics.k8s.io: what the last scrape of the node agents said.
    pub metrics_api: Arc<metrics_api::MetricsStore>,
}

impl Ctx {
    /// Waits until the cache has every write acknowledged so far (by any API server of the
    /// store), and returns that revision.
    pub async fn fresh(&self) -> Result<Revision, ApiError> {
        self.cache_ready()?;
        let rev = self
            .store
            .latest_revision()
            .await
            .map_err(|e| ApiError::unavailable(format!("reading the store's revision: {e}")))?;
        self.cache
            .wait_for(rev, CACHE_WAIT)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
        Ok(rev)
    }

    /// Waits until the cache is at least at `rev` (a client's resourceVersion).
    pub async fn at_least(&self, rev: Revision) -> Result<(), ApiError> {
        self.cache_ready()?;
        if rev > self.cache.revision() && rev > self.store.current_revision() {
            let latest =
                self.store.latest_revision().await.map_err(|e| {
                    ApiError::unavailable(format!("reading the store's revision: {e}"))
                })?;
            if rev > latest {
                // Kubernetes answers a read from the future with 504 after waiting; fail fast.
                let mut e = ApiError::new(
                    504,
                    crate::machinery::Reason::Timeout,
                    format!("Too large resource version: {rev}, current: {latest}"),
                );
                e.retry_after_seconds = Some(1);
                return Err(e);
            }
        }
        self.cache
            .wait_for(rev, CACHE_WAIT)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))
    }

    /// 503 at once while the watch cache does not follow the store (with the reason).
    pub fn cache_ready(&self) -> Result<(), ApiError> {
        match self.cache.health() {
            None => Ok(()),
            Some(h) => {
                let mut e = ApiError::unavailable(format!(
                    "the watch cache is not following the store: {}",
                    h.reason
                ));
                e.retry_after_seconds = Some(1);
                Err(e)
            }
        }
    }

    pub fn resource_cache(&self, r: &Resource) -> Result<&Arc<ResourceCache>, ApiError> {
        self.cache
            .resource(&r.cache_prefix())
            .map_err(ApiError::internal)
    }

    /// The cached object at `key`, after catching up with the store.
    pub async fn cached(
        &self,
        r: &Resource,
        key: &str,
    ) -> Result<Option<Arc<CachedObject>>, ApiError> {
        self.fresh().await?;
        self.resource_cache(r)?
            .get(key)
            .map_err(|u| undecodable(key, u))
    }
}

/// A request on a resource path, as the handlers see it.
pub struct Call<'a> {
    pub method: &'a Method,
    pub path: &'a ResourcePath,
    pub resource: &'static Resource,
    pub query: &'a std::collections::HashMap<String, String>,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    /// The raw query string (for parameters that repeat, such as exec's `command`).
    pub query_string: &'a str,
    /// The connection's switch of protocols, when the request asked for one.
    pub upgrade: Option<OnUpgrade>,
    /// Who is calling (authenticated before the call was made).
    pub user: &'a UserInfo,
    /// For a proxy subresource, the path relayed to the backend as the client wrote it
    /// (`/metrics`; "" when the path ended at `proxy`); "" for everything else.
    pub proxy_path: &'a str,
}

impl Call<'_> {
    pub fn namespace(&self) -> Option<&str> {
        self.path.namespace.as_deref()
    }

    pub fn header(&self, name: http::header::HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn key(&self, name: &str) -> String {
        self.resource.key(self.namespace(), name)
    }

    pub fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(self.resource.group, self.resource.plural, name)
    }
}

/// Routes a resource request to its handler.
pub async fn dispatch(ctx: &Arc<Ctx>, mut call: Call<'_>) -> Result<Resp, ApiError> {
    let r = call.resource;
    if r.namespaced() != call.path.namespace.is_some() && call.path.name.is_some() {
        if r.namespaced() {
            return Err(ApiError::path_not_found(&format!(
                "{} is namespaced: the path needs /namespaces/<namespace>/",
                r.plural
            )));
        }
        return Err(ApiError::path_not_found(&format!(
            "{} is not namespaced",
            r.plural
        )));
    }
    if !r.namespaced() && call.path.namespace.is_some() {
        return Err(ApiError::path_not_found(&format!(
            "{} is not namespaced",
            r.plural
        )));
    }
    if matches!(r.storage, Storage::Metrics) {
        return metrics_api::serve(ctx, &call).await;
    }
    if matches!(r.storage, Storage::None) {
        return match (call.method, &call.path.name, &call.path.subresource) {
            (&Method::POST, None, None) => reviews::create(ctx, &call).await,
            (m, _, _) => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            ))),
        };
    }
    let sub = match call.path.subresource.as_deref() {
        None => None,
        Some(s) => Some(
            r.subresources
                .iter()
                .copied()
                .find(|x| x.name() == s)
                .or(if r.kind == "Namespace" && s == "finalize" {
                    Some(Subresource::Status)
                } else {
                    None
                })
                .ok_or_else(|| ApiError::path_not_found(&format!("{}/{s}", r.plural)))?,
        ),
    };
    let name = call.path.name.clone();
    let m = call.method.clone();
    match (m, name, sub) {
        (Method::GET, None, None) => {
            let opts = ListOptions::from_query(call.query)?;
            if opts.watch {
                watch::watch(ctx, &call, opts).await
            } else {
                read::list(ctx, &call, opts).await
            }
        }
        (Method::GET, Some(n), None) => read::get(ctx, &call, &n).await,
        (Method::POST, None, None) => write::create(ctx, &call).await,
        (Method::PUT, Some(n), None) => write::update(ctx, &call, &n, write::Part::Main).await,
        (Method::PATCH, Some(n), None) => write::patch(ctx, &call, &n, write::Part::Main).await,
        (Method::DELETE, Some(n), None) => delete::delete(ctx, &call, &n).await,
        (Method::DELETE, None, None) => delete::delete_collection(ctx, &call).await,
        (Method::GET, Some(n), Some(Subresource::Status)) => read::get(ctx, &call, &n).await,
        (Method::PUT, Some(n), Some(Subresource::Status)) => {
            write::update(ctx, &call, &n, write::Part::Status).await
        }
        (Method::PATCH, Some(n), Some(Subresource::Status)) => {
            write::patch(ctx, &call, &n, write::Part::Status).await
        }
        (Method::GET, Some(n), Some(Subresource::Approval)) => read::get(ctx, &call, &n).await,
        (Method::PUT, Some(n), Some(Subresource::Approval)) => {
            write::update(ctx, &call, &n, write::Part::Approval).await
        }
        (Method::PATCH, Some(n), Some(Subresource::Approval)) => {
            write::patch(ctx, &call, &n, write::Part::Approval).await
        }
        (Method::GET, Some(n), Some(Subresource::EphemeralContainers)) => {
            read::get(ctx, &call, &n).await
        }
        (Method::PUT, Some(n), Some(Subresource::EphemeralContainers)) => {
            write::update(ctx, &call, &n, write::Part::EphemeralContainers).await
        }
        (Method::PATCH, Some(n), Some(Subresource::EphemeralContainers)) => {
            write::patch(ctx, &call, &n, write::Part::EphemeralContainers).await
        }
        (Method::GET, Some(n), Some(Subresource::Scale)) => {
            subresources::get_scale(ctx, &call, &n).await
        }
        (Method::PUT, Some(n), Some(Subresource::Scale)) => {
            subresources::update_scale(ctx, &call, &n).await
        }
        (Method::PATCH, Some(n), Some(Subresource::Scale)) => {
            subresources::patch_scale(ctx, &call, &n).await
        }
        (Method::GET, Some(n), Some(Subresource::Log)) => kubelet::logs(ctx, &call, &n).await,
        (Method::GET | Method::POST, Some(n), Some(Subresource::Exec)) => {
            let upgrade = call.upgrade.take();
            kubelet::exec(ctx, &call, &n, upgrade).await
        }
        (Method::POST, Some(n), Some(Subresource::Eviction)) => {
            eviction::evict(ctx, &call, &n).await
        }
        (Method::GET | Method::POST, Some(n), Some(Subresource::Attach)) => {
            let upgrade = call.upgrade.take();
            kubelet::attach(ctx, &call, &n, upgrade).await
        }
        (Method::GET | Method::POST, Some(n), Some(Subresource::PortForward)) => {
            let upgrade = call.upgrade.take();
            kubelet::port_forward(ctx, &call, &n, upgrade).await
        }
        (_, Some(n), Some(Subresource::Proxy)) => proxy_subresource::proxy(ctx, &call, &n).await,
        (Method::POST, Some(n), Some(Subresource::Binding)) => {
            subresources::bind(ctx, &call, Some(&n)).await
        }
        (Method::POST, Some(n), Some(Subresource::Token)) => {
            authentication::token_request(ctx, &call, &n).await
        }
        (m, _, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

/// `POST /api/v1/namespaces/<ns>/bindings` (the legacy binding path some schedulers use).
pub async fn legacy_binding(ctx: &Arc<Ctx>, call: Call<'_>) -> Result<Resp, ApiError> {
    subresources::bind(ctx, &call, None).await
}

/// Maps a store failure to the Status a client expects.
pub fn store_error(r: &Resource, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::AlreadyExists(_) => ApiError::already_exists(r.group, r.plural, name),
        StoreError::NotFound(_) => ApiError::not_found(r.group, r.plural, name),
        StoreError::Conflict { .. } => ApiError::conflict(
            r.group,
            r.plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
        StoreError::Compacted { requested, oldest } => ApiError::expired(format!(
            "too old resource version: {requested} ({oldest})"
        )),
        StoreError::Backend(m) => ApiError::internal(m),
        StoreError::Unavailable(m) => {
            let mut e = ApiError::unavailable(m);
            e.retry_after_seconds = Some(1);
            e
        }
        StoreError::Closed => ApiError::unavailable("the store is shutting down"),
    }
}

/// A key whose stored value cannot be decoded: served as an error that says so (never as a
/// missing or stale object).
pub fn undecodable(key: &str, u: crate::store::cache::Undecodable) -> ApiError {
    ApiError::internal(format!(
        "the object stored at {key} (revision {}) cannot be decoded: {}",
        u.revision, u.error
    ))
}

/// Parses stored bytes (always written by this server) into an object.
pub fn parse_stored(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::internal(format!("stored object: {e}")))
}

/// The namespaces every cluster has from the start.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// The resource a write body names must be the one on the path.
pub fn check_kind(r: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if (api_version.is_empty() || api_version == r.api_version())
        && (kind.is_empty() || kind == r.kind)
    {
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), r.api_version().into());
            o.insert("kind".into(), r.kind.into());
        }
        return Ok(());
    }
    match registry::by_kind(api_version, kind) {
        _ if api_version.is_empty() || kind.is_empty() => Err(ApiError::bad_request(format!(
            "the object's apiVersion/kind {api_version}/{kind} does not match {}/{}",
            r.api_version(),
            r.kind
        ))),
        _ => Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) and kind ({kind}) do not match the resource {} of {}",
            r.plural,
            r.api_version()
        ))),
    }
}
