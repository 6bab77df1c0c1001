//! authorization.k8s.io/v1 access reviews, answered at once and never stored:
//! SelfSubjectAccessReview (`kubectl auth can-i`), SubjectAccessReview (may this user...?, for
//! delegated authorization such as the node agent's API), LocalSubjectAccessReview (the same,
//! within one namespace) and SelfSubjectRulesReview (`kubectl auth can-i --list`).

use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, NonResourceAttributes, NonResourceRule, ResourceRule,
    SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview,
    SubjectAccessReviewStatus, SubjectRulesReviewStatus,
};
use serde_json::Value;

use super::allowed;
use super::attributes::{Attributes, ResourceAttributes, Target};
use crate::apiserver::auth::UserInfo;
use crate::apiserver::handlers::Ctx;
use crate::machinery::status::FieldError;
use crate::machinery::ApiError;

/// The API group of the reviews.
pub const GROUP: &str = "authorization.k8s.io";

fn decode<T: serde::de::DeserializeOwned>(kind: &str, body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::bad_request(format!("decoding {kind}: {e}")))
}

fn encode<T: serde::Serialize>(t: &T) -> Result<Value, ApiError> {
    serde_json::to_value(t).map_err(ApiError::internal)
}

fn invalid(kind: &str, errs: Vec<FieldError>) -> Result<(), ApiError> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(GROUP, kind, "", errs))
    }
}

/// What a review asks about: exactly one of resource or non-resource attributes.
fn target(
    resource: Option<&k8s_openapi::api::authorization::v1::ResourceAttributes>,
    non_resource: Option<&NonResourceAttributes>,
) -> Result<Attributes, Vec<FieldError>> {
    match (resource, non_resource) {
        (Some(_), Some(_)) => Err(vec![FieldError::invalid_unquoted(
            "spec.nonResourceAttributes",
            "{...}",
            "cannot be specified in combination with resourceAttributes",
        )]),
        (None, None) => Err(vec![FieldError::invalid_unquoted(
            "spec.resourceAttributes",
            "null",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )]),
        (Some(r), None) => Ok(Attributes::resource(
            r.verb.as_deref().unwrap_or(""),
            ResourceAttributes {
                group: r.group.clone().unwrap_or_default(),
                version: r.version.clone().unwrap_or_default(),
                namespace: r.namespace.clone().unwrap_or_default(),
                resource: r.resource.clone().unwrap_or_default(),
                subresource: r.subresource.clone().unwrap_or_default(),
                name: r.name.clone().unwrap_or_default(),
                field_selector: r
                    .field_selector
                    .as_ref()
                    .and_then(|f| f.raw_selector.clone())
                    .filter(|s| !s.is_empty()),
            },
        )),
        (None, Some(n)) => Ok(Attributes {
            verb: n.verb.clone().unwrap_or_default(),
            target: Target::NonResource {
                path: n.path.clone().unwrap_or_default(),
            },
        }),
    }
}

async fn decide(
    ctx: &Ctx,
    user: &UserInfo,
    a: &Attributes,
) -> Result<SubjectAccessReviewStatus, ApiError> {
    let refused = allowed(ctx, user, a).await?;
    Ok(SubjectAccessReviewStatus {
        allowed: refused.is_none(),
        denied: None,
        evaluation_error: None,
        reason: refused.filter(|r| !r.is_empty()),
    })
}

/// Answers a review of kind `kind` created by `caller` (in `namespace` for the local one):
/// the object with its status filled in.
pub async fn answer(
    ctx: &Ctx,
    caller: &UserInfo,
    kind: &str,
    namespace: Option<&str>,
    body: Value,
) -> Result<Value, ApiError> {
    match kind {
        "SelfSubjectAccessReview" => {
            let mut r: SelfSubjectAccessReview = decode(kind, body)?;
            let a = target(
                r.spec.resource_attributes.as_ref(),
                r.spec.non_resource_attributes.as_ref(),
            )
            .map_err(|e| ApiError::invalid(GROUP, kind, "", e))?;
            r.status = Some(decide(ctx, caller, &a).await?);
            encode(&r)
        }
        "SubjectAccessReview" | "LocalSubjectAccessReview" => {
            let local = kind == "LocalSubjectAccessReview";
            let (spec, meta) = if local {
                let r: LocalSubjectAccessReview = decode(kind, body)?;
                (r.spec, r.metadata)
            } else {
                let r: SubjectAccessReview = decode(kind, body)?;
                (r.spec, r.metadata)
            };
            let mut errs = match target(
                spec.resource_attributes.as_ref(),
                spec.non_resource_attributes.as_ref(),
            ) {
                Ok(_) => vec![],
                Err(e) => e,
            };
            let user = spec.user.clone().unwrap_or_default();
            let groups = spec.groups.clone().unwrap_or_default();
            if user.is_empty() && groups.is_empty() {
                errs.push(FieldError::invalid(
                    "spec.user",
                    "",
                    "at least one of user or group must be specified",
                ));
            }
            if local && spec.non_resource_attributes.is_some() {
                errs.push(FieldError::invalid_unquoted(
                    "spec.nonResourceAttributes",
                    "{...}",
                    "disallowed on this kind of request",
                ));
            }
            invalid(kind, errs)?;
            let a = target(
                spec.resource_attributes.as_ref(),
                spec.non_resource_attributes.as_ref(),
            )
            .map_err(|e| ApiError::invalid(GROUP, kind, "", e))?;
            if local {
                let ns = namespace.unwrap_or_default();
                if ns.is_empty() {
                    return Err(ApiError::bad_request("namespace is required on this type"));
                }
                if a.namespace() != ns {
                    return Err(ApiError::bad_request(format!(
                        "spec.resourceAttributes.namespace must match namespace: {ns}"
                    )));
                }
            }
            let subject = UserInfo {
                name: user,
                uid: spec.uid.clone().unwrap_or_default(),
                groups,
                extra: spec.extra.clone().unwrap_or_default().into_iter().collect(),
            };
            let status = decide(ctx, &subject, &a).await?;
            let mut out = if local {
                encode(&LocalSubjectAccessReview {
                    metadata: meta,
                    spec,
                    status: Some(status),
                })?
            } else {
                encode(&SubjectAccessReview {
                    metadata: meta,
                    spec,
                    status: Some(status),
                })?
            };
            if let (true, Some(ns)) = (local, namespace) {
                out["metadata"]["namespace"] = Value::from(ns);
            }
            Ok(out)
        }
        "SelfSubjectRulesReview" => {
            let mut r: SelfSubjectRulesReview = decode(kind, body)?;
            let ns = r.spec.namespace.clone().unwrap_or_default();
            if ns.is_empty() {
                return Err(ApiError::bad_request("no namespace on request"));
            }
            ctx.fresh().await?;
            let (rules, incomplete) = ctx.authz.rules_for(caller, &ns);
            let mut resource_rules = vec![];
            let mut non_resource_rules = vec![];
            for rule in rules {
                if rule.non_resource_urls.is_empty() {
                    resource_rules.push(ResourceRule {
                        verbs: rule.verbs,
                        api_groups: Some(rule.api_groups),
                        resources: Some(rule.resources),
                        resource_names: (!rule.resource_names.is_empty())
                            .then_some(rule.resource_names),
                    });
                } else {
                    non_resource_rules.push(NonResourceRule {
                        verbs: rule.verbs,
                        non_resource_urls: Some(rule.non_resource_urls),
                    });
                }
            }
            r.status = Some(SubjectRulesReviewStatus {
                evaluation_error: incomplete.clone(),
                incomplete: incomplete.is_some(),
                non_resource_rules,
                resource_rules,
            });
            encode(&r)
        }
        other => Err(ApiError::internal(format!(
            "{other} is not an access review of {GROUP}"
        ))),
    }
}
