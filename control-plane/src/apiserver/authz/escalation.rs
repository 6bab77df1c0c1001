//! Escalation prevention, as Kubernetes' RBAC storage does it: nobody writes a Role or
//! ClusterRole granting what they do not hold unless they may `escalate` roles, nobody binds a
//! role whose rules they do not hold unless they may `bind` it, and only holders of everything
//! (`*` on `*`) set an aggregation rule. Members of `system:masters` may do all of it.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef};
use serde_json::Value;

use super::attributes::{Attributes, ResourceAttributes};
use super::rbac::RoleKey;
use super::rules::{compact, covers, Rule};
use super::{allowed, forbidden_resource, RBAC_GROUP};
use crate::apiserver::auth::{UserInfo, MASTERS};
use crate::apiserver::handlers::Ctx;
use crate::apiserver::registry::Resource;
use crate::machinery::ApiError;

/// Whether `r` is one of the four RBAC resources (the only ones checked here).
pub fn applies_to(r: &Resource) -> bool {
    r.group == RBAC_GROUP
}

/// Refuses a create (`old` None) or update of an RBAC object in `namespace` (the request's)
/// that would grant `user` more than it holds. Writes that change only what the garbage
/// collector changes (owner references, finalizers) are never refused here.
pub async fn check(
    ctx: &Ctx,
    user: &UserInfo,
    r: &Resource,
    namespace: Option<&str>,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if !applies_to(r) || user.in_group(MASTERS) {
        return Ok(());
    }
    if let Some(old) = old {
        if only_gc_fields_changed(new, old) {
            return Ok(());
        }
    }
    let name = new
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let namespace = namespace.unwrap_or("");
    let decode = |e: serde_json::Error| ApiError::bad_request(format!("decoding {}: {e}", r.kind));
    match r.kind {
        "Role" | "ClusterRole" => {
            let (rules, aggregated): (Vec<Rule>, bool) = if r.kind == "Role" {
                let role: Role = serde_json::from_value(new.clone()).map_err(decode)?;
                (role.rules.iter().flatten().map(Rule::from).collect(), false)
            } else {
                let role: ClusterRole = serde_json::from_value(new.clone()).map_err(decode)?;
                let was = old
                    .and_then(|o| serde_json::from_value::<ClusterRole>(o.clone()).ok())
                    .is_some_and(|o| o.aggregation_rule.is_some());
                (
                    role.rules.iter().flatten().map(Rule::from).collect(),
                    role.aggregation_rule.is_some() || was,
                )
            };
            // `escalate` on the role lets its holder write any rules (only an update names it).
            let escalate = verb_on(
                "escalate",
                r.plural,
                namespace,
                if old.is_some() { name } else { "" },
            );
            if allowed(ctx, user, &escalate).await?.is_none() {
                return Ok(());
            }
            confirm_no_escalation(ctx, r, name, user, namespace, &rules)?;
            if aggregated {
                let all = [
                    Rule::resource(&["*"], &["*"], &["*"]),
                    Rule::urls(&["*"], &["*"]),
                ];
                let (held, _) = ctx.authz.rules_for(user, namespace);
                if covers(&held, &all).is_err() {
                    return Err(forbidden_resource(
                        RBAC_GROUP,
                        r.plural,
                        name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    ));
                }
            }
            Ok(())
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let role_ref: RoleRef = if r.kind == "RoleBinding" {
                serde_json::from_value::<RoleBinding>(new.clone())
                    .map_err(decode)?
                    .role_ref
            } else {
                serde_json::from_value::<ClusterRoleBinding>(new.clone())
                    .map_err(decode)?
                    .role_ref
            };
            let (plural, key) = match role_ref.kind.as_str() {
                "Role" => (
                    "roles",
                    RoleKey::Role {
                        namespace: namespace.to_string(),
                        name: role_ref.name.clone(),
                    },
                ),
                _ => ("clusterroles", RoleKey::ClusterRole(role_ref.name.clone())),
            };
            // `bind` on the role, in the binding's namespace, lets its holder bind it.
            let bind = verb_on("bind", plural, namespace, &role_ref.name);
            if allowed(ctx, user, &bind).await?.is_none() {
                return Ok(());
            }
            let rules = ctx
                .authz
                .role_rules(&key)
                .ok_or_else(|| ApiError::not_found(RBAC_GROUP, plural, &role_ref.name))?;
            confirm_no_escalation(ctx, r, name, user, namespace, &rules)
        }
        _ => Ok(()),
    }
}

/// `verb` on an RBAC role resource, as the escalate and bind checks ask for it.
fn verb_on(verb: &str, plural: &str, namespace: &str, name: &str) -> Attributes {
    Attributes::resource(
        verb,
        ResourceAttributes {
            group: RBAC_GROUP.into(),
            version: "*".into(),
            namespace: namespace.into(),
            resource: plural.into(),
            name: name.into(),
            ..Default::default()
        },
    )
}

/// Kubernetes' `ConfirmNoEscalation`: the user's own rules in `namespace` must cover `rules`.
fn confirm_no_escalation(
    ctx: &Ctx,
    r: &Resource,
    name: &str,
    user: &UserInfo,
    namespace: &str,
    rules: &[Rule],
) -> Result<(), ApiError> {
    let (held, incomplete) = ctx.authz.rules_for(user, namespace);
    let Err(missing) = covers(&held, rules) else {
        return Ok(());
    };
    let mut lines: Vec<String> = compact(missing).iter().map(Rule::compact_string).collect();
    lines.sort();
    lines.dedup();
    let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    let mut why = format!(
        "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        groups.join(" "),
        lines.join("\n")
    );
    if let Some(e) = incomplete {
        why = format!("{why}; resolution errors: [{e}]");
    }
    Err(forbidden_resource(RBAC_GROUP, r.plural, name, &why))
}

/// Whether an update changes nothing but what the garbage collector changes (Kubernetes'
/// `IsOnlyMutatingGCFields`: owner references and finalizers).
fn only_gc_fields_changed(new: &Value, old: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in [
                "ownerReferences",
                "finalizers",
                "resourceVersion",
                "managedFields",
                "generation",
            ] {
                m.remove(k);
            }
        }
        v
    };
    strip(new) == strip(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gc_only_updates_are_recognised() {
        let old = json!({"metadata": {"name": "r", "resourceVersion": "5"}, "rules": []});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
        new["metadata"]["ownerReferences"] = json!([{"uid": "x"}]);
        assert!(only_gc_fields_changed(&new, &old));
        new["rules"] = json!([{"verbs": ["*"]}]);
        assert!(!only_gc_fields_changed(&new, &old));
    }
}
