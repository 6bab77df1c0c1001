//! The store's word on who holds a service address or a node port, so that several API
//! servers on one store never hand out the same one. One key per address, a
//! networking.k8s.io/v1 IPAddress at `/registry/ipaddresses/<ip>` as Kubernetes 1.33's
//! allocator writes it (its parentRef the Service), and one key per node port at
//! `/registry/nodeportclaims/<port>` in the same shape. A claim is created with a
//! must-not-exist precondition before the Service is written: the create that fails with
//! AlreadyExists lost the race. A claim is removed only with its own revision as the
//! precondition, and only by the Service that holds it, so nobody frees a newer claim.

use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::store::{Precondition, Revision, Store, StoreError, WriteOp};

/// Where IPAddress objects are kept (Kubernetes' key for them).
pub const IP_PREFIX: &str = "/registry/ipaddresses/";
/// Where node port claims are kept.
pub const PORT_PREFIX: &str = "/registry/nodeportclaims/";

/// A service address or a node port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Claimed {
    Ip(Ipv4Addr),
    Port(u16),
}

impl Claimed {
    pub fn key(&self) -> String {
        match self {
            Claimed::Ip(ip) => format!("{IP_PREFIX}{ip}"),
            Claimed::Port(p) => format!("{PORT_PREFIX}{p}"),
        }
    }

    fn from_key(key: &str) -> Option<Claimed> {
        if let Some(ip) = key.strip_prefix(IP_PREFIX) {
            return ip.parse().ok().map(Claimed::Ip);
        }
        key.strip_prefix(PORT_PREFIX)?
            .parse()
            .ok()
            .map(Claimed::Port)
    }
}

impl fmt::Display for Claimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claimed::Ip(ip) => write!(f, "service IP {ip}"),
            Claimed::Port(p) => write!(f, "node port {p}"),
        }
    }
}

/// The Service a claim belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Parent {
    pub namespace: String,
    pub name: String,
}

impl Parent {
    pub fn of(svc: &Value) -> Parent {
        let s = |p: &str| {
            svc.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Parent {
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name"),
        }
    }
}

impl fmt::Display for Parent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A claim as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub what: Claimed,
    /// None when the stored value does not name one (never written so by skiff).
    pub parent: Option<Parent>,
    pub revision: Revision,
}

/// Why a claim could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("already claimed")]
    Taken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn value(what: Claimed, parent: &Parent) -> Bytes {
    let (api_version, kind, name) = match what {
        Claimed::Ip(ip) => ("networking.k8s.io/v1", "IPAddress", ip.to_string()),
        Claimed::Port(p) => ("skiff.dev/v1", "NodePortClaim", p.to_string()),
    };
    let v = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "uid": meta::new_uid(),
            "creationTimestamp": meta::now(),
            "labels": {"ipaddress.kubernetes.io/managed-by": "skiff-apiserver"},
        },
        "spec": {"parentRef": {
            "group": "",
            "resource": "services",
            "namespace": parent.namespace,
            "name": parent.name,
        }},
    });
    Bytes::from(v.to_string())
}

fn parent_of(value: &[u8]) -> Option<Parent> {
    let v: Value = serde_json::from_slice(value).ok()?;
    let r = v.pointer("/spec/parentRef")?;
    let s = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_string);
    Some(Parent {
        namespace: s("namespace")?,
        name: s("name")?,
    })
}

/// Claims in one store.
pub struct Claims {
    store: Arc<dyn Store>,
}

impl Claims {
    pub fn new(store: Arc<dyn Store>) -> Claims {
        Claims { store }
    }

    /// Claims `what` for `parent`; returns the claim's revision (the precondition to free it).
    pub async fn take(&self, what: Claimed, parent: &Parent) -> Result<Revision, ClaimError> {
        let written = self
            .store
            .write(WriteOp::Put {
                key: what.key(),
                value: value(what, parent),
                precondition: Precondition::MustNotExist,
            })
            .await;
        match written {
            Ok(w) => Ok(w.revision),
            Err(StoreError::AlreadyExists(_)) => Err(ClaimError::Taken),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether nobody holds `what` now (what a dry run checks).
    pub async fn is_free(&self, what: Claimed) -> Result<bool, StoreError> {
        Ok(self.store.get(&what.key()).await?.is_none())
    }

    /// Removes the claim made at `revision` (a write that took it failed). A newer claim
    /// is left alone.
    pub async fn remove_at(&self, what: Claimed, revision: Revision) -> Result<(), StoreError> {
        let r = self
            .store
            .write(WriteOp::Delete {
                key: what.key(),
                precondition: Precondition::ModRevision(revision),
            })
            .await;
        match r {
            Ok(_) | Err(StoreError::NotFound(_)) | Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes `parent`'s claim on `what` (the Service gave it up); another's is left alone.
    pub async fn release(&self, what: Claimed, parent: &Parent) -> Result<(), StoreError> {
        let Some(kv) = self.store.get(&what.key()).await? else {
            return Ok(());
        };
        if parent_of(&kv.value).as_ref() != Some(parent) {
            return Ok(());
        }
        self.remove_at(what, kv.mod_revision).await
    }

    /// Every claim in the store.
    pub async fn list(&self) -> Result<Vec<Claim>, StoreError> {
        let mut out = Vec::new();
        for prefix in [IP_PREFIX, PORT_PREFIX] {
            for kv in self.store.range(prefix).await?.kvs {
                let Some(what) = Claimed::from_key(&kv.key) else {
                    tracing::warn!(key = %kv.key, "a claim key that names no address or port");
                    continue;
                };
                out.push(Claim {
                    what,
                    parent: parent_of(&kv.value),
                    revision: kv.mod_revision,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip() {
        for c in [
            Claimed::Ip("10.96.3.4".parse().unwrap()),
            Claimed::Port(30007),
        ] {
            assert_eq!(Claimed::from_key(&c.key()), Some(c));
        }
        assert_eq!(Claimed::from_key("/registry/ipaddresses/x"), None);
        let p = Parent {
            namespace: "ns".into(),
            name: "web".into(),
        };
        let v = value(Claimed::Ip("10.96.3.4".parse().unwrap()), &p);
        assert_eq!(parent_of(&v), Some(p));
        let v: Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(v["kind"], "IPAddress");
        assert_eq!(v["metadata"]["name"], "10.96.3.4");
        assert_eq!(v["spec"]["parentRef"]["resource"], "services");
    }
}
