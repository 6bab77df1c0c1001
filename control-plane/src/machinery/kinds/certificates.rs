//! certificates.k8s.io/v1 CertificateSigningRequest: Kubernetes' validation (a PEM request
//! that parses and whose signature holds, a qualified signerName, known usages,
//! expirationSeconds of at least ten minutes, an immutable spec, approval conditions that
//! exclude each other and are never taken back, a certificate only on an approved request and
//! never changed once issued), what the status and approval subresources may change, and
//! kubectl's columns (NAME AGE SIGNERNAME REQUESTOR REQUESTEDDURATION CONDITION).

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::common::{age_cell, decode, default_row, meta_errors, name_cell, str_at};
use crate::machinery::duration;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{dns1123_subdomain_errors, NameRule, Scope};

pub const GROUP: &str = "certificates.k8s.io";

/// The signers Kubernetes defines.
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// Condition types.
pub const APPROVED: &str = "Approved";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";

/// The shortest certificate a request may ask for (Kubernetes' 10 minutes).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;

/// The key usages a request may name (Kubernetes' `KeyUsage` values).
pub const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// The PEM request of a stored or sent object (`spec.request` is base64 in JSON).
pub fn request_pem(v: &Value) -> Option<String> {
    bytes_at(v, "/spec/request")
}

/// The PEM certificate of `status.certificate`, if issued.
pub fn certificate_pem(v: &Value) -> Option<String> {
    bytes_at(v, "/status/certificate").filter(|s| !s.is_empty())
}

fn bytes_at(v: &Value, pointer: &str) -> Option<String> {
    let b64 = v.pointer(pointer)?.clone();
    let bytes: k8s_openapi::ByteString = serde_json::from_value(b64).ok()?;
    String::from_utf8(bytes.0).ok()
}

fn conditions(v: &Value) -> Vec<Value> {
    v.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn condition_type(c: &Value) -> &str {
    c.get("type").and_then(Value::as_str).unwrap_or("")
}

fn is_approval(c: &Value) -> bool {
    matches!(condition_type(c), APPROVED | DENIED)
}

/// Whether the request carries a condition of type `t` with status True.
pub fn has_condition(v: &Value, t: &str) -> bool {
    conditions(v).iter().any(|c| {
        condition_type(c) == t
            && c.get("status").and_then(Value::as_str).unwrap_or("True") == "True"
    })
}

/// What a write to `/approval` stores: the current object with the new Approved and Denied
/// conditions only (Kubernetes' approval strategy).
pub fn approval_update(new: &Value, cur: &Value) -> Value {
    let mut merged = cur.clone();
    let mut conds: Vec<Value> = conditions(cur)
        .into_iter()
        .filter(|c| !is_approval(c))
        .collect();
    conds.extend(conditions(new).into_iter().filter(is_approval));
    set_conditions(&mut merged, conds);
    merged
}

/// What a write to `/status` stores: the new status, but the current Approved and Denied
/// conditions (approval goes only through `/approval`).
pub fn status_update(new: &Value, cur: &Value) -> Value {
    let mut merged = cur.clone();
    merged["status"] = new.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut conds: Vec<Value> = conditions(new)
        .into_iter()
        .filter(|c| !is_approval(c))
        .collect();
    conds.extend(conditions(cur).into_iter().filter(is_approval));
    set_conditions(&mut merged, conds);
    merged
}

fn set_conditions(v: &mut Value, conds: Vec<Value>) {
    if !v.get("status").is_some_and(Value::is_object) {
        v["status"] = json!({});
    }
    if let Some(s) = v["status"].as_object_mut() {
        if conds.is_empty() {
            s.remove("conditions");
        } else {
            s.insert("conditions".into(), Value::Array(conds));
        }
    }
}

/// `example.com/signer-name`: a DNS subdomain, a slash, and a path of printable characters.
fn signer_name_errors(name: &str) -> Vec<FieldError> {
    let field = "spec.signerName";
    if name.is_empty() {
        return vec![FieldError::required(field)];
    }
    let why = "must be a fully qualified domain and path of the form 'example.com/signer-name'";
    let Some((domain, path)) = name.split_once('/') else {
        return vec![FieldError::invalid(field, name, why)];
    };
    let mut errs = vec![];
    if path.is_empty() || path.chars().any(|c| c.is_control() || c.is_whitespace()) {
        errs.push(FieldError::invalid(field, name, why));
    }
    for m in dns1123_subdomain_errors(domain) {
        errs.push(FieldError::invalid(field, name, &format!("the domain {m}")));
    }
    if name.len() > 571 {
        errs.push(FieldError::too_long(field, 571));
    }
    errs
}

fn spec_errors(v: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    match v.pointer("/spec/request") {
        None | Some(Value::Null) => errs.push(FieldError::required("spec.request")),
        Some(Value::String(s)) if s.is_empty() => errs.push(FieldError::required("spec.request")),
        Some(_) => match request_pem(v) {
            None => errs.push(FieldError::invalid_unquoted(
                "spec.request",
                "[]byte{...}",
                "must be base64-encoded PEM",
            )),
            Some(pem) => {
                if let Err(e) = crate::pki::check_request(&pem) {
                    errs.push(FieldError::invalid_unquoted(
                        "spec.request",
                        "[]byte{...}",
                        &e.to_string(),
                    ));
                }
            }
        },
    }
    let signer = str_at(v, "/spec/signerName");
    errs.extend(signer_name_errors(signer));
    if signer == LEGACY_UNKNOWN {
        errs.push(FieldError::invalid(
            "spec.signerName",
            signer,
            "the legacy signerName is not allowed via this API version",
        ));
    }
    match v.pointer("/spec/usages") {
        Some(Value::Array(usages)) if !usages.is_empty() => {
            let mut seen = std::collections::BTreeSet::new();
            for (i, u) in usages.iter().enumerate() {
                let at = format!("spec.usages[{i}]");
                let u = u.as_str().unwrap_or("");
                if !USAGES.contains(&u) {
                    errs.push(FieldError::not_supported(&at, u, USAGES));
                } else if !seen.insert(u) {
                    errs.push(FieldError::duplicate(&at, u));
                }
            }
        }
        _ => errs.push(FieldError::required("spec.usages")),
    }
    if let Some(e) = v.pointer("/spec/expirationSeconds") {
        match e.as_i64() {
            Some(s) if s >= MIN_EXPIRATION_SECONDS => {}
            Some(s) => errs.push(FieldError::invalid_number(
                "spec.expirationSeconds",
                s,
                "may not specify a duration less than 600 seconds (10 minutes)",
            )),
            None if e.is_null() => {}
            None => errs.push(FieldError::invalid(
                "spec.expirationSeconds",
                e,
                "must be an integer",
            )),
        }
    }
    errs
}

fn status_errors(v: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in conditions(v).iter().enumerate() {
        let at = format!("status.conditions[{i}]");
        let t = condition_type(c);
        if t.is_empty() {
            errs.push(FieldError::required(format!("{at}.type")));
            continue;
        }
        if matches!(t, APPROVED | DENIED | FAILED) && !seen.insert(t.to_string()) {
            errs.push(FieldError::duplicate(format!("{at}.type"), t));
        }
        let status = c.get("status").and_then(Value::as_str).unwrap_or("");
        match (t, status) {
            (APPROVED | DENIED, "True") => {}
            (APPROVED | DENIED, s) => errs.push(FieldError::not_supported(
                format!("{at}.status"),
                s,
                &["True"],
            )),
            (_, "True" | "False" | "Unknown") => {}
            (_, "") => errs.push(FieldError::required(format!("{at}.status"))),
            (_, s) => errs.push(FieldError::not_supported(
                format!("{at}.status"),
                s,
                &["True", "False", "Unknown"],
            )),
        }
    }
    if seen.contains(APPROVED) && seen.contains(DENIED) {
        errs.push(FieldError::invalid(
            "status.conditions",
            "Approved,Denied",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    if let Some(cert) = v.pointer("/status/certificate").filter(|c| !c.is_null()) {
        let pem = certificate_pem(v);
        match pem {
            None if cert.as_str() == Some("") => {}
            None => errs.push(FieldError::invalid_unquoted(
                "status.certificate",
                "[]byte{...}",
                "must be base64-encoded PEM",
            )),
            Some(pem) => {
                if let Err(e) = crate::pki::check_certificates(&pem) {
                    errs.push(FieldError::invalid_unquoted(
                        "status.certificate",
                        "[]byte{...}",
                        &e.to_string(),
                    ));
                }
                if !has_condition(v, APPROVED) || has_condition(v, FAILED) {
                    errs.push(FieldError::forbidden(
                        "status.certificate",
                        "certificate can only be set on an approved, non-failed request",
                    ));
                }
            }
        }
    }
    errs
}

/// Validation of a create (`old` None) or an update.
pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let typed = match decode::<CertificateSigningRequest>(new) {
        Ok(t) => Some(t),
        Err(e) if new.pointer("/spec").is_some_and(Value::is_object) => {
            // The fields that fail to decode are reported by name below; say why too.
            let mut errs = spec_errors(new);
            if errs.is_empty() {
                errs.push(e);
            }
            return errs;
        }
        Err(e) => return vec![e],
    };
    let old_meta = old
        .and_then(|o| decode::<CertificateSigningRequest>(o).ok())
        .map(|o| o.metadata);
    let mut errs = meta_errors(
        &typed.map(|t| t.metadata).unwrap_or_default(),
        old_meta.as_ref(),
        Scope::Cluster,
        NameRule::Dns1123Subdomain,
    );
    errs.extend(spec_errors(new));
    errs.extend(status_errors(new));
    if let Some(old) = old {
        if new.get("spec") != old.get("spec") {
            errs.push(FieldError::new(
                CauseType::Invalid,
                "spec",
                "Invalid value: \"...\": field is immutable",
            ));
        }
        for t in [APPROVED, DENIED] {
            if has_condition(old, t) && !has_condition(new, t) {
                errs.push(FieldError::forbidden(
                    "status.conditions",
                    &format!("updates may not remove a condition of type {t:?}"),
                ));
            }
        }
        if let Some(was) = certificate_pem(old) {
            if certificate_pem(new).as_deref() != Some(&was) {
                errs.push(FieldError::forbidden(
                    "status.certificate",
                    "updates may not modify existing certificate content",
                ));
            }
        }
    }
    errs
}

pub fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new(
            "SignerName",
            ColumnType::String,
            "Only one signer is in charge of a request.",
        ),
        TableColumnDefinition::new(
            "Requestor",
            ColumnType::String,
            "Name of the user that created the request.",
        ),
        TableColumnDefinition::new(
            "RequestedDuration",
            ColumnType::String,
            "Duration the certificate is requested to be valid for.",
        ),
        TableColumnDefinition::new(
            "Condition",
            ColumnType::String,
            "The state of the request: Pending, Approved or Denied, with Failed and Issued.",
        ),
    ]
}

/// kubectl's CONDITION: Denied, else Approved, else Pending; then `,Failed` and `,Issued`.
pub fn condition_cell(v: &Value) -> String {
    let mut s = if has_condition(v, DENIED) {
        DENIED.to_string()
    } else if has_condition(v, APPROVED) {
        APPROVED.to_string()
    } else {
        "Pending".to_string()
    };
    if has_condition(v, FAILED) {
        s.push_str(",Failed");
    }
    if certificate_pem(v).is_some() {
        s.push_str(",Issued");
    }
    s
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(csr) = decode::<CertificateSigningRequest>(v) else {
        return default_row(v, now);
    };
    let requested = csr
        .spec
        .expiration_seconds
        .map_or("<none>".to_string(), |s| duration::human_duration(s.into()));
    vec![
        name_cell(&csr.metadata),
        age_cell(&csr.metadata, now),
        Value::from(csr.spec.signer_name.clone()),
        Value::from(csr.spec.username.clone().unwrap_or_default()),
        Value::from(requested),
        Value::from(condition_cell(v)),
    ]
}

pub fn field(v: &Value, field: &str) -> Option<String> {
    match field {
        "spec.signerName" => Some(str_at(v, "/spec/signerName").to_string()),
        _ => super::common::meta_field(v, field),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A CertificateSigningRequest as kubectl would send it, for `subject`.
    pub fn minimal(name: &str, cn: &str, org: Option<&str>) -> Value {
        let (pem, _) =
            crate::pki::new_request(&crate::pki::Subject::new(cn, org), &[]).expect("a request");
        let request = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes())).unwrap();
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name, "creationTimestamp": "2025-01-01T11:55:00Z"},
            "spec": {"request": request, "signerName": KUBE_APISERVER_CLIENT,
                "usages": ["client auth"], "username": "jane", "expirationSeconds": 86400}})
    }

    fn fields(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.field.as_str()).collect()
    }

    #[test]
    fn bad_requests_name_their_field() {
        let ok = minimal("c", "jane", None);
        assert!(validate(&ok, None).is_empty(), "{:?}", validate(&ok, None));
        let mut v = ok.clone();
        v["spec"]["request"] = json!("bm90IGEgcmVxdWVzdA==");
        assert_eq!(fields(&validate(&v, None)), ["spec.request"]);
        let mut v = ok.clone();
        v["spec"]["signerName"] = json!("nodomain");
        assert_eq!(fields(&validate(&v, None)), ["spec.signerName"]);
        let mut v = ok.clone();
        v["spec"]["usages"] = json!(["client auth", "flying"]);
        assert_eq!(fields(&validate(&v, None)), ["spec.usages[1]"]);
        let mut v = ok.clone();
        v["spec"]["expirationSeconds"] = json!(599);
        assert_eq!(fields(&validate(&v, None)), ["spec.expirationSeconds"]);
        let mut v = ok.clone();
        v["spec"].as_object_mut().unwrap().remove("signerName");
        assert_eq!(fields(&validate(&v, None)), ["spec.signerName"]);
        let mut v = ok.clone();
        v["spec"].as_object_mut().unwrap().remove("request");
        assert!(fields(&validate(&v, None)).contains(&"spec.request"));
    }

    #[test]
    fn approval_is_final_and_the_certificate_needs_it() {
        let old = minimal("c", "jane", None);
        let mut changed = old.clone();
        changed["spec"]["usages"] = json!(["server auth"]);
        assert_eq!(fields(&validate(&changed, Some(&old))), ["spec"]);

        let approved = approval_update(
            &json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}),
            &old,
        );
        assert!(validate(&approved, Some(&old)).is_empty());
        assert_eq!(condition_cell(&approved), "Approved");
        let both = approval_update(
            &json!({"status": {"conditions": [{"type": "Approved", "status": "True"},
                {"type": "Denied", "status": "True"}]}}),
            &old,
        );
        assert_eq!(fields(&validate(&both, Some(&old))), ["status.conditions"]);
        let taken_back = approval_update(&json!({}), &approved);
        assert_eq!(
            fields(&validate(&taken_back, Some(&approved))),
            ["status.conditions"]
        );
        // A status write cannot approve.
        let sneaky = status_update(
            &json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}),
            &old,
        );
        assert!(!has_condition(&sneaky, APPROVED));

        let ca_dir = tempfile::tempdir().unwrap();
        let ca = crate::pki::Ca::load_or_create(ca_dir.path()).unwrap();
        let cert = ca
            .issue(&crate::pki::CertSpec::client(
                "jane",
                None,
                std::time::Duration::from_secs(3600),
            ))
            .unwrap()
            .cert_pem;
        let b64 = serde_json::to_value(k8s_openapi::ByteString(cert.into_bytes())).unwrap();
        let issued_pending = status_update(&json!({"status": {"certificate": b64}}), &old);
        assert_eq!(
            fields(&validate(&issued_pending, Some(&old))),
            ["status.certificate"]
        );
        let issued = status_update(&json!({"status": {"certificate": b64}}), &approved);
        assert!(validate(&issued, Some(&approved)).is_empty());
        assert_eq!(condition_cell(&issued), "Approved,Issued");
        let cleared = status_update(&json!({"status": {}}), &issued);
        assert_eq!(
            fields(&validate(&cleared, Some(&issued))),
            ["status.certificate"]
        );
    }
}
