//! The key every cache, queue and expectation is indexed by: an object's namespace and name,
//! printed `namespace/name` (or `name` for cluster-scoped objects) as client-go prints it.

use std::fmt;
use std::hash::{Hash, Hasher};

use kube::{Resource, ResourceExt};

/// Identifies one object of a kind (the kind itself is implied by the cache or queue).
/// Hashed as its borrowed form [`KeyRef`], so hashbrown maps keyed by it are searched
/// without building a key (two allocations per lookup).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
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

/// An [`ObjectKey`] borrowed from strings at hand: looks up a hashbrown map keyed by
/// `ObjectKey` (std's `Borrow` cannot express a borrowed pair; hashbrown's `Equivalent` can).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRef<'a> {
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.namespace.hash(state);
        self.name.hash(state);
    }
}

impl Hash for ObjectKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        KeyRef {
            namespace: self.namespace.as_deref(),
            name: &self.name,
        }
        .hash(state)
    }
}

impl hashbrown::Equivalent<ObjectKey> for KeyRef<'_> {
    fn equivalent(&self, key: &ObjectKey) -> bool {
        self.namespace == key.namespace.as_deref() && self.name == key.name
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
    fn a_borrowed_key_finds_what_an_owned_key_stored() {
        let mut m = hashbrown::HashMap::new();
        m.insert(ObjectKey::namespaced("default", "web"), 1);
        m.insert(ObjectKey::cluster("web"), 2);
        m.insert(ObjectKey::namespaced("", "web"), 3);
        let get = |namespace, name| m.get(&KeyRef { namespace, name }).copied();
        assert_eq!(get(Some("default"), "web"), Some(1));
        assert_eq!(get(None, "web"), Some(2));
        assert_eq!(get(Some(""), "web"), Some(3));
        assert_eq!(get(Some("other"), "web"), None);
        assert_eq!(get(Some("default"), "we"), None);
        // A split that concatenates the same never matches ("de"/"faultweb").
        assert_eq!(get(Some("de"), "faultweb"), None);
    }

    #[test]
    fn prints_as_client_go_does() {
        assert_eq!(
            ObjectKey::namespaced("default", "web").to_string(),
            "default/web"
        );
        assert_eq!(ObjectKey::cluster("node-1").to_string(), "node-1");
    }
}
