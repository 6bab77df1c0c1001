//! Validation of a custom object against its schema, with Kubernetes' paths and messages:
//! the OpenAPI value validations as kube-openapi words them (`spec.replicas in body must be
//! of type integer: "string"`), mapped to field errors as apiextensions maps them (Required,
//! NotSupported for enum, TooLong, TooMany, TypeInvalid, Invalid), list-type uniqueness
//! (Duplicate) and the CEL rules.

use serde_json::{Map, Number, Value};

use super::cel::Budget;
use super::node::{Additional, ListType, Node, Type};
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::validation::FieldPath;

/// Validate a whole object. The root's apiVersion, kind and metadata are ObjectMeta's (the
/// caller validates them), except that a schema may restrict metadata.name/generateName.
pub(super) fn root(node: &Node, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut v = Validator {
        errs: Vec::new(),
        report_under: None,
        budget: Budget::default(),
        run_rules: true,
    };
    v.node(node, obj, old, &FieldPath::default(), true);
    v.errs
}

/// Validate a schema's `default` against the schema it sits in; errors are reported under
/// `at` (`...properties[x].default`), as apiextensions does when the CRD is written.
pub(super) fn default_value(node: &Node, value: &Value, at: &FieldPath) -> Vec<FieldError> {
    let mut v = Validator {
        errs: Vec::new(),
        report_under: Some(at.clone()),
        budget: Budget::default(),
        run_rules: true,
    };
    v.node(node, value, None, &FieldPath::default(), false);
    v.errs
}

/// Whether `value` satisfies `node` (for anyOf/oneOf/not): no errors, rules not run.
fn matches(node: &Node, value: &Value, path: &FieldPath) -> bool {
    let mut v = Validator {
        errs: Vec::new(),
        report_under: None,
        budget: Budget::default(),
        run_rules: false,
    };
    v.node(node, value, None, path, false);
    v.errs.is_empty()
}

pub(super) struct Validator {
    pub errs: Vec<FieldError>,
    /// Where errors go when the value is not an object's (a default in a schema).
    report_under: Option<FieldPath>,
    pub budget: Budget,
    run_rules: bool,
}

impl Validator {
    /// The field an error at data path `path` is reported under.
    pub(super) fn field(&self, path: &FieldPath) -> String {
        match &self.report_under {
            None => path.to_string(),
            Some(at) if path.as_str().is_empty() => at.to_string(),
            Some(at) => format!("{at}.{path}"),
        }
    }

    fn push(&mut self, kind: CauseType, path: &FieldPath, message: String) {
        let field = self.field(path);
        self.errs.push(FieldError::new(kind, field, message));
    }

    /// kube-openapi's errors, turned into `Invalid value: <v>: <path> in body <what>`.
    fn invalid(&mut self, path: &FieldPath, value: &str, what: &str) {
        let message = format!("Invalid value: {value}: {} {what}", in_body(path));
        self.push(CauseType::Invalid, path, message);
    }

    fn node(
        &mut self,
        node: &Node,
        value: &Value,
        old: Option<&Value>,
        path: &FieldPath,
        is_root: bool,
    ) {
        if value.is_null() {
            if node.nullable || (node.ty.is_none() && !node.int_or_string) {
                return;
            }
            let want = node.ty.map_or("integer,string", Type::as_str);
            let message = format!(
                "Invalid value: \"null\": {} must be of type {want}: \"null\"",
                in_body(path)
            );
            self.push(CauseType::TypeInvalid, path, message);
            return;
        }
        if !self.type_ok(node, value, path) {
            return;
        }
        self.checks(node, value, path);
        match value {
            Value::Object(map) => {
                self.object(node, map, old.and_then(Value::as_object), path, is_root)
            }
            Value::Array(items) => self.array(node, items, old.and_then(Value::as_array), path),
            _ => {}
        }
        if self.run_rules && !node.rules.is_empty() {
            super::cel::run(node, value, old, path, self, is_root);
        }
    }

    /// The `type` check; false (and one error) on a mismatch, which skips the value's other
    /// checks as kube-openapi does.
    fn type_ok(&mut self, node: &Node, value: &Value, path: &FieldPath) -> bool {
        let ok = match node.ty {
            None if node.int_or_string => is_integer(value) || value.is_string(),
            None => true,
            Some(Type::Object) => value.is_object(),
            Some(Type::Array) => value.is_array(),
            Some(Type::String) => value.is_string(),
            Some(Type::Boolean) => value.is_boolean(),
            Some(Type::Number) => value.is_number(),
            Some(Type::Integer) => is_integer(value),
        };
        if !ok {
            let want = node.ty.map_or("integer,string", Type::as_str);
            let actual = json_type(value);
            let message = format!(
                "Invalid value: \"{actual}\": {} must be of type {want}: \"{actual}\"",
                in_body(path)
            );
            self.push(CauseType::TypeInvalid, path, message);
        }
        ok
    }

    /// The value validations of a node (also those of allOf/anyOf/oneOf/not branches).
    fn checks(&mut self, node: &Node, value: &Value, path: &FieldPath) {
        let c = &node.checks;
        if !c.enumeration.is_empty() && !c.enumeration.iter().any(|e| json_eq(e, value)) {
            let supported: Vec<String> = c
                .enumeration
                .iter()
                .map(|e| match e {
                    Value::String(s) => go_quote(s),
                    other => go_quote(&other.to_string()),
                })
                .collect();
            let message = format!(
                "Unsupported value: {}: supported values: {}",
                go_value(value),
                supported.join(", ")
            );
            self.push(CauseType::NotSupported, path, message);
        }
        match value {
            Value::String(s) => self.string(node, s, path),
            Value::Number(n) => self.number(node, n, path),
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(max) = c.max_items.filter(|m| n > *m) {
                    self.push(CauseType::TooMany, path, too_many(n, max));
                }
                if let Some(min) = c.min_items.filter(|m| n < *m) {
                    self.invalid(
                        path,
                        &n.to_string(),
                        &format!("should have at least {min} items"),
                    );
                }
            }
            Value::Object(map) => {
                let n = map.len() as u64;
                if let Some(max) = c.max_properties.filter(|m| n > *m) {
                    self.push(CauseType::TooMany, path, too_many(n, max));
                }
                if let Some(min) = c.min_properties.filter(|m| n < *m) {
                    self.invalid(
                        path,
                        &n.to_string(),
                        &format!("should have at least {min} properties"),
                    );
                }
                for name in &c.required {
                    if !map.contains_key(name) {
                        self.push(
                            CauseType::Required,
                            &path.child(name),
                            "Required value".into(),
                        );
                    }
                }
            }
            _ => {}
        }
        self.junctors(node, value, path);
    }

    fn string(&mut self, node: &Node, s: &str, path: &FieldPath) {
        let c = &node.checks;
        // Lengths are in characters (runes), as kube-openapi counts them.
        let chars = s.chars().count() as u64;
        if let Some(max) = c.max_length.filter(|m| chars > *m) {
            let unit = if max == 1 { "byte" } else { "bytes" };
            self.push(
                CauseType::TooLong,
                path,
                format!("Too long: may not be more than {max} {unit}"),
            );
        }
        if let Some(min) = c.min_length.filter(|m| chars < *m) {
            self.invalid(
                path,
                &go_quote(s),
                &format!("should be at least {min} chars long"),
            );
        }
        if let Some(p) = c.pattern.as_ref().filter(|p| !p.re.is_match(s)) {
            let what = format!("should match '{}'", p.source);
            self.invalid(path, &go_quote(s), &what);
        }
        if let Some(f) = c.format.filter(|f| !f.accepts(s)) {
            let message = format!(
                "Invalid value: {}: {} must be of type {}: {}",
                go_quote(s),
                in_body(path),
                f.name(),
                go_quote(s)
            );
            self.push(CauseType::TypeInvalid, path, message);
        }
    }

    fn number(&mut self, node: &Node, n: &Number, path: &FieldPath) {
        let c = &node.checks;
        let Some(x) = n.as_f64() else {
            return;
        };
        let shown = n.to_string();
        if let Some(max) = c.maximum.as_ref().and_then(Number::as_f64) {
            if c.exclusive_maximum && x >= max {
                self.invalid(
                    path,
                    &shown,
                    &format!("should be less than {}", go_float(max)),
                );
            } else if x > max {
                self.invalid(
                    path,
                    &shown,
                    &format!("should be less than or equal to {}", go_float(max)),
                );
            }
        }
        if let Some(min) = c.minimum.as_ref().and_then(Number::as_f64) {
            if c.exclusive_minimum && x <= min {
                self.invalid(
                    path,
                    &shown,
                    &format!("should be greater than {}", go_float(min)),
                );
            } else if x < min {
                self.invalid(
                    path,
                    &shown,
                    &format!("should be greater than or equal to {}", go_float(min)),
                );
            }
        }
        if let Some(m) = c.multiple_of.as_ref().and_then(Number::as_f64) {
            let ok = match (n.as_i64(), c.multiple_of.as_ref().and_then(Number::as_i64)) {
                (Some(a), Some(b)) if b != 0 => a % b == 0,
                _ => {
                    let q = x / m;
                    (q - q.round()).abs() < 1e-9
                }
            };
            if !ok {
                self.invalid(
                    path,
                    &shown,
                    &format!("should be a multiple of {}", go_float(m)),
                );
            }
        }
    }

    /// allOf/anyOf/oneOf/not: value validations only (no types, no rules), as Kubernetes
    /// allows in structural schemas.
    fn junctors(&mut self, node: &Node, value: &Value, path: &FieldPath) {
        let c = &node.checks;
        if !c.all_of.is_empty() {
            let before = self.errs.len();
            for sub in &c.all_of {
                self.sub(sub, value, path);
            }
            if self.errs.len() > before {
                self.invalid(path, "\"\"", "must validate all the schemas (allOf)");
            }
        }
        if !c.any_of.is_empty() && !c.any_of.iter().any(|s| matches(s, value, path)) {
            self.invalid(path, "\"\"", "must validate at least one schema (anyOf)");
        }
        if !c.one_of.is_empty() && c.one_of.iter().filter(|s| matches(s, value, path)).count() != 1
        {
            self.invalid(
                path,
                "\"\"",
                "must validate one and only one schema (oneOf)",
            );
        }
        if let Some(not) = &c.not {
            if matches(not, value, path) {
                self.invalid(path, "\"\"", "must not validate the schema (not)");
            }
        }
    }

    /// A branch of allOf: its checks, and those of the properties and items it names.
    fn sub(&mut self, node: &Node, value: &Value, path: &FieldPath) {
        if node.ty.is_some() && !self.type_ok(node, value, path) {
            return;
        }
        self.checks(node, value, path);
        match value {
            Value::Object(map) => {
                for (name, p) in &node.properties {
                    if let Some(v) = map.get(name).filter(|v| !v.is_null()) {
                        self.sub(p, v, &path.child(name));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(it) = &node.items {
                    for (i, v) in items.iter().enumerate() {
                        self.sub(it, v, &path.index(i));
                    }
                }
            }
            _ => {}
        }
    }

    fn object(
        &mut self,
        node: &Node,
        map: &Map<String, Value>,
        old: Option<&Map<String, Value>>,
        path: &FieldPath,
        is_root: bool,
    ) {
        if node.embedded {
            self.embedded_type_meta(map, path);
        }
        for (name, v) in map {
            let child = path.child(name);
            let old_v = old.and_then(|o| o.get(name));
            if is_root && name == "metadata" {
                self.metadata(node.properties.get(name), v, &child);
                continue;
            }
            if (is_root || node.embedded)
                && (name == "apiVersion" || name == "kind")
                && !node.properties.contains_key(name)
            {
                continue;
            }
            if let Some(p) = node.properties.get(name) {
                self.node(p, v, old_v, &child, false);
            } else if let Some(Additional::Schema(s)) = &node.additional {
                self.node(s, v, old_v, &child, false);
            }
        }
    }

    /// An embedded resource names its kind: apiVersion and kind are required non-empty
    /// strings (apiextensions' `validateEmbeddedResource`).
    fn embedded_type_meta(&mut self, map: &Map<String, Value>, path: &FieldPath) {
        for field in ["apiVersion", "kind"] {
            let at = path.child(field);
            match map.get(field) {
                None => {
                    let f = self.field(&at);
                    self.errs
                        .push(FieldError::required_because(f, "must not be empty"));
                }
                Some(Value::String(s)) if s.is_empty() => {
                    let f = self.field(&at);
                    self.errs
                        .push(FieldError::invalid(f, "", "must not be empty"));
                }
                Some(Value::String(_)) => {}
                Some(other) => {
                    let f = self.field(&at);
                    self.errs
                        .push(FieldError::invalid_unquoted(f, other, "must be a string"));
                }
            }
        }
    }

    /// The root's metadata: only name and generateName may be restricted by the schema.
    fn metadata(&mut self, schema: Option<&Node>, meta: &Value, path: &FieldPath) {
        let (Some(schema), Some(meta)) = (schema, meta.as_object()) else {
            return;
        };
        for field in ["name", "generateName"] {
            if let (Some(p), Some(v)) = (schema.properties.get(field), meta.get(field)) {
                self.node(p, v, None, &path.child(field), false);
            }
        }
    }

    fn array(&mut self, node: &Node, items: &[Value], old: Option<&Vec<Value>>, path: &FieldPath) {
        let Some(item_schema) = node.items.as_deref() else {
            return;
        };
        for (i, v) in items.iter().enumerate() {
            // Only list-type=map items correlate with an old item (by their keys).
            let old_v = match (node.list_type, old) {
                (Some(ListType::Map), Some(old)) => old
                    .iter()
                    .find(|o| same_keys(&node.map_keys, item_schema, o, v)),
                _ => None,
            };
            self.node(item_schema, v, old_v, &path.index(i), false);
        }
        match node.list_type {
            Some(ListType::Set) => {
                for (i, v) in items.iter().enumerate() {
                    if items[..i].iter().any(|u| json_eq(u, v)) {
                        let message = format!("Duplicate value: {}", go_value(v));
                        self.push(CauseType::Duplicate, &path.index(i), message);
                    }
                }
            }
            Some(ListType::Map) => {
                for (i, v) in items.iter().enumerate() {
                    if items[..i]
                        .iter()
                        .any(|u| same_keys(&node.map_keys, item_schema, u, v))
                    {
                        let message = format!(
                            "Duplicate value: {}",
                            go_key_map(&node.map_keys, item_schema, v)
                        );
                        self.push(CauseType::Duplicate, &path.index(i), message);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Two items of a list-type=map list have the same key fields (a missing key field takes its
/// default, as the item would after defaulting).
fn same_keys(keys: &[String], items: &Node, a: &Value, b: &Value) -> bool {
    keys.iter().all(|k| {
        let default = items.properties.get(k).and_then(|p| p.default.as_ref());
        match (a.get(k).or(default), b.get(k).or(default)) {
            (Some(x), Some(y)) => json_eq(x, y),
            (None, None) => true,
            _ => false,
        }
    })
}

/// The key fields of a map-list item as Go prints a `map[string]interface{}`.
fn go_key_map(keys: &[String], items: &Node, v: &Value) -> String {
    let mut fields: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            let value = v
                .get(k)
                .or_else(|| items.properties.get(k).and_then(|p| p.default.as_ref()))?;
            Some(format!("{}:{}", go_quote(k), go_value(value)))
        })
        .collect();
    fields.sort();
    format!("map[string]interface {{}}{{{}}}", fields.join(", "))
}

/// `<path> in body`, or `in body` for a value at the root (a schema's default).
fn in_body(path: &FieldPath) -> String {
    if path.as_str().is_empty() {
        "in body".into()
    } else {
        format!("{path} in body")
    }
}

fn too_many(actual: u64, max: u64) -> String {
    let unit = if max == 1 { "item" } else { "items" };
    format!("Too many: {actual}: must have at most {max} {unit}")
}

/// An integer in JSON: a number without a fraction (`2` or `2.0`), as Go decodes it.
pub(super) fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64()
                || n.is_u64()
                || n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        _ => false,
    }
}

/// kube-openapi's name for a JSON value's type.
pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Number(_) if is_integer(v) => "integer",
        Value::Number(_) => "number",
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
pub(super) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// A string as Go's `%q` prints it (JSON escaping is the same for the characters that
/// matter here).
pub(super) fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// A bad value as apimachinery's field errors print it: strings quoted, numbers and booleans
/// bare, anything else as JSON.
pub(super) fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => go_quote(s),
        Value::Null => "\"null\"".into(),
        other => other.to_string(),
    }
}

/// A float64 as Go's `%v` prints it: `10`, not `10.0`.
fn go_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i128)
    } else {
        format!("{f}")
    }
}
