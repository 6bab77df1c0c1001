//! The scale subresource (an autoscaling/v1 Scale view of `.spec.replicas`) and pod binding
//! (`pods/<name>/binding` and the legacy `bindings` collection: the scheduler's only write).
//! The subresources a node agent serves (log, exec) are in `kubelet.rs`.

use std::sync::Arc;

use http::{header, StatusCode};
use serde_json::{json, Value};

use super::write::{update_object, Part};
use super::{Call, Ctx};
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry::Resource;
use crate::apiserver::request::WriteOptions;
use crate::apiserver::{crd, meta, rules};
use crate::machinery::ApiError;

/// Where a resource keeps its replicas: `.spec.replicas` and `.status.replicas` for the
/// built-in workloads; a custom resource's scale subresource names its own paths (JSON
/// pointers here) and its selector's (a string in the object).
struct Paths {
    spec: String,
    status: String,
    selector: Option<String>,
}

fn paths(r: &Resource) -> Paths {
    match r.custom().and_then(|c| c.scale.as_ref()) {
        Some(s) => Paths {
            spec: crd::pointer(&s.spec_replicas),
            status: crd::pointer(&s.status_replicas),
            selector: s.label_selector.as_deref().map(crd::pointer),
        },
        None => Paths {
            spec: "/spec/replicas".into(),
            status: "/status/replicas".into(),
            selector: None,
        },
    }
}

/// Sets the value at a JSON pointer, making the objects on the way.
fn set_at(obj: &mut Value, pointer: &str, v: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, p) in parts.iter().enumerate() {
        let key = p.replace("~1", "/").replace("~0", "~");
        if !cur.is_object() {
            *cur = json!({});
        }
        let m = cur.as_object_mut().expect("an object");
        if i + 1 == parts.len() {
            m.insert(key, v);
            return;
        }
        cur = m.entry(key).or_insert_with(|| json!({}));
    }
}

/// The Scale of an object.
fn scale_of(r: &Resource, obj: &Value) -> Value {
    let p = paths(r);
    let mut scale = builtin_scale(obj);
    scale["spec"]["replicas"] = obj.pointer(&p.spec).cloned().unwrap_or(json!(0));
    scale["status"]["replicas"] = obj.pointer(&p.status).cloned().unwrap_or(json!(0));
    if let Some(sel) = &p.selector {
        scale["status"]["selector"] = obj.pointer(sel).cloned().unwrap_or(json!(""));
    }
    scale
}

/// The Scale of an object with `.spec.replicas`.
fn builtin_scale(obj: &Value) -> Value {
    let m = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let selector = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m.get("name"),
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
            "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

fn replicas_of(scale: &Value) -> Result<i64, ApiError> {
    match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v.as_i64().filter(|r| *r >= 0).ok_or_else(|| {
            ApiError::invalid(
                "autoscaling",
                "Scale",
                meta::name(scale).unwrap_or_default(),
                vec![crate::machinery::FieldError::invalid(
                    "spec.replicas",
                    v,
                    "must be greater than or equal to 0",
                )],
            )
        }),
    }
}

pub async fn get_scale(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let o = ctx
        .cached(call.resource, &call.key(name))
        .await?
        .ok_or_else(|| call.not_found(name))?;
    Ok(output::ok(&scale_of(
        call.resource,
        &o.value().map_err(ApiError::internal)?,
    )))
}

pub async fn update_scale(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let opts = super::write::options(call)?;
    let format = BodyFormat::of(call.header(header::CONTENT_TYPE))?;
    let scale = negotiate::decode_object(format, &call.body)?;
    let replicas = replicas_of(&scale)?;
    let expected = meta::resource_version(&scale)
        .map(meta::parse_revision)
        .transpose()?;
    let r = call.resource;
    let stored = update_object(ctx, call, name, Part::Main, expected, &opts, |cur| {
        let mut new = cur.clone();
        set_at(&mut new, &paths(r).spec, json!(replicas));
        Ok(new)
    })
    .await?;
    Ok(output::ok(&scale_of(r, &stored)))
}

pub async fn patch_scale(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let opts = super::write::options(call)?;
    let content_type = call.header(header::CONTENT_TYPE).unwrap_or("");
    let pt = rules::patch_type(content_type)
        .filter(|t| !rules::is_apply(*t))
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let body = call.body.clone();
    let r = call.resource;
    let stored = update_object(ctx, call, name, Part::Main, None, &opts, |cur| {
        let patched = crate::machinery::patch::apply(
            &crate::machinery::GroupKind::new("autoscaling", "Scale"),
            &scale_of(r, cur),
            pt,
            &body,
        )?;
        let mut new = cur.clone();
        set_at(&mut new, &paths(r).spec, json!(replicas_of(&patched)?));
        Ok(new)
    })
    .await?;
    Ok(output::ok(&scale_of(r, &stored)))
}

/// Binds a pod to a node: sets spec.nodeName (once) and the PodScheduled condition.
pub async fn bind(ctx: &Arc<Ctx>, call: &Call<'_>, name: Option<&str>) -> Result<Resp, ApiError> {
    let opts = WriteOptions::from_query(call.query)?;
    let format = BodyFormat::of(call.header(header::CONTENT_TYPE))?;
    let binding = negotiate::decode_object(format, &call.body)?;
    let pod = match (name, meta::name(&binding)) {
        (Some(n), Some(b)) if n != b => {
            return Err(ApiError::bad_request(format!(
                "the name of the binding ({b}) does not match the pod on the URL ({n})"
            )))
        }
        (Some(n), _) | (None, Some(n)) => n.to_string(),
        (None, None) => {
            return Err(ApiError::invalid(
                "",
                "Binding",
                "",
                vec![crate::machinery::FieldError::required("metadata.name")],
            ))
        }
    };
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "",
                "Binding",
                &pod,
                vec![crate::machinery::FieldError::required("target.name")],
            )
        })?
        .to_string();
    let expected_uid = binding
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_string);
    let pods = crate::apiserver::registry::find("", "v1", "pods")
        .ok_or_else(|| ApiError::internal("pods not registered"))?;
    let pod_call = Call {
        method: call.method,
        path: call.path,
        resource: pods,
        query: call.query,
        headers: call.headers,
        body: call.body.clone(),
        query_string: call.query_string,
        upgrade: None,
        user: call.user,
        proxy_path: "",
    };
    update_object(ctx, &pod_call, &pod, Part::System, None, &opts, |cur| {
        if expected_uid.as_deref().is_some_and(|u| Some(u) != meta::uid(cur)) {
            return Err(ApiError::conflict("", "pods", &pod, "the pod's UID does not match the binding's"));
        }
        if meta::deletion_timestamp(cur).is_some() {
            return Err(ApiError::conflict("", "pods", &pod, "the pod is being deleted"));
        }
        if let Some(n) = cur.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict(
                "",
                "pods",
                &pod,
                &format!("pod {pod} is already assigned to node \"{n}\""),
            ));
        }
        let mut new = cur.clone();
        new["spec"]["nodeName"] = json!(node);
        let mut conditions: Vec<Value> = new
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}));
        new["status"]["conditions"] = Value::Array(conditions);
        Ok(new)
    })
    .await?;
    Ok(output::json(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
