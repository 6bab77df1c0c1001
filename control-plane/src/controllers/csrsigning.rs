//! The CSR signing controller (Kubernetes' csrsigning): an approved CertificateSigningRequest
//! of the `kubernetes.io/kube-apiserver-client`, `kube-apiserver-client-kubelet` or
//! `kubelet-serving` signer gets its certificate from the cluster CA in `status.certificate`,
//! valid for its `expirationSeconds` capped by `--cluster-signing-duration`. A request the
//! signer will not sign (a kubelet certificate for a subject that is not a node, a usage the
//! signer does not give) gets a `Failed` condition instead. Denied, failed and already issued
//! requests are never signed; requests of other signers are left to their signers.
//!
//! Scale: one reconcile per changed request (the informer's events), nothing per other
//! request.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

use super::Context;
use crate::machinery::kinds::certificates::{
    self as csr, APPROVED, DENIED, FAILED, KUBELET_SERVING, KUBE_APISERVER_CLIENT,
    KUBE_APISERVER_CLIENT_KUBELET,
};
use crate::pki::{Ca, CertRequest, PkiError, Usage};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "csrsigning";
/// The user-name prefix and the group of node identities.
pub const NODE_PREFIX: &str = "system:node:";
pub const NODES_GROUP: &str = "system:nodes";

/// The CA that signs, and the longest certificate it gives (`--cluster-signing-duration`).
#[derive(Debug)]
pub struct Signing {
    pub ca: Ca,
    pub max_duration: Duration,
}

impl Signing {
    /// The signing CA from `--cluster-signing-cert-file` and `--cluster-signing-key-file`.
    pub fn load(cert: &Path, key: &Path, max_duration: Duration) -> Result<Signing, PkiError> {
        Ok(Signing {
            ca: Ca::load(cert, key)?,
            max_duration,
        })
    }
}

/// What the signer does with one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing: not approved yet, denied, failed, issued, or another signer's.
    Nothing,
    /// Mark it failed, with why.
    Fail(String),
    /// Issue this certificate (PEM).
    Issue(String),
}

/// Why `req` with `usages` is not a kubelet certificate of `signer` (None: it is).
/// Client certificates: CN `system:node:<name>`, O `system:nodes`, no SANs, client auth (with
/// digital signature and key encipherment at most). Serving certificates: the same subject,
/// at least one DNS or IP SAN, server auth.
pub fn kubelet_problem(signer: &str, req: &CertRequest, usages: &[String]) -> Option<String> {
    let node = req.subject.common_name.strip_prefix(NODE_PREFIX);
    if node.is_none_or(str::is_empty) {
        return Some(format!(
            "subject common name must begin with {NODE_PREFIX:?} and name a node"
        ));
    }
    if req.subject.organization.as_deref() != Some(NODES_GROUP) {
        return Some(format!("subject organization must be [{NODES_GROUP:?}]"));
    }
    let main = if signer == KUBELET_SERVING {
        if req.sans.is_empty() {
            return Some("a serving certificate needs at least one DNS or IP SAN".into());
        }
        "server auth"
    } else {
        if !req.sans.is_empty() {
            return Some("a client certificate may not have subject alternative names".into());
        }
        "client auth"
    };
    usage_problem(usages, main)
}

/// `main` is required; besides it only digital signature and key encipherment are allowed.
fn usage_problem(usages: &[String], main: &str) -> Option<String> {
    if !usages.iter().any(|u| u == main) {
        return Some(format!("usages must include {main:?}"));
    }
    let extra: Vec<&String> = usages
        .iter()
        .filter(|u| !matches!(u.as_str(), "digital signature" | "key encipherment") && *u != main)
        .collect();
    match extra.as_slice() {
        [] => None,
        e => Some(format!("usages not allowed for this signer: {e:?}")),
    }
}

/// What to do with `c` (its JSON), signing with `signing`.
pub fn plan(c: &Value, signing: &Signing) -> Plan {
    let signer = c
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if ![
        KUBE_APISERVER_CLIENT,
        KUBE_APISERVER_CLIENT_KUBELET,
        KUBELET_SERVING,
    ]
    .contains(&signer)
    {
        return Plan::Nothing;
    }
    if !csr::has_condition(c, APPROVED)
        || csr::has_condition(c, DENIED)
        || csr::has_condition(c, FAILED)
        || csr::certificate_pem(c).is_some()
    {
        return Plan::Nothing;
    }
    let usages: Vec<String> = c
        .pointer("/spec/usages")
        .and_then(|u| serde_json::from_value(u.clone()).ok())
        .unwrap_or_default();
    let req = match csr::request_pem(c).map(|pem| CertRequest::parse(&pem)) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return Plan::Fail(format!("the request cannot be signed: {e}")),
        None => return Plan::Fail("the request is not PEM".into()),
    };
    let problem = match signer {
        KUBE_APISERVER_CLIENT => usage_problem(&usages, "client auth"),
        _ => kubelet_problem(signer, &req, &usages),
    };
    if let Some(p) = problem {
        return Plan::Fail(p);
    }
    let validity = c
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
        .map_or(signing.max_duration, |s| {
            Duration::from_secs(s).min(signing.max_duration)
        });
    let eku: Vec<Usage> = usages
        .iter()
        .filter_map(|u| match u.as_str() {
            "client auth" => Some(Usage::Client),
            "server auth" => Some(Usage::Server),
            _ => None,
        })
        .collect();
    match signing.ca.sign_request(&req, &eku, validity) {
        Ok(pem) => Plan::Issue(pem),
        Err(e) => Plan::Fail(format!("signing failed: {e}")),
    }
}

/// The current time as the API's timestamps are written.
pub fn now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap_or(Value::Null)
}

/// The cached request at `key` and its JSON (what the rules of `machinery` read).
pub fn cached(
    csrs: &Informer<CertificateSigningRequest>,
    key: &ObjectKey,
) -> Result<Option<(Arc<CertificateSigningRequest>, Value)>, ReconcileError> {
    let Some(c) = csrs.get(key) else {
        return Ok(None);
    };
    let value =
        serde_json::to_value(c.as_ref()).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
    Ok(Some((c, value)))
}

pub struct SigningController {
    client: Client,
    csrs: Informer<CertificateSigningRequest>,
    signing: Arc<Signing>,
}

/// The signer, or None when the controller manager has no signing CA.
pub fn build(ctx: &Context) -> Option<Controller<SigningController>> {
    let Some(signing) = ctx.settings.cluster_signing.clone() else {
        tracing::warn!(
            "no signing CA (--cluster-signing-cert-file, --cluster-signing-key-file): \
             csrsigning not started"
        );
        return None;
    };
    let csrs = ctx.informers.get::<CertificateSigningRequest>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    csrs.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    let c = SigningController {
        client: ctx.client.clone(),
        csrs,
        signing,
    };
    Some(Controller::new(
        NAME,
        Arc::new(c),
        queue,
        2,
        ctx.metrics.clone(),
    ))
}

impl Reconciler for SigningController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some((c, value)) = cached(&self.csrs, key)? else {
            return Ok(Action::AwaitChange);
        };
        let rv = c.resource_version().unwrap_or_default();
        let status = match plan(&value, &self.signing) {
            Plan::Nothing => return Ok(Action::AwaitChange),
            Plan::Issue(pem) => {
                let b64 = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes()))
                    .map_err(|e| ReconcileError::Invalid(e.to_string()))?;
                json!({"certificate": b64})
            }
            Plan::Fail(why) => {
                tracing::info!(csr = %key.name, %why, "certificate signing request failed");
                let mut conds = value
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let now = now();
                conds.push(json!({"type": FAILED, "status": "True",
                    "reason": "SignerValidationFailure", "message": why,
                    "lastUpdateTime": now, "lastTransitionTime": now}));
                json!({"conditions": conds})
            }
        };
        let patch = json!({"metadata": {"resourceVersion": rv}, "status": status});
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        match api
            .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                if status.get("certificate").is_some() {
                    tracing::info!(csr = %key.name, "certificate issued");
                }
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

    fn request(cn: &str, org: Option<&str>, sans: &[San], signer: &str, usages: &[&str]) -> Value {
        let (pem, _) = new_request(&Subject::new(cn, org), sans).unwrap();
        let b64 = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes())).unwrap();
        json!({"metadata": {"name": "c"}, "spec": {"request": b64, "signerName": signer,
            "usages": usages, "expirationSeconds": 3600},
            "status": {"conditions": [{"type": "Approved", "status": "True"}]}})
    }

    fn signing() -> (tempfile::TempDir, Signing) {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(d.path()).unwrap();
        (
            d,
            Signing {
                ca,
                max_duration: Duration::from_secs(1800),
            },
        )
    }

    #[test]
    fn approved_node_client_requests_are_signed_capped_by_the_flag() {
        let (_d, s) = signing();
        let c = request(
            "system:node:n1",
            Some(NODES_GROUP),
            &[],
            KUBE_APISERVER_CLIENT_KUBELET,
            &["client auth", "digital signature"],
        );
        let Plan::Issue(pem) = plan(&c, &s) else {
            panic!("{:?}", plan(&c, &s))
        };
        let der = crate::pki::tls::certs_from_pem(&pem).unwrap().remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let subject = crate::pki::ca::subject_of(cert.subject()).unwrap();
        assert_eq!(subject, Subject::new("system:node:n1", Some(NODES_GROUP)));
        let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        // 30 minutes (the cap, not the hour asked for) plus the 5 minutes of backdating.
        assert_eq!(life, 1800 + 300);
    }

    #[test]
    fn never_signs_what_is_not_approved_or_not_a_node() {
        let (_d, s) = signing();
        let mut pending = request(
            "system:node:n1",
            Some(NODES_GROUP),
            &[],
            KUBE_APISERVER_CLIENT_KUBELET,
            &["client auth"],
        );
        pending["status"] = json!({});
        assert_eq!(plan(&pending, &s), Plan::Nothing);
        let mut denied = pending.clone();
        denied["status"] = json!({"conditions": [{"type": "Denied", "status": "True"}]});
        assert_eq!(plan(&denied, &s), Plan::Nothing);
        let other = request("x", None, &[], "example.com/mine", &["client auth"]);
        assert_eq!(plan(&other, &s), Plan::Nothing);
        let not_node = request(
            "jane",
            Some(NODES_GROUP),
            &[],
            KUBE_APISERVER_CLIENT_KUBELET,
            &["client auth"],
        );
        assert!(matches!(plan(&not_node, &s), Plan::Fail(_)));
        let serving_usage = request(
            "system:node:n1",
            Some(NODES_GROUP),
            &[],
            KUBE_APISERVER_CLIENT_KUBELET,
            &["client auth", "server auth"],
        );
        assert!(matches!(plan(&serving_usage, &s), Plan::Fail(_)));
        let serving = request(
            "system:node:n1",
            Some(NODES_GROUP),
            &["n1.local".parse().unwrap()],
            KUBELET_SERVING,
            &["server auth", "key encipherment"],
        );
        assert!(matches!(plan(&serving, &s), Plan::Issue(_)));
    }
}
