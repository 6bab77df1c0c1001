//! delete and deletecollection. Pods on a node are deleted gracefully (deletionTimestamp and
//! grace period set; the node agent finishes with a grace-0 delete once the containers are
//! gone); objects with finalizers stay until their finalizers are removed; the propagation
//! policy is recorded as Kubernetes does (the `orphan` or `foregroundDeletion` finalizer) for
//! the garbage collector. pods/eviction (see `eviction`) ends in the same graceful delete.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::read::current;
use super::write::blocks_deletion;
use super::{store_error, Call, Ctx};
use crate::apiserver::admission::{self, Operation, Request};
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::request::ListOptions;
use crate::apiserver::{conversion, meta, rules};
use crate::machinery::ApiError;
use crate::store::{Precondition, StoreError, WriteOp};

const RETRIES: usize = 16;

/// metav1.DeleteOptions as the server reads it (body and query).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DeleteOptions {
    grace_period_seconds: Option<i64>,
    propagation_policy: Option<String>,
    orphan_dependents: Option<bool>,
    preconditions: Option<Preconditions>,
    #[serde(default)]
    dry_run: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

/// How dependents are treated (recorded for the garbage collector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl DeleteOptions {
    /// From the body (JSON, YAML or protobuf, as the typed clients in `kubectl drain` send
    /// it) and the query, which wins.
    fn parse(call: &Call<'_>) -> Result<DeleteOptions, ApiError> {
        let mut o: DeleteOptions = if call.body.iter().all(u8::is_ascii_whitespace) {
            DeleteOptions::default()
        } else {
            let format = BodyFormat::of(call.header(http::header::CONTENT_TYPE))?;
            let v = negotiate::decode_object(format, &call.body)?;
            serde_json::from_value(v).map_err(|e| ApiError::malformed("DeleteOptions", e))?
        };
        o.apply_query(call)?;
        Ok(o)
    }

    /// The options an Eviction carries (`deleteOptions`), then the query's.
    pub(super) fn from_eviction(
        call: &Call<'_>,
        eviction: &Value,
    ) -> Result<DeleteOptions, ApiError> {
        let mut o: DeleteOptions = match eviction.get("deleteOptions") {
            Some(v) if !v.is_null() => serde_json::from_value(v.clone())
                .map_err(|e| ApiError::malformed("DeleteOptions", e))?,
            _ => DeleteOptions::default(),
        };
        o.apply_query(call)?;
        Ok(o)
    }

    pub(super) fn is_dry_run(&self) -> bool {
        !self.dry_run.is_empty()
    }

    /// The client's own resourceVersion precondition, if it set one.
    pub(super) fn resource_version_precondition(&self) -> Option<&str> {
        self.preconditions
            .as_ref()
            .and_then(|p| p.resource_version.as_deref())
    }

    /// The client's uid precondition, if it set one.
    pub(super) fn uid_precondition(&self) -> Option<&str> {
        self.preconditions.as_ref().and_then(|p| p.uid.as_deref())
    }

    /// Deletes only the object at `rv` (the eviction's guard against a pod that changed).
    pub(super) fn set_resource_version_precondition(&mut self, rv: Option<&str>) {
        self.preconditions
            .get_or_insert_with(Preconditions::default)
            .resource_version = rv.map(str::to_string);
    }

    fn apply_query(&mut self, call: &Call<'_>) -> Result<(), ApiError> {
        let o = self;
        if let Some(g) = call.query.get("gracePeriodSeconds") {
            o.grace_period_seconds =
                Some(g.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}"))
                })?);
        }
        if let Some(p) = call.query.get("propagationPolicy") {
            o.propagation_policy = Some(p.clone());
        }
        if call.query.get("dryRun").is_some_and(|d| d == "All") {
            o.dry_run = vec!["All".into()];
        }
        if o.grace_period_seconds.is_some_and(|g| g < 0) {
            o.grace_period_seconds = Some(0);
        }
        Ok(())
    }

    fn propagation(&self) -> Result<Option<Propagation>, ApiError> {
        match (self.propagation_policy.as_deref(), self.orphan_dependents) {
            (Some("Background"), _) => Ok(Some(Propagation::Background)),
            (Some("Foreground"), _) => Ok(Some(Propagation::Foreground)),
            (Some("Orphan"), _) => Ok(Some(Propagation::Orphan)),
            (Some(other), _) => Err(ApiError::invalid(
                "",
                "DeleteOptions",
                "",
                vec![crate::machinery::FieldError::new(
                    crate::machinery::CauseType::NotSupported,
                    "propagationPolicy",
                    format!("Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""),
                )],
            )),
            (None, Some(true)) => Ok(Some(Propagation::Orphan)),
            (None, _) => Ok(None),
        }
    }
}

pub async fn delete(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let opts = DeleteOptions::parse(call)?;
    let obj = delete_object(ctx, call, name, &opts).await?;
    Ok(output::ok(&obj))
}

pub async fn delete_collection(ctx: &Arc<Ctx>, call: &Call<'_>) -> Result<Resp, ApiError> {
    let opts = DeleteOptions::parse(call)?;
    let list = ListOptions::from_query(call.query)?;
    let r = call.resource;
    let sel = rules::selection(
        r,
        call.namespace(),
        list.label_selector.as_deref(),
        list.field_selector.as_deref(),
    )?;
    ctx.fresh().await?;
    let page = ctx.resource_cache(r)?.list(
        &r.namespace_prefix(call.namespace()),
        &sel.filter,
        None,
        None,
    );
    let mut deleted = Vec::new();
    for o in page.items {
        match delete_object(ctx, call, &o.name, &opts).await {
            Ok(v) => deleted.push(serde_json::to_vec(&v).map_err(ApiError::internal)?),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(output::bytes(
        http::StatusCode::OK,
        output::JSON,
        output::list_bytes(
            &r.api_version(),
            &r.list_kind(),
            ctx.store.current_revision(),
            None,
            deleted.iter().map(Vec::as_slice),
        ),
    ))
}

/// Deletes (or starts deleting) one object; returns it as it now is, or as it was last.
pub(super) async fn delete_object(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Value, ApiError> {
    let r = call.resource;
    let propagation = opts.propagation()?;
    let dry_run = !opts.dry_run.is_empty();
    for _ in 0..RETRIES {
        let (cur, rev) = current(ctx, call, name).await?;
        let req = Request::new(Operation::Delete, r, call.namespace(), name, call.user)
            .old(&cur)
            .dry_run(dry_run)
            .options(admission::options("DeleteOptions", dry_run, None));
        ctx.admission.admit_without_object(&req).await?;
        if let Some(p) = &opts.preconditions {
            if let Some(uid) = &p.uid {
                if meta::uid(&cur) != Some(uid.as_str()) {
                    return Err(ApiError::conflict(
                        r.group,
                        r.plural,
                        name,
                        &format!(
                            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                            meta::uid(&cur).unwrap_or_default()
                        ),
                    ));
                }
            }
            if let Some(rv) = &p.resource_version {
                if meta::resource_version(&cur) != Some(rv.as_str()) {
                    return Err(ApiError::conflict(
                        r.group,
                        r.plural,
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            meta::resource_version(&cur).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        let mut new = cur.clone();
        record_propagation(&mut new, propagation)?;
        let grace = pod_grace(r.kind, r.group, &cur, opts.grace_period_seconds);
        let stays = blocks_deletion(&new) || grace.is_some();
        let op = if stays {
            mark_deleting(r.kind, &mut new, grace)?;
            if new == cur {
                return Ok(cur);
            }
            WriteOp::Put {
                key: call.key(name),
                value: conversion::stored_bytes(r, &new)?,
                precondition: Precondition::ModRevision(rev),
            }
        } else {
            WriteOp::Delete {
                key: call.key(name),
                precondition: Precondition::ModRevision(rev),
            }
        };
        if dry_run {
            return Ok(new);
        }
        match ctx.store.write(op).await {
            Ok(w) => {
                if !stays {
                    ctx.allocator.deleted(r, &cur).await;
                }
                meta::set_resource_version(&mut new, w.revision);
                ctx.metrics.wrote(r.plural, "delete");
                return Ok(new);
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

/// Adds the finalizer that tells the garbage collector how to treat dependents.
fn record_propagation(obj: &mut Value, p: Option<Propagation>) -> Result<(), ApiError> {
    let add = match p {
        Some(Propagation::Orphan) => "orphan",
        Some(Propagation::Foreground) => "foregroundDeletion",
        _ => return Ok(()),
    };
    let mut f = meta::finalizers(obj);
    if !f.iter().any(|x| x == add) {
        f.push(add.to_string());
        meta::metadata_mut(obj)?.insert("finalizers".into(), json!(f));
    }
    Ok(())
}

/// The grace period of a pod's deletion, if it is graceful: a pod bound to a node and not
/// finished gets its requested (or spec's, default 30 s) grace; others go at once.
fn pod_grace(kind: &str, group: &str, pod: &Value, requested: Option<i64>) -> Option<i64> {
    if kind != "Pod" || !group.is_empty() {
        return None;
    }
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !bound || finished {
        return None;
    }
    let spec_grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let grace = requested.unwrap_or(spec_grace);
    let current = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    match (grace, current) {
        (0, _) => None,
        // An ongoing deletion is only ever shortened.
        (g, Some(c)) => Some(g.min(c)),
        (g, None) => Some(g),
    }
}

/// Sets deletionTimestamp (now plus the grace period) unless a shorter one is set already.
fn mark_deleting(kind: &str, obj: &mut Value, grace: Option<i64>) -> Result<(), ApiError> {
    let g = grace.unwrap_or(0);
    let existing = obj
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    let first = meta::deletion_timestamp(obj).is_none();
    if kind == "Namespace" {
        obj["status"]["phase"] = json!("Terminating");
    }
    let m = meta::metadata_mut(obj)?;
    if first || existing.is_some_and(|e| g < e) {
        m.insert("deletionTimestamp".into(), json!(meta::now_plus(g)));
        m.insert("deletionGracePeriodSeconds".into(), json!(g));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_on_nodes_are_deleted_gracefully() {
        let pod = json!({"spec":{"nodeName":"n1","terminationGracePeriodSeconds":5},"status":{"phase":"Running"}});
        assert_eq!(pod_grace("Pod", "", &pod, None), Some(5));
        assert_eq!(pod_grace("Pod", "", &pod, Some(0)), None);
        let unbound = json!({"spec":{},"status":{"phase":"Pending"}});
        assert_eq!(pod_grace("Pod", "", &unbound, None), None);
        let done = json!({"spec":{"nodeName":"n"},"status":{"phase":"Succeeded"}});
        assert_eq!(pod_grace("Pod", "", &done, None), None);
        let deleting = json!({"metadata":{"deletionGracePeriodSeconds":3},"spec":{"nodeName":"n"}});
        assert_eq!(pod_grace("Pod", "", &deleting, Some(10)), Some(3));
        assert_eq!(pod_grace("Deployment", "apps", &pod, None), None);
    }

    #[test]
    fn propagation_becomes_a_finalizer() {
        let mut o = json!({"metadata":{"name":"d"}});
        record_propagation(&mut o, Some(Propagation::Foreground)).unwrap();
        record_propagation(&mut o, Some(Propagation::Foreground)).unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["foregroundDeletion"]));
        record_propagation(&mut o, Some(Propagation::Background)).unwrap();
        assert_eq!(meta::finalizers(&o).len(), 1);
        mark_deleting("Deployment", &mut o, None).unwrap();
        assert!(meta::deletion_timestamp(&o).is_some());
        assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 0);
    }
}
