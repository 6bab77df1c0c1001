//! TLS configurations over the cluster CA, and the check of a client certificate.
//!
//! Servers ask for a client certificate but do not require one, and accept any certificate
//! during the handshake (its signature over the handshake still proves the key): the check
//! against the CA comes after, in the authenticator ([`ClientVerifier`]), as Kubernetes'
//! API server does it. So a certificate of another CA, or an expired one, is a 401 with a
//! reason, not a failed handshake, and a client without a certificate can still present a
//! bearer token.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use super::ca::{subject_of, Subject};
use super::{provider, PkiError};

/// Every certificate in a PEM text.
pub fn certs_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Invalid(format!("certificates: {e}")))
}

/// The private key in a PEM text.
pub fn key_from_pem(pem: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| PkiError::Invalid(format!("private key: {e}")))
}

fn roots(ca: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, PkiError> {
    let mut store = RootCertStore::empty();
    for c in ca {
        store
            .add(c.clone())
            .map_err(PkiError::tls("a CA certificate"))?;
    }
    Ok(Arc::new(store))
}

/// A verified client certificate: who it names and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCertificate {
    pub subject: Subject,
    /// Its notAfter.
    pub not_after: SystemTime,
}

impl PeerCertificate {
    pub fn expired(&self) -> bool {
        SystemTime::now() > self.not_after
    }
}

/// Checks client certificate chains against the CA (signature, validity, the clientAuth
/// usage) and reads the subject.
#[derive(Clone, Debug)]
pub struct ClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientVerifier {
    pub fn new(ca: &CertificateDer<'static>) -> Result<ClientVerifier, PkiError> {
        let inner = WebPkiClientVerifier::builder_with_provider(
            roots(std::slice::from_ref(ca))?,
            provider(),
        )
        .build()
        .map_err(|e| PkiError::Invalid(format!("the client verifier: {e}")))?;
        Ok(ClientVerifier { inner })
    }

    /// The identity in `chain` (end entity first), if the CA issued it and it is valid now.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Result<PeerCertificate, String> {
        let (end, intermediates) = chain
            .split_first()
            .ok_or_else(|| "no certificate".to_string())?;
        self.inner
            .verify_client_cert(end, intermediates, UnixTime::now())
            .map_err(|e| format!("verifying certificate: {e}"))?;
        let (_, cert) = x509_parser::parse_x509_certificate(end)
            .map_err(|e| format!("parsing certificate: {e}"))?;
        let subject = subject_of(cert.subject()).map_err(|e| e.to_string())?;
        let secs = cert.validity().not_after.timestamp().max(0) as u64;
        Ok(PeerCertificate {
            subject,
            not_after: UNIX_EPOCH + Duration::from_secs(secs),
        })
    }
}

/// The handshake-signature methods of rustls' verifier traits, the same in every verifier
/// here: whatever a verifier decides about the chain, the peer must prove it holds the key
/// of the certificate it presented, checked with this provider's algorithms.
macro_rules! handshake_signatures_checked {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &provider().signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &provider().signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

/// Offers client authentication, does not require it, and defers the check of the chain
/// to [`ClientVerifier`] (see the module docs). The handshake signature is still verified.
#[derive(Debug)]
struct DeferredClientAuth;

impl ClientCertVerifier for DeferredClientAuth {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a Go client then sends whatever certificate it has, which the
        // authenticator judges (a certificate of another CA is a 401, not silence).
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    handshake_signatures_checked!();
}

/// A server configuration: this certificate chain and key, client certificates asked for
/// (checked later), HTTP/2 and HTTP/1.1 offered (upgrades such as exec use HTTP/1.1).
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, PkiError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(PkiError::tls("TLS versions"))?
        .with_client_cert_verifier(Arc::new(DeferredClientAuth))
        .with_single_cert(certs_from_pem(cert_pem)?, key_from_pem(key_pem)?)
        .map_err(PkiError::tls("the serving certificate"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts any server certificate (the handshake's signatures are still checked against
/// the certificate presented): what Kubernetes' proxy transport does for `https:` pod and
/// service backends of the proxy subresources (`InsecureSkipVerify`), whose certificates
/// name whatever their owners chose and come from CAs the cluster does not know.
#[derive(Debug)]
struct AnyServerCert;

impl rustls::client::danger::ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    handshake_signatures_checked!();
}

/// The client configuration for `https:` backends of pods/proxy and services/proxy: any
/// server certificate accepted, as Kubernetes does there (see [`AnyServerCert`]); no client
/// certificate (the API server's own identity is not the caller's). HTTP/1.1 only.
///
/// SECURITY: for those proxy backends ONLY (its one caller is
/// `apiserver::handlers::proxy_subresource::tls_to_backend`). Webhooks, the node agent's
/// API (nodes/proxy too), etcd and every other peer the control plane trusts use
/// [`client_config`]-style configurations that verify against a known CA.
pub fn unverified_backend_config() -> Result<Arc<rustls::ClientConfig>, PkiError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(PkiError::tls("TLS versions"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration that trusts the CA in `ca_pem` only, presenting `identity`
/// (certificate chain and key PEM) when given. HTTP/1.1 only (ALPN): the callers relay
/// upgrades.
pub fn client_config(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Arc<rustls::ClientConfig>, PkiError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(PkiError::tls("TLS versions"))?
        .with_root_certificates(roots(&certs_from_pem(ca_pem)?)?);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certs_from_pem(cert)?, key_from_pem(key)?)
            .map_err(PkiError::tls("the client certificate"))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
