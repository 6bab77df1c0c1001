//! Who is calling: authentication turns a request's credentials into a [`UserInfo`], the
//! identity that authorization, admission and the audit log see. Kubernetes' user.Info:
//! a name, a uid, groups and extra attributes.
//!
//! Rooms: `authenticator` (the union of authenticators a request passes), `token_file`
//! (`--token-auth-file`), `bootstrap` (bootstrap tokens), `serviceaccount` (bound service
//! account JWTs: issuing for TokenRequest, verifying).

pub mod authenticator;
pub mod bootstrap;
pub mod serviceaccount;
pub mod token_file;

pub use authenticator::{Authenticator, AuthnError, ClientCert};

use std::collections::BTreeMap;

/// An authenticated identity (Kubernetes' `user.Info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// `admin`, `system:node:<name>`, `system:serviceaccount:<ns>:<name>`, ...
    pub name: String,
    pub uid: String,
    /// Always includes `system:authenticated` for an authenticated user.
    pub groups: Vec<String>,
    /// Extra attributes (a service account token's pod name and uid, ...).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of cluster administrators (bypasses authorization, as in Kubernetes).
pub const MASTERS: &str = "system:masters";

impl UserInfo {
    /// A user with these groups (plus `system:authenticated`).
    pub fn new(name: impl Into<String>, groups: &[&str]) -> UserInfo {
        let mut g: Vec<String> = groups.iter().map(|s| s.to_string()).collect();
        if !g.iter().any(|x| x == AUTHENTICATED) {
            g.push(AUTHENTICATED.to_string());
        }
        UserInfo {
            name: name.into(),
            uid: String::new(),
            groups: g,
            extra: BTreeMap::new(),
        }
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}
