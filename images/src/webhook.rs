//! A mutating admission webhook that injects a sidecar container: `echo webhook` serves
//! AdmissionReview v1 over HTTPS (rustls, the certificate and key from files, typically a
//! mounted Secret) and answers every pod CREATE with a JSONPatch that appends the sidecar,
//! unless the pod already has a container of that name. Which pods it sees is the
//! MutatingWebhookConfiguration's business (an objectSelector on a label, say).

use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use crate::http::{self, ReadError};

/// What to inject.
#[derive(Clone, Debug)]
pub struct Sidecar {
    pub name: String,
    pub image: String,
    /// The sidecar's arguments (the echo image's own server on another port, by default).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The response to one AdmissionReview request body.
pub fn review(body: &[u8], sidecar: &Sidecar) -> Result<Value, String> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request = review
        .get("request")
        .ok_or("an AdmissionReview without a request")?;
    let uid = request.get("uid").cloned().unwrap_or(Value::Null);
    let mut response = json!({"uid": uid, "allowed": true});
    let is_pod_create = request.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod")
        && request.get("operation").and_then(Value::as_str) == Some("CREATE");
    let containers = request
        .pointer("/object/spec/containers")
        .and_then(Value::as_array);
    let has_it = containers.is_some_and(|cs| {
        cs.iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(&sidecar.name))
    });
    if is_pod_create && containers.is_some() && !has_it {
        let env: Vec<Value> = sidecar
            .env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let container = json!({
            "name": sidecar.name,
            "image": sidecar.image,
            "args": sidecar.args,
            "env": env,
        });
        let patch = json!([{"op": "add", "path": "/spec/containers/-", "value": container}]);
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(STANDARD.encode(serde_json::to_vec(&patch).unwrap_or_default()));
    }
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// The TLS configuration from a PEM certificate chain and key.
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the certificate file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| format!("certificate and key: {e}"))?;
    Ok(Arc::new(config))
}

/// Serves HTTPS on `listener` until the process ends: POST anything with an AdmissionReview,
/// GET /healthz.
pub fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, sidecar: Sidecar) {
    let sidecar = Arc::new(sidecar);
    for conn in listener.incoming().flatten() {
        let (tls, sidecar) = (tls.clone(), sidecar.clone());
        std::thread::spawn(move || {
            if let Err(e) = connection(conn, tls, &sidecar) {
                eprintln!("webhook: {e}");
            }
        });
    }
}

fn connection(
    conn: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    sidecar: &Sidecar,
) -> Result<(), String> {
    let session = rustls::ServerConnection::new(tls).map_err(|e| e.to_string())?;
    let stream = rustls::StreamOwned::new(session, conn);
    // One stream for reading and writing: a reader and a writer over a shared cell.
    let stream = std::rc::Rc::new(std::cell::RefCell::new(stream));
    let mut r = BufReader::new(Shared(stream.clone()));
    let mut w = BufWriter::new(Shared(stream));
    loop {
        let req = match http::read_request(&mut r) {
            Ok(req) => req,
            Err(ReadError::Eof) => return Ok(()),
            Err(ReadError::Io(e)) => return Err(e.to_string()),
            Err(ReadError::Malformed(why)) => {
                let _ = http::write_response(&mut w, 400, why, true);
                return Err(why.into());
            }
        };
        let written = match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/healthz") => http::write_response(&mut w, 200, "ok\n", req.close),
            ("POST", _) => match review(&req.body, sidecar) {
                Ok(v) => {
                    http::write_typed(&mut w, 200, "application/json", &v.to_string(), req.close)
                }
                Err(e) => http::write_response(&mut w, 400, &format!("{e}\n"), true),
            },
            _ => http::write_response(&mut w, 404, "not found\n", req.close),
        };
        written.map_err(|e| e.to_string())?;
        w.flush().map_err(|e| e.to_string())?;
        if req.close {
            return Ok(());
        }
    }
}

/// A TLS stream shared by the reader and the writer of one connection (one thread).
struct Shared(
    std::rc::Rc<std::cell::RefCell<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>>,
);

impl std::io::Read for Shared {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().read(buf)
    }
}

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar() -> Sidecar {
        Sidecar {
            name: "sidecar".into(),
            image: "127.0.0.1:5000/skiff/echo:latest".into(),
            args: vec!["serve".into()],
            env: vec![("PORT".into(), "9090".into())],
        }
    }

    #[test]
    fn pods_get_the_sidecar_once() {
        let review_of = |containers: Value| {
            json!({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
                "uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE",
                "object":{"spec":{"containers":containers}}}})
            .to_string()
        };
        let out = review(review_of(json!([{"name": "web"}])).as_bytes(), &sidecar()).unwrap();
        assert_eq!(out["response"]["uid"], "u1");
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
        let patch = out["response"]["patch"].as_str().unwrap();
        assert!(patch.starts_with("W3sib3AiOiJhZGQi"), "{patch}");
        let again = review(
            review_of(json!([{"name": "web"}, {"name": "sidecar"}])).as_bytes(),
            &sidecar(),
        )
        .unwrap();
        assert!(again["response"].get("patch").is_none());
        assert!(review(b"nonsense", &sidecar()).is_err());
    }
}
