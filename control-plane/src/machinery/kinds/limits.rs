//! core/v1 LimitRange and ResourceQuota, the per-namespace resource policies the LimitRanger
//! and ResourceQuota admission plugins enforce: defaulting (a LimitRange's default limits and
//! requests filled from max and min, as SetDefaults_LimitRangeItem), validation as
//! Kubernetes' ValidateLimitRange and ValidateResourceQuota, and kubectl's columns.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRange, LimitRangeItem, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, name_cell, validate_typed,
};
use crate::machinery::quantity::Quantity;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{qualified_name_errors, FieldPath, NameRule, Scope};

/// The resource quota scopes Kubernetes knows.
pub const QUOTA_SCOPES: &[&str] = &[
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
];

// ---------------------------------------------------------------- LimitRange

pub fn default_limit_range(v: &mut Value) {
    default_typed(v, |lr: &mut LimitRange| {
        for item in lr.spec.iter_mut().flat_map(|s| s.limits.iter_mut()) {
            default_limit_range_item(item);
        }
    });
}

/// SetDefaults_LimitRangeItem: for containers, a missing default limit is the max, a missing
/// default request the default limit, else the min.
fn default_limit_range_item(item: &mut LimitRangeItem) {
    if item.type_ != "Container" {
        return;
    }
    let default = item.default.get_or_insert_with(BTreeMap::new);
    for (k, v) in item.max.iter().flatten() {
        default.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let request = item.default_request.get_or_insert_with(BTreeMap::new);
    for (k, v) in default.iter() {
        request.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in item.min.iter().flatten() {
        request.entry(k.clone()).or_insert_with(|| v.clone());
    }
    if item.default.as_ref().is_some_and(BTreeMap::is_empty) {
        item.default = None;
    }
    if item
        .default_request
        .as_ref()
        .is_some_and(BTreeMap::is_empty)
    {
        item.default_request = None;
    }
}

type Quantities = BTreeMap<String, ApiQuantity>;

/// Parses a resource list, reporting each quantity that does not parse or is negative.
fn parsed(
    list: Option<&Quantities>,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    for (k, q) in list.into_iter().flatten() {
        let p = path.key(k);
        match Quantity::parse(&q.0) {
            Ok(v) if v.nano_value() < 0 => errs.push(FieldError::invalid(
                p,
                &q.0,
                "must be greater than or equal to 0",
            )),
            Ok(v) => {
                out.insert(k.clone(), v);
            }
            Err(e) => errs.push(FieldError::invalid(p, &q.0, &e.to_string())),
        }
        for m in resource_name_errors(k) {
            errs.push(FieldError::invalid(path.key(k), k, &m));
        }
    }
    out
}

/// A resource name is a standard name or a domain-qualified one (`example.com/gpu`).
fn resource_name_errors(name: &str) -> Vec<String> {
    qualified_name_errors(name)
}

pub fn validate_limit_range(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &LimitRange, old: Option<&LimitRange>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let limits = FieldPath::new("spec").child("limits");
        let items = new
            .spec
            .as_ref()
            .map(|s| s.limits.as_slice())
            .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for (i, item) in items.iter().enumerate() {
            let path = limits.index(i);
            let t = item.type_.as_str();
            if !seen.insert(t) {
                errs.push(FieldError::duplicate(path.child("type"), t));
            }
            if !matches!(t, "Pod" | "Container" | "PersistentVolumeClaim") {
                if t.is_empty() {
                    errs.push(FieldError::required(path.child("type")));
                } else {
                    errs.push(FieldError::not_supported(
                        path.child("type"),
                        t,
                        &["Container", "PersistentVolumeClaim", "Pod"],
                    ));
                }
            }
            let max = parsed(item.max.as_ref(), &path.child("max"), &mut errs);
            let min = parsed(item.min.as_ref(), &path.child("min"), &mut errs);
            let default = parsed(item.default.as_ref(), &path.child("default"), &mut errs);
            let request = parsed(
                item.default_request.as_ref(),
                &path.child("defaultRequest"),
                &mut errs,
            );
            let ratio = parsed(
                item.max_limit_request_ratio.as_ref(),
                &path.child("maxLimitRequestRatio"),
                &mut errs,
            );
            if t == "Pod" {
                if !default.is_empty() {
                    errs.push(FieldError::forbidden(
                        path.child("default"),
                        "may not be specified when `type` is 'Pod'",
                    ));
                }
                if !request.is_empty() {
                    errs.push(FieldError::forbidden(
                        path.child("defaultRequest"),
                        "may not be specified when `type` is 'Pod'",
                    ));
                }
            }
            let show = |q: &Quantity| q.to_string();
            for (k, mx) in &max {
                if let Some(mn) = min.get(k).filter(|mn| *mn > mx) {
                    errs.push(FieldError::invalid(
                        path.child("min").key(k),
                        show(mn),
                        &format!(
                            "min value {} is greater than max value {}",
                            show(mn),
                            show(mx)
                        ),
                    ));
                }
            }
            for (k, d) in &default {
                if let Some(mx) = max.get(k).filter(|mx| d > *mx) {
                    errs.push(FieldError::invalid(
                        path.child("default").key(k),
                        show(d),
                        &format!(
                            "default value {} is greater than max value {}",
                            show(d),
                            show(mx)
                        ),
                    ));
                }
                if let Some(mn) = min.get(k).filter(|mn| *mn > d) {
                    errs.push(FieldError::invalid(
                        path.child("default").key(k),
                        show(d),
                        &format!(
                            "min value {} is greater than default value {}",
                            show(mn),
                            show(d)
                        ),
                    ));
                }
            }
            for (k, r) in &request {
                if let Some(mx) = max.get(k).filter(|mx| r > *mx) {
                    errs.push(FieldError::invalid(
                        path.child("defaultRequest").key(k),
                        show(r),
                        &format!(
                            "default request value {} is greater than max value {}",
                            show(r),
                            show(mx)
                        ),
                    ));
                }
                if let Some(d) = default.get(k).filter(|d| r > *d) {
                    errs.push(FieldError::invalid(
                        path.child("defaultRequest").key(k),
                        show(r),
                        &format!(
                            "default request value {} is greater than default limit value {}",
                            show(r),
                            show(d)
                        ),
                    ));
                }
                if let Some(mn) = min.get(k).filter(|mn| *mn > r) {
                    errs.push(FieldError::invalid(
                        path.child("defaultRequest").key(k),
                        show(r),
                        &format!(
                            "min value {} is greater than default request value {}",
                            show(mn),
                            show(r)
                        ),
                    ));
                }
            }
            let one = Quantity::from_value(1, crate::machinery::quantity::Format::DecimalSI);
            for (k, r) in &ratio {
                if *r < one {
                    errs.push(FieldError::invalid(
                        path.child("maxLimitRequestRatio").key(k),
                        show(r),
                        "ratio must be greater than or equal to 1",
                    ));
                }
            }
        }
        errs
    })
}

pub fn limit_range_columns() -> Vec<TableColumnDefinition> {
    super::common::default_columns()
}

pub fn limit_range_row(v: &Value, now: Timestamp) -> Vec<Value> {
    default_row(v, now)
}

// ---------------------------------------------------------------- ResourceQuota

/// Whether a quota resource name is one Kubernetes accepts: standard names, `requests.*`,
/// `limits.*`, `count/<resource>[.<group>]`, and domain-qualified extended resources.
fn quota_resource_errors(name: &str) -> Vec<String> {
    if let Some(rest) = name.strip_prefix("count/") {
        return if rest.is_empty() {
            vec!["must be a standard resource for quota".into()]
        } else {
            Vec::new()
        };
    }
    qualified_name_errors(name)
}

pub fn validate_resource_quota(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &ResourceQuota, old: Option<&ResourceQuota>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            let spec = new.spec.clone().unwrap_or_default();
            let path = FieldPath::new("spec");
            let hard = path.child("hard");
            for (k, q) in spec.hard.iter().flatten() {
                for m in quota_resource_errors(k) {
                    errs.push(FieldError::invalid(hard.key(k), k, &m));
                }
                match Quantity::parse(&q.0) {
                    Ok(v) if v.nano_value() < 0 => errs.push(FieldError::invalid(
                        hard.key(k),
                        &q.0,
                        "must be greater than or equal to 0",
                    )),
                    Ok(v) if is_integer_resource(k) && v.nano_value() % 1_000_000_000 != 0 => {
                        errs.push(FieldError::invalid(hard.key(k), &q.0, "must be an integer"))
                    }
                    Ok(_) => {}
                    Err(e) => errs.push(FieldError::invalid(hard.key(k), &q.0, &e.to_string())),
                }
            }
            let scopes: Vec<&str> = spec.scopes.iter().flatten().map(String::as_str).collect();
            for (i, s) in scopes.iter().enumerate() {
                if !QUOTA_SCOPES.contains(s) {
                    errs.push(FieldError::not_supported(
                        path.child("scopes").index(i),
                        s,
                        QUOTA_SCOPES,
                    ));
                }
            }
            let selector_scopes: Vec<String> = spec
                .scope_selector
                .iter()
                .flat_map(|s| s.match_expressions.iter().flatten())
                .map(|e| e.scope_name.clone())
                .collect();
            for (i, e) in spec
                .scope_selector
                .iter()
                .flat_map(|s| s.match_expressions.iter().flatten())
                .enumerate()
            {
                let p = path
                    .child("scopeSelector")
                    .child("matchExpressions")
                    .index(i);
                if !QUOTA_SCOPES.contains(&e.scope_name.as_str()) {
                    errs.push(FieldError::not_supported(
                        p.child("scopeName"),
                        &e.scope_name,
                        QUOTA_SCOPES,
                    ));
                }
                if !matches!(
                    e.operator.as_str(),
                    "In" | "NotIn" | "Exists" | "DoesNotExist"
                ) {
                    errs.push(FieldError::not_supported(
                        p.child("operator"),
                        &e.operator,
                        &["In", "NotIn", "Exists", "DoesNotExist"],
                    ));
                }
            }
            let all: Vec<&str> = scopes
                .iter()
                .copied()
                .chain(selector_scopes.iter().map(String::as_str))
                .collect();
            let has = |s: &str| all.contains(&s);
            if has("Terminating") && has("NotTerminating") {
                errs.push(FieldError::invalid(
                    path.child("scopes"),
                    all.join(", "),
                    "conflicting scopes",
                ));
            }
            if has("BestEffort") && has("NotBestEffort") {
                errs.push(FieldError::invalid(
                    path.child("scopes"),
                    all.join(", "),
                    "conflicting scopes",
                ));
            }
            errs
        },
    )
}

/// Resources counted in whole objects.
fn is_integer_resource(name: &str) -> bool {
    name.starts_with("count/")
        || matches!(
            name,
            "pods"
                | "services"
                | "replicationcontrollers"
                | "resourcequotas"
                | "secrets"
                | "configmaps"
                | "persistentvolumeclaims"
                | "services.nodeports"
                | "services.loadbalancers"
        )
}

pub fn resource_quota_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new(
            "Request",
            ColumnType::String,
            "Request represents a minimum amount of cpu/memory that a container may consume.",
        ),
        TableColumnDefinition::new(
            "Limit",
            ColumnType::String,
            "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
        ),
    ]
}

/// `pods: 1/10, requests.cpu: 500m/2` (used/hard, sorted; limits.* in the LIMIT column).
pub fn resource_quota_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(q) = decode::<ResourceQuota>(v) else {
        return default_row(v, now);
    };
    let hard = q
        .spec
        .as_ref()
        .and_then(|s| s.hard.clone())
        .unwrap_or_default();
    let status = q.status.clone().unwrap_or_default();
    let show = |m: &Option<Quantities>, k: &str| {
        m.as_ref()
            .and_then(|m| m.get(k))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .map_or_else(|| "0".to_string(), |q| q.to_string())
    };
    let mut request = Vec::new();
    let mut limit = Vec::new();
    for k in hard.keys() {
        let cell = format!("{k}: {}/{}", show(&status.used, k), show(&status.hard, k));
        if k.split('.').next() == Some("limits") && k.contains('.') {
            limit.push(cell);
        } else {
            request.push(cell);
        }
    }
    vec![
        name_cell(&q.metadata),
        age_cell(&q.metadata, now),
        Value::from(request.join(", ")),
        Value::from(limit.join(", ")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(errs: Vec<FieldError>) -> Vec<String> {
        errs.into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn limit_range_defaults_follow_max_and_min() {
        let mut v = json!({"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"l","namespace":"d"},
            "spec":{"limits":[{"type":"Container","max":{"cpu":"2"},"min":{"memory":"64Mi"}},
                               {"type":"Pod","max":{"cpu":"4"}}]}});
        default_limit_range(&mut v);
        let c = &v["spec"]["limits"][0];
        assert_eq!(c["default"], json!({"cpu": "2"}));
        assert_eq!(c["defaultRequest"], json!({"cpu": "2", "memory": "64Mi"}));
        assert!(
            v["spec"]["limits"][1].get("default").is_none(),
            "pods get no defaults"
        );
        assert!(validate_limit_range(&v, None).is_empty());
    }

    #[test]
    fn limit_range_validation() {
        let v = json!({"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"l","namespace":"d"},
            "spec":{"limits":[{"type":"Container","max":{"cpu":"1"},"min":{"cpu":"2"},
                               "default":{"cpu":"3"},"maxLimitRequestRatio":{"cpu":"500m"}},
                              {"type":"Pod","default":{"cpu":"1"}},
                              {"type":"Thing"}]}});
        let m = messages(validate_limit_range(&v, None));
        for want in [
            "spec.limits[0].min[cpu]: Invalid value: \"2\": min value 2 is greater than max value 1",
            "spec.limits[0].default[cpu]: Invalid value: \"3\": default value 3 is greater than max value 1",
            "spec.limits[0].maxLimitRequestRatio[cpu]: Invalid value: \"500m\": ratio must be greater than or equal to 1",
            "spec.limits[1].default: Forbidden: may not be specified when `type` is 'Pod'",
            "spec.limits[2].type: Unsupported value: \"Thing\": supported values: \"Container\", \"PersistentVolumeClaim\", \"Pod\"",
        ] {
            assert!(m.iter().any(|x| x == want), "{want} not in {m:#?}");
        }
    }

    #[test]
    fn quota_validation_and_row() {
        let v = json!({"apiVersion":"v1","kind":"ResourceQuota",
            "metadata":{"name":"q","namespace":"d","creationTimestamp":"2025-01-01T11:00:00Z"},
            "spec":{"hard":{"pods":"2","requests.cpu":"1","limits.memory":"1Gi"}},
            "status":{"hard":{"pods":"2","requests.cpu":"1","limits.memory":"1Gi"},
                      "used":{"pods":"1","requests.cpu":"500m"}}});
        assert!(validate_resource_quota(&v, None).is_empty());
        let row = resource_quota_row(&v, "2025-01-01T12:00:00Z".parse().unwrap());
        assert_eq!(row[2], "pods: 1/2, requests.cpu: 500m/1");
        assert_eq!(row[3], "limits.memory: 0/1Gi");
        let bad = json!({"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"q","namespace":"d"},
            "spec":{"hard":{"pods":"1.5","cpu":"-1"},"scopes":["Terminating","NotTerminating","Bogus"]}});
        let m = messages(validate_resource_quota(&bad, None));
        for want in [
            "spec.hard[pods]: Invalid value: \"1.5\": must be an integer",
            "spec.hard[cpu]: Invalid value: \"-1\": must be greater than or equal to 0",
            "spec.scopes[2]: Unsupported value: \"Bogus\"",
            "spec.scopes: Invalid value: \"Terminating, NotTerminating, Bogus\": conflicting scopes",
        ] {
            assert!(m.iter().any(|x| x.starts_with(want)), "{want} not in {m:#?}");
        }
    }
}
