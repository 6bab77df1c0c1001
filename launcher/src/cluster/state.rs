//! What a cluster put on the machine, written to `<state dir>/cluster.json` as each piece
//! appears, so `down` (from another process, or after a failed `up`) removes exactly that.

use super::Error;
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

pub const FILE: &str = "cluster.json";

/// The programs a cluster runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Binaries {
    pub control_plane: PathBuf,
    pub node: PathBuf,
    pub proxy: PathBuf,
}

impl Binaries {
    /// `control-plane`, `node` and `proxy` in one directory (a cargo profile's output).
    pub fn in_dir(dir: &Path) -> Binaries {
        Binaries {
            control_plane: dir.join("control-plane"),
            node: dir.join("node"),
            proxy: dir.join("proxy"),
        }
    }

    pub fn missing(&self) -> Vec<&Path> {
        [&self.control_plane, &self.node, &self.proxy]
            .into_iter()
            .map(PathBuf::as_path)
            .filter(|p| !p.exists())
            .collect()
    }
}

/// One node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    /// The host end of its veth.
    pub veth: String,
    pub ip: Ipv4Addr,
    pub data_dir: PathBuf,
    /// Its cgroup v2 directory: the pods' parent, which the proxy's programs are attached
    /// to; node-level processes run in its `host` child.
    pub cgroup: PathBuf,
    /// The proxy's pins (a directory on the cluster's bpffs).
    pub bpffs: PathBuf,
    pub agent: Option<u32>,
    pub proxy: Option<u32>,
    /// Its podCIDR, when the host routes to it (`Spec::pod_routes_on_host`).
    #[serde(default)]
    pub pod_cidr: Option<String>,
}

impl NodeState {
    /// The cgroup of the node's own (host-network) processes.
    pub fn host_cgroup(&self) -> PathBuf {
        self.cgroup.join("host")
    }
}

/// One of several control-plane servers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerState {
    pub pid: Option<u32>,
    /// Where it serves (its own address on the bridge).
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    pub name: String,
    pub bridge: String,
    pub subnet: String,
    pub binaries: Binaries,
    pub pause_image: String,
    /// The API server (loopback).
    pub api: Option<SocketAddr>,
    /// The relay process, when it is one (not threads of the process that ran `up`).
    pub relay: Option<u32>,
    pub relay_program: Option<String>,
    pub control_plane: Option<u32>,
    /// With several control planes: each `control-plane server` (the first is also
    /// `control_plane`).
    #[serde(default)]
    pub servers: Vec<ServerState>,
    /// With several control planes: the etcd members' processes.
    #[serde(default)]
    pub etcd: Vec<u32>,
    /// The cluster's private bpffs mount.
    pub bpffs: PathBuf,
    pub bpffs_mounted: bool,
    pub nodes: Vec<NodeState>,
}

impl State {
    pub fn load(dir: &Path) -> Result<Option<State>, Error> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::new(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::new(format!("{}: {e}", path.display()))),
        }
    }

    /// Written atomically (temp file, then rename).
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let tmp = dir.join(format!(".{FILE}.tmp"));
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::new(e.to_string()))?;
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, dir.join(FILE)))
            .map_err(|e| Error::new(format!("writing {}: {e}", dir.join(FILE).display())))
    }
}
