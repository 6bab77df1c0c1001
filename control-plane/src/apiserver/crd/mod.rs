//! CustomResourceDefinitions served: each served version of an established definition is a
//! [`Resource`] like the built-in ones, kept in a process-wide table that the registry's
//! lookups consult after its static list. The rules behind such a resource (schema,
//! printer columns, scale paths, the managed-fields type) are its [`Custom`].
//!
//! Resources are `&'static` throughout the server, so a definition's resources are leaked
//! once per distinct definition spec (interned by the spec's JSON): memory grows with the
//! number of distinct definition revisions a process sees, not with requests or resyncs.
//!
//! `controller` keeps the table and the definitions' status current; this file holds the
//! table, the translation of a definition into resources and the per-request rules.

pub mod controller;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use serde_json::{json, Value};

use super::registry::{Resource, Scope, StatusOnCreate, Storage, Subresource};
use crate::machinery::fieldmanager::{self, Type};
use crate::machinery::jsonpath::Path;
use crate::machinery::schema::Structural;
use crate::machinery::table::TableColumnDefinition;
use crate::machinery::validation::FieldPath;
use crate::machinery::{FieldError, GroupKind};
use crate::store::cache::{CacheSpec, CUSTOM_PREFIX};

/// What a custom resource's version needs beyond its [`Resource`] entry.
pub struct Custom {
    /// The definition's name (`<plural>.<group>`).
    pub crd: String,
    /// The version objects are stored at.
    pub storage_version: &'static str,
    pub schema: Structural,
    pub columns: Vec<Column>,
    pub scale: Option<ScalePaths>,
    /// The managed-fields type (server-side apply), from the schema.
    pub managed: Arc<Type>,
}

impl std::fmt::Debug for Custom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Custom").field("crd", &self.crd).finish()
    }
}

/// One additionalPrinterColumn.
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i32,
    pub path: Path,
}

/// The scale subresource's paths.
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

#[derive(Default)]
struct Table {
    /// Definition name -> its served resources (preferred version first) and whether it is
    /// being deleted.
    by_crd: BTreeMap<String, Entry>,
    /// (group, version, plural) -> resource.
    by_path: HashMap<(String, String, String), &'static Resource>,
}

struct Entry {
    resources: Vec<&'static Resource>,
    terminating: bool,
}

static TABLE: RwLock<Option<Table>> = RwLock::new(None);

fn read<T>(f: impl FnOnce(&Table) -> T) -> T {
    let g = TABLE.read().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some(t) => f(t),
        None => f(&Table::default()),
    }
}

fn write<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    let mut g = TABLE.write().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Table::default))
}

/// Serves `resources` for the definition `crd` (replacing what it served before).
pub fn register(crd: &str, resources: Vec<&'static Resource>) {
    write(|t| {
        if let Some(old) = t.by_crd.remove(crd) {
            for r in old.resources {
                t.by_path.remove(&path_key(r));
            }
        }
        for r in &resources {
            t.by_path.insert(path_key(r), r);
        }
        t.by_crd.insert(
            crd.to_string(),
            Entry {
                resources,
                terminating: false,
            },
        );
    })
}

/// Stops serving the definition `crd`.
pub fn unregister(crd: &str) {
    write(|t| {
        if let Some(old) = t.by_crd.remove(crd) {
            for r in old.resources {
                t.by_path.remove(&path_key(r));
            }
        }
    })
}

/// Marks a definition as being deleted: its objects can be read and deleted, not created.
pub fn set_terminating(crd: &str) {
    write(|t| {
        if let Some(e) = t.by_crd.get_mut(crd) {
            e.terminating = true;
        }
    })
}

pub fn terminating(crd: &str) -> bool {
    read(|t| t.by_crd.get(crd).is_some_and(|e| e.terminating))
}

fn path_key(r: &Resource) -> (String, String, String) {
    (r.group.into(), r.version.into(), r.plural.into())
}

/// Every served custom resource, by definition name, preferred version first.
pub fn served() -> Vec<&'static Resource> {
    read(|t| {
        t.by_crd
            .values()
            .flat_map(|e| e.resources.iter().copied())
            .collect()
    })
}

pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    read(|t| {
        t.by_path
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .copied()
    })
}

pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    read(|t| {
        t.by_path
            .values()
            .find(|r| r.kind == kind && r.api_version() == api_version)
            .copied()
    })
}

pub fn find_version(group: &str, version: &str) -> bool {
    read(|t| {
        t.by_path
            .values()
            .any(|r| r.group == group && r.version == version)
    })
}

/// The watch cache's one cache of custom objects.
pub fn cache_spec() -> CacheSpec {
    CacheSpec {
        prefix: CUSTOM_PREFIX.to_string(),
        fields: vec!["metadata.name", "metadata.namespace"],
        indexed: vec!["metadata.namespace"],
        field_fn: Arc::new(crate::machinery::kinds::meta_field),
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_all(v: &[String]) -> &'static [&'static str] {
    Box::leak(
        v.iter()
            .map(|s| leak(s))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

/// Kubernetes' version priority: GA before beta before alpha, higher numbers first, then
/// the rest alphabetically (`v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > foo`).
pub fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = || -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        for (stage, name) in [(1u8, "beta"), (2, "alpha")] {
            if let Some(n) = tail.strip_prefix(name) {
                let minor: i64 = n.parse().ok()?;
                return Some((stage, -major, -minor));
            }
        }
        None
    };
    match parse() {
        Some((s, a, b)) => (s, a, b, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// The resources a definition serves, preferred version first, or why it cannot be served.
/// Interned: the same definition spec gives the same `&'static` resources.
pub fn resources_of(crd: &Value) -> Result<Vec<&'static Resource>, Vec<FieldError>> {
    static INTERNED: Mutex<Option<HashMap<String, Vec<&'static Resource>>>> = Mutex::new(None);
    let key = serde_json::to_string(&crd["spec"]).unwrap_or_default();
    if let Some(found) = INTERNED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(found.clone());
    }
    let built = build(crd)?;
    INTERNED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, built.clone());
    Ok(built)
}

fn build(crd: &Value) -> Result<Vec<&'static Resource>, Vec<FieldError>> {
    let def: apiext::CustomResourceDefinition = serde_json::from_value(crd.clone())
        .map_err(|e| vec![FieldError::invalid("", "", &e.to_string())])?;
    let spec = &def.spec;
    let name = def.metadata.name.clone().unwrap_or_default();
    let storage_version = spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| leak(&v.name))
        .ok_or_else(|| vec![FieldError::required("spec.versions[].storage")])?;
    let scope = match spec.scope.as_str() {
        "Cluster" => Scope::Cluster,
        _ => Scope::Namespaced,
    };
    let names = &spec.names;
    let singular = names
        .singular
        .clone()
        .unwrap_or_else(|| names.kind.to_lowercase());
    let (group, kind, plural) = (leak(&spec.group), leak(&names.kind), leak(&names.plural));
    let short_names = leak_all(names.short_names.as_deref().unwrap_or(&[]));
    let categories = leak_all(names.categories.as_deref().unwrap_or(&[]));
    let singular = leak(&singular);
    let mut versions: Vec<&apiext::CustomResourceDefinitionVersion> =
        spec.versions.iter().filter(|v| v.served).collect();
    versions.sort_by_key(|v| version_priority(&v.name));
    let raw_versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for v in versions {
        let i = raw_versions
            .iter()
            .position(|r| r["name"] == v.name.as_str())
            .unwrap_or(0);
        let raw = raw_versions.get(i).cloned().unwrap_or(Value::Null);
        let schema_value = raw
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        let path = FieldPath::new(&format!("spec.versions[{i}].schema.openAPIV3Schema"));
        let schema = Structural::compile(&schema_value, &path)?;
        let mut subresources = Vec::new();
        let sub = v.subresources.as_ref();
        if sub.is_some_and(|s| s.status.is_some()) {
            subresources.push(Subresource::Status);
        }
        let scale = sub.and_then(|s| s.scale.as_ref()).map(|s| ScalePaths {
            spec_replicas: s.spec_replicas_path.clone(),
            status_replicas: s.status_replicas_path.clone(),
            label_selector: s.label_selector_path.clone(),
        });
        if scale.is_some() {
            subresources.push(Subresource::Scale);
        }
        let columns = match &v.additional_printer_columns {
            Some(cols) => cols
                .iter()
                .filter_map(|c| {
                    Some(Column {
                        name: c.name.clone(),
                        type_: c.type_.clone(),
                        format: c.format.clone().unwrap_or_default(),
                        description: c.description.clone().unwrap_or_default(),
                        priority: c.priority.unwrap_or(0),
                        path: Path::parse(&c.json_path).ok()?,
                    })
                })
                .collect(),
            None => vec![Column {
                name: "Age".into(),
                type_: "date".into(),
                format: String::new(),
                description: "CreationTimestamp is a timestamp representing the server time when this object was created.".into(),
                priority: 0,
                path: Path::parse(".metadata.creationTimestamp").expect("a valid path"),
            }],
        };
        let managed = Arc::new(managed_type(&schema_value));
        let custom: &'static Custom = Box::leak(Box::new(Custom {
            crd: name.clone(),
            storage_version,
            schema,
            columns,
            scale,
            managed,
        }));
        let has_status = subresources.contains(&Subresource::Status);
        let r: &'static Resource = Box::leak(Box::new(Resource {
            group,
            version: leak(&v.name),
            kind,
            plural,
            singular,
            scope,
            short_names,
            categories,
            subresources: Box::leak(subresources.into_boxed_slice()),
            fields: &[],
            indexed: &["metadata.namespace"],
            status_on_create: if has_status {
                StatusOnCreate::Reset
            } else {
                StatusOnCreate::Keep
            },
            storage: Storage::Custom(custom),
            schema: super::registry::untyped_schema(),
        }));
        out.push(r);
    }
    Ok(out)
}

/// The managed-fields type of a structural schema: objects with properties are granular
/// maps (atomic with `x-kubernetes-map-type: atomic`), `additionalProperties` and
/// preserve-unknown-fields maps are granular maps of their element, lists follow
/// `x-kubernetes-list-type` (`map` with its keys, `set`, atomic otherwise), and `metadata`
/// is ObjectMeta's type.
fn managed_type(schema: &Value) -> Type {
    let mut root = fieldmanager::schema::from_structural(schema, 0);
    if let Type::Map { fields, .. } = &mut root {
        fields.insert("metadata".into(), object_meta_type());
        fields.insert("apiVersion".into(), Type::Scalar);
        fields.insert("kind".into(), Type::Scalar);
    }
    root
}

fn object_meta_type() -> Type {
    let t = fieldmanager::type_of(
        &GroupKind::new("", "ConfigMap"),
        <k8s_openapi::api::core::v1::ConfigMap as schemars::JsonSchema>::json_schema,
    );
    t.child("metadata").cloned().unwrap_or(Type::Scalar)
}

/// The Table columns of a custom resource: NAME, then its printer columns.
pub fn columns(c: &Custom) -> Vec<TableColumnDefinition> {
    let mut out = vec![TableColumnDefinition::name_column()];
    for col in &c.columns {
        out.push(TableColumnDefinition {
            name: col.name.clone(),
            type_: col.type_.clone(),
            format: col.format.clone(),
            description: col.description.clone(),
            priority: col.priority,
        });
    }
    out
}

/// One row: the name, then each printer column's value (dates as ages, as Kubernetes'
/// table convertor prints them; absent values empty).
pub fn cells(c: &Custom, obj: &Value, now: k8s_openapi::jiff::Timestamp) -> Vec<Value> {
    let mut out = vec![json!(obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(""))];
    for col in &c.columns {
        let found = col.path.all(obj);
        let cell = match found.as_slice() {
            [] => Value::Null,
            [one] => match (col.type_.as_str(), one) {
                ("date", Value::String(s)) => {
                    let then = s.parse::<k8s_openapi::jiff::Timestamp>().ok();
                    json!(crate::machinery::duration::age(then, now))
                }
                ("string", Value::String(_)) | ("integer" | "number", Value::Number(_)) => {
                    (*one).clone()
                }
                ("boolean", Value::Bool(_)) => (*one).clone(),
                (_, Value::String(s)) => json!(s),
                (_, other) => json!(other.to_string()),
            },
            many => json!(many
                .iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(",")),
        };
        out.push(cell);
    }
    out
}

/// The value at a scale path (`.spec.replicas`) as JSON pointer segments.
pub fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .fold(String::new(), |mut acc, s| {
            acc.push('/');
            acc.push_str(&s.replace('~', "~0").replace('/', "~1"));
            acc
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_as_kubernetes_sorts_them() {
        let mut v = vec![
            "v1alpha1", "foo", "v1", "v2beta1", "v1beta2", "v2", "v10", "v1beta1",
        ];
        v.sort_by_key(|s| version_priority(s));
        assert_eq!(
            v,
            ["v10", "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn scale_paths_become_pointers() {
        assert_eq!(pointer(".spec.replicas"), "/spec/replicas");
        assert_eq!(pointer(".status.a/b"), "/status/a~1b");
    }
}
