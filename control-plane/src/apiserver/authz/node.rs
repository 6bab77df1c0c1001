//! The Node authorizer: a node (user `system:node:<name>` in group `system:nodes`) reads only
//! the Secrets, ConfigMaps, PersistentVolumeClaims and service-account tokens of the pods bound
//! to it, its own Lease, and the pods bound to it; everything else it may do is the static
//! `system:node` rule set. Which objects a node may read comes from a graph kept from the pod
//! cache, changed per pod event: each referenced object counts the pods on each node that refer
//! to it, so a decision is one lookup.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, Pod, PodSpec};

use super::attributes::{Attributes, ResourceAttributes, Target};
use super::follow::{Follower, Update};
use super::rules::Rule;
use super::Decision;
use crate::apiserver::auth::UserInfo;
use crate::apiserver::registry;
use crate::machinery::FieldSelector;
use crate::store::cache::{Cache, CachedObject};

/// The user-name prefix of nodes.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group every node is in.
pub const NODES_GROUP: &str = "system:nodes";
/// The namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node a user is, if it is one (Kubernetes' default `NodeIdentifier`): `Some("")` for a
/// node whose name cannot be told.
pub fn node_identity(user: &UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    user.in_group(NODES_GROUP).then_some(name)
}

/// What a pod refers to that its node may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    Secret,
    ConfigMap,
    PersistentVolumeClaim,
    ServiceAccount,
}

type ObjectKey = (Kind, String, String);

/// What one bound pod adds to the graph.
#[derive(Debug, PartialEq)]
struct Edges {
    node: String,
    objects: Vec<ObjectKey>,
}

/// Objects -> the nodes whose pods refer to them (with how many pods).
#[derive(Default, Debug)]
pub struct Graph {
    refs: HashMap<ObjectKey, HashMap<String, u32>>,
    pods: HashMap<String, Edges>,
}

impl Graph {
    /// A pod as it now is (store key `key`): unbound pods add nothing.
    pub fn set_pod(&mut self, key: &str, pod: &Pod) {
        self.remove_pod(key);
        let Some(edges) = edges_of(pod) else {
            return;
        };
        for o in &edges.objects {
            *self
                .refs
                .entry(o.clone())
                .or_default()
                .entry(edges.node.clone())
                .or_default() += 1;
        }
        self.pods.insert(key.to_string(), edges);
    }

    pub fn remove_pod(&mut self, key: &str) {
        let Some(old) = self.pods.remove(key) else {
            return;
        };
        for o in old.objects {
            if let Some(nodes) = self.refs.get_mut(&o) {
                if let Some(n) = nodes.get_mut(&old.node) {
                    *n -= 1;
                    if *n == 0 {
                        nodes.remove(&old.node);
                    }
                }
                if nodes.is_empty() {
                    self.refs.remove(&o);
                }
            }
        }
    }

    fn clear(&mut self) {
        self.refs.clear();
        self.pods.clear();
    }

    /// Whether a pod on `node` refers to the object.
    pub fn related(&self, node: &str, kind: Kind, namespace: &str, name: &str) -> bool {
        self.refs
            .get(&(kind, namespace.to_string(), name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
    }
}

/// The pod itself and every object it names that its node must read, if it is bound.
fn edges_of(pod: &Pod) -> Option<Edges> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut objects = vec![(Kind::Pod, ns.clone(), name.clone())];
    let mut add = |kind: Kind, n: &str| {
        let key = (kind, ns.clone(), n.to_string());
        if !n.is_empty() && !objects.contains(&key) {
            objects.push(key);
        }
    };
    let sa = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    add(Kind::ServiceAccount, sa);
    for s in spec.image_pull_secrets.iter().flatten() {
        add(Kind::Secret, &s.name);
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            add(Kind::Secret, s.secret_name.as_deref().unwrap_or_default());
        }
        if let Some(c) = &v.config_map {
            add(Kind::ConfigMap, &c.name);
        }
        if let Some(c) = &v.persistent_volume_claim {
            add(Kind::PersistentVolumeClaim, &c.claim_name);
        }
        if v.ephemeral.is_some() {
            // A generic ephemeral volume's claim is named after the pod and the volume.
            add(Kind::PersistentVolumeClaim, &format!("{name}-{}", v.name));
        }
        if let Some(csi) = &v.csi {
            if let Some(s) = &csi.node_publish_secret_ref {
                add(Kind::Secret, &s.name);
            }
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &src.secret {
                add(Kind::Secret, &s.name);
            }
            if let Some(c) = &src.config_map {
                add(Kind::ConfigMap, &c.name);
            }
        }
    }
    let mut containers: Vec<(&[EnvVar], &[EnvFromSource])> =
        spec.containers.iter().map(env_of).collect();
    containers.extend(spec.init_containers.iter().flatten().map(env_of));
    for e in spec.ephemeral_containers.iter().flatten() {
        containers.push((
            e.env.as_deref().unwrap_or_default(),
            e.env_from.as_deref().unwrap_or_default(),
        ));
    }
    for (env, env_from) in containers {
        for e in env {
            let from = e.value_from.as_ref();
            if let Some(s) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                add(Kind::Secret, &s.name);
            }
            if let Some(c) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                add(Kind::ConfigMap, &c.name);
            }
        }
        for f in env_from {
            if let Some(s) = &f.secret_ref {
                add(Kind::Secret, &s.name);
            }
            if let Some(c) = &f.config_map_ref {
                add(Kind::ConfigMap, &c.name);
            }
        }
    }
    Some(Edges { node, objects })
}

fn env_of(c: &Container) -> (&[EnvVar], &[EnvFromSource]) {
    (
        c.env.as_deref().unwrap_or_default(),
        c.env_from.as_deref().unwrap_or_default(),
    )
}

/// Whether a pod spec names any Secret, ConfigMap or PersistentVolumeClaim (NodeRestriction
/// refuses mirror pods that do).
pub fn references(spec: &PodSpec) -> Vec<Kind> {
    let pod = Pod {
        spec: Some(PodSpec {
            node_name: Some("-".into()),
            service_account_name: Some("-".into()),
            ..spec.clone()
        }),
        ..Default::default()
    };
    let mut kinds: Vec<Kind> = edges_of(&pod)
        .map(|e| e.objects.into_iter().map(|(k, _, _)| k).collect())
        .unwrap_or_default();
    kinds.retain(|k| {
        matches!(
            k,
            Kind::Secret | Kind::ConfigMap | Kind::PersistentVolumeClaim
        )
    });
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The Node authorizer over the live pod cache.
pub struct NodeAuthorizer {
    pods: Mutex<Option<Follower>>,
    graph: RwLock<Graph>,
    /// What every node may do beyond the objects of its pods (the `system:node` role).
    rules: Vec<Rule>,
}

fn no_opinion(reason: impl Into<String>) -> Decision {
    Decision::NoOpinion(reason.into())
}

impl NodeAuthorizer {
    pub fn new(cache: &Cache, rules: Vec<Rule>) -> NodeAuthorizer {
        let pods = registry::find("", "v1", "pods").and_then(|r| Follower::new(cache, r));
        if pods.is_none() {
            tracing::error!("no pod cache: nodes may read none of their pods' objects");
        }
        let a = NodeAuthorizer {
            pods: Mutex::new(pods),
            graph: RwLock::new(Graph::default()),
            rules,
        };
        a.catch_up();
        a
    }

    /// Applies every pod change the cache has made since the last call.
    pub fn catch_up(&self) {
        let mut follower = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = follower.as_mut() else {
            return;
        };
        let updates = f.drain();
        if updates.is_empty() {
            return;
        }
        let mut graph = self.graph.write().unwrap_or_else(|p| p.into_inner());
        for u in updates {
            apply(&mut graph, u);
        }
    }

    fn related(&self, node: &str, kind: Kind, r: &ResourceAttributes) -> Decision {
        if r.name.is_empty() {
            return no_opinion("No Object name found");
        }
        self.catch_up();
        let graph = self.graph.read().unwrap_or_else(|p| p.into_inner());
        if graph.related(node, kind, &r.namespace, &r.name) {
            Decision::Allow
        } else {
            no_opinion(format!(
                "no relationship found between node '{node}' and this object"
            ))
        }
    }

    /// The decision for a request (NoOpinion for anyone who is not a node).
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        let Some(node) = node_identity(user) else {
            return no_opinion("");
        };
        if node.is_empty() {
            return no_opinion(format!("unknown node for user {:?}", user.name));
        }
        if let Target::Resource(r) = &a.target {
            let verb = a.verb.as_str();
            match (r.group.as_str(), r.resource.as_str()) {
                ("", "secrets") => return self.read_namespaced(node, Kind::Secret, verb, r),
                ("", "configmaps") => return self.read_namespaced(node, Kind::ConfigMap, verb, r),
                ("", "persistentvolumeclaims") => {
                    return if r.subresource == "status" {
                        match verb {
                            "update" | "patch" => {
                                self.related(node, Kind::PersistentVolumeClaim, r)
                            }
                            _ => no_opinion("can only get/update/patch this type"),
                        }
                    } else {
                        self.get(node, Kind::PersistentVolumeClaim, verb, r)
                    }
                }
                ("", "serviceaccounts") => {
                    if verb != "create" || r.name.is_empty() {
                        return no_opinion(
                            "can only create tokens for individual service accounts",
                        );
                    }
                    if r.subresource != "token" {
                        return no_opinion("can only create token subresource of serviceaccount");
                    }
                    return self.related(node, Kind::ServiceAccount, r);
                }
                ("coordination.k8s.io", "leases") => return lease(node, verb, r),
                ("", "pods") => return self.pod(node, verb, r),
                _ => {}
            }
        }
        if self.rules.iter().any(|rule| rule.allows(a)) {
            Decision::Allow
        } else {
            no_opinion("")
        }
    }

    fn get(&self, node: &str, kind: Kind, verb: &str, r: &ResourceAttributes) -> Decision {
        if verb != "get" {
            return no_opinion("can only get individual resources of this type");
        }
        if !r.subresource.is_empty() {
            return no_opinion("cannot get subresource");
        }
        self.related(node, kind, r)
    }

    fn read_namespaced(
        &self,
        node: &str,
        kind: Kind,
        verb: &str,
        r: &ResourceAttributes,
    ) -> Decision {
        if !matches!(verb, "get" | "list" | "watch") {
            return no_opinion("can only read resources of this type");
        }
        if !r.subresource.is_empty() {
            return no_opinion("cannot read subresource");
        }
        if r.namespace.is_empty() {
            return no_opinion("can only read namespaced object of this type");
        }
        self.related(node, kind, r)
    }

    fn pod(&self, node: &str, verb: &str, r: &ResourceAttributes) -> Decision {
        match (r.subresource.as_str(), verb) {
            ("", "get") => self.get(node, Kind::Pod, verb, r),
            ("", "list" | "watch") => {
                let scoped = r
                    .field_selector
                    .as_deref()
                    .and_then(|s| FieldSelector::parse(s).ok())
                    .is_some_and(|s| s.required_value("spec.nodeName") == Some(node));
                if scoped {
                    Decision::Allow
                } else if !r.name.is_empty() {
                    self.related(node, Kind::Pod, r)
                } else {
                    no_opinion("can only list/watch pods with spec.nodeName field selector")
                }
            }
            // Mirror pods and deleting its own pods; NodeRestriction checks which.
            ("", "create" | "delete") => Decision::Allow,
            ("status", "update" | "patch") | ("eviction", "create") => Decision::Allow,
            _ => no_opinion(""),
        }
    }
}

fn lease(node: &str, verb: &str, r: &ResourceAttributes) -> Decision {
    if !matches!(verb, "get" | "create" | "update" | "patch" | "delete") {
        return no_opinion("can only get, create, update, patch, or delete a node lease");
    }
    if r.namespace != NODE_LEASE_NAMESPACE {
        return no_opinion(format!(
            "can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"
        ));
    }
    // A create names no object; NodeRestriction checks the name in the body.
    if verb != "create" && r.name != node {
        return no_opinion("can only access node lease with the same name as the requesting node");
    }
    Decision::Allow
}

fn apply(graph: &mut Graph, u: Update) {
    match u {
        Update::Reset => graph.clear(),
        Update::Delete(o) => graph.remove_pod(&o.key),
        Update::Upsert(o) => match decode(&o) {
            Some(pod) => graph.set_pod(&o.key, &pod),
            None => graph.remove_pod(&o.key),
        },
    }
}

fn decode(o: &CachedObject) -> Option<Pod> {
    serde_json::from_slice(&o.json)
        .map_err(|e| tracing::warn!(key = %o.key, error = %e, "pod ignored by the node authorizer"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "bot",
                "imagePullSecrets": [{"name": "pull"}],
                "containers": [{"name": "c", "image": "i",
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
                    "envFrom": [{"configMapRef": {"name": "env-cm"}}]}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "vol-secret"}},
                    {"name": "p", "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}}]}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_node_is_related_to_what_its_pods_name() {
        let mut g = Graph::default();
        g.set_pod("/p/a", &pod("a", "n1"));
        g.set_pod("/p/b", &pod("b", "n2"));
        for (kind, name) in [
            (Kind::Secret, "pull"),
            (Kind::Secret, "env-secret"),
            (Kind::Secret, "vol-secret"),
            (Kind::ConfigMap, "env-cm"),
            (Kind::ConfigMap, "kube-root-ca.crt"),
            (Kind::PersistentVolumeClaim, "data"),
            (Kind::ServiceAccount, "bot"),
        ] {
            assert!(g.related("n1", kind, "default", name), "{kind:?} {name}");
            assert!(g.related("n2", kind, "default", name), "{kind:?} {name}");
            assert!(!g.related("n1", kind, "other", name));
        }
        assert!(g.related("n1", Kind::Pod, "default", "a"));
        assert!(!g.related("n1", Kind::Pod, "default", "b"));
        assert!(!g.related("n3", Kind::Secret, "default", "pull"));
        // Shared objects stay related while any pod on the node still names them.
        g.set_pod("/p/c", &pod("c", "n1"));
        g.remove_pod("/p/a");
        assert!(g.related("n1", Kind::Secret, "default", "pull"));
        g.remove_pod("/p/c");
        assert!(!g.related("n1", Kind::Secret, "default", "pull"));
        // A pod that moves (or was not bound) is counted on its current node only.
        let mut unbound = pod("b", "");
        unbound.spec.as_mut().unwrap().node_name = None;
        g.set_pod("/p/b", &unbound);
        assert!(g.refs.is_empty() && g.pods.is_empty());
    }

    #[test]
    fn a_node_may_write_the_status_of_its_pods_claims_only() {
        let mut graph = Graph::default();
        graph.set_pod("/p/a", &pod("a", "n1"));
        let authz = NodeAuthorizer {
            pods: Mutex::new(None),
            graph: RwLock::new(graph),
            rules: super::super::bootstrap::node_rules(),
        };
        let user = UserInfo::new("system:node:n1", &[NODES_GROUP]);
        let other = UserInfo::new("system:node:n2", &[NODES_GROUP]);
        let claim = |verb: &str, name: &str, sub: &str| Attributes {
            verb: verb.into(),
            target: Target::Resource(ResourceAttributes {
                namespace: "default".into(),
                resource: "persistentvolumeclaims".into(),
                subresource: sub.into(),
                name: name.into(),
                ..Default::default()
            }),
        };
        // The kubelet's half of volume expansion: capacity and conditions of its pods' claims.
        for verb in ["patch", "update"] {
            assert_eq!(
                authz.authorize(&user, &claim(verb, "data", "status")),
                Decision::Allow,
                "{verb}"
            );
            assert_ne!(
                authz.authorize(&user, &claim(verb, "other", "status")),
                Decision::Allow
            );
            assert_ne!(
                authz.authorize(&other, &claim(verb, "data", "status")),
                Decision::Allow
            );
            // The claim itself (its spec) is not the node's to change.
            assert_ne!(
                authz.authorize(&user, &claim(verb, "data", "")),
                Decision::Allow
            );
        }
        assert_eq!(
            authz.authorize(&user, &claim("get", "data", "")),
            Decision::Allow
        );
    }

    #[test]
    fn node_identity_needs_the_name_and_the_group() {
        assert_eq!(
            node_identity(&UserInfo::new("system:node:n1", &[NODES_GROUP])),
            Some("n1")
        );
        assert_eq!(node_identity(&UserInfo::new("system:node:n1", &[])), None);
        assert_eq!(node_identity(&UserInfo::new("n1", &[NODES_GROUP])), None);
    }

    #[test]
    fn leases_and_pods_follow_the_node_rules() {
        let r = |ns: &str, res: &str, sub: &str, name: &str, fs: Option<&str>| ResourceAttributes {
            namespace: ns.into(),
            resource: res.into(),
            subresource: sub.into(),
            name: name.into(),
            field_selector: fs.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(
            lease(
                "n1",
                "update",
                &r(NODE_LEASE_NAMESPACE, "leases", "", "n1", None)
            ),
            Decision::Allow
        );
        assert_ne!(
            lease(
                "n1",
                "update",
                &r(NODE_LEASE_NAMESPACE, "leases", "", "n2", None)
            ),
            Decision::Allow
        );
        assert_ne!(
            lease("n1", "get", &r("default", "leases", "", "n1", None)),
            Decision::Allow
        );
        assert_ne!(
            lease(
                "n1",
                "list",
                &r(NODE_LEASE_NAMESPACE, "leases", "", "", None)
            ),
            Decision::Allow
        );
        assert_eq!(
            references(pod("a", "n1").spec.as_ref().unwrap()),
            vec![Kind::Secret, Kind::ConfigMap, Kind::PersistentVolumeClaim]
        );
    }
}
