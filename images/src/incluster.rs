//! In-cluster API access as client-go's `rest.InClusterConfig` and kube-rs's
//! `Config::incluster` do it, with nothing the pod was not given: the API's address from
//! `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, the bearer token from
//! `/var/run/secrets/kubernetes.io/serviceaccount/token` (read again for every request, as
//! the node renews it in place), the server verified against `ca.crt` beside it, the pod's
//! namespace from `namespace`. HTTPS through rustls over std sockets: the image stays one
//! small static binary (kube-rs would bring tokio and hyper into it).

use crate::http::{parse_response, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the service account's files are mounted in every pod that has them.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How the API is reached from inside a pod.
pub struct InCluster {
    host: String,
    port: u16,
    token_file: PathBuf,
    namespace: String,
    tls: Arc<rustls::ClientConfig>,
}

impl InCluster {
    /// From the environment and the service account directory `dir`; the errors say what is
    /// missing in client-go's words.
    pub fn load(env: impl Fn(&str) -> Option<String>, dir: &Path) -> Result<InCluster, String> {
        let (Some(host), Some(port)) = (
            env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty()),
            env("KUBERNETES_SERVICE_PORT").filter(|p| !p.is_empty()),
        ) else {
            return Err("unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined".into());
        };
        let port = port
            .parse()
            .map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))?;
        let token_file = dir.join("token");
        std::fs::metadata(&token_file).map_err(|e| format!("{}: {e}", token_file.display()))?;
        let ca_file = dir.join("ca.crt");
        let ca = std::fs::read(&ca_file).map_err(|e| format!("{}: {e}", ca_file.display()))?;
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|_| "default".into());
        Ok(InCluster {
            host,
            port,
            token_file,
            namespace,
            tls: tls_config(&ca)?,
        })
    }

    /// The pod's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `GET path` with the current token, on a fresh connection.
    pub fn get(&self, path: &str, timeout: Duration) -> Result<Response, String> {
        let token = std::fs::read_to_string(&self.token_file)
            .map_err(|e| format!("{}: {e}", self.token_file.display()))?;
        let authority = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("{authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority} resolved to nothing"))?;
        let tcp = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        tcp.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| format!("server name {}: {e}", self.host))?;
        let session =
            rustls::ClientConnection::new(self.tls.clone(), name).map_err(|e| e.to_string())?;
        let mut tls = rustls::StreamOwned::new(session, tcp);
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nAccept: application/json\r\nUser-Agent: skiff-echo/incluster\r\nConnection: close\r\n\r\n",
            token.trim()
        )
        .and_then(|()| tls.flush())
        .map_err(|e| format!("GET {path}: {e}"))?;
        let mut raw = Vec::new();
        match tls.read_to_end(&mut raw) {
            Ok(_) => {}
            // A server that closes without close_notify: what arrived is the answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(format!("GET {path}: {e}")),
        }
        parse_response(&raw).map_err(|e| format!("GET {path}: {e}"))
    }
}

/// A client configuration that trusts only the cluster's CA bundle.
fn tls_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("ca.crt: {e}"))?;
        roots.add(cert).map_err(|e| format!("ca.crt: {e}"))?;
    }
    if roots.is_empty() {
        return Err("ca.crt holds no certificate".into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_variables_it_says_what_client_go_says() {
        let dir = std::env::temp_dir();
        let err = InCluster::load(|_| None, &dir).err().unwrap();
        assert!(err.contains("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined"));
        let bad_port = InCluster::load(
            |k| {
                Some(
                    if k.ends_with("HOST") {
                        "10.96.0.1"
                    } else {
                        "https"
                    }
                    .into(),
                )
            },
            &dir,
        )
        .err()
        .unwrap();
        assert!(bad_port.contains("is not a port"), "{bad_port}");
    }

    #[test]
    fn a_bundle_without_certificates_is_refused() {
        assert!(tls_config(b"not a pem").is_err());
    }
}
