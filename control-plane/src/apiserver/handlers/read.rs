//! get and list, served from the watch cache at a revision at least as new as the client asks
//! for (the latest acknowledged write when it names none), as JSON or as a Table.

use std::sync::Arc;

use http::{header, StatusCode};
use serde_json::{json, Value};

use super::{Call, Ctx};
use crate::apiserver::negotiate::{self, Output};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry::Resource;
use crate::apiserver::request::{ListOptions, ReadAt};
use crate::apiserver::{conversion, meta, rules, table};
use crate::machinery::ApiError;
use crate::store::cache::{CacheError, Page};
use crate::store::Revision;

/// Brings the cache to the revision a read asks for; returns the revision to report.
pub async fn read_at(ctx: &Ctx, at: ReadAt) -> Result<Revision, ApiError> {
    match at {
        ReadAt::Latest => ctx.fresh().await,
        ReadAt::Any => {
            ctx.cache_ready()?;
            Ok(ctx.cache.revision())
        }
        ReadAt::NotOlderThan(n) => {
            ctx.at_least(Revision(n)).await?;
            Ok(ctx.cache.revision())
        }
    }
}

pub async fn get(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let opts = ListOptions::from_query(call.query)?;
    read_at(ctx, opts.read_at()?).await?;
    let key = call.key(name);
    let obj = ctx
        .resource_cache(call.resource)?
        .get(&key)
        .map_err(|u| super::undecodable(&key, u))?
        .ok_or_else(|| call.not_found(name))?;
    match negotiate::output(
        call.header(header::ACCEPT),
        call.query.get("includeObject").map(String::as_str),
    ) {
        Output::Object => Ok(output::bytes(
            StatusCode::OK,
            output::JSON,
            conversion::served(call.resource, &obj)?,
        )),
        Output::Table(inc) => {
            let t = table::render(
                call.resource,
                std::slice::from_ref(&obj),
                inc,
                Some(obj.revision),
                None,
            )?;
            Ok(output::ok(&t))
        }
    }
}

/// The continuation of a paged list: the revision of its first page and the last key sent.
fn encode_continue(rev: Revision, after: &str) -> String {
    let raw = serde_json::to_vec(&json!({ "rv": rev.0, "start": after })).unwrap_or_default();
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: malformed token");
    if !token.len().is_multiple_of(2) || !token.is_ascii() {
        return Err(bad());
    }
    let raw: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    match (v["rv"].as_u64(), v["start"].as_str()) {
        (Some(rv), Some(s)) => Ok((Revision(rv), s.to_string())),
        _ => Err(bad()),
    }
}

pub async fn list(ctx: &Arc<Ctx>, call: &Call<'_>, opts: ListOptions) -> Result<Resp, ApiError> {
    let r = call.resource;
    let sel = rules::selection(
        r,
        call.namespace(),
        opts.label_selector.as_deref(),
        opts.field_selector.as_deref(),
    )?;
    let cache = ctx.resource_cache(r)?;
    let prefix = r.namespace_prefix(call.namespace());
    let page = match &opts.continue_token {
        // Later pages show the objects as the first page did, or 410 once that is impossible
        // (as Kubernetes answers once etcd has compacted the first page's revision).
        Some(t) => {
            let (rev, after) = decode_continue(t)?;
            ctx.cache_ready()?;
            cache
                .list_at(&prefix, &sel.filter, Some(&after), opts.limit, rev)
                .map_err(|e| match e {
                    CacheError::Expired { .. } => ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ),
                    e => ApiError::internal(e),
                })?
        }
        None => {
            read_at(ctx, opts.read_at()?).await?;
            cache.list(&prefix, &sel.filter, None, opts.limit)
        }
    };
    let Page {
        items,
        revision,
        continue_after,
    } = page;
    let token = continue_after.map(|k| encode_continue(revision, &k));
    ctx.metrics.listed(r.plural, items.len());
    match negotiate::output(
        call.header(header::ACCEPT),
        call.query.get("includeObject").map(String::as_str),
    ) {
        Output::Object => {
            let jsons = items
                .iter()
                .map(|o| conversion::served(r, o))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(output::bytes(
                StatusCode::OK,
                output::JSON,
                output::list_bytes(
                    &r.api_version(),
                    &r.list_kind(),
                    revision,
                    token.as_deref(),
                    jsons.iter().map(|b| b.as_ref()),
                ),
            ))
        }
        Output::Table(inc) => {
            let t = table::render(r, &items, inc, Some(revision), token.as_deref())?;
            Ok(output::ok(&t))
        }
    }
}

/// The object at `key` as stored now (for writes), with its resourceVersion, in the shape of
/// the resource the call names.
pub async fn current(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
) -> Result<(Value, Revision), ApiError> {
    stored(ctx, call.resource, &call.key(name), name)
        .await?
        .ok_or_else(|| call.not_found(name))
}

/// The object of `r` at `key` as stored, with its revision (None: it does not exist).
pub async fn stored(
    ctx: &Ctx,
    r: &Resource,
    key: &str,
    name: &str,
) -> Result<Option<(Value, Revision)>, ApiError> {
    let Some(kv) = ctx
        .store
        .get(key)
        .await
        .map_err(|e| super::store_error(r, name, e))?
    else {
        return Ok(None);
    };
    let mut v = conversion::from_storage(r, super::parse_stored(&kv.value)?)?;
    meta::set_resource_version(&mut v, kv.mod_revision);
    Ok(Some((v, kv.mod_revision)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = encode_continue(Revision(42), "/registry/pods/default/web-1");
        assert_eq!(
            decode_continue(&t).unwrap(),
            (Revision(42), "/registry/pods/default/web-1".to_string())
        );
        assert_eq!(decode_continue("zz").unwrap_err().code, 400);
        assert_eq!(decode_continue("abc").unwrap_err().code, 400);
        assert_eq!(decode_continue("7b7d").unwrap_err().code, 400);
    }
}
