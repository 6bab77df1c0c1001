//! authentication.k8s.io/v1, answered and never stored:
//!
//! - `POST tokenreviews`: who a bearer token stands for (the node agents ask this of the
//!   tokens their callers present), for the audiences asked (default: the API's).
//! - `POST selfsubjectreviews`: who the caller is (`kubectl auth whoami`).
//! - `POST serviceaccounts/<name>/token`: a TokenRequest, answered with a bound service
//!   account token (`kubectl create token`; the node agent's projected token volumes).

use std::sync::Arc;
use std::time::Duration;

use http::{header, StatusCode};
use serde_json::{json, Value};

use super::{Call, Ctx};
use crate::apiserver::admission;
use crate::apiserver::auth::serviceaccount::{
    BoundObject, ObjectRef, TokenSpec, DEFAULT_EXPIRATION, MIN_EXPIRATION,
};
use crate::apiserver::auth::UserInfo;
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry;
use crate::machinery::{ApiError, FieldError};

/// The longest lifetime a TokenRequest may name (Kubernetes: 2^32 seconds).
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// The request body as JSON, checked to be an `authentication.k8s.io/v1` `kind`.
fn decode(call: &Call<'_>, kind: &str) -> Result<Value, ApiError> {
    let format = BodyFormat::of(call.header(header::CONTENT_TYPE))?;
    let obj = negotiate::decode_object(format, &call.body)?;
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let given = obj["kind"].as_str().unwrap_or("");
    if (!api_version.is_empty() && api_version != "authentication.k8s.io/v1")
        || (!given.is_empty() && given != kind)
    {
        return Err(ApiError::bad_request(format!(
            "expected an authentication.k8s.io/v1 {kind}, got {api_version}/{given}"
        )));
    }
    Ok(obj)
}

/// The `authentication.k8s.io/v1` answer: the request as sent with `status` set.
fn answer(mut obj: Value, kind: &str, status: Value) -> Resp {
    obj["apiVersion"] = json!("authentication.k8s.io/v1");
    obj["kind"] = json!(kind);
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]["creationTimestamp"] = json!(crate::apiserver::meta::now());
    obj["status"] = status;
    output::json(StatusCode::CREATED, &obj)
}

fn user_json(u: &UserInfo) -> Value {
    let mut v = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        v["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        v["extra"] = json!(u.extra);
    }
    v
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`
pub async fn token_review(ctx: &Arc<Ctx>, call: &Call<'_>) -> Result<Resp, ApiError> {
    let obj = decode(call, "TokenReview")?;
    let token = obj
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "authentication.k8s.io",
                "TokenReview",
                "",
                vec![FieldError::required("spec.token")],
            )
        })?;
    let audiences = strings(&obj["spec"]["audiences"]);
    let status = match ctx.authenticator.authenticate_token(token, &audiences) {
        Ok((user, audiences)) => json!({
            "authenticated": true,
            "user": user_json(&user),
            "audiences": audiences,
        }),
        Err(why) => {
            tracing::debug!(reason = %why, "TokenReview: not authenticated");
            json!({"user": {}, "error": why})
        }
    };
    Ok(answer(obj, "TokenReview", status))
}

/// `POST /apis/authentication.k8s.io/v1/selfsubjectreviews`
pub async fn self_subject_review(call: &Call<'_>) -> Result<Resp, ApiError> {
    let obj = decode(call, "SelfSubjectReview")?;
    Ok(answer(
        obj,
        "SelfSubjectReview",
        json!({"userInfo": user_json(call.user)}),
    ))
}

/// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`
pub async fn token_request(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let ns = call.namespace().unwrap_or_default().to_string();
    let mut obj = decode(call, "TokenRequest")?;
    let invalid = |causes: Vec<FieldError>| {
        ApiError::invalid("authentication.k8s.io", "TokenRequest", name, causes)
    };
    let account = ctx
        .cached(call.resource, &call.key(name))
        .await?
        .ok_or_else(|| call.not_found(name))?
        .value()
        .map_err(ApiError::internal)?;
    // The admission chain sees the TokenRequest as a create of serviceaccounts/token
    // (NodeRestriction: a node asks only for tokens bound to its own pods).
    let req = admission::Request::new(
        admission::Operation::Create,
        call.resource,
        Some(&ns),
        name,
        call.user,
    )
    .subresource(Some("token"))
    .options(admission::options("CreateOptions", false, None));
    ctx.admission
        .admit(&req, &mut obj, admission::Schema::Trusted)
        .await?;
    let service_account = ObjectRef {
        name: name.to_string(),
        uid: account
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    };
    let tokens = ctx.authenticator.service_accounts();
    let seconds = match obj.pointer("/spec/expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION.as_secs() as i64,
        Some(v) => v.as_i64().ok_or_else(|| {
            invalid(vec![FieldError::invalid(
                "spec.expirationSeconds",
                v,
                "must be an integer",
            )])
        })?,
    };
    if seconds < MIN_EXPIRATION.as_secs() as i64 {
        return Err(invalid(vec![FieldError::invalid_number(
            "spec.expirationSeconds",
            seconds,
            "may not specify a duration less than 10 minutes",
        )]));
    }
    if seconds > MAX_EXPIRATION_SECONDS {
        return Err(invalid(vec![FieldError::invalid_number(
            "spec.expirationSeconds",
            seconds,
            "may not specify a duration larger than 2^32 seconds",
        )]));
    }
    let mut expiration = Duration::from_secs(seconds as u64);
    if let Some(max) = tokens.max_expiration() {
        expiration = expiration.min(max);
    }
    let mut audiences = strings(&obj["spec"]["audiences"]);
    if audiences.is_empty() {
        audiences = tokens.api_audiences().to_vec();
    }
    let bound = match obj.pointer("/spec/boundObjectRef") {
        None | Some(Value::Null) => None,
        Some(r) => Some(bound_object(ctx, &ns, name, r).await?),
    };
    let issued = tokens
        .issue(&TokenSpec {
            namespace: ns.clone(),
            service_account,
            bound,
            audiences: audiences.clone(),
            expiration,
        })
        .map_err(ApiError::internal)?;
    let expires = k8s_openapi::jiff::Timestamp::try_from(issued.expires)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .map_err(ApiError::internal)?;
    obj["metadata"] = json!({"name": name, "namespace": ns});
    obj["spec"]["audiences"] = json!(audiences);
    obj["spec"]["expirationSeconds"] = json!(expiration.as_secs());
    Ok(answer(
        obj,
        "TokenRequest",
        json!({"token": issued.token, "expirationTimestamp": expires}),
    ))
}

/// The object a TokenRequest's `spec.boundObjectRef` names, checked: it exists, its uid
/// is the one given, a pod runs as this service account.
async fn bound_object(
    ctx: &Ctx,
    ns: &str,
    account: &str,
    r: &Value,
) -> Result<BoundObject, ApiError> {
    let kind = r["kind"].as_str().unwrap_or_default();
    let name = r["name"].as_str().unwrap_or_default();
    let plural = match kind {
        "Pod" => "pods",
        "Secret" => "secrets",
        "Node" => "nodes",
        _ => {
            return Err(ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                account,
                vec![FieldError::not_supported(
                    "spec.boundObjectRef.kind",
                    kind,
                    &["Pod", "Secret", "Node"],
                )],
            ))
        }
    };
    let resource = registry::find("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
    let namespace = resource.namespaced().then_some(ns);
    let obj = ctx
        .cached(resource, &resource.key(namespace, name))
        .await?
        .ok_or_else(|| ApiError::not_found("", plural, name))?
        .value()
        .map_err(ApiError::internal)?;
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(want) = r["uid"].as_str().filter(|u| !u.is_empty()) {
        if want != uid {
            return Err(ApiError::conflict(
                "",
                plural,
                name,
                &format!(
                    "the UID in the bound object reference ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
                ),
            ));
        }
    }
    let this = ObjectRef {
        name: name.to_string(),
        uid,
    };
    Ok(match kind {
        "Pod" => {
            let runs_as = obj
                .pointer("/spec/serviceAccountName")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or("default");
            if runs_as != account {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount \"{account}\" to pod running with different serviceaccount name."
                )));
            }
            let node = match obj.pointer("/spec/nodeName").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => {
                    let nodes = registry::find("", "v1", "nodes")
                        .ok_or_else(|| ApiError::internal("nodes not registered"))?;
                    let uid = ctx
                        .cached(nodes, &nodes.key(None, n))
                        .await?
                        .and_then(|o| o.value().ok())
                        .and_then(|v| v.pointer("/metadata/uid")?.as_str().map(str::to_string))
                        .unwrap_or_default();
                    Some(ObjectRef {
                        name: n.to_string(),
                        uid,
                    })
                }
                _ => None,
            };
            BoundObject::Pod { pod: this, node }
        }
        "Secret" => BoundObject::Secret(this),
        _ => BoundObject::Node(this),
    })
}
