//! admissionregistration.k8s.io/v1 MutatingWebhookConfiguration and
//! ValidatingWebhookConfiguration: Kubernetes' v1 defaults (failurePolicy Fail, matchPolicy
//! Equivalent, empty selectors, timeoutSeconds 10, reinvocationPolicy Never, rule scope `*`,
//! service port 443), validation as ValidateMutatingWebhookConfiguration (names, rules,
//! client config, sideEffects, timeouts, review versions) and kubectl's columns
//! (NAME WEBHOOKS AGE).

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, name_cell, validate_typed,
};
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{is_dns1123_subdomain, FieldPath, NameRule, Scope};

const OPERATIONS: &[&str] = &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];

fn default_rules(rules: &mut Option<Vec<RuleWithOperations>>) {
    for r in rules.iter_mut().flatten() {
        r.scope.get_or_insert_with(|| "*".into());
    }
}

fn default_client(c: &mut WebhookClientConfig) {
    if let Some(s) = c.service.as_mut() {
        s.port.get_or_insert(443);
    }
}

fn default_selector(s: &mut Option<metav1::LabelSelector>) {
    s.get_or_insert_with(Default::default);
}

pub fn default_mutating(v: &mut Value) {
    default_typed(v, |c: &mut MutatingWebhookConfiguration| {
        for w in c.webhooks.iter_mut().flatten() {
            w.failure_policy.get_or_insert_with(|| "Fail".into());
            w.match_policy.get_or_insert_with(|| "Equivalent".into());
            w.reinvocation_policy.get_or_insert_with(|| "Never".into());
            w.timeout_seconds.get_or_insert(10);
            default_selector(&mut w.namespace_selector);
            default_selector(&mut w.object_selector);
            default_rules(&mut w.rules);
            default_client(&mut w.client_config);
        }
    });
}

pub fn default_validating(v: &mut Value) {
    default_typed(v, |c: &mut ValidatingWebhookConfiguration| {
        for w in c.webhooks.iter_mut().flatten() {
            w.failure_policy.get_or_insert_with(|| "Fail".into());
            w.match_policy.get_or_insert_with(|| "Equivalent".into());
            w.timeout_seconds.get_or_insert(10);
            default_selector(&mut w.namespace_selector);
            default_selector(&mut w.object_selector);
            default_rules(&mut w.rules);
            default_client(&mut w.client_config);
        }
    });
}

/// What both kinds of webhook share, for validation.
struct Webhook<'a> {
    name: &'a str,
    rules: Option<&'a Vec<RuleWithOperations>>,
    failure_policy: Option<&'a str>,
    match_policy: Option<&'a str>,
    namespace_selector: Option<&'a metav1::LabelSelector>,
    object_selector: Option<&'a metav1::LabelSelector>,
    side_effects: &'a str,
    timeout_seconds: Option<i32>,
    admission_review_versions: &'a [String],
    client_config: &'a WebhookClientConfig,
    has_match_conditions: bool,
}

fn one_of(errs: &mut Vec<FieldError>, path: FieldPath, value: Option<&str>, allowed: &[&str]) {
    if let Some(v) = value.filter(|v| !allowed.contains(v)) {
        errs.push(FieldError::not_supported(path, v, allowed));
    }
}

fn non_empty_list(errs: &mut Vec<FieldError>, path: FieldPath, list: Option<&Vec<String>>) {
    match list {
        None => errs.push(FieldError::required(path)),
        Some(l) if l.is_empty() => errs.push(FieldError::required(path)),
        Some(l) if l.len() > 1 && l.iter().any(|x| x == "*") => errs.push(FieldError::invalid(
            path,
            format!("{l:?}"),
            "if '*' is present, must not specify other values",
        )),
        Some(_) => {}
    }
}

fn validate_rule(errs: &mut Vec<FieldError>, path: FieldPath, r: &RuleWithOperations) {
    non_empty_list(errs, path.child("operations"), r.operations.as_ref());
    for (i, op) in r.operations.iter().flatten().enumerate() {
        one_of(
            errs,
            path.child("operations").index(i),
            Some(op),
            OPERATIONS,
        );
    }
    non_empty_list(errs, path.child("apiGroups"), r.api_groups.as_ref());
    non_empty_list(errs, path.child("apiVersions"), r.api_versions.as_ref());
    for (i, v) in r.api_versions.iter().flatten().enumerate() {
        if v.is_empty() {
            errs.push(FieldError::required(path.child("apiVersions").index(i)));
        }
    }
    match r.resources.as_ref() {
        None => errs.push(FieldError::required(path.child("resources"))),
        Some(l) if l.is_empty() => errs.push(FieldError::required(path.child("resources"))),
        Some(l) => {
            for (i, res) in l.iter().enumerate() {
                let p = path.child("resources").index(i);
                let (main, sub) = res.split_once('/').unwrap_or((res, ""));
                if main.is_empty() || (res.contains('/') && sub.is_empty()) {
                    errs.push(FieldError::invalid(p, res, "must not be empty"));
                }
            }
        }
    }
    one_of(
        errs,
        path.child("scope"),
        r.scope.as_deref(),
        &["*", "Cluster", "Namespaced"],
    );
}

fn validate_client(errs: &mut Vec<FieldError>, path: FieldPath, c: &WebhookClientConfig) {
    match (&c.url, &c.service) {
        (Some(_), Some(_)) | (None, None) => errs.push(FieldError::new(
            CauseType::Required,
            path.clone(),
            "Required value: exactly one of url or service is required",
        )),
        (Some(url), None) => {
            let p = path.child("url");
            match url.strip_prefix("https://") {
                None => errs.push(FieldError::invalid(
                    p,
                    url,
                    "'https' is the only allowed URL scheme",
                )),
                Some(rest) => {
                    let authority = rest.split('/').next().unwrap_or("");
                    if authority.is_empty() {
                        errs.push(FieldError::invalid(
                            p.clone(),
                            url,
                            "host must be specified",
                        ));
                    }
                    if authority.contains('@') {
                        errs.push(FieldError::invalid(
                            p.clone(),
                            url,
                            "user information is not permitted in the URL",
                        ));
                    }
                    if rest.contains('#') {
                        errs.push(FieldError::invalid(
                            p.clone(),
                            url,
                            "fragments are not permitted in the URL",
                        ));
                    }
                    if rest.contains('?') {
                        errs.push(FieldError::invalid(
                            p,
                            url,
                            "query parameters are not permitted in the URL",
                        ));
                    }
                }
            }
        }
        (None, Some(s)) => {
            let p = path.child("service");
            if s.name.is_empty() {
                errs.push(FieldError::required(p.child("name")));
            }
            if s.namespace.is_empty() {
                errs.push(FieldError::required(p.child("namespace")));
            }
            if let Some(path) = s.path.as_deref().filter(|x| !x.is_empty()) {
                if !path.starts_with('/') {
                    errs.push(FieldError::invalid(
                        p.child("path"),
                        path,
                        "must start with a '/'",
                    ));
                }
            }
            if let Some(port) = s.port.filter(|p| !(1..=65535).contains(p)) {
                errs.push(FieldError::invalid_number(
                    p.child("port"),
                    port.into(),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
}

fn validate_selector(
    errs: &mut Vec<FieldError>,
    path: FieldPath,
    s: Option<&metav1::LabelSelector>,
) {
    if let Some(s) = s {
        if let Err(e) = LabelSelector::from_meta(s) {
            errs.push(FieldError::invalid(path, "selector", &e.message));
        }
    }
}

fn validate_webhooks(webhooks: &[Webhook<'_>]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = BTreeSet::new();
    for (i, w) in webhooks.iter().enumerate() {
        let path = FieldPath::new("webhooks").index(i);
        let name = path.child("name");
        if w.name.is_empty() {
            errs.push(FieldError::required(name.clone()));
        } else if w.name.split('.').count() < 3 || !is_dns1123_subdomain(w.name) {
            errs.push(FieldError::invalid(
                name.clone(),
                w.name,
                "should be a domain with at least three segments separated by dots",
            ));
        }
        if !names.insert(w.name) {
            errs.push(FieldError::duplicate(name, w.name));
        }
        for (j, r) in w.rules.iter().flat_map(|r| r.iter()).enumerate() {
            validate_rule(&mut errs, path.child("rules").index(j), r);
        }
        one_of(
            &mut errs,
            path.child("failurePolicy"),
            w.failure_policy,
            &["Fail", "Ignore"],
        );
        one_of(
            &mut errs,
            path.child("matchPolicy"),
            w.match_policy,
            &["Exact", "Equivalent"],
        );
        match w.side_effects {
            "" => errs.push(FieldError::required(path.child("sideEffects"))),
            s => one_of(
                &mut errs,
                path.child("sideEffects"),
                Some(s),
                &["None", "NoneOnDryRun"],
            ),
        }
        if let Some(t) = w.timeout_seconds.filter(|t| !(1..=30).contains(t)) {
            errs.push(FieldError::invalid_number(
                path.child("timeoutSeconds"),
                t.into(),
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
        let versions = path.child("admissionReviewVersions");
        if w.admission_review_versions.is_empty() {
            errs.push(FieldError::required(versions));
        } else if !w.admission_review_versions.iter().any(|v| v == "v1") {
            errs.push(FieldError::invalid(
                versions,
                format!("{:?}", w.admission_review_versions),
                "must include v1: this server sends admission.k8s.io/v1 AdmissionReviews",
            ));
        }
        if w.has_match_conditions {
            errs.push(FieldError::forbidden(
                path.child("matchConditions"),
                "matchConditions (CEL) are not supported by this server",
            ));
        }
        validate_selector(
            &mut errs,
            path.child("namespaceSelector"),
            w.namespace_selector,
        );
        validate_selector(&mut errs, path.child("objectSelector"), w.object_selector);
        validate_client(&mut errs, path.child("clientConfig"), w.client_config);
    }
    errs
}

pub fn validate_mutating(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &MutatingWebhookConfiguration, old: Option<&MutatingWebhookConfiguration>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            let hooks: Vec<Webhook<'_>> = new
                .webhooks
                .iter()
                .flatten()
                .map(|w| Webhook {
                    name: &w.name,
                    rules: w.rules.as_ref(),
                    failure_policy: w.failure_policy.as_deref(),
                    match_policy: w.match_policy.as_deref(),
                    namespace_selector: w.namespace_selector.as_ref(),
                    object_selector: w.object_selector.as_ref(),
                    side_effects: &w.side_effects,
                    timeout_seconds: w.timeout_seconds,
                    admission_review_versions: &w.admission_review_versions,
                    client_config: &w.client_config,
                    has_match_conditions: w
                        .match_conditions
                        .as_ref()
                        .is_some_and(|m| !m.is_empty()),
                })
                .collect();
            errs.extend(validate_webhooks(&hooks));
            for (i, w) in new.webhooks.iter().flatten().enumerate() {
                one_of(
                    &mut errs,
                    FieldPath::new("webhooks")
                        .index(i)
                        .child("reinvocationPolicy"),
                    w.reinvocation_policy.as_deref(),
                    &["Never", "IfNeeded"],
                );
            }
            errs
        },
    )
}

pub fn validate_validating(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &ValidatingWebhookConfiguration, old: Option<&ValidatingWebhookConfiguration>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            let hooks: Vec<Webhook<'_>> = new
                .webhooks
                .iter()
                .flatten()
                .map(|w| Webhook {
                    name: &w.name,
                    rules: w.rules.as_ref(),
                    failure_policy: w.failure_policy.as_deref(),
                    match_policy: w.match_policy.as_deref(),
                    namespace_selector: w.namespace_selector.as_ref(),
                    object_selector: w.object_selector.as_ref(),
                    side_effects: &w.side_effects,
                    timeout_seconds: w.timeout_seconds,
                    admission_review_versions: &w.admission_review_versions,
                    client_config: &w.client_config,
                    has_match_conditions: w
                        .match_conditions
                        .as_ref()
                        .is_some_and(|m| !m.is_empty()),
                })
                .collect();
            errs.extend(validate_webhooks(&hooks));
            errs
        },
    )
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Webhooks",
            ColumnType::Integer,
            "Webhooks indicates the number of webhooks in this configuration.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn mutating_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(c) = decode::<MutatingWebhookConfiguration>(v) else {
        return default_row(v, now);
    };
    vec![
        name_cell(&c.metadata),
        Value::from(c.webhooks.as_ref().map_or(0, Vec::len)),
        age_cell(&c.metadata, now),
    ]
}

pub fn validating_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(c) = decode::<ValidatingWebhookConfiguration>(v) else {
        return default_row(v, now);
    };
    vec![
        name_cell(&c.metadata),
        Value::from(c.webhooks.as_ref().map_or(0, Vec::len)),
        age_cell(&c.metadata, now),
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
    fn defaults_and_a_valid_configuration() {
        let mut v = json!({"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration",
            "metadata":{"name":"inject"},
            "webhooks":[{"name":"inject.skiff.dev","sideEffects":"None","admissionReviewVersions":["v1"],
                "clientConfig":{"service":{"namespace":"hooks","name":"injector","path":"/mutate"}},
                "rules":[{"operations":["CREATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["pods"]}]}]});
        default_mutating(&mut v);
        let w = &v["webhooks"][0];
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["matchPolicy"], "Equivalent");
        assert_eq!(w["reinvocationPolicy"], "Never");
        assert_eq!(w["timeoutSeconds"], 10);
        assert_eq!(w["namespaceSelector"], json!({}));
        assert_eq!(w["rules"][0]["scope"], "*");
        assert_eq!(w["clientConfig"]["service"]["port"], 443);
        assert!(
            validate_mutating(&v, None).is_empty(),
            "{:?}",
            validate_mutating(&v, None)
        );
    }

    #[test]
    fn what_kubernetes_refuses() {
        let v = json!({"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration",
            "metadata":{"name":"v"},
            "webhooks":[
              {"name":"short","sideEffects":"Some","admissionReviewVersions":["v1beta1"],"timeoutSeconds":31,
               "clientConfig":{"url":"http://x.example/v"},
               "rules":[{"operations":["PATCH"],"apiGroups":[""],"apiVersions":["v1"],"resources":["pods"]}]},
              {"name":"a.b.c","sideEffects":"None","admissionReviewVersions":["v1"],
               "clientConfig":{"service":{"namespace":"","name":"s","path":"x"}}},
              {"name":"a.b.c","sideEffects":"None","admissionReviewVersions":["v1"],"clientConfig":{}}]});
        let m = messages(validate_validating(&v, None));
        for want in [
            "webhooks[0].name: Invalid value: \"short\": should be a domain with at least three segments separated by dots",
            "webhooks[0].rules[0].operations[0]: Unsupported value: \"PATCH\"",
            "webhooks[0].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
            "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
            "webhooks[0].clientConfig.url: Invalid value: \"http://x.example/v\": 'https' is the only allowed URL scheme",
            "webhooks[1].clientConfig.service.namespace: Required value",
            "webhooks[1].clientConfig.service.path: Invalid value: \"x\": must start with a '/'",
            "webhooks[2].name: Duplicate value: \"a.b.c\"",
            "webhooks[2].clientConfig: Required value: exactly one of url or service is required",
        ] {
            assert!(m.iter().any(|x| x.starts_with(want)), "{want} not in {m:#?}");
        }
    }
}
