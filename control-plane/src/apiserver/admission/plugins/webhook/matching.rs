//! Whether a webhook wants a request: its rules (operations, groups, versions, resources
//! with `*` and `<resource>/<subresource>` forms, scope) under its match policy, then its
//! namespace selector (the namespace's labels; a Namespace's own) and object selector
//! (the new or the old object's labels), as Kubernetes' webhook predicates decide.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;

use super::config::{Hook, MatchPolicy};
use crate::apiserver::admission::Request;

fn listed(list: Option<&Vec<String>>, value: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|x| x == "*" || x == value))
}

/// `*` is every resource but no subresource, `*/*` every resource and subresource, `pods/*`
/// pods and every subresource of pods (a `*` subresource matches none as well, as in
/// Kubernetes' matcher), `*/status` every status subresource.
fn resource_listed(list: Option<&Vec<String>>, resource: &str, subresource: &str) -> bool {
    list.is_some_and(|l| {
        l.iter().any(|entry| {
            let (res, sub) = entry.split_once('/').unwrap_or((entry, ""));
            (res == "*" || res == resource) && (sub == subresource || (sub == "*"))
        })
    })
}

fn rule_matches(rule: &RuleWithOperations, req: &Request<'_>, any_version: bool) -> bool {
    let r = req.resource;
    let scope_ok = match rule.scope.as_deref().unwrap_or("*") {
        "Cluster" => !r.namespaced(),
        "Namespaced" => r.namespaced(),
        _ => true,
    };
    scope_ok
        && listed(rule.operations.as_ref(), req.operation.as_str())
        && listed(rule.api_groups.as_ref(), r.group)
        && (any_version || listed(rule.api_versions.as_ref(), r.version))
        && resource_listed(
            rule.resources.as_ref(),
            r.plural,
            req.subresource.unwrap_or(""),
        )
}

/// Whether the hook's rules name the request. With matchPolicy Equivalent, a rule for
/// another version of the same group and resource matches too (skiff serves one version
/// of each resource, so the object is sent in that version).
pub fn rules_match(hook: &Hook, req: &Request<'_>) -> bool {
    hook.rules.iter().any(|rule| {
        rule_matches(rule, req, false)
            || (hook.match_policy == MatchPolicy::Equivalent && rule_matches(rule, req, true))
    })
}

/// The selectors, given the namespace's labels (None for cluster-scoped requests) and the
/// labels of the object and the old object.
pub fn selectors_match(
    hook: &Hook,
    namespace_labels: Option<&BTreeMap<String, String>>,
    object: Option<&BTreeMap<String, String>>,
    old: Option<&BTreeMap<String, String>>,
) -> bool {
    let ns_ok = match namespace_labels {
        Some(l) => hook.namespace_selector.is_everything() || hook.namespace_selector.matches(l),
        None => true,
    };
    if !ns_ok {
        return false;
    }
    if hook.object_selector.is_everything() {
        return true;
    }
    let empty = BTreeMap::new();
    let any = [object, old];
    let matched = any
        .iter()
        .flatten()
        .any(|l| hook.object_selector.matches(l));
    // An operation without an object (connect) is judged on an empty label set.
    matched || (any.iter().all(Option::is_none) && hook.object_selector.matches(&empty))
}

/// The webhook configurations themselves never go to webhooks (a broken webhook could
/// otherwise lock every administrator out of fixing it), as in Kubernetes.
pub fn exempt(req: &Request<'_>) -> bool {
    req.resource.group == "admissionregistration.k8s.io"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_forms() {
        let l = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(resource_listed(l(&["*"]).as_ref(), "pods", ""));
        assert!(!resource_listed(l(&["*"]).as_ref(), "pods", "status"));
        assert!(resource_listed(l(&["*/*"]).as_ref(), "pods", "status"));
        assert!(resource_listed(l(&["pods/*"]).as_ref(), "pods", "exec"));
        // As Kubernetes' matcher has it: `*` as a subresource matches none too.
        assert!(resource_listed(l(&["pods/*"]).as_ref(), "pods", ""));
        assert!(resource_listed(
            l(&["*/scale"]).as_ref(),
            "deployments",
            "scale"
        ));
        assert!(resource_listed(
            l(&["pods", "services"]).as_ref(),
            "services",
            ""
        ));
        assert!(!resource_listed(l(&["pods"]).as_ref(), "pods", "status"));
    }
}
