//! Prometheus metrics (CSI operations by method and gRPC code, their latency, the node's
//! volumes and capacity; the controller runtime's `skiff_controller_*` series of the
//! provisioner, resizer and placement controllers) and the HTTP endpoint serving them with
//! /healthz (which fails while a controller keeps panicking on a key, as the controller
//! manager's does).

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
    /// The controller runtime's metrics and panic health of this process's controllers
    /// (provisioner and resizer in the plugin, placement in the controller).
    pub controllers: control_plane::runtime::Metrics,
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
            controllers: control_plane::runtime::Metrics::new(),
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

    /// The driver's series, then the controller runtime's, in one exposition (one `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        let driver_len = out.trim_end().trim_end_matches("# EOF").trim_end().len();
        out.truncate(driver_len);
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&self.controllers.render());
        out
    }

    /// /healthz: Err names the keys a controller keeps panicking on.
    pub fn health(&self) -> Result<(), String> {
        self.controllers.panic_health()
    }
}

/// Serves /metrics and /healthz on `addr` until `token` is cancelled; returns the bound
/// address (port 0 allowed) and the serving task. /healthz answers 500 naming the failing
/// check while a controller keeps panicking.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    token: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use axum::{http::StatusCode, routing::get, Router};
    let health = metrics.clone();
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
        .route(
            "/healthz",
            get(move || {
                let m = health.clone();
                async move {
                    match m.health() {
                        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("[-]controllers failed: {e}\nhealthz check failed\n"),
                        ),
                    }
                }
            }),
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use control_plane::runtime::metrics::{Outcome, PANICS_UNHEALTHY};

    #[test]
    fn one_exposition_with_the_driver_and_the_controller_runtime_series() {
        let m = Metrics::new();
        m.volumes.set(2);
        m.controllers
            .reconciled("provisioner", Outcome::Error, 0.01);
        let text = m.render();
        assert!(text.contains("skiff_csi_volumes 2\n"), "{text}");
        assert!(
            text.contains("skiff_controller_reconcile_errors_total{controller=\"provisioner\"} 1"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test]
    async fn healthz_fails_while_a_controller_keeps_panicking() {
        let m = Arc::new(Metrics::new());
        let token = CancellationToken::new();
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), m.clone(), token.clone())
            .await
            .unwrap();
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        for _ in 0..PANICS_UNHEALTHY {
            m.controllers
                .panicked("resizer", "default/data".into(), "index out of bounds");
        }
        let answer = get("/healthz").await;
        assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
        assert!(answer.contains("controller resizer: reconcile of default/data panicked 3 times in a row: index out of bounds"), "{answer}");
        let metrics = get("/metrics").await;
        assert!(
            metrics.contains("skiff_controller_reconcile_panics_total{controller=\"resizer\"} 3"),
            "{metrics}"
        );
        token.cancel();
        task.await.unwrap();
    }
}
