//! The Node object and the Lease: registration with addresses, capacity, node info and
//! conditions; status updates on change and at least every `status_interval`; a
//! coordination.k8s.io Lease renewed every `lease_interval` (the heartbeat the node lifecycle
//! controller watches).

use crate::names::NodeName;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use std::collections::BTreeMap;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Pods per node, as the kubelet's default --max-pods.
const MAX_PODS: &str = "110";

/// What the node reports about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub name: NodeName,
    pub ip: String,
    pub runtime_version: String,
    /// Where the kubelet API listens (status.daemonEndpoints: the API server proxies
    /// pods/log and pods/exec to InternalIP:port).
    pub kubelet_port: u16,
    /// Why pods cannot get a network yet (no podCIDR), if so.
    pub network_unavailable: Option<String>,
    /// Which pressure conditions hold (`pressure.rs`).
    pub pressure: super::pressure::Pressure,
}

fn machine_cpus() -> String {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string()
}

fn machine_memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn condition(
    type_: &str,
    ok_status: bool,
    reason: &str,
    message: &str,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: if ok_status { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// A pressure condition: True with the kubelet's `held` reason and message, else False with
/// its `clear` ones.
fn pressure_condition(
    type_: &str,
    pressure: bool,
    held: (&str, &str),
    clear: (&str, &str),
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> NodeCondition {
    let (reason, message) = if pressure { held } else { clear };
    condition(type_, pressure, reason, message, now)
}

/// The node's status as it is now.
pub fn status(facts: &NodeFacts) -> NodeStatus {
    let now = crate::pod::now();
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity(machine_cpus())),
        (
            "memory".to_string(),
            Quantity(format!("{}Ki", machine_memory_kib())),
        ),
        ("pods".to_string(), Quantity(MAX_PODS.into())),
    ]
    .into();
    let ready = facts.network_unavailable.is_none();
    NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: facts.ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: facts.name.to_string(),
            },
        ]),
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![
            if ready {
                condition(
                    "Ready",
                    true,
                    "KubeletReady",
                    "skiff node agent is posting ready status",
                    &now,
                )
            } else {
                condition(
                    "Ready",
                    false,
                    "NetworkPluginNotReady",
                    facts.network_unavailable.as_deref().unwrap_or_default(),
                    &now,
                )
            },
            pressure_condition(
                "MemoryPressure",
                facts.pressure.memory,
                (
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
                (
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                &now,
            ),
            pressure_condition(
                "DiskPressure",
                facts.pressure.disk,
                ("KubeletHasDiskPressure", "kubelet has disk pressure"),
                ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                &now,
            ),
            pressure_condition(
                "PIDPressure",
                facts.pressure.pid,
                (
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
                (
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                &now,
            ),
            condition(
                "NetworkUnavailable",
                !ready,
                if ready {
                    "RouteCreated"
                } else {
                    "NoRouteCreated"
                },
                if ready {
                    "pod network configured"
                } else {
                    "no podCIDR assigned yet"
                },
                &now,
            ),
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(facts.kubelet_port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.replace("x86_64", "amd64"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            container_runtime_version: facts.runtime_version.clone(),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            kube_proxy_version: String::new(),
            kubelet_version: format!("v1.33.0-skiff.{}", env!("CARGO_PKG_VERSION")),
            machine_id: read_trimmed("/etc/machine-id"),
            operating_system: "linux".into(),
            os_image: os_image(),
            system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_else(|| "Linux".into())
}

/// Creates the Node, or takes over an existing one as it is (an agent restart: the caller then
/// writes the status with the podCIDR known, so no condition flaps).
pub async fn register(client: &Client, facts: &NodeFacts) -> Result<Node, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = facts.name.to_string();
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname".to_string(), name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
    ]
    .into();
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        status: Some(status(facts)),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(n) => Ok(n),
        // Registered before (an agent restart): the Node as it is; the caller writes the
        // status once it knows its podCIDR again, keeping the conditions' transition times.
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(&name).await,
        Err(e) => Err(e),
    }
}

/// Keeps each condition's lastTransitionTime from `before` (the Node as last written) while
/// its status is unchanged, as the kubelet does: the time says when it last changed.
pub fn carry_transitions(status: &mut NodeStatus, before: Option<&Node>) {
    let Some(old) = before
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
    else {
        return;
    };
    for c in status.conditions.iter_mut().flatten() {
        if let Some(prev) = old
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            if prev.last_transition_time.is_some() {
                c.last_transition_time = prev.last_transition_time.clone();
            }
        }
    }
}

/// Writes the node's status; `before` is the Node as last written (or read), whose
/// conditions' transition times carry over.
pub async fn update_status(
    client: &Client,
    facts: &NodeFacts,
    before: Option<&Node>,
) -> Result<Node, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut status = status(facts);
    carry_transitions(&mut status, before);
    let patch = serde_json::json!({"status": status});
    api.patch_status(
        facts.name.as_str(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Renews (creating if needed) the node's Lease.
pub async fn renew_lease(
    client: &Client,
    node: &Node,
    duration_secs: i32,
) -> Result<(), kube::Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    // kube-node-lease is a system namespace the API server creates; a node may not read
    // namespaces (Kubernetes' Node authorizer), so it does not look.
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let micro_now = MicroTime(crate::pod::now().0);
    let spec = LeaseSpec {
        holder_identity: Some(name.clone()),
        lease_duration_seconds: Some(duration_secs),
        renew_time: Some(micro_now),
        ..Default::default()
    };
    match api.get_opt(&name).await? {
        Some(mut lease) => {
            lease.spec = Some(spec);
            api.replace(&name, &PostParams::default(), &lease).await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.clone(),
                        uid: node.metadata.uid.clone().unwrap_or_default(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_times_change_only_with_the_status() {
        let facts = NodeFacts {
            name: NodeName::new("n1".to_string()),
            ip: "10.0.0.2".into(),
            runtime_version: "containerd://1.6".into(),
            kubelet_port: 10250,
            network_unavailable: None,
            pressure: Default::default(),
        };
        let long_ago = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        );
        let mut before = status(&facts);
        for c in before.conditions.iter_mut().flatten() {
            c.last_transition_time = Some(long_ago.clone());
        }
        let before = Node {
            status: Some(before),
            ..Default::default()
        };
        // Nothing written before: every condition starts now.
        let mut first = status(&facts);
        carry_transitions(&mut first, None);
        assert!(first
            .conditions
            .iter()
            .flatten()
            .all(|c| c.last_transition_time.as_ref() != Some(&long_ago)));
        // Memory pressure appears: only that condition transitions.
        let mut pressured = facts.clone();
        pressured.pressure.memory = true;
        let mut now = status(&pressured);
        carry_transitions(&mut now, Some(&before));
        for c in now.conditions.iter().flatten() {
            let kept = c.last_transition_time.as_ref() == Some(&long_ago);
            assert_eq!(kept, c.type_ != "MemoryPressure", "{c:?}");
        }
    }
}
