//! PodSecurity: the Pod Security Standards per namespace, from its labels
//! `pod-security.kubernetes.io/{enforce,warn,audit}` (a level: privileged, baseline,
//! restricted) and `...-version` (`latest` or `v1.N`). Enforce refuses a pod that violates
//! its level (403 `violates PodSecurity "restricted:latest": ...`); warn adds a `Warning` to
//! the response (kubectl prints it), also for workloads whose pod template would violate
//! it; audit records the violation as an audit annotation. Exemptions (usernames, runtime
//! classes, namespaces) and the defaults for unlabelled namespaces come from the server's
//! admission configuration. Labelling a namespace with a stricter enforce level warns about
//! the pods already there.

mod checks;

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

pub use checks::Level;
use checks::{evaluate, message, Subject};

use super::super::{Env, Operation, Plugin, Request};
use crate::apiserver::{audit, warning};
use crate::machinery::{ApiError, FieldError};

const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";
/// Pods reported per namespace when its enforce level becomes stricter (Kubernetes' cap).
const MAX_EXISTING_REPORTED: usize = 30;

/// A level at a version of the standards (`restricted:latest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub level: Level,
    /// `latest` or `v1.N`; skiff evaluates every version with the latest checks.
    pub version: String,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// PodSecurityConfiguration (pod-security.admission.config.k8s.io/v1): defaults for
/// namespaces without labels, and exemptions.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Config {
    pub defaults: Defaults,
    pub exemptions: Exemptions,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct Defaults {
    pub enforce: String,
    pub enforce_version: String,
    pub audit: String,
    pub audit_version: String,
    pub warn: String,
    pub warn_version: String,
}

impl Default for Defaults {
    fn default() -> Self {
        let p = || "privileged".to_string();
        let l = || "latest".to_string();
        Defaults {
            enforce: p(),
            enforce_version: l(),
            audit: p(),
            audit_version: l(),
            warn: p(),
            warn_version: l(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Exemptions {
    pub usernames: Vec<String>,
    pub runtime_classes: Vec<String>,
    pub namespaces: Vec<String>,
}

/// The three modes of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Modes {
    enforce: Policy,
    warn: Policy,
    audit: Policy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Enforce,
    Warn,
    Audit,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
        }
    }
}

fn valid_version(v: &str) -> bool {
    v == "latest"
        || v.strip_prefix("v1.")
            .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
}

/// Errors in a namespace's pod-security labels, as field errors on its metadata.
pub fn label_errors(labels: &BTreeMap<String, String>) -> Vec<FieldError> {
    let mut out = Vec::new();
    for mode in [Mode::Enforce, Mode::Warn, Mode::Audit] {
        let key = format!("{LABEL_PREFIX}{}", mode.as_str());
        if let Some(v) = labels.get(&key) {
            if Level::parse(v).is_none() {
                out.push(FieldError::not_supported(
                    format!("metadata.labels[{key}]"),
                    v,
                    &["privileged", "baseline", "restricted"],
                ));
            }
        }
        let key = format!("{LABEL_PREFIX}{}-version", mode.as_str());
        if let Some(v) = labels.get(&key) {
            if !valid_version(v) {
                out.push(FieldError::invalid(
                    format!("metadata.labels[{key}]"),
                    v,
                    "must be \"latest\" or \"v1.x\"",
                ));
            }
        }
    }
    out
}

impl Config {
    fn default_policy(&self, mode: Mode) -> Policy {
        let d = &self.defaults;
        let (level, version) = match mode {
            Mode::Enforce => (&d.enforce, &d.enforce_version),
            Mode::Warn => (&d.warn, &d.warn_version),
            Mode::Audit => (&d.audit, &d.audit_version),
        };
        Policy {
            level: Level::parse(level).unwrap_or(Level::Privileged),
            version: if valid_version(version) {
                version.clone()
            } else {
                "latest".into()
            },
        }
    }

    /// A namespace's modes from its labels; an invalid label means the strictest policy,
    /// as Kubernetes treats it.
    fn modes(&self, labels: &BTreeMap<String, String>) -> Modes {
        let policy = |mode: Mode| {
            let default = self.default_policy(mode);
            let level = match labels.get(&format!("{LABEL_PREFIX}{}", mode.as_str())) {
                None => default.level,
                Some(v) => Level::parse(v).unwrap_or(Level::Restricted),
            };
            let version = match labels.get(&format!("{LABEL_PREFIX}{}-version", mode.as_str())) {
                None => default.version,
                Some(v) if valid_version(v) => v.clone(),
                Some(_) => "latest".into(),
            };
            Policy { level, version }
        };
        Modes {
            enforce: policy(Mode::Enforce),
            warn: policy(Mode::Warn),
            audit: policy(Mode::Audit),
        }
    }
}

pub struct PodSecurity {
    env: Env,
    config: Config,
}

impl PodSecurity {
    pub fn new(env: Env, config: Config) -> PodSecurity {
        PodSecurity { env, config }
    }

    async fn namespace_labels(&self, ns: &str) -> Result<BTreeMap<String, String>, ApiError> {
        Ok(self
            .env
            .get("", "namespaces", None, ns)
            .await?
            .map(|o| o.labels.clone())
            .unwrap_or_default())
    }

    /// A namespace's labels changed: refuse invalid ones; a stricter enforce level warns
    /// about the pods already there.
    async fn namespace(&self, req: &Request<'_>, obj: &Value) -> Result<(), ApiError> {
        let labels: BTreeMap<String, String> = obj
            .pointer("/metadata/labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        let errors = label_errors(&labels);
        if !errors.is_empty() {
            return Err(ApiError::invalid("", "Namespace", req.name, errors));
        }
        if req.operation != Operation::Update
            || self
                .config
                .exemptions
                .namespaces
                .iter()
                .any(|n| n == req.name)
        {
            return Ok(());
        }
        let old_labels: BTreeMap<String, String> = req
            .old
            .and_then(|o| o.pointer("/metadata/labels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        let new = self.config.modes(&labels).enforce;
        let old = self.config.modes(&old_labels).enforce;
        if new == old || new.level == Level::Privileged {
            return Ok(());
        }
        let pods = self.env.list("", "pods", Some(req.name)).await?;
        let mut reported = 0;
        let mut any = false;
        for o in &pods {
            let Ok(pod) = serde_json::from_slice::<Pod>(&o.json) else {
                continue;
            };
            let Some(spec) = pod.spec.as_ref() else {
                continue;
            };
            if self.exempt_runtime_class(spec) {
                continue;
            }
            let v = evaluate(
                new.level,
                &Subject {
                    meta: &pod.metadata,
                    spec,
                },
            );
            if v.is_empty() {
                continue;
            }
            if !any {
                warning::add(format!(
                    "existing pods in namespace \"{}\" violate the new PodSecurity enforce level \"{new}\"",
                    req.name
                ));
                any = true;
            }
            if reported < MAX_EXISTING_REPORTED {
                warning::add(format!("{}: {}", o.name, message(&v)));
                reported += 1;
            }
        }
        Ok(())
    }

    fn exempt_runtime_class(&self, spec: &PodSpec) -> bool {
        spec.runtime_class_name
            .as_ref()
            .is_some_and(|r| self.config.exemptions.runtime_classes.contains(r))
    }
}

/// The pod template of a workload, if the object has one: at `spec.template` (deployments,
/// replicasets, daemonsets, statefulsets, jobs, ...) or a CronJob's
/// `spec.jobTemplate.spec.template`.
fn template(obj: &Value) -> Option<PodTemplateSpec> {
    let t = obj
        .pointer("/spec/template")
        .or_else(|| obj.pointer("/spec/jobTemplate/spec/template"))?;
    serde_json::from_value(t.clone()).ok()
}

/// Kubernetes skips pod updates that change nothing the standards look at (labels,
/// annotations other than AppArmor's, status): only spec changes are evaluated again.
fn spec_unchanged(obj: &Value, old: Option<&Value>) -> bool {
    old.is_some_and(|o| o.get("spec") == obj.get("spec"))
}

#[async_trait]
impl Plugin for PodSecurity {
    fn name(&self) -> &'static str {
        "PodSecurity"
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let Some(obj) = obj else { return Ok(()) };
        if !matches!(req.operation, Operation::Create | Operation::Update) {
            return Ok(());
        }
        if req.is("", "Namespace") {
            return self.namespace(req, obj).await;
        }
        let Some(ns) = req.namespace else {
            return Ok(());
        };
        let exemptions = &self.config.exemptions;
        if exemptions.namespaces.iter().any(|n| n == ns)
            || exemptions.usernames.contains(&req.user.name)
        {
            return Ok(());
        }
        // Pods themselves (every mode); workloads' templates (warn and audit only).
        let (meta, spec, workload): (ObjectMeta, PodSpec, bool) = if req.is_pod() {
            if req.operation == Operation::Update && spec_unchanged(obj, req.old) {
                return Ok(());
            }
            let Ok(pod) = serde_json::from_value::<Pod>(obj.clone()) else {
                return Ok(());
            };
            (pod.metadata, pod.spec.unwrap_or_default(), false)
        } else if req.subresource.is_none() {
            let Some(t) = template(obj) else {
                return Ok(());
            };
            if req.operation == Operation::Update && req.old.and_then(template) == Some(t.clone()) {
                return Ok(());
            }
            (
                t.metadata.unwrap_or_default(),
                t.spec.unwrap_or_default(),
                true,
            )
        } else {
            return Ok(());
        };
        if self.exempt_runtime_class(&spec) {
            return Ok(());
        }
        let labels = self.namespace_labels(ns).await?;
        let modes = self.config.modes(&labels);
        let subject = Subject {
            meta: &meta,
            spec: &spec,
        };
        if !workload && modes.enforce.level != Level::Privileged {
            let v = evaluate(modes.enforce.level, &subject);
            if !v.is_empty() {
                return Err(req.forbidden(
                    Some(obj),
                    format!(
                        "violates PodSecurity \"{}\": {}",
                        modes.enforce,
                        message(&v)
                    ),
                ));
            }
        }
        if modes.warn.level != Level::Privileged {
            let v = evaluate(modes.warn.level, &subject);
            if !v.is_empty() {
                warning::add(format!(
                    "would violate PodSecurity \"{}\": {}",
                    modes.warn,
                    message(&v)
                ));
            }
        }
        if modes.audit.level != Level::Privileged {
            let v = evaluate(modes.audit.level, &subject);
            if !v.is_empty() {
                let violation = format!(
                    "would violate PodSecurity \"{}\": {}",
                    modes.audit,
                    message(&v)
                );
                // The audit log's annotation, as Kubernetes records it; also a log line for
                // servers without an audit log.
                tracing::info!(
                    namespace = ns,
                    name = req.name,
                    resource = req.resource.plural,
                    user = %req.user.name,
                    violation = %violation,
                    "pod-security.kubernetes.io/audit-violations"
                );
                audit::annotate("pod-security.kubernetes.io/audit-violations", violation);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn templates_of_workloads_and_cron_jobs() {
        let spec = serde_json::json!({"containers": [{"name": "c", "image": "i"}]});
        let set = serde_json::json!({"kind": "StatefulSet", "spec": {"template": {"spec": spec}}});
        let cron = serde_json::json!({"kind": "CronJob",
            "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        for obj in [set, cron] {
            let t = template(&obj).unwrap_or_else(|| panic!("{obj}"));
            assert_eq!(t.spec.unwrap().containers[0].name, "c");
        }
        assert!(template(&serde_json::json!({"kind": "ConfigMap", "data": {}})).is_none());
    }

    #[test]
    fn modes_from_labels_and_defaults() {
        let c = Config::default();
        let m = c.modes(&labels(&[
            ("pod-security.kubernetes.io/enforce", "baseline"),
            ("pod-security.kubernetes.io/warn", "restricted"),
            ("pod-security.kubernetes.io/warn-version", "v1.30"),
        ]));
        assert_eq!(m.enforce.to_string(), "baseline:latest");
        assert_eq!(m.warn.to_string(), "restricted:v1.30");
        assert_eq!(m.audit.to_string(), "privileged:latest");
        let bogus = c.modes(&labels(&[("pod-security.kubernetes.io/enforce", "bogus")]));
        assert_eq!(bogus.enforce.level, Level::Restricted);
        let errs = label_errors(&labels(&[
            ("pod-security.kubernetes.io/enforce", "bogus"),
            ("pod-security.kubernetes.io/audit-version", "1.2"),
        ]));
        assert_eq!(errs.len(), 2);
        assert!(errs[0]
            .message
            .contains("supported values: \"privileged\", \"baseline\", \"restricted\""));
    }

    #[test]
    fn configuration_reads_as_kubernetes_writes_it() {
        let c: Config = serde_json::from_value(serde_json::json!({
            "defaults": {"enforce": "baseline", "warn": "restricted"},
            "exemptions": {"namespaces": ["kube-system"], "usernames": ["admin"]}
        }))
        .unwrap();
        let m = c.modes(&BTreeMap::new());
        assert_eq!(m.enforce.level, Level::Baseline);
        assert_eq!(m.warn.level, Level::Restricted);
        assert_eq!(m.audit.level, Level::Privileged);
        assert_eq!(c.exemptions.namespaces, vec!["kube-system"]);
    }
}
