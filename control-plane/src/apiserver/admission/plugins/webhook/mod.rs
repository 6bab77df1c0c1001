//! Dynamic admission: the MutatingAdmissionWebhook and ValidatingAdmissionWebhook plugins.
//! Every admissionregistration.k8s.io/v1 webhook whose rules and selectors match a request
//! gets an AdmissionReview v1 over HTTPS (`client`): mutating webhooks one after another in
//! configuration-name order, each JSONPatch applied before the next is called (and those
//! with reinvocationPolicy IfNeeded called again once when a later one changed the object);
//! validating webhooks all at once. A refusal reaches the client with the webhook's status
//! and message (`admission webhook "x" denied the request: ...`), its warnings as Warning
//! headers; a webhook that cannot be called fails the request (failurePolicy Fail, 500) or
//! is skipped (Ignore). A dry-run request only goes to webhooks without side effects.

mod client;
mod config;
mod matching;
mod review;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;

use self::config::{FailurePolicy, Hook, Kind, SideEffects};
use super::super::{Env, Plugin, Request};
use crate::apiserver::{meta, warning};
use crate::machinery::{ApiError, Reason};
use crate::store::Revision;

/// What the mutating webhooks remember between the first pass and a reinvocation.
#[derive(Debug, Default)]
pub struct Reinvocation {
    /// The second pass is running.
    reinvoking: bool,
    /// IfNeeded webhooks called so far in the first pass.
    called: Vec<String>,
    /// Webhooks to call in the second pass (IfNeeded ones called before a later change).
    again: BTreeSet<String>,
}

/// Starts the second mutating pass if a webhook asked for it; false if none is needed.
pub fn start_reinvocation(req: &Request<'_>) -> bool {
    let mut r = req.reinvocation.lock().unwrap_or_else(|p| p.into_inner());
    if r.reinvoking || r.again.is_empty() {
        return false;
    }
    r.reinvoking = true;
    true
}

/// The parsed webhooks of one kind, kept until a configuration changes.
struct Snapshot {
    /// The configurations' (key, revision) the hooks were parsed from.
    source: Vec<(String, Revision)>,
    hooks: Arc<Vec<Hook>>,
}

struct Hooks {
    env: Env,
    kind: Kind,
    snapshot: Mutex<Option<Snapshot>>,
}

impl Hooks {
    fn new(env: Env, kind: Kind) -> Hooks {
        Hooks {
            env,
            kind,
            snapshot: Mutex::new(None),
        }
    }

    /// The current webhooks (parsed again only when a configuration changed).
    async fn current(&self) -> Result<Arc<Vec<Hook>>, ApiError> {
        let found = self
            .env
            .list("admissionregistration.k8s.io", self.kind.plural(), None)
            .await?;
        let source: Vec<(String, Revision)> =
            found.iter().map(|o| (o.key.clone(), o.revision)).collect();
        let mut snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = snap.as_ref().filter(|s| s.source == source) {
            return Ok(s.hooks.clone());
        }
        let hooks = match self.kind {
            Kind::Mutating => config::mutating(
                found
                    .iter()
                    .filter_map(|o| serde_json::from_slice(&o.json).ok())
                    .collect(),
            ),
            Kind::Validating => config::validating(
                found
                    .iter()
                    .filter_map(|o| serde_json::from_slice(&o.json).ok())
                    .collect(),
            ),
        };
        let hooks = Arc::new(hooks);
        *snap = Some(Snapshot {
            source,
            hooks: hooks.clone(),
        });
        Ok(hooks)
    }

    /// The hooks that want this request, in calling order.
    async fn matching(
        &self,
        req: &Request<'_>,
        obj: Option<&Value>,
    ) -> Result<Vec<usize>, ApiError> {
        if matching::exempt(req) {
            return Ok(Vec::new());
        }
        let hooks = self.current().await?;
        let candidates: Vec<usize> = (0..hooks.len())
            .filter(|i| matching::rules_match(&hooks[*i], req))
            .collect();
        if candidates.is_empty() {
            return Ok(candidates);
        }
        let labels = |v: Option<&Value>| -> Option<BTreeMap<String, String>> {
            v.map(|v| {
                v.pointer("/metadata/labels")
                    .and_then(|l| serde_json::from_value(l.clone()).ok())
                    .unwrap_or_default()
            })
        };
        let object = labels(obj);
        let old = labels(req.old);
        let namespace = if req.is("", "Namespace") {
            // A namespace is selected by its own labels.
            object.clone().or_else(|| old.clone())
        } else if let Some(ns) = req.namespace {
            Some(
                self.env
                    .get("", "namespaces", None, ns)
                    .await?
                    .map(|o| o.labels.clone())
                    .unwrap_or_default(),
            )
        } else {
            None
        };
        Ok(candidates
            .into_iter()
            .filter(|i| {
                matching::selectors_match(
                    &hooks[*i],
                    namespace.as_ref(),
                    object.as_ref(),
                    old.as_ref(),
                )
            })
            .collect())
    }

    /// Calls one webhook. `Ok(None)`: skipped (failurePolicy Ignore after a failure).
    async fn call(
        &self,
        hook: &Hook,
        req: &Request<'_>,
        obj: Option<&Value>,
    ) -> Result<Option<review::Response>, ApiError> {
        if req.dry_run && hook.side_effects == SideEffects::Some {
            return Err(ApiError::bad_request(format!(
                "admission webhook \"{}\" does not support dry run",
                hook.name
            )));
        }
        let uid = meta::new_uid();
        let body = review::request(&uid, req, obj);
        let answer = client::call(&self.env, hook, &body)
            .await
            .and_then(|bytes| review::response(&bytes, &uid));
        match answer {
            Ok(r) => Ok(Some(r)),
            Err(e) => self.failed(hook, format!("failed to call webhook: {e}")),
        }
    }

    /// A webhook that could not be called or answered nonsense.
    fn failed<T>(&self, hook: &Hook, why: String) -> Result<Option<T>, ApiError> {
        match hook.failure_policy {
            FailurePolicy::Ignore => {
                tracing::warn!(webhook = %hook.name, error = %why, "webhook failed open (failurePolicy Ignore)");
                Ok(None)
            }
            FailurePolicy::Fail => Err(ApiError::internal(format!(
                "failed calling webhook \"{}\": {why}",
                hook.name
            ))),
        }
    }
}

/// The error a refusal becomes (Kubernetes' webhookerrors.ToStatusErr).
fn denied(hook: &Hook, status: Option<review::Status>) -> ApiError {
    let s = status.unwrap_or_default();
    let by = format!("admission webhook \"{}\" denied the request", hook.name);
    let message = match (s.message.as_str(), s.reason.as_str()) {
        ("", "") => format!("{by} without explanation"),
        ("", reason) => format!("{by}: {reason}"),
        (m, _) => format!("{by}: {m}"),
    };
    // A refusal is never a success code.
    let code = if s.code < 400 { 400 } else { s.code };
    ApiError::new(code, reason_for(code), message)
}

/// The Status reason of an error code (a webhook's own reason string is in its message).
fn reason_for(code: u16) -> Reason {
    match code {
        401 => Reason::Unauthorized,
        403 => Reason::Forbidden,
        404 => Reason::NotFound,
        405 => Reason::MethodNotAllowed,
        409 => Reason::Conflict,
        410 => Reason::Gone,
        413 => Reason::RequestEntityTooLarge,
        415 => Reason::UnsupportedMediaType,
        422 => Reason::Invalid,
        429 => Reason::TooManyRequests,
        503 => Reason::ServiceUnavailable,
        504 => Reason::Timeout,
        c if c >= 500 => Reason::InternalError,
        _ => Reason::BadRequest,
    }
}

fn passed_on(r: &review::Response) {
    for w in &r.warnings {
        warning::add(w.clone());
    }
}

/// MutatingAdmissionWebhook.
pub struct MutatingWebhooks {
    hooks: Hooks,
}

impl MutatingWebhooks {
    pub fn new(env: Env) -> MutatingWebhooks {
        MutatingWebhooks {
            hooks: Hooks::new(env, Kind::Mutating),
        }
    }
}

#[async_trait]
impl Plugin for MutatingWebhooks {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    async fn admit(&self, req: &Request<'_>, mut obj: Option<&mut Value>) -> Result<(), ApiError> {
        let matched = self.hooks.matching(req, obj.as_deref()).await?;
        if matched.is_empty() {
            return Ok(());
        }
        let hooks = self.hooks.current().await?;
        for i in matched {
            let hook = &hooks[i];
            let second_pass = {
                let r = req.reinvocation.lock().unwrap_or_else(|p| p.into_inner());
                if r.reinvoking && !r.again.contains(&hook.id) {
                    continue;
                }
                r.reinvoking
            };
            let Some(resp) = self.hooks.call(hook, req, obj.as_deref()).await? else {
                continue;
            };
            passed_on(&resp);
            if !resp.allowed {
                return Err(denied(hook, resp.status));
            }
            let changed = match obj.as_deref_mut() {
                Some(o) => {
                    let mut patched = o.clone();
                    match review::apply_patch(&mut patched, &resp) {
                        Ok(c) => {
                            *o = patched;
                            c
                        }
                        Err(e) => {
                            self.hooks.failed::<()>(hook, e)?;
                            false
                        }
                    }
                }
                None => false,
            };
            let mut r = req.reinvocation.lock().unwrap_or_else(|p| p.into_inner());
            if !second_pass {
                if changed {
                    // Every IfNeeded webhook called before this change sees it again.
                    let earlier: Vec<String> = r.called.clone();
                    r.again.extend(earlier);
                }
                if hook.reinvoke_if_needed {
                    r.called.push(hook.id.clone());
                }
            }
        }
        Ok(())
    }
}

/// ValidatingAdmissionWebhook.
pub struct ValidatingWebhooks {
    hooks: Hooks,
}

impl ValidatingWebhooks {
    pub fn new(env: Env) -> ValidatingWebhooks {
        ValidatingWebhooks {
            hooks: Hooks::new(env, Kind::Validating),
        }
    }
}

#[async_trait]
impl Plugin for ValidatingWebhooks {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let matched = self.hooks.matching(req, obj).await?;
        if matched.is_empty() {
            return Ok(());
        }
        let hooks = self.hooks.current().await?;
        // All at once, as Kubernetes calls them; the first refusal in order wins.
        let calls = matched
            .iter()
            .map(|i| self.hooks.call(&hooks[*i], req, obj));
        let answers = futures::future::join_all(calls).await;
        for (i, answer) in matched.iter().zip(answers) {
            let Some(resp) = answer? else { continue };
            passed_on(&resp);
            if !resp.allowed {
                return Err(denied(&hooks[*i], resp.status));
            }
        }
        Ok(())
    }
}
