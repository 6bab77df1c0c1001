//! Prometheus metrics (queries by type, rcode and where they were answered; latency) and
//! the HTTP endpoint serving them with /healthz (the process serves), /readyz (the first
//! listing of Services and EndpointSlices is in the records) and
//! /learned?namespace=&name= (when this server learned a Service's name and addresses, as
//! JSON; 404 while the name does not resolve). Like the metrics, /learned is served without
//! authentication: it tells what any pod can already ask this server (names and
//! addresses) plus when it learned them. `kubectl skiff trace` reads it through the API
//! server's pods/proxy.

use crate::records::{Records, ServiceKey};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Who answered a query.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Source {
    /// The cluster zone (or a PTR of a cluster address).
    Cluster,
    /// The upstream resolvers.
    Upstream,
    /// Refused or malformed before a lookup.
    None,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// The record type asked (A, AAAA, SRV, ...).
    pub qtype: String,
    /// The response code sent (NOERROR, NXDOMAIN, SERVFAIL, ...).
    pub rcode: String,
    pub source: Source,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    pub queries: Family<QueryLabels, Counter>,
    pub latency: Histogram,
    pub services: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("skiff_dns");
        let queries = Family::<QueryLabels, Counter>::default();
        registry.register("queries", "DNS queries answered", queries.clone());
        // 25 us .. ~0.8 s
        let latency = Histogram::new(exponential_buckets(0.000_025, 2.0, 16));
        registry.register(
            "request_duration_seconds",
            "Time from a query's arrival to its response being sent",
            latency.clone(),
        );
        let services = Gauge::default();
        registry.register(
            "services",
            "Services with records in the cluster zone",
            services.clone(),
        );
        Metrics {
            registry,
            queries,
            latency,
            services,
        }
    }

    pub fn observe(&self, labels: QueryLabels, took: Duration) {
        self.queries.get_or_create(&labels).inc();
        self.latency.observe(took.as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The query of /learned.
#[derive(serde::Deserialize)]
struct LearnedQuery {
    namespace: String,
    name: String,
}

/// Serves /metrics, /healthz, /readyz and /learned on `addr` until `token` is cancelled;
/// returns the bound address (port 0 allowed).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    records: Arc<Records>,
    ready: impl Fn() -> bool + Send + Sync + Clone + 'static,
    token: tokio_util::sync::CancellationToken,
) -> std::io::Result<SocketAddr> {
    use axum::extract::Query;
    use axum::response::IntoResponse;
    use axum::{http::StatusCode, routing::get, Json, Router};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            "content-type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/learned",
            get(move |q: Query<LearnedQuery>| {
                let records = records.clone();
                async move {
                    match records.learned(&ServiceKey::new(q.0.namespace, q.0.name)) {
                        Some(l) => Json(l).into_response(),
                        None => (StatusCode::NOT_FOUND, "the name does not resolve here\n")
                            .into_response(),
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    match ready() {
                        true => (StatusCode::OK, "ok\n"),
                        false => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "initial sync in progress\n",
                        ),
                    }
                }
            }),
        );
    tokio::spawn(async move {
        let stop = token.cancelled_owned();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}
