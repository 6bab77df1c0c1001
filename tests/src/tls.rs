//! Certificates for tests: a certificate authority of the test's own and serving
//! certificates it signs (for a webhook, say), in PEM, so a test can hand a server its key
//! and a client (a caBundle) the CA, as an operator would with a CA of their own.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A CA that lives as long as the test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A serving certificate and its key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    /// The CA's certificate (what a client trusts).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn issue(&self, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("certificate parameters");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
