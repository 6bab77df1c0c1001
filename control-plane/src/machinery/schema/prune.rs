//! Pruning: fields the schema does not specify are dropped, as Kubernetes does for
//! structural schemas, except under `x-kubernetes-preserve-unknown-fields` (where declared
//! properties are still pruned inside) and `additionalProperties: true`. An embedded resource
//! (`x-kubernetes-embedded-resource`) keeps apiVersion and kind, and its metadata keeps
//! ObjectMeta's fields only.

use serde_json::Value;

use super::node::{Additional, Node};
use crate::machinery::validation::FieldPath;

/// ObjectMeta's JSON fields: what an embedded resource's metadata keeps.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Prune a whole object; its apiVersion, kind and metadata are the caller's.
pub(super) fn root(node: &Node, obj: &mut Value, pruned: &mut Vec<String>) {
    object(node, obj, &FieldPath::default(), true, pruned);
}

/// Prune `v` against `node`, recording the paths of dropped fields under `path`.
pub(super) fn value(node: &Node, v: &mut Value, path: &FieldPath, pruned: &mut Vec<String>) {
    match v {
        Value::Object(_) => object(node, v, path, false, pruned),
        Value::Array(items) => {
            if let Some(item_schema) = node.items.as_deref() {
                for (i, item) in items.iter_mut().enumerate() {
                    value(item_schema, item, &path.index(i), pruned);
                }
            }
        }
        _ => {}
    }
}

fn object(node: &Node, v: &mut Value, path: &FieldPath, is_root: bool, pruned: &mut Vec<String>) {
    let Value::Object(map) = v else {
        return;
    };
    let keeps_type_meta = is_root || node.embedded;
    map.retain(|name, child| {
        let child_path = path.child(name);
        if keeps_type_meta && (name == "apiVersion" || name == "kind") {
            return true;
        }
        if name == "metadata" && is_root {
            return true;
        }
        if name == "metadata" && node.embedded {
            embedded_metadata(child, &child_path, pruned);
            return true;
        }
        if let Some(p) = node.properties.get(name) {
            value(p, child, &child_path, pruned);
            return true;
        }
        match &node.additional {
            Some(Additional::Schema(s)) => {
                value(s, child, &child_path, pruned);
                true
            }
            Some(Additional::Any) => true,
            None if node.preserve_unknown => true,
            None => {
                pruned.push(child_path.to_string());
                false
            }
        }
    });
}

fn embedded_metadata(meta: &mut Value, path: &FieldPath, pruned: &mut Vec<String>) {
    if let Value::Object(map) = meta {
        map.retain(|name, _| {
            let known = OBJECT_META_FIELDS.contains(&name.as_str());
            if !known {
                pruned.push(path.child(name).to_string());
            }
            known
        });
    }
}
