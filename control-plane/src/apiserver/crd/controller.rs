//! What apiextensions-apiserver's controllers do, run in every API server (each must serve
//! every definition; their status writes are idempotent and guarded by resourceVersion, so
//! several servers agree): a definition whose names are free is served (its versions put in
//! the table) and then marked NamesAccepted and Established; a definition being deleted stops
//! taking new objects, its objects are deleted, then its cleanup finalizer is removed and it
//! goes; a deleted definition is no longer served.
//!
//! Driven by the watch cache's events for definitions (O(changed)), with a full pass at start
//! and whenever the watch starts over, and a one-second tick only while a definition's
//! objects are being deleted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::super::registry::{self, Resource};
use crate::machinery::kinds::apiextensions::CLEANUP_FINALIZER;
use crate::store::cache::{Cache, CachedObject, Filter, WatchEvent, WatchStart};
use crate::store::{Precondition, Store, StoreError, WriteOp};

const CRDS: &str = "/registry/customresourcedefinitions/";

/// Serves every stored definition that can be served (at start, before the server listens,
/// so a restarted server answers for custom resources at once).
pub fn load(cache: &Cache) {
    let Ok(rc) = cache.resource(CRDS) else {
        return;
    };
    let all: Filter = Arc::new(|_| true);
    for o in rc.list(CRDS, &all, None, None).items {
        if let Ok(v) = o.value() {
            if let Plan::Serve(resources) = plan(&v) {
                super::register(&name_of(&v), resources);
            }
        }
    }
}

/// Runs until `shutdown`.
pub async fn run(store: Arc<dyn Store>, cache: Arc<Cache>, shutdown: CancellationToken) {
    let Ok(rc) = cache.resource(CRDS).cloned() else {
        tracing::error!("no cache of customresourcedefinitions");
        return;
    };
    let mut cleaning: BTreeSet<String> = BTreeSet::new();
    'watch: loop {
        let all: Filter = Arc::new(|_| true);
        let mut watch = match rc.watch(CRDS, WatchStart::Current, all, None) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "watching definitions");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        // The initial events are every definition: forget what is no longer stored.
        let mut present = BTreeSet::new();
        while let Some(e) = watch.next_initial() {
            present.insert(e.object().name.clone());
            handle(store.as_ref(), &cache, &e, &mut cleaning).await;
        }
        for r in super::served() {
            if let Some(c) = r.custom() {
                if !present.contains(&c.crd) {
                    super::unregister(&c.crd);
                }
            }
        }
        loop {
            let tick = async {
                if cleaning.is_empty() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(Duration::from_secs(1)).await
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick => {
                    for name in cleaning.clone() {
                        let key = format!("{CRDS}{name}");
                        match rc.get(&key) {
                            Ok(Some(o)) => {
                                let e = WatchEvent::Modified(o);
                                handle(store.as_ref(), &cache, &e, &mut cleaning).await;
                            }
                            _ => { cleaning.remove(&name); }
                        }
                    }
                }
                e = watch.next() => match e {
                    Ok(e) => handle(store.as_ref(), &cache, &e, &mut cleaning).await,
                    Err(end) => {
                        tracing::info!(?end, "the definitions' watch starts over");
                        continue 'watch;
                    }
                },
            }
        }
    }
}

async fn handle(store: &dyn Store, cache: &Cache, e: &WatchEvent, cleaning: &mut BTreeSet<String>) {
    let o = e.object();
    if let WatchEvent::Deleted(_) = e {
        super::unregister(&o.name);
        cleaning.remove(&o.name);
        tracing::info!(crd = %o.name, "no longer served");
        return;
    }
    if let Err(err) = reconcile(store, cache, o, cleaning).await {
        // Another server wrote first, or the store is away: the next event or tick retries.
        tracing::debug!(crd = %o.name, error = %err, "reconciling a definition");
    }
}

enum Plan {
    Serve(Vec<&'static Resource>),
    Conflict(String),
    Invalid(String),
}

fn name_of(v: &Value) -> String {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Whether the definition can be served and as what.
fn plan(v: &Value) -> Plan {
    let name = name_of(v);
    let group = v
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or("");
    if registry::RESOURCES.iter().any(|r| r.group == group) {
        return Plan::Conflict(format!(
            "the group {group} is served by the API server itself"
        ));
    }
    let names = &v["spec"]["names"];
    let str_of = |k: &str| {
        names
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut mine: Vec<String> = vec![str_of("plural"), str_of("singular")];
    mine.extend(
        names["shortNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from),
    );
    let kind = str_of("kind");
    for other in super::served() {
        let Some(c) = other.custom() else { continue };
        if c.crd == name || other.group != group {
            continue;
        }
        let theirs: Vec<&str> = [other.plural, other.singular]
            .into_iter()
            .chain(other.short_names.iter().copied())
            .collect();
        if let Some(clash) = mine
            .iter()
            .find(|m| !m.is_empty() && theirs.contains(&m.as_str()))
        {
            return Plan::Conflict(format!("\"{clash}\" is already in use"));
        }
        if other.kind == kind {
            return Plan::Conflict(format!("\"{kind}\" is already in use"));
        }
    }
    match super::resources_of(v) {
        Ok(r) => Plan::Serve(r),
        Err(errs) => Plan::Invalid(
            errs.iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}

async fn reconcile(
    store: &dyn Store,
    cache: &Cache,
    o: &CachedObject,
    cleaning: &mut BTreeSet<String>,
) -> Result<(), StoreError> {
    let v = o
        .value()
        .map_err(|e| StoreError::Backend(format!("decoding {}: {e}", o.key)))?;
    let name = o.name.clone();
    let finalizers: Vec<String> = v["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect();
    let deleting = v.pointer("/metadata/deletionTimestamp").is_some();
    if deleting {
        super::set_terminating(&name);
        if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
            return Ok(());
        }
        cleaning.insert(name.clone());
        let mut status = v["status"].clone();
        set_condition(
            &mut status,
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
        );
        let mut v = v;
        if status != v["status"] {
            v["status"] = status;
            put(store, &o.key, &v, o.revision).await?;
            return Ok(());
        }
        if delete_objects(store, cache, &v).await? > 0 {
            return Ok(());
        }
        let kept: Vec<Value> = finalizers
            .iter()
            .filter(|f| *f != CLEANUP_FINALIZER)
            .map(|f| json!(f))
            .collect();
        if kept.is_empty() {
            store
                .write(WriteOp::Delete {
                    key: o.key.clone(),
                    precondition: Precondition::ModRevision(o.revision),
                })
                .await?;
        } else {
            v["metadata"]["finalizers"] = json!(kept);
            put(store, &o.key, &v, o.revision).await?;
        }
        cleaning.remove(&name);
        tracing::info!(crd = %name, "objects deleted; the definition goes");
        return Ok(());
    }
    let mut v = v;
    if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        let mut f: Vec<Value> = finalizers.iter().map(|f| json!(f)).collect();
        f.push(json!(CLEANUP_FINALIZER));
        v["metadata"]["finalizers"] = json!(f);
        put(store, &o.key, &v, o.revision).await?;
        return Ok(());
    }
    let mut status = v["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    match plan(&v) {
        Plan::Serve(resources) => {
            // Served first, then Established: a client that waits for the condition finds
            // the resource.
            super::register(&name, resources);
            set_condition(
                &mut status,
                "NamesAccepted",
                "True",
                "NoConflicts",
                "no conflicts found",
            );
            set_condition(
                &mut status,
                "Established",
                "True",
                "InitialNamesAccepted",
                "the initial names have been accepted",
            );
            status["acceptedNames"] = v["spec"]["names"].clone();
            let storage = v["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|x| x["storage"] == true)
                .and_then(|x| x["name"].as_str())
                .unwrap_or("")
                .to_string();
            let mut stored: Vec<Value> = status["storedVersions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !storage.is_empty() && !stored.contains(&json!(storage)) {
                stored.push(json!(storage));
            }
            status["storedVersions"] = json!(stored);
        }
        Plan::Conflict(why) => {
            set_condition(
                &mut status,
                "NamesAccepted",
                "False",
                "MultipleNamesNotAllowed",
                &why,
            );
            set_condition(
                &mut status,
                "Established",
                "False",
                "NotAccepted",
                "not all names are accepted",
            );
            if status.get("acceptedNames").is_none() {
                status["acceptedNames"] = json!({"plural": "", "kind": ""});
            }
        }
        Plan::Invalid(why) => {
            set_condition(&mut status, "Established", "False", "Invalid", &why);
        }
    }
    if status != v["status"] {
        v["status"] = status;
        put(store, &o.key, &v, o.revision).await?;
    }
    Ok(())
}

/// Deletes the definition's objects (those with finalizers are marked deleted and waited
/// for); returns how many remain.
async fn delete_objects(
    store: &dyn Store,
    cache: &Cache,
    crd: &Value,
) -> Result<usize, StoreError> {
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or("");
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or("");
    if group.is_empty() || plural.is_empty() {
        return Ok(0);
    }
    let prefix = format!("/registry/{group}/{plural}/");
    let Ok(rc) = cache.resource(crate::store::cache::CUSTOM_PREFIX) else {
        return Ok(0);
    };
    let all: Filter = Arc::new(|_| true);
    let items = rc.list(&prefix, &all, None, None).items;
    let remaining = items.len();
    for o in items {
        let Ok(mut v) = o.value() else { continue };
        let has_finalizers = v["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let result = if !has_finalizers {
            store
                .write(WriteOp::Delete {
                    key: o.key.clone(),
                    precondition: Precondition::ModRevision(o.revision),
                })
                .await
                .map(|_| ())
        } else if v.pointer("/metadata/deletionTimestamp").is_none() {
            v["metadata"]["deletionTimestamp"] = json!(super::super::meta::now());
            v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            put(store, &o.key, &v, o.revision).await
        } else {
            Ok(())
        };
        match result {
            Ok(()) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(remaining)
}

async fn put(
    store: &dyn Store,
    key: &str,
    v: &Value,
    rev: crate::store::Revision,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(v).map_err(|e| StoreError::Backend(e.to_string()))?;
    store
        .write(WriteOp::Put {
            key: key.to_string(),
            value: bytes.into(),
            precondition: Precondition::ModRevision(rev),
        })
        .await
        .map(|_| ())
}

/// Sets a condition, keeping its lastTransitionTime when its status does not change.
fn set_condition(status: &mut Value, type_: &str, s: &str, reason: &str, message: &str) {
    if !status.is_object() {
        *status = json!({});
    }
    let conds = status
        .as_object_mut()
        .expect("an object")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let list = conds.as_array_mut().expect("an array");
    let now = super::super::meta::now();
    match list.iter_mut().find(|c| c["type"] == type_) {
        Some(c) => {
            if c["status"] != s {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(s);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        None => list.push(json!({
            "type": type_, "status": s, "reason": reason, "message": message,
            "lastTransitionTime": now,
        })),
    }
}
