//! The node agent's data directory: where each file and directory lives under it.

use std::path::{Path, PathBuf};

/// The kubelet's root dir, which each agent's data dir plays for its pods and drivers (several
/// agents may share one machine): paths in this form are mapped to and from the data dir.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

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

    /// Where plugins (CSI drivers) put their registration sockets (`*.sock`): the kubelet's
    /// `plugins_registry`.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// Where plugins keep their own sockets and state: the kubelet's `plugins`.
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }

    /// The directory of a CSI volume staged on this node (its `globalmount` is the staging
    /// target): named by the SHA-256 of the volume handle, as the kubelet names it, so any
    /// handle makes a short, safe path.
    pub fn csi_staging_dir(&self, driver: &str, volume_handle: &str) -> PathBuf {
        use sha2::{Digest, Sha256};
        let hex: String = Sha256::digest(volume_handle.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.plugins_dir()
            .join("kubernetes.io/csi")
            .join(driver)
            .join(hex)
    }

    /// The directory of a CSI volume published into a pod (its `mount` is the target path).
    pub fn csi_publish_dir(&self, pod_uid: &str, pv_name: &str) -> PathBuf {
        self.pod_dir(pod_uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv_name)
    }

    /// A path in the kubelet's form (`/var/lib/kubelet/...`, as drivers and hostPath volumes
    /// name it) on this machine: under this agent's root dir. Other paths are unchanged.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        match path.strip_prefix(KUBELET_ROOT) {
            Ok(rest) if rest.as_os_str().is_empty() => self.root.clone(),
            Ok(rest) => self.root.join(rest),
            Err(_) => path.to_path_buf(),
        }
    }

    /// The kubelet's form of a path under this agent's root dir (what a driver is told);
    /// None for paths outside it.
    pub fn kubelet_path(&self, path: &Path) -> Option<PathBuf> {
        let rest = path.strip_prefix(&self.root).ok()?;
        Some(if rest.as_os_str().is_empty() {
            PathBuf::from(KUBELET_ROOT)
        } else {
            Path::new(KUBELET_ROOT).join(rest)
        })
    }

    /// Container logs, as the kubelet's /var/log/pods: `<ns>_<name>_<uid>/<container>/<n>.log`.
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{name}_{uid}"))
    }
}
