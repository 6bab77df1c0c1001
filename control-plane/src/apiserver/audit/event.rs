//! The shape of one audit record: Kubernetes' audit.k8s.io/v1 `Event` at the Metadata level
//! (who, what, on which object, with which outcome; never a request or response body), as
//! kube-apiserver writes it one JSON object a line. Pure.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::apiserver::auth::UserInfo;
use crate::apiserver::authz::attributes::{Attributes, Target};
use crate::apiserver::authz::impersonation::{ANONYMOUS, UNAUTHENTICATED};
use crate::machinery::ApiError;

/// When in a request's life the event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Stage {
    /// A long-running request (watch, exec, proxy, ...) sent its response headers.
    ResponseStarted,
    /// The response was sent in full (for a long-running one: the stream ended).
    ResponseComplete,
}

/// audit.k8s.io/v1 Event, Metadata level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: &'static str,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: Stage,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: User,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<User>,
    #[serde(rename = "sourceIPs")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    pub response_status: ResponseStatus,
    /// metav1.MicroTime (RFC 3339 with microseconds).
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// authentication.k8s.io/v1 UserInfo.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct User {
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// Who a request without (valid) credentials is.
    pub fn anonymous() -> User {
        User {
            username: ANONYMOUS.to_string(),
            uid: String::new(),
            groups: vec![UNAUTHENTICATED.to_string()],
            extra: BTreeMap::new(),
        }
    }
}

impl From<&UserInfo> for User {
    fn from(u: &UserInfo) -> User {
        User {
            username: u.name.clone(),
            uid: u.uid.clone(),
            groups: u.groups.clone(),
            extra: u.extra.clone(),
        }
    }
}

/// The object a resource request is about (empty parts left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

impl ObjectRef {
    /// The object of a resource request (None for non-resource paths).
    pub fn of(a: &Attributes) -> Option<ObjectRef> {
        match &a.target {
            Target::NonResource { .. } => None,
            Target::Resource(r) => Some(ObjectRef {
                resource: r.resource.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                api_group: r.group.clone(),
                api_version: r.version.clone(),
                subresource: r.subresource.clone(),
            }),
        }
    }
}

/// The bounded part of the response's Status, as Kubernetes records it: the code always; for
/// an error also `Failure`, the reason and the message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResponseStatus {
    pub metadata: Empty,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    pub code: u16,
}

/// `{}` (Status' empty ListMeta).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Empty {}

impl ResponseStatus {
    pub fn code(code: u16) -> ResponseStatus {
        ResponseStatus {
            metadata: Empty {},
            status: None,
            message: None,
            reason: None,
            code,
        }
    }

    pub fn error(e: &ApiError) -> ResponseStatus {
        ResponseStatus {
            metadata: Empty {},
            status: Some("Failure"),
            message: Some(e.message.clone()),
            reason: Some(e.reason.as_str()),
            code: e.code,
        }
    }
}

/// Now as metav1.MicroTime: `2026-12-02T01:20:00.123456Z`.
pub fn micro_time() -> String {
    let now = jiff::Timestamp::now();
    format!("{now:.6}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn an_event_serializes_as_kubernetes_writes_it() {
        let q = Default::default();
        let a = Attributes::of_request(
            &Method::GET,
            "/apis/apps/v1/namespaces/a/deployments/web",
            &q,
        );
        let e = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: "Metadata",
            audit_id: "id".into(),
            stage: Stage::ResponseComplete,
            request_uri: "/apis/apps/v1/namespaces/a/deployments/web".into(),
            verb: a.verb.clone(),
            user: User::anonymous(),
            impersonated_user: None,
            source_ips: vec!["127.0.0.1".into()],
            user_agent: None,
            object_ref: ObjectRef::of(&a),
            response_status: ResponseStatus::error(&ApiError::unauthorized()),
            request_received_timestamp: "t0".into(),
            stage_timestamp: "t1".into(),
            annotations: BTreeMap::new(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                "auditID": "id", "stage": "ResponseComplete",
                "requestURI": "/apis/apps/v1/namespaces/a/deployments/web", "verb": "get",
                "user": {"username": "system:anonymous", "groups": ["system:unauthenticated"]},
                "sourceIPs": ["127.0.0.1"],
                "objectRef": {"resource": "deployments", "namespace": "a", "name": "web",
                    "apiGroup": "apps", "apiVersion": "v1"},
                "responseStatus": {"metadata": {}, "status": "Failure", "message": "Unauthorized",
                    "reason": "Unauthorized", "code": 401},
                "requestReceivedTimestamp": "t0", "stageTimestamp": "t1",
            })
        );
    }

    #[test]
    fn micro_time_has_microseconds() {
        let t = micro_time();
        assert_eq!(t.len(), "2026-12-02T01:20:00.123456Z".len(), "{t}");
        assert!(t.ends_with('Z'), "{t}");
    }
}
