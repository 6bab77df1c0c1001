//! Resources that are answered, never stored (`Storage::None`): a POST gets back its object
//! with the status filled in, 201 Created, as Kubernetes' review APIs answer.

use std::sync::Arc;

use http::{header, StatusCode};

use super::{authentication, check_kind, Call, Ctx};
use crate::apiserver::authz;
use crate::apiserver::negotiate::{self, BodyFormat};
use crate::apiserver::output::{self, Resp};
use crate::machinery::ApiError;

pub async fn create(ctx: &Arc<Ctx>, call: &Call<'_>) -> Result<Resp, ApiError> {
    match (call.resource.group, call.resource.kind) {
        ("authentication.k8s.io", "TokenReview") => {
            return authentication::token_review(ctx, call).await
        }
        ("authentication.k8s.io", "SelfSubjectReview") => {
            return authentication::self_subject_review(call).await
        }
        _ => {}
    }
    let format = BodyFormat::of(call.header(header::CONTENT_TYPE))?;
    let mut obj = negotiate::decode_object(format, &call.body)?;
    check_kind(call.resource, &mut obj)?;
    let r = call.resource;
    let answered = match r.group {
        authz::review::GROUP => {
            authz::review::answer(ctx, call.user, r.kind, call.namespace(), obj).await?
        }
        _ => return Err(ApiError::path_not_found(r.plural)),
    };
    Ok(output::json(StatusCode::CREATED, &answered))
}
