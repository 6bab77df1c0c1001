//! `ApiError`: every failure the API server reports, as the Kubernetes `Status` a client
//! expects (code, reason, message, details with the kind, name and the fields at fault).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// Machine-readable reasons (metav1.StatusReason) that skiff returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    AlreadyExists,
    Conflict,
    Gone,
    Expired,
    Invalid,
    MethodNotAllowed,
    NotAcceptable,
    RequestEntityTooLarge,
    UnsupportedMediaType,
    Timeout,
    TooManyRequests,
    InternalError,
    ServiceUnavailable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Gone => "Gone",
            Reason::Expired => "Expired",
            Reason::Invalid => "Invalid",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::Timeout => "Timeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
            Reason::ServiceUnavailable => "ServiceUnavailable",
        }
    }
}

/// Why a field is rejected (metav1.CauseType).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CauseType {
    /// `FieldValueRequired`
    Required,
    /// `FieldValueInvalid`
    Invalid,
    /// `FieldValueNotSupported`
    NotSupported,
    /// `FieldValueDuplicate`
    Duplicate,
    /// `FieldValueForbidden`
    Forbidden,
    /// `FieldValueTooLong`
    TooLong,
    /// `FieldValueTypeInvalid`
    TypeInvalid,
    /// `FieldValueUnknown` (strict field validation)
    Unknown,
    /// `FieldValueNotFound` (a reference to something that does not exist)
    NotFound,
    /// `FieldValueTooMany`
    TooMany,
    /// `FieldManagerConflict` (server-side apply: another manager owns the field)
    FieldManagerConflict,
    /// `NamespaceTerminating` (NamespaceLifecycle refusing new content)
    NamespaceTerminating,
    /// `DisruptionBudget` (an eviction refused by a PodDisruptionBudget)
    DisruptionBudget,
}

impl CauseType {
    pub fn as_str(self) -> &'static str {
        match self {
            CauseType::Required => "FieldValueRequired",
            CauseType::Invalid => "FieldValueInvalid",
            CauseType::NotSupported => "FieldValueNotSupported",
            CauseType::Duplicate => "FieldValueDuplicate",
            CauseType::Forbidden => "FieldValueForbidden",
            CauseType::TooLong => "FieldValueTooLong",
            CauseType::TypeInvalid => "FieldValueTypeInvalid",
            CauseType::Unknown => "FieldValueUnknown",
            CauseType::NotFound => "FieldValueNotFound",
            CauseType::TooMany => "FieldValueTooMany",
            CauseType::FieldManagerConflict => "FieldManagerConflict",
            CauseType::NamespaceTerminating => "NamespaceTerminating",
            CauseType::DisruptionBudget => "DisruptionBudget",
        }
    }
}

/// One field at fault, with its JSON path as Kubernetes prints it (`spec.template.spec.containers[0].image`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: CauseType,
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(kind: CauseType, field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            kind,
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn required(field: impl Into<String>) -> Self {
        FieldError::new(CauseType::Required, field, "Required value")
    }
    /// `Required value: why` (Kubernetes' field.Required with a detail).
    pub fn required_because(field: impl Into<String>, why: &str) -> Self {
        FieldError::new(CauseType::Required, field, format!("Required value: {why}"))
    }
    pub fn invalid(field: impl Into<String>, value: impl std::fmt::Display, why: &str) -> Self {
        let field = field.into();
        FieldError::new(
            CauseType::Invalid,
            field,
            format!("Invalid value: \"{value}\": {why}"),
        )
    }
    pub fn immutable(field: impl Into<String>) -> Self {
        FieldError::new(CauseType::Invalid, field, "field is immutable")
    }
    /// `Unsupported value: "x": supported values: "a", "b"`
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        FieldError::new(
            CauseType::NotSupported,
            field,
            format!(
                "Unsupported value: \"{value}\": supported values: {}",
                list.join(", ")
            ),
        )
    }
    /// `Forbidden: why`
    pub fn forbidden(field: impl Into<String>, why: &str) -> Self {
        FieldError::new(CauseType::Forbidden, field, format!("Forbidden: {why}"))
    }
    /// `Duplicate value: "x"`
    pub fn duplicate(field: impl Into<String>, value: impl std::fmt::Display) -> Self {
        FieldError::new(
            CauseType::Duplicate,
            field,
            format!("Duplicate value: \"{value}\""),
        )
    }
    /// `Not found: "x"`
    pub fn not_found(field: impl Into<String>, value: impl std::fmt::Display) -> Self {
        FieldError::new(
            CauseType::NotFound,
            field,
            format!("Not found: \"{value}\""),
        )
    }
    /// `Too long: may not be more than N bytes`
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        FieldError::new(
            CauseType::TooLong,
            field,
            format!("Too long: may not be more than {max} bytes"),
        )
    }
    /// A number out of range: `Invalid value: 0: must be between 1 and 65535, inclusive`
    /// (Kubernetes quotes strings but not numbers).
    pub fn invalid_number(field: impl Into<String>, value: i64, why: &str) -> Self {
        FieldError::new(
            CauseType::Invalid,
            field,
            format!("Invalid value: {value}: {why}"),
        )
    }
    /// A structured value (a map, a selector) printed as Go prints it, unquoted:
    /// `Invalid value: map[string]string{"app":"x"}: why`.
    pub fn invalid_unquoted(
        field: impl Into<String>,
        value: impl std::fmt::Display,
        why: &str,
    ) -> Self {
        FieldError::new(
            CauseType::Invalid,
            field,
            format!("Invalid value: {value}: {why}"),
        )
    }
    pub fn unknown(field: impl Into<String>) -> Self {
        FieldError::new(CauseType::Unknown, field, "unknown field")
    }

    /// `spec.replicas: Invalid value: "-1": must be greater than or equal to 0`
    fn render(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// An API failure. Converts to the `Status` body and HTTP code a Kubernetes client expects.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {}: {message}", reason.as_str())]
pub struct ApiError {
    pub code: u16,
    pub reason: Reason,
    pub message: String,
    /// The object at fault: (group, kind as the plural resource name, name).
    pub details: Option<Details>,
    pub causes: Vec<FieldError>,
    pub retry_after_seconds: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Details {
    pub group: String,
    /// Kubernetes puts the resource (plural) here for most errors: `"kind":"deployments"`.
    pub kind: String,
    pub name: String,
}

impl ApiError {
    pub fn new(code: u16, reason: Reason, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: vec![],
            retry_after_seconds: None,
        }
    }

    pub fn with_details(mut self, group: &str, resource: &str, name: &str) -> Self {
        self.details = Some(Details {
            group: group.into(),
            kind: resource.into(),
            name: name.into(),
        });
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, Reason::BadRequest, message)
    }

    pub fn unauthorized() -> Self {
        ApiError::new(401, Reason::Unauthorized, "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, Reason::Forbidden, message)
    }

    /// `deployments.apps "web" not found`
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            404,
            Reason::NotFound,
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// A path that names no resource at all.
    pub fn path_not_found(path: &str) -> Self {
        ApiError::new(
            404,
            Reason::NotFound,
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            Reason::AlreadyExists,
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// Optimistic-concurrency failure on a stale resourceVersion.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// A watch or list from a compacted resourceVersion.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, Reason::Expired, message)
    }

    /// `Deployment.apps "web" is invalid: spec.replicas: Invalid value: ...` (details carry the Kind).
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<FieldError>) -> Self {
        let listed: Vec<String> = causes.iter().map(FieldError::render).collect();
        let message = match listed.len() {
            0 => format!("{} \"{name}\" is invalid", qualified(group, kind)),
            1 => format!(
                "{} \"{name}\" is invalid: {}",
                qualified(group, kind),
                listed[0]
            ),
            _ => format!(
                "{} \"{name}\" is invalid: [{}]",
                qualified(group, kind),
                listed.join(", ")
            ),
        };
        let mut e = ApiError::new(422, Reason::Invalid, message).with_details(group, kind, name);
        e.causes = causes;
        e
    }

    /// A body that does not decode (400 BadRequest, with the decoder's message).
    pub fn malformed(what: &str, err: impl std::fmt::Display) -> Self {
        ApiError::bad_request(format!(
            "the body of the request was in an unknown format - {what}: {err}"
        ))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, Reason::MethodNotAllowed, message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        ApiError::new(406, Reason::NotAcceptable, message)
    }

    pub fn too_large(limit_bytes: usize) -> Self {
        ApiError::new(
            413,
            Reason::RequestEntityTooLarge,
            format!("Request entity too large: limit is {limit_bytes}"),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(415, Reason::UnsupportedMediaType, format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf; got {content_type:?}"))
    }

    pub fn internal(err: impl std::fmt::Display) -> Self {
        ApiError::new(
            500,
            Reason::InternalError,
            format!("Internal error occurred: {err}"),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(503, Reason::ServiceUnavailable, message)
    }

    /// The `Status` body, as sent on the wire (with kind and apiVersion added by serialisation).
    pub fn to_status(&self) -> Status {
        let details = if self.details.is_some()
            || !self.causes.is_empty()
            || self.retry_after_seconds.is_some()
        {
            let d = self.details.clone().unwrap_or_default();
            Some(StatusDetails {
                group: (!d.group.is_empty()).then_some(d.group),
                kind: (!d.kind.is_empty()).then_some(d.kind),
                name: (!d.name.is_empty()).then_some(d.name),
                causes: (!self.causes.is_empty()).then(|| {
                    self.causes
                        .iter()
                        .map(|c| StatusCause {
                            // Omitted when empty, as Go's omitempty does.
                            field: (!c.field.is_empty()).then(|| c.field.clone()),
                            message: Some(c.message.clone()),
                            reason: Some(c.kind.as_str().to_string()),
                        })
                        .collect()
                }),
                retry_after_seconds: self.retry_after_seconds,
                uid: None,
            })
        } else {
            None
        };
        Status {
            code: Some(self.code.into()),
            details,
            message: Some(self.message.clone()),
            metadata: Default::default(),
            reason: Some(self.reason.as_str().to_string()),
            status: Some("Failure".to_string()),
        }
    }
}

/// `deployments.apps`, or just `pods` for the core group.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_kubernetes_wording() {
        let s = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(s.code, Some(404));
        assert_eq!(s.reason.as_deref(), Some("NotFound"));
        assert_eq!(
            s.message.as_deref(),
            Some("deployments.apps \"web\" not found")
        );
        let d = s.details.unwrap();
        assert_eq!(d.kind.as_deref(), Some("deployments"));
        assert_eq!(d.group.as_deref(), Some("apps"));
    }

    #[test]
    fn invalid_lists_every_field() {
        let e = ApiError::invalid(
            "apps",
            "Deployment",
            "web",
            vec![
                FieldError::required("spec.selector"),
                FieldError::immutable("spec.selector"),
            ],
        );
        assert_eq!(e.code, 422);
        assert!(e
            .message
            .starts_with("Deployment.apps \"web\" is invalid: [spec.selector: Required value, "));
        let causes = e.to_status().details.unwrap().causes.unwrap();
        assert_eq!(causes[0].field.as_deref(), Some("spec.selector"));
        assert_eq!(causes[0].reason.as_deref(), Some("FieldValueRequired"));
    }
}
