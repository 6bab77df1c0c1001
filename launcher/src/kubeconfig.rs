//! A kubeconfig's server and credentials for the harness's own HTTP calls (ureq): the
//! cluster CA to trust, and the user's client certificate or bearer token. kubectl and
//! kube-rs read the same files themselves.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

/// What a kubeconfig's current context says: where the server is, whom to trust, who to be.
#[derive(Clone, Debug)]
pub struct KubeconfigAccess {
    /// `https://host:port`
    pub server: String,
    /// The cluster CA (PEM).
    pub ca_pem: Option<String>,
    /// A client certificate and key (PEM).
    pub client: Option<(String, String)>,
    pub token: Option<String>,
}

impl KubeconfigAccess {
    /// Reads the current context of the kubeconfig at `path`.
    pub fn read(path: &Path) -> Result<KubeconfigAccess, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        KubeconfigAccess::parse(&text)
    }

    pub fn parse(text: &str) -> Result<KubeconfigAccess, String> {
        let kc: Value = serde_saphyr::from_str(text).map_err(|e| format!("kubeconfig: {e}"))?;
        let current = kc["current-context"].as_str().unwrap_or_default();
        let named = |list: &str, name: &str, field: &str| -> Value {
            kc[list]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == name || name.is_empty())
                .map(|e| e[field].clone())
                .unwrap_or(Value::Null)
        };
        let context = named("contexts", current, "context");
        let cluster = named(
            "clusters",
            context["cluster"].as_str().unwrap_or(""),
            "cluster",
        );
        let user = named("users", context["user"].as_str().unwrap_or(""), "user");
        let b64 = |v: &Value| -> Option<String> {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(v.as_str()?)
                .ok()?;
            String::from_utf8(raw).ok()
        };
        let server = cluster["server"]
            .as_str()
            .ok_or("kubeconfig: no server")?
            .to_string();
        let client = match (
            b64(&user["client-certificate-data"]),
            b64(&user["client-key-data"]),
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            _ => None,
        };
        Ok(KubeconfigAccess {
            server,
            ca_pem: b64(&cluster["certificate-authority-data"]),
            client,
            token: user["token"].as_str().map(str::to_string),
        })
    }

    /// An HTTP client that trusts the kubeconfig's CA and presents its client certificate;
    /// errors are answers (`http_status_as_error` off), each call bounded by `timeout`.
    pub fn agent(&self, timeout: Duration) -> Result<ureq::Agent, String> {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
        let mut tls = TlsConfig::builder();
        if let Some(ca) = &self.ca_pem {
            let ca = Certificate::from_pem(ca.as_bytes()).map_err(|e| format!("CA: {e}"))?;
            tls = tls.root_certs(RootCerts::new_with_certs(&[ca]));
        }
        if let Some((cert, key)) = &self.client {
            let cert =
                Certificate::from_pem(cert.as_bytes()).map_err(|e| format!("certificate: {e}"))?;
            let key = PrivateKey::from_pem(key.as_bytes()).map_err(|e| format!("key: {e}"))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
        }
        Ok(ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into())
    }

    /// GET `path` with these credentials: (status, body).
    pub fn get(&self, path: &str, timeout: Duration) -> Result<(u16, String), String> {
        let agent = self.agent(timeout)?;
        let mut req = agent.get(format!("{}{path}", self.server));
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req.call().map_err(|e| format!("GET {path}: {e}"))?;
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("GET {path}: {e}"))?;
        Ok((resp.status().as_u16(), body))
    }
}
