//! Who may call the node agent's API, decided as the kubelet decides it (delegated
//! authentication and authorization, no anonymous access, no loopback bypass):
//!
//! - Authentication: a client certificate the cluster CA issued (`--client-ca-file`; CN the
//!   user, O the group), else a bearer token the API server vouches for in a TokenReview.
//!   Neither: 401 `Unauthorized`. Every authenticated user is in `system:authenticated`.
//! - Authorization: a SubjectAccessReview to the API server for `<verb>` on `nodes/<sub>`
//!   named after this node ([`Attributes::of`]: the HTTP method gives the verb, the path the
//!   subresource, as the kubelet maps them). Denied: 403 `Forbidden (user=.., verb=..,
//!   resource=nodes, subresource=..)`; the review failing: 500 `Authorization error (..)`.
//!
//! Both answers are cached, as the kubelet caches them (tokens 2 min, failed tokens 30 s;
//! decisions allowed 5 min, denied 30 s), so a busy log stream or exec loop costs the API
//! server one review per caller, not one per request. Tokens are kept as their SHA-256
//! only. The caches are bounded: when full, expired entries go first, then everything.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use crate::metrics::Metrics;

/// How long a TokenReview's answer is trusted (the kubelet's authentication cache TTL).
const TOKEN_OK_TTL: Duration = Duration::from_secs(120);
/// How long a rejected token stays rejected without asking again.
const TOKEN_FAIL_TTL: Duration = Duration::from_secs(30);
/// How long an allowed decision is kept (the kubelet's authorized cache TTL).
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied decision is kept (the kubelet's unauthorized cache TTL).
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Entries per cache before expired ones are dropped.
const CACHE_ENTRIES: usize = 4096;

/// The group every authenticated caller is in.
const AUTHENTICATED: &str = "system:authenticated";

/// An authenticated caller, as SubjectAccessReview names one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn new(name: String, uid: Option<String>, mut groups: Vec<String>) -> User {
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_string());
        }
        User {
            name,
            uid,
            groups,
            extra: BTreeMap::new(),
        }
    }

    /// The identity of a verified client certificate.
    pub fn of_certificate(subject: &control_plane::pki::Subject) -> User {
        User::new(
            subject.common_name.clone(),
            None,
            subject.organization.iter().cloned().collect(),
        )
    }
}

/// What the TLS handshake of a connection proved, attached to each of its requests.
#[derive(Clone, Debug)]
pub enum Peer {
    /// No client certificate.
    Anonymous,
    /// A certificate of the cluster CA, valid now.
    Certificate(User),
    /// A certificate that did not verify (another CA, expired, not for clients): why.
    Rejected(String),
}

/// The authorization attributes of a request to the node agent's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    /// The `nodes` subresource.
    pub subresource: &'static str,
    /// Asked when `subresource` is denied (Kubernetes' KubeletFineGrainedAuthz: `healthz`
    /// falls back to `proxy`).
    pub fallback: Option<&'static str>,
}

impl Attributes {
    /// The kubelet's mapping: POST create, GET/HEAD get, PUT update, PATCH patch, DELETE
    /// delete; `/stats` stats, `/metrics` metrics, `/logs` log, `/spec` spec, `/checkpoint`
    /// checkpoint, `/configz` configz, `/healthz` healthz (else proxy), `/pods` pods (else
    /// proxy); everything else (exec, attach, portForward, run, containerLogs, the pod
    /// tunnel) proxy.
    pub fn of(method: &Method, path: &str) -> Attributes {
        let verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let under = |prefix: &str| {
            path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let (subresource, fallback) = if under("/stats") {
            ("stats", None)
        } else if under("/metrics") {
            ("metrics", None)
        } else if under("/logs") {
            ("log", None)
        } else if under("/spec") {
            ("spec", None)
        } else if under("/checkpoint") {
            ("checkpoint", None)
        } else if under("/configz") {
            ("configz", Some("proxy"))
        } else if under("/healthz") {
            ("healthz", Some("proxy"))
        } else if under("/pods") {
            ("pods", Some("proxy"))
        } else {
            ("proxy", None)
        };
        Attributes {
            verb,
            subresource,
            fallback,
        }
    }
}

/// A map whose entries expire, bounded in size.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, k: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(k)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, v)| v.clone())
    }

    fn put(&self, k: K, v: V, ttl: Duration) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if entries.len() >= CACHE_ENTRIES {
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= CACHE_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(k, (now + ttl, v));
    }
}

/// Why a request was not let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Unauthorized,
    Forbidden(String),
    Error(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            Refusal::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized".to_string()),
            Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            Refusal::Error(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        };
        (status, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
    }
}

/// Authenticates and authorizes every request to the node agent's API.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<GateInner>,
}

struct GateInner {
    node: String,
    client: kube::Client,
    metrics: Arc<Metrics>,
    tokens: TtlCache<[u8; 32], Option<User>>,
    decisions: TtlCache<(User, &'static str, &'static str), bool>,
}

impl Gate {
    /// Reviews through `client` (the node agent's own identity) for the node `node`.
    pub fn new(node: impl Into<String>, client: kube::Client, metrics: Arc<Metrics>) -> Gate {
        Gate {
            inner: Arc::new(GateInner {
                node: node.into(),
                client,
                metrics,
                tokens: TtlCache::new(),
                decisions: TtlCache::new(),
            }),
        }
    }

    /// Who is calling: the certificate's identity, else the bearer token's.
    pub async fn authenticate(
        &self,
        peer: &Peer,
        authorization: Option<&str>,
    ) -> Result<User, Refusal> {
        if let Peer::Certificate(user) = peer {
            return Ok(user.clone());
        }
        let token = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            if let Peer::Rejected(why) = peer {
                tracing::info!(error = %why, "client certificate rejected");
            }
            return Err(Refusal::Unauthorized);
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.inner.tokens.get(&key) {
            return known.ok_or(Refusal::Unauthorized);
        }
        match self.review_token(token).await {
            Ok(Some(user)) => {
                self.inner.tokens.put(key, Some(user.clone()), TOKEN_OK_TTL);
                Ok(user)
            }
            Ok(None) => {
                self.inner.tokens.put(key, None, TOKEN_FAIL_TTL);
                Err(Refusal::Unauthorized)
            }
            Err(e) => {
                // Not cached: the API server may be back in a moment.
                tracing::warn!(error = %e, "TokenReview failed");
                Err(Refusal::Unauthorized)
            }
        }
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.inner.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let Some(info) = status.user.filter(|u| u.username.is_some()) else {
            return Ok(None);
        };
        let mut user = User::new(
            info.username.unwrap_or_default(),
            info.uid,
            info.groups.unwrap_or_default(),
        );
        user.extra = info.extra.unwrap_or_default();
        Ok(Some(user))
    }

    /// Whether `user` may do `attrs` on this node, falling back as [`Attributes`] says.
    pub async fn authorize(&self, user: &User, attrs: Attributes) -> Result<(), Refusal> {
        let mut subresource = attrs.subresource;
        loop {
            if self.allowed(user, attrs.verb, subresource).await? {
                return Ok(());
            }
            match attrs.fallback {
                Some(next) if next != subresource => subresource = next,
                _ => break,
            }
        }
        Err(Refusal::Forbidden(format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
            user.name, attrs.verb, attrs.subresource
        )))
    }

    async fn allowed(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, Refusal> {
        let key = (user.clone(), verb, subresource);
        if let Some(known) = self.inner.decisions.get(&key) {
            return Ok(known);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    group: Some(String::new()),
                    version: Some("v1".to_string()),
                    resource: Some("nodes".to_string()),
                    subresource: Some(subresource.to_string()),
                    name: Some(self.inner.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.inner.client.clone());
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) => {
                let allowed = answer.status.is_some_and(|s| s.allowed);
                let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
                self.inner.decisions.put(key, allowed, ttl);
                Ok(allowed)
            }
            Err(e) => {
                let msg = format!(
                    "Authorization error (user={}, verb={verb}, resource=nodes, subresource={subresource})",
                    user.name
                );
                tracing::warn!(error = %e, "{msg}");
                Err(Refusal::Error(msg))
            }
        }
    }

    fn count(&self, outcome: &str) {
        self.inner.metrics.api_request(outcome);
    }
}

/// The middleware in front of every route: authenticate, authorize, then the handler.
pub async fn guard(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    // Owned copies: nothing borrowed from the request is held across the reviews.
    let peer = req
        .extensions()
        .get::<Arc<Peer>>()
        .cloned()
        .unwrap_or_else(|| Arc::new(Peer::Anonymous));
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let user = match gate.authenticate(&peer, authorization.as_deref()).await {
        Ok(u) => u,
        Err(r) => {
            gate.count("unauthorized");
            return r.into_response();
        }
    };
    let attrs = Attributes::of(req.method(), req.uri().path());
    if let Err(r) = gate.authorize(&user, attrs).await {
        gate.count(match r {
            Refusal::Forbidden(_) => "forbidden",
            _ => "error",
        });
        tracing::info!(
            user = %user.name,
            verb = attrs.verb,
            subresource = attrs.subresource,
            path = %req.uri().path(),
            "refused"
        );
        return r.into_response();
    }
    gate.count("allowed");
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_node_subresources_as_the_kubelet_maps_them() {
        let a = |m: Method, p: &str| {
            let a = Attributes::of(&m, p);
            (a.verb, a.subresource, a.fallback)
        };
        assert_eq!(
            a(Method::POST, "/exec/default/web/echo"),
            ("create", "proxy", None)
        );
        assert_eq!(
            a(Method::GET, "/containerLogs/default/web/echo"),
            ("get", "proxy", None)
        );
        assert_eq!(a(Method::GET, "/metrics"), ("get", "metrics", None));
        assert_eq!(
            a(Method::GET, "/metrics/cadvisor"),
            ("get", "metrics", None)
        );
        assert_eq!(a(Method::GET, "/metricsx"), ("get", "proxy", None));
        assert_eq!(a(Method::GET, "/stats/summary"), ("get", "stats", None));
        assert_eq!(a(Method::GET, "/logs/"), ("get", "log", None));
        assert_eq!(
            a(Method::GET, "/healthz"),
            ("get", "healthz", Some("proxy"))
        );
        assert_eq!(a(Method::HEAD, "/pods"), ("get", "pods", Some("proxy")));
        assert_eq!(
            a(Method::DELETE, "/portForward/ns/p"),
            ("delete", "proxy", None)
        );
        assert_eq!(a(Method::PUT, "/x").0, "update");
        assert_eq!(a(Method::PATCH, "/x").0, "patch");
    }

    #[test]
    fn certificate_users_are_authenticated_and_in_their_group() {
        let u = User::of_certificate(&control_plane::pki::Subject::new(
            "system:node:n1",
            Some("system:nodes"),
        ));
        assert_eq!(u.name, "system:node:n1");
        assert_eq!(u.groups, ["system:nodes", AUTHENTICATED]);
        let twice = User::new("x".into(), None, vec![AUTHENTICATED.into()]);
        assert_eq!(twice.groups, [AUTHENTICATED]);
    }

    #[test]
    fn caches_expire_and_stay_bounded() {
        let c: TtlCache<u32, bool> = TtlCache::new();
        c.put(1, true, Duration::from_secs(60));
        c.put(2, false, Duration::ZERO);
        assert_eq!(c.get(&1), Some(true));
        assert_eq!(c.get(&2), None, "expired");
        for i in 0..(CACHE_ENTRIES as u32 * 2) {
            c.put(i + 10, true, Duration::from_secs(60));
        }
        assert!(c.entries.lock().unwrap().len() <= CACHE_ENTRIES);
    }

    #[test]
    fn refusals_answer_as_the_kubelet_does() {
        assert_eq!(
            Refusal::Unauthorized.into_response().status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Refusal::Forbidden(
                "Forbidden (user=x, verb=get, resource=nodes, subresource=proxy)".into()
            )
            .into_response()
            .status(),
            StatusCode::FORBIDDEN
        );
    }
}
