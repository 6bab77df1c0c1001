//! The operations endpoint of the controller-manager and the scheduler: `/healthz` (every
//! registered check passes: 200 `ok`, else 500 naming the failing ones), `/livez` and
//! `/readyz` (the same), and `/metrics` (Prometheus text from every registered source).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A named health check: Ok, or why not.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Renders one set of metrics in the Prometheus text format.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// What the endpoint serves.
#[derive(Default, Clone)]
pub struct Ops {
    checks: Vec<(&'static str, HealthCheck)>,
    metrics: Vec<MetricsSource>,
}

impl Ops {
    pub fn new() -> Ops {
        Ops::default()
    }

    pub fn check(
        mut self,
        name: &'static str,
        f: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Ops {
        self.checks.push((name, Arc::new(f)));
        self
    }

    pub fn metrics(mut self, f: impl Fn() -> String + Send + Sync + 'static) -> Ops {
        self.metrics.push(Arc::new(f));
        self
    }

    fn health(&self) -> (StatusCode, String) {
        let failed: Vec<String> = self
            .checks
            .iter()
            .filter_map(|(name, c)| c().err().map(|e| format!("[-]{name} failed: {e}")))
            .collect();
        if failed.is_empty() {
            (StatusCode::OK, "ok".into())
        } else {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{}\nhealthz check failed\n", failed.join("\n")),
            )
        }
    }

    fn respond(&self, path: &str) -> Response<Full<Bytes>> {
        let (code, content_type, body) = match path {
            "/healthz" | "/livez" | "/readyz" => {
                let (c, b) = self.health();
                (c, "text/plain; charset=utf-8", b)
            }
            "/metrics" => {
                let mut out = String::new();
                for m in &self.metrics {
                    let text = m();
                    // Each registry ends its text with `# EOF`; only the last one may.
                    out.push_str(text.trim_end().trim_end_matches("# EOF").trim_end());
                    out.push('\n');
                }
                out.push_str("# EOF\n");
                (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                )
            }
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found\n".into(),
            ),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = code;
        if let Ok(v) = http::HeaderValue::from_str(content_type) {
            resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        resp
    }
}

/// Serves `ops` on `listener` until `token` is cancelled.
pub async fn serve(listener: TcpListener, ops: Ops, token: CancellationToken) {
    let ops = Arc::new(ops);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = tokio::select! {
            _ = token.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "ops endpoint: accept failed");
                    continue;
                }
            },
        };
        let ops = ops.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let ops = ops.clone();
            async move { Ok::<_, Infallible>(ops.respond(req.uri().path())) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let token = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = token.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_names_the_failing_check() {
        let ops = Ops::new()
            .check("informers", || Ok(()))
            .check("leader-election", || Err("lease not renewed".into()));
        let (code, body) = ops.health();
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("[-]leader-election failed: lease not renewed"));
        assert!(!body.contains("informers"));
        let (code, body) = Ops::new().check("x", || Ok(())).health();
        assert_eq!((code, body.as_str()), (StatusCode::OK, "ok"));
    }

    #[test]
    fn metrics_concatenate_with_one_eof() {
        let ops = Ops::new()
            .metrics(|| "a_total 1\n# EOF\n".into())
            .metrics(|| "b_total 2\n# EOF\n".into());
        let resp = ops.respond("/metrics");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = futures::executor::block_on(http_body_util::BodyExt::collect(resp.into_body()))
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"a_total 1\nb_total 2\n# EOF\n");
    }
}
