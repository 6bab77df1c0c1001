//! core/v1 Node: validation (name, taints, pod CIDRs that may only be set once), kubectl's
//! columns (STATUS from the Ready condition plus SchedulingDisabled, ROLES from the
//! node-role labels) and the `spec.unschedulable` field selector.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, meta_field, name_cell,
    validate_typed,
};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    invalid_each, label_value_errors, qualified_name_errors, FieldPath, NameRule, Scope,
};

const TAINT_EFFECTS: &[&str] = &["NoExecute", "NoSchedule", "PreferNoSchedule"];
const ROLE_PREFIX: &str = "node-role.kubernetes.io/";
const ROLE_LABEL: &str = "kubernetes.io/role";

/// `SetDefaults_NodeStatus`: allocatable defaults to capacity.
pub fn default(v: &mut Value) {
    default_typed(v, |node: &mut Node| {
        if let Some(status) = node.status.as_mut() {
            if status.allocatable.is_none() {
                status.allocatable = status.capacity.clone();
            }
        }
    });
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Node, old: Option<&Node>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::Dns1123Subdomain,
        );
        let path = FieldPath::new("spec");
        let spec = new.spec.clone().unwrap_or_default();
        let mut seen = BTreeSet::new();
        for (i, t) in spec.taints.iter().flatten().enumerate() {
            let tp = path.child("taints").index(i);
            errs.extend(invalid_each(
                &tp.child("key"),
                &t.key,
                qualified_name_errors(&t.key),
            ));
            let value = t.value.as_deref().unwrap_or("");
            errs.extend(invalid_each(
                &tp.child("value"),
                value,
                label_value_errors(value),
            ));
            if t.effect.is_empty() {
                errs.push(FieldError::required(tp.child("effect")));
            } else if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
                errs.push(FieldError::not_supported(
                    tp.child("effect"),
                    &t.effect,
                    TAINT_EFFECTS,
                ));
            }
            if !seen.insert((t.key.clone(), t.effect.clone())) {
                errs.push(FieldError::duplicate(tp, format!("{}:{}", t.key, t.effect)));
            }
        }
        for (i, cidr) in spec.pod_cidrs.iter().flatten().enumerate() {
            if !is_cidr(cidr) {
                errs.push(FieldError::invalid(
                    path.child("podCIDRs").index(i),
                    cidr,
                    "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                ));
            }
        }
        if let Some(cidr) = spec.pod_cidr.as_deref().filter(|c| !c.is_empty()) {
            if !is_cidr(cidr) {
                errs.push(FieldError::invalid(
                    path.child("podCIDR"),
                    cidr,
                    "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                ));
            }
        }
        if let Some(old) = old {
            let old_spec: NodeSpec = old.spec.clone().unwrap_or_default();
            let was = old_spec.pod_cidrs.clone().unwrap_or_default();
            let now = spec.pod_cidrs.clone().unwrap_or_default();
            if !was.is_empty() && was != now {
                errs.push(FieldError::forbidden(
                    path.child("podCIDRs"),
                    "node updates may not change podCIDR except from \"\" to valid",
                ));
            }
            let was = old_spec.provider_id.clone().unwrap_or_default();
            if !was.is_empty() && Some(&was) != spec.provider_id.as_ref() {
                errs.push(FieldError::forbidden(
                    path.child("providerID"),
                    "node updates may not change providerID except from \"\" to valid",
                ));
            }
        }
        errs
    })
}

pub fn columns() -> Vec<TableColumnDefinition> {
    use ColumnType::String as S;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Status", S, "The status of the node"),
        TableColumnDefinition::new("Roles", S, "The roles of the node"),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("Version", S, "Kubelet Version reported by the node."),
        TableColumnDefinition::new("Internal-IP", S, "List of addresses reachable to the node. Queried from cloud provider, if available.").wide(),
        TableColumnDefinition::new("External-IP", S, "List of addresses reachable to the node. Queried from cloud provider, if available.").wide(),
        TableColumnDefinition::new("OS-Image", S, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).").wide(),
        TableColumnDefinition::new("Kernel-Version", S, "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).").wide(),
        TableColumnDefinition::new("Container-Runtime", S, "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).").wide(),
    ]
}

/// kubectl's `printNode`.
pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(node) = decode::<Node>(v) else {
        return default_row(v, now);
    };
    let status = node.status.clone().unwrap_or_default();
    let mut state: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "Ready")
        .take(1)
        .map(|c| {
            if c.status == "True" {
                "Ready".to_string()
            } else {
                "NotReady".to_string()
            }
        })
        .collect();
    if state.is_empty() {
        state.push("Unknown".into());
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        state.push("SchedulingDisabled".into());
    }
    let mut roles = BTreeSet::new();
    for (k, v) in node.metadata.labels.iter().flatten() {
        if let Some(role) = k.strip_prefix(ROLE_PREFIX).filter(|r| !r.is_empty()) {
            roles.insert(role.to_string());
        } else if k == ROLE_LABEL && !v.is_empty() {
            roles.insert(v.clone());
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };
    let address = |kind: &str| {
        status
            .addresses
            .iter()
            .flatten()
            .find(|a| a.type_ == kind)
            .map(|a| a.address.clone())
            .unwrap_or_else(|| "<none>".into())
    };
    let info = status.node_info.clone().unwrap_or_default();
    let or_unknown = |s: String| {
        if s.is_empty() {
            "<unknown>".to_string()
        } else {
            s
        }
    };
    vec![
        name_cell(&node.metadata),
        Value::from(state.join(",")),
        Value::from(roles),
        age_cell(&node.metadata, now),
        Value::from(info.kubelet_version.clone()),
        Value::from(address("InternalIP")),
        Value::from(address("ExternalIP")),
        Value::from(or_unknown(info.os_image)),
        Value::from(or_unknown(info.kernel_version)),
        Value::from(or_unknown(info.container_runtime_version)),
    ]
}

pub fn field(v: &Value, field: &str) -> Option<String> {
    match field {
        "spec.unschedulable" => Some(
            v.pointer("/spec/unschedulable")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string(),
        ),
        _ => meta_field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-03T15:00:00Z".parse().unwrap()
    }

    fn node() -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-1", "creationTimestamp": "2025-01-01T12:00:00Z",
                "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": "node-1"}},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.11"}, {"type": "Hostname", "address": "node-1"}],
                "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": "6.18.0",
                    "containerRuntimeVersion": "containerd://1.6.20", "architecture": "amd64", "bootID": "", "kubeProxyVersion": "",
                    "machineID": "", "operatingSystem": "linux", "systemUUID": ""}}})
    }

    #[test]
    fn rows_like_kubectl() {
        let mut v = node();
        default(&mut v);
        assert_eq!(v["status"]["allocatable"], v["status"]["capacity"]);
        // NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE KERNEL-VERSION CONTAINER-RUNTIME
        assert_eq!(
            row(&v, now()),
            vec![
                json!("node-1"),
                json!("Ready"),
                json!("control-plane"),
                json!("2d3h"),
                json!("v1.33.0"),
                json!("10.0.0.11"),
                json!("<none>"),
                json!("Debian GNU/Linux 12 (bookworm)"),
                json!("6.18.0"),
                json!("containerd://1.6.20")
            ]
        );
        let mut cordoned = v.clone();
        cordoned["spec"]["unschedulable"] = json!(true);
        cordoned["status"]["conditions"][1]["status"] = json!("Unknown");
        assert_eq!(row(&cordoned, now())[1], "NotReady,SchedulingDisabled");
        assert_eq!(
            field(&cordoned, "spec.unschedulable").as_deref(),
            Some("true")
        );
        assert_eq!(field(&v, "spec.unschedulable").as_deref(), Some("false"));
        let mut fresh = v.clone();
        fresh["status"]["conditions"] = json!([]);
        fresh["metadata"]["labels"] = json!({});
        let cells = row(&fresh, now());
        assert_eq!(
            (cells[1].as_str(), cells[2].as_str()),
            (Some("Unknown"), Some("<none>"))
        );
    }

    #[test]
    fn validation() {
        let v = node();
        assert!(validate(&v, None).is_empty());
        let mut tainted = v.clone();
        tainted["spec"]["taints"] = json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                                           {"key": "dedicated", "value": "x", "effect": "NoSchedule"},
                                           {"key": "k", "effect": "Sometimes"}]);
        let errs: Vec<String> = validate(&tainted, None)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert_eq!(errs, vec![
            "spec.taints[1]: Duplicate value: \"dedicated:NoSchedule\"",
            "spec.taints[2].effect: Unsupported value: \"Sometimes\": supported values: \"NoExecute\", \"NoSchedule\", \"PreferNoSchedule\"",
        ]);
        let mut moved = v.clone();
        moved["spec"]["podCIDRs"] = json!(["10.244.2.0/24"]);
        assert_eq!(validate(&moved, Some(&v))[0].field, "spec.podCIDRs");
        let mut unset = v.clone();
        unset["spec"] = json!({});
        assert!(
            validate(&v, Some(&unset)).is_empty(),
            "a CIDR may be set once"
        );
        let mut namespaced = v.clone();
        namespaced["metadata"]["namespace"] = json!("default");
        assert_eq!(
            validate(&namespaced, None)[0].message,
            "Forbidden: not allowed on this type"
        );
        let mut bad = v.clone();
        bad["spec"]["podCIDRs"] = json!(["10.244.1.0/33"]);
        assert_eq!(validate(&bad, None)[0].field, "spec.podCIDRs[0]");
    }
}
