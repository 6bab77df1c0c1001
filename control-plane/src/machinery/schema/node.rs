//! The compiled schema tree and Kubernetes' checks of a CRD schema (apiextensions'
//! structural-schema rules and the OpenAPI subset CRDs may use), done once per CRD version.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Number, Value};

use super::cel::{self, Rule};
use super::format::Format;
use super::validate;
use crate::machinery::status::FieldError;
use crate::machinery::validation::FieldPath;

/// The OpenAPI types a structural schema may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Type {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

impl Type {
    fn parse(s: &str) -> Option<Type> {
        Some(match s {
            "object" => Type::Object,
            "array" => Type::Array,
            "string" => Type::String,
            "integer" => Type::Integer,
            "number" => Type::Number,
            "boolean" => Type::Boolean,
            _ => return None,
        })
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Type::Object => "object",
            Type::Array => "array",
            Type::String => "string",
            Type::Integer => "integer",
            Type::Number => "number",
            Type::Boolean => "boolean",
        }
    }
}

/// `x-kubernetes-list-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListType {
    Atomic,
    Set,
    Map,
}

/// `additionalProperties`: a schema for every value, or `true` (anything). `false` is
/// the same as leaving it out: unknown fields are pruned.
#[derive(Debug)]
pub(super) enum Additional {
    Schema(Box<Node>),
    Any,
}

/// A compiled `pattern`; `source` is what error messages quote.
#[derive(Debug)]
pub(super) struct Pattern {
    pub source: String,
    pub re: Regex,
}

/// One schema node. Value validations (`Checks`) also appear under allOf/anyOf/oneOf/not,
/// where Kubernetes allows nothing structural (no types, defaults, descriptions).
#[derive(Debug, Default)]
pub(super) struct Node {
    pub ty: Option<Type>,
    pub nullable: bool,
    pub int_or_string: bool,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub properties: BTreeMap<String, Node>,
    pub additional: Option<Additional>,
    pub items: Option<Box<Node>>,
    pub default: Option<Value>,
    pub list_type: Option<ListType>,
    pub map_keys: Vec<String>,
    /// `x-kubernetes-map-type: atomic`: the object is replaced whole, so it can be an item
    /// of a set.
    pub map_atomic: bool,
    pub checks: Checks,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Default)]
pub(super) struct Checks {
    pub format: Option<Format>,
    pub enumeration: Vec<Value>,
    pub pattern: Option<Pattern>,
    pub maximum: Option<Number>,
    pub exclusive_maximum: bool,
    pub minimum: Option<Number>,
    pub exclusive_minimum: bool,
    pub multiple_of: Option<Number>,
    pub max_length: Option<u64>,
    pub min_length: Option<u64>,
    pub max_items: Option<u64>,
    pub min_items: Option<u64>,
    pub max_properties: Option<u64>,
    pub min_properties: Option<u64>,
    pub required: Vec<String>,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
}

/// Where a node sits, for the messages that differ (`type` must not be empty "at the root",
/// "for specified array items", "for specified object fields").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

/// What the compiler knows about the place of a node.
#[derive(Clone, Copy)]
struct Place {
    level: Level,
    /// Under allOf/anyOf/oneOf/not: value validations only.
    nested: bool,
    /// Reachable from the root through fields, map values and list-type=map items only, so
    /// an old value can be found for it: CEL transition rules (oldSelf) are allowed.
    correlatable: bool,
}

/// Compile a CRD version's `openAPIV3Schema` found at `path`.
pub(super) fn compile(schema: &Value, path: &FieldPath) -> Result<Node, Vec<FieldError>> {
    let mut errs = Vec::new();
    let place = Place {
        level: Level::Root,
        nested: false,
        correlatable: true,
    };
    let root = compile_node(schema, path, place, &mut errs);
    if errs.is_empty() {
        check_defaults(&root, path, true, &mut errs);
    }
    if errs.is_empty() {
        Ok(root)
    } else {
        Err(errs)
    }
}

fn compile_node(raw: &Value, path: &FieldPath, place: Place, errs: &mut Vec<FieldError>) -> Node {
    let Some(obj) = raw.as_object() else {
        errs.push(FieldError::invalid_unquoted(
            path,
            raw,
            "must be a JSON object (an OpenAPI schema)",
        ));
        return Node::default();
    };
    let mut node = Node::default();
    forbid_unsupported(obj, path, errs);

    // type
    match obj.get("type") {
        None => {}
        Some(Value::String(t)) => match Type::parse(t) {
            Some(ty) => node.ty = Some(ty),
            None if t.is_empty() => {}
            None => errs.push(FieldError::not_supported(path.child("type"), t, TYPES)),
        },
        Some(other) => errs.push(FieldError::invalid_unquoted(
            path.child("type"),
            other,
            "must be a string",
        )),
    }
    node.nullable = flag(obj, "nullable", path, errs);
    node.int_or_string = flag(obj, "x-kubernetes-int-or-string", path, errs);
    node.preserve_unknown = flag(obj, "x-kubernetes-preserve-unknown-fields", path, errs);
    node.embedded = flag(obj, "x-kubernetes-embedded-resource", path, errs);
    node.default = obj.get("default").cloned();

    // children
    if let Some(props) = obj.get("properties") {
        match props.as_object() {
            Some(props) => {
                for (name, sub) in props {
                    let sub_path = path.child("properties").key(name);
                    let sub_place = Place {
                        level: Level::Field,
                        ..place
                    };
                    node.properties
                        .insert(name.clone(), compile_node(sub, &sub_path, sub_place, errs));
                }
            }
            None => errs.push(FieldError::invalid_unquoted(
                path.child("properties"),
                props,
                "must be an object",
            )),
        }
    }
    match obj.get("additionalProperties") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => node.additional = Some(Additional::Any),
        Some(sub @ Value::Object(_)) => {
            let sub_place = Place {
                level: Level::Field,
                ..place
            };
            let sub = compile_node(sub, &path.child("additionalProperties"), sub_place, errs);
            node.additional = Some(Additional::Schema(Box::new(sub)));
        }
        Some(other) => errs.push(FieldError::invalid_unquoted(
            path.child("additionalProperties"),
            other,
            "must be a schema or a boolean",
        )),
    }
    match obj.get("items") {
        None => {}
        Some(Value::Array(_)) => errs.push(FieldError::forbidden(
            path.child("items"),
            "items must be a schema object and not an array",
        )),
        Some(sub) => {
            let list_type = list_type(obj, path, errs);
            node.list_type = list_type;
            let sub_place = Place {
                level: Level::Item,
                correlatable: place.correlatable && list_type == Some(ListType::Map),
                ..place
            };
            node.items = Some(Box::new(compile_node(
                sub,
                &path.child("items"),
                sub_place,
                errs,
            )));
        }
    }
    if node.items.is_none() {
        node.list_type = list_type(obj, path, errs);
    }
    node.map_keys = string_list(obj, "x-kubernetes-list-map-keys", path, errs);
    if let Some(v) = obj.get("x-kubernetes-map-type") {
        match v.as_str() {
            Some("atomic") => node.map_atomic = true,
            Some("granular") => {}
            Some(other) => errs.push(FieldError::not_supported(
                path.child("x-kubernetes-map-type"),
                other,
                &["atomic", "granular"],
            )),
            None => errs.push(FieldError::invalid_unquoted(
                path.child("x-kubernetes-map-type"),
                v,
                "must be a string",
            )),
        }
    }

    node.checks = compile_checks(obj, path, place, errs);
    if let Some(rules) = obj.get("x-kubernetes-validations") {
        if place.nested {
            errs.push(FieldError::forbidden(
                path.child("x-kubernetes-validations"),
                "must be empty to be structural",
            ));
        } else {
            node.rules = cel::compile_rules(
                rules,
                &path.child("x-kubernetes-validations"),
                &node,
                place.correlatable,
                errs,
            );
        }
    }

    if place.nested {
        check_nested(obj, &node, path, errs);
    } else {
        check_structural(&node, path, place.level, errs);
    }
    if !node.properties.is_empty() && obj.contains_key("additionalProperties") {
        errs.push(FieldError::forbidden(
            path.child("additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    check_list_type(&node, path, errs);
    node
}

/// The OpenAPI keywords a CRD schema may not use (apiextensions' validation of
/// JSONSchemaProps).
fn forbid_unsupported(obj: &Map<String, Value>, path: &FieldPath, errs: &mut Vec<FieldError>) {
    for (key, why) in [
        ("$ref", "$ref is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("additionalItems", "additionalItems is not supported"),
    ] {
        if obj.contains_key(key) {
            errs.push(FieldError::forbidden(path.child(key), why));
        }
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        errs.push(FieldError::forbidden(
            path.child("uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
}

fn flag(obj: &Map<String, Value>, key: &str, path: &FieldPath, errs: &mut Vec<FieldError>) -> bool {
    match obj.get(key) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            errs.push(FieldError::invalid_unquoted(
                path.child(key),
                other,
                "must be a boolean",
            ));
            false
        }
    }
}

fn unsigned(
    obj: &Map<String, Value>,
    key: &str,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> Option<u64> {
    let v = obj.get(key)?;
    match v.as_u64() {
        Some(n) => Some(n),
        None => {
            errs.push(FieldError::invalid_unquoted(
                path.child(key),
                v,
                "must be a non-negative integer",
            ));
            None
        }
    }
}

fn number(
    obj: &Map<String, Value>,
    key: &str,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> Option<Number> {
    match obj.get(key)? {
        Value::Number(n) => Some(n.clone()),
        other => {
            errs.push(FieldError::invalid_unquoted(
                path.child(key),
                other,
                "must be a number",
            ));
            None
        }
    }
}

fn string_list(
    obj: &Map<String, Value>,
    key: &str,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> Vec<String> {
    let Some(v) = obj.get(key) else {
        return vec![];
    };
    match v.as_array() {
        Some(items) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item.as_str() {
                Some(s) => Some(s.to_string()),
                None => {
                    errs.push(FieldError::invalid_unquoted(
                        path.child(key).index(i),
                        item,
                        "must be a string",
                    ));
                    None
                }
            })
            .collect(),
        None => {
            errs.push(FieldError::invalid_unquoted(
                path.child(key),
                v,
                "must be a list of strings",
            ));
            vec![]
        }
    }
}

fn list_type(
    obj: &Map<String, Value>,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) -> Option<ListType> {
    let v = obj.get("x-kubernetes-list-type")?;
    let p = path.child("x-kubernetes-list-type");
    match v.as_str() {
        Some("atomic") => Some(ListType::Atomic),
        Some("set") => Some(ListType::Set),
        Some("map") => Some(ListType::Map),
        Some(other) => {
            errs.push(FieldError::not_supported(
                p,
                other,
                &["atomic", "set", "map"],
            ));
            None
        }
        None => {
            errs.push(FieldError::invalid_unquoted(p, v, "must be a string"));
            None
        }
    }
}

fn compile_checks(
    obj: &Map<String, Value>,
    path: &FieldPath,
    place: Place,
    errs: &mut Vec<FieldError>,
) -> Checks {
    let mut c = Checks {
        maximum: number(obj, "maximum", path, errs),
        exclusive_maximum: flag(obj, "exclusiveMaximum", path, errs),
        minimum: number(obj, "minimum", path, errs),
        exclusive_minimum: flag(obj, "exclusiveMinimum", path, errs),
        multiple_of: number(obj, "multipleOf", path, errs),
        max_length: unsigned(obj, "maxLength", path, errs),
        min_length: unsigned(obj, "minLength", path, errs),
        max_items: unsigned(obj, "maxItems", path, errs),
        min_items: unsigned(obj, "minItems", path, errs),
        max_properties: unsigned(obj, "maxProperties", path, errs),
        min_properties: unsigned(obj, "minProperties", path, errs),
        required: string_list(obj, "required", path, errs),
        ..Checks::default()
    };
    if let Some(m) = &c.multiple_of {
        if m.as_f64().is_none_or(|m| m <= 0.0) {
            errs.push(FieldError::invalid_unquoted(
                path.child("multipleOf"),
                m,
                "must be greater than zero",
            ));
        }
    }
    if let Some(f) = obj.get("format") {
        match f.as_str() {
            // Formats Kubernetes does not know are accepted and not checked, as there.
            Some(name) => c.format = Format::parse(name),
            None => errs.push(FieldError::invalid_unquoted(
                path.child("format"),
                f,
                "must be a string",
            )),
        }
    }
    if let Some(e) = obj.get("enum") {
        match e.as_array() {
            Some(values) => c.enumeration = values.clone(),
            None => errs.push(FieldError::invalid_unquoted(
                path.child("enum"),
                e,
                "must be a list",
            )),
        }
    }
    if let Some(p) = obj.get("pattern") {
        match p.as_str() {
            Some(source) => match Regex::new(source) {
                Ok(re) => {
                    c.pattern = Some(Pattern {
                        source: source.to_string(),
                        re,
                    })
                }
                Err(e) => errs.push(FieldError::invalid(
                    path.child("pattern"),
                    source,
                    &format!("must be a valid regular expression, but isn't: {e}"),
                )),
            },
            None => errs.push(FieldError::invalid_unquoted(
                path.child("pattern"),
                p,
                "must be a string",
            )),
        }
    }
    let nested = Place {
        nested: true,
        ..place
    };
    for (key, out) in [
        ("allOf", &mut c.all_of),
        ("anyOf", &mut c.any_of),
        ("oneOf", &mut c.one_of),
    ] {
        let Some(v) = obj.get(key) else {
            continue;
        };
        match v.as_array() {
            Some(subs) => {
                for (i, sub) in subs.iter().enumerate() {
                    out.push(compile_node(sub, &path.child(key).index(i), nested, errs));
                }
            }
            None => errs.push(FieldError::invalid_unquoted(
                path.child(key),
                v,
                "must be a list of schemas",
            )),
        }
    }
    if let Some(sub) = obj.get("not") {
        c.not = Some(Box::new(compile_node(
            sub,
            &path.child("not"),
            nested,
            errs,
        )));
    }
    c
}

/// The structural rules of a node outside value validations (apiextensions'
/// `validateStructuralInvariants`).
fn check_structural(node: &Node, path: &FieldPath, level: Level, errs: &mut Vec<FieldError>) {
    if node.ty == Some(Type::Array) && node.items.is_none() {
        errs.push(FieldError::required_because(
            path.child("items"),
            "must be specified",
        ));
    }
    if node.embedded && node.ty != Some(Type::Object) {
        let why = "must be object if x-kubernetes-embedded-resource is true";
        match node.ty {
            None => errs.push(FieldError::required_because(path.child("type"), why)),
            Some(t) => errs.push(FieldError::invalid(path.child("type"), t.as_str(), why)),
        }
    } else if node.ty.is_none() && !node.int_or_string && !node.preserve_unknown {
        let why = match level {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required_because(path.child("type"), why));
    }
    if node.embedded && node.additional.is_some() {
        errs.push(FieldError::forbidden(
            path.child("additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if level == Level::Root {
        if let Some(t) = node.ty.filter(|t| *t != Type::Object) {
            errs.push(FieldError::invalid(
                path.child("type"),
                t.as_str(),
                "must be object at the root",
            ));
        }
        if node.additional.is_some() {
            errs.push(FieldError::forbidden(
                path.child("additionalProperties"),
                "must not be used at the root",
            ));
        }
        if node.default.is_some() {
            errs.push(FieldError::forbidden(
                path.child("default"),
                "must not be used at the root",
            ));
        }
    }
    if node.int_or_string && node.preserve_unknown {
        errs.push(FieldError::invalid_unquoted(
            path.child("x-kubernetes-preserve-unknown-fields"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if node.int_or_string && node.embedded {
        errs.push(FieldError::invalid_unquoted(
            path.child("x-kubernetes-embedded-resource"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if node.int_or_string && node.ty.is_some() {
        errs.push(FieldError::forbidden(
            path.child("type"),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    let check_meta = level == Level::Root || node.embedded;
    if check_meta {
        for (field, want) in [
            ("kind", Type::String),
            ("apiVersion", Type::String),
            ("metadata", Type::Object),
        ] {
            if let Some(p) = node.properties.get(field) {
                if p.ty != Some(want) {
                    errs.push(FieldError::invalid(
                        path.child("properties").key(field).child("type"),
                        p.ty.map_or("", Type::as_str),
                        &format!("must be {}", want.as_str()),
                    ));
                }
            }
        }
    }
    if level == Level::Root {
        if let Some(meta) = node.properties.get("metadata") {
            if !metadata_only_names(meta) {
                errs.push(FieldError::forbidden(
                    path.child("properties").key("metadata"),
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if node.embedded && !node.preserve_unknown && node.properties.is_empty() {
        errs.push(FieldError::required_because(
            path.child("properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// The root's `metadata` may only restrict `name` and `generateName` (string value
/// validations); nothing else of ObjectMeta is the CRD's to describe.
fn metadata_only_names(meta: &Node) -> bool {
    let only_strings = |n: &Node| {
        n.properties.is_empty()
            && n.items.is_none()
            && n.additional.is_none()
            && n.default.is_none()
            && !n.preserve_unknown
            && !n.embedded
            && !n.int_or_string
            && n.rules.is_empty()
    };
    meta.properties
        .iter()
        .all(|(k, n)| (k == "name" || k == "generateName") && only_strings(n))
        && meta.additional.is_none()
        && meta.items.is_none()
        && meta.default.is_none()
        && !meta.preserve_unknown
        && !meta.embedded
        && !meta.nullable
        && meta.rules.is_empty()
        && meta.checks.required.is_empty()
}

/// Under allOf/anyOf/oneOf/not only value validations are allowed (apiextensions'
/// `validateNestedValueValidation`), except the int-or-string pattern
/// `anyOf: [{type: integer}, {type: string}]`.
fn check_nested(
    obj: &Map<String, Value>,
    node: &Node,
    path: &FieldPath,
    errs: &mut Vec<FieldError>,
) {
    let int_or_string_branch =
        matches!(node.ty, Some(Type::Integer | Type::String)) && obj.len() == 1;
    if node.ty.is_some() && !int_or_string_branch {
        errs.push(FieldError::forbidden(
            path.child("type"),
            "must be empty to be structural",
        ));
    }
    for (key, set, why) in [
        (
            "additionalProperties",
            obj.contains_key("additionalProperties"),
            "must be undefined to be structural",
        ),
        (
            "default",
            node.default.is_some(),
            "must be undefined to be structural",
        ),
        (
            "title",
            obj.contains_key("title"),
            "must be empty to be structural",
        ),
        (
            "description",
            obj.contains_key("description"),
            "must be empty to be structural",
        ),
        ("nullable", node.nullable, "must be false to be structural"),
        (
            "x-kubernetes-preserve-unknown-fields",
            node.preserve_unknown,
            "must be false to be structural",
        ),
        (
            "x-kubernetes-embedded-resource",
            node.embedded,
            "must be false to be structural",
        ),
        (
            "x-kubernetes-int-or-string",
            node.int_or_string,
            "must be false to be structural",
        ),
        (
            "x-kubernetes-list-map-keys",
            !node.map_keys.is_empty(),
            "must be empty to be structural",
        ),
        (
            "x-kubernetes-list-type",
            node.list_type.is_some(),
            "must be undefined to be structural",
        ),
    ] {
        if set {
            errs.push(FieldError::forbidden(path.child(key), why));
        }
    }
    if node.properties.contains_key("metadata") {
        errs.push(FieldError::forbidden(
            path.child("properties").key("metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// `x-kubernetes-list-type` and `x-kubernetes-list-map-keys` (apiextensions'
/// `validateListSetsAndMaps`).
fn check_list_type(node: &Node, path: &FieldPath, errs: &mut Vec<FieldError>) {
    let lt_path = path.child("x-kubernetes-list-type");
    let keys_path = path.child("x-kubernetes-list-map-keys");
    if node.list_type.is_some() && node.ty != Some(Type::Array) {
        errs.push(FieldError::invalid(
            lt_path.clone(),
            list_type_name(node.list_type),
            "must only be used if type is array",
        ));
        return;
    }
    if !node.map_keys.is_empty() && node.list_type != Some(ListType::Map) {
        errs.push(FieldError::forbidden(
            keys_path.clone(),
            "must not be set if x-kubernetes-list-type is not map",
        ));
    }
    let Some(items) = node.items.as_deref() else {
        return;
    };
    match node.list_type {
        Some(ListType::Set) => {
            let why = "must be atomic as item of a list with x-kubernetes-list-type=set";
            if items.ty == Some(Type::Object) && !items.map_atomic {
                errs.push(FieldError::invalid(
                    path.child("items").child("x-kubernetes-map-type"),
                    "granular",
                    why,
                ));
            }
            if items.ty == Some(Type::Array) && items.list_type != Some(ListType::Atomic) {
                errs.push(FieldError::invalid(
                    path.child("items").child("x-kubernetes-list-type"),
                    list_type_name(items.list_type),
                    why,
                ));
            }
        }
        Some(ListType::Map) => {
            if node.map_keys.is_empty() {
                errs.push(FieldError::required_because(
                    keys_path,
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            if items.ty != Some(Type::Object) {
                errs.push(FieldError::invalid(
                    path.child("items").child("type"),
                    items.ty.map_or("", Type::as_str),
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
                return;
            }
            for (i, key) in node.map_keys.iter().enumerate() {
                let kp = path.child("x-kubernetes-list-map-keys").index(i);
                match items.properties.get(key) {
                    None => errs.push(FieldError::invalid(
                        kp,
                        key,
                        "entries must all be names of item properties",
                    )),
                    Some(k) => {
                        if !matches!(
                            k.ty,
                            Some(Type::String | Type::Integer | Type::Number | Type::Boolean)
                        ) && !k.int_or_string
                        {
                            errs.push(FieldError::invalid(
                                path.child("items").child("properties").key(key).child("type"),
                                k.ty.map_or("", Type::as_str),
                                "must be a scalar type if parent array's x-kubernetes-list-type is map",
                            ));
                        }
                        if k.default.is_none() && !items.checks.required.contains(key) {
                            errs.push(FieldError::required_because(
                                path.child("items").child("required"),
                                &format!("all map keys must be required or have a default value: {key:?} is neither"),
                            ));
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

fn list_type_name(t: Option<ListType>) -> &'static str {
    match t {
        Some(ListType::Atomic) => "atomic",
        Some(ListType::Set) => "set",
        Some(ListType::Map) => "map",
        None => "",
    }
}

/// Every `default` must validate against its own schema and survive pruning (apiextensions
/// checks both when the CRD is written, so a default can never make an object invalid).
fn check_defaults(node: &Node, path: &FieldPath, root: bool, errs: &mut Vec<FieldError>) {
    if let Some(default) = &node.default {
        let at = path.child("default");
        let mut pruned = default.clone();
        let mut unknown = Vec::new();
        super::prune::value(node, &mut pruned, &FieldPath::default(), &mut unknown);
        if !unknown.is_empty() {
            errs.push(FieldError::invalid_unquoted(
                at.clone(),
                default,
                &format!("must not have unknown fields: {}", unknown.join(", ")),
            ));
        }
        errs.extend(validate::default_value(node, default, &at));
    }
    for (name, p) in &node.properties {
        // The root's metadata is ObjectMeta: its defaults are the caller's.
        if root && name == "metadata" {
            continue;
        }
        check_defaults(p, &path.child("properties").key(name), false, errs);
    }
    if let Some(Additional::Schema(s)) = &node.additional {
        check_defaults(s, &path.child("additionalProperties"), false, errs);
    }
    if let Some(items) = &node.items {
        check_defaults(items, &path.child("items"), false, errs);
    }
}
