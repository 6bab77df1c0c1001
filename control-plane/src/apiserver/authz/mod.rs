//! Authorization: may this user do what the request asks? Every request is authorized after
//! authentication (resource and non-resource paths alike) by a chain of authorizers, each
//! answering Allow or NoOpinion as in Kubernetes: members of `system:masters`, then the Node
//! authorizer, then RBAC. Nothing allowing it is a 403 with Kubernetes' message (`secrets is
//! forbidden: User "x" cannot list resource "secrets" in API group "" in the namespace
//! "default"`).
//!
//! Rooms: `attributes` (what a request asks, as Kubernetes derives it), `rules` (the rule
//! matcher, coverage and escalation text), `rbac` (roles and bindings indexed by subject),
//! `node` (the Node authorizer's graph), `follow` (how the indexes keep up with the watch
//! cache), `bootstrap` (the default policy), `impersonation`, `escalation`, `review` (the
//! access review APIs).

pub mod attributes;
pub mod bootstrap;
pub mod escalation;
mod follow;
pub mod impersonation;
pub mod node;
pub mod rbac;
pub mod review;
pub mod rules;

use self::attributes::{Attributes, Target};
use self::node::NodeAuthorizer;
use self::rbac::Rbac;
use self::rules::Rule;
use super::auth::{UserInfo, MASTERS};
use super::handlers::Ctx;
use crate::machinery::ApiError;
use crate::store::cache::Cache;

/// The API group of RBAC.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// One authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Not allowed by this authorizer (the next one may); the reason, if any, is shown in
    /// the 403 when no authorizer allows.
    NoOpinion(String),
}

/// Which authorizers decide (`--authorization-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// `system:masters`, the Node authorizer, then RBAC (`Node,RBAC`, the default).
    #[default]
    NodeRbac,
    /// Every authenticated request allowed (`AlwaysAllow`): a baseline for benchmarks and
    /// for debugging, accepted only on a loopback address.
    AlwaysAllow,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        let mut modes: Vec<&str> = s.split(',').map(str::trim).collect();
        modes.sort_unstable();
        match modes.as_slice() {
            ["Node", "RBAC"] => Ok(Mode::NodeRbac),
            ["AlwaysAllow"] => Ok(Mode::AlwaysAllow),
            _ => Err(format!(
                "unsupported authorization mode {s:?} (Node,RBAC or AlwaysAllow)"
            )),
        }
    }
}

/// The authorizer chain.
pub struct Authorizer {
    node: NodeAuthorizer,
    rbac: Rbac,
    mode: Mode,
}

impl Authorizer {
    /// The chain over the live watch cache.
    pub fn new(cache: &Cache, mode: Mode) -> Authorizer {
        Authorizer {
            node: NodeAuthorizer::new(cache, bootstrap::node_rules()),
            rbac: Rbac::new(cache),
            mode,
        }
    }

    /// `system:masters`, then the Node authorizer, then RBAC (everything with AlwaysAllow).
    pub fn decide(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.in_group(MASTERS) || self.mode == Mode::AlwaysAllow {
            return Decision::Allow;
        }
        let mut reasons = vec![];
        match self.node.authorize(user, a) {
            Decision::Allow => return Decision::Allow,
            Decision::NoOpinion(r) if !r.is_empty() => reasons.push(r),
            Decision::NoOpinion(_) => {}
        }
        if self.rbac.read(|p| p.allows(user, a)) {
            return Decision::Allow;
        }
        Decision::NoOpinion(reasons.join("\n"))
    }

    /// The rules the user holds at cluster scope and in `namespace`, and whether the list is
    /// incomplete (a node's access is not a list of rules) with why.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<Rule>, Option<String>) {
        if user.in_group(MASTERS) || self.mode == Mode::AlwaysAllow {
            return (
                vec![
                    Rule::resource(&["*"], &["*"], &["*"]),
                    Rule::urls(&["*"], &["*"]),
                ],
                None,
            );
        }
        let incomplete = node::node_identity(user)
            .map(|_| "node authorizer does not support user rule resolution".to_string());
        (self.rbac.read(|p| p.rules_for(user, namespace)), incomplete)
    }

    /// The rules of the role a binding refers to (None: no such role).
    pub fn role_rules(&self, key: &rbac::RoleKey) -> Option<Vec<Rule>> {
        self.rbac.read(|p| p.role(key)).map(|r| r.to_vec())
    }
}

/// Whether `user` may do `a`, as an error to return when not. A refusal is confirmed once the
/// cache holds every write acknowledged so far, so a role or binding just written applies to
/// the very next request.
pub async fn check(ctx: &Ctx, user: &UserInfo, a: &Attributes) -> Result<(), ApiError> {
    allowed(ctx, user, a)
        .await?
        .map_or(Ok(()), |reason| Err(forbidden(user, a, &reason)))
}

/// None when allowed, else the reasons the chain gave (possibly empty).
pub async fn allowed(
    ctx: &Ctx,
    user: &UserInfo,
    a: &Attributes,
) -> Result<Option<String>, ApiError> {
    if ctx.authz.decide(user, a) == Decision::Allow {
        return Ok(None);
    }
    ctx.fresh().await?;
    Ok(match ctx.authz.decide(user, a) {
        Decision::Allow => None,
        Decision::NoOpinion(reason) => Some(reason),
    })
}

/// `<resource>[.<group>] ["<name>"] is forbidden: User "<user>" cannot <what>[: <reason>]`, as
/// Kubernetes words a refusal.
pub fn forbidden(user: &UserInfo, a: &Attributes, reason: &str) -> ApiError {
    let mut why = format!("User {:?} cannot {}", user.name, a.describe());
    if !reason.is_empty() {
        why = format!("{why}: {reason}");
    }
    match &a.target {
        Target::NonResource { .. } => ApiError::forbidden(format!("forbidden: {why}")),
        Target::Resource(r) => forbidden_resource(&r.group, &r.resource, &r.name, &why),
    }
}

/// Kubernetes' `NewForbidden` for a resource: `pods "web" is forbidden: <why>`.
pub fn forbidden_resource(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let message = if name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} {name:?} is forbidden: {why}")
    };
    ApiError::forbidden(message).with_details(group, resource, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn authorization_modes_parse_as_kube_apiserver_spells_them() {
        assert_eq!("Node,RBAC".parse(), Ok(Mode::NodeRbac));
        assert_eq!("RBAC,Node".parse(), Ok(Mode::NodeRbac));
        assert_eq!("AlwaysAllow".parse(), Ok(Mode::AlwaysAllow));
        assert!("RBAC".parse::<Mode>().is_err());
        assert!("AlwaysAllow,RBAC".parse::<Mode>().is_err());
    }

    #[test]
    fn refusals_read_as_kubernetes_writes_them() {
        let user = UserInfo::new("system:serviceaccount:default:x", &[]);
        let q = Default::default();
        let a = Attributes::of_request(&Method::GET, "/api/v1/namespaces/default/secrets", &q);
        let e = forbidden(&user, &a, "");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"secrets is forbidden: User "system:serviceaccount:default:x" cannot list resource "secrets" in API group "" in the namespace "default""#
        );
        let a = Attributes::of_request(
            &Method::GET,
            "/apis/apps/v1/namespaces/a/deployments/web",
            &q,
        );
        let e = forbidden(&user, &a, "because");
        assert_eq!(
            e.message,
            r#"deployments.apps "web" is forbidden: User "system:serviceaccount:default:x" cannot get resource "deployments" in API group "apps" in the namespace "a": because"#
        );
        let d = e.details.unwrap();
        assert_eq!(
            (d.group.as_str(), d.kind.as_str(), d.name.as_str()),
            ("apps", "deployments", "web")
        );
        let a = Attributes::of_request(&Method::GET, "/metrics", &q);
        assert_eq!(
            forbidden(&user, &a, "").message,
            r#"forbidden: User "system:serviceaccount:default:x" cannot get path "/metrics""#
        );
    }
}
