//! apps/v1 Deployment, ReplicaSet and DaemonSet: Kubernetes' defaulters (strategy 25%/25%,
//! replicas 1, revisionHistoryLimit 10, progressDeadlineSeconds 600, DaemonSet rolling update
//! of 1), validation (selector present, non-empty, matching the template's labels and
//! immutable; replicas >= 0; strategies), kubectl's columns, and field selectors.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetUpdateStrategy, Deployment, DeploymentStrategy, ReplicaSet,
    RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, format_labels, format_selector, meta_errors,
    meta_field, name_cell, validate_typed,
};
use super::pod::{default_template, validate_template};
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{FieldPath, NameRule, Scope};

// ---------------------------------------------------------------- defaulting

pub fn default_deployment(v: &mut Value) {
    default_typed(v, |d: &mut Deployment| {
        let spec = d.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        let strategy = spec
            .strategy
            .get_or_insert_with(DeploymentStrategy::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
        if kind == "RollingUpdate" {
            let ru = strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateDeployment::default);
            ru.max_unavailable
                .get_or_insert_with(|| IntOrString::String("25%".into()));
            ru.max_surge
                .get_or_insert_with(|| IntOrString::String("25%".into()));
        }
        spec.revision_history_limit.get_or_insert(10);
        spec.progress_deadline_seconds.get_or_insert(600);
        default_template(&mut spec.template);
    });
}

pub fn default_replica_set(v: &mut Value) {
    default_typed(v, |rs: &mut ReplicaSet| {
        let spec = rs.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        if let Some(t) = spec.template.as_mut() {
            default_template(t);
        }
    });
}

pub fn default_daemon_set(v: &mut Value) {
    default_typed(v, |ds: &mut DaemonSet| {
        let spec = ds.spec.get_or_insert_with(Default::default);
        let strategy = spec
            .update_strategy
            .get_or_insert_with(DaemonSetUpdateStrategy::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
        if kind == "RollingUpdate" {
            let ru = strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateDaemonSet::default);
            ru.max_unavailable.get_or_insert(IntOrString::Int(1));
            ru.max_surge.get_or_insert(IntOrString::Int(0));
        }
        spec.revision_history_limit.get_or_insert(10);
        default_template(&mut spec.template);
    });
}

// ---------------------------------------------------------------- validation

/// Go's rendering of a label map in messages: `map[string]string{"app":"web"}`.
fn go_map(labels: Option<&BTreeMap<String, String>>) -> String {
    let entries: Vec<String> = labels
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("\"{k}\":\"{v}\""))
        .collect();
    format!("map[string]string{{{}}}", entries.join(", "))
}

/// Go's rendering of a selector in messages: `v1.LabelSelector{MatchLabels:..., MatchExpressions:...}`.
fn go_selector(s: &metav1::LabelSelector) -> String {
    let exprs = match s.match_expressions.as_deref() {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(list) => {
            let items: Vec<String> = list
                .iter()
                .map(|r| {
                    format!(
                        "v1.LabelSelectorRequirement{{Key:\"{}\", Operator:\"{}\", Values:{:?}}}",
                        r.key,
                        r.operator,
                        r.values.clone().unwrap_or_default()
                    )
                })
                .collect();
            format!("[]v1.LabelSelectorRequirement{{{}}}", items.join(", "))
        }
    };
    format!(
        "v1.LabelSelector{{MatchLabels:{}, MatchExpressions:{exprs}}}",
        go_map(s.match_labels.as_ref())
    )
}

/// The selector of a workload: required, valid, non-empty, matching the template's labels,
/// and unchanged on update.
pub(super) fn validate_selector(
    selector: Option<&metav1::LabelSelector>,
    old: Option<Option<&metav1::LabelSelector>>,
    template: Option<&PodTemplateSpec>,
    kind: &str,
) -> Vec<FieldError> {
    let path = FieldPath::new("spec").child("selector");
    let Some(selector) = selector else {
        return vec![FieldError::required(&path)];
    };
    let mut errs = vec![];
    match LabelSelector::from_meta(selector) {
        Err(e) => errs.push(FieldError::invalid_unquoted(
            &path,
            go_selector(selector),
            &e.message,
        )),
        Ok(s) if s.is_everything() => errs.push(FieldError::invalid_unquoted(
            &path,
            go_selector(selector),
            &format!("empty selector is invalid for {kind}"),
        )),
        Ok(s) => {
            let labels = template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.as_ref());
            if !s.matches(&labels.cloned().unwrap_or_default()) {
                errs.push(FieldError::invalid_unquoted(
                    FieldPath::new("spec")
                        .child("template")
                        .child("metadata")
                        .child("labels"),
                    go_map(labels),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    if let Some(old) = old {
        if old != Some(selector) {
            errs.push(FieldError::invalid_unquoted(
                &path,
                go_selector(selector),
                "field is immutable",
            ));
        }
    }
    errs
}

pub(super) fn non_negative(errs: &mut Vec<FieldError>, path: FieldPath, value: Option<i32>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        errs.push(FieldError::invalid_number(
            path,
            v.into(),
            "must be greater than or equal to 0",
        ));
    }
}

/// An int >= 0 or a percentage string (`25%`); `max_100` caps percentages at 100%.
/// Returns the errors and whether the value is zero.
pub(super) fn int_or_percent(
    value: &IntOrString,
    path: &FieldPath,
    max_100: bool,
) -> (Vec<FieldError>, bool) {
    match value {
        IntOrString::Int(n) if *n < 0 => (
            vec![FieldError::invalid_number(
                path,
                (*n).into(),
                "must be greater than or equal to 0",
            )],
            false,
        ),
        IntOrString::Int(n) => (vec![], *n == 0),
        IntOrString::String(s) => {
            let digits = s
                .strip_suffix('%')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
            match digits.and_then(|d| d.parse::<u64>().ok()) {
                None => (
                    vec![FieldError::invalid(path, s, "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")],
                    false,
                ),
                Some(p) if max_100 && p > 100 => (
                    vec![FieldError::invalid(path, s, "must not be greater than 100%")],
                    false,
                ),
                Some(p) => (vec![], p == 0),
            }
        }
    }
}

const DEPLOYMENT_STRATEGIES: &[&str] = &["Recreate", "RollingUpdate"];
const DAEMON_SET_STRATEGIES: &[&str] = &["OnDelete", "RollingUpdate"];
pub(super) const ALWAYS: &[&str] = &["Always"];

pub fn validate_deployment(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Deployment, old: Option<&Deployment>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let spec_path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&spec_path));
            return errs;
        };
        non_negative(&mut errs, spec_path.child("replicas"), spec.replicas);
        errs.extend(validate_selector(
            present_selector(&spec.selector),
            old.map(|o| o.spec.as_ref().and_then(|s| present_selector(&s.selector))),
            Some(&spec.template),
            "deployment",
        ));
        errs.extend(validate_template(
            &spec.template,
            &spec_path.child("template"),
            ALWAYS,
        ));
        if let Some(strategy) = spec.strategy.as_ref() {
            let sp = spec_path.child("strategy");
            let kind = strategy.type_.as_deref().unwrap_or("RollingUpdate");
            if !DEPLOYMENT_STRATEGIES.contains(&kind) {
                errs.push(FieldError::not_supported(
                    sp.child("type"),
                    kind,
                    DEPLOYMENT_STRATEGIES,
                ));
            }
            if kind == "Recreate" && strategy.rolling_update.is_some() {
                errs.push(FieldError::forbidden(
                    sp.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
            if let Some(ru) = strategy.rolling_update.as_ref() {
                let rp = sp.child("rollingUpdate");
                let (e1, unavailable_zero) =
                    ru.max_unavailable.as_ref().map_or((vec![], false), |v| {
                        int_or_percent(v, &rp.child("maxUnavailable"), true)
                    });
                let (e2, surge_zero) = ru.max_surge.as_ref().map_or((vec![], false), |v| {
                    int_or_percent(v, &rp.child("maxSurge"), false)
                });
                errs.extend(e1);
                errs.extend(e2);
                if unavailable_zero && surge_zero {
                    errs.push(FieldError::invalid_number(
                        rp.child("maxUnavailable"),
                        0,
                        "may not be 0 when `maxSurge` is 0",
                    ));
                }
            }
        }
        non_negative(
            &mut errs,
            spec_path.child("revisionHistoryLimit"),
            spec.revision_history_limit,
        );
        non_negative(
            &mut errs,
            spec_path.child("minReadySeconds"),
            spec.min_ready_seconds,
        );
        if let Some(p) = spec.progress_deadline_seconds {
            if p <= spec.min_ready_seconds.unwrap_or(0) {
                errs.push(FieldError::invalid_number(
                    spec_path.child("progressDeadlineSeconds"),
                    p.into(),
                    "must be greater than minReadySeconds",
                ));
            }
        }
        errs
    })
}

pub fn validate_replica_set(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &ReplicaSet, old: Option<&ReplicaSet>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let spec_path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&spec_path));
            return errs;
        };
        non_negative(&mut errs, spec_path.child("replicas"), spec.replicas);
        non_negative(
            &mut errs,
            spec_path.child("minReadySeconds"),
            spec.min_ready_seconds,
        );
        errs.extend(validate_selector(
            present_selector(&spec.selector),
            old.map(|o| o.spec.as_ref().and_then(|s| present_selector(&s.selector))),
            spec.template.as_ref(),
            "replicaset",
        ));
        match spec.template.as_ref() {
            Some(t) => errs.extend(validate_template(t, &spec_path.child("template"), ALWAYS)),
            None if spec.replicas.unwrap_or(1) > 0 => {
                errs.push(FieldError::required(spec_path.child("template")))
            }
            None => {}
        }
        errs
    })
}

pub fn validate_daemon_set(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &DaemonSet, old: Option<&DaemonSet>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let spec_path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&spec_path));
            return errs;
        };
        errs.extend(validate_selector(
            present_selector(&spec.selector),
            old.map(|o| o.spec.as_ref().and_then(|s| present_selector(&s.selector))),
            Some(&spec.template),
            "daemonset",
        ));
        errs.extend(validate_template(
            &spec.template,
            &spec_path.child("template"),
            ALWAYS,
        ));
        if let Some(strategy) = spec.update_strategy.as_ref() {
            let kind = strategy.type_.as_deref().unwrap_or("RollingUpdate");
            if !DAEMON_SET_STRATEGIES.contains(&kind) {
                errs.push(FieldError::not_supported(
                    spec_path.child("updateStrategy").child("type"),
                    kind,
                    DAEMON_SET_STRATEGIES,
                ));
            }
        }
        non_negative(
            &mut errs,
            spec_path.child("revisionHistoryLimit"),
            spec.revision_history_limit,
        );
        errs
    })
}

/// A workload's `spec.selector`: required in the API, but k8s-openapi decodes an absent one
/// as empty; no matchLabels and no matchExpressions at all counts as absent.
pub(super) fn present_selector(s: &metav1::LabelSelector) -> Option<&metav1::LabelSelector> {
    (s.match_labels.is_some() || s.match_expressions.is_some()).then_some(s)
}

// ---------------------------------------------------------------- tables

pub(super) fn containers_and_images(t: Option<&PodTemplateSpec>) -> (Value, Value) {
    let containers = t
        .and_then(|t| t.spec.as_ref())
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers
        .iter()
        .map(|c| c.image.as_deref().unwrap_or(""))
        .collect();
    (Value::from(names.join(",")), Value::from(images.join(",")))
}

fn wide_columns() -> [TableColumnDefinition; 3] {
    [
        TableColumnDefinition::new("Containers", ColumnType::String, "Names of each container in the template.").wide(),
        TableColumnDefinition::new("Images", ColumnType::String, "Images referenced by each container in the template.").wide(),
        TableColumnDefinition::new("Selector", ColumnType::String, "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.").wide(),
    ]
}

pub fn deployment_columns() -> Vec<TableColumnDefinition> {
    let mut c = vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Ready", ColumnType::String, "Number of the pod with ready state"),
        TableColumnDefinition::new("Up-to-date", ColumnType::String, "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
        TableColumnDefinition::new("Available", ColumnType::String, "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment."),
        TableColumnDefinition::age_column(),
    ];
    c.extend(wide_columns());
    c
}

pub fn deployment_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(d) = decode::<Deployment>(v) else {
        return default_row(v, now);
    };
    let spec = d.spec.clone().unwrap_or_default();
    let status = d.status.clone().unwrap_or_default();
    let (containers, images) = containers_and_images(Some(&spec.template));
    vec![
        name_cell(&d.metadata),
        Value::from(format!(
            "{}/{}",
            status.ready_replicas.unwrap_or(0),
            spec.replicas.unwrap_or(0)
        )),
        Value::from(status.updated_replicas.unwrap_or(0)),
        Value::from(status.available_replicas.unwrap_or(0)),
        age_cell(&d.metadata, now),
        containers,
        images,
        Value::from(format_selector(present_selector(&spec.selector))),
    ]
}

pub fn replica_set_columns() -> Vec<TableColumnDefinition> {
    let mut c = vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Desired",
            ColumnType::Integer,
            "Replicas is the number of desired pods.",
        ),
        TableColumnDefinition::new(
            "Current",
            ColumnType::Integer,
            "Replicas is the most recently observed number of replicas.",
        ),
        TableColumnDefinition::new(
            "Ready",
            ColumnType::Integer,
            "The number of ready replicas for this replica set.",
        ),
        TableColumnDefinition::age_column(),
    ];
    c.extend(wide_columns());
    c
}

pub fn replica_set_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(rs) = decode::<ReplicaSet>(v) else {
        return default_row(v, now);
    };
    let spec = rs.spec.clone().unwrap_or_default();
    let status = rs.status.clone().unwrap_or_default();
    let (containers, images) = containers_and_images(spec.template.as_ref());
    vec![
        name_cell(&rs.metadata),
        Value::from(spec.replicas.unwrap_or(0)),
        Value::from(status.replicas),
        Value::from(status.ready_replicas.unwrap_or(0)),
        age_cell(&rs.metadata, now),
        containers,
        images,
        Value::from(format_selector(Some(&spec.selector))),
    ]
}

pub fn daemon_set_columns() -> Vec<TableColumnDefinition> {
    use ColumnType::Integer as I;
    let mut c = vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Desired", I, "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod)."),
        TableColumnDefinition::new("Current", I, "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod."),
        TableColumnDefinition::new("Ready", I, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
        TableColumnDefinition::new("Up-to-date", I, "The total number of nodes that are running updated daemon pod"),
        TableColumnDefinition::new("Available", I, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
        TableColumnDefinition::new("Node Selector", ColumnType::String, "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node."),
        TableColumnDefinition::age_column(),
    ];
    c.extend(wide_columns());
    c
}

pub fn daemon_set_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(ds) = decode::<DaemonSet>(v) else {
        return default_row(v, now);
    };
    let spec = ds.spec.clone().unwrap_or_default();
    let status = ds.status.clone().unwrap_or_default();
    let (containers, images) = containers_and_images(Some(&spec.template));
    let node_selector = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref());
    vec![
        name_cell(&ds.metadata),
        Value::from(status.desired_number_scheduled),
        Value::from(status.current_number_scheduled),
        Value::from(status.number_ready),
        Value::from(status.updated_number_scheduled.unwrap_or(0)),
        Value::from(status.number_available.unwrap_or(0)),
        Value::from(format_labels(node_selector)),
        age_cell(&ds.metadata, now),
        containers,
        images,
        Value::from(format_selector(Some(&spec.selector))),
    ]
}

// ---------------------------------------------------------------- field selectors

pub fn replica_set_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "status.replicas" => Some(
            v.pointer("/status/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                .to_string(),
        ),
        _ => meta_field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    /// What `kubectl create deployment web --image=nginx:1.27 --replicas=3` sends.
    fn created() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "creationTimestamp": "2025-01-01T11:55:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "strategy": {},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27", "resources": {}}]}}},
            "status": {}})
    }

    fn errors(v: &Value, old: Option<&Value>) -> Vec<String> {
        validate_deployment(v, old)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn deployment_defaults() {
        let mut v = created();
        v["spec"].as_object_mut().unwrap().remove("replicas");
        default_deployment(&mut v);
        let spec = &v["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        );
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
        assert!(
            pod.get("tolerations").is_none(),
            "admission defaults are for pods, not templates"
        );
        let mut recreate = created();
        recreate["spec"]["strategy"] = json!({"type": "Recreate"});
        default_deployment(&mut recreate);
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));
        assert!(errors(&recreate, None).is_empty());
    }

    #[test]
    fn deployment_validation_messages() {
        let mut v = created();
        default_deployment(&mut v);
        assert!(errors(&v, None).is_empty());

        let mut bad = v.clone();
        bad["spec"]["replicas"] = json!(-1);
        bad["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
        bad["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        bad["spec"]["strategy"]["rollingUpdate"] = json!({"maxSurge": 0, "maxUnavailable": "0%"});
        let errs = errors(&bad, None);
        assert_eq!(
            errs,
            vec![
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
            ]
        );

        let mut no_selector = v.clone();
        no_selector["spec"]
            .as_object_mut()
            .unwrap()
            .remove("selector");
        assert_eq!(
            errors(&no_selector, None)[0],
            "spec.selector: Required value"
        );
        let mut empty = v.clone();
        empty["spec"]["selector"] = json!({"matchLabels": {}});
        assert!(errors(&empty, None)[0].ends_with("empty selector is invalid for deployment"));

        let mut moved = v.clone();
        moved["spec"]["selector"] = json!({"matchLabels": {"app": "web", "tier": "x"}});
        moved["spec"]["template"]["metadata"]["labels"]["tier"] = json!("x");
        let errs = errors(&moved, Some(&v));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"app\":\"web\", \"tier\":\"x\"}"));
        assert!(errs[0].ends_with("field is immutable"));
        let mut scaled = v.clone();
        scaled["spec"]["replicas"] = json!(5);
        assert!(errors(&scaled, Some(&v)).is_empty());
    }

    #[test]
    fn deployment_row_like_kubectl() {
        let mut v = created();
        v["status"] = json!({"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2});
        // NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR
        assert_eq!(
            deployment_row(&v, now()),
            vec![
                json!("web"),
                json!("2/3"),
                json!(3),
                json!(2),
                json!("5m"),
                json!("nginx"),
                json!("nginx:1.27"),
                json!("app=web")
            ]
        );
        let names: Vec<String> = deployment_columns()
            .into_iter()
            .filter(|c| c.priority == 0)
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["Name", "Ready", "Up-to-date", "Available", "Age"]);
    }

    fn replica_set() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-7d9c", "namespace": "default", "creationTimestamp": "2025-01-01T09:00:00Z"},
            "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "7d9c"}},
                "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "7d9c"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}, {"name": "side", "image": "busybox"}]}}},
            "status": {"replicas": 3, "readyReplicas": 3}})
    }

    #[test]
    fn replica_sets() {
        let mut v = replica_set();
        default_replica_set(&mut v);
        assert_eq!(v["spec"]["replicas"], 1);
        assert!(validate_replica_set(&v, None).is_empty());
        // NAME DESIRED CURRENT READY AGE CONTAINERS IMAGES SELECTOR
        assert_eq!(
            replica_set_row(&v, now()),
            vec![
                json!("web-7d9c"),
                json!(1),
                json!(3),
                json!(3),
                json!("3h"),
                json!("nginx,side"),
                json!("nginx:1.27,busybox"),
                json!("app=web,pod-template-hash=7d9c")
            ]
        );
        assert_eq!(
            replica_set_field(&v, "status.replicas").as_deref(),
            Some("3")
        );
        assert_eq!(
            replica_set_field(&json!({}), "status.replicas").as_deref(),
            Some("0")
        );
        let mut neg = v.clone();
        neg["spec"]["replicas"] = json!(-2);
        assert_eq!(
            validate_replica_set(&neg, Some(&v))[0].message,
            "Invalid value: -2: must be greater than or equal to 0"
        );
    }

    #[test]
    fn daemon_sets() {
        let mut v = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "proxy", "namespace": "kube-system", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": {"selector": {"matchLabels": {"app": "proxy"}},
                "template": {"metadata": {"labels": {"app": "proxy"}},
                    "spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "hostNetwork": true,
                        "containers": [{"name": "proxy", "image": "skiff/proxy:v1", "ports": [{"containerPort": 10256}]}]}}},
            "status": {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1, "updatedNumberScheduled": 2, "numberAvailable": 1, "numberMisscheduled": 0}});
        default_daemon_set(&mut v);
        assert_eq!(
            v["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"],
            10256
        );
        assert!(validate_daemon_set(&v, None).is_empty());
        // NAME DESIRED CURRENT READY UP-TO-DATE AVAILABLE NODE SELECTOR AGE
        assert_eq!(
            &daemon_set_row(&v, now())[..8],
            &[
                json!("proxy"),
                json!(2),
                json!(2),
                json!(1),
                json!(2),
                json!(1),
                json!("kubernetes.io/os=linux"),
                json!("60m")
            ]
        );
        let mut bad = v.clone();
        bad["spec"]["updateStrategy"]["type"] = json!("Surge");
        assert_eq!(
            validate_daemon_set(&bad, None)[0].field,
            "spec.updateStrategy.type"
        );
    }
}
