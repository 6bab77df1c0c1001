//! ResourceQuota: the last validating plugin. What a create (or a Service update) adds to
//! the namespace's usage is checked against every ResourceQuota that covers the object, and
//! charged to the quotas' `status.used` through the store, a compare-and-swap on each
//! quota's revision, before the object is persisted, as Kubernetes' quota admission does:
//! two creates that race for the last unit cannot both succeed. The quota controller fills
//! in `status.hard` and recomputes `status.used` when objects go away.
//!
//! Messages as Kubernetes': `exceeded quota: <name>, requested: pods=1, used: pods=2,
//! limited: pods=2`; `status unknown for quota: <name>, resources: pods` (before the
//! controller has seen the quota); `failed quota: <name>: must specify requests.cpu for: web`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota as Quota};
use serde_json::Value;

use super::super::{Env, Operation, Plugin, Request};
use crate::apiserver::{conversion, registry};
use crate::machinery::quota::{self, Evaluator, PodScopes, Usage};
use crate::machinery::ApiError;
use crate::store::{Precondition, Revision, StoreError, WriteOp};

/// Re-reads after losing a race with another writer of the same quota.
const RETRIES: usize = 32;

/// The resources for which a pod's every container must say what it wants once a quota
/// limits them (Kubernetes keeps this for compatibility).
const NEEDS_EXPLICIT: &[&str] = &[
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

pub struct ResourceQuota {
    env: Env,
    /// Charges in one namespace are made one at a time by this server, so that concurrent
    /// creates queue instead of failing each other's compare-and-swap (other API servers and
    /// the controller can still race; the compare-and-swap keeps that correct).
    namespaces: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// One quota as read for one attempt.
struct Covering {
    key: String,
    revision: Revision,
    value: Value,
    quota: Quota,
}

impl ResourceQuota {
    pub fn new(env: Env) -> ResourceQuota {
        ResourceQuota {
            env,
            namespaces: Mutex::new(HashMap::new()),
        }
    }

    fn lock_for(&self, ns: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(ns.to_string()).or_default().clone()
    }

    /// The namespace's quotas that cover the object.
    async fn covering(
        &self,
        ns: &str,
        scopes: Option<&PodScopes>,
    ) -> Result<Vec<Covering>, ApiError> {
        let found = self.env.list("", "resourcequotas", Some(ns)).await?;
        let mut out = Vec::new();
        for o in found {
            let Ok(value) = o.value() else { continue };
            let Ok(quota) = serde_json::from_value::<Quota>(value.clone()) else {
                continue;
            };
            if !quota::matches_scopes(&quota.spec.clone().unwrap_or_default(), scopes) {
                continue;
            }
            out.push(Covering {
                key: o.key.clone(),
                revision: o.revision,
                value,
                quota,
            });
        }
        Ok(out)
    }
}

/// What the request adds to its namespace's usage (zeros dropped), if the plugin charges it.
fn delta(req: &Request<'_>, obj: &Value) -> Usage {
    let r = req.resource;
    let evaluator = Evaluator::of(r.group, r.plural);
    let charged = match req.operation {
        Operation::Create => true,
        // Only a Service's node ports and load balancers and a claim's storage (expansion)
        // can grow after the object exists.
        Operation::Update => matches!(
            evaluator,
            Evaluator::Services | Evaluator::PersistentVolumeClaims
        ),
        Operation::Delete | Operation::Connect => false,
    };
    if !charged || req.subresource.is_some() || req.namespace.is_none() {
        return Usage::new();
    }
    let new = quota::usage(r.group, r.plural, obj);
    let old = match (req.operation, req.old) {
        (Operation::Update, Some(old)) => quota::usage(r.group, r.plural, old),
        _ => Usage::new(),
    };
    quota::positive_delta(&new, &old)
}

/// Kubernetes' pod Constraints: with cpu or memory under quota, every container must name it.
fn constraints(quota_name: &str, restricted: &BTreeSet<String>, pod: &Pod) -> Result<(), String> {
    let required: Vec<&String> = restricted
        .iter()
        .filter(|r| NEEDS_EXPLICIT.contains(&r.as_str()))
        .collect();
    if required.is_empty() {
        return Ok(());
    }
    let mut missing: std::collections::BTreeMap<&str, BTreeSet<&str>> = Default::default();
    let spec = pod.spec.as_ref();
    let containers = spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        let res = c.resources.as_ref();
        let requests = quota::from_api(res.and_then(|r| r.requests.as_ref()));
        let limits = quota::from_api(res.and_then(|r| r.limits.as_ref()));
        let has = quota::compute_usage(&requests, &limits);
        for r in &required {
            if !has.contains_key(*r) {
                missing.entry(r.as_str()).or_default().insert(&c.name);
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(r, names)| {
            format!(
                "{r} for: {}",
                names.iter().copied().collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    Err(format!(
        "failed quota: {quota_name}: must specify {}",
        parts.join("; ")
    ))
}

#[async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let (Some(obj), Some(ns)) = (obj, req.namespace) else {
            return Ok(());
        };
        let delta = delta(req, obj);
        if delta.is_empty() {
            return Ok(());
        }
        let r = req.resource;
        let pod = (Evaluator::of(r.group, r.plural) == Evaluator::Pods)
            .then(|| serde_json::from_value::<Pod>(obj.clone()).ok())
            .flatten();
        let scopes = pod.as_ref().map(PodScopes::of);
        let lock = self.lock_for(ns);
        let _serial = lock.lock().await;
        // Quotas charged already by an earlier attempt of this request (by key), so that a
        // retry after a lost race charges each quota once.
        let mut charged: BTreeSet<String> = BTreeSet::new();
        for _ in 0..RETRIES {
            let covering = self.covering(ns, scopes.as_ref()).await?;
            let mut writes: Vec<(String, Revision, Value)> = Vec::new();
            for c in &covering {
                let name = c.quota.metadata.name.clone().unwrap_or_default();
                let status = c.quota.status.clone().unwrap_or_default();
                let hard = quota::from_api(status.hard.as_ref());
                let restricted: BTreeSet<String> = c
                    .quota
                    .spec
                    .as_ref()
                    .and_then(|s| s.hard.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| k.clone())
                    .chain(hard.keys().cloned())
                    .filter(|k| quota::handles(r.group, r.plural, k))
                    .collect();
                if restricted.is_empty() {
                    continue;
                }
                if let Some(pod) = &pod {
                    constraints(&name, &restricted, pod)
                        .map_err(|m| req.forbidden(Some(obj), m))?;
                }
                let used = quota::from_api(status.used.as_ref());
                let unknown: Vec<&str> = restricted
                    .iter()
                    .filter(|k| !hard.contains_key(*k) || !used.contains_key(*k))
                    .map(String::as_str)
                    .collect();
                if !unknown.is_empty() {
                    return Err(req.forbidden(
                        Some(obj),
                        format!(
                            "status unknown for quota: {name}, resources: {}",
                            unknown.join(",")
                        ),
                    ));
                }
                let requested = quota::mask(&delta, hard.keys());
                if requested.is_empty() {
                    continue;
                }
                let mut new_used = used.clone();
                quota::add(&mut new_used, &requested);
                let exceeded: Vec<String> = requested
                    .keys()
                    .filter(|k| new_used.get(*k) > hard.get(*k))
                    .cloned()
                    .collect();
                if !exceeded.is_empty() {
                    return Err(req.forbidden(
                        Some(obj),
                        format!(
                            "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
                            quota::pretty(&quota::mask(&requested, &exceeded)),
                            quota::pretty(&quota::mask(&used, &exceeded)),
                            quota::pretty(&quota::mask(&hard, &exceeded)),
                        ),
                    ));
                }
                if charged.contains(&c.key) {
                    continue;
                }
                let mut v = c.value.clone();
                v["status"]["used"] =
                    serde_json::to_value(quota::to_api(&new_used)).map_err(ApiError::internal)?;
                if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                writes.push((c.key.clone(), c.revision, v));
            }
            if req.dry_run {
                return Ok(());
            }
            let quotas = registry::find("", "v1", "resourcequotas")
                .ok_or_else(|| ApiError::internal("resourcequotas are not served"))?;
            let mut lost = false;
            for (key, revision, v) in writes {
                let op = WriteOp::Put {
                    key: key.clone(),
                    value: conversion::stored_bytes(quotas, &v)?,
                    precondition: Precondition::ModRevision(revision),
                };
                match self.env.store.write(op).await {
                    Ok(_) => {
                        charged.insert(key);
                    }
                    Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => {
                        lost = true;
                        break;
                    }
                    Err(e) => return Err(ApiError::internal(e)),
                }
            }
            if !lost {
                return Ok(());
            }
        }
        Err(ApiError::internal(
            "resource quota evaluation timed out: too many concurrent changes of the namespace's quotas",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_must_name_what_a_quota_limits() {
        let pod: Pod = serde_json::from_value(json!({"spec":{"containers":[
            {"name":"web","resources":{"requests":{"cpu":"1"}}},
            {"name":"side"}]}}))
        .unwrap();
        let restricted: BTreeSet<String> = ["requests.cpu", "limits.memory", "pods"]
            .map(String::from)
            .into();
        assert_eq!(
            constraints("q", &restricted, &pod).unwrap_err(),
            "failed quota: q: must specify limits.memory for: side,web; requests.cpu for: side"
        );
        let only_pods: BTreeSet<String> = ["pods".to_string()].into();
        assert!(constraints("q", &only_pods, &pod).is_ok());
    }
}
