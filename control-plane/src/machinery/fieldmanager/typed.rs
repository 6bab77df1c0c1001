//! Objects walked along their shape: the fields an object sets, what changed between two
//! versions, the merge of an applied configuration into a live object, and the removal of a
//! set of fields. structured-merge-diff's semantics, written over serde_json values.

use serde_json::{Map, Value};

use super::path::PathElement;
use super::schema::{ListKind, Type, UNTYPED};
use super::set::Set;

/// What a list item is called in a field path.
pub fn item_element(kind: &ListKind, item: &Value, index: usize) -> Result<PathElement, String> {
    match kind {
        ListKind::Map(keys) => {
            let Value::Object(m) = item else {
                return Err(format!(
                    "associative list with keys has an element that is not a map: {item}"
                ));
            };
            let mut fields = Vec::with_capacity(keys.len());
            for k in keys {
                match m.get(&k.name).filter(|v| !v.is_null()).or(k.default.as_ref()) {
                    Some(v) => fields.push((k.name.clone(), v.clone())),
                    None => {
                        return Err(format!(
                            "associative list with keys has an element that omits key field {:?} (and doesn't have default value)",
                            k.name
                        ))
                    }
                }
            }
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(PathElement::Key(fields))
        }
        ListKind::Set => Ok(PathElement::Value(item.clone())),
        ListKind::Atomic => Ok(PathElement::Index(index)),
    }
}

/// A list's items with their path elements, in order.
fn indexed<'v>(
    kind: &ListKind,
    items: &'v [Value],
) -> Result<Vec<(PathElement, &'v Value)>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| item_element(kind, v, i).map(|pe| (pe, v)))
        .collect()
}

fn empty_or_null(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Whether this pair of values is compared as one leaf: atomic types, scalars, values of the
/// wrong shape, and empty/null on both sides (which keeps `{}` distinct from absent).
fn is_leaf(t: &Type, l: Option<&Value>, r: Option<&Value>) -> bool {
    let shaped = |v: Option<&Value>| {
        matches!(
            (t, v),
            (_, None | Some(Value::Null))
                | (Type::Map { .. }, Some(Value::Object(_)))
                | (Type::List { .. }, Some(Value::Array(_)))
        )
    };
    t.is_atomic() || !shaped(l) || !shaped(r) || (empty_or_null(l) && empty_or_null(r))
}

/// The fields an object sets (structured-merge-diff's ToFieldSet): every leaf, every list
/// item, every map entry; struct fields only when they are leaves, null or empty.
pub fn field_set(v: &Value, t: &Type) -> Result<Set, String> {
    let mut out = Set::new();
    to_set(v, t, &mut Vec::new(), &mut out)?;
    Ok(out)
}

fn to_set(v: &Value, t: &Type, path: &mut Vec<PathElement>, out: &mut Set) -> Result<(), String> {
    match (t, v) {
        (Type::Scalar, _) => out.insert(path),
        (Type::Map { atomic: true, .. }, _)
        | (
            Type::List {
                kind: ListKind::Atomic,
                ..
            },
            _,
        ) => out.insert(path),
        (Type::Map { .. }, Value::Object(m)) => {
            for (k, child) in m {
                path.push(PathElement::Field(k.clone()));
                to_set(child, t.child(k).unwrap_or(&UNTYPED), path, out)?;
                let empty = matches!(child, Value::Object(c) if c.is_empty());
                if child.is_null() || empty || !t.declares(k) {
                    out.insert(path);
                }
                path.pop();
            }
        }
        (Type::List { elem, kind }, Value::Array(items)) => {
            for (pe, item) in indexed(kind, items)? {
                path.push(pe);
                to_set(item, elem, path, out)?;
                out.insert(path);
                path.pop();
            }
        }
        // Null or a value of the wrong shape: nothing below it is set.
        _ => {}
    }
    Ok(())
}

/// What changed from `old` to `new`.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

impl Comparison {
    pub fn changed(&self) -> Set {
        self.modified.union(&self.added)
    }
}

/// Compares two versions of an object field by field.
pub fn compare(old: &Value, new: &Value, t: &Type) -> Result<Comparison, String> {
    let mut c = Comparison::default();
    cmp(Some(old), Some(new), t, &mut Vec::new(), &mut c)?;
    Ok(c)
}

fn cmp(
    l: Option<&Value>,
    r: Option<&Value>,
    t: &Type,
    path: &mut Vec<PathElement>,
    c: &mut Comparison,
) -> Result<(), String> {
    if is_leaf(t, l, r) {
        match (l, r) {
            (None, Some(_)) => c.added.insert(path),
            (Some(_), None) => c.removed.insert(path),
            (Some(a), Some(b)) if a != b => c.modified.insert(path),
            _ => {}
        }
        return Ok(());
    }
    match t {
        Type::Map { .. } => {
            let lm = l.and_then(Value::as_object);
            let rm = r.and_then(Value::as_object);
            let mut keys: Vec<&String> = lm.into_iter().flat_map(|m| m.keys()).collect();
            keys.extend(
                rm.into_iter()
                    .flat_map(|m| m.keys())
                    .filter(|k| !lm.is_some_and(|m| m.contains_key(*k))),
            );
            for k in keys {
                path.push(PathElement::Field(k.clone()));
                cmp(
                    lm.and_then(|m| m.get(k)),
                    rm.and_then(|m| m.get(k)),
                    t.child(k).unwrap_or(&UNTYPED),
                    path,
                    c,
                )?;
                path.pop();
            }
        }
        Type::List { elem, kind } => {
            let empty = Vec::new();
            let li = indexed(kind, l.and_then(Value::as_array).unwrap_or(&empty))?;
            let ri = indexed(kind, r.and_then(Value::as_array).unwrap_or(&empty))?;
            let find = |items: &[(PathElement, &Value)], pe: &PathElement| -> Option<usize> {
                items.iter().position(|(p, _)| p == pe)
            };
            for (pe, lv) in &li {
                path.push(pe.clone());
                let rv = find(&ri, pe).map(|i| ri[i].1);
                cmp(Some(lv), rv, elem, path, c)?;
                path.pop();
            }
            for (pe, rv) in &ri {
                if find(&li, pe).is_none() {
                    path.push(pe.clone());
                    cmp(None, Some(rv), elem, path, c)?;
                    path.pop();
                }
            }
        }
        Type::Scalar => {}
    }
    match (l, r) {
        (None, Some(_)) => c.added.insert(path),
        (Some(_), None) => c.removed.insert(path),
        _ => {}
    }
    Ok(())
}

/// Merges an applied configuration into the live object: the configuration's values win,
/// structs and maps merge field by field, lists by their kind (associative lists item by
/// item on their keys, sets by value, atomic lists replaced), keeping the live order of
/// items the configuration does not name.
pub fn merge(live: &Value, config: &Value, t: &Type) -> Result<Value, String> {
    Ok(merge_values(Some(live), Some(config), t)?.unwrap_or(Value::Null))
}

fn merge_values(l: Option<&Value>, r: Option<&Value>, t: &Type) -> Result<Option<Value>, String> {
    if is_leaf(t, l, r) {
        return Ok(r.or(l).cloned());
    }
    match t {
        Type::Map { .. } => {
            let lm = l.and_then(Value::as_object);
            let rm = r.and_then(Value::as_object);
            let mut out = Map::new();
            for (k, lv) in lm.into_iter().flatten() {
                let child = t.child(k).unwrap_or(&UNTYPED);
                if let Some(v) = merge_values(Some(lv), rm.and_then(|m| m.get(k)), child)? {
                    out.insert(k.clone(), v);
                }
            }
            for (k, rv) in rm.into_iter().flatten() {
                if !out.contains_key(k) {
                    let child = t.child(k).unwrap_or(&UNTYPED);
                    if let Some(v) = merge_values(None, Some(rv), child)? {
                        out.insert(k.clone(), v);
                    }
                }
            }
            Ok(Some(Value::Object(out)))
        }
        Type::List { elem, kind } => {
            let empty = Vec::new();
            let li = indexed(kind, l.and_then(Value::as_array).unwrap_or(&empty))?;
            let ri = indexed(kind, r.and_then(Value::as_array).unwrap_or(&empty))?;
            let mut seen = std::collections::BTreeSet::new();
            for (i, (pe, _)) in ri.iter().enumerate() {
                if ri[..i].iter().any(|(p, _)| p == pe) {
                    return Err(format!("duplicate entries for key {pe:?}"));
                }
            }
            let in_r = |pe: &PathElement| ri.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
            let in_l = |pe: &PathElement| li.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
            let mut out = Vec::with_capacity(li.len().max(ri.len()));
            // Live items the configuration does not name stay where they are; the named ones
            // come in the configuration's order, at the place of the first of them.
            let mut r_iter = ri.iter();
            for (pe, lv) in &li {
                if in_r(pe).is_none() {
                    if let Some(v) = merge_values(Some(lv), None, elem)? {
                        out.push(v);
                    }
                    continue;
                }
                // A shared item: emit configuration items up to and including it.
                if seen.contains(pe) {
                    continue;
                }
                for (rpe, rv) in r_iter.by_ref() {
                    seen.insert(rpe.clone());
                    if let Some(v) = merge_values(in_l(rpe), Some(rv), elem)? {
                        out.push(v);
                    }
                    if rpe == pe {
                        break;
                    }
                }
            }
            for (rpe, rv) in r_iter {
                if let Some(v) = merge_values(in_l(rpe), Some(rv), elem)? {
                    out.push(v);
                }
            }
            Ok(Some(Value::Array(out)))
        }
        Type::Scalar => Ok(r.or(l).cloned()),
    }
}

/// Removes the members of `set` (and what is below them) from `v`. A map or list left empty
/// by the removal goes too.
pub fn remove(v: &mut Value, set: &Set, t: &Type) -> Result<(), String> {
    if set.is_empty() || t.is_atomic() {
        return Ok(());
    }
    match (t, v) {
        (Type::Map { .. }, Value::Object(m)) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let pe = PathElement::Field(k.clone());
                if set.is_member(&pe) {
                    m.remove(&k);
                } else if let Some(sub) = set.children(&pe) {
                    let child = m.get_mut(&k).expect("key listed above");
                    let was_empty = empty_or_null(Some(child));
                    remove(child, sub, t.child(&k).unwrap_or(&UNTYPED))?;
                    if !was_empty && empty_or_null(Some(child)) {
                        m.remove(&k);
                    }
                }
            }
        }
        (Type::List { elem, kind }, Value::Array(items)) => {
            let mut kept = Vec::with_capacity(items.len());
            for (i, mut item) in std::mem::take(items).into_iter().enumerate() {
                let pe = item_element(kind, &item, i)?;
                if set.is_member(&pe) {
                    continue;
                }
                if let Some(sub) = set.children(&pe) {
                    remove(&mut item, sub, elem)?;
                }
                kept.push(item);
            }
            *items = kept;
        }
        _ => {}
    }
    Ok(())
}

/// The set with every declared struct field on its paths made a member too (so removing a
/// set's fields also removes the structs it alone populated).
pub fn with_named_fields(set: &Set, t: &Type) -> Set {
    Set::from_entries(set.entries().map(|(pe, member, children)| {
        let child_t = match (pe, t) {
            (PathElement::Field(f), Type::Map { .. }) => t.child(f).unwrap_or(&UNTYPED),
            (_, Type::List { elem, .. }) => elem,
            _ => &UNTYPED,
        };
        let named = matches!(pe, PathElement::Field(f) if t.declares(f)) && !children.is_empty();
        (
            pe.clone(),
            member || named,
            with_named_fields(children, child_t),
        )
    }))
}

/// Drops what Kubernetes' Go types never keep: empty maps and empty lists in optional fields
/// (`omitempty`), and nulls. A write of `annotations: {}` then stores nothing, as Kubernetes
/// does, so an unchanged object stays unchanged.
pub fn drop_empty(v: &mut Value, t: &Type) {
    match (t, v) {
        (Type::Map { .. }, Value::Object(m)) => {
            m.retain(|k, child| {
                let ct = t.child(k).unwrap_or(&UNTYPED);
                drop_empty(child, ct);
                let empty = match child {
                    Value::Null => true,
                    Value::Object(o) => o.is_empty() && ct.is_free_map(),
                    Value::Array(a) => a.is_empty() && matches!(ct, Type::List { .. }),
                    _ => false,
                };
                !(empty && t.declares(k) && !t.requires(k))
            });
        }
        (Type::List { elem, .. }, Value::Array(items)) => {
            for item in items {
                drop_empty(item, elem);
            }
        }
        _ => {}
    }
}
