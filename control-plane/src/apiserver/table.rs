//! meta.k8s.io/v1 Table output for kubectl: the kind's columns (wide ones at priority 1) and
//! one row per object, each row carrying the object's metadata or the whole object.

use std::sync::Arc;

use serde_json::{json, Value};

use super::negotiate::IncludeObject;
use super::registry::Resource;
use super::rules;
use crate::machinery::ApiError;
use crate::store::cache::CachedObject;
use crate::store::Revision;

/// A Table of `items`.
pub fn render(
    r: &Resource,
    items: &[Arc<CachedObject>],
    include: IncludeObject,
    revision: Option<Revision>,
    continue_token: Option<&str>,
) -> Result<Value, ApiError> {
    let mut rows = Vec::with_capacity(items.len());
    for o in items {
        let v = super::conversion::served_value(r, o)?;
        rows.push(row(r, &v, include));
    }
    let mut meta = json!({});
    if let Some(rev) = revision {
        meta["resourceVersion"] = json!(rev.to_string());
    }
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    Ok(json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": rules::columns(r),
        "rows": rows,
    }))
}

/// One row: the cells and the object as `include` asks.
pub fn row(r: &Resource, v: &Value, include: IncludeObject) -> Value {
    let object = match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Object => v.clone(),
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": v.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
    };
    json!({ "cells": rules::cells(r, v), "object": object })
}

/// A Table holding one object (the object of a watch event, for `kubectl get -w`).
pub fn single(r: &Resource, v: &Value, include: IncludeObject) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": { "resourceVersion": v.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null) },
        "columnDefinitions": rules::columns(r),
        "rows": [row(r, v, include)],
    })
}
