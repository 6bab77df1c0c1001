//! The cluster's public-key infrastructure. One certificate authority, kept in the control
//! plane's data directory, signs every identity in the cluster: the API server's serving
//! certificate, the client certificates of the admin and of each component (CN = user,
//! O = groups, as Kubernetes reads them), and the node agents' certificates through
//! CertificateSigningRequests. Also the TLS configurations of servers and clients that
//! trust that CA, and the identity a client certificate carries.
//!
//! Rooms: `ca` (create, load, issue, sign requests), `tls` (rustls configurations, the
//! client-certificate check), `files` (PEM files only their owner reads).

pub mod ca;
pub mod files;
pub mod tls;

pub use ca::{
    check_certificates, check_request, new_key, new_request, not_after, request_with_key, Ca,
    CertRequest, CertSpec, Issued, San, Subject, Usage,
};
pub use tls::{ClientVerifier, PeerCertificate};

/// Why a certificate or key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Cert {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what}: {source}")]
    Tls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl PkiError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PkiError {
        let what = what.into();
        move |source| PkiError::Io { what, source }
    }

    pub(crate) fn cert(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> PkiError {
        let what = what.into();
        move |source| PkiError::Cert { what, source }
    }

    pub(crate) fn tls(what: impl Into<String>) -> impl FnOnce(rustls::Error) -> PkiError {
        let what = what.into();
        move |source| PkiError::Tls { what, source }
    }
}

/// The crypto provider every TLS configuration uses (ring, as kube-rs is built with), set
/// explicitly so nothing depends on a process-wide default being installed.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
