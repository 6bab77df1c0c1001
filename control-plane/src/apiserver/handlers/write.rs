//! create, update and patch: decode, fill in the system metadata, the admission chain
//! (mutating plugins, defaulting and validation, validating plugins: `apiserver::admission`),
//! allocation, then one compare-and-swap write to the store, answered only once it is
//! durable. Updates and patches retry on a concurrent write unless the client named the
//! resourceVersion it expects (then a stale one is 409 Conflict).

use std::sync::Arc;

use http::{header, StatusCode};
use serde_json::{json, Value};

use super::read::current;
use super::{certificates, check_kind, store_error, Call, Ctx};
use crate::apiserver::admission::{self, Request, Schema};
use crate::apiserver::authz::escalation;
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry::{Resource, StatusOnCreate, Subresource};
use crate::apiserver::request::{FieldValidation, WriteOptions};
use crate::apiserver::{conversion, meta, rules};
use crate::machinery::fieldmanager::{self, Operation};
use crate::machinery::{ApiError, CauseType, FieldError};
use crate::store::{Precondition, Revision, StoreError, WriteOp};

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The main resource: everything but `.status` (when status is a subresource).
    Main,
    /// The status subresource: only `.status`.
    Status,
    /// `certificatesigningrequests/approval`: only the Approved and Denied conditions.
    Approval,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers`.
    EphemeralContainers,
    /// A write the server itself composes (a binding): taken whole, without the update
    /// validation a client's write gets (which would refuse setting spec.nodeName).
    System,
}

/// Retries of an update that lost a race with another writer.
const UPDATE_RETRIES: usize = 16;

/// The options of a write: the query's, with the field manager taken from the User-Agent
/// when the client named none (Kubernetes' rule), checked as Kubernetes checks them.
pub fn options(call: &Call<'_>) -> Result<WriteOptions, ApiError> {
    let mut opts = WriteOptions::from_query(call.query)?;
    let (options_kind, apply) = match *call.method {
        http::Method::POST => ("CreateOptions", false),
        http::Method::PATCH => (
            "PatchOptions",
            call.header(header::CONTENT_TYPE)
                .and_then(rules::patch_type)
                .is_some_and(rules::is_apply),
        ),
        _ => ("UpdateOptions", false),
    };
    let mut errors = Vec::new();
    match &opts.field_manager {
        None if apply => errors.push(FieldError::new(
            CauseType::Required,
            "fieldManager",
            "Required value: is required for apply patch",
        )),
        Some(m) if m.len() > fieldmanager::MAX_MANAGER_LENGTH => errors.push(FieldError::too_long(
            "fieldManager",
            fieldmanager::MAX_MANAGER_LENGTH,
        )),
        Some(m) if m.chars().any(char::is_control) => errors.push(FieldError::invalid(
            "fieldManager",
            m,
            "must only contain printable characters",
        )),
        _ => {}
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid("meta.k8s.io", options_kind, "", errors));
    }
    if opts.field_manager.is_none() {
        let ua = call.header(header::USER_AGENT).unwrap_or("");
        opts.field_manager = Some(fieldmanager::manager_from_user_agent(ua));
    }
    if apply {
        opts.operation = Operation::Apply;
    }
    Ok(opts)
}

/// Decodes an object body and checks it names this resource.
fn decode_body(call: &Call<'_>, opts: &WriteOptions) -> Result<Value, ApiError> {
    let format = BodyFormat::of(call.header(header::CONTENT_TYPE))?;
    let mut obj = negotiate::decode_object(format, &call.body)?;
    check_kind(call.resource, &mut obj)?;
    // One decode gives both the 400 and the unknown fields.
    let unknown = rules::decode(call.resource, &obj).map_err(ApiError::bad_request)?;
    report_unknown(unknown, opts)?;
    Ok(obj)
}

/// `fieldValidation=Strict`: unknown fields are a 400 naming each; `Warn` (the default):
/// a warning for each (`unknown field "spec.x"`, Kubernetes' text) and the write goes on (a
/// custom resource's are pruned); `Ignore`: nothing is said.
fn strict(r: &Resource, obj: &Value, opts: &WriteOptions) -> Result<(), ApiError> {
    if opts.field_validation == FieldValidation::Ignore {
        return Ok(());
    }
    report_unknown(rules::unknown_fields(r, obj), opts)
}

/// What [`strict`] does with the unknown fields found.
fn report_unknown(unknown: Vec<String>, opts: &WriteOptions) -> Result<(), ApiError> {
    if unknown.is_empty() || opts.field_validation == FieldValidation::Ignore {
        return Ok(());
    }
    if opts.field_validation == FieldValidation::Warn {
        for f in &unknown {
            crate::apiserver::warning::add(format!("unknown field \"{f}\""));
        }
        return Ok(());
    }
    Err(ApiError::bad_request(
        crate::machinery::strict::strict_error_message(&unknown),
    ))
}

/// The object's namespace must be the path's (filled in when absent).
fn place(r: &Resource, ns: Option<&str>, obj: &mut Value) -> Result<(), ApiError> {
    let m = meta::metadata_mut(obj)?;
    let given = m
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    match (r.namespaced(), ns, given) {
        (true, Some(ns), None) => {
            m.insert("namespace".into(), json!(ns));
        }
        (true, Some(ns), Some(g)) if g != ns => return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (true, None, _) => {
            return Err(ApiError::bad_request(format!(
                "{} is namespaced: create it under /namespaces/<namespace>/",
                r.plural
            )))
        }
        (false, _, _) => {
            m.remove("namespace");
        }
        _ => {}
    }
    Ok(())
}

pub async fn create(ctx: &Arc<Ctx>, call: &Call<'_>) -> Result<Resp, ApiError> {
    let opts = options(call)?;
    let obj = decode_body(call, &opts)?;
    escalation::check(ctx, call.user, call.resource, call.namespace(), &obj, None).await?;
    let stored = create_object(ctx, call, obj, &opts).await?;
    Ok(output::json(StatusCode::CREATED, &stored))
}

/// Creates an object: system metadata, admission, allocation, then the write. Returns the
/// stored object.
pub async fn create_object(
    ctx: &Ctx,
    call: &Call<'_>,
    mut obj: Value,
    opts: &WriteOptions,
) -> Result<Value, ApiError> {
    let (r, ns) = (call.resource, call.namespace());
    if let Some(c) = r.custom() {
        if crate::apiserver::crd::terminating(&c.crd) {
            return Err(ApiError::method_not_allowed(
                "create not allowed while custom resource definition is terminating",
            ));
        }
    }
    place(r, ns, &mut obj)?;
    if certificates::is_csr(r) {
        certificates::prepare_create(&mut obj, call.user)?;
    }
    let m = meta::metadata_mut(&mut obj)?;
    let has_name = m
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    if !has_name {
        if let Some(g) = m.get("generateName").and_then(Value::as_str) {
            let n = format!("{g}{}", meta::random_suffix(5));
            m.insert("name".into(), json!(n));
        }
    }
    m.insert("uid".into(), json!(meta::new_uid()));
    m.insert("creationTimestamp".into(), json!(meta::now()));
    match rules::tracks_generation(r) {
        true => m.insert("generation".into(), json!(1)),
        false => m.remove("generation"),
    };
    for k in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        m.remove(k);
    }
    if r.custom().is_some() && r.status_on_create == StatusOnCreate::Reset {
        // A custom resource with a status subresource starts without one (Kubernetes'
        // PrepareForCreate drops it: an empty status could break the schema's required).
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
    } else if r.status_on_create == StatusOnCreate::Reset {
        let status = match r.kind {
            "Pod" => json!({"phase": "Pending"}),
            "Namespace" => json!({"phase": "Active"}),
            "PersistentVolumeClaim" => json!({"phase": "Pending"}),
            // Kubernetes' volume strategy: Pending since now.
            "PersistentVolume" => {
                json!({"phase": "Pending", "lastPhaseTransitionTime": meta::now()})
            }
            _ => json!({}),
        };
        obj["status"] = status;
    }
    if r.group.is_empty() && r.kind == "Namespace" {
        // The namespace controller removes this finalizer once the namespace is empty.
        obj["spec"]["finalizers"] = json!(["kubernetes"]);
    }
    let name = meta::name(&obj).unwrap_or_default().to_string();
    rules::default(r, &mut obj);
    rules::normalize(r, &mut obj);
    if opts.operation == Operation::Update {
        rules::record_update(r, None, &mut obj, opts, "");
    }
    let req = Request::new(
        admission::Operation::Create,
        r,
        ns.filter(|_| r.namespaced()),
        &name,
        call.user,
    )
    .dry_run(opts.dry_run)
    .options(admission::options(
        "CreateOptions",
        opts.dry_run,
        opts.field_manager.as_deref(),
    ));
    ctx.admission
        .admit(&req, &mut obj, Schema::Validate)
        .await?;
    let alloc = ctx
        .allocator
        .allocate_create(r, &mut obj, opts.dry_run)
        .await?;
    if opts.dry_run {
        ctx.allocator.rollback(alloc).await;
        return Ok(obj);
    }
    let value = conversion::stored_bytes(r, &obj)?;
    let written = ctx
        .store
        .write(WriteOp::Put {
            key: r.key(ns.filter(|_| r.namespaced()), &name),
            value,
            precondition: Precondition::MustNotExist,
        })
        .await;
    match written {
        Ok(w) => {
            ctx.allocator.commit(alloc).await;
            meta::set_resource_version(&mut obj, w.revision);
            ctx.metrics.wrote(r.plural, "create");
            Ok(obj)
        }
        Err(e) => {
            ctx.allocator.rollback(alloc).await;
            Err(store_error(r, &name, e))
        }
    }
}

pub async fn update(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    name: &str,
    part: Part,
) -> Result<Resp, ApiError> {
    let opts = options(call)?;
    if part == Part::Status
        && BodyFormat::of(call.header(header::CONTENT_TYPE))? == BodyFormat::Protobuf
        && !crate::apiserver::protobuf::converts_status(call.resource.kind)
    {
        // The protobuf decoders drop what they do not convert of a status (kubectl never
        // writes one); a status write must not lose it silently.
        return Err(ApiError::unsupported_media_type(
            "application/vnd.kubernetes.protobuf for a status (send JSON)",
        ));
    }
    let mut obj = decode_body(call, &opts)?;
    match meta::name(&obj) {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => {
            meta::metadata_mut(&mut obj)?.insert("name".into(), json!(name));
        }
    }
    place(call.resource, call.namespace(), &mut obj)?;
    let expected = meta::resource_version(&obj)
        .map(meta::parse_revision)
        .transpose()?;
    let stored = update_object(ctx, call, name, part, expected, &opts, |_| Ok(obj.clone())).await?;
    Ok(output::ok(&stored))
}

pub async fn patch(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    name: &str,
    part: Part,
) -> Result<Resp, ApiError> {
    let opts = options(call)?;
    let content_type = call.header(header::CONTENT_TYPE).unwrap_or("");
    let patch_type = rules::patch_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let apply = opts.operation == Operation::Apply;
    let body = call.body.clone();
    let r = call.resource;
    // A patch naming a resourceVersion is a precondition, as Kubernetes treats it.
    let expected = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| meta::resource_version(&v).map(str::to_string))
        .map(|rv| meta::parse_revision(&rv))
        .transpose()?;
    let result = update_object(ctx, call, name, part, expected, &opts, |cur| {
        let patched = match apply {
            true => rules::apply(r, Some(cur), &body, &opts)?,
            false => rules::patch(r, cur, patch_type, &body)?,
        };
        strict(r, &patched, &opts)?;
        Ok(patched)
    })
    .await;
    match result {
        Err(e) if e.code == 404 && apply && part == Part::Main => {
            // Server-side apply creates what does not exist yet.
            let mut obj = rules::apply(r, None, &body, &opts)?;
            meta::metadata_mut(&mut obj)?
                .entry("name")
                .or_insert_with(|| json!(name));
            check_kind(r, &mut obj)?;
            strict(r, &obj, &opts)?;
            escalation::check(ctx, call.user, r, call.namespace(), &obj, None).await?;
            let stored = create_object(ctx, call, obj, &opts).await?;
            Ok(output::json(StatusCode::CREATED, &stored))
        }
        other => Ok(output::ok(&other?)),
    }
}

/// The read-modify-write loop of every update: `mutate` computes the desired object from the
/// current one; the write is a compare-and-swap on the current revision.
pub async fn update_object(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
    part: Part,
    expected: Option<Revision>,
    opts: &WriteOptions,
    mut mutate: impl FnMut(&Value) -> Result<Value, ApiError>,
) -> Result<Value, ApiError> {
    let r = call.resource;
    for _ in 0..UPDATE_RETRIES {
        let (cur, cur_rev) = current(ctx, call, name).await?;
        if expected.is_some_and(|e| e != cur_rev) {
            return Err(store_error(
                r,
                name,
                StoreError::Conflict {
                    key: call.key(name),
                    expected: expected.unwrap_or_default(),
                    actual: cur_rev,
                },
            ));
        }
        let mut new = mutate(&cur)?;
        check_kind(r, &mut new)?;
        prepare_update(r, part, &mut new, &cur)?;
        rules::default(r, &mut new);
        rules::normalize(r, &mut new);
        if opts.operation == Operation::Update && part != Part::System {
            let subresource = call.path.subresource.as_deref().unwrap_or("");
            rules::record_update(r, Some(&cur), &mut new, opts, subresource);
        }
        // A binding is Kubernetes' CREATE of pods/binding; the rest update the object.
        let (operation, subresource, schema) = match part {
            Part::System => (
                admission::Operation::Create,
                Some("binding"),
                Schema::Trusted,
            ),
            Part::Main | Part::Status | Part::Approval => (
                admission::Operation::Update,
                call.path.subresource.as_deref(),
                Schema::Validate,
            ),
            Part::EphemeralContainers => (
                admission::Operation::Update,
                call.path.subresource.as_deref(),
                Schema::EphemeralContainers,
            ),
        };
        let req = Request::new(operation, r, call.namespace(), name, call.user)
            .subresource(subresource)
            .old(&cur)
            .dry_run(opts.dry_run)
            .options(admission::options(
                "UpdateOptions",
                opts.dry_run,
                opts.field_manager.as_deref(),
            ));
        ctx.admission.admit(&req, &mut new, schema).await?;
        if certificates::is_csr(r) {
            certificates::authorize_update(ctx, call.user, subresource, &new, &cur).await?;
        }
        escalation::check(ctx, call.user, r, call.namespace(), &new, Some(&cur)).await?;
        let alloc = ctx
            .allocator
            .allocate_update(r, &mut new, &cur, opts.dry_run)
            .await?;
        if unchanged(&new, &cur) || opts.dry_run {
            ctx.allocator.rollback(alloc).await;
            return Ok(if opts.dry_run { new } else { cur });
        }
        let finished = finishes_deletion(&cur, &new);
        let op = if finished {
            WriteOp::Delete {
                key: call.key(name),
                precondition: Precondition::ModRevision(cur_rev),
            }
        } else {
            WriteOp::Put {
                key: call.key(name),
                value: conversion::stored_bytes(r, &new)?,
                precondition: Precondition::ModRevision(cur_rev),
            }
        };
        match ctx.store.write(op).await {
            Ok(w) => {
                ctx.allocator.commit(alloc).await;
                if finished {
                    ctx.allocator.deleted(r, &new).await;
                }
                meta::set_resource_version(&mut new, w.revision);
                ctx.metrics.wrote(r.plural, "update");
                return Ok(new);
            }
            Err(StoreError::Conflict { .. }) if expected.is_none() => {
                ctx.allocator.rollback(alloc).await;
            }
            Err(e) => {
                ctx.allocator.rollback(alloc).await;
                return Err(store_error(r, name, e));
            }
        }
    }
    Err(ApiError::conflict(
        r.group,
        r.plural,
        name,
        "too many concurrent writes; please retry",
    ))
}

/// Whether something still holds an object that is being deleted: metadata finalizers, or a
/// namespace's spec finalizers.
pub fn blocks_deletion(obj: &Value) -> bool {
    !meta::finalizers(obj).is_empty()
        || obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
}

/// Whether an update finishes a deletion (Kubernetes' ShouldDeleteDuringUpdate): the object
/// is being deleted, nothing holds it any more, and no grace period runs. A pod under
/// graceful deletion goes only with the node agent's final DELETE (grace 0), never with a
/// status write; status writes cannot remove finalizers, so they finish nothing.
fn finishes_deletion(cur: &Value, new: &Value) -> bool {
    let grace = cur
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    meta::deletion_timestamp(cur).is_some() && grace == 0 && !blocks_deletion(new)
}

/// A volume whose phase changes records when (Kubernetes' volume status strategy), unless
/// the writer set a new time itself.
fn stamp_phase_transition(new: &mut Value, cur: &Value) {
    let phase = |v: &Value| v.pointer("/status/phase").cloned();
    let time = |v: &Value| v.pointer("/status/lastPhaseTransitionTime").cloned();
    if phase(new) == phase(cur) || !new["status"].is_object() {
        return;
    }
    if time(new).is_none_or(|t| t.is_null() || Some(&t) == time(cur).as_ref()) {
        new["status"]["lastPhaseTransitionTime"] = json!(meta::now());
    }
}

/// Carries over what a client cannot change and separates the main resource from status.
fn prepare_update(r: &Resource, part: Part, new: &mut Value, cur: &Value) -> Result<(), ApiError> {
    if certificates::is_csr(r) && matches!(part, Part::Status | Part::Approval) {
        // Approval only through /approval, the rest of status only through /status.
        *new = match part {
            Part::Approval => crate::machinery::kinds::certificates::approval_update(new, cur),
            _ => crate::machinery::kinds::certificates::status_update(new, cur),
        };
        return Ok(());
    }
    if part == Part::Status {
        // Only status changes (Kubernetes' ResetObjectMetaForStatus and status strategies).
        let status = new.get("status").cloned();
        let mut merged = cur.clone();
        match status {
            Some(s) => merged["status"] = s,
            None => {
                if let Some(o) = merged.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        if r.kind == "Namespace" {
            // /finalize changes spec.finalizers.
            if let Some(f) = new.pointer("/spec/finalizers") {
                merged["spec"]["finalizers"] = f.clone();
            }
        }
        if r.group.is_empty() && r.kind == "PersistentVolume" {
            stamp_phase_transition(&mut merged, cur);
        }
        *new = merged;
        return Ok(());
    }
    if part == Part::EphemeralContainers {
        // Only the ephemeral containers change (Kubernetes' ephemeral containers strategy).
        let ephemeral = new.pointer("/spec/ephemeralContainers").cloned();
        *new = cur.clone();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            match ephemeral {
                Some(e) => spec.insert("ephemeralContainers".into(), e),
                None => spec.remove("ephemeralContainers"),
            };
        }
        return Ok(());
    }
    if part == Part::Main && r.has(Subresource::EphemeralContainers) {
        // ... and the main resource never changes them.
        let kept = cur.pointer("/spec/ephemeralContainers").cloned();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            match kept {
                Some(e) => spec.insert("ephemeralContainers".into(), e),
                None => spec.remove("ephemeralContainers"),
            };
        }
    }
    if part == Part::Main && r.has(Subresource::Status) {
        match cur.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    let cur_meta = cur.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let spec_changed = meta::without_meta_and_status(new) != meta::without_meta_and_status(cur);
    let m = meta::metadata_mut(new)?;
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "namespace",
        "name",
    ] {
        match cur_meta.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
    m.remove("selfLink");
    if rules::tracks_generation(r) {
        let generation = meta::generation(cur) + i64::from(spec_changed);
        m.insert("generation".into(), json!(generation.max(1)));
    } else {
        match cur_meta.get("generation") {
            Some(g) => m.insert("generation".into(), g.clone()),
            None => m.remove("generation"),
        };
    }
    Ok(())
}

/// Whether an update changes nothing, managed fields included (then nothing is written and
/// the revision stays).
fn unchanged(new: &Value, cur: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        v
    };
    strip(new) == strip(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::find;

    #[test]
    fn main_writes_keep_status_and_system_metadata() {
        let r = find("apps", "v1", "deployments").unwrap();
        let cur = json!({"metadata":{"name":"d","uid":"u1","generation":3,"creationTimestamp":"t"},
            "spec":{"replicas":1},"status":{"replicas":1}});
        let mut new = json!({"metadata":{"name":"d","uid":"other"},"spec":{"replicas":2},"status":{"replicas":9}});
        prepare_update(r, Part::Main, &mut new, &cur).unwrap();
        assert_eq!(new["status"]["replicas"], 1);
        assert_eq!(new["metadata"]["uid"], "u1");
        assert_eq!(new["metadata"]["generation"], 4);
        let mut same = json!({"metadata":{"name":"d","labels":{"a":"b"}},"spec":{"replicas":1}});
        prepare_update(r, Part::Main, &mut same, &cur).unwrap();
        assert_eq!(
            same["metadata"]["generation"], 3,
            "a metadata change keeps the generation"
        );
    }

    #[test]
    fn a_volume_records_its_phase_transitions() {
        let r = find("", "v1", "persistentvolumes").unwrap();
        let t0 = "2020-01-01T00:00:00Z";
        let cur = json!({"metadata":{"name":"pv"},"spec":{},
            "status":{"phase":"Pending","lastPhaseTransitionTime":t0}});
        let mut new = json!({"metadata":{"name":"pv"},
            "status":{"phase":"Available","lastPhaseTransitionTime":t0}});
        prepare_update(r, Part::Status, &mut new, &cur).unwrap();
        assert_ne!(new["status"]["lastPhaseTransitionTime"], t0);
        let mut same = cur.clone();
        same["status"]["message"] = json!("m");
        prepare_update(r, Part::Status, &mut same, &cur).unwrap();
        assert_eq!(same["status"]["lastPhaseTransitionTime"], t0);
    }

    #[test]
    fn status_writes_change_only_status() {
        let r = find("", "v1", "pods").unwrap();
        let cur = json!({"metadata":{"name":"p","labels":{"a":"b"}},"spec":{"nodeName":"n"},"status":{"phase":"Pending"}});
        let mut new = json!({"metadata":{"name":"p","labels":{}},"spec":{"nodeName":"x"},"status":{"phase":"Running"}});
        prepare_update(r, Part::Status, &mut new, &cur).unwrap();
        assert_eq!(new["status"]["phase"], "Running");
        assert_eq!(new["spec"]["nodeName"], "n");
        assert_eq!(new["metadata"]["labels"]["a"], "b");
    }

    #[test]
    fn deletion_finishes_when_nothing_holds_the_object_and_no_grace_runs() {
        let graceful =
            json!({"metadata":{"deletionTimestamp":"t","deletionGracePeriodSeconds":30}});
        assert!(
            !finishes_deletion(&graceful, &graceful),
            "a pod in its grace period"
        );
        let held = json!({"metadata":{"deletionTimestamp":"t","deletionGracePeriodSeconds":0,"finalizers":["f"]}});
        let released = json!({"metadata":{"deletionTimestamp":"t","deletionGracePeriodSeconds":0}});
        assert!(!finishes_deletion(&held, &held));
        assert!(finishes_deletion(&held, &released));
        let live = json!({"metadata":{}});
        assert!(!finishes_deletion(&live, &live));
        let ns = json!({"metadata":{"deletionTimestamp":"t","deletionGracePeriodSeconds":0},"spec":{"finalizers":["kubernetes"]}});
        let finalized = json!({"metadata":{"deletionTimestamp":"t"},"spec":{"finalizers":[]}});
        assert!(!finishes_deletion(&ns, &ns));
        assert!(finishes_deletion(&ns, &finalized));
    }

    #[test]
    fn namespaces_are_checked() {
        let pods = find("", "v1", "pods").unwrap();
        let mut o = json!({"metadata":{"name":"p","namespace":"other"}});
        assert_eq!(place(pods, Some("default"), &mut o).unwrap_err().code, 400);
        let mut o = json!({"metadata":{"name":"p"}});
        place(pods, Some("default"), &mut o).unwrap();
        assert_eq!(o["metadata"]["namespace"], "default");
        let nodes = find("", "v1", "nodes").unwrap();
        let mut o = json!({"metadata":{"name":"n","namespace":"x"}});
        place(nodes, None, &mut o).unwrap();
        assert!(o["metadata"].get("namespace").is_none());
    }
}
