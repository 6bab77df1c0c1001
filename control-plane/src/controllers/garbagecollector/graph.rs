//! The owner graph of the garbage collector (Kubernetes' GraphBuilder), pure: a node per
//! object uid with its owner references and the uids of its dependents; owners referenced but
//! not (yet) observed are virtual nodes, checked against the API. Each change returns the work
//! it causes: a uid to attempt to delete (its owners may be gone, or it is waiting in a
//! foreground deletion) or an owner whose dependents must be orphaned.

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// Which object a node stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub api_version: String,
    pub kind: String,
    /// The object's namespace; for a virtual node, its dependent's (the owner is looked up
    /// there if its kind is namespaced).
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

/// An object as a watch reported it.
#[derive(Clone, Debug)]
pub struct Observed {
    pub identity: Identity,
    pub owners: Vec<OwnerReference>,
    pub being_deleted: bool,
    pub finalizers: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub identity: Identity,
    pub owners: Vec<OwnerReference>,
    pub dependents: HashSet<String>,
    /// False for a virtual node (only known as someone's owner).
    pub observed: bool,
    pub being_deleted: bool,
    /// In a foreground deletion: waits for its blocking dependents to go.
    pub deleting_dependents: bool,
}

/// Work the graph asks the collector to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Check whether this object (uid) should be deleted or its finalizer removed.
    Delete(String),
    /// Orphan this owner's dependents, then remove its `orphan` finalizer.
    Orphan(String),
}

#[derive(Default)]
pub struct Graph {
    nodes: HashMap<String, Node>,
}

impl Graph {
    pub fn get(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Dependents that hold `uid` with blockOwnerDeletion (a foreground deletion waits for
    /// them).
    pub fn blocking_dependents(&self, uid: &str) -> Vec<String> {
        let Some(n) = self.nodes.get(uid) else {
            return Vec::new();
        };
        n.dependents
            .iter()
            .filter(|d| {
                self.nodes.get(*d).is_some_and(|dep| {
                    dep.owners
                        .iter()
                        .any(|o| o.uid == uid && o.block_owner_deletion == Some(true))
                })
            })
            .cloned()
            .collect()
    }

    fn add_dependent(
        &mut self,
        dependent: &Identity,
        owner: &OwnerReference,
        work: &mut Vec<Work>,
    ) {
        match self.nodes.get_mut(&owner.uid) {
            Some(o) => {
                o.dependents.insert(dependent.uid.clone());
                if o.deleting_dependents {
                    work.push(Work::Delete(dependent.uid.clone()));
                }
            }
            None => {
                let virtual_node = Node {
                    identity: Identity {
                        api_version: owner.api_version.clone(),
                        kind: owner.kind.clone(),
                        namespace: dependent.namespace.clone(),
                        name: owner.name.clone(),
                        uid: owner.uid.clone(),
                    },
                    owners: Vec::new(),
                    dependents: [dependent.uid.clone()].into(),
                    observed: false,
                    being_deleted: false,
                    deleting_dependents: false,
                };
                self.nodes.insert(owner.uid.clone(), virtual_node);
                // Does the owner exist at all? The worker asks the API.
                work.push(Work::Delete(owner.uid.clone()));
            }
        }
    }

    fn remove_dependent(&mut self, dependent: &str, owner_uid: &str, work: &mut Vec<Work>) {
        if let Some(o) = self.nodes.get_mut(owner_uid) {
            o.dependents.remove(dependent);
            if o.deleting_dependents {
                work.push(Work::Delete(owner_uid.to_string()));
            }
            if !o.observed && o.dependents.is_empty() {
                self.nodes.remove(owner_uid);
            }
        }
    }

    /// An object was added or changed.
    pub fn upsert(&mut self, o: Observed) -> Vec<Work> {
        let mut work = Vec::new();
        let uid = o.identity.uid.clone();
        let foreground = o.being_deleted && o.finalizers.iter().any(|f| f == FOREGROUND);
        let orphan = o.being_deleted && o.finalizers.iter().any(|f| f == ORPHAN);
        let previous = self.nodes.get(&uid).cloned();
        let (old_owners, was_observed, was_deleting, was_foreground) = match &previous {
            Some(p) => (
                p.owners.clone(),
                p.observed,
                p.being_deleted,
                p.deleting_dependents,
            ),
            None => (Vec::new(), false, false, false),
        };
        if let Some(p) = &previous {
            if !p.observed && p.identity.kind != o.identity.kind {
                // A reference named the wrong kind for this uid: let its dependents recheck.
                work.extend(p.dependents.iter().map(|d| Work::Delete(d.clone())));
            }
        }
        let node = Node {
            identity: o.identity.clone(),
            owners: o.owners.clone(),
            dependents: previous.map(|p| p.dependents).unwrap_or_default(),
            observed: true,
            being_deleted: o.being_deleted,
            deleting_dependents: was_foreground || foreground,
        };
        self.nodes.insert(uid.clone(), node);

        // Owner references added, removed or with blockOwnerDeletion changed.
        let old: HashMap<&str, &OwnerReference> =
            old_owners.iter().map(|r| (r.uid.as_str(), r)).collect();
        let new: HashMap<&str, &OwnerReference> =
            o.owners.iter().map(|r| (r.uid.as_str(), r)).collect();
        for (u, r) in &new {
            match old.get(u) {
                None => self.add_dependent(&o.identity, r, &mut work),
                Some(prev) => {
                    let unblocked = prev.block_owner_deletion == Some(true)
                        && r.block_owner_deletion != Some(true);
                    if unblocked && self.nodes.get(*u).is_some_and(|n| n.deleting_dependents) {
                        work.push(Work::Delete(u.to_string()));
                    }
                }
            }
        }
        for u in old.keys().filter(|u| !new.contains_key(*u)) {
            self.remove_dependent(&uid, u, &mut work);
        }

        // Deletion transitions.
        let newly_deleting = !was_observed || !was_deleting;
        if orphan && newly_deleting {
            work.push(Work::Orphan(uid.clone()));
        } else if foreground && !was_foreground {
            if let Some(n) = self.nodes.get(&uid) {
                work.extend(n.dependents.iter().map(|d| Work::Delete(d.clone())));
            }
            work.push(Work::Delete(uid.clone()));
        }
        work
    }

    /// An object was deleted: its dependents may now be dangling, and owners waiting for it
    /// in a foreground deletion may finish.
    pub fn remove(&mut self, uid: &str) -> Vec<Work> {
        let mut work = Vec::new();
        let Some(n) = self.nodes.remove(uid) else {
            return work;
        };
        for o in &n.owners {
            self.remove_dependent(uid, &o.uid, &mut work);
        }
        work.extend(n.dependents.iter().map(|d| Work::Delete(d.clone())));
        if !n.dependents.is_empty() {
            // Keep a virtual node so dependents find their owner verified absent.
            let mut v = n.clone();
            v.observed = false;
            v.owners.clear();
            v.being_deleted = false;
            v.deleting_dependents = false;
            self.nodes.insert(uid.to_string(), v);
        }
        work
    }

    /// A virtual node's object does not exist: drop it and recheck its dependents.
    pub fn remove_virtual(&mut self, uid: &str) -> Vec<Work> {
        match self.nodes.get(uid) {
            Some(n) if !n.observed => {
                let n = self.nodes.remove(uid).expect("present");
                n.dependents.into_iter().map(Work::Delete).collect()
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: &str, name: &str, uid: &str) -> Identity {
        Identity {
            api_version: if kind == "Pod" {
                "v1".into()
            } else {
                "apps/v1".into()
            },
            kind: kind.into(),
            namespace: Some("default".into()),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn owner(kind: &str, name: &str, uid: &str, block: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(block),
        }
    }

    fn observed(identity: Identity, owners: Vec<OwnerReference>) -> Observed {
        Observed {
            identity,
            owners,
            being_deleted: false,
            finalizers: vec![],
        }
    }

    #[test]
    fn unseen_owners_become_virtual_nodes_to_verify() {
        let mut g = Graph::default();
        let w = g.upsert(observed(
            id("Pod", "p", "p1"),
            vec![owner("ReplicaSet", "rs", "rs1", true)],
        ));
        assert_eq!(w, vec![Work::Delete("rs1".into())]);
        assert!(!g.get("rs1").unwrap().observed);
        // The owner shows up: no more work, the node is real.
        let w = g.upsert(observed(id("ReplicaSet", "rs", "rs1"), vec![]));
        assert!(w.is_empty());
        assert!(g.get("rs1").unwrap().observed);
        assert!(g.get("rs1").unwrap().dependents.contains("p1"));
    }

    #[test]
    fn deleting_an_owner_rechecks_its_dependents() {
        let mut g = Graph::default();
        g.upsert(observed(id("ReplicaSet", "rs", "rs1"), vec![]));
        g.upsert(observed(
            id("Pod", "a", "p1"),
            vec![owner("ReplicaSet", "rs", "rs1", true)],
        ));
        g.upsert(observed(
            id("Pod", "b", "p2"),
            vec![owner("ReplicaSet", "rs", "rs1", true)],
        ));
        let mut w = g.remove("rs1");
        w.sort_by_key(|x| format!("{x:?}"));
        assert_eq!(
            w,
            vec![Work::Delete("p1".into()), Work::Delete("p2".into())]
        );
        // The pods go: the leftover virtual owner goes with them.
        g.remove("p1");
        g.remove("p2");
        assert!(g.is_empty());
    }

    #[test]
    fn foreground_deletion_waits_for_blocking_dependents() {
        let mut g = Graph::default();
        g.upsert(observed(id("ReplicaSet", "rs", "rs1"), vec![]));
        g.upsert(observed(
            id("Pod", "a", "p1"),
            vec![owner("ReplicaSet", "rs", "rs1", true)],
        ));
        g.upsert(observed(
            id("Pod", "b", "p2"),
            vec![owner("ReplicaSet", "rs", "rs1", false)],
        ));
        let mut deleting = observed(id("ReplicaSet", "rs", "rs1"), vec![]);
        deleting.being_deleted = true;
        deleting.finalizers = vec![FOREGROUND.into()];
        let w = g.upsert(deleting.clone());
        assert!(w.contains(&Work::Delete("p1".into())));
        assert!(w.contains(&Work::Delete("p2".into())));
        assert!(w.contains(&Work::Delete("rs1".into())));
        assert_eq!(g.blocking_dependents("rs1"), vec!["p1".to_string()]);
        // The same state again causes nothing new.
        assert!(g.upsert(deleting).is_empty());
        // The blocking pod goes: the owner is checked again.
        assert_eq!(g.remove("p1"), vec![Work::Delete("rs1".into())]);
        assert!(g.blocking_dependents("rs1").is_empty());
    }

    #[test]
    fn orphan_finalizer_asks_for_orphaning_once() {
        let mut g = Graph::default();
        g.upsert(observed(id("Deployment", "d", "d1"), vec![]));
        let mut deleting = observed(id("Deployment", "d", "d1"), vec![]);
        deleting.being_deleted = true;
        deleting.finalizers = vec![ORPHAN.into()];
        assert_eq!(g.upsert(deleting.clone()), vec![Work::Orphan("d1".into())]);
        assert!(g.upsert(deleting).is_empty());
    }

    #[test]
    fn released_dependents_leave_the_owner() {
        let mut g = Graph::default();
        g.upsert(observed(id("ReplicaSet", "rs", "rs1"), vec![]));
        g.upsert(observed(
            id("Pod", "a", "p1"),
            vec![owner("ReplicaSet", "rs", "rs1", true)],
        ));
        g.upsert(observed(id("Pod", "a", "p1"), vec![]));
        assert!(g.get("rs1").unwrap().dependents.is_empty());
    }
}
