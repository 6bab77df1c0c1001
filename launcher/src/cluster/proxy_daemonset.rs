//! The service proxy as a DaemonSet (deploy/proxy.yaml) on a skiff cluster: what differs from
//! a Kubernetes node, and the manifest made for it.
//!
//! The manifest is the one a user applies to any cluster; the skiff cluster applies it as a
//! kustomization would, with this cluster's values filled in (the same path `cargo xtask up`
//! and the tests take):
//! - the ConfigMap `kube-system/skiff-proxy` with the API server's real address, as kubeadm
//!   writes kube-proxy's: a host-network proxy cannot reach the API through the `kubernetes`
//!   ClusterIP that it programs itself;
//! - several nodes share one kernel here, each in its own cgroup (`/skiff-<node>`, the pods'
//!   parent and the node's processes) and with its own pins: the cgroup volume is the
//!   machine's cgroup v2 root and `--cgroup` the node's subtree, the bpffs volume is the
//!   cluster's private bpffs and `--bpffs` the node's directory on it, both named through
//!   `$(NODE_NAME)` (the downward API's `spec.nodeName`, expanded by the node agent as the
//!   kubelet expands `$(VAR)` in args).

use super::Error;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;

/// deploy/proxy.yaml, built into the library so a cluster needs no checkout at run time.
pub const MANIFEST: &str = include_str!("../../../deploy/proxy.yaml");
/// The DaemonSet's namespace and name.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "skiff-proxy";
/// The ConfigMap holding the API server's address (`apiserver-host`, `apiserver-port`).
pub const CONFIG_MAP: &str = "skiff-proxy";

/// What a skiff cluster fills in.
pub struct ClusterValues<'a> {
    /// The API server's address on the node network.
    pub api: SocketAddr,
    /// The cluster's private bpffs (each node pins under `<bpffs>/<node>`).
    pub bpffs: &'a Path,
    /// The machine's cgroup v2 root (each node's cgroup is `<root>/skiff-<node>`).
    pub cgroup_root: &'a Path,
    /// `RUST_LOG` for the proxies, when set.
    pub log: Option<String>,
}

/// deploy/proxy.yaml with this cluster's values, plus its ConfigMap: one `v1 List` for
/// `kubectl apply -f -`.
pub fn manifest(values: &ClusterValues) -> Result<Value, Error> {
    let mut items: Vec<Value> = serde_saphyr::from_multiple(MANIFEST)
        .map_err(|e| Error::new(format!("deploy/proxy.yaml: {e}")))?;
    let ds = items
        .iter_mut()
        .find(|o| o["kind"] == "DaemonSet")
        .ok_or_else(|| Error::new("deploy/proxy.yaml has no DaemonSet"))?;
    let pod = &mut ds["spec"]["template"]["spec"];
    for (volume, host) in [("bpffs", values.bpffs), ("cgroup", values.cgroup_root)] {
        let v = pod["volumes"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == volume)
            .ok_or_else(|| Error::new(format!("deploy/proxy.yaml: no volume {volume}")))?;
        v["hostPath"]["path"] = json!(host.display().to_string());
    }
    let container = pod["containers"]
        .get_mut(0)
        .ok_or_else(|| Error::new("deploy/proxy.yaml: no container"))?;
    // This machine's mounts are private (no systemd making / shared), and the CRI refuses
    // HostToContainer (rslave) from a private mount; the cluster's bpffs is mounted before
    // any proxy pod starts, so nothing needs to propagate.
    for m in container["volumeMounts"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(m) = m.as_object_mut() {
            m.remove("mountPropagation");
        }
    }
    let cgroup_mount = mount_path(container, "cgroup")?;
    let bpffs_mount = mount_path(container, "bpffs")?;
    let mut replaced = 0;
    for arg in container["args"].as_array_mut().into_iter().flatten() {
        let new = match arg.as_str() {
            Some(a) if a.starts_with("--cgroup=") => {
                format!("--cgroup={cgroup_mount}/skiff-$(NODE_NAME)")
            }
            Some(a) if a.starts_with("--bpffs=") => format!("--bpffs={bpffs_mount}/$(NODE_NAME)"),
            _ => continue,
        };
        *arg = json!(new);
        replaced += 1;
    }
    if replaced != 2 {
        return Err(Error::new(
            "deploy/proxy.yaml: the proxy's args need --cgroup= and --bpffs=",
        ));
    }
    if let Some(log) = &values.log {
        if let Some(env) = container["env"].as_array_mut() {
            env.push(json!({"name": "RUST_LOG", "value": log}));
        }
    }
    // First: the pods read it once, when their container starts.
    items.insert(
        0,
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {
                "apiserver-host": values.api.ip().to_string(),
                "apiserver-port": values.api.port().to_string(),
            },
        }),
    );
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

fn mount_path(container: &Value, volume: &str) -> Result<String, Error> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == volume)
        .and_then(|m| m["mountPath"].as_str())
        .map(|p| p.trim_end_matches('/').to_string())
        .ok_or_else(|| Error::new(format!("deploy/proxy.yaml: volume {volume} is not mounted")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_gets_this_clusters_values() {
        let list = manifest(&ClusterValues {
            api: "10.9.0.1:36443".parse().unwrap(),
            bpffs: Path::new("/tmp/c/bpffs"),
            cgroup_root: Path::new("/sys/fs/cgroup/unified"),
            log: None,
        })
        .unwrap();
        let items = list["items"].as_array().unwrap();
        let kinds: Vec<&str> = items.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ConfigMap",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "DaemonSet"
            ]
        );
        let pod = &items[4]["spec"]["template"]["spec"];
        let args: Vec<&str> = pod["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(args.contains(&"--cgroup=/run/skiff-proxy/cgroup/skiff-$(NODE_NAME)"));
        assert!(args.contains(&"--bpffs=/sys/fs/bpf/$(NODE_NAME)"));
        let host = |name: &str| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .unwrap()["hostPath"]["path"]
                .clone()
        };
        assert_eq!(host("bpffs"), "/tmp/c/bpffs");
        assert_eq!(host("cgroup"), "/sys/fs/cgroup/unified");
        assert_eq!(items[0]["data"]["apiserver-host"], "10.9.0.1");
        assert_eq!(items[0]["data"]["apiserver-port"], "36443");
    }

    /// The generic manifest keeps Kubernetes-normal values: the node's whole cgroup v2 root
    /// and bpffs, tolerations of every taint, readiness on /healthz.
    #[test]
    fn the_generic_manifest_is_kubernetes_normal() {
        let items: Vec<Value> = serde_saphyr::from_multiple(MANIFEST).unwrap();
        let ds = items.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(pod["serviceAccountName"], "skiff-proxy");
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["privileged"], true);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz");
        assert!(c["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--cgroup=/run/skiff-proxy/cgroup")));
        assert_eq!(
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            1
        );
    }
}
