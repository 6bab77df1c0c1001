//! CEL validation rules (`x-kubernetes-validations`) through the `cel` crate (cel-rust): each
//! rule (and its messageExpression) is parsed once when the schema is compiled; a rule that
//! does not parse, or names a variable other than `self` and `oldSelf`, is a schema error
//! there. At validation `self` is the node's value (integers as int, numbers as double,
//! strings, lists, maps), and a transition rule (one that uses `oldSelf`) runs only on an
//! update where the old object has a value at the same place, unless `optionalOldSelf` makes
//! `oldSelf` an optional.
//!
//! Cost: Kubernetes estimates each rule's cost from the schema's maxItems/maxLength and
//! meters evaluation. The `cel` crate meters nothing, so skiff bounds it by size: a rule's
//! cost is the number of JSON nodes under `self` (and `oldSelf`), raised to the power of its
//! comprehension nesting (`all`/`exists`/`map`/`filter` inside one another); a rule over
//! 1,000,000 is refused ("call cost exceeds limit"), and one object's rules together get
//! 10,000,000 (Kubernetes' per-call limit and per-object budget).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::common::types::CelOptional;
use cel::common::value::Val;
use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Program, Value as CelValue};
use serde_json::Value;

use super::node::{Additional, Node, Type};
use super::validate::Validator;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::validation::FieldPath;

/// Kubernetes' limit on one rule's evaluation (`PerCallLimit`).
const PER_CALL_LIMIT: u64 = 1_000_000;
/// Kubernetes' budget for all the rules of one object (`RuntimeCELCostBudget`).
const PER_OBJECT_BUDGET: u64 = 10_000_000;

/// Names a rule may use besides `self`, `oldSelf` and its own comprehension variables:
/// namespaces and type names of the standard library.
const BUILTIN_NAMES: &[&str] = &[
    "optional",
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
    "timestamp",
    "duration",
    "math",
    "strings",
    "base64",
];

/// The environment every rule compiles and runs in: the standard library with optionals,
/// plus the strings, lists and math extensions (Kubernetes' CEL libraries include these).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Each extension registers distinct names on a fresh environment: failing here is a bug.
    env.add_extension(cel::extensions::strings)
        .expect("strings extension registers");
    env.add_extension(cel::extensions::lists)
        .expect("lists extension registers");
    env.add_extension(cel::extensions::math)
        .expect("math extension registers");
    Arc::new(env)
});

/// `reason` of a rule: the cause type its failure is reported with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Invalid,
    Forbidden,
    Required,
    Duplicate,
}

/// A compiled `x-kubernetes-validations` entry.
pub(super) struct Rule {
    source: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
    reason: Reason,
    /// `fieldPath` as field-path segments below the node.
    field_path: Vec<Segment>,
    /// Uses `oldSelf`.
    transition: bool,
    optional_old_self: bool,
    /// Comprehension nesting depth, for the cost bound.
    depth: u32,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule").field("rule", &self.source).finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Field(String),
    Key(String),
}

/// The cost left for one object's rules.
pub(super) struct Budget {
    remaining: u64,
    exhausted: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            remaining: PER_OBJECT_BUDGET,
            exhausted: false,
        }
    }
}

/// Compile a node's `x-kubernetes-validations` (found at `path`).
pub(super) fn compile_rules(
    raw: &Value,
    path: &FieldPath,
    node: &Node,
    correlatable: bool,
    errs: &mut Vec<FieldError>,
) -> Vec<Rule> {
    let Some(list) = raw.as_array() else {
        errs.push(FieldError::invalid_unquoted(
            path,
            raw,
            "must be a list of rules",
        ));
        return vec![];
    };
    let mut rules = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        if let Some(rule) = compile_rule(entry, &path.index(i), node, correlatable, errs) {
            rules.push(rule);
        }
    }
    rules
}

fn compile_rule(
    entry: &Value,
    path: &FieldPath,
    node: &Node,
    correlatable: bool,
    errs: &mut Vec<FieldError>,
) -> Option<Rule> {
    let before = errs.len();
    let text = |key: &str, errs: &mut Vec<FieldError>| match entry.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            errs.push(FieldError::invalid_unquoted(
                path.child(key),
                other,
                "must be a string",
            ));
            None
        }
    };
    let source = text("rule", errs).unwrap_or_default();
    if source.trim().is_empty() {
        errs.push(FieldError::required(path.child("rule")));
        return None;
    }
    let message = text("message", errs);
    if let Some(m) = &message {
        if m.trim().is_empty() {
            errs.push(FieldError::invalid(
                path.child("message"),
                m,
                "message must be non-empty if specified",
            ));
        } else if m.contains('\n') {
            errs.push(FieldError::invalid(
                path.child("message"),
                m,
                "message must not contain line breaks",
            ));
        }
    }
    let reason = match text("reason", errs).as_deref() {
        None | Some("FieldValueInvalid") => Reason::Invalid,
        Some("FieldValueForbidden") => Reason::Forbidden,
        Some("FieldValueRequired") => Reason::Required,
        Some("FieldValueDuplicate") => Reason::Duplicate,
        Some(other) => {
            errs.push(FieldError::not_supported(
                path.child("reason"),
                other,
                &[
                    "FieldValueRequired",
                    "FieldValueDuplicate",
                    "FieldValueInvalid",
                    "FieldValueForbidden",
                ],
            ));
            Reason::Invalid
        }
    };
    let field_path = match text("fieldPath", errs) {
        None => vec![],
        Some(fp) => match parse_field_path(&fp).filter(|segs| field_path_exists(node, segs)) {
            Some(segs) => segs,
            None => {
                errs.push(FieldError::invalid(
                    path.child("fieldPath"),
                    &fp,
                    "fieldPath must be a valid path",
                ));
                vec![]
            }
        },
    };
    let optional_old_self = match entry.get("optionalOldSelf") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            errs.push(FieldError::invalid_unquoted(
                path.child("optionalOldSelf"),
                other,
                "must be a boolean",
            ));
            false
        }
    };

    let program = compile_expr(&source, &path.child("rule"), errs);
    let message_expression = text("messageExpression", errs)
        .and_then(|src| {
            compile_expr(&src, &path.child("messageExpression"), errs).map(|p| (p, src))
        })
        .map(|(p, src)| {
            if uses(&p, "oldSelf") && !correlatable {
                errs.push(FieldError::invalid(
                    path.child("messageExpression"),
                    &src,
                    "oldSelf cannot be used on the uncorrelatable portion of the schema",
                ));
            }
            p
        });
    let program = program?;
    let transition = uses(&program, "oldSelf");
    if transition && !correlatable {
        errs.push(FieldError::invalid(
            path.child("rule"),
            &source,
            "oldSelf cannot be used on the uncorrelatable portion of the schema",
        ));
    }
    if optional_old_self && !transition {
        errs.push(FieldError::invalid_unquoted(
            path.child("optionalOldSelf"),
            true,
            "may not be set if the rule does not reference oldSelf",
        ));
    }
    if node.ty.is_none() && !node.int_or_string && !node.preserve_unknown {
        // A rule needs a typed self; check_structural reports the missing type.
        return None;
    }
    if errs.len() > before {
        return None;
    }
    let depth = nesting(program.expression());
    Some(Rule {
        source,
        program,
        message,
        message_expression,
        reason,
        field_path,
        transition,
        optional_old_self,
        depth,
    })
}

fn compile_expr(source: &str, path: &FieldPath, errs: &mut Vec<FieldError>) -> Option<Program> {
    match ENV.compile(source) {
        Err(e) => {
            errs.push(FieldError::invalid(
                path,
                source,
                &format!("compilation failed: {e}"),
            ));
            None
        }
        Ok(program) => {
            let mut free = BTreeSet::new();
            free_names(program.expression(), &mut Vec::new(), &mut free);
            let unknown: Vec<&String> = free
                .iter()
                .filter(|n| *n != "self" && *n != "oldSelf" && !BUILTIN_NAMES.contains(&n.as_str()))
                .collect();
            if let Some(name) = unknown.first() {
                errs.push(FieldError::invalid(
                    path,
                    source,
                    &format!("compilation failed: undeclared reference to '{name}'"),
                ));
                return None;
            }
            Some(program)
        }
    }
}

fn uses(program: &Program, name: &str) -> bool {
    let mut free = BTreeSet::new();
    free_names(program.expression(), &mut Vec::new(), &mut free);
    free.contains(name)
}

/// The identifiers an expression uses that no comprehension inside it binds.
fn free_names(e: &IdedExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>) {
    match &e.expr {
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(name) {
                out.insert(name.clone());
            }
        }
        Expr::Call(call) => {
            if let Some(t) = &call.target {
                free_names(t, bound, out);
            }
            call.args.iter().for_each(|a| free_names(a, bound, out));
        }
        Expr::Comprehension(c) => {
            free_names(&c.iter_range, bound, out);
            free_names(&c.accu_init, bound, out);
            let n = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                free_names(part, bound, out);
            }
            bound.truncate(n);
        }
        Expr::List(l) => l.elements.iter().for_each(|x| free_names(x, bound, out)),
        Expr::Map(m) => m
            .entries
            .iter()
            .for_each(|x| entry_names(&x.expr, bound, out)),
        Expr::Struct(s) => s
            .entries
            .iter()
            .for_each(|x| entry_names(&x.expr, bound, out)),
        Expr::Select(s) => free_names(&s.operand, bound, out),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn entry_names(e: &EntryExpr, bound: &mut Vec<String>, out: &mut BTreeSet<String>) {
    match e {
        EntryExpr::StructField(f) => free_names(&f.value, bound, out),
        EntryExpr::MapEntry(m) => {
            free_names(&m.key, bound, out);
            free_names(&m.value, bound, out);
        }
    }
}

/// How deeply comprehensions nest in an expression (0 for none).
fn nesting(e: &IdedExpr) -> u32 {
    match &e.expr {
        Expr::Comprehension(c) => {
            let inner = deepest([&c.loop_cond, &c.loop_step, &c.result].into_iter());
            let outer = deepest([&c.iter_range, &c.accu_init].into_iter());
            outer.max(inner + 1)
        }
        Expr::Call(call) => deepest(call.target.as_deref().into_iter().chain(call.args.iter())),
        Expr::List(l) => deepest(l.elements.iter()),
        Expr::Map(m) => deepest(m.entries.iter().flat_map(|x| entry_exprs(&x.expr))),
        Expr::Struct(s) => deepest(s.entries.iter().flat_map(|x| entry_exprs(&x.expr))),
        Expr::Select(s) => nesting(&s.operand),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    }
}

fn deepest<'a>(exprs: impl Iterator<Item = &'a IdedExpr>) -> u32 {
    exprs.map(nesting).max().unwrap_or(0)
}

fn entry_exprs(e: &EntryExpr) -> Vec<&IdedExpr> {
    match e {
        EntryExpr::StructField(f) => vec![&f.value],
        EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
    }
}

/// `fieldPath`: a JSONPath-like path below the node, `.a.b` or `.a['b.c']` (no list
/// indexes, as in Kubernetes).
fn parse_field_path(s: &str) -> Option<Vec<Segment>> {
    let mut segs = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']")?;
            segs.push(Segment::Key(r[..end].to_string()));
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return None;
            }
            segs.push(Segment::Field(name.to_string()));
            rest = &r[end..];
        } else {
            return None;
        }
    }
    (!segs.is_empty()).then_some(segs)
}

fn field_path_exists(node: &Node, segs: &[Segment]) -> bool {
    let mut at = node;
    for seg in segs {
        let name = match seg {
            Segment::Field(n) | Segment::Key(n) => n,
        };
        at = match (at.properties.get(name), &at.additional) {
            (Some(p), _) => p,
            (None, Some(Additional::Schema(s))) => s,
            _ => return false,
        };
    }
    true
}

/// Run a node's rules on `value` (with `old`, its correlated old value on update).
pub(super) fn run(
    node: &Node,
    value: &Value,
    old: Option<&Value>,
    path: &FieldPath,
    v: &mut Validator,
    is_root: bool,
) {
    if v.budget.exhausted {
        return;
    }
    let ty = node.ty.map_or("", Type::as_str);
    let mut size = 0u64;
    let self_val = to_cel(value, Some(node), is_root, &mut size);
    let old_val = old.map(|o| to_cel(o, Some(node), is_root, &mut size));
    for rule in &node.rules {
        if rule.transition && old_val.is_none() && !rule.optional_old_self {
            continue;
        }
        let cost = size.max(1).saturating_pow(rule.depth.max(1));
        if cost > PER_CALL_LIMIT {
            let why = format!("call cost exceeds limit for rule: {}", rule.source.trim());
            let field = v.field(path);
            v.errs.push(FieldError::invalid(field, ty, &why));
            continue;
        }
        if cost > v.budget.remaining {
            v.budget.exhausted = true;
            let field = v.field(path);
            v.errs.push(FieldError::invalid(
                field,
                ty,
                "validation failed due to running out of cost budget, no further validation rules will be run",
            ));
            return;
        }
        v.budget.remaining -= cost;

        let mut ctx = Context::with_env(Arc::clone(&ENV));
        ctx.add_variable_from_value("self", self_val.clone());
        if rule.transition {
            match (&old_val, rule.optional_old_self) {
                (Some(o), false) => ctx.add_variable_from_value("oldSelf", o.clone()),
                (o, true) => {
                    let inner: Option<Box<dyn Val>> = o.clone().and_then(|o| o.try_into().ok());
                    ctx.add_variable_as_val("oldSelf", Box::new(CelOptional::from(inner)));
                }
                (None, false) => continue,
            }
        }
        let at = rule
            .field_path
            .iter()
            .fold(path.clone(), |p, seg| match seg {
                Segment::Field(n) => p.child(n),
                Segment::Key(k) => p.child(k),
            });
        let field = v.field(&at);
        match rule.program.execute(&ctx) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let message = rule
                    .message_expression
                    .as_ref()
                    .and_then(|m| match m.execute(&ctx) {
                        Ok(CelValue::String(s)) if !s.trim().is_empty() => Some(s.to_string()),
                        _ => None,
                    })
                    .or_else(|| rule.message.clone())
                    .unwrap_or_else(|| format!("failed rule: {}", rule.source.trim()));
                v.errs.push(failure(rule.reason, field, ty, &message));
            }
            Ok(other) => {
                let why = format!(
                    "{}: rule did not evaluate to a bool: {other:?}",
                    rule.source.trim()
                );
                v.errs.push(FieldError::invalid(field, ty, &why));
            }
            Err(e) => {
                let why = format!("{}: {e}", rule.source.trim());
                v.errs.push(FieldError::invalid(field, ty, &why));
            }
        }
    }
}

/// A failed rule as apiextensions reports it: `Invalid value: "object": <message>`, or the
/// rule's `reason` (Forbidden and Required keep the message; Duplicate, as there, has none).
fn failure(reason: Reason, field: String, ty: &str, message: &str) -> FieldError {
    match reason {
        Reason::Invalid => FieldError::invalid(field, ty, message),
        Reason::Forbidden => FieldError::forbidden(field, message),
        Reason::Required => FieldError::required_because(field, message),
        Reason::Duplicate => FieldError::new(
            CauseType::Duplicate,
            field,
            format!("Duplicate value: \"{ty}\""),
        ),
    }
}

/// A JSON value as CEL sees it under `node`: integers as int, `number`s as double (also
/// when written without a fraction), objects as maps. `size` counts the nodes converted.
/// At the root only metadata.name and generateName are visible, as in Kubernetes.
fn to_cel(v: &Value, node: Option<&Node>, is_root: bool, size: &mut u64) -> CelValue {
    *size += 1;
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Number(n) => {
            let as_double = node.is_some_and(|n| n.ty == Some(Type::Number));
            match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) if !as_double => CelValue::Int(i),
                (None, Some(u), _) if !as_double => CelValue::UInt(u),
                (_, _, Some(f))
                    if !as_double
                        && node.is_some_and(|n| n.ty == Some(Type::Integer))
                        && f.fract() == 0.0 =>
                {
                    CelValue::Int(f as i64)
                }
                (_, _, Some(f)) => CelValue::Float(f),
                _ => CelValue::Null,
            }
        }
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            CelValue::List(Arc::new(
                items
                    .iter()
                    .map(|x| to_cel(x, item_node, false, size))
                    .collect(),
            ))
        }
        Value::Object(map) => {
            let mut out: HashMap<Key, CelValue> = HashMap::with_capacity(map.len());
            for (k, x) in map {
                let child = node.and_then(|n| match (n.properties.get(k), &n.additional) {
                    (Some(p), _) => Some(p),
                    (None, Some(Additional::Schema(s))) => Some(&**s),
                    _ => None,
                });
                let converted = if is_root && k == "metadata" {
                    root_metadata(x, size)
                } else {
                    to_cel(x, child, false, size)
                };
                out.insert(Key::String(Arc::new(k.clone())), converted);
            }
            CelValue::Map(CelMap { map: Arc::new(out) })
        }
    }
}

fn root_metadata(meta: &Value, size: &mut u64) -> CelValue {
    let mut out: HashMap<Key, CelValue> = HashMap::new();
    for field in ["name", "generateName"] {
        if let Some(Value::String(s)) = meta.get(field) {
            *size += 1;
            out.insert(
                Key::String(Arc::new(field.to_string())),
                CelValue::String(Arc::new(s.clone())),
            );
        }
    }
    CelValue::Map(CelMap { map: Arc::new(out) })
}
