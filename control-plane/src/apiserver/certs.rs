//! The API server's certificates and the kubeconfigs it writes at start, under
//! `<data-dir>/pki` (every file 0600, never in git):
//!
//! - `ca.crt`, `ca.key`: the cluster CA, made on first start and kept.
//! - `apiserver.crt`, `apiserver.key`: the serving certificate, made again at every start
//!   (so its SANs always follow the flags): loopback, the listen and advertise addresses,
//!   `--tls-san`s, `kubernetes`, `kubernetes.default`, `kubernetes.default.svc`,
//!   `kubernetes.default.svc.cluster.local` and the first service IP.
//! - `apiserver-kubelet-client.crt`, `.key`: the identity of the API server's calls to node
//!   agents (`kube-apiserver-kubelet-client`).
//! - `sa.key`: the service account token signing key (`auth::serviceaccount`).
//!
//! Node agents' serving certificates (`system:node:<name>` in `system:nodes`, SANs = the
//! node's addresses and host name) come from the same CA through [`kubelet_serving`]
//! (`control-plane kubelet-serving-cert`), or through a CertificateSigningRequest.
//!
//! Kubeconfigs (client certificates, one year): the admin's (`system:masters`) where
//! `--write-kubeconfig` says, and `controller-manager.kubeconfig`
//! (`system:kube-controller-manager`) and `scheduler.kubeconfig` (`system:kube-scheduler`)
//! in the data directory, which `control-plane server` runs its components with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::authz::node::{NODES_GROUP, NODE_USER_PREFIX};
use super::kubeconfig::{self, Credentials};
use crate::pki::{Ca, CertSpec, Issued, PkiError, San, Subject, Usage};

/// How long the serving and client certificates made here are valid.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The DNS names of the in-cluster `kubernetes` Service.
pub const SERVICE_NAMES: &[&str] = &[
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The user of the API server's calls to node agents.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
/// The admin's user and group.
pub const ADMIN_USER: &str = "kubernetes-admin";
pub const MASTERS_GROUP: &str = "system:masters";
/// The controller manager's and scheduler's users.
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
pub const SCHEDULER_USER: &str = "system:kube-scheduler";

/// The PKI directory of a data directory.
pub fn pki_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("pki")
}

/// What the server made of its PKI at start.
pub struct ServerCerts {
    pub ca: Ca,
    pub serving: Issued,
    pub kubelet_client: Issued,
}

/// The SANs of the serving certificate.
pub fn serving_sans(
    listen: SocketAddr,
    advertise: Option<IpAddr>,
    first_service_ip: Ipv4Addr,
    extra: &[San],
) -> Vec<San> {
    let mut sans: Vec<San> = vec![
        San::Ip(Ipv4Addr::LOCALHOST.into()),
        San::Ip(Ipv6Addr::LOCALHOST.into()),
        San::Dns("localhost".into()),
        San::Ip(first_service_ip.into()),
    ];
    if !listen.ip().is_unspecified() {
        sans.push(San::Ip(listen.ip()));
    }
    sans.extend(advertise.map(San::Ip));
    sans.extend(SERVICE_NAMES.iter().map(|n| San::Dns(n.to_string())));
    sans.extend(extra.iter().cloned());
    let mut seen = std::collections::HashSet::new();
    sans.retain(|s| seen.insert(s.clone()));
    sans
}

/// A node agent's serving certificate for its API (the kubelet's port), as the
/// `kubernetes.io/kubelet-serving` signer issues it: CN `system:node:<node>`, O
/// `system:nodes`, the server usage, `sans` (the node's addresses and host name). Callers
/// verify it against the cluster CA for the address they dial (the Node's InternalIP).
pub fn kubelet_serving(
    ca: &Ca,
    node: &str,
    sans: Vec<San>,
    validity: Duration,
) -> Result<Issued, PkiError> {
    if node.is_empty() || sans.is_empty() {
        return Err(PkiError::Invalid(
            "a node serving certificate needs the node's name and at least one address".into(),
        ));
    }
    ca.issue(&CertSpec {
        subject: Subject::new(format!("{NODE_USER_PREFIX}{node}"), Some(NODES_GROUP)),
        sans,
        usages: vec![Usage::Server],
        validity,
    })
}

/// The API server's identity towards etcd (`--etcd-certfile`).
pub const ETCD_CLIENT: &str = "apiserver-etcd-client";

/// An etcd cluster's certificates, as kubeadm's `certs etcd-*` phases make them, in `dir`
/// (0600): an etcd CA of its own (`ca.crt`, `ca.key`, made once and kept: etcd trusts no
/// other identity of the cluster), for each member `<name>.crt`/`.key` with both server and
/// client usages (a member is its peers' client) and SANs the given ones, loopback and
/// `localhost`, and the API server's client certificate [`ETCD_CLIENT`]`.crt`/`.key`.
pub fn etcd_certificates(
    dir: &Path,
    members: &[(String, Vec<San>)],
    validity: Duration,
) -> Result<(), PkiError> {
    let ca = Ca::load_or_create(dir)?;
    for (name, extra) in members {
        let mut sans = vec![
            San::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            San::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            San::Dns("localhost".into()),
        ];
        sans.extend(extra.iter().cloned());
        let mut spec = CertSpec::server(name, sans, validity);
        spec.usages.push(Usage::Client);
        ca.issue(&spec)?.write(dir, name)?;
    }
    ca.issue(&CertSpec::client(ETCD_CLIENT, None, validity))?
        .write(dir, ETCD_CLIENT)
}

impl ServerCerts {
    /// Loads (or creates) the CA and makes the serving and kubelet-client certificates.
    pub fn prepare(data_dir: &Path, sans: Vec<San>) -> Result<ServerCerts, PkiError> {
        let dir = pki_dir(data_dir);
        let ca = Ca::load_or_create(&dir)?;
        let serving = ca.issue(&CertSpec::server("kube-apiserver", sans, LEAF_VALIDITY))?;
        serving.write(&dir, "apiserver")?;
        let kubelet_client =
            ca.issue(&CertSpec::client(KUBELET_CLIENT_USER, None, LEAF_VALIDITY))?;
        kubelet_client.write(&dir, "apiserver-kubelet-client")?;
        Ok(ServerCerts {
            ca,
            serving,
            kubelet_client,
        })
    }

    /// Writes a kubeconfig for `server` as `user` in `group`, with a new client certificate.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        server: &str,
        user: &str,
        group: Option<&str>,
    ) -> Result<(), PkiError> {
        let issued = self
            .ca
            .issue(&CertSpec::client(user, group, LEAF_VALIDITY))?;
        kubeconfig::write(
            path,
            server,
            self.ca.cert_pem(),
            user,
            &Credentials::Certificate(issued),
        )
        .map_err(PkiError::io(format!("writing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_serving_certificates_name_the_node() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path()).unwrap();
        let issued = kubelet_serving(
            &ca,
            "n1",
            vec!["10.0.0.5".parse().unwrap(), "n1".parse().unwrap()],
            LEAF_VALIDITY,
        )
        .unwrap();
        let der = crate::pki::tls::certs_from_pem(&issued.cert_pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let subject = crate::pki::ca::subject_of(cert.subject()).unwrap();
        assert_eq!(
            subject,
            Subject::new("system:node:n1", Some("system:nodes"))
        );
        let sans = cert.subject_alternative_name().unwrap().unwrap().value;
        assert_eq!(sans.general_names.len(), 2);
        assert!(kubelet_serving(&ca, "n1", vec![], LEAF_VALIDITY).is_err());
    }

    #[test]
    fn etcd_members_serve_and_are_clients_under_a_ca_of_their_own() {
        let d = tempfile::tempdir().unwrap();
        let members = [
            ("m0".to_string(), vec!["10.0.0.7".parse().unwrap()]),
            ("m1".to_string(), vec![]),
        ];
        etcd_certificates(d.path(), &members, LEAF_VALIDITY).unwrap();
        let ca_before = std::fs::read_to_string(d.path().join("ca.crt")).unwrap();
        let read = |name: &str| {
            let pem = std::fs::read_to_string(d.path().join(format!("{name}.crt"))).unwrap();
            crate::pki::tls::certs_from_pem(&pem).unwrap().remove(0)
        };
        let der = read("m0");
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(
            eku.server_auth && eku.client_auth,
            "a member is a server and a peer's client"
        );
        let sans = cert.subject_alternative_name().unwrap().unwrap().value;
        let text = format!("{:?}", sans.general_names);
        assert!(
            text.contains("localhost") && text.contains("[10, 0, 0, 7]"),
            "{text}"
        );
        let der = read(ETCD_CLIENT);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        // Run again (a restart): the CA stays, so the members' trust does.
        etcd_certificates(d.path(), &members, LEAF_VALIDITY).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("ca.crt")).unwrap(),
            ca_before
        );
    }

    #[test]
    fn serving_sans_cover_loopback_the_service_and_the_flags() {
        let sans = serving_sans(
            "0.0.0.0:6443".parse().unwrap(),
            Some("10.249.0.1".parse().unwrap()),
            "10.96.0.1".parse().unwrap(),
            &["api.example".parse().unwrap(), "127.0.0.1".parse().unwrap()],
        );
        let text: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        for want in [
            "127.0.0.1",
            "::1",
            "10.96.0.1",
            "10.249.0.1",
            "kubernetes.default.svc.cluster.local",
            "api.example",
        ] {
            assert!(text.iter().any(|t| t == want), "{want} in {text:?}");
        }
        assert!(!text.iter().any(|t| t == "0.0.0.0"));
        assert_eq!(text.iter().filter(|t| *t == "127.0.0.1").count(), 1);
    }
}
