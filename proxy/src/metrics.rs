//! Prometheus metrics and the HTTP endpoint serving them with /healthz. Kernel counters
//! (per-frontend translations and refusals) are read from the maps at scrape time.
//! The status endpoint (`--status`, kube-proxy's healthz port) serves /healthz and
//! /programmed (when each service was written into the data path, `programmed`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::programmed::{Programmed, Report};

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    /// Seconds to apply one batch of changes to the data path.
    pub sync_duration: Histogram,
    /// Seconds from a change's trigger time to its data path write (kube-proxy's
    /// network_programming_duration_seconds).
    pub network_programming: Histogram,
    pub events: Counter,
    pub services: Gauge,
    /// Seconds one grace period took (retired slots and ids wait for it).
    pub grace_period: Histogram,
    /// Backend slots deleted after their grace period.
    pub reclaimed: Counter,
    errors: Family<Labels, Counter>,
    input_errors: Family<Labels, Counter>,
    map_entries: Family<Labels, Gauge>,
    map_capacity: Family<Labels, Gauge>,
    drops: Family<Labels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("skiff_proxy");
        let sync_duration = Histogram::new(exponential_buckets(0.000_01, 2.0, 24));
        let network_programming = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        let events = Counter::default();
        let services = Gauge::default();
        let grace_period = Histogram::new(exponential_buckets(0.000_1, 2.0, 18));
        let reclaimed = Counter::default();
        let errors = Family::<Labels, Counter>::default();
        let input_errors = Family::<Labels, Counter>::default();
        let map_entries = Family::<Labels, Gauge>::default();
        let map_capacity = Family::<Labels, Gauge>::default();
        let drops = Family::<Labels, Gauge>::default();
        registry.register(
            "sync_duration_seconds",
            "Time to apply one batch of desired-state changes to the data path",
            sync_duration.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "Time from an endpoint change's trigger (the EndpointSlice's last-change-trigger-time) to the data path write",
            network_programming.clone(),
        );
        registry.register(
            "events",
            "Desired-state events received from the source",
            events.clone(),
        );
        registry.register(
            "services",
            "Services in the desired state",
            services.clone(),
        );
        registry.register(
            "grace_period_seconds",
            "Time one grace period took before retired backend slots and frontend ids were reclaimed",
            grace_period.clone(),
        );
        registry.register(
            "reclaimed_slots",
            "Backend slots deleted once no reader could hold them",
            reclaimed.clone(),
        );
        registry.register(
            "errors",
            "Data path errors by kind (map_full, map_write, iptables, grace_period)",
            errors.clone(),
        );
        registry.register(
            "input_errors",
            "Rejected or suspicious input by reason (malformed, unknown_kind, invalid, duplicate, missing_service)",
            input_errors.clone(),
        );
        registry.register(
            "map_entries",
            "Entries programmed per map (frontends, backends, conntrack: live flow entries)",
            map_entries.clone(),
        );
        registry.register("map_capacity", "Capacity per map", map_capacity.clone());
        registry.register(
            "dropped_packets",
            "North-south packets dropped outside any frontend, by reason (ct_full, snat_ports, no_device, no_route; kernel counters)",
            drops.clone(),
        );
        Metrics {
            registry,
            sync_duration,
            network_programming,
            events,
            services,
            grace_period,
            reclaimed,
            errors,
            input_errors,
            map_entries,
            map_capacity,
            drops,
        }
    }
}

impl Metrics {
    pub fn error(&self, kind: &'static str) {
        self.errors
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    pub fn input_error(&self, reason: &'static str) {
        self.input_errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn set_fill(&self, map: &'static str, entries: u64, capacity: Option<u64>) {
        self.map_entries
            .get_or_create(&vec![("map", map.to_string())])
            .set(entries as i64);
        if let Some(c) = capacity {
            self.map_capacity
                .get_or_create(&vec![("map", map.to_string())])
                .set(c as i64);
        }
    }

    pub fn set_drops(&self, reason: &'static str, n: u64) {
        self.drops
            .get_or_create(&vec![("reason", reason.to_string())])
            .set(n as i64);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// One frontend's kernel counters, for the scrape.
pub struct FrontendCounters {
    pub service: String,
    pub frontend: String,
    pub counters: proxy_common::ServiceCounters,
}

pub type KernelCounters = Box<dyn Fn() -> Vec<FrontendCounters> + Send + Sync>;

/// What the HTTP endpoint serves.
pub struct Shared {
    pub metrics: Metrics,
    /// Set once the first full sync is done.
    pub ready: AtomicBool,
    /// Set once the node's interfaces were first read: node addresses in the maps, the
    /// north-south programs attached, announced addresses held. Until then NodePorts and
    /// LoadBalancer addresses do not answer, so the proxy is not healthy yet.
    pub network_read: AtomicBool,
    pub kernel: Option<KernelCounters>,
    /// When each service was written into the data path.
    pub programmed: Mutex<Programmed>,
}

impl Shared {
    pub fn new(kernel: Option<KernelCounters>) -> Shared {
        Shared {
            metrics: Metrics::default(),
            ready: AtomicBool::new(false),
            network_read: AtomicBool::new(false),
            kernel,
            programmed: Mutex::new(Programmed::default()),
        }
    }

    /// Both the services and the node's network are programmed.
    pub fn healthy(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.network_read.load(Ordering::Relaxed)
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn render(shared: &Shared) -> String {
    let mut text = shared.metrics.render();
    if let Some(kernel) = &shared.kernel {
        let body = text.strip_suffix("# EOF\n").unwrap_or(&text).to_string();
        let mut out = body;
        let rows = kernel();
        for (name, help, pick) in [
            (
                "skiff_proxy_translations",
                "Connections and datagrams translated to a backend, per frontend (kernel counter)",
                (|c: &FrontendCounters| c.counters.translations) as fn(&FrontendCounters) -> u64,
            ),
            (
                "skiff_proxy_refused",
                "Connections refused because the frontend had no usable backend (kernel counter)",
                |c: &FrontendCounters| c.counters.refused,
            ),
            (
                "skiff_proxy_missed_slots",
                "Backend slots found empty by a connect (must stay zero: the sync engine keeps slots until no reader holds them; kernel counter)",
                |c: &FrontendCounters| c.counters.missed,
            ),
            (
                "skiff_proxy_denied",
                "Connections and packets denied by loadBalancerSourceRanges (kernel counter)",
                |c: &FrontendCounters| c.counters.denied,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}.\n# TYPE {name} counter\n"));
            for r in &rows {
                out.push_str(&format!(
                    "{name}_total{{service=\"{}\",frontend=\"{}\"}} {}\n",
                    escape(&r.service),
                    escape(&r.frontend),
                    pick(r)
                ));
            }
        }
        out.push_str("# EOF\n");
        text = out;
    }
    text
}

/// Serves /metrics and /healthz on `addr`; returns the bound address (port 0 allowed).
pub async fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<SocketAddr> {
    use axum::{response::IntoResponse, routing::get, Router};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let metrics_state = shared.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let s = metrics_state.clone();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        render(&s),
                    )
                        .into_response()
                }
            }),
        )
        .route("/healthz", get(move || healthz(shared.clone())));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}

async fn healthz(s: Arc<Shared>) -> (axum::http::StatusCode, &'static str) {
    use axum::http::StatusCode;
    if s.healthy() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "initial sync in progress\n",
        )
    }
}

/// `?namespace=NS&name=NAME` of /programmed.
#[derive(serde::Deserialize)]
struct ServiceQuery {
    namespace: String,
    name: String,
}

/// Serves /healthz and /programmed on `addr` (the node's addresses, for the API server's
/// pods/proxy: nothing here but health and when services were programmed, as kube-proxy's
/// healthz port); returns the bound address.
pub async fn serve_status(
    addr: SocketAddr,
    shared: Arc<Shared>,
    node: Option<String>,
) -> std::io::Result<SocketAddr> {
    use axum::extract::{rejection::QueryRejection, Query};
    use axum::{http::StatusCode, response::IntoResponse, routing::get, Json, Router};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let health = shared.clone();
    let node: Arc<Option<String>> = Arc::new(node);
    let app = Router::new()
        .route("/healthz", get(move || healthz(health.clone())))
        .route(
            "/programmed",
            get(move |q: Result<Query<ServiceQuery>, QueryRejection>| {
                let (s, node) = (shared.clone(), node.clone());
                async move {
                    let Ok(Query(q)) = q else {
                        return (
                            StatusCode::BAD_REQUEST,
                            "query parameters namespace and name are required\n",
                        )
                            .into_response();
                    };
                    let programmed = s.programmed.lock().unwrap_or_else(|p| p.into_inner());
                    match programmed.get(&q.namespace, &q.name) {
                        Some(r) => Json(Report::new(node.as_deref(), &q.namespace, &q.name, r))
                            .into_response(),
                        None => (
                            StatusCode::NOT_FOUND,
                            format!(
                                "service {}/{} is not programmed on this node\n",
                                q.namespace, q.name
                            ),
                        )
                            .into_response(),
                    }
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "status server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Frontends;
    use crate::model::{ObjectKey, ServiceName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn status_serves_when_services_were_programmed() {
        let shared = Arc::new(Shared::new(None));
        let addr = serve_status(
            "127.0.0.1:0".parse().unwrap(),
            shared.clone(),
            Some("n1".into()),
        )
        .await
        .unwrap();
        let svc = ServiceName(ObjectKey::new("default", "web"));
        let answer = get(addr, "/programmed?namespace=default&name=web").await;
        assert!(answer.starts_with("HTTP/1.0 404"), "{answer}");
        let mut f = Frontends::new();
        f.insert(
            crate::desired::FrontendKey::cluster(
                "10.96.0.9".parse().unwrap(),
                crate::model::Port::new(80).unwrap(),
                crate::model::Protocol::Tcp,
            ),
            crate::desired::DesiredFrontend {
                backends: Default::default(),
                affinity: crate::model::Affinity::None,
                port_name: String::new(),
                kind: crate::desired::FrontendKind::ClusterIp,
                snat_remote: false,
                source_ranges: Vec::new(),
                internal: None,
            },
        );
        shared
            .programmed
            .lock()
            .unwrap()
            .record(&svc, &f, std::time::SystemTime::now());
        let answer = get(addr, "/programmed?namespace=default&name=web").await;
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["node"], "n1");
        assert_eq!(v["name"], "web");
        let answer = get(addr, "/programmed?name=web").await;
        assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
        // Not ready yet: the status port's /healthz says so.
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.0 503"));
    }
}
