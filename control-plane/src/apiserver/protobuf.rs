//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`), as the typed
//! clients inside kubectl send them (`kubectl create deployment|configmap|secret|namespace|
//! service|serviceaccount`, `kubectl autoscale`): the `k8s\0` magic, a runtime.Unknown
//! envelope naming the apiVersion/kind, and the object's message, decoded with k8s-pb and
//! converted to JSON field by field (k8s-pb has no serde). The conversion covers the fields those commands set; a body
//! using a part it does not cover is refused with 415, never silently cut short.

use k8s_openapi::ByteString;
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::authentication::v1 as authn;
use k8s_pb::api::authorization::v1 as authorization;
use k8s_pb::api::autoscaling::v1 as autoscaling;
use k8s_pb::api::batch::v1 as batch;
use k8s_pb::api::certificates::v1 as certificates;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::policy::v1 as policy;
use k8s_pb::api::rbac::v1 as rbac;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{json, Map, Value};

use crate::machinery::ApiError;

mod pod;

const MAGIC: &[u8] = b"k8s\0";

/// Decodes a protobuf-encoded object into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let raw = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::malformed("protobuf", "missing the k8s\\0 prefix"))?;
    let unknown = Unknown::decode(raw).map_err(|e| ApiError::malformed("protobuf", e))?;
    let tm = unknown.type_meta.unwrap_or_default();
    let api_version = tm.api_version.unwrap_or_default();
    let kind = tm.kind.unwrap_or_default();
    let bytes = unknown.raw.unwrap_or_default();
    let bad = |e: prost::DecodeError| ApiError::malformed("protobuf", e);
    let mut v = match (api_version.as_str(), kind.as_str()) {
        ("apps/v1", "Deployment") => deployment(apps::Deployment::decode(&*bytes).map_err(bad)?)?,
        ("batch/v1", "Job") => {
            let j = batch::Job::decode(&*bytes).map_err(bad)?;
            obj(vec![
                ("metadata", Some(object_meta(j.metadata))),
                ("spec", j.spec.map(job_spec).transpose()?),
            ])
        }
        ("batch/v1", "CronJob") => cron_job(batch::CronJob::decode(&*bytes).map_err(bad)?)?,
        ("v1", "Pod") => pod::pod(core::Pod::decode(&*bytes).map_err(bad)?)?,
        ("v1", "ConfigMap") => config_map(core::ConfigMap::decode(&*bytes).map_err(bad)?),
        ("v1", "Secret") => secret(core::Secret::decode(&*bytes).map_err(bad)?),
        ("v1", "Namespace") => namespace(core::Namespace::decode(&*bytes).map_err(bad)?),
        ("v1", "Service") => service(core::Service::decode(&*bytes).map_err(bad)?),
        ("v1", "ResourceQuota") => {
            resource_quota(core::ResourceQuota::decode(&*bytes).map_err(bad)?)
        }
        // Registered in every group version: `v1`, `apps/v1`, `meta.k8s.io/v1`...
        (_, "DeleteOptions") => delete_options(meta::DeleteOptions::decode(&*bytes).map_err(bad)?),
        ("policy/v1", "Eviction") => {
            let e = policy::Eviction::decode(&*bytes).map_err(bad)?;
            obj(vec![
                ("metadata", Some(object_meta(e.metadata))),
                ("deleteOptions", e.delete_options.map(delete_options)),
            ])
        }
        // `kubectl create poddisruptionbudget`.
        ("policy/v1", "PodDisruptionBudget") => {
            let b = policy::PodDisruptionBudget::decode(&*bytes).map_err(bad)?;
            let spec = b.spec.map(|sp| {
                obj(vec![
                    ("minAvailable", int_or_string(sp.min_available)),
                    ("maxUnavailable", int_or_string(sp.max_unavailable)),
                    ("selector", label_selector(sp.selector)),
                    (
                        "unhealthyPodEvictionPolicy",
                        s(sp.unhealthy_pod_eviction_policy),
                    ),
                ])
            });
            obj(vec![
                ("metadata", Some(object_meta(b.metadata))),
                ("spec", spec),
            ])
        }
        ("rbac.authorization.k8s.io/v1", "Role") => {
            let r = rbac::Role::decode(&*bytes).map_err(bad)?;
            obj(vec![
                ("metadata", Some(object_meta(r.metadata))),
                ("rules", Some(policy_rules(r.rules))),
            ])
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            let r = rbac::ClusterRole::decode(&*bytes).map_err(bad)?;
            let aggregation = r.aggregation_rule.map(|a| {
                let selectors: Vec<Value> = a
                    .cluster_role_selectors
                    .into_iter()
                    .filter_map(|l| label_selector(Some(l)))
                    .collect();
                json!({"clusterRoleSelectors": selectors})
            });
            obj(vec![
                ("metadata", Some(object_meta(r.metadata))),
                ("rules", Some(policy_rules(r.rules))),
                ("aggregationRule", aggregation),
            ])
        }
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            let b = rbac::RoleBinding::decode(&*bytes).map_err(bad)?;
            binding(b.metadata, b.subjects, b.role_ref)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            let b = rbac::ClusterRoleBinding::decode(&*bytes).map_err(bad)?;
            binding(b.metadata, b.subjects, b.role_ref)
        }
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            let r = authorization::SelfSubjectAccessReview::decode(&*bytes).map_err(bad)?;
            let spec = r.spec.unwrap_or_default();
            obj(vec![
                ("metadata", Some(object_meta(r.metadata))),
                (
                    "spec",
                    Some(obj(access_attributes(
                        spec.resource_attributes,
                        spec.non_resource_attributes,
                    )?)),
                ),
            ])
        }
        ("authorization.k8s.io/v1", "SubjectAccessReview" | "LocalSubjectAccessReview") => {
            let (meta, spec) = if kind == "SubjectAccessReview" {
                let r = authorization::SubjectAccessReview::decode(&*bytes).map_err(bad)?;
                (r.metadata, r.spec)
            } else {
                let r = authorization::LocalSubjectAccessReview::decode(&*bytes).map_err(bad)?;
                (r.metadata, r.spec)
            };
            let spec = spec.unwrap_or_default();
            let extra = (!spec.extra.is_empty()).then(|| {
                Value::Object(
                    spec.extra
                        .into_iter()
                        .map(|(k, v)| (k, json!(v.items)))
                        .collect(),
                )
            });
            let mut fields =
                access_attributes(spec.resource_attributes, spec.non_resource_attributes)?;
            fields.extend([
                ("user", s(spec.user)),
                ("groups", strings(spec.groups)),
                ("extra", extra),
                ("uid", s(spec.uid)),
            ]);
            obj(vec![
                ("metadata", Some(object_meta(meta))),
                ("spec", Some(obj(fields))),
            ])
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            let r = authorization::SelfSubjectRulesReview::decode(&*bytes).map_err(bad)?;
            let namespace = r.spec.and_then(|sp| s(sp.namespace));
            obj(vec![
                ("metadata", Some(object_meta(r.metadata))),
                ("spec", Some(obj(vec![("namespace", namespace)]))),
            ])
        }
        ("authentication.k8s.io/v1", "TokenRequest") => {
            let t = authn::TokenRequest::decode(&*bytes).map_err(bad)?;
            let spec = t.spec.unwrap_or_default();
            let bound = spec.bound_object_ref.map(|b| {
                obj(vec![
                    ("kind", s(b.kind)),
                    ("apiVersion", s(b.api_version)),
                    ("name", s(b.name)),
                    ("uid", s(b.u_id)),
                ])
            });
            obj(vec![
                ("metadata", Some(object_meta(t.metadata))),
                (
                    "spec",
                    Some(obj(vec![
                        ("audiences", strings(spec.audiences)),
                        ("expirationSeconds", n(spec.expiration_seconds)),
                        ("boundObjectRef", bound),
                    ])),
                ),
            ])
        }
        ("authentication.k8s.io/v1", "TokenReview") => {
            let t = authn::TokenReview::decode(&*bytes).map_err(bad)?;
            let spec = t.spec.unwrap_or_default();
            obj(vec![
                ("metadata", Some(object_meta(t.metadata))),
                (
                    "spec",
                    Some(obj(vec![
                        ("token", s(spec.token)),
                        ("audiences", strings(spec.audiences)),
                    ])),
                ),
            ])
        }
        ("authentication.k8s.io/v1", "SelfSubjectReview") => {
            let r = authn::SelfSubjectReview::decode(&*bytes).map_err(bad)?;
            obj(vec![("metadata", Some(object_meta(r.metadata)))])
        }
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => certificate_signing_request(
            certificates::CertificateSigningRequest::decode(&*bytes).map_err(bad)?,
        ),
        ("autoscaling/v1", "HorizontalPodAutoscaler") => horizontal_pod_autoscaler(
            autoscaling::HorizontalPodAutoscaler::decode(&*bytes).map_err(bad)?,
        ),
        ("v1", "ServiceAccount") => {
            let sa = core::ServiceAccount::decode(&*bytes).map_err(bad)?;
            obj(vec![("metadata", Some(object_meta(sa.metadata)))])
        }
        _ => {
            return Err(ApiError::unsupported_media_type(&format!(
                "application/vnd.kubernetes.protobuf for {api_version}/{kind} (send JSON)"
            )))
        }
    };
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

/// Whether [`decode`] converts `kind`'s status. The others' (a pod's, a deployment's...) are
/// the server's and its controllers', written in JSON here; the status subresource refuses
/// them in protobuf rather than dropping them.
pub fn converts_status(kind: &str) -> bool {
    kind == "CertificateSigningRequest"
}

/// A CertificateSigningRequest (`kubectl certificate approve|deny` sends the whole object to
/// `/approval`).
fn certificate_signing_request(c: certificates::CertificateSigningRequest) -> Value {
    let bytes = |b: Option<Vec<u8>>| b.filter(|b| !b.is_empty()).map(|b| json!(ByteString(b)));
    let spec = c.spec.unwrap_or_default();
    let extra = (!spec.extra.is_empty()).then(|| {
        Value::Object(
            spec.extra
                .into_iter()
                .map(|(k, v)| (k, json!(v.items)))
                .collect(),
        )
    });
    let status = c.status.map(|st| {
        let conditions = (!st.conditions.is_empty()).then(|| {
            Value::Array(
                st.conditions
                    .into_iter()
                    .map(|cond| {
                        obj(vec![
                            ("type", s(cond.r#type)),
                            ("status", s(cond.status)),
                            ("reason", s(cond.reason)),
                            ("message", s(cond.message)),
                            ("lastUpdateTime", time(cond.last_update_time)),
                            ("lastTransitionTime", time(cond.last_transition_time)),
                        ])
                    })
                    .collect(),
            )
        });
        obj(vec![
            ("conditions", conditions),
            ("certificate", bytes(st.certificate)),
        ])
    });
    obj(vec![
        ("metadata", Some(object_meta(c.metadata))),
        (
            "spec",
            Some(obj(vec![
                ("request", bytes(spec.request)),
                ("signerName", s(spec.signer_name)),
                ("expirationSeconds", n(spec.expiration_seconds)),
                ("usages", strings(spec.usages)),
                ("username", s(spec.username)),
                ("uid", s(spec.uid)),
                ("groups", strings(spec.groups)),
                ("extra", extra),
            ])),
        ),
        ("status", status),
    ])
}

/// An autoscaling/v1 HorizontalPodAutoscaler (`kubectl autoscale`); its status is the
/// controller's (reset on create), so it is not converted.
fn horizontal_pod_autoscaler(h: autoscaling::HorizontalPodAutoscaler) -> Value {
    let spec = h.spec.unwrap_or_default();
    let target = spec.scale_target_ref.unwrap_or_default();
    obj(vec![
        ("metadata", Some(object_meta(h.metadata))),
        (
            "spec",
            Some(obj(vec![
                (
                    "scaleTargetRef",
                    Some(obj(vec![
                        ("apiVersion", s(target.api_version)),
                        ("kind", s(target.kind)),
                        ("name", s(target.name)),
                    ])),
                ),
                ("minReplicas", n(spec.min_replicas)),
                ("maxReplicas", n(spec.max_replicas)),
                (
                    "targetCPUUtilizationPercentage",
                    n(spec.target_cpu_utilization_percentage),
                ),
            ])),
        ),
    ])
}

/// A metav1.Time (seconds since the epoch) as RFC 3339, None when unset or out of range.
fn time(t: Option<meta::Time>) -> Option<Value> {
    let t = t?;
    let at = k8s_openapi::jiff::Timestamp::from_second(t.seconds?).ok()?;
    Some(json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
}

fn unsupported(what: &str) -> ApiError {
    ApiError::unsupported_media_type(&format!(
        "application/vnd.kubernetes.protobuf with {what} (send JSON)"
    ))
}

/// An object of the present fields.
fn obj(fields: Vec<(&str, Option<Value>)>) -> Value {
    let mut m = Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    Value::Object(m)
}

/// A string field. Go's protobuf writes every non-pointer field, empty or not; JSON omits the
/// empty ones, so an empty string is "not set" here.
fn s(v: Option<String>) -> Option<Value> {
    v.filter(|s| !s.is_empty()).map(Value::String)
}

/// A pointer field (`*int32`, `*bool`): present means set, zero included.
fn n<T: Into<Value>>(v: Option<T>) -> Option<Value> {
    v.map(Into::into)
}

/// A non-pointer number or bool (`omitempty`): zero means not set.
fn nz<T: Into<Value> + Default + PartialEq>(v: Option<T>) -> Option<Value> {
    v.filter(|x| *x != T::default()).map(Into::into)
}

fn strings(v: Vec<String>) -> Option<Value> {
    (!v.is_empty()).then(|| json!(v))
}

fn map(m: std::collections::BTreeMap<String, String>) -> Option<Value> {
    (!m.is_empty()).then(|| json!(m))
}

/// metav1.DeleteOptions (what `kubectl drain` and the typed clients' Delete send).
fn delete_options(o: meta::DeleteOptions) -> Value {
    let pre = o.preconditions.map(|p| {
        obj(vec![
            ("uid", s(p.uid)),
            ("resourceVersion", s(p.resource_version)),
        ])
    });
    obj(vec![
        ("gracePeriodSeconds", n(o.grace_period_seconds)),
        ("preconditions", pre),
        ("orphanDependents", n(o.orphan_dependents)),
        ("propagationPolicy", s(o.propagation_policy)),
        ("dryRun", (!o.dry_run.is_empty()).then(|| json!(o.dry_run))),
    ])
}

fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
    let m = m.unwrap_or_default();
    obj(vec![
        ("name", s(m.name)),
        ("generateName", s(m.generate_name)),
        ("namespace", s(m.namespace)),
        ("resourceVersion", s(m.resource_version)),
        ("labels", map(m.labels)),
        ("annotations", map(m.annotations)),
        ("finalizers", strings(m.finalizers)),
        (
            "ownerReferences",
            (!m.owner_references.is_empty()).then(|| {
                Value::Array(
                    m.owner_references
                        .into_iter()
                        .map(|o| {
                            obj(vec![
                                ("apiVersion", s(o.api_version)),
                                ("kind", s(o.kind)),
                                ("name", s(o.name)),
                                ("uid", s(o.uid)),
                                ("controller", n(o.controller)),
                                ("blockOwnerDeletion", n(o.block_owner_deletion)),
                            ])
                        })
                        .collect(),
                )
            }),
        ),
    ])
}

fn label_selector(l: Option<meta::LabelSelector>) -> Option<Value> {
    let l = l?;
    Some(obj(vec![
        ("matchLabels", map(l.match_labels)),
        (
            "matchExpressions",
            (!l.match_expressions.is_empty()).then(|| {
                Value::Array(
                    l.match_expressions
                        .into_iter()
                        .map(|r| {
                            obj(vec![
                                ("key", s(r.key)),
                                ("operator", s(r.operator)),
                                ("values", strings(r.values)),
                            ])
                        })
                        .collect(),
                )
            }),
        ),
    ]))
}

/// rbac.v1 PolicyRules (`verbs` is required, so always written).
fn policy_rules(rules: Vec<rbac::PolicyRule>) -> Value {
    Value::Array(
        rules
            .into_iter()
            .map(|r| {
                obj(vec![
                    ("verbs", Some(json!(r.verbs))),
                    ("apiGroups", strings(r.api_groups)),
                    ("resources", strings(r.resources)),
                    ("resourceNames", strings(r.resource_names)),
                    ("nonResourceURLs", strings(r.non_resource_ur_ls)),
                ])
            })
            .collect(),
    )
}

/// A RoleBinding or ClusterRoleBinding (roleRef's and subjects' kind and name are required).
fn binding(
    metadata: Option<meta::ObjectMeta>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> Value {
    let r = role_ref.unwrap_or_default();
    let subjects = (!subjects.is_empty()).then(|| {
        Value::Array(
            subjects
                .into_iter()
                .map(|x| {
                    obj(vec![
                        ("kind", Some(json!(x.kind.unwrap_or_default()))),
                        ("apiGroup", s(x.api_group)),
                        ("name", Some(json!(x.name.unwrap_or_default()))),
                        ("namespace", s(x.namespace)),
                    ])
                })
                .collect(),
        )
    });
    obj(vec![
        ("metadata", Some(object_meta(metadata))),
        ("subjects", subjects),
        (
            "roleRef",
            Some(json!({
                "apiGroup": r.api_group.unwrap_or_default(),
                "kind": r.kind.unwrap_or_default(),
                "name": r.name.unwrap_or_default(),
            })),
        ),
    ])
}

/// authorization.v1 ResourceAttributes; selectors only in their raw form.
fn resource_attributes(
    a: Option<authorization::ResourceAttributes>,
) -> Result<Option<Value>, ApiError> {
    let Some(a) = a else {
        return Ok(None);
    };
    let raw = |sel: Option<(Option<String>, usize)>| -> Result<Option<Value>, ApiError> {
        match sel {
            None => Ok(None),
            Some((_, n)) if n > 0 => Err(unsupported("selector requirements")),
            Some((raw, _)) => Ok(s(raw).map(|r| json!({"rawSelector": r}))),
        }
    };
    Ok(Some(obj(vec![
        ("namespace", s(a.namespace)),
        ("verb", s(a.verb)),
        ("group", s(a.group)),
        ("version", s(a.version)),
        ("resource", s(a.resource)),
        ("subresource", s(a.subresource)),
        ("name", s(a.name)),
        (
            "fieldSelector",
            raw(a
                .field_selector
                .map(|f| (f.raw_selector, f.requirements.len())))?,
        ),
        (
            "labelSelector",
            raw(a
                .label_selector
                .map(|l| (l.raw_selector, l.requirements.len())))?,
        ),
    ])))
}

/// The two target fields every access review's spec has.
fn access_attributes(
    resource: Option<authorization::ResourceAttributes>,
    non_resource: Option<authorization::NonResourceAttributes>,
) -> Result<Vec<(&'static str, Option<Value>)>, ApiError> {
    Ok(vec![
        ("resourceAttributes", resource_attributes(resource)?),
        (
            "nonResourceAttributes",
            non_resource_attributes(non_resource),
        ),
    ])
}

fn non_resource_attributes(a: Option<authorization::NonResourceAttributes>) -> Option<Value> {
    a.map(|a| obj(vec![("path", s(a.path)), ("verb", s(a.verb))]))
}

fn int_or_string(v: Option<IntOrString>) -> Option<Value> {
    let v = v?;
    match v.r#type {
        Some(1) => s(v.str_val),
        _ => n(v.int_val),
    }
}

fn quantities(
    m: std::collections::BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
) -> Option<Value> {
    (!m.is_empty()).then(|| {
        Value::Object(
            m.into_iter()
                .map(|(k, q)| (k, json!(q.string.unwrap_or_default())))
                .collect(),
        )
    })
}

fn deployment(d: apps::Deployment) -> Result<Value, ApiError> {
    let spec = match d.spec {
        None => None,
        Some(sp) => Some(obj(vec![
            ("replicas", n(sp.replicas)),
            ("selector", label_selector(sp.selector)),
            ("template", sp.template.map(pod_template).transpose()?),
            (
                "strategy",
                sp.strategy.map(|st| {
                    obj(vec![
                        ("type", s(st.r#type)),
                        (
                            "rollingUpdate",
                            st.rolling_update.map(|r| {
                                obj(vec![
                                    ("maxUnavailable", int_or_string(r.max_unavailable)),
                                    ("maxSurge", int_or_string(r.max_surge)),
                                ])
                            }),
                        ),
                    ])
                }),
            ),
            ("minReadySeconds", nz(sp.min_ready_seconds)),
            ("revisionHistoryLimit", n(sp.revision_history_limit)),
            ("paused", nz(sp.paused)),
            ("progressDeadlineSeconds", n(sp.progress_deadline_seconds)),
        ])),
    };
    Ok(obj(vec![
        ("metadata", Some(object_meta(d.metadata))),
        ("spec", spec),
    ]))
}

/// kubectl create job (also `--from=cronjob/x`) and the Job template of a CronJob.
fn job_spec(sp: batch::JobSpec) -> Result<Value, ApiError> {
    if sp.pod_failure_policy.is_some() || sp.success_policy.is_some() {
        return Err(unsupported("a podFailurePolicy or successPolicy"));
    }
    Ok(obj(vec![
        ("parallelism", n(sp.parallelism)),
        ("completions", n(sp.completions)),
        ("activeDeadlineSeconds", n(sp.active_deadline_seconds)),
        ("backoffLimit", n(sp.backoff_limit)),
        ("backoffLimitPerIndex", n(sp.backoff_limit_per_index)),
        ("maxFailedIndexes", n(sp.max_failed_indexes)),
        ("selector", label_selector(sp.selector)),
        ("manualSelector", n(sp.manual_selector)),
        ("template", sp.template.map(pod_template).transpose()?),
        ("ttlSecondsAfterFinished", n(sp.ttl_seconds_after_finished)),
        ("completionMode", s(sp.completion_mode)),
        ("suspend", n(sp.suspend)),
        ("podReplacementPolicy", s(sp.pod_replacement_policy)),
        ("managedBy", s(sp.managed_by)),
    ]))
}

/// kubectl create cronjob.
fn cron_job(c: batch::CronJob) -> Result<Value, ApiError> {
    let spec = match c.spec {
        None => None,
        Some(sp) => {
            let template = match sp.job_template {
                None => None,
                Some(t) => Some(obj(vec![
                    ("metadata", Some(object_meta(t.metadata))),
                    ("spec", t.spec.map(job_spec).transpose()?),
                ])),
            };
            Some(obj(vec![
                ("schedule", s(sp.schedule)),
                ("timeZone", n(sp.time_zone)),
                ("startingDeadlineSeconds", n(sp.starting_deadline_seconds)),
                ("concurrencyPolicy", s(sp.concurrency_policy)),
                ("suspend", n(sp.suspend)),
                ("jobTemplate", template),
                (
                    "successfulJobsHistoryLimit",
                    n(sp.successful_jobs_history_limit),
                ),
                ("failedJobsHistoryLimit", n(sp.failed_jobs_history_limit)),
            ]))
        }
    };
    Ok(obj(vec![
        ("metadata", Some(object_meta(c.metadata))),
        ("spec", spec),
    ]))
}

fn pod_template(t: core::PodTemplateSpec) -> Result<Value, ApiError> {
    Ok(obj(vec![
        ("metadata", Some(object_meta(t.metadata))),
        ("spec", t.spec.map(pod::pod_spec).transpose()?),
    ]))
}

fn config_map(c: core::ConfigMap) -> Value {
    obj(vec![
        ("metadata", Some(object_meta(c.metadata))),
        ("immutable", n(c.immutable)),
        ("data", map(c.data)),
        (
            "binaryData",
            (!c.binary_data.is_empty()).then(|| {
                Value::Object(
                    c.binary_data
                        .into_iter()
                        .map(|(k, b)| (k, json!(ByteString(b))))
                        .collect(),
                )
            }),
        ),
    ])
}

fn secret(c: core::Secret) -> Value {
    obj(vec![
        ("metadata", Some(object_meta(c.metadata))),
        ("immutable", n(c.immutable)),
        ("type", s(c.r#type)),
        (
            "data",
            (!c.data.is_empty()).then(|| {
                Value::Object(
                    c.data
                        .into_iter()
                        .map(|(k, b)| (k, json!(ByteString(b))))
                        .collect(),
                )
            }),
        ),
        ("stringData", map(c.string_data)),
    ])
}

/// `kubectl create quota` (hard limits, scopes; the status is the server's).
fn resource_quota(q: core::ResourceQuota) -> Value {
    let spec = q.spec.map(|sp| {
        let selector = sp.scope_selector.map(|sel| {
            let exprs = sel
                .match_expressions
                .into_iter()
                .map(|e| {
                    obj(vec![
                        ("scopeName", s(e.scope_name)),
                        ("operator", s(e.operator)),
                        ("values", strings(e.values)),
                    ])
                })
                .collect();
            obj(vec![("matchExpressions", Some(Value::Array(exprs)))])
        });
        obj(vec![
            ("hard", quantities(sp.hard)),
            ("scopes", strings(sp.scopes)),
            ("scopeSelector", selector),
        ])
    });
    obj(vec![
        ("metadata", Some(object_meta(q.metadata))),
        ("spec", spec),
    ])
}

fn namespace(ns: core::Namespace) -> Value {
    obj(vec![
        ("metadata", Some(object_meta(ns.metadata))),
        (
            "spec",
            ns.spec
                .map(|sp| obj(vec![("finalizers", strings(sp.finalizers))])),
        ),
    ])
}

fn service(svc: core::Service) -> Value {
    let spec = svc.spec.map(|sp| {
        obj(vec![
            (
                "ports",
                (!sp.ports.is_empty()).then(|| {
                    Value::Array(
                        sp.ports
                            .into_iter()
                            .map(|p| {
                                obj(vec![
                                    ("name", s(p.name)),
                                    ("protocol", s(p.protocol)),
                                    ("appProtocol", s(p.app_protocol)),
                                    ("port", nz(p.port)),
                                    ("targetPort", int_or_string(p.target_port)),
                                    ("nodePort", nz(p.node_port)),
                                ])
                            })
                            .collect(),
                    )
                }),
            ),
            ("selector", map(sp.selector)),
            ("clusterIP", s(sp.cluster_ip)),
            ("clusterIPs", strings(sp.cluster_ips)),
            ("type", s(sp.r#type)),
            ("externalIPs", strings(sp.external_ips)),
            ("sessionAffinity", s(sp.session_affinity)),
            ("externalName", s(sp.external_name)),
            ("externalTrafficPolicy", s(sp.external_traffic_policy)),
            ("internalTrafficPolicy", s(sp.internal_traffic_policy)),
            (
                "publishNotReadyAddresses",
                nz(sp.publish_not_ready_addresses),
            ),
            ("ipFamilies", strings(sp.ip_families)),
            ("ipFamilyPolicy", s(sp.ip_family_policy)),
        ])
    });
    obj(vec![
        ("metadata", Some(object_meta(svc.metadata))),
        ("spec", spec),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;

    pub(super) fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let u = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(u.encode_to_vec());
        out
    }

    #[test]
    fn decodes_delete_options_and_evictions_as_kubectl_drain_sends_them() {
        let opts = meta::DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(meta::Preconditions {
                uid: Some("u1".into()),
                resource_version: None,
            }),
            propagation_policy: Some("Foreground".into()),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "DeleteOptions", opts.encode_to_vec())).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                   "preconditions": {"uid": "u1"}, "propagationPolicy": "Foreground"})
        );
        let e = policy::Eviction {
            metadata: Some(meta::ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            delete_options: Some(meta::DeleteOptions {
                grace_period_seconds: Some(5),
                ..Default::default()
            }),
        };
        let v = decode(&envelope("policy/v1", "Eviction", e.encode_to_vec())).unwrap();
        assert_eq!(v["metadata"]["name"], "web-1");
        assert_eq!(v["deleteOptions"], json!({"gracePeriodSeconds": 5}));
    }

    #[test]
    fn decodes_a_deployment_as_kubectl_create_sends_it() {
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_string(), "web".to_string())].into();
        let d = apps::Deployment {
            metadata: Some(meta::ObjectMeta {
                name: Some("web".into()),
                labels: labels.clone(),
                ..Default::default()
            }),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(3),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(core::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(core::PodSpec {
                        containers: vec![core::Container {
                            name: Some("nginx".into()),
                            image: Some("nginx:1.27".into()),
                            resources: Some(Default::default()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                strategy: Some(Default::default()),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let v = decode(&envelope("apps/v1", "Deployment", d.encode_to_vec())).unwrap();
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["spec"]["replicas"], 3);
        assert_eq!(v["spec"]["selector"]["matchLabels"]["app"], "web");
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:1.27"
        );
        // It is a valid typed Deployment.
        let _: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(v).unwrap();
    }

    #[test]
    fn decodes_jobs_and_cron_jobs_as_kubectl_create_sends_them() {
        let template = core::PodTemplateSpec {
            metadata: None,
            spec: Some(core::PodSpec {
                restart_policy: Some("Never".into()),
                containers: vec![core::Container {
                    name: Some("hello".into()),
                    image: Some("busybox".into()),
                    command: vec!["echo".into(), "hi".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
        };
        let job = batch::Job {
            metadata: Some(meta::ObjectMeta {
                name: Some("hello".into()),
                annotations: [(
                    "cronjob.kubernetes.io/instantiate".to_string(),
                    "manual".to_string(),
                )]
                .into(),
                ..Default::default()
            }),
            spec: Some(batch::JobSpec {
                template: Some(template.clone()),
                backoff_limit: Some(0),
                ..Default::default()
            }),
            status: None,
        };
        let v = decode(&envelope("batch/v1", "Job", job.encode_to_vec())).unwrap();
        assert_eq!(
            v["spec"]["backoffLimit"], 0,
            "a pointer field keeps its zero"
        );
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["command"][1],
            "hi"
        );
        assert_eq!(
            v["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"],
            "manual"
        );
        let _: k8s_openapi::api::batch::v1::Job = serde_json::from_value(v).unwrap();
        let cj = batch::CronJob {
            metadata: Some(meta::ObjectMeta {
                name: Some("tick".into()),
                ..Default::default()
            }),
            spec: Some(batch::CronJobSpec {
                schedule: Some("*/1 * * * *".into()),
                job_template: Some(batch::JobTemplateSpec {
                    metadata: None,
                    spec: Some(batch::JobSpec {
                        template: Some(template),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        };
        let v = decode(&envelope("batch/v1", "CronJob", cj.encode_to_vec())).unwrap();
        assert_eq!(v["spec"]["schedule"], "*/1 * * * *");
        let _: k8s_openapi::api::batch::v1::CronJob = serde_json::from_value(v).unwrap();
    }

    #[test]
    fn secrets_keep_bytes_and_bad_bodies_are_refused() {
        let s = core::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            }),
            data: [("k".to_string(), b"v\xff".to_vec())].into(),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "Secret", s.encode_to_vec())).unwrap();
        assert_eq!(v["data"]["k"], "dv8=");
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
        assert_eq!(decode(b"k8s\0\xff\xff\xff").unwrap_err().code, 400);
        assert_eq!(
            decode(&envelope("example.com/v1", "Widget", vec![]))
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn decodes_rbac_objects_and_reviews_as_kubectl_sends_them() {
        let b = rbac::RoleBinding {
            metadata: Some(meta::ObjectMeta {
                name: Some("viewer".into()),
                ..Default::default()
            }),
            subjects: vec![rbac::Subject {
                kind: Some("ServiceAccount".into()),
                api_group: Some(String::new()),
                name: Some("bot".into()),
                namespace: Some("team".into()),
            }],
            role_ref: Some(rbac::RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: Some("ClusterRole".into()),
                name: Some("view".into()),
            }),
        };
        let v = decode(&envelope(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            b.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(v["roleRef"]["name"], "view");
        assert_eq!(
            v["subjects"][0],
            json!({"kind": "ServiceAccount", "name": "bot", "namespace": "team"})
        );
        let typed: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(v).unwrap();
        assert_eq!(typed.metadata.name.as_deref(), Some("viewer"));
        let r = rbac::Role {
            metadata: None,
            rules: vec![rbac::PolicyRule {
                verbs: vec!["get".into()],
                api_groups: vec![String::new()],
                resources: vec!["pods".into()],
                ..Default::default()
            }],
        };
        let v = decode(&envelope(
            "rbac.authorization.k8s.io/v1",
            "Role",
            r.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(
            v["rules"][0],
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]})
        );
        let review = authorization::SelfSubjectAccessReview {
            spec: Some(authorization::SelfSubjectAccessReviewSpec {
                resource_attributes: Some(authorization::ResourceAttributes {
                    namespace: Some("team".into()),
                    verb: Some("list".into()),
                    resource: Some("pods".into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
            ..Default::default()
        };
        let v = decode(&envelope(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            review.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(
            v["spec"],
            json!({"resourceAttributes": {"namespace": "team", "verb": "list", "resource": "pods"}})
        );
    }
}
