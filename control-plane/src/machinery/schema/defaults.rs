//! Defaulting as Kubernetes does it for structural schemas: a missing field with a
//! `default` gets a copy of it (then the defaults inside that copy apply too); a `null` in a
//! field that is not `nullable` is replaced by the default or, without one, dropped (so
//! validation does not fail on a null the client meant as "unset").

use serde_json::{Map, Value};

use super::node::{Additional, Node};

/// Default a whole object (the root's metadata is ObjectMeta, not the schema's to default).
pub(super) fn apply(node: &Node, obj: &mut Value) {
    if let Value::Object(map) = obj {
        fields(node, map, true);
    }
}

fn value(node: &Node, v: &mut Value) {
    match v {
        Value::Object(map) => fields(node, map, false),
        Value::Array(items) => {
            if let Some(item_schema) = node.items.as_deref() {
                for item in items.iter_mut() {
                    if item.is_null() && !item_schema.nullable {
                        if let Some(d) = &item_schema.default {
                            *item = d.clone();
                        }
                    }
                    value(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

fn fields(node: &Node, map: &mut Map<String, Value>, is_root: bool) {
    for (name, p) in &node.properties {
        if is_root && name == "metadata" {
            continue;
        }
        match map.get_mut(name) {
            None => {
                if let Some(d) = &p.default {
                    map.insert(name.clone(), d.clone());
                }
            }
            Some(v) if v.is_null() && !p.nullable => match &p.default {
                Some(d) => *v = d.clone(),
                None => {
                    map.remove(name);
                }
            },
            Some(_) => {}
        }
        if let Some(v) = map.get_mut(name) {
            value(p, v);
        }
    }
    if let Some(Additional::Schema(s)) = &node.additional {
        let known = |k: &str| node.properties.contains_key(k);
        let mut drop = Vec::new();
        for (k, v) in map.iter_mut().filter(|(k, _)| !known(k)) {
            if v.is_null() && !s.nullable {
                match &s.default {
                    Some(d) => *v = d.clone(),
                    None => {
                        drop.push(k.clone());
                        continue;
                    }
                }
            }
            value(s, v);
        }
        for k in drop {
            map.remove(&k);
        }
    }
}
