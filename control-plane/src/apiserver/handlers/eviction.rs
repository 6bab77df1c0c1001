//! `POST pods/<name>/eviction` (policy/v1 Eviction, what `kubectl drain` sends), as
//! Kubernetes' EvictionREST: a pod that is pending, finished or already terminating is
//! deleted without asking any budget; otherwise the one PodDisruptionBudget selecting the pod
//! decides. With no disruption allowed the answer is 429 TooManyRequests (the client retries);
//! else the budget's status is written first (disruptionsAllowed - 1, the pod in
//! disruptedPods, with the budget's revision as precondition so two evictions never spend the
//! same disruption) and the pod is deleted gracefully. A pod that is not Ready does not spend
//! a disruption when the budget is healthy (or its policy is AlwaysAllow); its delete then
//! carries the pod's resourceVersion so a pod that became Ready meanwhile is not lost.
//! Every delete is preceded, as in Kubernetes 1.33, by the DisruptionTarget condition
//! (reason EvictionByEvictionAPI) written to the pod's status, so its controller and the
//! disruption controller can tell an eviction from a failure.

use std::sync::Arc;

use serde_json::{json, Value};

use super::delete::{delete_object, DeleteOptions};
use super::read::{current, stored};
use super::{store_error, Call, Ctx};
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::{conversion, meta, registry, rules};
use crate::machinery::kinds::policy::{self as budgets, ALWAYS_ALLOW};
use crate::machinery::selectors::LabelSelector;
use crate::machinery::{ApiError, CauseType, FieldError, Reason};
use crate::store::{Precondition, StoreError, WriteOp};

/// Retries of the budget's status write on a conflict (Kubernetes' EvictionsRetry steps).
const RETRIES: usize = 20;

/// More unconfirmed evictions than this and the budget refuses (Kubernetes'
/// MaxDisruptedPodSize).
const MAX_DISRUPTED_PODS: usize = 2000;

const VIOLATES: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

pub async fn evict(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let format = BodyFormat::of(call.header(http::header::CONTENT_TYPE))?;
    let eviction = negotiate::decode_object(format, &call.body)?;
    if let Some(kind) = eviction.get("kind").and_then(Value::as_str) {
        if kind != "Eviction" {
            return Err(ApiError::bad_request(format!(
                "expected an Eviction, got a {kind}"
            )));
        }
    }
    let named = eviction.pointer("/metadata/name").and_then(Value::as_str);
    if named.is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object: {name} != {}",
            named.unwrap_or_default()
        )));
    }
    let opts = DeleteOptions::from_eviction(call, &eviction)?;
    let own_precondition = opts.resource_version_precondition().is_some();
    let dry_run = opts.is_dry_run();

    let (pod, _) = current(ctx, call, name).await?;
    if ignores_budgets(&pod) {
        // Kubernetes retries conflicts here unless the client set its own precondition.
        let mut last = None;
        for _ in 0..RETRIES {
            let (pod, _) = current(ctx, call, name).await?;
            let mut o = opts.clone();
            if enforces_resource_version(&pod) && !own_precondition {
                o.set_resource_version_precondition(meta::resource_version(&pod));
            }
            match disrupt_and_delete(ctx, call, name, &o).await {
                Err(e) if e.reason == Reason::Conflict && !own_precondition => last = Some(e),
                Err(e) => return Err(e),
                Ok(_) => return success(),
            }
        }
        return Err(last.unwrap_or_else(|| ApiError::internal("eviction retries exhausted")));
    }

    let covering = budgets_for(ctx, &pod).await?;
    if covering.len() > 1 {
        return Err(ApiError::new(
            500,
            Reason::InternalError,
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    let mut opts = opts;
    if let Some(budget) = covering.first() {
        let budget_name = meta::name(budget).unwrap_or_default().to_string();
        let mut spend = true;
        if !is_ready(&pod) {
            let policy = budget
                .pointer("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str);
            let current_healthy = status_count(budget, "currentHealthy");
            let desired_healthy = status_count(budget, "desiredHealthy");
            if policy == Some(ALWAYS_ALLOW)
                || (current_healthy >= desired_healthy && desired_healthy > 0)
            {
                // Deleting an unready pod does not disrupt a healthy application: no
                // disruption is spent, but the pod must still be unready when it goes.
                spend = false;
                if !own_precondition {
                    opts.set_resource_version_precondition(meta::resource_version(&pod));
                }
            }
        }
        if spend {
            check_and_decrement(ctx, &pod, &budget_name, name, dry_run).await?;
        } else {
            return match disrupt_and_delete(ctx, call, name, &opts).await {
                Err(e) if e.reason == Reason::Conflict && !own_precondition => {
                    Err(too_many_requests_processing(&budget_name))
                }
                Err(e) => Err(e),
                Ok(_) => success(),
            };
        }
    }
    disrupt_and_delete(ctx, call, name, &opts).await?;
    success()
}

/// The condition an eviction adds before it deletes.
const DISRUPTION_TARGET: &str = "DisruptionTarget";
const EVICTION_REASON: &str = "EvictionByEvictionAPI";
const EVICTION_MESSAGE: &str = "Eviction API: evicting";

/// Kubernetes' addConditionAndDeletePod: the DisruptionTarget condition on the latest pod
/// (the delete's preconditions checked against it), then the delete, its resourceVersion
/// precondition moved to the revision the condition wrote. A dry run writes neither.
async fn disrupt_and_delete(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Value, ApiError> {
    if opts.is_dry_run() {
        return delete_object(ctx, call, name, opts).await;
    }
    let rv = mark_disruption_target(ctx, call, name, opts).await?;
    let mut opts = opts.clone();
    if opts.resource_version_precondition().is_some() {
        opts.set_resource_version_precondition(Some(&rv));
    }
    delete_object(ctx, call, name, &opts).await
}

/// Writes DisruptionTarget=True to the pod's status (a status-only write the server makes
/// itself, as Kubernetes' eviction updates through the pod status store); returns the pod's
/// resourceVersion afterwards.
async fn mark_disruption_target(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
    opts: &DeleteOptions,
) -> Result<String, ApiError> {
    let r = call.resource;
    for _ in 0..RETRIES {
        let (mut pod, rev) = current(ctx, call, name).await?;
        if let Some(uid) = opts.uid_precondition() {
            let actual = meta::uid(&pod).unwrap_or_default();
            if actual != uid {
                return Err(ApiError::conflict(r.group, r.plural, name, &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({actual}). The object might have been deleted and then recreated"
                )));
            }
        }
        if let Some(want) = opts.resource_version_precondition() {
            let actual = meta::resource_version(&pod).unwrap_or_default();
            if actual != want {
                return Err(ApiError::conflict(r.group, r.plural, name, &format!(
                    "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({actual}). The object might have been modified"
                )));
            }
        }
        if !set_disruption_target(&mut pod, &meta::now()) {
            return Ok(meta::resource_version(&pod).unwrap_or_default().to_string());
        }
        let op = WriteOp::Put {
            key: call.key(name),
            value: conversion::stored_bytes(r, &pod)?,
            precondition: Precondition::ModRevision(rev),
        };
        match ctx.store.write(op).await {
            Ok(w) => {
                ctx.metrics.wrote(r.plural, "update");
                meta::set_resource_version(&mut pod, w.revision);
                return Ok(meta::resource_version(&pod).unwrap_or_default().to_string());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(store_error(r, name, e)),
        }
    }
    Err(ApiError::conflict(
        r.group,
        r.plural,
        name,
        "too many concurrent writes; please retry",
    ))
}

/// Sets DisruptionTarget=True (reason EvictionByEvictionAPI) as Kubernetes'
/// UpdatePodCondition does: the transition time moves only when the status changes. Returns
/// whether anything changed.
fn set_disruption_target(pod: &mut Value, now: &str) -> bool {
    let wanted = json!({
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": EVICTION_REASON,
        "message": EVICTION_MESSAGE,
    });
    let Some(status) = pod
        .as_object_mut()
        .map(|o| o.entry("status").or_insert_with(|| json!({})))
    else {
        return false;
    };
    if !status.is_object() {
        *status = json!({});
    }
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return false;
    };
    match conditions
        .iter_mut()
        .find(|c| c["type"] == DISRUPTION_TARGET)
    {
        Some(c) => {
            let same_status = c["status"] == wanted["status"];
            if same_status && c["reason"] == wanted["reason"] && c["message"] == wanted["message"] {
                return false;
            }
            c["reason"] = wanted["reason"].clone();
            c["message"] = wanted["message"].clone();
            if !same_status {
                c["status"] = wanted["status"].clone();
                c["lastTransitionTime"] = json!(now);
            }
        }
        None => {
            let mut c = wanted;
            c["lastTransitionTime"] = json!(now);
            conditions.push(c);
        }
    }
    true
}

/// The Success Status Kubernetes answers an eviction with (201).
fn success() -> Result<Resp, ApiError> {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Success", "code": 201,
    });
    Ok(output::bytes(
        http::StatusCode::CREATED,
        output::JSON,
        serde_json::to_vec(&status).map_err(ApiError::internal)?,
    ))
}

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

/// Kubernetes' canIgnorePDB: a finished or pending pod disrupts nothing by going, and a
/// terminating one is going already.
fn ignores_budgets(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed" | "Pending")
        || meta::deletion_timestamp(pod).is_some()
}

/// Kubernetes' shouldEnforceResourceVersion: a pending pod could become Ready meanwhile.
fn enforces_resource_version(pod: &Value) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && meta::deletion_timestamp(pod).is_none()
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn namespace(pod: &Value) -> &str {
    meta::str_field(pod, &["metadata", "namespace"]).unwrap_or_default()
}

fn status_count(budget: &Value, field: &str) -> i64 {
    budget["status"][field].as_i64().unwrap_or(0)
}

fn budget_resource() -> Result<&'static registry::Resource, ApiError> {
    registry::find(budgets::GROUP, "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not registered"))
}

/// The budgets in the pod's namespace whose selector matches its labels (an empty selector
/// matches every pod, an absent one none, as in policy/v1).
async fn budgets_for(ctx: &Ctx, pod: &Value) -> Result<Vec<Value>, ApiError> {
    let r = budget_resource()?;
    let ns = namespace(pod);
    let labels: std::collections::BTreeMap<String, String> = pod
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    ctx.fresh().await?;
    let sel = rules::selection(r, Some(ns), None, None)?;
    let page = ctx
        .resource_cache(r)?
        .list(&r.namespace_prefix(Some(ns)), &sel.filter, None, None);
    let mut out = Vec::new();
    for o in page.items {
        let Ok(v) = o.value() else { continue };
        let selector = v
            .pointer("/spec/selector")
            .filter(|s| !s.is_null())
            .map(|s| serde_json::from_value(s.clone()));
        let selects = match selector {
            None => false,
            Some(Err(_)) => false,
            Some(Ok(s)) => LabelSelector::from_meta(&s).is_ok_and(|s| s.matches(&labels)),
        };
        if selects {
            out.push(v);
        }
    }
    Ok(out)
}

/// 429 with the DisruptionBudget cause.
fn too_many_requests(cause: String, retry_after: Option<i32>) -> ApiError {
    let mut e = ApiError::new(429, Reason::TooManyRequests, VIOLATES);
    e.causes = vec![FieldError::new(CauseType::DisruptionBudget, "", cause)];
    e.retry_after_seconds = retry_after;
    e
}

/// The budget's status is behind its spec, or the pod changed under the eviction: retry.
fn too_many_requests_processing(budget: &str) -> ApiError {
    too_many_requests(
        format!("The disruption budget {budget} is still being processed by the server."),
        Some(10),
    )
}

/// Kubernetes' checkAndDecrement, re-reading the budget after each conflict: refuses when
/// the budget allows no disruption, else spends one and records the pod as disrupted.
async fn check_and_decrement(
    ctx: &Ctx,
    pod: &Value,
    budget_name: &str,
    pod_name: &str,
    dry_run: bool,
) -> Result<(), ApiError> {
    let r = budget_resource()?;
    let key = r.key(Some(namespace(pod)), budget_name);
    for _ in 0..RETRIES {
        let Some((mut budget, rev)) = stored(ctx, r, &key, budget_name).await? else {
            // Deleted meanwhile: nothing guards the pod any more.
            return Ok(());
        };
        let observed = budget["status"]["observedGeneration"].as_i64().unwrap_or(0);
        if observed < meta::generation(&budget) {
            return Err(too_many_requests_processing(budget_name));
        }
        let allowed = status_count(&budget, "disruptionsAllowed");
        if allowed < 0 {
            return Err(ApiError::forbidden(format!(
                "poddisruptionbudgets.policy \"{budget_name}\" is forbidden: pdb disruptions allowed is negative"
            )));
        }
        let disrupted = budget["status"]["disruptedPods"]
            .as_object()
            .map_or(0, |m| m.len());
        if disrupted > MAX_DISRUPTED_PODS {
            return Err(ApiError::forbidden(format!(
                "poddisruptionbudgets.policy \"{budget_name}\" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"
            )));
        }
        if allowed == 0 {
            return Err(too_many_requests(
                format!(
                    "The disruption budget {budget_name} needs {} healthy pods and has {} currently",
                    status_count(&budget, "desiredHealthy"),
                    status_count(&budget, "currentHealthy")
                ),
                None,
            ));
        }
        if dry_run {
            return Ok(());
        }
        let now = meta::now();
        let status = &mut budget["status"];
        status["disruptionsAllowed"] = json!(allowed - 1);
        if allowed - 1 == 0 {
            budgets::set_disruption_allowed(status, &now);
        }
        if !status["disruptedPods"].is_object() {
            status["disruptedPods"] = json!({});
        }
        status["disruptedPods"][pod_name] = json!(now);
        let op = WriteOp::Put {
            key: key.clone(),
            value: conversion::stored_bytes(r, &budget)?,
            precondition: Precondition::ModRevision(rev),
        };
        match ctx.store.write(op).await {
            Ok(_) => {
                ctx.metrics.wrote(r.plural, "update");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(store_error(r, budget_name, e)),
        }
    }
    Err(ApiError::new(
        504,
        Reason::Timeout,
        format!("couldn't update PodDisruptionBudget \"{budget_name}\" due to conflicts"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_pods_skip_the_budget() {
        let running = json!({"metadata": {}, "status": {"phase": "Running"}});
        assert!(!ignores_budgets(&running));
        assert!(enforces_resource_version(&running));
        for phase in ["Pending", "Succeeded", "Failed"] {
            assert!(ignores_budgets(&json!({"status": {"phase": phase}})));
        }
        assert!(ignores_budgets(&json!({"status": {}})));
        let going = json!({"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z"},
            "status": {"phase": "Running"}});
        assert!(ignores_budgets(&going));
        assert!(!enforces_resource_version(&going));
        assert!(!enforces_resource_version(
            &json!({"status": {"phase": "Succeeded"}})
        ));
    }

    #[test]
    fn the_disruption_target_condition_is_added_once() {
        let mut pod = json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(set_disruption_target(&mut pod, "2026-12-02T17:00:00Z"));
        let c = &pod["status"]["conditions"][1];
        assert_eq!(c["type"], "DisruptionTarget");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "EvictionByEvictionAPI");
        assert_eq!(c["message"], "Eviction API: evicting");
        assert_eq!(c["lastTransitionTime"], "2026-12-02T17:00:00Z");
        assert!(!set_disruption_target(&mut pod, "2026-12-02T18:00:00Z"));
        // A preemption's condition is taken over, keeping its transition time.
        let mut preempted = json!({"status": {"conditions": [{"type": "DisruptionTarget",
            "status": "True", "reason": "PreemptionByScheduler",
            "lastTransitionTime": "2026-12-02T16:00:00Z"}]}});
        assert!(set_disruption_target(
            &mut preempted,
            "2026-12-02T17:00:00Z"
        ));
        let c = &preempted["status"]["conditions"][0];
        assert_eq!(c["reason"], "EvictionByEvictionAPI");
        assert_eq!(c["lastTransitionTime"], "2026-12-02T16:00:00Z");
        assert!(set_disruption_target(&mut json!({}), "t"));
    }

    #[test]
    fn the_refusal_is_kubernetes_429() {
        let s = too_many_requests(
            "The disruption budget web needs 2 healthy pods and has 2 currently".into(),
            None,
        )
        .to_status();
        assert_eq!(s.code, Some(429));
        assert_eq!(s.reason.as_deref(), Some("TooManyRequests"));
        assert_eq!(s.message.as_deref(), Some(VIOLATES));
        let cause = &s.details.unwrap().causes.unwrap()[0];
        assert_eq!(cause.reason.as_deref(), Some("DisruptionBudget"));
        assert_eq!(cause.field, None);
        assert_eq!(
            cause.message.as_deref(),
            Some("The disruption budget web needs 2 healthy pods and has 2 currently")
        );
    }
}
