//! Prometheus metrics (CSI operations by method and gRPC code, their latency, the node's
//! volumes and capacity) and the HTTP endpoint serving them with /healthz.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The RPC (CreateVolume, NodeStageVolume, ...).
    pub method: String,
    /// The gRPC code answered (Ok, ResourceExhausted, ...).
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: String,
}

pub struct Metrics {
    registry: Registry,
    pub operations: Family<OpLabels, Counter>,
    pub failures: Family<MethodLabels, Counter>,
    pub duration: Family<MethodLabels, Histogram>,
    pub volumes: Gauge,
    pub allocated_bytes: Gauge,
    pub available_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("skiff_csi");
        let operations = Family::<OpLabels, Counter>::default();
        registry.register(
            "operations",
            "CSI calls answered, by method and gRPC code",
            operations.clone(),
        );
        let failures = Family::<MethodLabels, Counter>::default();
        registry.register(
            "operation_failures",
            "CSI calls answered with an error, by method",
            failures.clone(),
        );
        // 100 us .. ~3.3 s
        let duration = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        });
        registry.register(
            "operation_duration_seconds",
            "Time to answer a CSI call",
            duration.clone(),
        );
        let volumes = Gauge::default();
        registry.register("volumes", "Volumes on this node", volumes.clone());
        let allocated_bytes = Gauge::default();
        registry.register(
            "allocated_bytes",
            "Sum of the capacities of the volumes on this node",
            allocated_bytes.clone(),
        );
        let available_bytes = Gauge::default();
        registry.register(
            "available_bytes",
            "Bytes a new volume may still take on this node",
            available_bytes.clone(),
        );
        // The provisioner's counters (provisioned and deleted volumes, by class).
        crate::provisioner::register_metrics(&mut registry);
        Metrics {
            registry,
            operations,
            failures,
            duration,
            volumes,
            allocated_bytes,
            available_bytes,
        }
    }

    /// Counts one call of `method` that started at `start` and ended with `result`.
    pub fn observe<T>(&self, method: &str, start: Instant, result: &Result<T, tonic::Status>) {
        let code = match result {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        self.operations
            .get_or_create(&OpLabels {
                method: method.to_string(),
                code: format!("{code:?}"),
            })
            .inc();
        let m = MethodLabels {
            method: method.to_string(),
        };
        if result.is_err() {
            self.failures.get_or_create(&m).inc();
        }
        self.duration
            .get_or_create(&m)
            .observe(start.elapsed().as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves /metrics and /healthz on `addr` until `token` is cancelled; returns the bound
/// address (port 0 allowed) and the serving task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use axum::{routing::get, Router};
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
        .route("/healthz", get(|| async { "ok\n" }));
    let task = tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "metrics server failed");
        }
    });
    Ok((bound, task))
}
