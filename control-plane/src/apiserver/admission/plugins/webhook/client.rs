//! Calling a webhook: resolve where it is (a URL's host, or a ready endpoint of the Service,
//! from its EndpointSlices), connect with TLS verified against the webhook's caBundle under
//! the name its certificate must carry, POST the AdmissionReview, read the answer; all of it
//! within the webhook's timeout.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request as HttpRequest};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;

use super::config::{Hook, Target};
use crate::apiserver::admission::Env;

/// A response larger than this is refused (Kubernetes' limit on webhook responses is of
/// the same order).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// Where a Service's webhook port is served: every ready endpoint's address and port.
async fn service_endpoints(
    env: &Env,
    namespace: &str,
    name: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, String> {
    let svc = env
        .get_value("", "services", Some(namespace), name)
        .await
        .map_err(|e| e.message)?
        .ok_or_else(|| format!("service \"{name}\" not found"))?;
    let port_name = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)))
        })
        .map(|p| {
            p.get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .ok_or_else(|| format!("service \"{name}\" has no port {port}"))?;
    let slices = env
        .list("discovery.k8s.io", "endpointslices", Some(namespace))
        .await
        .map_err(|e| e.message)?;
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| {
        s.labels
            .get("kubernetes.io/service-name")
            .map(String::as_str)
            == Some(name)
    }) {
        let Ok(v) = s.value() else { continue };
        let target = v
            .get("ports")
            .and_then(Value::as_array)
            .and_then(|ps| {
                ps.iter()
                    .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            })
            .and_then(|p| p.get("port").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok());
        let Some(target) = target else { continue };
        for ep in v
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ready = ep
                .pointer("/conditions/ready")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for a in ep
                .get("addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(ip) = a.as_str().and_then(|a| a.parse().ok()) {
                    out.push(SocketAddr::new(ip, target));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no endpoints available for service \"{name}\""));
    }
    Ok(out)
}

async fn resolve(env: &Env, target: &Target) -> Result<SocketAddr, String> {
    match target {
        Target::Url { host, port, .. } => {
            let found = tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|e| format!("dial tcp: lookup {host}: {e}"))?
                .next();
            found.ok_or_else(|| format!("dial tcp: lookup {host}: no address"))
        }
        Target::Service {
            namespace,
            name,
            port,
            ..
        } => {
            let all = service_endpoints(env, namespace, name, *port).await?;
            Ok(all[rand::random_range(0..all.len())])
        }
    }
}

/// POSTs `review` to the webhook and returns the response body. Errors read as the Go
/// client's do after Kubernetes' `failed to call webhook: `.
pub async fn call(env: &Env, hook: &Hook, review: &Value) -> Result<Bytes, String> {
    let url = hook.target.display_url(hook.timeout);
    let attempt = async {
        let tls = hook
            .tls
            .clone()
            .map_err(|e| format!("invalid caBundle: {e}"))?;
        let addr = resolve(env, &hook.target).await?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dial tcp {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(hook.target.server_name())
            .map_err(|e| format!("server name: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(Arc::clone(&tls))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let path = format!(
            "{}?timeout={}s",
            match hook.target.path() {
                "" => "/",
                p => p,
            },
            hook.timeout.as_secs()
        );
        let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
        let request = HttpRequest::post(path)
            .header(header::HOST, hook.target.server_name())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string());
        let result = match resp {
            Ok(resp) => {
                let status = resp.status();
                let bytes = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the response: {e}"))?
                    .to_bytes();
                if !status.is_success() {
                    Err(format!(
                        "the server responded with the status code {} but did not return more information",
                        status.as_u16()
                    ))
                } else {
                    Ok(bytes)
                }
            }
            Err(e) => Err(e),
        };
        driver.abort();
        result
    };
    match tokio::time::timeout(hook.timeout, attempt).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(format!("Post \"{url}\": {e}")),
        Err(_) => Err(format!("Post \"{url}\": context deadline exceeded")),
    }
}
