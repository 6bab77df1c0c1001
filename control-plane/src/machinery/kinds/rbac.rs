//! rbac.authorization.k8s.io/v1 Role, ClusterRole, RoleBinding and ClusterRoleBinding:
//! Kubernetes' defaulting (roleRef and subject API groups), validation (the minimal path-segment
//! names RBAC allows, policy rules, aggregation selectors, subjects, an immutable roleRef) and
//! kubectl's columns (NAME CREATED AT for roles; NAME ROLE AGE, and USERS GROUPS
//! SERVICEACCOUNTS wide, for bindings).

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, name_cell, validate_typed,
};
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{dns1123_subdomain_errors, FieldPath, NameRule, Scope};

/// The API group of RBAC, and of User and Group subjects.
pub const GROUP: &str = "rbac.authorization.k8s.io";

fn required(path: FieldPath, detail: &str) -> FieldError {
    let message = if detail.is_empty() {
        "Required value".to_string()
    } else {
        format!("Required value: {detail}")
    };
    FieldError::new(CauseType::Required, path, message)
}

/// Go's `%#v` of a `[]string`, as Kubernetes prints an invalid list value.
fn go_strings(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[]string{{{}}}", items.join(", "))
}

fn non_empty(v: &Option<Vec<String>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

/// One policy rule: verbs always; either non-resource URLs (cluster roles only) or API groups
/// and resources, never both.
fn rule_errors(rule: &PolicyRule, namespaced: bool, path: FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    if rule.verbs.is_empty() {
        errs.push(required(
            path.child("verbs"),
            "verbs must contain at least one value",
        ));
    }
    if let Some(urls) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
        let at = path.child("nonResourceURLs");
        if namespaced {
            errs.push(FieldError::invalid_unquoted(
                &at,
                go_strings(urls),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if non_empty(&rule.api_groups)
            || non_empty(&rule.resources)
            || non_empty(&rule.resource_names)
        {
            errs.push(FieldError::invalid_unquoted(
                &at,
                go_strings(urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return errs;
    }
    if !non_empty(&rule.api_groups) {
        errs.push(required(
            path.child("apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if !non_empty(&rule.resources) {
        errs.push(required(
            path.child("resources"),
            "resource rules must supply at least one resource",
        ));
    }
    if non_empty(&rule.resource_names) && rule.resources.as_ref().is_some_and(|r| r.len() > 1) {
        errs.push(required(
            path.child("resourceNames"),
            "resource names cannot apply to multiple resources",
        ));
    }
    errs
}

fn rules_errors(rules: Option<&Vec<PolicyRule>>, namespaced: bool) -> Vec<FieldError> {
    let path = FieldPath::new("rules");
    rules
        .into_iter()
        .flatten()
        .enumerate()
        .flat_map(|(i, r)| rule_errors(r, namespaced, path.index(i)))
        .collect()
}

/// RBAC's minimal name rule: a path segment (no `/`, no `%`, not `.` or `..`).
fn path_segment_name(path: FieldPath, name: &str) -> Vec<FieldError> {
    NameRule::PathSegment
        .errors(name, false)
        .into_iter()
        .map(|m| FieldError::invalid(&path, name, &m))
        .collect()
}

fn role_ref_errors(r: &RoleRef, kinds: &[&str]) -> Vec<FieldError> {
    let path = FieldPath::new("roleRef");
    let mut errs = vec![];
    if r.api_group != GROUP {
        errs.push(FieldError::not_supported(
            path.child("apiGroup"),
            &r.api_group,
            &[GROUP],
        ));
    }
    if !kinds.contains(&r.kind.as_str()) {
        errs.push(FieldError::not_supported(
            path.child("kind"),
            &r.kind,
            kinds,
        ));
    }
    if r.name.is_empty() {
        errs.push(required(path.child("name"), ""));
    } else {
        errs.extend(path_segment_name(path.child("name"), &r.name));
    }
    errs
}

fn subject_errors(s: &Subject, namespaced: bool, path: FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    if s.name.is_empty() {
        errs.push(required(path.child("name"), ""));
    }
    let group = s.api_group.as_deref().unwrap_or("");
    match s.kind.as_str() {
        "ServiceAccount" => {
            if !s.name.is_empty() {
                for m in dns1123_subdomain_errors(&s.name) {
                    errs.push(FieldError::invalid(path.child("name"), &s.name, &m));
                }
            }
            if !group.is_empty() {
                errs.push(FieldError::not_supported(
                    path.child("apiGroup"),
                    group,
                    &[""],
                ));
            }
            if !namespaced && s.namespace.as_deref().unwrap_or("").is_empty() {
                errs.push(required(path.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if s.name.is_empty() {
                let why = if s.kind == "User" {
                    "user name cannot be empty"
                } else {
                    "group name cannot be empty"
                };
                errs.push(FieldError::invalid(path.child("name"), "", why));
            }
            if group != GROUP {
                errs.push(FieldError::not_supported(
                    path.child("apiGroup"),
                    group,
                    &[GROUP],
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            path.child("kind"),
            other,
            &["ServiceAccount", "User", "Group"],
        )),
    }
    errs
}

fn subjects_errors(subjects: Option<&Vec<Subject>>, namespaced: bool) -> Vec<FieldError> {
    let path = FieldPath::new("subjects");
    subjects
        .into_iter()
        .flatten()
        .enumerate()
        .flat_map(|(i, s)| subject_errors(s, namespaced, path.index(i)))
        .collect()
}

fn role_ref_unchanged(new: &RoleRef, old: Option<&RoleRef>) -> Option<FieldError> {
    let old = old?;
    (old != new).then(|| {
        FieldError::invalid_unquoted(
            FieldPath::new("roleRef"),
            format!(
                "v1.RoleRef{{APIGroup:{:?}, Kind:{:?}, Name:{:?}}}",
                new.api_group, new.kind, new.name
            ),
            "cannot change roleRef",
        )
    })
}

fn default_subjects(subjects: &mut Option<Vec<Subject>>) {
    for s in subjects.iter_mut().flatten() {
        if s.api_group.as_deref().unwrap_or("").is_empty() {
            s.api_group = match s.kind.as_str() {
                "User" | "Group" => Some(GROUP.to_string()),
                _ => s.api_group.take(),
            };
        }
    }
}

fn default_role_ref(r: &mut RoleRef) {
    if r.api_group.is_empty() {
        r.api_group = GROUP.to_string();
    }
}

pub fn default_role_binding(v: &mut Value) {
    default_typed(v, |b: &mut RoleBinding| {
        default_role_ref(&mut b.role_ref);
        default_subjects(&mut b.subjects);
    });
}

pub fn default_cluster_role_binding(v: &mut Value) {
    default_typed(v, |b: &mut ClusterRoleBinding| {
        default_role_ref(&mut b.role_ref);
        default_subjects(&mut b.subjects);
    });
}

pub fn validate_role(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Role, old: Option<&Role>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::PathSegment,
        );
        errs.extend(rules_errors(new.rules.as_ref(), true));
        errs
    })
}

pub fn validate_cluster_role(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &ClusterRole, old: Option<&ClusterRole>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::PathSegment,
        );
        errs.extend(rules_errors(new.rules.as_ref(), false));
        if let Some(agg) = &new.aggregation_rule {
            let path = FieldPath::new("aggregationRule").child("clusterRoleSelectors");
            let selectors = agg.cluster_role_selectors.as_deref().unwrap_or_default();
            if selectors.is_empty() {
                errs.push(required(
                    path.clone(),
                    "at least one clusterRoleSelector required if aggregationRule is non-nil",
                ));
            }
            for (i, s) in selectors.iter().enumerate() {
                if let Err(e) = LabelSelector::from_meta(s) {
                    errs.push(FieldError::invalid_unquoted(
                        path.index(i),
                        "{...}",
                        &format!("invalid label selector: {}", e.message),
                    ));
                }
            }
        }
        errs
    })
}

pub fn validate_role_binding(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &RoleBinding, old: Option<&RoleBinding>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::PathSegment,
        );
        errs.extend(role_ref_errors(&new.role_ref, &["Role", "ClusterRole"]));
        errs.extend(subjects_errors(new.subjects.as_ref(), true));
        errs.extend(role_ref_unchanged(&new.role_ref, old.map(|o| &o.role_ref)));
        errs
    })
}

pub fn validate_cluster_role_binding(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &ClusterRoleBinding, old: Option<&ClusterRoleBinding>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::PathSegment,
            );
            errs.extend(role_ref_errors(&new.role_ref, &["ClusterRole"]));
            errs.extend(subjects_errors(new.subjects.as_ref(), false));
            errs.extend(role_ref_unchanged(&new.role_ref, old.map(|o| &o.role_ref)));
            errs
        },
    )
}

/// Roles and cluster roles: NAME and CREATED AT, as kubectl prints them.
pub fn role_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Created At",
            ColumnType::Date,
            "CreationTimestamp is a timestamp representing the server time when this object was created.",
        ),
    ]
}

pub fn binding_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Role",
            ColumnType::String,
            "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace.",
        ),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("Users", ColumnType::String, "Users in the roleBinding").wide(),
        TableColumnDefinition::new("Groups", ColumnType::String, "Groups in the roleBinding")
            .wide(),
        TableColumnDefinition::new(
            "ServiceAccounts",
            ColumnType::String,
            "ServiceAccounts in the roleBinding",
        )
        .wide(),
    ]
}

/// The cells after NAME of a binding: `Kind/name`, age, and its subjects by kind.
fn binding_cells(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    role_ref: &RoleRef,
    subjects: Option<&Vec<Subject>>,
    now: Timestamp,
) -> Vec<Value> {
    let of = |kind: &str| -> Value {
        let names: Vec<String> = subjects
            .into_iter()
            .flatten()
            .filter(|s| s.kind == kind)
            .map(|s| match (kind, s.namespace.as_deref()) {
                ("ServiceAccount", Some(ns)) => format!("{ns}/{}", s.name),
                _ => s.name.clone(),
            })
            .collect();
        Value::from(names.join(", "))
    };
    vec![
        name_cell(meta),
        Value::from(format!("{}/{}", role_ref.kind, role_ref.name)),
        age_cell(meta, now),
        of("User"),
        of("Group"),
        of("ServiceAccount"),
    ]
}

pub fn role_binding_row(v: &Value, now: Timestamp) -> Vec<Value> {
    match decode::<RoleBinding>(v) {
        Ok(b) => binding_cells(&b.metadata, &b.role_ref, b.subjects.as_ref(), now),
        Err(_) => binding_fallback(v, now),
    }
}

pub fn cluster_role_binding_row(v: &Value, now: Timestamp) -> Vec<Value> {
    match decode::<ClusterRoleBinding>(v) {
        Ok(b) => binding_cells(&b.metadata, &b.role_ref, b.subjects.as_ref(), now),
        Err(_) => binding_fallback(v, now),
    }
}

/// An undecodable binding still gets a row as wide as the columns.
fn binding_fallback(v: &Value, now: Timestamp) -> Vec<Value> {
    let mut row = default_row(v, now);
    row.resize(binding_columns().len(), Value::from(""));
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(errs: Vec<FieldError>) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn policy_rules_follow_kubernetes() {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "r", "namespace": "default"},
        "rules": [
            {"verbs": []},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["pods", "secrets"], "resourceNames": ["a"]},
            {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
        ]});
        assert_eq!(
            errors(validate_role(&role, None)),
            vec![
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
                "rules[0].resources: Required value: resource rules must supply at least one resource",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].resourceNames: Required value: resource names cannot apply to multiple resources",
            ]
        );
        let cr = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:discovery"},
            "rules": [
                {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*"]},
                {"verbs": ["get"], "nonResourceURLs": ["/x"], "resources": ["pods"]},
            ],
            "aggregationRule": {"clusterRoleSelectors": []}});
        assert_eq!(
            errors(validate_cluster_role(&cr, None)),
            vec![
                "rules[1].nonResourceURLs: Invalid value: []string{\"/x\"}: rules cannot apply to both regular resources and non-resource URLs",
                "aggregationRule.clusterRoleSelectors: Required value: at least one clusterRoleSelector required if aggregationRule is non-nil",
            ]
        );
        let bad_name = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "a/b"}});
        assert_eq!(
            errors(validate_cluster_role(&bad_name, None)),
            vec!["metadata.name: Invalid value: \"a/b\": may not contain '/'"]
        );
    }

    #[test]
    fn bindings_are_defaulted_and_validated() {
        let mut b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "b", "namespace": "default"},
        "roleRef": {"apiGroup": "", "kind": "ClusterRole", "name": "view"},
        "subjects": [
            {"kind": "User", "name": "jane"},
            {"kind": "ServiceAccount", "name": "x"},
            {"kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io"},
        ]});
        default_role_binding(&mut b);
        assert_eq!(b["roleRef"]["apiGroup"], GROUP);
        assert_eq!(b["subjects"][0]["apiGroup"], GROUP);
        assert!(b["subjects"][1].get("apiGroup").is_none());
        assert!(validate_role_binding(&b, None).is_empty());
        let mut changed = b.clone();
        changed["roleRef"]["name"] = json!("edit");
        assert_eq!(
            errors(validate_role_binding(&changed, Some(&b))),
            vec!["roleRef: Invalid value: v1.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"]
        );
        let crb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "b"},
        "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "view"},
        "subjects": [
            {"kind": "ServiceAccount", "name": "x"},
            {"kind": "Robot", "name": "r"},
        ]});
        assert_eq!(
            errors(validate_cluster_role_binding(&crb, None)),
            vec![
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value",
                "subjects[1].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
    }

    #[test]
    fn binding_rows_list_subjects_by_kind() {
        let b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "b", "creationTimestamp": "2025-01-01T11:00:00Z"},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "view"},
        "subjects": [
            {"kind": "User", "name": "jane", "apiGroup": GROUP},
            {"kind": "User", "name": "joe", "apiGroup": GROUP},
            {"kind": "ServiceAccount", "name": "x", "namespace": "default"},
        ]});
        let now = "2025-01-01T12:00:00Z".parse().unwrap();
        assert_eq!(
            cluster_role_binding_row(&b, now),
            vec![
                json!("b"),
                json!("ClusterRole/view"),
                json!("60m"),
                json!("jane, joe"),
                json!(""),
                json!("default/x")
            ]
        );
        assert_eq!(
            cluster_role_binding_row(&json!({}), now).len(),
            binding_columns().len()
        );
    }
}
