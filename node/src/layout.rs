//! The node agent's data directory: where each file and directory lives under it.

use std::path::{Path, PathBuf};

/// Paths under the agent's `--data-dir`.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn containerd_dir(&self) -> PathBuf {
        self.root.join("containerd")
    }

    pub fn containerd_config(&self) -> PathBuf {
        self.containerd_dir().join("config.toml")
    }

    /// containerd's registry `config_path`: `<registry>/hosts.toml` per registry.
    pub fn registry_hosts_dir(&self) -> PathBuf {
        self.containerd_dir().join("certs.d")
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.containerd_dir().join("containerd.sock")
    }

    pub fn containerd_pid(&self) -> PathBuf {
        self.containerd_dir().join("containerd.pid")
    }

    pub fn containerd_log(&self) -> PathBuf {
        self.containerd_dir().join("containerd.log")
    }

    pub fn cni_conf_dir(&self) -> PathBuf {
        self.root.join("cni/net.d")
    }

    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.root.join("cni/ipam")
    }

    /// Per-pod state: volumes live here (`<uid>/volumes/<kind>/<name>`).
    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.root.join("pods").join(pod_uid)
    }

    /// Container logs, as the kubelet's /var/log/pods: `<ns>_<name>_<uid>/<container>/<n>.log`.
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{name}_{uid}"))
    }
}
