//! The RBAC authorizer: Roles, ClusterRoles and their bindings from the watch cache, indexed
//! so that a decision looks only at the bindings of the request's subjects (the user, each of
//! its groups, its service account) in the request's namespace and at cluster scope: O(rules
//! of the subject), whatever the number of bindings in the cluster. Roles are resolved at
//! decision time, so a changed role applies at once to every binding that names it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};

use super::attributes::Attributes;
use super::follow::{Follower, Update};
use super::rules::Rule;
use crate::apiserver::auth::UserInfo;
use crate::apiserver::registry;
use crate::store::cache::{Cache, CachedObject};

/// The user-name prefix of service accounts: `system:serviceaccount:<namespace>:<name>`.
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// A subject as bindings name it and users match it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SubjectKey {
    User(String),
    Group(String),
    ServiceAccount { namespace: String, name: String },
}

impl SubjectKey {
    /// The subjects a user is: its name, its groups and, for a service account's user name,
    /// that service account.
    pub fn of_user(user: &UserInfo) -> Vec<SubjectKey> {
        let mut out = Vec::with_capacity(user.groups.len() + 2);
        out.push(SubjectKey::User(user.name.clone()));
        out.extend(user.groups.iter().cloned().map(SubjectKey::Group));
        if let Some((namespace, name)) = service_account_of(&user.name) {
            out.push(SubjectKey::ServiceAccount {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        }
        out
    }

    /// A binding's subject; a service account without a namespace is in the binding's.
    fn of_subject(s: &Subject, binding_namespace: Option<&str>) -> Option<SubjectKey> {
        match s.kind.as_str() {
            "User" => Some(SubjectKey::User(s.name.clone())),
            "Group" => Some(SubjectKey::Group(s.name.clone())),
            "ServiceAccount" => {
                let namespace = s
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .or(binding_namespace)?;
                Some(SubjectKey::ServiceAccount {
                    namespace: namespace.to_string(),
                    name: s.name.clone(),
                })
            }
            _ => None,
        }
    }
}

/// `(namespace, name)` of a service account's user name.
pub fn service_account_of(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// What a binding refers to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RoleKey {
    Role { namespace: String, name: String },
    ClusterRole(String),
}

/// One binding as the index keeps it.
#[derive(Clone, Debug)]
struct Binding {
    /// None: a ClusterRoleBinding.
    namespace: Option<String>,
    role: RoleKey,
    subjects: Vec<SubjectKey>,
}

/// The bindings of one subject: cluster-wide, and per namespace.
#[derive(Default, Debug)]
struct SubjectBindings {
    cluster: HashMap<String, RoleKey>,
    namespaced: HashMap<String, HashMap<String, RoleKey>>,
}

impl SubjectBindings {
    fn is_empty(&self) -> bool {
        self.cluster.is_empty() && self.namespaced.is_empty()
    }
}

/// Which of the four RBAC resources an object comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Roles,
    ClusterRoles,
    RoleBindings,
    ClusterRoleBindings,
}

/// Roles and bindings, indexed by subject. Pure: the cache feeding is in [`Rbac`].
#[derive(Default, Debug)]
pub struct Policy {
    roles: HashMap<RoleKey, Arc<[Rule]>>,
    /// Store key of the role object -> its key here (for deletes and resets).
    role_keys: HashMap<String, RoleKey>,
    bindings: HashMap<String, Binding>,
    by_subject: HashMap<SubjectKey, SubjectBindings>,
}

impl Policy {
    pub fn set_role(&mut self, store_key: &str, key: RoleKey, rules: Vec<Rule>) {
        self.role_keys.insert(store_key.to_string(), key.clone());
        self.roles.insert(key, rules.into());
    }

    fn remove_role(&mut self, store_key: &str) {
        if let Some(k) = self.role_keys.remove(store_key) {
            self.roles.remove(&k);
        }
    }

    fn set_binding(&mut self, store_key: &str, b: Binding) {
        self.remove_binding(store_key);
        for s in &b.subjects {
            let entry = self.by_subject.entry(s.clone()).or_default();
            match &b.namespace {
                None => {
                    entry.cluster.insert(store_key.to_string(), b.role.clone());
                }
                Some(ns) => {
                    entry
                        .namespaced
                        .entry(ns.clone())
                        .or_default()
                        .insert(store_key.to_string(), b.role.clone());
                }
            }
        }
        self.bindings.insert(store_key.to_string(), b);
    }

    fn remove_binding(&mut self, store_key: &str) {
        let Some(old) = self.bindings.remove(store_key) else {
            return;
        };
        for s in &old.subjects {
            let Some(entry) = self.by_subject.get_mut(s) else {
                continue;
            };
            match &old.namespace {
                None => {
                    entry.cluster.remove(store_key);
                }
                Some(ns) => {
                    if let Some(m) = entry.namespaced.get_mut(ns) {
                        m.remove(store_key);
                        if m.is_empty() {
                            entry.namespaced.remove(ns);
                        }
                    }
                }
            }
            if entry.is_empty() {
                self.by_subject.remove(s);
            }
        }
    }

    /// A ClusterRoleBinding (namespace None) or RoleBinding.
    pub fn bind(
        &mut self,
        store_key: &str,
        namespace: Option<&str>,
        role: RoleKey,
        subjects: &[Subject],
    ) {
        let subjects = subjects
            .iter()
            .filter_map(|s| SubjectKey::of_subject(s, namespace))
            .collect();
        self.set_binding(
            store_key,
            Binding {
                namespace: namespace.map(str::to_string),
                role,
                subjects,
            },
        );
    }

    fn reset(&mut self, source: Source) {
        match source {
            Source::Roles | Source::ClusterRoles => {
                let cluster = source == Source::ClusterRoles;
                let gone: Vec<String> = self
                    .role_keys
                    .iter()
                    .filter(|(_, k)| matches!(k, RoleKey::ClusterRole(_)) == cluster)
                    .map(|(s, _)| s.clone())
                    .collect();
                for s in gone {
                    self.remove_role(&s);
                }
            }
            Source::RoleBindings | Source::ClusterRoleBindings => {
                let cluster = source == Source::ClusterRoleBindings;
                let gone: Vec<String> = self
                    .bindings
                    .iter()
                    .filter(|(_, b)| b.namespace.is_none() == cluster)
                    .map(|(s, _)| s.clone())
                    .collect();
                for s in gone {
                    self.remove_binding(&s);
                }
            }
        }
    }

    fn apply(&mut self, source: Source, update: Update) {
        match update {
            Update::Reset => self.reset(source),
            Update::Delete(o) => match source {
                Source::Roles | Source::ClusterRoles => self.remove_role(&o.key),
                Source::RoleBindings | Source::ClusterRoleBindings => self.remove_binding(&o.key),
            },
            Update::Upsert(o) => {
                if let Err(e) = self.upsert(source, &o) {
                    // Stored objects passed validation; one that does not decode grants nothing.
                    tracing::warn!(key = %o.key, error = %e, "RBAC object ignored");
                    self.apply(source, Update::Delete(o));
                }
            }
        }
    }

    fn upsert(&mut self, source: Source, o: &CachedObject) -> Result<(), serde_json::Error> {
        let ns = o.namespace.clone().unwrap_or_default();
        match source {
            Source::Roles => {
                let r: Role = serde_json::from_slice(&o.json)?;
                let rules = r.rules.iter().flatten().map(Rule::from).collect();
                self.set_role(
                    &o.key,
                    RoleKey::Role {
                        namespace: ns,
                        name: o.name.clone(),
                    },
                    rules,
                );
            }
            Source::ClusterRoles => {
                let r: ClusterRole = serde_json::from_slice(&o.json)?;
                let rules = r.rules.iter().flatten().map(Rule::from).collect();
                self.set_role(&o.key, RoleKey::ClusterRole(o.name.clone()), rules);
            }
            Source::RoleBindings => {
                let b: RoleBinding = serde_json::from_slice(&o.json)?;
                let role = match b.role_ref.kind.as_str() {
                    "Role" => RoleKey::Role {
                        namespace: ns.clone(),
                        name: b.role_ref.name,
                    },
                    _ => RoleKey::ClusterRole(b.role_ref.name),
                };
                self.bind(
                    &o.key,
                    Some(&ns),
                    role,
                    b.subjects.as_deref().unwrap_or_default(),
                );
            }
            Source::ClusterRoleBindings => {
                let b: ClusterRoleBinding = serde_json::from_slice(&o.json)?;
                let role = RoleKey::ClusterRole(b.role_ref.name);
                self.bind(
                    &o.key,
                    None,
                    role,
                    b.subjects.as_deref().unwrap_or_default(),
                );
            }
        }
        Ok(())
    }

    /// The rules of a role, if it exists.
    pub fn role(&self, key: &RoleKey) -> Option<Arc<[Rule]>> {
        self.roles.get(key).cloned()
    }

    /// Calls `visit` with the rules of every role bound to `user` at cluster scope and in
    /// `namespace` (when not empty), until it returns true; returns whether it did.
    fn any_rule(
        &self,
        user: &UserInfo,
        namespace: &str,
        mut visit: impl FnMut(&Rule) -> bool,
    ) -> bool {
        for subject in SubjectKey::of_user(user) {
            let Some(b) = self.by_subject.get(&subject) else {
                continue;
            };
            let namespaced = (!namespace.is_empty())
                .then(|| b.namespaced.get(namespace))
                .flatten();
            for role in b
                .cluster
                .values()
                .chain(namespaced.into_iter().flat_map(|m| m.values()))
            {
                if let Some(rules) = self.roles.get(role) {
                    if rules.iter().any(&mut visit) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Whether any rule bound to the user allows the request (a RoleBinding applies only to
    /// requests in its namespace).
    pub fn allows(&self, user: &UserInfo, a: &Attributes) -> bool {
        self.any_rule(user, a.namespace(), |r| r.allows(a))
    }

    /// Every rule bound to the user at cluster scope and in `namespace` (SelfSubjectRulesReview
    /// and escalation checks).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        let mut out = vec![];
        self.any_rule(user, namespace, |r| {
            out.push(r.clone());
            false
        });
        out
    }

    /// The number of bindings indexed (for metrics and tests).
    pub fn bindings(&self) -> usize {
        self.bindings.len()
    }
}

/// The RBAC authorizer over the live cache.
pub struct Rbac {
    feeds: Mutex<Vec<(Source, Follower)>>,
    policy: RwLock<Policy>,
}

impl Rbac {
    /// Follows the four RBAC resources in `cache`.
    pub fn new(cache: &Cache) -> Rbac {
        let mut feeds = vec![];
        for (source, plural) in [
            (Source::Roles, "roles"),
            (Source::ClusterRoles, "clusterroles"),
            (Source::RoleBindings, "rolebindings"),
            (Source::ClusterRoleBindings, "clusterrolebindings"),
        ] {
            match registry::find(super::RBAC_GROUP, "v1", plural)
                .and_then(|r| Follower::new(cache, r))
            {
                Some(f) => feeds.push((source, f)),
                None => tracing::error!(
                    plural,
                    "no watch cache for an RBAC resource: RBAC grants nothing from it"
                ),
            }
        }
        let rbac = Rbac {
            feeds: Mutex::new(feeds),
            policy: RwLock::new(Policy::default()),
        };
        rbac.catch_up();
        rbac
    }

    /// Applies every change the cache has made since the last call.
    pub fn catch_up(&self) {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        let updates: Vec<(Source, Vec<Update>)> = feeds
            .iter_mut()
            .map(|(s, f)| (*s, f.drain()))
            .filter(|(_, u)| !u.is_empty())
            .collect();
        if updates.is_empty() {
            return;
        }
        let mut policy = self.policy.write().unwrap_or_else(|p| p.into_inner());
        for (source, list) in updates {
            for u in list {
                policy.apply(source, u);
            }
        }
    }

    /// Runs `f` on the policy as of the cache's latest change.
    pub fn read<T>(&self, f: impl FnOnce(&Policy) -> T) -> T {
        self.catch_up();
        let policy = self.policy.read().unwrap_or_else(|p| p.into_inner());
        f(&policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::authz::attributes::ResourceAttributes;

    fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
        Subject {
            kind: kind.into(),
            name: name.into(),
            namespace: namespace.map(str::to_string),
            api_group: None,
        }
    }

    fn list(resource: &str, namespace: &str) -> Attributes {
        Attributes::resource(
            "list",
            ResourceAttributes {
                resource: resource.into(),
                namespace: namespace.into(),
                version: "v1".into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn bindings_apply_to_their_subjects_and_namespace() {
        let mut p = Policy::default();
        p.set_role(
            "/cr/view",
            RoleKey::ClusterRole("view".into()),
            vec![Rule::resource(&["get", "list", "watch"], &[""], &["pods"])],
        );
        p.set_role(
            "/r/a/secrets",
            RoleKey::Role {
                namespace: "a".into(),
                name: "secrets".into(),
            },
            vec![Rule::resource(&["list"], &[""], &["secrets"])],
        );
        p.bind(
            "/rb/a/1",
            Some("a"),
            RoleKey::ClusterRole("view".into()),
            &[
                subject("User", "jane", None),
                subject("ServiceAccount", "bot", None),
            ],
        );
        p.bind(
            "/rb/a/2",
            Some("a"),
            RoleKey::Role {
                namespace: "a".into(),
                name: "secrets".into(),
            },
            &[subject("Group", "devs", None)],
        );
        let jane = UserInfo::new("jane", &[]);
        assert!(p.allows(&jane, &list("pods", "a")));
        assert!(
            !p.allows(&jane, &list("pods", "b")),
            "only in the binding's namespace"
        );
        assert!(!p.allows(&jane, &list("pods", "")), "not cluster-wide");
        assert!(!p.allows(&jane, &list("secrets", "a")));
        let bot = UserInfo::new("system:serviceaccount:a:bot", &["system:serviceaccounts"]);
        assert!(p.allows(&bot, &list("pods", "a")));
        let other_bot = UserInfo::new("system:serviceaccount:b:bot", &[]);
        assert!(!p.allows(&other_bot, &list("pods", "a")));
        let dev = UserInfo::new("joe", &["devs"]);
        assert!(p.allows(&dev, &list("secrets", "a")));
        assert_eq!(p.rules_for(&dev, "a").len(), 1);
        // A cluster binding applies everywhere; removing it revokes at once.
        p.bind(
            "/crb/1",
            None,
            RoleKey::ClusterRole("view".into()),
            &[subject("User", "joe", None)],
        );
        assert!(p.allows(&dev, &list("pods", "")));
        assert!(p.allows(&dev, &list("pods", "zzz")));
        p.remove_binding("/crb/1");
        assert!(!p.allows(&dev, &list("pods", "zzz")));
        assert!(!p.by_subject.contains_key(&SubjectKey::User("joe".into())));
        // Changing the role changes what its bindings grant.
        p.set_role("/cr/view", RoleKey::ClusterRole("view".into()), vec![]);
        assert!(!p.allows(&jane, &list("pods", "a")));
        // Re-binding under the same key replaces the old subjects.
        p.bind("/rb/a/2", Some("a"), RoleKey::ClusterRole("x".into()), &[]);
        assert!(!p.by_subject.contains_key(&SubjectKey::Group("devs".into())));
        p.reset(Source::RoleBindings);
        assert_eq!(p.bindings(), 0);
        p.reset(Source::ClusterRoles);
        assert!(p.role(&RoleKey::ClusterRole("view".into())).is_none());
        assert!(p
            .role(&RoleKey::Role {
                namespace: "a".into(),
                name: "secrets".into()
            })
            .is_some());
    }

    #[test]
    fn service_account_names_parse() {
        assert_eq!(
            service_account_of("system:serviceaccount:ns:sa"),
            Some(("ns", "sa"))
        );
        assert_eq!(service_account_of("system:serviceaccount:ns"), None);
        assert_eq!(service_account_of("system:serviceaccount::sa"), None);
        assert_eq!(service_account_of("jane"), None);
    }
}
