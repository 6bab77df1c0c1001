//! The shape of a kind as server-side apply needs it: which nodes are structs (declared
//! fields), maps (free keys), lists and scalars, and how each list and map merges. The shape
//! comes from the kind's OpenAPI schema (k8s-openapi's schemars impls, the same schemas
//! /openapi/v3 serves); list semantics from the strategic-merge table in `patch/strategy.rs`
//! (Kubernetes derives SSA list types from the same `patchStrategy`/`patchMergeKey` tags
//! where `x-kubernetes-list-type` is absent), plus the few places where Kubernetes' OpenAPI
//! says more than the patch tags: extra list-map keys with their defaults, and atomic maps and
//! structs (`x-kubernetes-map-type: atomic`, `+structType=atomic`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value};

use crate::machinery::patch::{schema_for, FieldStrategy, Schema as Strategy, EMPTY};
use crate::machinery::GroupKind;

/// How a list's items are told apart.
#[derive(Clone, Debug, PartialEq)]
pub enum ListKind {
    /// Replaced whole (the default for lists without a merge strategy).
    Atomic,
    /// Scalars, each item its own identity.
    Set,
    /// Objects identified by these key fields (sorted by name); a key an item omits takes
    /// its default when it has one (`protocol: TCP`).
    Map(Vec<ListKey>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ListKey {
    pub name: String,
    pub default: Option<Value>,
}

/// One node of a kind's shape.
#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    /// A leaf: strings, numbers, booleans, quantities, untyped JSON.
    Scalar,
    /// An object: declared fields (a struct), free keys of `elem` (a map), or both.
    Map {
        fields: BTreeMap<String, Type>,
        elem: Option<Box<Type>>,
        atomic: bool,
        /// Declared fields the schema requires (Go fields without `omitempty`).
        required: Vec<String>,
    },
    List {
        elem: Box<Type>,
        kind: ListKind,
    },
}

impl Type {
    /// The type of a map's entry or a struct's field (`None`: not declared, untyped).
    pub fn child(&self, key: &str) -> Option<&Type> {
        match self {
            Type::Map { fields, elem, .. } => fields.get(key).or(elem.as_deref()),
            _ => None,
        }
    }

    /// Whether a declared field is required (kept even when empty).
    pub fn requires(&self, key: &str) -> bool {
        matches!(self, Type::Map { required, .. } if required.iter().any(|r| r == key))
    }

    /// Whether the node is a map of free keys (not a struct).
    pub fn is_free_map(&self) -> bool {
        matches!(self, Type::Map { fields, elem: Some(_), .. } if fields.is_empty())
    }

    /// Whether `key` is a declared struct field (not a map entry).
    pub fn declares(&self, key: &str) -> bool {
        matches!(self, Type::Map { fields, .. } if fields.contains_key(key))
    }

    /// Whether the node is a leaf whatever its content.
    pub fn is_atomic(&self) -> bool {
        match self {
            Type::Scalar => true,
            Type::Map { atomic, .. } => *atomic,
            Type::List { kind, .. } => *kind == ListKind::Atomic,
        }
    }
}

/// The untyped leaf used where a schema says nothing.
pub static UNTYPED: Type = Type::Scalar;

/// Structs Kubernetes marks `+structType=atomic`: replaced whole, owned as one field.
const ATOMIC_STRUCTS: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.NodeSelectorTerm",
    "io.k8s.api.core.v1.TopologySelectorTerm",
    "io.k8s.api.core.v1.ObjectReference",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
];

/// Maps Kubernetes marks `x-kubernetes-map-type: atomic`: (owning definition, field).
const ATOMIC_MAPS: &[(&str, &str)] = &[
    ("io.k8s.api.core.v1.PodSpec", "nodeSelector"),
    ("io.k8s.api.core.v1.ServiceSpec", "selector"),
];

/// A list-map key field and its default.
type KeyDefault = (&'static str, Option<&'static str>);

/// Associative lists whose `x-kubernetes-list-map-keys` name more keys than the patch merge
/// key: (owning definition, field) -> the keys, with their defaults.
const LIST_MAP_KEYS: &[(&str, &str, &[KeyDefault])] = &[
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        &[("containerPort", None), ("protocol", Some("TCP"))],
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "ports",
        &[("containerPort", None), ("protocol", Some("TCP"))],
    ),
    (
        "io.k8s.api.core.v1.ServiceSpec",
        "ports",
        &[("port", None), ("protocol", Some("TCP"))],
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        &[("topologyKey", None), ("whenUnsatisfiable", None)],
    ),
];

/// Deep enough for every Kubernetes type; stops self-referencing schemas (JSONSchemaProps).
const MAX_DEPTH: usize = 40;

/// How a kind's OpenAPI schema is made (the registry's builder for the kind's type).
pub type SchemaBuilder = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// The shape of `kind`, compiled once per kind and shared.
pub fn type_of(kind: &GroupKind, build: SchemaBuilder) -> Arc<Type> {
    static CACHE: OnceLock<Mutex<HashMap<GroupKind, Arc<Type>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(kind) {
        return t.clone();
    }
    let t = Arc::new(compile(kind, build));
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(kind.clone(), t.clone());
    t
}

/// Compiles a kind's schema (uncached).
pub fn compile(kind: &GroupKind, build: SchemaBuilder) -> Type {
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    let root = build(&mut generator).to_value();
    let defs: Map<String, Value> = generator.take_definitions(true);
    let compiler = Compiler {
        defs: &defs,
        open: Default::default(),
    };
    compiler.node(&root, schema_for(kind).unwrap_or(&EMPTY), 0)
}

struct Compiler<'a> {
    defs: &'a Map<String, Value>,
    /// The definitions being compiled on the current path: a recursive type
    /// (apiextensions' JSONSchemaProps) is atomic where it recurs instead of expanding without
    /// end.
    open: std::cell::RefCell<Vec<String>>,
}

impl Compiler<'_> {
    /// Follows `$ref` and single-element `allOf` wrappers; returns the schema and the name
    /// of the definition it came from.
    fn resolve<'s>(&'s self, mut s: &'s Value) -> (&'s Value, Option<&'s str>) {
        let mut name = None;
        for _ in 0..8 {
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                let n = r.rsplit('/').next().unwrap_or(r);
                match self.defs.get(n) {
                    Some(d) => {
                        name = Some(n);
                        s = d;
                        continue;
                    }
                    None => break,
                }
            }
            match s.get("allOf").and_then(Value::as_array) {
                Some(all) if all.len() == 1 => s = &all[0],
                _ => break,
            }
        }
        (s, name)
    }

    fn node(&self, s: &Value, strategy: &'static Strategy, depth: usize) -> Type {
        if depth > MAX_DEPTH {
            return Type::Scalar;
        }
        let (s, name) = self.resolve(s);
        if let Some(n) = name {
            if self.open.borrow().iter().any(|o| o == n) {
                return Type::Scalar;
            }
            self.open.borrow_mut().push(n.to_string());
            let t = self.node_of(s, name, strategy, depth);
            self.open.borrow_mut().pop();
            return t;
        }
        self.node_of(s, name, strategy, depth)
    }

    fn node_of(
        &self,
        s: &Value,
        name: Option<&str>,
        strategy: &'static Strategy,
        depth: usize,
    ) -> Type {
        let types: Vec<&str> = match s.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let props = s.get("properties").and_then(Value::as_object);
        let additional = s.get("additionalProperties").filter(|a| a.is_object());
        if types.contains(&"array") {
            // A list reached without its owning field (a list of lists): atomic.
            let items = s.get("items").unwrap_or(&Value::Null);
            return Type::List {
                elem: Box::new(self.node(items, &EMPTY, depth + 1)),
                kind: ListKind::Atomic,
            };
        }
        if props.is_none() && additional.is_none() {
            return Type::Scalar;
        }
        let mut fields = BTreeMap::new();
        for (f, fs) in props.into_iter().flatten() {
            fields.insert(f.clone(), self.field(name, f, fs, strategy, depth + 1));
        }
        let elem = additional.map(|a| Box::new(self.node(a, &EMPTY, depth + 1)));
        let required = required_of(s);
        Type::Map {
            fields,
            elem,
            atomic: name.is_some_and(|n| ATOMIC_STRUCTS.contains(&n)),
            required,
        }
    }

    /// A declared field of the definition `owner`, with the strategies its parent has for it.
    fn field(
        &self,
        owner: Option<&str>,
        field: &str,
        s: &Value,
        strategy: &'static Strategy,
        depth: usize,
    ) -> Type {
        let (resolved, _) = self.resolve(s);
        let is_array = match resolved.get("type") {
            Some(Value::String(t)) => t == "array",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "array"),
            _ => false,
        };
        let owned = |table: &[(&str, &str)]| {
            owner.is_some_and(|o| table.iter().any(|(d, f)| *d == o && *f == field))
        };
        if is_array {
            let items = resolved.get("items").unwrap_or(&Value::Null);
            let (kind, item_strategy) = match strategy.field(field) {
                Some(FieldStrategy::MergeByKey { key, item }) => {
                    let keys = LIST_MAP_KEYS
                        .iter()
                        .find(|(d, f, _)| Some(*d) == owner && *f == field)
                        .map(|(_, _, keys)| {
                            keys.iter()
                                .map(|(n, d)| ListKey {
                                    name: n.to_string(),
                                    default: d.map(|d| Value::String(d.into())),
                                })
                                .collect()
                        })
                        .unwrap_or_else(|| {
                            vec![ListKey {
                                name: key.to_string(),
                                default: None,
                            }]
                        });
                    (ListKind::Map(keys), *item)
                }
                Some(FieldStrategy::MergeSet) => (ListKind::Set, &EMPTY),
                _ => (ListKind::Atomic, &EMPTY),
            };
            return Type::List {
                elem: Box::new(self.node(items, item_strategy, depth + 1)),
                kind,
            };
        }
        let mut t = self.node(s, strategy.object(field), depth);
        if owned(ATOMIC_MAPS) {
            if let Type::Map { atomic, .. } = &mut t {
                *atomic = true;
            }
        }
        t
    }
}

/// A schema's `required` field names.
fn required_of(s: &Value) -> Vec<String> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The managed-fields type of a CustomResourceDefinition's structural schema (JSON): objects
/// with properties are granular maps (atomic with `x-kubernetes-map-type: atomic`),
/// `additionalProperties` and preserve-unknown-fields maps granular maps of their element,
/// lists per `x-kubernetes-list-type` (`map` with its keys, `set`, atomic otherwise).
pub fn from_structural(s: &Value, depth: usize) -> Type {
    if depth > 40 {
        return Type::Scalar;
    }
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    let preserve = s
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match ty {
        "array" => {
            let elem = s
                .get("items")
                .map(|i| from_structural(i, depth + 1))
                .unwrap_or(Type::Scalar);
            let kind = match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("map") => ListKind::Map(
                    s.get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|keys| {
                            keys.iter()
                                .filter_map(Value::as_str)
                                .map(|k| ListKey {
                                    name: k.to_string(),
                                    default: s
                                        .pointer(&format!("/items/properties/{k}/default"))
                                        .cloned(),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                Some("set") => ListKind::Set,
                _ => ListKind::Atomic,
            };
            Type::List {
                elem: Box::new(elem),
                kind,
            }
        }
        "object" | ""
            if s.get("properties").is_some()
                || s.get("additionalProperties").is_some()
                || preserve
                || ty == "object" =>
        {
            let fields: BTreeMap<String, Type> = s
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| (k.clone(), from_structural(v, depth + 1)))
                        .collect()
                })
                .unwrap_or_default();
            let elem = match s.get("additionalProperties") {
                Some(Value::Object(a)) => Some(Box::new(from_structural(
                    &Value::Object(a.clone()),
                    depth + 1,
                ))),
                _ if preserve || fields.is_empty() => Some(Box::new(Type::Scalar)),
                _ => None,
            };
            let atomic = s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
            let required = required_of(s);
            Type::Map {
                fields,
                elem,
                atomic,
                required,
            }
        }
        _ => Type::Scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::{apps, core};
    use schemars::JsonSchema;

    fn at<'t>(t: &'t Type, path: &[&str]) -> &'t Type {
        let mut t = t;
        for p in path {
            t = match (t, *p) {
                (Type::List { elem, .. }, "[]") => elem,
                _ => t.child(p).unwrap_or_else(|| panic!("no {p} in {path:?}")),
            };
        }
        t
    }

    #[test]
    fn deployment_shape_has_kubernetes_list_types() {
        let t = compile(
            &GroupKind::new("apps", "Deployment"),
            apps::v1::Deployment::json_schema,
        );
        let containers = at(&t, &["spec", "template", "spec", "containers"]);
        match containers {
            Type::List {
                kind: ListKind::Map(keys),
                ..
            } => assert_eq!(keys[0].name, "name"),
            other => panic!("{other:?}"),
        }
        match at(
            &t,
            &["spec", "template", "spec", "containers", "[]", "ports"],
        ) {
            Type::List {
                kind: ListKind::Map(keys),
                ..
            } => {
                assert_eq!(keys.len(), 2);
                assert_eq!(keys[1].default, Some(Value::String("TCP".into())));
            }
            other => panic!("{other:?}"),
        }
        assert!(at(&t, &["spec", "selector"]).is_atomic(), "LabelSelector");
        assert!(at(&t, &["spec", "template", "spec", "nodeSelector"]).is_atomic());
        assert!(at(&t, &["spec", "template", "spec", "tolerations"]).is_atomic());
        assert!(!at(&t, &["metadata", "labels"]).is_atomic());
        assert!(!at(&t, &["metadata", "labels"]).declares("app"));
        assert!(at(&t, &["metadata"]).declares("labels"));
        assert!(matches!(
            at(&t, &["metadata", "finalizers"]),
            Type::List {
                kind: ListKind::Set,
                ..
            }
        ));
        assert_eq!(*at(&t, &["spec", "replicas"]), Type::Scalar);
        assert_eq!(
            *at(
                &t,
                &[
                    "spec",
                    "template",
                    "spec",
                    "containers",
                    "[]",
                    "resources",
                    "limits",
                    "cpu"
                ]
            ),
            Type::Scalar
        );
    }

    #[test]
    fn service_and_configmap_shapes() {
        let t = compile(
            &GroupKind::new("", "Service"),
            core::v1::Service::json_schema,
        );
        assert!(at(&t, &["spec", "selector"]).is_atomic());
        assert!(
            matches!(at(&t, &["spec", "ports"]), Type::List { kind: ListKind::Map(k), .. } if k[0].name == "port")
        );
        let t = compile(
            &GroupKind::new("", "ConfigMap"),
            core::v1::ConfigMap::json_schema,
        );
        assert!(!at(&t, &["data"]).is_atomic());
        assert!(!at(&t, &["data"]).declares("x"));
    }
}
