//! TLS bootstrap, as the kubelet does it: a node agent that has no kubeconfig of its own (or
//! whose client certificate has expired) joins with a bootstrap kubeconfig (a bootstrap
//! token): it makes a key in its certificate directory (0600, kept while the request is
//! pending so a restart asks again with the same key), submits a CertificateSigningRequest
//! for `system:node:<name>` in `system:nodes` to the `kubernetes.io/kube-apiserver-client-kubelet`
//! signer, waits (with a deadline) for the certificate the control plane issues once the
//! request is approved, and writes its kubeconfig with that certificate. A restart with a
//! valid kubeconfig uses it as is.

use std::path::{Path, PathBuf};
use std::time::Duration;

use control_plane::apiserver::kubeconfig::{self, Credentials};
use control_plane::machinery::kinds::certificates::{
    certificate_pem, has_condition, DENIED, FAILED, KUBE_APISERVER_CLIENT_KUBELET,
};
use control_plane::pki::{self, Issued, PkiError, Subject};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

/// The key the agent's client certificate is for.
pub const KEY_FILE: &str = "kubelet-client.key";
/// The issued client certificate.
pub const CERT_FILE: &str = "kubelet-client.crt";
/// How long before its end a certificate counts as expired (bootstrap again rather than
/// start with a certificate about to stop working).
const EXPIRY_MARGIN_SECONDS: i64 = 60;

/// Where the agent's credentials come from.
#[derive(Clone, Debug)]
pub struct BootstrapConfig {
    /// The agent's own kubeconfig: used when its certificate is valid, written otherwise.
    pub kubeconfig: PathBuf,
    /// The kubeconfig with the bootstrap token (None: the kubeconfig must exist).
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the key and the certificate live.
    pub cert_dir: PathBuf,
    /// The node's name (the certificate's CN is `system:node:<name>`).
    pub node_name: String,
    /// How long to wait for the certificate.
    pub timeout: Duration,
}

/// Why the agent could not get its credentials.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{0} does not exist (or its certificate has expired) and no --bootstrap-kubeconfig was given")]
    NoCredentials(PathBuf),
    #[error("{path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("the API server: {0}")]
    Api(#[from] kube::Error),
    #[error("certificate signing request {name} was {how}: {why}")]
    Refused {
        name: String,
        how: &'static str,
        why: String,
    },
    #[error("no certificate for request {0} within {1:?} (is it approved? `kubectl certificate approve {0}`)")]
    Timeout(String, Duration),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let what = what.into();
    move |source| BootstrapError::Io { what, source }
}

/// What a kubeconfig says about its cluster and user.
struct Parsed {
    server: String,
    ca_pem: String,
    client_cert_pem: Option<String>,
}

fn base64_text(data: &str) -> Option<String> {
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(Value::String(data.trim().to_string())).ok()?;
    String::from_utf8(bytes.0).ok()
}

fn parse(path: &Path) -> Result<Parsed, BootstrapError> {
    let bad = |why: &str| BootstrapError::Kubeconfig {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e.to_string()))?;
    let context = kc
        .current_context
        .as_deref()
        .and_then(|c| kc.contexts.iter().find(|n| n.name == c))
        .and_then(|n| n.context.as_ref());
    let cluster = kc
        .clusters
        .iter()
        .find(|n| context.is_none_or(|c| c.cluster == n.name))
        .and_then(|n| n.cluster.as_ref())
        .ok_or_else(|| bad("no cluster"))?;
    let user = kc
        .auth_infos
        .iter()
        .find(|n| context.is_none_or(|c| c.user.as_deref() == Some(n.name.as_str())))
        .and_then(|n| n.auth_info.as_ref());
    let ca_pem = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(d), _) => base64_text(d).ok_or_else(|| bad("certificate-authority-data"))?,
        (None, Some(f)) => std::fs::read_to_string(f).map_err(io(format!("reading {f}")))?,
        (None, None) => {
            return Err(bad(
                "no certificate-authority(-data): TLS bootstrap needs one",
            ))
        }
    };
    let client_cert_pem = match user {
        Some(u) => match (&u.client_certificate_data, &u.client_certificate) {
            (Some(d), _) => base64_text(d),
            (None, Some(f)) => std::fs::read_to_string(f).ok(),
            (None, None) => None,
        },
        None => None,
    };
    Ok(Parsed {
        server: cluster.server.clone().ok_or_else(|| bad("no server"))?,
        ca_pem,
        client_cert_pem,
    })
}

/// Whether the kubeconfig at `path` exists and holds a client certificate still valid.
fn usable(path: &Path) -> bool {
    if !path.exists() {
        return false;
    }
    let Ok(Parsed {
        client_cert_pem: Some(pem),
        ..
    }) = parse(path)
    else {
        // A kubeconfig with a token (or one that does not parse): used as is.
        return parse(path).is_ok();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    pki::not_after(&pem).is_ok_and(|end| end - EXPIRY_MARGIN_SECONDS > now)
}

/// Makes sure `config.kubeconfig` holds valid credentials of this node, bootstrapping them
/// with the bootstrap kubeconfig when it does not. Returns the kubeconfig's path.
pub async fn ensure_kubeconfig(config: &BootstrapConfig) -> Result<PathBuf, BootstrapError> {
    if usable(&config.kubeconfig) {
        tracing::info!(kubeconfig = %config.kubeconfig.display(), "using the node's kubeconfig");
        return Ok(config.kubeconfig.clone());
    }
    let Some(bootstrap) = &config.bootstrap_kubeconfig else {
        return Err(BootstrapError::NoCredentials(config.kubeconfig.clone()));
    };
    let parsed = parse(bootstrap)?;
    std::fs::create_dir_all(&config.cert_dir)
        .map_err(io(format!("creating {}", config.cert_dir.display())))?;
    let key_path = config.cert_dir.join(KEY_FILE);
    let key_pem = match std::fs::read_to_string(&key_path) {
        Ok(k) => k,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = pki::new_key()?;
            kubeconfig::write_private(&key_path, k.as_bytes())
                .map_err(io(format!("writing {}", key_path.display())))?;
            k
        }
        Err(e) => return Err(io(format!("reading {}", key_path.display()))(e)),
    };
    let user = format!("system:node:{}", config.node_name);
    let request = pki::request_with_key(&Subject::new(&user, Some("system:nodes")), &[], &key_pem)?;
    let client = client_of(bootstrap).await?;
    tracing::info!(server = %parsed.server, node = %config.node_name,
        "TLS bootstrap: asking for a node client certificate");
    let cert_pem = request_certificate(client, &request, config.timeout).await?;
    kubeconfig::write_private(&config.cert_dir.join(CERT_FILE), cert_pem.as_bytes())
        .map_err(io("writing the certificate"))?;
    kubeconfig::write(
        &config.kubeconfig,
        &parsed.server,
        &parsed.ca_pem,
        &user,
        &Credentials::Certificate(Issued { cert_pem, key_pem }),
    )
    .map_err(io(format!("writing {}", config.kubeconfig.display())))?;
    tracing::info!(kubeconfig = %config.kubeconfig.display(), "TLS bootstrap: certificate issued");
    Ok(config.kubeconfig.clone())
}

async fn client_of(path: &Path) -> Result<kube::Client, BootstrapError> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| BootstrapError::Kubeconfig {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| BootstrapError::Kubeconfig {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    Ok(kube::Client::try_from(config)?)
}

/// Submits `request_pem` as a node client CSR and waits for its certificate.
pub async fn request_certificate(
    client: kube::Client,
    request_pem: &str,
    timeout: Duration,
) -> Result<String, BootstrapError> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let b64 = serde_json::to_value(k8s_openapi::ByteString(request_pem.as_bytes().to_vec()))
        .unwrap_or(Value::Null);
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"generateName": "node-csr-"},
        "spec": {"request": b64, "signerName": KUBE_APISERVER_CLIENT_KUBELET,
            "usages": ["digital signature", "client auth"]}
    }))
    .map_err(|e| BootstrapError::Kubeconfig {
        path: PathBuf::new(),
        why: e.to_string(),
    })?;
    let created = api.create(&PostParams::default(), &csr).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "certificate signing request submitted");
    let outcome = |c: &CertificateSigningRequest| -> Option<Result<String, BootstrapError>> {
        let v = serde_json::to_value(c).ok()?;
        let why = |t: &str| {
            v.pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == t))
                .map(|c| {
                    format!(
                        "{} {}",
                        c["reason"].as_str().unwrap_or(""),
                        c["message"].as_str().unwrap_or("")
                    )
                })
                .unwrap_or_default()
        };
        if has_condition(&v, DENIED) {
            return Some(Err(BootstrapError::Refused {
                name: name.clone(),
                how: "denied",
                why: why(DENIED),
            }));
        }
        if has_condition(&v, FAILED) {
            return Some(Err(BootstrapError::Refused {
                name: name.clone(),
                how: "failed",
                why: why(FAILED),
            }));
        }
        certificate_pem(&v).map(Ok)
    };
    if let Some(done) = outcome(&created) {
        return done;
    }
    let wait = async {
        let mut backoff = Duration::from_millis(200);
        loop {
            // A watch would do too; polling one object by name is cheap and survives the
            // bootstrap token's watch being cut.
            match api.get_opt(&name).await {
                Ok(Some(c)) => {
                    if let Some(done) = outcome(&c) {
                        return done;
                    }
                }
                Ok(None) => {
                    return Err(BootstrapError::Refused {
                        name: name.clone(),
                        how: "deleted",
                        why: "it no longer exists".into(),
                    })
                }
                Err(e) => tracing::warn!(error = %e, csr = %name, "reading the request"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .unwrap_or_else(|_| Err(BootstrapError::Timeout(name.clone(), timeout)))
}
