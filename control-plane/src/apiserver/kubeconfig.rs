//! Kubeconfigs as kubectl, client-go and kube-rs read them: the server URL and the cluster
//! CA (embedded), and the user's credentials (a client certificate and key, embedded, or a
//! bearer token), context namespace `default`. Written 0600: they hold credentials.

use std::path::Path;

use base64::Engine;

pub use crate::pki::files::write_private;
use crate::pki::Issued;

/// The credentials of a kubeconfig's user.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A client certificate and its key (PEM).
    Certificate(Issued),
    /// A bearer token (a bootstrap token, a static token).
    Token(String),
}

/// A kubeconfig for `server` (a URL) trusting `ca_pem`, as `user` with `credentials`.
pub fn render(server: &str, ca_pem: &str, user: &str, credentials: &Credentials) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user_fields = match credentials {
        Credentials::Certificate(c) => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&c.cert_pem),
            b64(&c.key_pem)
        ),
        Credentials::Token(t) => format!("    token: {t}\n"),
    };
    // Quoted: user names such as `system:node:n1` hold colons.
    let user = serde_json::Value::from(user).to_string();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: skiff
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
{user_fields}contexts:
- name: skiff
  context:
    cluster: skiff
    user: {user}
    namespace: default
current-context: skiff
preferences: {{}}
",
        ca = b64(ca_pem),
    )
}

/// Writes a kubeconfig (see [`render`]) to `path`, 0600.
pub fn write(
    path: &Path,
    server: &str,
    ca_pem: &str,
    user: &str,
    credentials: &Credentials,
) -> std::io::Result<()> {
    write_private(path, render(server, ca_pem, user, credentials).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfigs_parse_as_kube_rs_reads_them() {
        let issued = Issued {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let text = render(
            "https://127.0.0.1:6443",
            "CA",
            "system:node:n1",
            &Credentials::Certificate(issued),
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(kc.auth_infos[0].name, "system:node:n1");
        assert!(kc.auth_infos[0]
            .auth_info
            .as_ref()
            .unwrap()
            .client_certificate_data
            .is_some());
        let token = render(
            "https://x",
            "CA",
            "bootstrap",
            &Credentials::Token("a.b".into()),
        );
        let kc = kube::config::Kubeconfig::from_yaml(&token).unwrap();
        assert!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.is_some());
    }

    #[test]
    fn files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kc");
        write(&p, "https://x", "CA", "u", &Credentials::Token("t".into())).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
