//! NodeRestriction: what a node (user `system:node:<name>` in `system:nodes`) may write. The
//! Node authorizer decides by resource and name; what it cannot see is in the body, so it
//! lets a node create pods, write pod status, evict, write Nodes and create Leases and
//! service account tokens, and this plugin checks the object, as Kubernetes' plugin does:
//!
//! - pods: only mirror pods bound to itself, referring to no secret, configmap, claim or
//!   service account, owned by nothing but its own Node; status, eviction and deletion only
//!   of pods bound to itself;
//! - nodes: only its own Node; no labels outside the kubelet's own set (nothing under
//!   `node-restriction.kubernetes.io/`, nothing else under `kubernetes.io`/`k8s.io`) and no
//!   change of its taints after registration (either would let a node steer workloads that
//!   select or tolerate them onto itself);
//! - leases: only the Lease named after it;
//! - serviceaccounts/token: only tokens bound to a pod that exists, is bound to it and runs
//!   as that service account (the pod's uid, when given, must match).
//!
//! Anyone who is not a node passes untouched.

use async_trait::async_trait;
use serde_json::Value;

use super::super::{Env, Operation, Plugin, Request};
use crate::apiserver::authz::node::node_identity;
use crate::machinery::ApiError;

/// The annotation that marks a mirror pod (the API copy of a node's static pod).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Labels a node may set on itself (Kubernetes' kubelet labels).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];
/// Label namespaces (and their subdomains) a node may set freely.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];
/// The namespace reserved for labels nodes can never set (for isolating workloads).
const RESTRICTED_NAMESPACE: &str = "node-restriction.kubernetes.io";

pub struct NodeRestriction {
    env: Env,
}

impl NodeRestriction {
    pub fn new(env: Env) -> NodeRestriction {
        NodeRestriction { env }
    }

    async fn pod(
        &self,
        node: &str,
        req: &Request<'_>,
        obj: Option<&Value>,
    ) -> Result<(), ApiError> {
        let deny = |why: String| Err(req.forbidden(obj, why));
        match (req.operation, req.subresource) {
            (Operation::Create, None) => {
                let Some(pod) = obj else { return Ok(()) };
                if let Some(why) = mirror_pod_violation(node, pod) {
                    return deny(why);
                }
                Ok(())
            }
            (Operation::Create, Some("eviction")) => {
                // The pod named by the eviction (gone already: the eviction answers 404).
                let ns = req.namespace.unwrap_or_default();
                match self.env.get_value("", "pods", Some(ns), req.name).await? {
                    Some(pod) if bound_to(&pod) != Some(node) => deny(format!(
                        "node {node:?} can only evict pods with spec.nodeName set to itself"
                    )),
                    _ => Ok(()),
                }
            }
            (Operation::Update, Some("status")) => match req.old {
                Some(old) if bound_to(old) != Some(node) => deny(format!(
                    "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                )),
                _ => Ok(()),
            },
            (Operation::Delete, None) => match req.old {
                Some(old) if bound_to(old) != Some(node) => deny(format!(
                    "node {node:?} can only delete pods with spec.nodeName set to itself"
                )),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    async fn token(
        &self,
        node: &str,
        req: &Request<'_>,
        obj: Option<&Value>,
    ) -> Result<(), ApiError> {
        let deny = |why: String| Err(req.forbidden(None, why));
        let bound = obj.and_then(|o| o.pointer("/spec/boundObjectRef"));
        let Some(bound) = bound.filter(|b| b.get("kind").and_then(Value::as_str) == Some("Pod"))
        else {
            return deny(format!("node {node:?} requested token not bound to a pod"));
        };
        let name = bound["name"].as_str().unwrap_or_default();
        let ns = req.namespace.unwrap_or_default();
        let Some(pod) = self.env.get_value("", "pods", Some(ns), name).await? else {
            return deny(format!(
                "node {node:?} requested token bound to a pod that does not exist"
            ));
        };
        if bound_to(&pod) != Some(node) {
            return deny(format!(
                "node {node:?} requested token bound to a pod scheduled on a different node"
            ));
        }
        let uid = pod.pointer("/metadata/uid").and_then(Value::as_str);
        if let Some(want) = bound["uid"].as_str().filter(|u| !u.is_empty()) {
            if Some(want) != uid {
                return deny(format!(
                    "node {node:?} requested token bound to a pod with a different uid"
                ));
            }
        }
        let runs_as = pod
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        if runs_as != req.name {
            return deny(format!(
                "node {node:?} requested token for a service account its pod does not use"
            ));
        }
        Ok(())
    }
}

fn bound_to(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName").and_then(Value::as_str)
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
}

/// Why a node may not create this pod, if it may not.
fn mirror_pod_violation(node: &str, pod: &Value) -> Option<String> {
    if annotation(pod, MIRROR_ANNOTATION).is_none() {
        return Some(format!(
            "pod does not have {MIRROR_ANNOTATION:?} annotation, node {node:?} can only create mirror pods"
        ));
    }
    if bound_to(pod) != Some(node) {
        return Some(format!(
            "node {node:?} can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let own_node = |o: &Value| {
        o["apiVersion"] == "v1" && o["kind"] == "Node" && o["name"].as_str() == Some(node)
    };
    if !owners.is_empty() && (owners.len() != 1 || !own_node(&owners[0])) {
        return Some(format!(
            "node {node:?} can only create pods with a single owner reference set to itself"
        ));
    }
    let spec = pod.get("spec")?;
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Some(format!(
            "node {node:?} can not create pods that reference service accounts"
        ));
    }
    let mut refs = Vec::new();
    for v in spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("secret").is_some() {
            refs.push("secrets");
        }
        if v.get("configMap").is_some() {
            refs.push("configmaps");
        }
        if v.get("persistentVolumeClaim").is_some() || v.get("ephemeral").is_some() {
            refs.push("persistentvolumeclaims");
        }
        let sources = v.pointer("/projected/sources").and_then(Value::as_array);
        for s in sources.into_iter().flatten() {
            if s.get("secret").is_some() {
                refs.push("secrets");
            }
            if s.get("configMap").is_some() {
                refs.push("configmaps");
            }
            if s.get("serviceAccountToken").is_some() {
                refs.push("service account tokens");
            }
        }
    }
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten();
    for c in containers {
        let from = c
            .get("envFrom")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for f in from {
            if f.get("secretRef").is_some() {
                refs.push("secrets");
            }
            if f.get("configMapRef").is_some() {
                refs.push("configmaps");
            }
        }
        let env = c.get("env").and_then(Value::as_array).into_iter().flatten();
        for e in env.filter_map(|e| e.get("valueFrom")) {
            if e.get("secretKeyRef").is_some() {
                refs.push("secrets");
            }
            if e.get("configMapKeyRef").is_some() {
                refs.push("configmaps");
            }
        }
    }
    refs.first()
        .map(|what| format!("node {node:?} can not create pods that reference {what}"))
}

/// The label keys added, removed or changed between `old` and `new`.
fn modified_labels<'a>(new: &'a Value, old: Option<&'a Value>) -> Vec<&'a str> {
    let labels = |o: Option<&'a Value>| {
        o.and_then(|o| o.pointer("/metadata/labels"))
            .and_then(Value::as_object)
    };
    let (new, old) = (labels(Some(new)), labels(old));
    let mut keys: Vec<&str> = Vec::new();
    for (k, v) in new.into_iter().flatten() {
        if old.and_then(|o| o.get(k)) != Some(v) {
            keys.push(k);
        }
    }
    for k in old.into_iter().flat_map(|o| o.keys()) {
        if new.is_none_or(|n| !n.contains_key(k)) {
            keys.push(k);
        }
    }
    keys.sort_unstable();
    keys
}

fn in_namespace(label_ns: &str, ns: &str) -> bool {
    label_ns == ns || label_ns.ends_with(&format!(".{ns}"))
}

/// Whether a node may set this label on itself (Kubernetes' IsKubeletLabel).
fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let ns = key.split_once('/').map(|(ns, _)| ns).unwrap_or("");
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|allowed| in_namespace(ns, allowed))
}

/// Whether a node may not set or change this label.
fn forbidden_label(key: &str) -> bool {
    let ns = key.split_once('/').map(|(ns, _)| ns).unwrap_or("");
    if in_namespace(ns, RESTRICTED_NAMESPACE) {
        return true;
    }
    (in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io")) && !is_kubelet_label(key)
}

/// The object's name: the URL's, else (a create) the body's.
fn requested_name<'a>(req: &Request<'a>, obj: Option<&'a Value>) -> &'a str {
    match req.name {
        "" => obj
            .and_then(|o| o.pointer("/metadata/name"))
            .and_then(Value::as_str)
            .unwrap_or_default(),
        n => n,
    }
}

fn node_object(node: &str, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
    let deny = |why: String| Err(req.forbidden(obj, why));
    let requested = requested_name(req, obj);
    if requested != node {
        return deny(format!(
            "node {node:?} is not allowed to modify node {requested:?}"
        ));
    }
    let Some(new) = obj else { return Ok(()) };
    let forbidden: Vec<&str> = modified_labels(new, req.old)
        .into_iter()
        .filter(|k| forbidden_label(k))
        .collect();
    match req.operation {
        Operation::Create if !forbidden.is_empty() => deny(format!(
            "node {node:?} is not allowed to set the following labels: {}",
            forbidden.join(", ")
        )),
        Operation::Update if !forbidden.is_empty() => deny(format!(
            "node {node:?} is not allowed to modify labels: {}",
            forbidden.join(", ")
        )),
        Operation::Update
            if req.subresource.is_none()
                && req.old.and_then(|o| o.pointer("/spec/taints"))
                    != new.pointer("/spec/taints") =>
        {
            deny(format!("node {node:?} is not allowed to modify taints"))
        }
        _ => Ok(()),
    }
}

fn lease(node: &str, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
    let name = requested_name(req, obj);
    if name != node {
        return Err(req.forbidden(
            obj,
            format!("node {node:?} can only access node lease with the same name as the requesting node"),
        ));
    }
    Ok(())
}

#[async_trait]
impl Plugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(node) = node_identity(req.user) else {
            return Ok(());
        };
        if node.is_empty() {
            return Err(req.forbidden(obj, "could not determine node from user"));
        }
        let r = req.resource;
        match (r.group, r.plural) {
            ("", "pods") => self.pod(node, req, obj).await,
            ("", "nodes") => node_object(node, req, obj),
            ("coordination.k8s.io", "leases") => lease(node, req, obj),
            ("", "serviceaccounts") if req.subresource == Some("token") => {
                self.token(node, req, obj).await
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mirror(spec: Value) -> Value {
        json!({
            "metadata": {"name": "p", "annotations": {MIRROR_ANNOTATION: "x"}},
            "spec": spec,
        })
    }

    #[test]
    fn only_own_mirror_pods_without_references() {
        let ok = mirror(json!({"nodeName": "a", "containers": [{"name": "c"}]}));
        assert_eq!(mirror_pod_violation("a", &ok), None);
        let plain = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "a"}});
        assert!(mirror_pod_violation("a", &plain)
            .unwrap()
            .contains("can only create mirror pods"));
        let other = mirror(json!({"nodeName": "b"}));
        assert!(mirror_pod_violation("a", &other)
            .unwrap()
            .contains("spec.nodeName set to itself"));
        let secret = mirror(json!({"nodeName": "a",
            "volumes": [{"name": "s", "secret": {"secretName": "s"}}]}));
        assert!(mirror_pod_violation("a", &secret)
            .unwrap()
            .ends_with("reference secrets"));
        let env = mirror(json!({"nodeName": "a", "containers": [{"name": "c",
            "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}}]}]}));
        assert!(mirror_pod_violation("a", &env)
            .unwrap()
            .ends_with("reference configmaps"));
        let sa = mirror(json!({"nodeName": "a", "serviceAccountName": "x"}));
        assert!(mirror_pod_violation("a", &sa).is_some());
        let mut owned = ok.clone();
        owned["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "u"}]);
        assert_eq!(mirror_pod_violation("a", &owned), None);
        owned["metadata"]["ownerReferences"][0]["name"] = json!("b");
        assert!(mirror_pod_violation("a", &owned).is_some());
    }

    #[test]
    fn kubelet_labels_and_restricted_ones() {
        for ok in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/instance-type",
            "kubelet.kubernetes.io/anything",
            "foo.node.kubernetes.io/x",
            "example.com/role",
            "plain",
        ] {
            assert!(!forbidden_label(ok), "{ok}");
        }
        for no in [
            "node-role.kubernetes.io/control-plane",
            "node-restriction.kubernetes.io/pool",
            "x.node-restriction.kubernetes.io/pool",
            "k8s.io/x",
            "kubernetes.io/role",
        ] {
            assert!(forbidden_label(no), "{no}");
        }
    }

    #[test]
    fn modified_labels_are_added_changed_and_removed_keys() {
        let old = json!({"metadata": {"labels": {"a": "1", "b": "2", "c": "3"}}});
        let new = json!({"metadata": {"labels": {"a": "1", "b": "x", "d": "4"}}});
        assert_eq!(modified_labels(&new, Some(&old)), vec!["b", "c", "d"]);
        assert_eq!(modified_labels(&new, None), vec!["a", "b", "d"]);
    }
}
