//! `healthCheckNodePort`: for a LoadBalancer Service with externalTrafficPolicy Local, the
//! proxy answers HTTP on that port of every node address, as kube-proxy does: 200 with the
//! number of endpoints on this node when there is at least one (and the proxy is healthy),
//! 503 otherwise, so an external load balancer sends traffic only to nodes that can serve
//! it locally. The body is kube-proxy's JSON.

use crate::metrics::Shared;
use crate::model::ServiceName;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};

/// What one health check port reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub service: ServiceName,
    pub local_endpoints: usize,
}

struct Server {
    check: Arc<RwLock<Check>>,
    task: tokio::task::JoinHandle<()>,
}

/// The health check servers, one per port.
pub struct HealthChecks {
    servers: HashMap<u16, Server>,
    /// The proxy's own health (its initial sync is done) is reported in every answer.
    shared: Arc<Shared>,
}

fn body(c: &Check, healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        c.service.0.namespace, c.service.0.name, c.local_endpoints, healthy
    )
}

impl HealthChecks {
    pub fn new(shared: Arc<Shared>) -> HealthChecks {
        HealthChecks {
            servers: HashMap::new(),
            shared,
        }
    }

    /// Makes the servers match `wanted` (port -> check): new ports start listening, gone
    /// ones stop, the rest get their new counts. A port that cannot be bound is reported
    /// and tried again on the next call.
    pub async fn sync(&mut self, wanted: &HashMap<u16, Check>) -> Vec<(u16, std::io::Error)> {
        self.servers.retain(|port, s| {
            let keep = wanted.contains_key(port);
            if !keep {
                s.task.abort();
            }
            keep
        });
        let mut errors = Vec::new();
        for (port, check) in wanted {
            if let Some(s) = self.servers.get(port) {
                let mut c = s.check.write().unwrap_or_else(|p| p.into_inner());
                if *c != *check {
                    *c = check.clone();
                }
                continue;
            }
            match self.start(*port, check.clone()).await {
                Ok(s) => {
                    self.servers.insert(*port, s);
                }
                Err(e) => errors.push((*port, e)),
            }
        }
        errors
    }

    async fn start(&self, port: u16, check: Check) -> std::io::Result<Server> {
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).await?;
        let check = Arc::new(RwLock::new(check));
        let (c, shared) = (check.clone(), self.shared.clone());
        let app = axum::Router::new().fallback(move || {
            let (c, shared) = (c.clone(), shared.clone());
            async move {
                let c = c.read().unwrap_or_else(|p| p.into_inner()).clone();
                let healthy = shared.healthy();
                let status = if c.local_endpoints > 0 && healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let weight = HeaderValue::from(c.local_endpoints);
                (
                    status,
                    [
                        (
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        ),
                        (
                            header::X_CONTENT_TYPE_OPTIONS,
                            HeaderValue::from_static("nosniff"),
                        ),
                        (
                            header::HeaderName::from_static("x-load-balancing-endpoint-weight"),
                            weight,
                        ),
                    ],
                    body(&c, healthy),
                )
                    .into_response()
            }
        });
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(port, error = %e, "health check server stopped");
            }
        });
        tracing::info!(port, "health check node port listening");
        Ok(Server { check, task })
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for s in self.servers.values() {
            s.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjectKey;

    #[test]
    fn body_is_kube_proxys_json() {
        let c = Check {
            service: ServiceName(ObjectKey::new("default", "web")),
            local_endpoints: 2,
        };
        let v: serde_json::Value = serde_json::from_str(&body(&c, true)).unwrap();
        assert_eq!(v["service"]["namespace"], "default");
        assert_eq!(v["service"]["name"], "web");
        assert_eq!(v["localEndpoints"], 2);
        assert_eq!(v["serviceProxyHealthy"], true);
    }
}
