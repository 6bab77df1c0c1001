//! Structural schemas of CustomResourceDefinitions: one CRD version's `openAPIV3Schema`
//! compiled once (`Structural::compile`, with Kubernetes' apiextensions checks of the schema
//! itself), then used on every request and every read of a custom object: defaulting,
//! pruning of unknown fields, validation (OpenAPI value validations and CEL
//! `x-kubernetes-validations` rules) and the schema published in /openapi.
//!
//! Rooms: `node` is the compiled tree and the schema checks, `validate` the OpenAPI value
//! validations, `defaults` and `prune` the two rewrites, `cel` the rules, `format` the
//! string formats, `openapi` the published form. Everything is pure: no I/O, no locks.

mod cel;
mod defaults;
mod format;
mod node;
mod openapi;
mod prune;
mod validate;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde_json::Value;

use super::status::FieldError;
use super::validation::FieldPath;

/// One CRD version's compiled structural schema. Cheap to clone (an `Arc`), `Send + Sync`:
/// the API server keeps one per served version and shares it between requests.
#[derive(Clone)]
pub struct Structural {
    inner: Arc<Inner>,
}

struct Inner {
    root: node::Node,
    /// The schema as the CRD gave it, for /openapi.
    raw: Value,
}

impl std::fmt::Debug for Structural {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Structural")
            .field("schema", &self.inner.raw)
            .finish()
    }
}

impl Structural {
    /// Compile one CRD version's `openAPIV3Schema` (JSON). Errors are Kubernetes'
    /// apiextensions validation of the schema itself (structural rules: every node has a type
    /// unless x-kubernetes-int-or-string / x-kubernetes-preserve-unknown-fields, no
    /// additionalProperties with properties, metadata at the root may only restrict
    /// name/generateName, CEL rules that do not compile, defaults that do not validate...),
    /// each a `FieldError` under `path` (e.g.
    /// `spec.versions[0].schema.openAPIV3Schema.properties[spec].type`).
    pub fn compile(schema: &Value, path: &FieldPath) -> Result<Structural, Vec<FieldError>> {
        let root = node::compile(schema, path)?;
        Ok(Structural {
            inner: Arc::new(Inner {
                root,
                raw: schema.clone(),
            }),
        })
    }

    /// Apply `default`s as Kubernetes does when it decodes a request and when it reads from
    /// storage: a missing field with a default gets it (and then the defaults inside it); a
    /// `null` in a field that is not `nullable` is replaced by the default, or dropped when
    /// there is none.
    pub fn apply_defaults(&self, obj: &mut Value) {
        defaults::apply(&self.inner.root, obj);
    }

    /// Drop fields the schema does not know (not under x-kubernetes-preserve-unknown-fields,
    /// with embedded resources keeping apiVersion, kind and ObjectMeta's fields); returns their
    /// paths (`spec.foo`, `spec.items[0].bar`) for fieldValidation Warn/Strict.
    /// The root's apiVersion, kind and metadata are the caller's (ObjectMeta) and left alone.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        let mut pruned = Vec::new();
        prune::root(&self.inner.root, obj, &mut pruned);
        pruned
    }

    /// Validate an object: OpenAPI value validations, list-type uniqueness and the CEL rules.
    /// `old` is the stored object on update: CEL transition rules (those using `oldSelf`) run
    /// only where the old object has a value at the same (correlatable) place. Errors carry
    /// Kubernetes' field paths and messages, for a 422 with causes.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        validate::root(&self.inner.root, obj, old)
    }

    /// The schema as published in /openapi/v3 (for `kubectl explain`), with descriptions.
    /// crdapi wraps it with the GroupVersionKind extension and the standard apiVersion, kind
    /// and metadata properties.
    pub fn openapi(&self) -> Value {
        self.inner.raw.clone()
    }

    /// The schema as published in /openapi/v2: what OpenAPI v2 cannot say is left out
    /// (`nullable`, and with it the `type` of a nullable field; allOf/anyOf/oneOf/not), as
    /// Kubernetes does, so clients that validate against v2 do not reject valid objects.
    pub fn openapi_v2(&self) -> Value {
        openapi::v2(&self.inner.raw)
    }
}
