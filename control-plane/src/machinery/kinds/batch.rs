//! batch/v1 Job and CronJob: Kubernetes' defaulters (parallelism and completions 1,
//! backoffLimit 6, NonIndexed, podReplacementPolicy; the generated selector on
//! `batch.kubernetes.io/controller-uid`; CronJob's Allow policy and history limits 3 and 1),
//! validation (restart policy OnFailure or Never, Indexed needs completions, podFailurePolicy
//! and successPolicy rules, the schedule and its time zone, what may not change), kubectl's
//! columns, and the `status.successful` field selector.

use k8s_openapi::api::batch::v1::{
    CronJob, Job, JobSpec, PodFailurePolicy, PodFailurePolicyRule, SuccessPolicy,
};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, format_selector, meta_errors, meta_field,
    name_cell, scalar_at, validate_typed,
};
use super::pod::{default_template, validate_template};
use crate::machinery::cron;
use crate::machinery::duration::human_duration;
use crate::machinery::index_set::IndexSet;
use crate::machinery::selectors::LabelSelector;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{FieldPath, NameRule, Scope};

/// The label (and selector) tying a Job's pods to it, and its name label; both also in
/// their legacy, unprefixed form.
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";

const RESTART_POLICIES: &[&str] = &["OnFailure", "Never"];
const COMPLETION_MODES: &[&str] = &["NonIndexed", "Indexed"];
const REPLACEMENT_POLICIES: &[&str] = &["TerminatingOrFailed", "Failed"];
const FAILURE_ACTIONS: &[&str] = &["Count", "FailIndex", "FailJob", "Ignore"];
const CONCURRENCY_POLICIES: &[&str] = &["Allow", "Forbid", "Replace"];
/// The most completions (and parallelism) of an Indexed Job.
const MAX_INDEXED_COMPLETIONS: i32 = 100_000;
/// A CronJob's name leaves room for the 11-character suffix of the Jobs it creates.
const CRON_JOB_NAME_MAX: usize = 52;

// ---------------------------------------------------------------- defaulting

fn default_job_spec(spec: &mut JobSpec) {
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
    }
    spec.parallelism.get_or_insert(1);
    spec.backoff_limit
        .get_or_insert(if spec.backoff_limit_per_index.is_some() {
            i32::MAX
        } else {
            6
        });
    spec.completion_mode
        .get_or_insert_with(|| "NonIndexed".into());
    spec.suspend.get_or_insert(false);
    if let Some(policy) = spec.pod_failure_policy.as_mut() {
        for rule in &mut policy.rules {
            for pattern in rule.on_pod_conditions.iter_mut().flatten() {
                if pattern.status.is_empty() {
                    pattern.status = "True".into();
                }
            }
        }
    }
    let replacement = if spec.pod_failure_policy.is_some() {
        "Failed"
    } else {
        "TerminatingOrFailed"
    };
    spec.pod_replacement_policy
        .get_or_insert_with(|| replacement.into());
    default_template(&mut spec.template);
}

/// The Job strategy's generated selector: unless `manualSelector`, the pods carry the Job's
/// name and uid as labels and the selector picks the uid. Needs the uid, which the server
/// assigns before defaulting a create.
fn generate_selector(job: &mut Job) {
    let spec = job.spec.get_or_insert_with(Default::default);
    if spec.manual_selector == Some(true) {
        return;
    }
    let (Some(name), Some(uid)) = (job.metadata.name.clone(), job.metadata.uid.clone()) else {
        return;
    };
    let already = spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .is_some_and(|m| m.contains_key(CONTROLLER_UID_LABEL));
    if already {
        return;
    }
    let meta = spec.template.metadata.get_or_insert_with(Default::default);
    let labels = meta.labels.get_or_insert_with(Default::default);
    for key in [LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL] {
        labels.entry(key.into()).or_insert_with(|| name.clone());
    }
    for key in [LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL] {
        labels.entry(key.into()).or_insert_with(|| uid.clone());
    }
    let selector = spec.selector.get_or_insert_with(Default::default);
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(CONTROLLER_UID_LABEL.into(), uid);
}

pub fn default_job(v: &mut Value) {
    default_typed(v, |job: &mut Job| {
        generate_selector(job);
        let spec = job.spec.get_or_insert_with(Default::default);
        default_job_spec(spec);
        let template_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone());
        if job.metadata.labels.as_ref().is_none_or(|l| l.is_empty()) {
            if let Some(l) = template_labels.filter(|l| !l.is_empty()) {
                job.metadata.labels = Some(l);
            }
        }
    });
}

pub fn default_cron_job(v: &mut Value) {
    default_typed(v, |cj: &mut CronJob| {
        let spec = cj.spec.get_or_insert_with(Default::default);
        spec.concurrency_policy
            .get_or_insert_with(|| "Allow".into());
        spec.suspend.get_or_insert(false);
        spec.successful_jobs_history_limit.get_or_insert(3);
        spec.failed_jobs_history_limit.get_or_insert(1);
        // The template's Job spec is defaulted as a Job's is, less what needs a Job's
        // identity (the selector is generated when the Job is created).
        if let Some(job) = spec.job_template.spec.as_mut() {
            default_job_spec(job);
        }
    });
}

// ---------------------------------------------------------------- validation

fn non_negative(errs: &mut Vec<FieldError>, path: FieldPath, value: Option<i64>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        errs.push(FieldError::invalid_number(
            path,
            v,
            "must be greater than or equal to 0",
        ));
    }
}

fn validate_pod_failure_policy(
    policy: &PodFailurePolicy,
    spec: &JobSpec,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = vec![];
    let restart = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    if restart != "Never" {
        errs.push(FieldError::invalid(
            FieldPath::new("spec")
                .child("template")
                .child("spec")
                .child("restartPolicy"),
            restart,
            "only \"Never\" is supported when podFailurePolicy is specified",
        ));
    }
    let rules = path.child("rules");
    if policy.rules.len() > 20 {
        errs.push(FieldError::new(
            crate::machinery::CauseType::TooMany,
            &rules,
            format!(
                "Too many: {}: must have at most 20 items",
                policy.rules.len()
            ),
        ));
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        errs.extend(validate_failure_rule(rule, spec, &rules.index(i)));
    }
    errs
}

fn validate_failure_rule(
    rule: &PodFailurePolicyRule,
    spec: &JobSpec,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = vec![];
    if !FAILURE_ACTIONS.contains(&rule.action.as_str()) {
        errs.push(FieldError::not_supported(
            path.child("action"),
            &rule.action,
            FAILURE_ACTIONS,
        ));
    }
    if rule.action == "FailIndex" && spec.backoff_limit_per_index.is_none() {
        errs.push(FieldError::forbidden(
            path.child("action"),
            "requires the backoffLimitPerIndex to be set",
        ));
    }
    match (&rule.on_exit_codes, &rule.on_pod_conditions) {
        (Some(_), Some(c)) if !c.is_empty() => errs.push(FieldError::invalid(
            path,
            "",
            "specifying both OnExitCodes and OnPodConditions is not supported",
        )),
        (None, None) => errs.push(FieldError::invalid(
            path,
            "",
            "specifying one of OnExitCodes and OnPodConditions is required",
        )),
        _ => {}
    }
    if let Some(codes) = &rule.on_exit_codes {
        let p = path.child("onExitCodes");
        if codes.operator != "In" && codes.operator != "NotIn" {
            errs.push(FieldError::not_supported(
                p.child("operator"),
                &codes.operator,
                &["In", "NotIn"],
            ));
        }
        if codes.values.is_empty() {
            errs.push(FieldError::invalid_unquoted(
                p.child("values"),
                "[]int32{}",
                "at least one value is required",
            ));
        }
        if codes.values.len() > 255 {
            errs.push(FieldError::new(
                crate::machinery::CauseType::TooMany,
                p.child("values"),
                format!(
                    "Too many: {}: must have at most 255 items",
                    codes.values.len()
                ),
            ));
        }
        for (i, w) in codes.values.iter().enumerate() {
            let vp = p.child("values").index(i);
            if codes.operator == "In" && *w == 0 {
                errs.push(FieldError::invalid_number(
                    &vp,
                    0,
                    "must not be 0 for the In operator",
                ));
            }
            if i > 0 && codes.values[i - 1] >= *w {
                let msg = if codes.values[i - 1] == *w {
                    FieldError::duplicate(&vp, w)
                } else {
                    FieldError::invalid_number(&vp, (*w).into(), "must be ordered")
                };
                errs.push(msg);
            }
        }
        if let Some(name) = &codes.container_name {
            let known = spec.template.spec.as_ref().is_some_and(|s| {
                s.containers.iter().any(|c| &c.name == name)
                    || s.init_containers.iter().flatten().any(|c| &c.name == name)
            });
            if !known {
                errs.push(FieldError::invalid(
                    p.child("containerName"),
                    name,
                    "must be one of the container or initContainer names in the pod template",
                ));
            }
        }
    }
    for (i, c) in rule.on_pod_conditions.iter().flatten().enumerate() {
        let p = path.child("onPodConditions").index(i);
        if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            errs.push(FieldError::not_supported(
                p.child("status"),
                &c.status,
                &["False", "True", "Unknown"],
            ));
        }
        if c.type_.is_empty() {
            errs.push(FieldError::required(p.child("type")));
        }
    }
    errs
}

fn validate_success_policy(
    policy: &SuccessPolicy,
    spec: &JobSpec,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errs = vec![];
    if spec.completion_mode.as_deref() != Some("Indexed") {
        errs.push(FieldError::invalid(
            FieldPath::new("spec").child("completionMode"),
            spec.completion_mode.as_deref().unwrap_or("NonIndexed"),
            "requires indexed completion mode",
        ));
    }
    let rules = path.child("rules");
    if policy.rules.is_empty() {
        errs.push(FieldError::required(&rules));
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        let p = rules.index(i);
        if rule.succeeded_count.is_none() && rule.succeeded_indexes.is_none() {
            errs.push(FieldError::required_because(
                &p,
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut size = None;
        if let Some(ix) = &rule.succeeded_indexes {
            match IndexSet::parse(ix, spec.completions) {
                Ok(s) => size = Some(s.len()),
                Err(e) => errs.push(FieldError::invalid(
                    p.child("succeededIndexes"),
                    ix,
                    &format!("error parsing succeededIndexes: {e}"),
                )),
            }
        }
        if let Some(n) = rule.succeeded_count {
            if n < 0 {
                errs.push(FieldError::invalid_number(
                    p.child("succeededCount"),
                    n.into(),
                    "must be greater than or equal to 0",
                ));
            }
            if spec.completions.is_some_and(|c| n > c) {
                errs.push(FieldError::invalid_number(
                    p.child("succeededCount"),
                    n.into(),
                    &format!(
                        "must be less than or equal to {} (the number of specified completions)",
                        spec.completions.unwrap_or(0)
                    ),
                ));
            }
            if size.is_some_and(|s| usize::try_from(n).unwrap_or(0) > s) {
                errs.push(FieldError::invalid_number(
                    p.child("succeededCount"),
                    n.into(),
                    &format!(
                        "must be less than or equal to {} (the number of indexes in the specified succeededIndexes field)",
                        size.unwrap_or(0)
                    ),
                ));
            }
        }
    }
    errs
}

/// The parts of a Job spec every Job and every CronJob's template share.
fn validate_job_spec(spec: &JobSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    non_negative(
        &mut errs,
        path.child("parallelism"),
        spec.parallelism.map(i64::from),
    );
    non_negative(
        &mut errs,
        path.child("completions"),
        spec.completions.map(i64::from),
    );
    non_negative(
        &mut errs,
        path.child("backoffLimit"),
        spec.backoff_limit.map(i64::from),
    );
    non_negative(
        &mut errs,
        path.child("ttlSecondsAfterFinished"),
        spec.ttl_seconds_after_finished.map(i64::from),
    );
    if let Some(d) = spec.active_deadline_seconds.filter(|d| *d <= 0) {
        errs.push(FieldError::invalid_number(
            path.child("activeDeadlineSeconds"),
            d,
            "must be greater than 0",
        ));
    }
    let mode = spec.completion_mode.as_deref().unwrap_or("NonIndexed");
    if !COMPLETION_MODES.contains(&mode) {
        errs.push(FieldError::not_supported(
            path.child("completionMode"),
            mode,
            COMPLETION_MODES,
        ));
    }
    if mode == "Indexed" {
        match spec.completions {
            None => errs.push(FieldError::required_because(
                path.child("completions"),
                "when completion mode is Indexed",
            )),
            Some(c) if c > MAX_INDEXED_COMPLETIONS => errs.push(FieldError::invalid_number(
                path.child("completions"),
                c.into(),
                "must be less than or equal to 100000 when completion mode is Indexed",
            )),
            _ => {}
        }
        if let Some(p) = spec.parallelism.filter(|p| *p > MAX_INDEXED_COMPLETIONS) {
            errs.push(FieldError::invalid_number(
                path.child("parallelism"),
                p.into(),
                "must be less than or equal to 100000 when completion mode is Indexed",
            ));
        }
    }
    if let Some(b) = spec.backoff_limit_per_index {
        if mode != "Indexed" {
            errs.push(FieldError::invalid(
                path.child("backoffLimitPerIndex"),
                b,
                "requires indexed completion mode",
            ));
        }
        non_negative(
            &mut errs,
            path.child("backoffLimitPerIndex"),
            Some(b.into()),
        );
    }
    if let Some(m) = spec.max_failed_indexes {
        if spec.backoff_limit_per_index.is_none() {
            errs.push(FieldError::required_because(
                path.child("backoffLimitPerIndex"),
                "when maxFailedIndexes is specified",
            ));
        }
        non_negative(&mut errs, path.child("maxFailedIndexes"), Some(m.into()));
        if spec.completions.is_some_and(|c| m > c) {
            errs.push(FieldError::invalid_number(
                path.child("maxFailedIndexes"),
                m.into(),
                "must be less than or equal to completions",
            ));
        }
    }
    if let Some(p) = spec.pod_replacement_policy.as_deref() {
        if !REPLACEMENT_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("podReplacementPolicy"),
                p,
                REPLACEMENT_POLICIES,
            ));
        } else if p == "TerminatingOrFailed" && spec.pod_failure_policy.is_some() {
            errs.push(FieldError::not_supported(
                path.child("podReplacementPolicy"),
                p,
                &["Failed"],
            ));
        }
    }
    if let Some(policy) = &spec.pod_failure_policy {
        errs.extend(validate_pod_failure_policy(
            policy,
            spec,
            &path.child("podFailurePolicy"),
        ));
    }
    if let Some(policy) = &spec.success_policy {
        errs.extend(validate_success_policy(
            policy,
            spec,
            &path.child("successPolicy"),
        ));
    }
    errs.extend(validate_template(
        &spec.template,
        &path.child("template"),
        RESTART_POLICIES,
    ));
    errs
}

/// The selector must match the template's labels; a generated one must select the Job's uid.
fn validate_job_selector(job: &Job, spec: &JobSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let sp = path.child("selector");
    let Some(selector) = spec.selector.as_ref() else {
        errs.push(FieldError::required(&sp));
        return errs;
    };
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    match LabelSelector::from_meta(selector) {
        Err(e) => errs.push(FieldError::invalid(
            &sp,
            format_selector(Some(selector)),
            &e.message,
        )),
        Ok(s) if s.is_everything() => errs.push(FieldError::invalid(
            &sp,
            "",
            "empty selector is invalid for job",
        )),
        Ok(s) if !s.matches(&labels) => errs.push(FieldError::invalid(
            path.child("template").child("metadata").child("labels"),
            super::common::format_labels(Some(&labels)),
            "`selector` does not match template `labels`",
        )),
        Ok(_) => {}
    }
    if spec.manual_selector != Some(true) {
        if let Some(uid) = job.metadata.uid.as_deref() {
            let picks = selector
                .match_labels
                .as_ref()
                .and_then(|m| m.get(CONTROLLER_UID_LABEL))
                .map(String::as_str);
            if picks != Some(uid) {
                errs.push(FieldError::invalid(
                    &sp,
                    format_selector(Some(selector)),
                    &format!(
                        "`selector` not auto-generated: must contain {CONTROLLER_UID_LABEL}={uid}"
                    ),
                ));
            }
            if labels.get(CONTROLLER_UID_LABEL).map(String::as_str) != Some(uid) {
                errs.push(FieldError::invalid(
                    path.child("template")
                        .child("metadata")
                        .child("labels")
                        .key(CONTROLLER_UID_LABEL),
                    labels
                        .get(CONTROLLER_UID_LABEL)
                        .cloned()
                        .unwrap_or_default(),
                    &format!("must be '{uid}'"),
                ));
            }
        }
    }
    errs
}

/// What a Job update may not change (Kubernetes' ValidateJobSpecUpdate).
fn validate_job_update(new: &JobSpec, old: &JobSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let immutable = |errs: &mut Vec<FieldError>, field: &str, changed: bool| {
        if changed {
            errs.push(FieldError::immutable(path.child(field)));
        }
    };
    immutable(&mut errs, "selector", new.selector != old.selector);
    immutable(
        &mut errs,
        "completionMode",
        new.completion_mode != old.completion_mode,
    );
    immutable(
        &mut errs,
        "podFailurePolicy",
        new.pod_failure_policy != old.pod_failure_policy,
    );
    immutable(
        &mut errs,
        "backoffLimitPerIndex",
        new.backoff_limit_per_index != old.backoff_limit_per_index,
    );
    immutable(
        &mut errs,
        "successPolicy",
        new.success_policy != old.success_policy,
    );
    // Elastic Indexed Jobs scale completions together with parallelism.
    let elastic = new.completion_mode.as_deref() == Some("Indexed")
        && new.completions == new.parallelism
        && old.completions == old.parallelism;
    if new.completions != old.completions && !elastic {
        errs.push(FieldError::immutable(path.child("completions")));
    }
    // The template may change only while the Job is suspended (its pods are gone then).
    let suspended = new.suspend == Some(true) || old.suspend == Some(true);
    if !suspended && new.template != old.template {
        errs.push(FieldError::invalid_unquoted(
            path.child("template"),
            "core.PodTemplateSpec{...}",
            "field is immutable",
        ));
    }
    errs
}

pub fn validate_job(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Job, old: Option<&Job>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&path));
            return errs;
        };
        errs.extend(validate_job_selector(new, spec, &path));
        errs.extend(validate_job_spec(spec, &path));
        if let Some(old_spec) = old.and_then(|o| o.spec.as_ref()) {
            errs.extend(validate_job_update(spec, old_spec, &path));
        }
        errs
    })
}

pub fn validate_cron_job(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &CronJob, old: Option<&CronJob>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        if let Some(name) = new.metadata.name.as_deref() {
            if name.len() > CRON_JOB_NAME_MAX {
                errs.push(FieldError::invalid(
                    FieldPath::new("metadata").child("name"),
                    name,
                    "must be no more than 52 characters",
                ));
            }
        }
        let path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&path));
            return errs;
        };
        let sp = path.child("schedule");
        if spec.schedule.is_empty() {
            errs.push(FieldError::required(&sp));
        } else if let Err(e) = cron::parse(&spec.schedule) {
            errs.push(FieldError::invalid(&sp, &spec.schedule, &e.to_string()));
        }
        if let Some(tz) = spec.time_zone.as_deref() {
            if let Err(e) = cron::time_zone(Some(tz)) {
                errs.push(FieldError::invalid(
                    path.child("timeZone"),
                    tz,
                    &e.to_string(),
                ));
            }
        }
        let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
        if !CONCURRENCY_POLICIES.contains(&policy) {
            errs.push(FieldError::not_supported(
                path.child("concurrencyPolicy"),
                policy,
                CONCURRENCY_POLICIES,
            ));
        }
        non_negative(
            &mut errs,
            path.child("startingDeadlineSeconds"),
            spec.starting_deadline_seconds,
        );
        non_negative(
            &mut errs,
            path.child("successfulJobsHistoryLimit"),
            spec.successful_jobs_history_limit.map(i64::from),
        );
        non_negative(
            &mut errs,
            path.child("failedJobsHistoryLimit"),
            spec.failed_jobs_history_limit.map(i64::from),
        );
        let jp = path.child("jobTemplate").child("spec");
        match spec.job_template.spec.as_ref() {
            None => errs.push(FieldError::required(&jp)),
            Some(job) => {
                if job.manual_selector == Some(true) || job.selector.is_some() {
                    // The Jobs a CronJob makes get generated selectors.
                    if let Some(sel) = &job.selector {
                        if let Ok(s) = LabelSelector::from_meta(sel) {
                            let labels = job
                                .template
                                .metadata
                                .as_ref()
                                .and_then(|m| m.labels.clone())
                                .unwrap_or_default();
                            if !s.matches(&labels) {
                                errs.push(FieldError::invalid(
                                    jp.child("template").child("metadata").child("labels"),
                                    super::common::format_labels(Some(&labels)),
                                    "`selector` does not match template `labels`",
                                ));
                            }
                        }
                    }
                }
                errs.extend(validate_job_spec(job, &jp));
            }
        }
        errs
    })
}

// ---------------------------------------------------------------- tables

fn job_condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn containers_cells(t: &PodTemplateSpec) -> (Value, Value) {
    let containers = t
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers
        .iter()
        .map(|c| c.image.as_deref().unwrap_or(""))
        .collect();
    (Value::from(names.join(",")), Value::from(images.join(",")))
}

fn wide(selector_doc: &str) -> [TableColumnDefinition; 3] {
    [
        TableColumnDefinition::new(
            "Containers",
            ColumnType::String,
            "Names of each container in the template.",
        )
        .wide(),
        TableColumnDefinition::new(
            "Images",
            ColumnType::String,
            "Images referenced by each container in the template.",
        )
        .wide(),
        TableColumnDefinition::new("Selector", ColumnType::String, selector_doc).wide(),
    ]
}

pub fn job_columns() -> Vec<TableColumnDefinition> {
    let mut c = vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Status", ColumnType::String, "Status of the job."),
        TableColumnDefinition::new(
            "Completions",
            ColumnType::String,
            "The number of pods which reached phase Succeeded.",
        ),
        TableColumnDefinition::new(
            "Duration",
            ColumnType::String,
            "Time required to complete the job.",
        ),
        TableColumnDefinition::age_column(),
    ];
    c.extend(wide(
        "A label query over pods that should match the pod count.",
    ));
    c
}

/// kubectl's printJob: status from the conditions, completions as `succeeded/completions`
/// (or `n/1 of parallelism` without completions), duration from start to completion (or now).
pub fn job_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(job) = decode::<Job>(v) else {
        return pad(default_row(v, now), job_columns().len());
    };
    let spec = job.spec.clone().unwrap_or_default();
    let status = job.status.clone().unwrap_or_default();
    let succeeded = status.succeeded.unwrap_or(0);
    let completions = match spec.completions {
        Some(c) => format!("{succeeded}/{c}"),
        None => match spec.parallelism.unwrap_or(0) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (&status.start_time, &status.completion_time) {
        (None, _) => String::new(),
        (Some(s), None) => human_duration((now.as_second() - s.0.as_second()).max(0)),
        (Some(s), Some(c)) => human_duration((c.0.as_second() - s.0.as_second()).max(0)),
    };
    let state = if job_condition(&job, "Complete") {
        "Complete"
    } else if job_condition(&job, "Failed") {
        "Failed"
    } else if job.metadata.deletion_timestamp.is_some() {
        "Terminating"
    } else if job_condition(&job, "Suspended") {
        "Suspended"
    } else if job_condition(&job, "FailureTarget") {
        "FailureTarget"
    } else if job_condition(&job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let (containers, images) = containers_cells(&spec.template);
    vec![
        name_cell(&job.metadata),
        Value::from(state),
        Value::from(completions),
        Value::from(duration),
        age_cell(&job.metadata, now),
        containers,
        images,
        Value::from(format_selector(spec.selector.as_ref())),
    ]
}

pub fn cron_job_columns() -> Vec<TableColumnDefinition> {
    let mut c = vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Schedule",
            ColumnType::String,
            "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
        ),
        TableColumnDefinition::new(
            "Timezone",
            ColumnType::String,
            "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones.",
        ),
        TableColumnDefinition::new(
            "Suspend",
            ColumnType::Boolean,
            "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
        ),
        TableColumnDefinition::new(
            "Active",
            ColumnType::Integer,
            "A list of pointers to currently running jobs.",
        ),
        TableColumnDefinition::new(
            "Last Schedule",
            ColumnType::String,
            "Information when was the last time the job was successfully scheduled.",
        ),
        TableColumnDefinition::age_column(),
    ];
    c.extend(wide(
        "A label query over pods that should match the pod count.",
    ));
    c
}

pub fn cron_job_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(cj) = decode::<CronJob>(v) else {
        return pad(default_row(v, now), cron_job_columns().len());
    };
    let spec = cj.spec.clone().unwrap_or_default();
    let status = cj.status.clone().unwrap_or_default();
    let last = status
        .last_schedule_time
        .as_ref()
        .map(|t| crate::machinery::duration::age(Some(t.0), now))
        .unwrap_or_else(|| "<none>".into());
    let suspend = match spec.suspend {
        None => "<unset>".to_string(),
        Some(true) => "True".to_string(),
        Some(false) => "False".to_string(),
    };
    let job_spec = spec.job_template.spec.clone().unwrap_or_default();
    let (containers, images) = containers_cells(&job_spec.template);
    vec![
        name_cell(&cj.metadata),
        Value::from(spec.schedule),
        Value::from(spec.time_zone.unwrap_or_else(|| "<none>".into())),
        Value::from(suspend),
        Value::from(status.active.map_or(0, |a| a.len())),
        Value::from(last),
        age_cell(&cj.metadata, now),
        containers,
        images,
        Value::from(format_selector(job_spec.selector.as_ref())),
    ]
}

/// A row of the default cells widened to the kind's columns (an undecodable object).
fn pad(mut row: Vec<Value>, width: usize) -> Vec<Value> {
    row.resize(width, Value::from(""));
    row
}

/// Jobs select on `status.successful` besides metadata.
pub fn job_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "status.successful" => Some(match v.pointer("/status/succeeded") {
            Some(_) => scalar_at(v, "/status/succeeded"),
            None => "0".to_string(),
        }),
        _ => meta_field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(spec: Value) -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "default", "uid": "u-1",
                         "creationTimestamp": "2025-01-01T11:55:00Z"},
            "spec": spec,
        })
    }

    fn template(restart: &str) -> Value {
        json!({"spec": {"restartPolicy": restart,
            "containers": [{"name": "main", "image": "busybox"}]}})
    }

    fn fields(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(|e| e.field.clone()).collect()
    }

    #[test]
    fn defaults_and_the_generated_selector() {
        let mut v = job(json!({"template": template("Never")}));
        default_job(&mut v);
        let spec = &v["spec"];
        assert_eq!(spec["completions"], 1);
        assert_eq!(spec["parallelism"], 1);
        assert_eq!(spec["backoffLimit"], 6);
        assert_eq!(spec["completionMode"], "NonIndexed");
        assert_eq!(spec["suspend"], false);
        assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(spec["selector"]["matchLabels"][CONTROLLER_UID_LABEL], "u-1");
        let labels = &spec["template"]["metadata"]["labels"];
        assert_eq!(labels[JOB_NAME_LABEL], "pi");
        assert_eq!(labels[LEGACY_JOB_NAME_LABEL], "pi");
        assert_eq!(labels[LEGACY_CONTROLLER_UID_LABEL], "u-1");
        assert_eq!(v["metadata"]["labels"][CONTROLLER_UID_LABEL], "u-1");
        assert!(
            validate_job(&v, None).is_empty(),
            "{:?}",
            validate_job(&v, None)
        );

        // Parallelism alone leaves completions unset (a work queue).
        let mut q = job(json!({"parallelism": 3, "template": template("OnFailure")}));
        default_job(&mut q);
        assert!(q["spec"].get("completions").is_none());
        let mut pfp = job(json!({"template": template("Never"),
            "backoffLimitPerIndex": 1, "completionMode": "Indexed", "completions": 2,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}));
        default_job(&mut pfp);
        assert_eq!(pfp["spec"]["podReplacementPolicy"], "Failed");
        assert_eq!(pfp["spec"]["backoffLimit"], i32::MAX);
        assert_eq!(
            pfp["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"],
            "True"
        );
        assert!(
            validate_job(&pfp, None).is_empty(),
            "{:?}",
            validate_job(&pfp, None)
        );
    }

    #[test]
    fn invalid_jobs_name_their_fields() {
        let mut always = job(json!({"template": template("Always")}));
        default_job(&mut always);
        let errs = validate_job(&always, None);
        assert_eq!(fields(&errs), ["spec.template.spec.restartPolicy"]);
        assert!(errs[0].message.contains("\"OnFailure\", \"Never\""));

        let mut bad = job(json!({"template": template("Never"), "parallelism": -1,
            "completionMode": "Indexed", "activeDeadlineSeconds": 0}));
        default_job(&mut bad);
        let f = fields(&validate_job(&bad, None));
        assert!(f.contains(&"spec.parallelism".to_string()), "{f:?}");
        assert!(
            f.contains(&"spec.activeDeadlineSeconds".to_string()),
            "{f:?}"
        );
        assert!(f.contains(&"spec.completions".to_string()), "{f:?}");

        let mut pfp = job(json!({"template": template("OnFailure"),
            "podFailurePolicy": {"rules": [
                {"action": "Explode", "onExitCodes": {"operator": "In", "values": [0, 3, 2]}}]}}));
        default_job(&mut pfp);
        let f = fields(&validate_job(&pfp, None));
        for want in [
            "spec.template.spec.restartPolicy",
            "spec.podFailurePolicy.rules[0].action",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[2]",
        ] {
            assert!(f.contains(&want.to_string()), "{want} in {f:?}");
        }

        let mut wrong = job(json!({"template": template("Never"),
            "selector": {"matchLabels": {"app": "x"}}}));
        default_job(&mut wrong);
        assert!(!validate_job(&wrong, None).is_empty());
    }

    #[test]
    fn updates_keep_what_may_not_change() {
        let mut old = job(json!({"template": template("Never"), "completions": 3}));
        default_job(&mut old);
        let mut new = old.clone();
        new["spec"]["parallelism"] = json!(2);
        assert!(validate_job(&new, Some(&old)).is_empty());
        new["spec"]["completions"] = json!(4);
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        let f = fields(&validate_job(&new, Some(&old)));
        assert_eq!(f, ["spec.completions", "spec.template"]);
        // Suspended: the template may change.
        let mut suspended = old.clone();
        suspended["spec"]["suspend"] = json!(true);
        let mut changed = suspended.clone();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        assert!(validate_job(&changed, Some(&suspended)).is_empty());
    }

    #[test]
    fn cron_jobs_validate_their_schedule_and_zone() {
        let mut cj = json!({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "tick", "namespace": "default"},
            "spec": {"schedule": "*/1 * * * *", "timeZone": "Europe/Berlin",
                     "jobTemplate": {"spec": {"template": template("OnFailure")}}},
        });
        default_cron_job(&mut cj);
        assert_eq!(cj["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(cj["spec"]["successfulJobsHistoryLimit"], 3);
        assert_eq!(cj["spec"]["failedJobsHistoryLimit"], 1);
        assert!(
            validate_cron_job(&cj, None).is_empty(),
            "{:?}",
            validate_cron_job(&cj, None)
        );
        cj["spec"]["schedule"] = json!("every minute");
        cj["spec"]["timeZone"] = json!("Nowhere/Land");
        cj["spec"]["concurrencyPolicy"] = json!("Sometimes");
        let f = fields(&validate_cron_job(&cj, None));
        assert_eq!(
            f,
            ["spec.schedule", "spec.timeZone", "spec.concurrencyPolicy"]
        );
        let long = "x".repeat(53);
        cj["metadata"]["name"] = json!(long);
        assert!(fields(&validate_cron_job(&cj, None)).contains(&"metadata.name".to_string()));
    }

    #[test]
    fn rows_read_like_kubectl() {
        let now: Timestamp = "2025-01-01T12:00:00Z".parse().unwrap();
        let mut v = job(json!({"template": template("Never"), "completions": 5, "parallelism": 2}));
        default_job(&mut v);
        v["status"] = json!({"succeeded": 3, "startTime": "2025-01-01T11:58:30Z"});
        let row = job_row(&v, now);
        assert_eq!(row[1], "Running");
        assert_eq!(row[2], "3/5");
        assert_eq!(row[3], "90s");
        v["status"]["conditions"] = json!([{"type": "Complete", "status": "True"}]);
        v["status"]["completionTime"] = json!("2025-01-01T11:59:00Z");
        let row = job_row(&v, now);
        assert_eq!(
            (row[1].as_str(), row[3].as_str()),
            (Some("Complete"), Some("30s"))
        );
        assert_eq!(row.len(), job_columns().len());
        assert_eq!(job_field(&v, "status.successful").as_deref(), Some("3"));

        let cj = json!({"metadata": {"name": "tick", "creationTimestamp": "2025-01-01T11:00:00Z"},
            "spec": {"schedule": "@hourly", "suspend": false, "jobTemplate": {"spec": {"template": template("Never")}}},
            "status": {"active": [{"name": "tick-1"}], "lastScheduleTime": "2025-01-01T11:59:30Z"}});
        let row = cron_job_row(&cj, now);
        assert_eq!(row[1], "@hourly");
        assert_eq!(row[2], "<none>");
        assert_eq!(row[3], "False");
        assert_eq!(row[4], 1);
        assert_eq!(row[5], "30s");
        assert_eq!(row.len(), cron_job_columns().len());
    }
}
