//! The key every cache, queue and expectation is indexed by: an object's namespace and name,
//! printed `namespace/name` (or `name` for cluster-scoped objects) as client-go prints it.

use std::fmt;

use kube::{Resource, ResourceExt};

/// Identifies one object of a kind (the kind itself is implied by the cache or queue).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// The key of a namespaced object.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    /// The key of a cluster-scoped object.
    pub fn cluster(name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: None,
            name: name.into(),
        }
    }

    /// The key of an object (its metadata's namespace and name).
    pub fn of<K: Resource>(obj: &K) -> ObjectKey {
        ObjectKey {
            namespace: obj.namespace(),
            name: obj.name_any(),
        }
    }

    /// The namespace, or "" for cluster-scoped objects.
    pub fn namespace_or_empty(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_as_client_go_does() {
        assert_eq!(
            ObjectKey::namespaced("default", "web").to_string(),
            "default/web"
        );
        assert_eq!(ObjectKey::cluster("node-1").to_string(), "node-1");
    }
}
