//! autoscaling/v2 HorizontalPodAutoscaler (stored) and its autoscaling/v1 view (what
//! `kubectl autoscale` posts): Kubernetes' defaults (minReplicas 1, a CPU target of 80%, the
//! behavior's default rules when a behavior is given), validation with Kubernetes' field paths
//! and messages, kubectl's columns (NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE) and
//! the conversion between the two versions. As in Kubernetes, what v1 cannot say (metrics
//! other than the CPU utilization, the behavior, conditions) rides in
//! `autoscaling.alpha.kubernetes.io/*` annotations of the v1 object, so a v1 round trip loses
//! nothing; a v1 object is validated and printed as its v2 form (field paths are v2's, as
//! Kubernetes validates the internal version).

use k8s_openapi::api::autoscaling::v1;
use k8s_openapi::api::autoscaling::v2;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::common::{age_cell, decode, default_row, default_typed, meta_errors, name_cell};
use crate::machinery::quantity::Quantity;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{NameRule, Scope};

pub const GROUP: &str = "autoscaling";

/// The CPU utilization target of an HPA that names no metric (Kubernetes'
/// DefaultCPUUtilization).
pub const DEFAULT_CPU_UTILIZATION: i32 = 80;

/// The longest stabilization window and policy period Kubernetes accepts.
const MAX_WINDOW_SECONDS: i32 = 3600;
const MAX_PERIOD_SECONDS: i32 = 1800;

pub const UTILIZATION: &str = "Utilization";
pub const AVERAGE_VALUE: &str = "AverageValue";
pub const VALUE: &str = "Value";
const TARGET_TYPES: &[&str] = &[UTILIZATION, VALUE, AVERAGE_VALUE];
const METRIC_TYPES: &[&str] = &[
    "Object",
    "Pods",
    "Resource",
    "ContainerResource",
    "External",
];
pub const SELECT_MAX: &str = "Max";
pub const SELECT_MIN: &str = "Min";
pub const SELECT_DISABLED: &str = "Disabled";
const SELECT_POLICIES: &[&str] = &[SELECT_MAX, SELECT_MIN, SELECT_DISABLED];
pub const POLICY_PODS: &str = "Pods";
pub const POLICY_PERCENT: &str = "Percent";
const POLICY_TYPES: &[&str] = &[POLICY_PODS, POLICY_PERCENT];

/// The v1 annotations that carry what v1 has no field for (Kubernetes' names).
const METRICS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/metrics";
const CURRENT_METRICS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/behavior";

fn policy(type_: &str, value: i32, period_seconds: i32) -> v2::HPAScalingPolicy {
    v2::HPAScalingPolicy {
        type_: type_.into(),
        value,
        period_seconds,
    }
}

/// Kubernetes' GenerateHPAScaleUpRules: no window, at most 4 pods or 100% per 15 s, the
/// larger.
pub fn scale_up_rules(given: Option<v2::HPAScalingRules>) -> v2::HPAScalingRules {
    let mut r = given.unwrap_or_default();
    r.stabilization_window_seconds.get_or_insert(0);
    r.select_policy.get_or_insert_with(|| SELECT_MAX.into());
    r.policies
        .get_or_insert_with(|| vec![policy(POLICY_PODS, 4, 15), policy(POLICY_PERCENT, 100, 15)]);
    r
}

/// Kubernetes' GenerateHPAScaleDownRules: a 300 s window, at most 100% per 15 s.
pub fn scale_down_rules(given: Option<v2::HPAScalingRules>) -> v2::HPAScalingRules {
    let mut r = given.unwrap_or_default();
    r.stabilization_window_seconds.get_or_insert(300);
    r.select_policy.get_or_insert_with(|| SELECT_MAX.into());
    r.policies
        .get_or_insert_with(|| vec![policy(POLICY_PERCENT, 100, 15)]);
    r
}

fn cpu_utilization(percent: i32) -> v2::MetricSpec {
    v2::MetricSpec {
        type_: "Resource".into(),
        resource: Some(v2::ResourceMetricSource {
            name: "cpu".into(),
            target: v2::MetricTarget {
                type_: UTILIZATION.into(),
                average_utilization: Some(percent),
                ..Default::default()
            },
        }),
        ..Default::default()
    }
}

/// Kubernetes' v2 defaulter.
pub fn default_hpa(hpa: &mut v2::HorizontalPodAutoscaler) {
    let Some(spec) = hpa.spec.as_mut() else {
        return;
    };
    spec.min_replicas.get_or_insert(1);
    if spec.metrics.as_ref().is_none_or(Vec::is_empty) {
        spec.metrics = Some(vec![cpu_utilization(DEFAULT_CPU_UTILIZATION)]);
    }
    if let Some(b) = spec.behavior.as_mut() {
        b.scale_up = Some(scale_up_rules(b.scale_up.take()));
        b.scale_down = Some(scale_down_rules(b.scale_down.take()));
    }
}

pub fn default(v: &mut Value) {
    default_typed(v, default_hpa);
}

/// v1's defaulter: minReplicas only (the CPU target defaults on the way to storage).
pub fn default_v1(v: &mut Value) {
    default_typed(v, |hpa: &mut v1::HorizontalPodAutoscaler| {
        if let Some(spec) = hpa.spec.as_mut() {
            spec.min_replicas.get_or_insert(1);
        }
    });
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let new: v2::HorizontalPodAutoscaler = match decode(new) {
        Ok(h) => h,
        Err(e) => return vec![e],
    };
    let old: Option<v2::HorizontalPodAutoscaler> = old.and_then(|o| decode(o).ok());
    validate_hpa(&new, old.as_ref())
}

/// A v1 object is validated as the v2 object it is stored as.
pub fn validate_v1(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let new = match v1_value_to_v2(new.clone()) {
        Ok(v) => v,
        Err(e) => return vec![e],
    };
    let old = old.and_then(|o| v1_value_to_v2(o.clone()).ok());
    validate(&new, old.as_ref())
}

fn validate_hpa(
    new: &v2::HorizontalPodAutoscaler,
    old: Option<&v2::HorizontalPodAutoscaler>,
) -> Vec<FieldError> {
    let mut errs = meta_errors(
        &new.metadata,
        old.map(|o| &o.metadata),
        Scope::Namespaced,
        NameRule::Dns1123Subdomain,
    );
    let Some(spec) = new.spec.as_ref() else {
        errs.push(FieldError::required("spec"));
        return errs;
    };
    let min = spec.min_replicas;
    if let Some(m) = min.filter(|m| *m < 1) {
        errs.push(FieldError::invalid_number(
            "spec.minReplicas",
            m.into(),
            "must be greater than or equal to 1",
        ));
    }
    if spec.max_replicas < 1 {
        errs.push(FieldError::invalid_number(
            "spec.maxReplicas",
            spec.max_replicas.into(),
            "must be greater than 0",
        ));
    }
    if min.is_some_and(|m| spec.max_replicas < m) {
        errs.push(FieldError::invalid_number(
            "spec.maxReplicas",
            spec.max_replicas.into(),
            "must be greater than or equal to `minReplicas`",
        ));
    }
    let target = &spec.scale_target_ref;
    if target.kind.is_empty() {
        errs.push(FieldError::required("spec.scaleTargetRef.kind"));
    } else if let Some(why) = path_segment_error(&target.kind) {
        errs.push(FieldError::invalid(
            "spec.scaleTargetRef.kind",
            &target.kind,
            why,
        ));
    }
    if target.name.is_empty() {
        errs.push(FieldError::required("spec.scaleTargetRef.name"));
    } else if let Some(why) = path_segment_error(&target.name) {
        errs.push(FieldError::invalid(
            "spec.scaleTargetRef.name",
            &target.name,
            why,
        ));
    }
    for (i, m) in spec.metrics.iter().flatten().enumerate() {
        metric_errors(&format!("spec.metrics[{i}]"), m, &mut errs);
    }
    if let Some(b) = spec.behavior.as_ref() {
        for (name, rules) in [("scaleUp", &b.scale_up), ("scaleDown", &b.scale_down)] {
            if let Some(r) = rules {
                rules_errors(&format!("spec.behavior.{name}"), r, &mut errs);
            }
        }
    }
    if let Some(s) = new.status.as_ref() {
        if s.desired_replicas < 0 {
            errs.push(FieldError::invalid_number(
                "status.desiredReplicas",
                s.desired_replicas.into(),
                "must be greater than or equal to 0",
            ));
        }
        if let Some(c) = s.current_replicas.filter(|c| *c < 0) {
            errs.push(FieldError::invalid_number(
                "status.currentReplicas",
                c.into(),
                "must be greater than or equal to 0",
            ));
        }
    }
    errs
}

/// Kubernetes' IsValidPathSegmentName.
fn path_segment_error(s: &str) -> Option<&'static str> {
    if s == "." || s == ".." {
        return Some("may not be '.' or '..'");
    }
    if s.contains('/') {
        return Some("may not contain '/'");
    }
    if s.contains('%') {
        return Some("may not contain '%'");
    }
    None
}

fn metric_errors(path: &str, m: &v2::MetricSpec, errs: &mut Vec<FieldError>) {
    if m.type_.is_empty() {
        errs.push(FieldError::required_because(
            format!("{path}.type"),
            "must specify a metric source type",
        ));
        return;
    }
    if !METRIC_TYPES.contains(&m.type_.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{path}.type"),
            &m.type_,
            METRIC_TYPES,
        ));
        return;
    }
    let given = [
        ("object", m.object.is_some()),
        ("pods", m.pods.is_some()),
        ("resource", m.resource.is_some()),
        ("containerResource", m.container_resource.is_some()),
        ("external", m.external.is_some()),
    ];
    let want = lower_first(&m.type_);
    for (field, set) in given {
        if set && field != want {
            errs.push(FieldError::forbidden(
                format!("{path}.{field}"),
                "must populate the given metric source only",
            ));
        }
    }
    if !given.iter().any(|(f, set)| *set && *f == want) {
        errs.push(FieldError::required_because(
            format!("{path}.{want}"),
            "must populate information for the given metric source",
        ));
        return;
    }
    let (name, target, field) = match (&m.resource, &m.container_resource) {
        (Some(r), _) => (&r.name, &r.target, "resource"),
        (_, Some(c)) => {
            if c.container.is_empty() {
                errs.push(FieldError::required_because(
                    format!("{path}.containerResource.container"),
                    "must populate container",
                ));
            }
            (&c.name, &c.target, "containerResource")
        }
        // Object, Pods and External metrics are stored; only resource metrics are computed.
        _ => return,
    };
    let at = format!("{path}.{field}");
    if name.is_empty() {
        errs.push(FieldError::required_because(
            format!("{at}.name"),
            "must specify a resource name",
        ));
    }
    target_errors(&format!("{at}.target"), target, errs);
    if target.average_utilization.is_none() && target.average_value.is_none() {
        errs.push(FieldError::required_because(
            format!("{at}.target.averageUtilization"),
            "must set either a target raw value or a target utilization",
        ));
    }
    if target.average_utilization.is_some() && target.average_value.is_some() {
        errs.push(FieldError::forbidden(
            format!("{at}.target.averageValue"),
            "may not set both a target raw value and a target utilization",
        ));
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_ascii_lowercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// Kubernetes' validateMetricTarget.
fn target_errors(path: &str, t: &v2::MetricTarget, errs: &mut Vec<FieldError>) {
    if t.type_.is_empty() {
        errs.push(FieldError::required_because(
            format!("{path}.type"),
            "must specify a metric target type",
        ));
    } else if !TARGET_TYPES.contains(&t.type_.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{path}.type"),
            &t.type_,
            TARGET_TYPES,
        ));
    }
    if let Some(u) = t.average_utilization.filter(|u| *u <= 0) {
        errs.push(FieldError::invalid_number(
            format!("{path}.averageUtilization"),
            u.into(),
            "must be greater than 0",
        ));
    }
    for (field, q) in [("averageValue", &t.average_value), ("value", &t.value)] {
        let Some(q) = q else { continue };
        match Quantity::try_from(q) {
            Ok(parsed) if parsed.milli_value() > 0 => {}
            Ok(_) => errs.push(FieldError::invalid(
                format!("{path}.{field}"),
                &q.0,
                "must be positive",
            )),
            Err(_) => errs.push(FieldError::invalid(
                format!("{path}.{field}"),
                &q.0,
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            )),
        }
    }
    let populated = match t.type_.as_str() {
        UTILIZATION => t.average_utilization.is_some(),
        AVERAGE_VALUE => t.average_value.is_some(),
        VALUE => t.value.is_some(),
        _ => true,
    };
    if !populated {
        errs.push(FieldError::required_because(
            path.to_string(),
            "must populate the given metric target type",
        ));
    }
}

/// Kubernetes' validateScalingRules.
fn rules_errors(path: &str, r: &v2::HPAScalingRules, errs: &mut Vec<FieldError>) {
    if let Some(w) = r.stabilization_window_seconds {
        if w < 0 {
            errs.push(FieldError::invalid_number(
                format!("{path}.stabilizationWindowSeconds"),
                w.into(),
                "must be greater than or equal to zero",
            ));
        } else if w > MAX_WINDOW_SECONDS {
            errs.push(FieldError::invalid_number(
                format!("{path}.stabilizationWindowSeconds"),
                w.into(),
                &format!("must be less than or equal to {MAX_WINDOW_SECONDS}"),
            ));
        }
    }
    if let Some(p) = r
        .select_policy
        .as_deref()
        .filter(|p| !SELECT_POLICIES.contains(p))
    {
        errs.push(FieldError::not_supported(
            format!("{path}.selectPolicy"),
            p,
            SELECT_POLICIES,
        ));
    }
    let policies = r.policies.as_deref().unwrap_or_default();
    if policies.is_empty() {
        errs.push(FieldError::required_because(
            format!("{path}.policies"),
            "must specify at least one Policy",
        ));
    }
    for (i, p) in policies.iter().enumerate() {
        let at = format!("{path}.policies[{i}]");
        if !POLICY_TYPES.contains(&p.type_.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{at}.type"),
                &p.type_,
                POLICY_TYPES,
            ));
        }
        if p.value <= 0 {
            errs.push(FieldError::invalid_number(
                format!("{at}.value"),
                p.value.into(),
                "must be greater than zero",
            ));
        }
        if p.period_seconds <= 0 {
            errs.push(FieldError::invalid_number(
                format!("{at}.periodSeconds"),
                p.period_seconds.into(),
                "must be greater than zero",
            ));
        } else if p.period_seconds > MAX_PERIOD_SECONDS {
            errs.push(FieldError::invalid_number(
                format!("{at}.periodSeconds"),
                p.period_seconds.into(),
                &format!("must be less than or equal to {MAX_PERIOD_SECONDS}"),
            ));
        }
    }
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Reference",
            ColumnType::String,
            "scaleTargetRef points to the target resource to scale, and is used to the pods for which metrics should be collected, as well as to actually change the replica count.",
        ),
        TableColumnDefinition::new(
            "Targets",
            ColumnType::String,
            "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).",
        ),
        TableColumnDefinition::new(
            "MinPods",
            ColumnType::String,
            "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.",
        ),
        TableColumnDefinition::new(
            "MaxPods",
            ColumnType::String,
            "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up.",
        ),
        TableColumnDefinition::new(
            "Replicas",
            ColumnType::String,
            "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(hpa) = decode::<v2::HorizontalPodAutoscaler>(v) else {
        return default_row(v, now);
    };
    let spec = hpa.spec.clone().unwrap_or_default();
    let status = hpa.status.clone().unwrap_or_default();
    vec![
        name_cell(&hpa.metadata),
        Value::from(format!(
            "{}/{}",
            spec.scale_target_ref.kind, spec.scale_target_ref.name
        )),
        Value::from(format_metrics(
            spec.metrics.as_deref().unwrap_or_default(),
            status.current_metrics.as_deref().unwrap_or_default(),
        )),
        Value::from(
            spec.min_replicas
                .map_or_else(|| "<unset>".to_string(), |m| m.to_string()),
        ),
        Value::from(spec.max_replicas),
        Value::from(status.current_replicas.unwrap_or(0)),
        age_cell(&hpa.metadata, now),
    ]
}

pub fn row_v1(v: &Value, now: Timestamp) -> Vec<Value> {
    match v1_value_to_v2(v.clone()) {
        Ok(v2) => row(&v2, now),
        Err(_) => default_row(v, now),
    }
}

fn quantity_text(q: &Option<KQuantity>) -> String {
    q.as_ref().map_or_else(
        || "<unknown>".to_string(),
        |q| Quantity::try_from(q).map_or_else(|_| q.0.clone(), |p| p.to_string()),
    )
}

/// kubectl's formatHPAMetrics: `cpu: 45%/50%`, `memory: <unknown>/100Mi`, at most two
/// metrics and then `+ N more...`.
pub fn format_metrics(specs: &[v2::MetricSpec], statuses: &[v2::MetricStatus]) -> String {
    if specs.is_empty() {
        return "<none>".into();
    }
    const MAX: usize = 2;
    let mut list = Vec::new();
    let mut count = 0;
    let mut more = false;
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let text = match (
            spec.type_.as_str(),
            &spec.resource,
            &spec.container_resource,
        ) {
            ("Resource", Some(r), _) => {
                let current = status.and_then(|s| s.resource.as_ref()).map(|s| &s.current);
                Some(target_text(&r.name, &r.target, current))
            }
            ("ContainerResource", _, Some(c)) => {
                let current = status
                    .and_then(|s| s.container_resource.as_ref())
                    .map(|s| &s.current);
                Some(target_text(&c.name, &c.target, current))
            }
            _ => None,
        };
        list.push(text.unwrap_or_else(|| "<unknown>".into()));
        if list.len() > MAX {
            list.truncate(MAX);
            more = true;
            break;
        }
        count += 1;
    }
    let out = list.join(", ");
    if more {
        format!("{out} + {} more...", specs.len() - count)
    } else {
        out
    }
}

fn target_text(
    name: &str,
    target: &v2::MetricTarget,
    current: Option<&v2::MetricValueStatus>,
) -> String {
    if target.average_value.is_some() {
        let cur = current
            .map(|c| quantity_text(&c.average_value))
            .unwrap_or_else(|| "<unknown>".into());
        return format!("{name}: {cur}/{}", quantity_text(&target.average_value));
    }
    let cur = current
        .and_then(|c| c.average_utilization)
        .map_or_else(|| "<unknown>".to_string(), |u| format!("{u}%"));
    let want = target
        .average_utilization
        .map_or_else(|| "<auto>".to_string(), |u| format!("{u}%"));
    format!("{name}: {cur}/{want}")
}

fn is_cpu_utilization(m: &v2::MetricSpec) -> Option<i32> {
    let r = m.resource.as_ref().filter(|_| m.type_ == "Resource")?;
    (r.name == "cpu" && r.target.type_ == UTILIZATION)
        .then_some(r.target.average_utilization)
        .flatten()
}

fn annotation<T: serde::de::DeserializeOwned>(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Result<Option<T>, FieldError> {
    let Some(text) = meta.annotations.as_mut().and_then(|a| a.remove(key)) else {
        return Ok(None);
    };
    if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    serde_json::from_str(&text).map(Some).map_err(|e| {
        FieldError::invalid(
            format!("metadata.annotations[{key}]"),
            &text,
            &format!("does not decode: {e}"),
        )
    })
}

fn set_annotation<T: serde::Serialize>(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
    value: &T,
) {
    if let Ok(text) = serde_json::to_string(value) {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), text);
    }
}

/// autoscaling/v1 to v2, as Kubernetes' conversion: the CPU target first, then the metrics the
/// v1 annotation carries; behavior and status conditions from their annotations.
pub fn v1_to_v2(
    mut hpa: v1::HorizontalPodAutoscaler,
) -> Result<v2::HorizontalPodAutoscaler, FieldError> {
    let extra: Option<Vec<v2::MetricSpec>> = annotation(&mut hpa.metadata, METRICS_ANNOTATION)?;
    let behavior: Option<v2::HorizontalPodAutoscalerBehavior> =
        annotation(&mut hpa.metadata, BEHAVIOR_ANNOTATION)?;
    let conditions: Option<Vec<v2::HorizontalPodAutoscalerCondition>> =
        annotation(&mut hpa.metadata, CONDITIONS_ANNOTATION)?;
    let current_extra: Option<Vec<v2::MetricStatus>> =
        annotation(&mut hpa.metadata, CURRENT_METRICS_ANNOTATION)?;
    let spec = hpa.spec.map(|s| {
        let mut metrics: Vec<v2::MetricSpec> = s
            .target_cpu_utilization_percentage
            .map(cpu_utilization)
            .into_iter()
            .collect();
        metrics.extend(extra.unwrap_or_default());
        v2::HorizontalPodAutoscalerSpec {
            behavior,
            max_replicas: s.max_replicas,
            metrics: (!metrics.is_empty()).then_some(metrics),
            min_replicas: s.min_replicas,
            scale_target_ref: v2::CrossVersionObjectReference {
                api_version: s.scale_target_ref.api_version,
                kind: s.scale_target_ref.kind,
                name: s.scale_target_ref.name,
            },
        }
    });
    let status = hpa.status.map(|s| {
        let mut current: Vec<v2::MetricStatus> = s
            .current_cpu_utilization_percentage
            .map(|u| v2::MetricStatus {
                type_: "Resource".into(),
                resource: Some(v2::ResourceMetricStatus {
                    name: "cpu".into(),
                    current: v2::MetricValueStatus {
                        average_utilization: Some(u),
                        ..Default::default()
                    },
                }),
                ..Default::default()
            })
            .into_iter()
            .collect();
        current.extend(current_extra.unwrap_or_default());
        v2::HorizontalPodAutoscalerStatus {
            conditions,
            current_metrics: (!current.is_empty()).then_some(current),
            current_replicas: Some(s.current_replicas),
            desired_replicas: s.desired_replicas,
            last_scale_time: s.last_scale_time,
            observed_generation: s.observed_generation,
        }
    });
    Ok(v2::HorizontalPodAutoscaler {
        metadata: hpa.metadata,
        spec,
        status,
    })
}

/// autoscaling/v2 to v1: the first CPU utilization target becomes
/// targetCPUUtilizationPercentage, everything else rides in annotations.
pub fn v2_to_v1(mut hpa: v2::HorizontalPodAutoscaler) -> v1::HorizontalPodAutoscaler {
    let spec = hpa.spec.take().map(|s| {
        let metrics = s.metrics.unwrap_or_default();
        let cpu = metrics.iter().position(|m| is_cpu_utilization(m).is_some());
        let target = cpu.and_then(|i| is_cpu_utilization(&metrics[i]));
        let rest: Vec<v2::MetricSpec> = metrics
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != cpu)
            .map(|(_, m)| m)
            .collect();
        if !rest.is_empty() {
            set_annotation(&mut hpa.metadata, METRICS_ANNOTATION, &rest);
        }
        if let Some(b) = s.behavior.as_ref() {
            set_annotation(&mut hpa.metadata, BEHAVIOR_ANNOTATION, b);
        }
        v1::HorizontalPodAutoscalerSpec {
            max_replicas: s.max_replicas,
            min_replicas: s.min_replicas,
            scale_target_ref: v1::CrossVersionObjectReference {
                api_version: s.scale_target_ref.api_version,
                kind: s.scale_target_ref.kind,
                name: s.scale_target_ref.name,
            },
            target_cpu_utilization_percentage: target,
        }
    });
    let status = hpa.status.take().map(|s| {
        let current = s.current_metrics.unwrap_or_default();
        let cpu = current.iter().position(|m| {
            m.resource
                .as_ref()
                .is_some_and(|r| r.name == "cpu" && r.current.average_utilization.is_some())
        });
        let utilization = cpu.and_then(|i| {
            current[i]
                .resource
                .as_ref()
                .and_then(|r| r.current.average_utilization)
        });
        let rest: Vec<v2::MetricStatus> = current
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != cpu)
            .map(|(_, m)| m)
            .collect();
        if !rest.is_empty() {
            set_annotation(&mut hpa.metadata, CURRENT_METRICS_ANNOTATION, &rest);
        }
        if let Some(c) = s.conditions.as_ref().filter(|c| !c.is_empty()) {
            set_annotation(&mut hpa.metadata, CONDITIONS_ANNOTATION, c);
        }
        v1::HorizontalPodAutoscalerStatus {
            current_cpu_utilization_percentage: utilization,
            current_replicas: s.current_replicas.unwrap_or(0),
            desired_replicas: s.desired_replicas,
            last_scale_time: s.last_scale_time,
            observed_generation: s.observed_generation,
        }
    });
    v1::HorizontalPodAutoscaler {
        metadata: hpa.metadata,
        spec,
        status,
    }
}

/// A v1 object's JSON as the v2 object stored for it (with v2's defaults, which Kubernetes
/// applies when it reads the stored object).
pub fn v1_value_to_v2(v: Value) -> Result<Value, FieldError> {
    let hpa: v1::HorizontalPodAutoscaler = decode(&v)?;
    let mut out = v1_to_v2(hpa)?;
    default_hpa(&mut out);
    let mut value =
        serde_json::to_value(out).map_err(|e| FieldError::invalid("", "", &e.to_string()))?;
    value["apiVersion"] = json!("autoscaling/v2");
    value["kind"] = json!("HorizontalPodAutoscaler");
    Ok(value)
}

/// A stored v2 object's JSON as the v1 view serves it.
pub fn v2_value_to_v1(v: Value) -> Result<Value, FieldError> {
    let hpa: v2::HorizontalPodAutoscaler = decode(&v)?;
    let mut value = serde_json::to_value(v2_to_v1(hpa))
        .map_err(|e| FieldError::invalid("", "", &e.to_string()))?;
    value["apiVersion"] = json!("autoscaling/v1");
    value["kind"] = json!("HorizontalPodAutoscaler");
    Ok(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn minimal(name: &str) -> Value {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "maxReplicas": 5}})
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn defaults_as_kubernetes() {
        let mut v = minimal("web");
        default(&mut v);
        assert_eq!(v["spec"]["minReplicas"], 1);
        assert_eq!(
            v["spec"]["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 80}}}])
        );
        assert!(v["spec"].get("behavior").is_none());
        v["spec"]["behavior"] = json!({"scaleDown": {"stabilizationWindowSeconds": 60}});
        default(&mut v);
        let b = &v["spec"]["behavior"];
        assert_eq!(b["scaleDown"]["stabilizationWindowSeconds"], 60);
        assert_eq!(b["scaleDown"]["selectPolicy"], "Max");
        assert_eq!(
            b["scaleDown"]["policies"],
            json!([{"type": "Percent", "value": 100, "periodSeconds": 15}])
        );
        assert_eq!(b["scaleUp"]["stabilizationWindowSeconds"], 0);
        assert_eq!(
            b["scaleUp"]["policies"],
            json!([{"type": "Pods", "value": 4, "periodSeconds": 15},
                   {"type": "Percent", "value": 100, "periodSeconds": 15}])
        );
        assert!(validate(&v, None).is_empty(), "{:?}", validate(&v, None));
    }

    #[test]
    fn validation_names_the_fields() {
        let mut v = minimal("web");
        v["spec"]["minReplicas"] = json!(0);
        v["spec"]["maxReplicas"] = json!(0);
        assert_eq!(
            messages(&validate(&v, None)),
            vec![
                "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1",
                "spec.maxReplicas: Invalid value: 0: must be greater than 0",
            ]
        );
        v["spec"]["minReplicas"] = json!(6);
        v["spec"]["maxReplicas"] = json!(5);
        assert_eq!(
            messages(&validate(&v, None)),
            vec!["spec.maxReplicas: Invalid value: 5: must be greater than or equal to `minReplicas`"]
        );
        let mut v = minimal("web");
        v["spec"]["scaleTargetRef"]["kind"] = json!("");
        v["spec"]["metrics"] = json!([
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "Utilization"}}},
            {"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 0}}},
            {"type": "Pods"},
        ]);
        v["spec"]["behavior"] = json!({"scaleUp": {"selectPolicy": "Most",
            "policies": [{"type": "Pods", "value": 0, "periodSeconds": 1801}]},
            "scaleDown": {"stabilizationWindowSeconds": 3601, "policies": []}});
        assert_eq!(
            messages(&validate(&v, None)),
            vec![
                "spec.scaleTargetRef.kind: Required value",
                "spec.metrics[0].resource.target: Required value: must populate the given metric target type",
                "spec.metrics[0].resource.target.averageUtilization: Required value: must set either a target raw value or a target utilization",
                "spec.metrics[1].resource.target.averageUtilization: Invalid value: 0: must be greater than 0",
                "spec.metrics[2].pods: Required value: must populate information for the given metric source",
                "spec.behavior.scaleUp.selectPolicy: Unsupported value: \"Most\": supported values: \"Max\", \"Min\", \"Disabled\"",
                "spec.behavior.scaleUp.policies[0].value: Invalid value: 0: must be greater than zero",
                "spec.behavior.scaleUp.policies[0].periodSeconds: Invalid value: 1801: must be less than or equal to 1800",
                "spec.behavior.scaleDown.stabilizationWindowSeconds: Invalid value: 3601: must be less than or equal to 3600",
                "spec.behavior.scaleDown.policies: Required value: must specify at least one Policy",
            ]
        );
    }

    #[test]
    fn targets_column_as_kubectl() {
        let mut v = minimal("web");
        default(&mut v);
        let now: Timestamp = "2025-01-01T12:00:00Z".parse().unwrap();
        let cells = row(&v, now);
        assert_eq!(cells[1], "Deployment/web");
        assert_eq!(cells[2], "cpu: <unknown>/80%");
        assert_eq!(cells[3], "1");
        assert_eq!(cells[4], 5);
        assert_eq!(cells[5], 0);
        assert_eq!(cells[6], "60m");
        v["spec"]["metrics"] = json!([
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 70}}},
        ]);
        v["status"] = json!({"currentReplicas": 3, "desiredReplicas": 3, "currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 45, "averageValue": "45m"}}},
            {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "52428800"}}},
        ]});
        let cells = row(&v, now);
        assert_eq!(cells[2], "cpu: 45%/50%, memory: 52428800/100Mi + 1 more...");
        assert_eq!(cells[5], 3);
    }

    #[test]
    fn v1_round_trips_through_v2() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": 1, "maxReplicas": 4, "targetCPUUtilizationPercentage": 50}});
        let v2 = v1_value_to_v2(v1.clone()).unwrap();
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            50
        );
        assert_eq!(v2_value_to_v1(v2.clone()).unwrap(), v1);
        // Without a target, v2's default CPU target is what is stored.
        let mut bare = v1.clone();
        bare["spec"]
            .as_object_mut()
            .unwrap()
            .remove("targetCPUUtilizationPercentage");
        let stored = v1_value_to_v2(bare).unwrap();
        assert_eq!(
            stored["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            DEFAULT_CPU_UTILIZATION
        );
        // A memory metric and a behavior survive a v1 round trip in annotations.
        let mut rich = v2.clone();
        rich["spec"]["metrics"] = json!([
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
        ]);
        rich["spec"]["behavior"] = json!({"scaleDown": {"stabilizationWindowSeconds": 0}});
        default(&mut rich);
        let as_v1 = v2_value_to_v1(rich.clone()).unwrap();
        assert!(as_v1["spec"]
            .get("targetCPUUtilizationPercentage")
            .is_none());
        assert!(as_v1["metadata"]["annotations"][METRICS_ANNOTATION].is_string());
        assert_eq!(v1_value_to_v2(as_v1.clone()).unwrap(), rich);
        // A v1 object is validated as its v2 form.
        let mut bad = v1;
        bad["spec"]["targetCPUUtilizationPercentage"] = json!(0);
        assert_eq!(
            messages(&validate_v1(&bad, None)),
            vec!["spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"]
        );
    }
}
