//! The admission chain: every write (create, update, patch, delete, and connect on pods/exec,
//! attach and portforward) passes it before it is persisted, in Kubernetes' order:
//!
//! 1. mutating: each plugin's [`Plugin::admit`] in chain order (built-ins, then the mutating
//!    webhooks), once more for the plugins that want it when a webhook asked to be reinvoked;
//! 2. schema validation: the kind's defaulting and validation (`rules`);
//! 3. validating: each plugin's [`Plugin::validate`] in chain order (built-ins, the validating
//!    webhooks, ResourceQuota last, so that nothing refused later is charged).
//!
//! The chain is the list in [`Chain::new`]; a plugin is a file under `plugins/` implementing
//! [`Plugin`], so adding one is that file and one line there. Plugins read what they need
//! from the watch cache ([`Env`]) and see the caller ([`Request::user`]); warnings for the
//! client go through `apiserver::warning`.

mod config;
pub mod plugins;

pub use config::{Config, ConfigError};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::auth::UserInfo;
use super::registry::{self, Resource};
use super::rules;
use crate::machinery::ApiError;
use crate::store::cache::{Cache, CachedObject, Filter};
use crate::store::Store;

/// How long admission waits for the watch cache to catch up with the store.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// What a request does (Kubernetes' admission.Operation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    /// pods/exec, pods/attach, pods/portforward.
    Connect,
}

impl Operation {
    /// As AdmissionReview and webhook rules spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// Whether schema validation applies: the server's own composed writes (a binding) are taken
/// as they are, as the write handlers already treated them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    Validate,
    /// A write of pods/ephemeralcontainers: only the ephemeral containers may change.
    EphemeralContainers,
    Trusted,
}

/// One request as admission sees it (Kubernetes' admission.Attributes).
pub struct Request<'a> {
    pub operation: Operation,
    pub resource: &'static Resource,
    /// `status`, `scale`, `binding`, `exec`, ... (None: the main resource).
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    /// Empty on a create with `generateName` only.
    pub name: &'a str,
    /// The stored object (update and delete).
    pub old: Option<&'a Value>,
    pub user: &'a UserInfo,
    /// Nothing may be changed outside the object (quota charges, webhooks with side effects).
    pub dry_run: bool,
    /// The operation's options as AdmissionReview carries them (CreateOptions, UpdateOptions,
    /// DeleteOptions, PodExecOptions, ...), or Null.
    pub options: Value,
    /// What the mutating webhooks remember between the first pass and a reinvocation.
    pub(crate) reinvocation: std::sync::Mutex<plugins::webhook::Reinvocation>,
}

impl<'a> Request<'a> {
    pub fn new(
        operation: Operation,
        resource: &'static Resource,
        namespace: Option<&'a str>,
        name: &'a str,
        user: &'a UserInfo,
    ) -> Request<'a> {
        Request {
            operation,
            resource,
            subresource: None,
            namespace,
            name,
            old: None,
            user,
            dry_run: false,
            options: Value::Null,
            reinvocation: Default::default(),
        }
    }

    pub fn subresource(mut self, s: Option<&'a str>) -> Self {
        self.subresource = s;
        self
    }

    pub fn old(mut self, old: &'a Value) -> Self {
        self.old = Some(old);
        self
    }

    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    pub fn options(mut self, options: Value) -> Self {
        self.options = options;
        self
    }

    /// The request is on the main resource (not a subresource) of group/kind.
    pub fn is(&self, group: &str, kind: &str) -> bool {
        self.subresource.is_none() && self.resource.group == group && self.resource.kind == kind
    }

    /// Whether the request is on a core/v1 Pod (main resource).
    pub fn is_pod(&self) -> bool {
        self.is("", "Pod")
    }

    /// Kubernetes' admission.NewForbidden: `pods "web" is forbidden: <why>`.
    pub fn forbidden(&self, obj: Option<&Value>, why: impl std::fmt::Display) -> ApiError {
        let r = self.resource;
        let resource = match r.group {
            "" => r.plural.to_string(),
            g => format!("{}.{g}", r.plural),
        };
        let name = match self.name {
            "" => obj
                .and_then(|o| o.pointer("/metadata/generateName"))
                .and_then(Value::as_str)
                .unwrap_or(""),
            n => n,
        };
        let message = match name {
            "" => format!("{resource} is forbidden: {why}"),
            n => format!("{resource} \"{n}\" is forbidden: {why}"),
        };
        ApiError::forbidden(message).with_details(r.group, r.plural, name)
    }
}

/// One admission plugin. Both phases do nothing unless the plugin implements them.
#[async_trait]
pub trait Plugin: Send + Sync {
    /// Kubernetes' name of the plugin (`LimitRanger`, `MutatingAdmissionWebhook`, ...).
    fn name(&self) -> &'static str;

    /// The mutating phase: may change `obj` (None on delete and connect).
    async fn admit(&self, _req: &Request<'_>, _obj: Option<&mut Value>) -> Result<(), ApiError> {
        Ok(())
    }

    /// The validating phase: may only refuse. `obj` is None on delete and connect.
    async fn validate(&self, _req: &Request<'_>, _obj: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The options object of a write as webhooks see it (`CreateOptions`, `UpdateOptions`,
/// `DeleteOptions`, `PatchOptions`).
pub fn options(kind: &str, dry_run: bool, field_manager: Option<&str>) -> Value {
    let mut o = serde_json::json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if dry_run {
        o["dryRun"] = serde_json::json!(["All"]);
    }
    if let Some(m) = field_manager {
        o["fieldManager"] = serde_json::json!(m);
    }
    o
}

/// What plugins may read: the watch cache, caught up with the store before each read so a
/// plugin sees every write acknowledged before the request (a LimitRange created just
/// before a pod applies to it).
#[derive(Clone)]
pub struct Env {
    pub store: Arc<dyn Store>,
    pub cache: Arc<Cache>,
}

impl Env {
    async fn fresh(&self) -> Result<(), ApiError> {
        self.cache
            .wait_for(self.store.current_revision(), CACHE_WAIT)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))
    }

    fn resource(group: &str, plural: &str) -> Result<&'static Resource, ApiError> {
        registry::RESOURCES
            .iter()
            .find(|r| r.group == group && r.plural == plural && r.stored_as().is_none())
            .ok_or_else(|| ApiError::internal(format!("{plural}.{group} is not served")))
    }

    /// One object of `group`/`plural` (`""` for core), or None.
    pub async fn get(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<CachedObject>>, ApiError> {
        let r = Env::resource(group, plural)?;
        self.fresh().await?;
        let rc = self
            .cache
            .resource(&r.prefix())
            .map_err(ApiError::internal)?;
        let key = r.key(namespace, name);
        rc.get(&key)
            .map_err(|u| crate::apiserver::handlers::undecodable(&key, u))
    }

    /// One object, parsed.
    pub async fn get_value(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        match self.get(group, plural, namespace, name).await? {
            Some(o) => Ok(Some(o.value().map_err(ApiError::internal)?)),
            None => Ok(None),
        }
    }

    /// Every object of `group`/`plural` in `namespace` (every namespace when None).
    pub async fn list(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<Arc<CachedObject>>, ApiError> {
        let r = Env::resource(group, plural)?;
        self.fresh().await?;
        let rc = self
            .cache
            .resource(&r.prefix())
            .map_err(ApiError::internal)?;
        let all: Filter = Arc::new(|_| true);
        let prefix = r.namespace_prefix(namespace);
        Ok(rc.list(&prefix, &all, None, None).items)
    }
}

/// The admission chain of one API server.
pub struct Chain {
    plugins: Vec<Arc<dyn Plugin>>,
}

impl Chain {
    /// Kubernetes' recommended order of the plugins skiff has.
    pub fn new(env: Env, config: &Config) -> Chain {
        use plugins::*;
        let all: Vec<Arc<dyn Plugin>> = vec![
            Arc::new(namespace_lifecycle::NamespaceLifecycle::new(env.clone())),
            Arc::new(limit_ranger::LimitRanger::new(env.clone())),
            Arc::new(service_account::ServiceAccount::new(env.clone())),
            Arc::new(node_restriction::NodeRestriction::new(env.clone())),
            Arc::new(pod_security::PodSecurity::new(
                env.clone(),
                config.pod_security.clone(),
            )),
            Arc::new(priority::Priority::new(env.clone())),
            Arc::new(storage::DefaultStorageClass::new(env.clone())),
            Arc::new(storage::StorageObjectInUseProtection),
            Arc::new(webhook::MutatingWebhooks::new(env.clone())),
            Arc::new(webhook::ValidatingWebhooks::new(env.clone())),
            Arc::new(resource_quota::ResourceQuota::new(env)),
        ];
        let plugins = all
            .into_iter()
            .filter(|p| !config.disabled.contains(p.name()))
            .collect();
        Chain { plugins }
    }

    /// The plugins' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }

    /// Admits a create or update of `obj` (already carrying its system metadata, defaulted):
    /// mutating plugins, defaulting again what they changed, schema validation, validating
    /// plugins. On success `obj` is what is persisted.
    pub async fn admit(
        &self,
        req: &Request<'_>,
        obj: &mut Value,
        schema: Schema,
    ) -> Result<(), ApiError> {
        let before = obj.clone();
        self.mutate(req, Some(obj)).await?;
        if *obj != before {
            // What mutating plugins and webhooks changed is defaulted and normalised again,
            // as Kubernetes decodes a patched object again.
            rules::default(req.resource, obj);
            rules::normalize(req.resource, obj);
        }
        let errors = match (schema, req.old) {
            (Schema::Validate, old) => rules::validate(req.resource, obj, old),
            (Schema::EphemeralContainers, Some(old)) => rules::validate_ephemeral(obj, old),
            (Schema::EphemeralContainers, None) | (Schema::Trusted, _) => Vec::new(),
        };
        if !errors.is_empty() {
            let name = super::meta::name(obj).unwrap_or(req.name);
            return Err(ApiError::invalid(
                req.resource.group,
                req.resource.kind,
                name,
                errors,
            ));
        }
        self.validate(req, Some(obj)).await
    }

    /// Admits a delete or a connect: both phases, without an object (a delete's is
    /// [`Request::old`]).
    pub async fn admit_without_object(&self, req: &Request<'_>) -> Result<(), ApiError> {
        self.mutate(req, None).await?;
        self.validate(req, None).await
    }

    async fn mutate(&self, req: &Request<'_>, mut obj: Option<&mut Value>) -> Result<(), ApiError> {
        for p in &self.plugins {
            p.admit(req, obj.as_deref_mut()).await?;
        }
        // A mutating webhook with reinvocationPolicy IfNeeded runs again when a later one
        // changed the object; the built-in mutating plugins run again before it (they are
        // idempotent), as Kubernetes' reinvocation does. Once at most.
        if plugins::webhook::start_reinvocation(req) {
            for p in &self.plugins {
                p.admit(req, obj.as_deref_mut()).await?;
            }
        }
        Ok(())
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        for p in &self.plugins {
            p.validate(req, obj).await?;
        }
        Ok(())
    }
}
