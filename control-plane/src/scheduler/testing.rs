//! Builders for the scheduler's unit tests: pods and nodes from compact JSON, and a cache
//! holding a small cluster.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};

use super::cache::Cache;
use super::node_info::NodeInfo;
use super::pod_info::PodInfo;

/// A pod from JSON (`metadata` and `spec` as in the API); uid `uid-<name>`, namespace
/// `default` and one container are filled in when absent.
pub fn pod(v: Value) -> Arc<PodInfo> {
    let mut v = v;
    if v.get("metadata").is_none() {
        v["metadata"] = json!({});
    }
    let name = v["metadata"]["name"].as_str().unwrap_or("p").to_string();
    let meta = v["metadata"].as_object_mut().unwrap();
    meta.entry("name").or_insert(json!(name.clone()));
    meta.entry("uid").or_insert(json!(format!("uid-{name}")));
    meta.entry("namespace").or_insert(json!("default"));
    if v.get("spec").is_none() {
        v["spec"] = json!({});
    }
    let spec = v["spec"].as_object_mut().unwrap();
    spec.entry("containers")
        .or_insert(json!([{"name": "c", "image": "img"}]));
    Arc::new(PodInfo::new(Arc::new(serde_json::from_value(v).unwrap())))
}

/// A pod requesting `cpu` and `memory` (either may be "").
pub fn pod_requesting(name: &str, cpu: &str, memory: &str) -> Arc<PodInfo> {
    let mut requests = json!({});
    if !cpu.is_empty() {
        requests["cpu"] = json!(cpu);
    }
    if !memory.is_empty() {
        requests["memory"] = json!(memory);
    }
    pod(json!({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "img", "resources": {"requests": requests}}]}}))
}

/// A node with allocatable cpu/memory/pods, labels (hostname added) and a spec (taints,
/// unschedulable).
pub fn node(name: &str, cpu: &str, memory: &str, labels: Value, spec: Value) -> Arc<Node> {
    let mut labels = labels;
    if labels.is_null() {
        labels = json!({});
    }
    labels["kubernetes.io/hostname"] = json!(name);
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": memory, "pods": "110"}},
        }))
        .unwrap(),
    )
}

/// A plain 4-cpu, 8 GiB node.
pub fn plain_node(name: &str) -> Arc<Node> {
    node(name, "4", "8Gi", json!({}), json!({}))
}

/// A NodeInfo holding `node` and `pods`.
pub fn node_info(node: Arc<Node>, pods: &[Arc<PodInfo>]) -> NodeInfo {
    let mut n = NodeInfo::default();
    n.set_node(node);
    for p in pods {
        n.add_pod(p.clone());
    }
    n
}

/// A cache of `nodes` with `pods` bound as (pod, node name).
pub fn cache(nodes: &[Arc<Node>], pods: &[(Arc<PodInfo>, &str)]) -> Cache {
    let mut c = Cache::new();
    for n in nodes {
        c.upsert_node(n.clone());
    }
    for (p, n) in pods {
        c.assume(p.clone(), n);
    }
    c.refresh_order();
    c
}
