//! The admin credentials: a bearer token kept in the data directory (so a restarted server
//! accepts the kubeconfigs it wrote before) and the kubeconfig that kubectl and kube-rs use.

use std::io::Write;
use std::path::Path;

/// Reads the token in `dir/admin-token`, creating it on first start.
pub fn load_or_create_token(dir: &Path) -> std::io::Result<String> {
    let path = dir.join("admin-token");
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let raw: [u8; 24] = rand::random();
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, token.as_bytes())?;
    Ok(token)
}

/// The kubeconfig for `server` (a URL) with `token`, context namespace `default`.
pub fn render(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: skiff
  cluster:
    server: {server}
users:
- name: skiff-admin
  user:
    token: {token}
contexts:
- name: skiff
  context:
    cluster: skiff
    user: skiff-admin
    namespace: default
current-context: skiff
preferences: {{}}
"
    )
}

/// Writes a file only its owner can read (it holds a credential).
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_survives_restart_and_is_private() {
        let d = tempfile::tempdir().unwrap();
        let a = load_or_create_token(d.path()).unwrap();
        let b = load_or_create_token(d.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 48);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.path().join("admin-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(render("http://127.0.0.1:1", &a).contains(&format!("token: {a}")));
    }
}
