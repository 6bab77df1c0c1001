//! What the API server does for CertificateSigningRequests beyond storing them, as
//! Kubernetes' CSR strategy and its CertificateApproval, CertificateSigning and
//! CertificateSubjectRestriction admission plugins do: the requester (username, uid, groups,
//! extra) comes from the authenticated caller, never from the body; approving or denying
//! needs the `approve` verb on the request's signer, issuing a certificate the `sign` verb
//! (on `signers` named after the signer, or `<domain>/*`); nobody may ask the
//! kube-apiserver-client signer for a `system:masters` certificate.

use serde_json::{json, Value};

use super::Ctx;
use crate::apiserver::auth::{UserInfo, MASTERS};
use crate::apiserver::authz;
use crate::apiserver::authz::attributes::{Attributes, ResourceAttributes};
use crate::apiserver::registry::Resource;
use crate::machinery::kinds::certificates::{
    self as csr, certificate_pem, has_condition, APPROVED, DENIED, GROUP, KUBE_APISERVER_CLIENT,
};
use crate::machinery::ApiError;

/// Whether `r` is certificates.k8s.io CertificateSigningRequests.
pub fn is_csr(r: &Resource) -> bool {
    r.group == GROUP && r.kind == "CertificateSigningRequest"
}

/// Fills in the requester and refuses a request for a `system:masters` client certificate.
pub fn prepare_create(obj: &mut Value, user: &UserInfo) -> Result<(), ApiError> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        // Validation reports it.
        return Ok(());
    }
    let spec = &mut obj["spec"];
    spec["username"] = json!(user.name);
    spec["groups"] = json!(user.groups);
    match user.uid.as_str() {
        "" => spec.as_object_mut().map(|s| s.remove("uid")),
        uid => spec
            .as_object_mut()
            .map(|s| s.insert("uid".into(), json!(uid))),
    };
    match user.extra.is_empty() {
        true => spec.as_object_mut().map(|s| s.remove("extra")),
        false => spec
            .as_object_mut()
            .map(|s| s.insert("extra".into(), json!(user.extra))),
    };
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if signer == KUBE_APISERVER_CLIENT {
        let masters = csr::request_pem(obj)
            .and_then(|pem| crate::pki::CertRequest::parse(&pem).ok())
            .is_some_and(|r| r.subject.organization.as_deref() == Some(MASTERS));
        if masters {
            let name = crate::apiserver::meta::name(obj).unwrap_or("");
            return Err(authz::forbidden_resource(
                GROUP,
                "certificatesigningrequests",
                name,
                &format!(
                    "use of {KUBE_APISERVER_CLIENT} signer with {MASTERS} group is not allowed"
                ),
            ));
        }
    }
    Ok(())
}

/// What an update of `/approval` or `/status` needs beyond `update` on the subresource:
/// `approve` on the signer when the approval changes, `sign` when the certificate does.
pub async fn authorize_update(
    ctx: &Ctx,
    user: &UserInfo,
    subresource: Option<&str>,
    new: &Value,
    cur: &Value,
) -> Result<(), ApiError> {
    let verb = match subresource {
        Some("approval")
            if has_condition(new, APPROVED) != has_condition(cur, APPROVED)
                || has_condition(new, DENIED) != has_condition(cur, DENIED) =>
        {
            "approve"
        }
        Some("status") if certificate_pem(new) != certificate_pem(cur) => "sign",
        _ => return Ok(()),
    };
    let signer = cur
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut names = vec![signer.to_string()];
    if let Some((domain, _)) = signer.split_once('/') {
        names.push(format!("{domain}/*"));
    }
    for name in names {
        let a = Attributes::resource(
            verb,
            ResourceAttributes {
                group: GROUP.into(),
                version: "v1".into(),
                resource: "signers".into(),
                name,
                ..Default::default()
            },
        );
        if authz::allowed(ctx, user, &a).await?.is_none() {
            return Ok(());
        }
    }
    let name = crate::apiserver::meta::name(cur).unwrap_or("");
    Err(authz::forbidden_resource(
        GROUP,
        "certificatesigningrequests",
        name,
        &format!("user not permitted to {verb} requests with signerName {signer:?}"),
    ))
}
