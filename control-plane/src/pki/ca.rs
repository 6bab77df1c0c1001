//! The cluster CA: an ECDSA P-256 key and a self-signed certificate, created once in a
//! directory (`ca.crt`, `ca.key`, 0600) and kept across restarts. It issues key pairs with
//! certificates ([`Ca::issue`]) and signs certificate requests ([`Ca::sign_request`]).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;

use super::files::{read_optional, read_text, write_private};
use super::PkiError;

/// How long the CA is valid (kubeadm's default).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Backdating of every certificate's start, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The subject of a certificate as Kubernetes reads it: CN is the user name, O the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    /// rcgen keeps one value per attribute type, so a certificate made here carries at most
    /// one organization (Kubernetes' identities need one: `system:masters`, `system:nodes`).
    pub organization: Option<String>,
}

impl Subject {
    pub fn new(common_name: impl Into<String>, organization: Option<&str>) -> Subject {
        Subject {
            common_name: common_name.into(),
            organization: organization.map(str::to_string),
        }
    }

    fn distinguished_name(&self) -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        if let Some(o) = &self.organization {
            dn.push(DnType::OrganizationName, o.as_str());
        }
        dn.push(DnType::CommonName, self.common_name.as_str());
        dn
    }
}

/// A subject alternative name of a serving certificate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum San {
    Dns(String),
    Ip(IpAddr),
}

impl std::str::FromStr for San {
    type Err = std::convert::Infallible;

    /// An IP address, else a DNS name.
    fn from_str(s: &str) -> Result<San, Self::Err> {
        Ok(match s.parse::<IpAddr>() {
            Ok(ip) => San::Ip(ip),
            Err(_) => San::Dns(s.to_string()),
        })
    }
}

impl std::fmt::Display for San {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            San::Dns(d) => f.write_str(d),
            San::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

impl San {
    fn to_rcgen(&self) -> Result<SanType, PkiError> {
        Ok(match self {
            San::Ip(ip) => SanType::IpAddress(*ip),
            San::Dns(d) => SanType::DnsName(
                d.as_str()
                    .try_into()
                    .map_err(PkiError::cert(format!("DNS name {d:?}")))?,
            ),
        })
    }
}

/// What a certificate may be used for (its extended key usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS client authentication.
    Client,
    /// TLS server authentication.
    Server,
}

/// A certificate to issue.
#[derive(Clone, Debug)]
pub struct CertSpec {
    pub subject: Subject,
    pub sans: Vec<San>,
    pub usages: Vec<Usage>,
    pub validity: Duration,
}

impl CertSpec {
    /// A client certificate for `user` in `group`, valid for `validity`.
    pub fn client(user: &str, group: Option<&str>, validity: Duration) -> CertSpec {
        CertSpec {
            subject: Subject::new(user, group),
            sans: Vec::new(),
            usages: vec![Usage::Client],
            validity,
        }
    }

    /// A serving certificate for `sans`, named `name`.
    pub fn server(name: &str, sans: Vec<San>, validity: Duration) -> CertSpec {
        CertSpec {
            subject: Subject::new(name, None),
            sans,
            usages: vec![Usage::Server],
            validity,
        }
    }
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl Issued {
    /// Writes `<base>.crt` and `<base>.key` (both 0600).
    pub fn write(&self, dir: &Path, base: &str) -> Result<(), PkiError> {
        for (ext, text) in [("crt", &self.cert_pem), ("key", &self.key_pem)] {
            let path = dir.join(format!("{base}.{ext}"));
            write_private(&path, text.as_bytes())
                .map_err(PkiError::io(format!("writing {}", path.display())))?;
        }
        Ok(())
    }
}

/// The cluster's certificate authority.
pub struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// The CA in `dir` (`ca.crt`, `ca.key`), created on first use.
    pub fn load_or_create(dir: &Path) -> Result<Ca, PkiError> {
        let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        if let (Some(_), Some(_)) = (read_optional(&cert)?, read_optional(&key)?) {
            return Ca::load(&cert, &key);
        }
        let key_pair = KeyPair::generate().map_err(PkiError::cert("generating the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = Subject::new("skiff-ca", None).distinguished_name();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(serial());
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let signed = params
            .self_signed(&key_pair)
            .map_err(PkiError::cert("self-signing the CA"))?;
        // The key first: a crash in between leaves a key without a certificate, which the
        // next start replaces, never a certificate whose key is lost.
        write_private(&key, key_pair.serialize_pem().as_bytes())
            .map_err(PkiError::io(format!("writing {}", key.display())))?;
        write_private(&cert, signed.pem().as_bytes())
            .map_err(PkiError::io(format!("writing {}", cert.display())))?;
        tracing::info!(dir = %dir.display(), "created the cluster CA");
        Ca::load(&dir.join("ca.crt"), &dir.join("ca.key"))
    }

    /// The CA from its certificate and key files.
    pub fn load(cert: &Path, key: &Path) -> Result<Ca, PkiError> {
        let cert_pem = read_text(cert)?;
        let key_pair = KeyPair::from_pem(&read_text(key)?)
            .map_err(PkiError::cert(format!("the CA key {}", key.display())))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key_pair).map_err(PkiError::cert(
            format!("the CA certificate {}", cert.display()),
        ))?;
        let cert_der = super::tls::certs_from_pem(&cert_pem)?
            .into_iter()
            .next()
            .ok_or_else(|| PkiError::Invalid(format!("{}: no certificate", cert.display())))?;
        Ok(Ca {
            cert_pem,
            cert_der,
            issuer,
        })
    }

    /// The CA certificate, PEM (what clients trust: a kubeconfig's certificate-authority-data,
    /// a pod's ca.crt).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// A new key pair and its certificate.
    pub fn issue(&self, spec: &CertSpec) -> Result<Issued, PkiError> {
        let key_pair = KeyPair::generate().map_err(PkiError::cert("generating a key"))?;
        let params = leaf_params(spec)?;
        let cert = params
            .signed_by(&key_pair, &self.issuer)
            .map_err(PkiError::cert(format!(
                "signing {}",
                spec.subject.common_name
            )))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key_pair.serialize_pem(),
        })
    }

    /// Signs a PKCS#10 request (its signature checked): the certificate carries the
    /// request's public key, subject and SANs, and the usages and validity the signer
    /// decided (never the request's own extensions).
    pub fn sign_request(
        &self,
        request: &CertRequest,
        usages: &[Usage],
        validity: Duration,
    ) -> Result<String, PkiError> {
        let mut csr = CertificateSigningRequestParams::from_pem(&request.pem)
            .map_err(PkiError::cert("the certificate request"))?;
        let spec = CertSpec {
            subject: request.subject.clone(),
            sans: request.sans.clone(),
            usages: usages.to_vec(),
            validity,
        };
        csr.params = leaf_params(&spec)?;
        let cert = csr
            .signed_by(&self.issuer)
            .map_err(PkiError::cert("signing the request"))?;
        Ok(cert.pem())
    }
}

/// A random positive 16-byte serial number.
fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn leaf_params(spec: &CertSpec) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = spec.subject.distinguished_name();
    params.subject_alt_names = spec
        .sans
        .iter()
        .map(San::to_rcgen)
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = spec
        .usages
        .iter()
        .map(|u| match u {
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
        })
        .collect();
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(serial());
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + spec.validity;
    Ok(params)
}

/// A PKCS#10 certificate request, parsed (its signature checked) into what a signer decides
/// on: the subject and the requested SANs.
#[derive(Clone, Debug)]
pub struct CertRequest {
    pem: String,
    pub subject: Subject,
    pub sans: Vec<San>,
}

impl CertRequest {
    /// Parses and checks a PEM request. A subject with several organizations is refused
    /// (see [`Subject`]).
    pub fn parse(pem: &str) -> Result<CertRequest, PkiError> {
        with_request(pem, |csr| CertRequest::of(pem, csr))
    }

    fn of(
        pem: &str,
        csr: &x509_parser::certification_request::X509CertificationRequest<'_>,
    ) -> Result<CertRequest, PkiError> {
        let info = &csr.certification_request_info;
        let subject = subject_of(&info.subject)?;
        let mut sans = Vec::new();
        for ext in csr.requested_extensions().into_iter().flatten() {
            if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
                for name in &san.general_names {
                    sans.push(match name {
                        x509_parser::extensions::GeneralName::DNSName(d) => San::Dns(d.to_string()),
                        x509_parser::extensions::GeneralName::IPAddress(b) => {
                            San::Ip(ip_of(b).ok_or_else(|| {
                                PkiError::Invalid("a SAN IP address of a bad length".into())
                            })?)
                        }
                        other => {
                            return Err(PkiError::Invalid(format!(
                                "unsupported subject alternative name {other}"
                            )))
                        }
                    });
                }
            }
        }
        Ok(CertRequest {
            pem: pem.to_string(),
            subject,
            sans,
        })
    }
}

/// Decodes a PEM request, parses it and checks its signature, then hands it to `f`.
fn with_request<T>(
    pem: &str,
    f: impl FnOnce(
        &x509_parser::certification_request::X509CertificationRequest<'_>,
    ) -> Result<T, PkiError>,
) -> Result<T, PkiError> {
    use rustls::pki_types::pem::PemObject;
    use x509_parser::prelude::FromDer;
    let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| PkiError::Invalid(format!("expected a PEM CERTIFICATE REQUEST block: {e}")))?;
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
            .map_err(|e| PkiError::Invalid(format!("the request does not parse: {e}")))?;
    csr.verify_signature()
        .map_err(|_| PkiError::Invalid("the request's signature is invalid".into()))?;
    f(&csr)
}

/// Whether `pem` is one PKCS#10 request that parses and whose signature holds (what the
/// API server checks of a CertificateSigningRequest; the signer decides on the rest).
pub fn check_request(pem: &str) -> Result<(), PkiError> {
    with_request(pem, |_| Ok(()))
}

/// Whether `pem` holds one or more certificates and nothing else.
pub fn check_certificates(pem: &str) -> Result<(), PkiError> {
    let certs = super::tls::certs_from_pem(pem)?;
    if certs.is_empty() {
        return Err(PkiError::Invalid(
            "must contain at least one CERTIFICATE PEM block".into(),
        ));
    }
    Ok(())
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

/// CN and O of an X.509 name.
pub fn subject_of(name: &x509_parser::x509::X509Name<'_>) -> Result<Subject, PkiError> {
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str()
            .map(str::to_string)
            .map_err(|e| PkiError::Invalid(format!("a subject attribute: {e}")))
    };
    let common_name = name
        .iter_common_name()
        .next()
        .map(text)
        .transpose()?
        .unwrap_or_default();
    let orgs: Vec<String> = name
        .iter_organization()
        .map(text)
        .collect::<Result<_, _>>()?;
    if orgs.len() > 1 {
        return Err(PkiError::Invalid(format!(
            "a subject with {} organizations: this CA signs one",
            orgs.len()
        )));
    }
    Ok(Subject {
        common_name,
        organization: orgs.into_iter().next(),
    })
}

/// A new P-256 key and a certificate request for `subject` and `sans` (what a node agent
/// sends in a CertificateSigningRequest): (request PEM, key PEM).
pub fn new_request(subject: &Subject, sans: &[San]) -> Result<(String, String), PkiError> {
    let key_pair = KeyPair::generate().map_err(PkiError::cert("generating a key"))?;
    let key_pem = key_pair.serialize_pem();
    Ok((request_for(subject, sans, &key_pair)?, key_pem))
}

/// A new key pair, PEM (P-256, as every key made here).
pub fn new_key() -> Result<String, PkiError> {
    Ok(KeyPair::generate()
        .map_err(PkiError::cert("generating a key"))?
        .serialize_pem())
}

/// A certificate request for `subject` and `sans` signed with the key `key_pem` (a node
/// agent keeps its key across restarts while a request is pending).
pub fn request_with_key(
    subject: &Subject,
    sans: &[San],
    key_pem: &str,
) -> Result<String, PkiError> {
    let key_pair = KeyPair::from_pem(key_pem).map_err(PkiError::cert("the private key"))?;
    request_for(subject, sans, &key_pair)
}

/// When the first certificate of `pem` stops being valid, in seconds since the epoch.
pub fn not_after(pem: &str) -> Result<i64, PkiError> {
    let der = super::tls::certs_from_pem(pem)?
        .into_iter()
        .next()
        .ok_or_else(|| PkiError::Invalid("no certificate".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PkiError::Invalid(format!("the certificate does not parse: {e}")))?;
    Ok(cert.validity().not_after.timestamp())
}

fn request_for(subject: &Subject, sans: &[San], key_pair: &KeyPair) -> Result<String, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject.distinguished_name();
    params.subject_alt_names = sans.iter().map(San::to_rcgen).collect::<Result<_, _>>()?;
    let csr = params
        .serialize_request(key_pair)
        .map_err(PkiError::cert("making the certificate request"))?;
    csr.pem()
        .map_err(PkiError::cert("encoding the certificate request"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_ca_is_kept_private_and_survives_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let a = Ca::load_or_create(d.path()).unwrap();
        let b = Ca::load_or_create(d.path()).unwrap();
        assert_eq!(a.cert_pem(), b.cert_pem());
        for f in ["ca.crt", "ca.key"] {
            let mode = std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }

    #[test]
    fn issued_certificates_carry_the_subject_and_verify_against_the_ca() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path()).unwrap();
        let issued = ca
            .issue(&CertSpec::client(
                "admin",
                Some("system:masters"),
                Duration::from_secs(3600),
            ))
            .unwrap();
        let verifier = super::super::tls::ClientVerifier::new(ca.cert_der()).unwrap();
        let chain = super::super::tls::certs_from_pem(&issued.cert_pem).unwrap();
        let peer = verifier.verify(&chain).unwrap();
        assert_eq!(peer.subject, Subject::new("admin", Some("system:masters")));

        let other = tempfile::tempdir().unwrap();
        let stranger = Ca::load_or_create(other.path())
            .unwrap()
            .issue(&CertSpec::client(
                "admin",
                Some("system:masters"),
                Duration::from_secs(3600),
            ))
            .unwrap();
        let chain = super::super::tls::certs_from_pem(&stranger.cert_pem).unwrap();
        assert!(verifier.verify(&chain).is_err(), "another CA's certificate");

        let serving = ca
            .issue(&CertSpec::server(
                "kube-apiserver",
                vec!["127.0.0.1".parse().unwrap()],
                Duration::from_secs(3600),
            ))
            .unwrap();
        let chain = super::super::tls::certs_from_pem(&serving.cert_pem).unwrap();
        assert!(verifier.verify(&chain).is_err(), "not a client certificate");
    }

    #[test]
    fn requests_are_signed_with_the_signers_usages() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path()).unwrap();
        let subject = Subject::new("system:node:n1", Some("system:nodes"));
        let sans: Vec<San> = vec!["n1".parse().unwrap(), "10.0.0.5".parse().unwrap()];
        let (pem, _key) = new_request(&subject, &sans).unwrap();
        let req = CertRequest::parse(&pem).unwrap();
        assert_eq!(req.subject, subject);
        assert_eq!(req.sans, sans);
        let cert = ca
            .sign_request(&req, &[Usage::Client], Duration::from_secs(600))
            .unwrap();
        let verifier = super::super::tls::ClientVerifier::new(ca.cert_der()).unwrap();
        let peer = verifier
            .verify(&super::super::tls::certs_from_pem(&cert).unwrap())
            .unwrap();
        assert_eq!(peer.subject, subject);

        let mut tampered = pem.replace("\n", "");
        tampered.insert(60, 'A');
        assert!(CertRequest::parse(&tampered).is_err());
        assert!(CertRequest::parse("not pem").is_err());
    }
}
