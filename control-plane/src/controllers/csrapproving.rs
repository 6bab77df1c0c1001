//! The CSR approving controller (Kubernetes' csrapproving): a pending request of the
//! `kubernetes.io/kube-apiserver-client-kubelet` signer for a node client certificate
//! (CN `system:node:<name>`, O `system:nodes`, no SANs, client auth) is approved when its
//! requester may `create` `certificatesigningrequests/nodeclient` (a node agent joining with a
//! bootstrap token) or, for a request for its own name, `.../selfnodeclient` (a node
//! renewing its certificate). The requester's permission is asked of the API server with a
//! SubjectAccessReview, so RBAC decides. Anything else stays pending for a person (`kubectl
//! certificate approve|deny`); this controller never denies.
//!
//! Scale: one reconcile per changed request; one or two SubjectAccessReviews per node client
//! request, none for others.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::Value;

use super::csrsigning::kubelet_problem;
use super::Context;
use crate::machinery::kinds::certificates::{
    self as csr, APPROVED, DENIED, GROUP, KUBE_APISERVER_CLIENT_KUBELET,
};
use crate::pki::CertRequest;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "csrapproving";

/// The permission that lets a request be approved automatically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recognized {
    /// A node renewing its own certificate (`certificatesigningrequests/selfnodeclient`).
    SelfNodeClient,
    /// Anyone allowed to ask for node client certificates (`.../nodeclient`).
    NodeClient,
}

impl Recognized {
    pub fn subresource(self) -> &'static str {
        match self {
            Recognized::SelfNodeClient => "selfnodeclient",
            Recognized::NodeClient => "nodeclient",
        }
    }
}

/// The permissions that would approve `c` (its JSON), most specific first; empty when it is
/// not a pending node client request.
pub fn recognize(c: &Value) -> Vec<Recognized> {
    let signer = c
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if signer != KUBE_APISERVER_CLIENT_KUBELET
        || csr::has_condition(c, APPROVED)
        || csr::has_condition(c, DENIED)
        || csr::certificate_pem(c).is_some()
    {
        return vec![];
    }
    let Some(Ok(req)) = csr::request_pem(c).map(|pem| CertRequest::parse(&pem)) else {
        return vec![];
    };
    let usages: Vec<String> = c
        .pointer("/spec/usages")
        .and_then(|u| serde_json::from_value(u.clone()).ok())
        .unwrap_or_default();
    if kubelet_problem(signer, &req, &usages).is_some() {
        return vec![];
    }
    let username = c
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut out = vec![];
    if username == req.subject.common_name {
        out.push(Recognized::SelfNodeClient);
    }
    out.push(Recognized::NodeClient);
    out
}

pub struct ApprovingController {
    client: Client,
    csrs: Informer<CertificateSigningRequest>,
}

pub fn build(ctx: &Context) -> Controller<ApprovingController> {
    let csrs = ctx.informers.get::<CertificateSigningRequest>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    csrs.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    let c = ApprovingController {
        client: ctx.client.clone(),
        csrs,
    };
    Controller::new(NAME, Arc::new(c), queue, 2, ctx.metrics.clone())
}

impl ApprovingController {
    /// Whether the requester of `c` may `create` the `recognized` subresource.
    async fn allowed(
        &self,
        c: &CertificateSigningRequest,
        recognized: Recognized,
    ) -> Result<bool, ReconcileError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: c.spec.username.clone(),
                uid: c.spec.uid.clone(),
                groups: c.spec.groups.clone(),
                extra: c.spec.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.into()),
                    resource: Some("certificatesigningrequests".into()),
                    subresource: Some(recognized.subresource().into()),
                    verb: Some("create".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

impl Reconciler for ApprovingController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some((c, value)) = super::csrsigning::cached(&self.csrs, key)? else {
            return Ok(Action::AwaitChange);
        };
        let mut approved_by = None;
        for r in recognize(&value) {
            if self.allowed(&c, r).await? {
                approved_by = Some(r);
                break;
            }
        }
        let Some(by) = approved_by else {
            return Ok(Action::AwaitChange);
        };
        let mut approved = c.as_ref().clone();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        approved
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: APPROVED.into(),
                status: "True".into(),
                reason: Some("AutoApproved".into()),
                message: Some(
                    "Auto approving kubelet client certificate after SubjectAccessReview.".into(),
                ),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            });
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        // With its resourceVersion: a concurrent change is a 409 and a retry.
        match api
            .replace_subresource::<_>("approval", &key.name, &PostParams::default(), &approved)
            .await
        {
            Ok(_) => {
                tracing::info!(csr = %key.name, requester = ?c.spec.username,
                    permission = by.subresource(), "node client certificate request approved");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{new_request, San, Subject};
    use serde_json::json;

    fn request(cn: &str, org: Option<&str>, sans: &[San], username: &str) -> Value {
        let (pem, _) = new_request(&Subject::new(cn, org), sans).unwrap();
        let b64 = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes())).unwrap();
        json!({"metadata": {"name": "c"}, "spec": {"request": b64,
            "signerName": KUBE_APISERVER_CLIENT_KUBELET, "usages": ["client auth"],
            "username": username}})
    }

    #[test]
    fn only_pending_node_client_requests_are_candidates() {
        let join = request(
            "system:node:n1",
            Some("system:nodes"),
            &[],
            "system:bootstrap:abcdef",
        );
        assert_eq!(recognize(&join), vec![Recognized::NodeClient]);
        let renew = request(
            "system:node:n1",
            Some("system:nodes"),
            &[],
            "system:node:n1",
        );
        assert_eq!(
            recognize(&renew),
            vec![Recognized::SelfNodeClient, Recognized::NodeClient]
        );
        let mut done = join.clone();
        done["status"] = json!({"conditions": [{"type": "Denied", "status": "True"}]});
        assert!(recognize(&done).is_empty());
        assert!(recognize(&request("jane", Some("system:nodes"), &[], "jane")).is_empty());
        assert!(recognize(&request("system:node:n1", Some("system:masters"), &[], "x")).is_empty());
        let with_san = request(
            "system:node:n1",
            Some("system:nodes"),
            &["evil.example".parse().unwrap()],
            "x",
        );
        assert!(recognize(&with_san).is_empty());
        let mut other_signer = join;
        other_signer["spec"]["signerName"] = json!("kubernetes.io/kube-apiserver-client");
        assert!(recognize(&other_signer).is_empty());
    }
}
