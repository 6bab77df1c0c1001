//! Strategic merge patch on JSON values, driven by a kind's `Schema`: merge lists by key,
//! scalar sets, null deletes, and the directives kubectl sends (`$patch: replace|delete|merge`,
//! `$retainKeys`, `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`), with
//! Kubernetes' ordering rules (the order in `$setElementOrder`, then the patch, then the live
//! object).

use serde_json::{Map, Value};

use super::strategy::{FieldStrategy, Schema};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Why a strategic merge patch cannot apply: a malformed patch (400) or one that does not
/// fit the object (422).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmpError {
    BadRequest(String),
    Invalid(String),
}

type Result<T> = std::result::Result<T, SmpError>;

fn bad(msg: impl Into<String>) -> SmpError {
    SmpError::BadRequest(msg.into())
}

fn invalid(msg: impl Into<String>) -> SmpError {
    SmpError::Invalid(msg.into())
}

/// Applies `patch` to `original` (both JSON objects) following `schema`.
pub fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: &Schema,
) -> Result<Map<String, Value>> {
    if let Some(directive) = patch.remove(DIRECTIVE) {
        match directive.as_str() {
            // Replace: the patch (with its own directives resolved) is the whole new value.
            Some("replace") => return merge_map(Map::new(), patch, schema),
            Some("delete") => return Ok(Map::new()),
            Some("merge") => {}
            _ => {
                return Err(bad(format!(
                    "Unknown patch type: {directive} in map: {}",
                    Value::Object(patch)
                )))
            }
        }
    }

    if let Some(retain) = patch.remove(RETAIN_KEYS) {
        let keys: Vec<&str> = retain
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("invalid patch format of retainKeys: must be a list of strings"))?;
        for (k, v) in &patch {
            if !v.is_null() && !k.starts_with('$') && !keys.contains(&k.as_str()) {
                return Err(bad(format!(
                    "invalid patch format of retainKeys: field {k:?} is in the patch but not in $retainKeys"
                )));
            }
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }

    // Lists with an explicit order are merged first, then reordered.
    let ordered: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for directive_key in ordered {
        let order = match patch.remove(&directive_key) {
            Some(Value::Array(order)) => order,
            _ => {
                return Err(bad(
                    "invalid patch format of setElementOrder list: must be a list",
                ))
            }
        };
        let field = &directive_key[SET_ELEMENT_ORDER.len()..];
        if field.is_empty() {
            return Err(bad(
                "invalid patch format of setElementOrder list: no field name",
            ));
        }
        let strategy = schema.field(field);
        let key = merge_key(strategy);
        let original_list = match original.remove(field) {
            Some(Value::Array(list)) => Some(list),
            Some(other) => {
                return Err(invalid(format!(
                    "{field}: setElementOrder applies to a list, found {other}"
                )))
            }
            None => None,
        };
        let patch_list = match patch.remove(field) {
            Some(Value::Array(list)) => Some(list),
            Some(other) => {
                return Err(bad(format!(
                    "{field}: setElementOrder applies to a list, found {other}"
                )))
            }
            None => None,
        };
        if let Some(p) = &patch_list {
            check_order_consistent(p, &order, key)?;
        }
        let server_order = original_list.clone().unwrap_or_default();
        let merged = match (original_list, patch_list) {
            (Some(o), None) => o,
            (o, Some(p)) => merge_list(o.unwrap_or_default(), p, strategy)?,
            (None, None) => continue,
        };
        let (in_order, server_only): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|v| index_of(&order, v, key).is_some());
        original.insert(
            field.to_string(),
            Value::Array(interleave(
                in_order,
                server_only,
                &order,
                &server_order,
                key,
            )),
        );
    }

    let mut deletions = vec![];
    for (k, patch_value) in patch {
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            match patch_value {
                Value::Array(values) if !field.is_empty() => deletions.push((field.to_string(), values)),
                _ => return Err(bad("invalid patch format of deleteFromPrimitiveList list: must be a list under $deleteFromPrimitiveList/<field>")),
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(bad(format!("unknown patch directive {k:?}")));
        }
        if patch_value.is_null() {
            original.remove(&k);
            continue;
        }
        let strategy = schema.field(&k);
        let merged = match (original.remove(&k), patch_value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                Value::Object(merge_map(o, p, schema.object(&k))?)
            }
            (Some(Value::Array(o)), Value::Array(p)) => Value::Array(merge_list(o, p, strategy)?),
            // Absent or of another type: the patch value, with its own directives resolved.
            (_, Value::Object(p)) => Value::Object(merge_map(Map::new(), p, schema.object(&k))?),
            (_, Value::Array(p)) => Value::Array(merge_list(vec![], p, strategy)?),
            (_, scalar) => scalar,
        };
        original.insert(k, merged);
    }

    for (field, values) in deletions {
        if let Some(Value::Array(list)) = original.get_mut(&field) {
            if let Some(item) = values
                .iter()
                .chain(list.iter())
                .find(|v| v.is_object() || v.is_array())
            {
                return Err(invalid(format!(
                    "$deleteFromPrimitiveList/{field} applies to lists of scalars, found {item}"
                )));
            }
            list.retain(|v| !values.contains(v));
        }
    }
    Ok(original)
}

fn merge_key(strategy: Option<&FieldStrategy>) -> Option<&'static str> {
    match strategy {
        Some(FieldStrategy::MergeByKey { key, .. }) => Some(key),
        _ => None,
    }
}

/// Merges two lists by the field's strategy: by key, as a set, or (default) replaced.
fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    strategy: Option<&FieldStrategy>,
) -> Result<Vec<Value>> {
    match strategy {
        Some(FieldStrategy::MergeByKey { key, item }) => merge_keyed(original, patch, key, item),
        Some(FieldStrategy::MergeSet) => merge_set(original, patch),
        // Atomic: the patch's list, items kept as sent (they carry no directives of ours).
        _ => Ok(patch),
    }
}

fn merge_keyed(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
    item: &Schema,
) -> Result<Vec<Value>> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    for v in original.iter().chain(patch.iter()) {
        if !v.is_object() {
            return Err(invalid(format!(
                "merging a list by {key:?}: item {v} is not an object"
            )));
        }
    }
    // Special elements first: `$patch: delete` removes by key, `$patch: replace` drops the
    // live list altogether.
    let mut items = vec![];
    let mut replace = false;
    for p in patch {
        let directive = p.get(DIRECTIVE).cloned();
        match directive.as_ref().map(|d| d.as_str()) {
            None => items.push(p),
            Some(Some("delete")) => {
                let k = p.get(key).ok_or_else(|| {
                    invalid(format!(
                        "map: {p} does not contain declared merge key: {key}"
                    ))
                })?;
                original.retain(|o| o.get(key) != Some(k));
            }
            Some(Some("replace")) => replace = true,
            Some(Some("merge")) => {
                return Err(bad("merging lists cannot yet be specified in the patch"))
            }
            _ => {
                return Err(bad(format!(
                    "Unknown patch type: {} in map: {p}",
                    directive.unwrap_or(Value::Null)
                )))
            }
        }
    }
    if replace {
        return items
            .into_iter()
            .map(|p| {
                into_object(p)
                    .and_then(|p| merge_map(Map::new(), p, item))
                    .map(Value::Object)
            })
            .collect();
    }
    let server_order = original.clone();
    let mut merged = original;
    for p in &items {
        let k = p.get(key).ok_or_else(|| {
            invalid(format!(
                "map: {p} does not contain declared merge key: {key}"
            ))
        })?;
        let p_map = into_object(p.clone())?;
        match merged.iter().position(|o| o.get(key) == Some(k)) {
            Some(i) => {
                let o = into_object(std::mem::take(&mut merged[i]))?;
                merged[i] = Value::Object(merge_map(o, p_map, item)?);
            }
            None => merged.push(Value::Object(merge_map(Map::new(), p_map, item)?)),
        }
    }
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| index_of(&items, v, Some(key)).is_some());
    Ok(interleave(
        in_patch,
        server_only,
        &items,
        &server_order,
        Some(key),
    ))
}

fn merge_set(original: Vec<Value>, patch: Vec<Value>) -> Result<Vec<Value>> {
    if let Some(v) = original
        .iter()
        .chain(patch.iter())
        .find(|v| v.is_object() || v.is_array())
    {
        return Err(invalid(format!(
            "merging a list of scalars: item {v} is not a scalar"
        )));
    }
    let server_order = original.clone();
    let mut merged: Vec<Value> = vec![];
    for v in original.into_iter().chain(patch.iter().cloned()) {
        if !merged.contains(&v) {
            merged.push(v);
        }
    }
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| patch.contains(v));
    Ok(interleave(
        in_patch,
        server_only,
        &patch,
        &server_order,
        None,
    ))
}

fn into_object(v: Value) -> Result<Map<String, Value>> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(invalid(format!("{other} is not an object"))),
    }
}

/// Where `v` sits in `list`, comparing merge keys (or whole scalars without a key).
fn index_of(list: &[Value], v: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        Some(key) => {
            let k = v.get(key)?;
            list.iter().position(|o| o.get(key) == Some(k))
        }
        None => list.iter().position(|o| o == v),
    }
}

/// Kubernetes' `normalizeElementOrder`: patch items in the patch's order, server-only items in
/// the live order, then interleaved so each keeps its relative order and, where both are known
/// to the live list, the live order decides.
fn interleave(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    patch_items.sort_by_key(|v| index_of(patch_order, v, key).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| index_of(server_order, v, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (index_of(server_order, l, key), index_of(server_order, r, key)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// Kubernetes' `validatePatchWithSetOrderList`: the patch list's items (deletions aside) must
/// appear in the `$setElementOrder` list, in the same relative order.
fn check_order_consistent(patch: &[Value], order: &[Value], key: Option<&str>) -> Result<()> {
    let wanted: Vec<&Value> = patch
        .iter()
        .filter(|p| p.get(DIRECTIVE).is_none())
        .collect();
    let mut next = 0;
    for o in order {
        if next < wanted.len() && same_item(wanted[next], o, key)? {
            next += 1;
        }
    }
    if next < wanted.len() {
        return Err(bad(format!(
            "The order in patch list:\n{}\n doesn't match $setElementOrder list:\n{}",
            Value::Array(patch.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

fn same_item(a: &Value, b: &Value, key: Option<&str>) -> Result<bool> {
    match key {
        None => Ok(a == b),
        Some(key) => match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => Ok(x == y),
            _ => Err(invalid(format!(
                "map: {a} or {b} does not contain declared merge key: {key}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::strategy::schema_for;
    use super::*;
    use crate::machinery::GroupKind;
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec, Toleration,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::DeepMerge;
    use proptest::prelude::*;
    use serde_json::json;

    fn smp(kind: (&str, &str), original: Value, patch: Value) -> Result<Value> {
        let schema = schema_for(&GroupKind::new(kind.0, kind.1)).unwrap();
        let (Value::Object(o), Value::Object(p)) = (original, patch) else {
            panic!("objects expected")
        };
        merge_map(o, p, schema).map(Value::Object)
    }

    fn deploy(original: Value, patch: Value) -> Value {
        smp(("apps", "Deployment"), original, patch).unwrap()
    }

    fn live() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web", "old": "x"}, "finalizers": ["a", "b"]},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "name": "web", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
                            "ports": [{"containerPort": 80, "protocol": "TCP"}],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
                        }],
                        "tolerations": [{"key": "k", "operator": "Exists"}]
                    }
                }
            }
        })
    }

    fn containers(v: &Value) -> &Vec<Value> {
        v["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
    }

    #[test]
    fn kubectl_apply_image_change() {
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"image":"nginx:1.28","name":"web"}]}}}}),
        );
        let c = &containers(&out)[0];
        assert_eq!(c["image"], "nginx:1.28");
        assert_eq!(
            c["imagePullPolicy"], "IfNotPresent",
            "fields absent from the patch stay"
        );
        assert_eq!(c["ports"][0]["containerPort"], 80);
        assert_eq!(containers(&out).len(), 1);
    }

    #[test]
    fn kubectl_apply_replicas_and_annotation() {
        let out = deploy(
            live(),
            json!({"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}\n"}},"spec":{"replicas":5}}),
        );
        assert_eq!(out["spec"]["replicas"], 5);
        assert_eq!(out["metadata"]["labels"]["app"], "web");
        assert_eq!(
            out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "{}\n"
        );
    }

    #[test]
    fn delete_list_item_by_key_and_keep_order() {
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"}],"containers":[{"$setElementOrder/env":[{"name":"A"}],"env":[{"$patch":"delete","name":"B"}],"name":"web"}]}}}}),
        );
        assert_eq!(
            containers(&out)[0]["env"],
            json!([{"name": "A", "value": "1"}])
        );
    }

    #[test]
    fn add_container_in_set_order() {
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"sidecar"},{"name":"web"}],"containers":[{"image":"busybox","name":"sidecar"}]}}}}),
        );
        let names: Vec<&str> = containers(&out)
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["sidecar", "web"]);
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"containers":[{"image":"busybox","name":"sidecar"}]}}}}),
        );
        let names: Vec<&str> = containers(&out)
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        // Without an order, Kubernetes' normalizeElementOrder puts items new to the live list first.
        assert_eq!(names, ["sidecar", "web"]);
    }

    #[test]
    fn reorder_only() {
        let mut l = live();
        l["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "b", "image": "b"}));
        let out = deploy(
            l,
            json!({"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"b"},{"name":"web"}]}}}}),
        );
        let names: Vec<&str> = containers(&out)
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b", "web"]);
    }

    #[test]
    fn null_deletes_and_primitive_lists() {
        let out = deploy(
            live(),
            json!({"metadata":{"labels":{"old":null},"$deleteFromPrimitiveList/finalizers":["a"],"$setElementOrder/finalizers":["b","c"],"finalizers":["c"]}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c"]));
    }

    #[test]
    fn retain_keys_switches_strategy() {
        let out = deploy(
            live(),
            json!({"spec":{"strategy":{"$retainKeys":["type"],"rollingUpdate":null,"type":"Recreate"}}}),
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
        let err = smp(
            ("apps", "Deployment"),
            live(),
            json!({"spec":{"strategy":{"$retainKeys":["type"],"rollingUpdate":{"maxSurge":1}}}}),
        )
        .unwrap_err();
        assert!(matches!(err, SmpError::BadRequest(_)));
    }

    #[test]
    fn replace_directives() {
        let out = deploy(
            live(),
            json!({"spec":{"selector":{"$patch":"replace","matchLabels":{"x":"y"}}}}),
        );
        assert_eq!(out["spec"]["selector"], json!({"matchLabels": {"x": "y"}}));
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"containers":[{"name":"x","image":"i"},{"$patch":"replace"}]}}}}),
        );
        assert_eq!(containers(&out), &vec![json!({"name": "x", "image": "i"})]);
        let out = deploy(live(), json!({"spec":{"strategy":{"$patch":"delete"}}}));
        assert_eq!(out["spec"]["strategy"], json!({}));
    }

    #[test]
    fn atomic_lists_are_replaced() {
        let out = deploy(
            live(),
            json!({"spec":{"template":{"spec":{"tolerations":[{"key":"other","operator":"Exists"}]}}}}),
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "other", "operator": "Exists"}])
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"spec":{"ports":[{"port":80,"targetPort":8080},{"port":443}],"selector":{"app":"web"}}});
        let out = smp(
            ("", "Service"),
            svc,
            json!({"spec":{"ports":[{"port":80,"targetPort":9090}],"selector":{"tier":"front"}}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port":80,"targetPort":9090},{"port":443}])
        );
        assert_eq!(out["spec"]["selector"], json!({"app":"web","tier":"front"}));
    }

    #[test]
    fn status_conditions_merge_by_type() {
        let pod = json!({"status":{"conditions":[{"type":"Ready","status":"False"},{"type":"PodScheduled","status":"True"}]}});
        let out = smp(
            ("", "Pod"),
            pod,
            json!({"status":{"$setElementOrder/conditions":[{"type":"Ready"},{"type":"PodScheduled"}],"conditions":[{"type":"Ready","status":"True"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["status"]["conditions"][0],
            json!({"type":"Ready","status":"True"})
        );
        assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn malformed_patches_are_errors() {
        let cases = [
            (
                json!({"spec":{"template":{"spec":{"containers":[{"image":"x"}]}}}}),
                false,
            ),
            (
                json!({"spec":{"template":{"spec":{"containers":["x"]}}}}),
                false,
            ),
            (json!({"spec":{"$patch":"explode"}}), true),
            (
                json!({"spec":{"template":{"spec":{"containers":[{"$patch":"merge","name":"web"}]}}}}),
                true,
            ),
            (
                json!({"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"a"}],"containers":[{"name":"web","image":"x"}]}}}}),
                true,
            ),
            (
                json!({"spec":{"template":{"spec":{"$setElementOrder/containers":{"name":"a"}}}}}),
                true,
            ),
            (
                json!({"metadata":{"$deleteFromPrimitiveList/finalizers":"a"}}),
                true,
            ),
            (json!({"metadata":{"$bogus":1}}), true),
        ];
        for (patch, bad_request) in cases {
            let err =
                smp(("apps", "Deployment"), live(), patch.clone()).expect_err(&patch.to_string());
            assert_eq!(
                matches!(err, SmpError::BadRequest(_)),
                bad_request,
                "{patch}: {err:?}"
            );
        }
    }

    /// SMP(original, patch) on JSON and DeepMerge on the typed object agree, once the given
    /// lists (JSON pointer, merge key) are put in key order. DeepMerge is only defined when
    /// every item carries its required fields (a typed patch cannot leave them out), so the
    /// cases below always send them.
    fn agrees<T>(kind: (&str, &str), original: Value, patch: Value, lists: &[(&str, &str)])
    where
        T: serde::de::DeserializeOwned + serde::Serialize + DeepMerge,
    {
        let mut typed: T = serde_json::from_value(original.clone()).unwrap();
        typed.merge_from(serde_json::from_value(patch.clone()).unwrap());
        let via_smp: T = serde_json::from_value(smp(kind, original, patch).unwrap()).unwrap();
        let (mut a, mut b) = (
            serde_json::to_value(via_smp).unwrap(),
            serde_json::to_value(typed).unwrap(),
        );
        for (pointer, key) in lists {
            for v in [&mut a, &mut b] {
                if let Some(Value::Array(items)) = v.pointer_mut(pointer) {
                    // An empty key sorts a list of scalars by value.
                    items.sort_by_key(|i| {
                        if key.is_empty() {
                            i.to_string()
                        } else {
                            i[*key].to_string()
                        }
                    });
                }
            }
        }
        assert_eq!(a, b, "{kind:?}");
    }

    // Every merge list of the strategy table, checked against k8s-openapi's DeepMerge: an item
    // present on both sides merges field by field, a new one is added.
    #[test]
    fn every_merge_list_agrees_with_deep_merge() {
        use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service, ServiceAccount};
        let pod =
            |o: Value, p: Value, lists: &[(&str, &str)]| agrees::<Pod>(("", "Pod"), o, p, lists);
        for (list, key, a, b) in [
            (
                "containers",
                "name",
                json!({"image": "a"}),
                json!({"workingDir": "/w"}),
            ),
            (
                "initContainers",
                "name",
                json!({"image": "a"}),
                json!({"workingDir": "/w"}),
            ),
            (
                "ephemeralContainers",
                "name",
                json!({"image": "a"}),
                json!({"workingDir": "/w"}),
            ),
            (
                "volumes",
                "name",
                json!({"emptyDir": {}}),
                json!({"emptyDir": {"medium": "Memory"}}),
            ),
            ("imagePullSecrets", "name", json!({}), json!({})),
            (
                "hostAliases",
                "ip",
                json!({"hostnames": ["x"]}),
                json!({"hostnames": ["y"]}),
            ),
            (
                "topologySpreadConstraints",
                "topologyKey",
                json!({"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}),
                json!({"maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule", "minDomains": 2}),
            ),
            ("schedulingGates", "name", json!({}), json!({})),
            (
                "resourceClaims",
                "name",
                json!({"resourceClaimName": "x"}),
                json!({"resourceClaimTemplateName": "y"}),
            ),
        ] {
            let item = |k: &str, extra: &Value| {
                let mut i = extra.clone();
                i[key] = json!(k);
                i
            };
            let k1 = if key == "ip" { "10.0.0.1" } else { "k1" };
            let k2 = if key == "ip" { "10.0.0.2" } else { "k2" };
            pod(
                json!({"spec": {"containers": [], list: [item(k1, &a)]}}),
                json!({"spec": {"containers": [], list: [item(k1, &b), item(k2, &a)]}}),
                &[(&format!("/spec/{list}"), key)],
            );
        }
        for (list, key, a, b) in [
            (
                "conditions",
                "type",
                json!({"status": "False", "message": "m"}),
                json!({"status": "True", "reason": "R"}),
            ),
            ("podIPs", "ip", json!({}), json!({})),
            ("hostIPs", "ip", json!({}), json!({})),
            (
                "resourceClaimStatuses",
                "name",
                json!({"resourceClaimName": "x"}),
                json!({"resourceClaimName": "y"}),
            ),
        ] {
            let (k1, k2) = if key == "ip" {
                ("10.0.0.1", "10.0.0.2")
            } else {
                ("Ready", "Initialized")
            };
            let item = |k: &str, extra: &Value| {
                let mut i = extra.clone();
                i[key] = json!(k);
                i
            };
            pod(
                json!({"status": {list: [item(k1, &a)]}}),
                json!({"status": {list: [item(k1, &b), item(k2, &a)]}}),
                &[(&format!("/status/{list}"), key)],
            );
        }
        pod(
            json!({"metadata": {"ownerReferences": [{"uid": "u1", "name": "a", "kind": "ReplicaSet", "apiVersion": "apps/v1"}], "finalizers": ["x"]},
                   "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "name": "http"}],
                       "env": [{"name": "A", "value": "1"}], "volumeMounts": [{"mountPath": "/a", "name": "v"}],
                       "volumeDevices": [{"devicePath": "/dev/a", "name": "d"}]}]}}),
            json!({"metadata": {"ownerReferences": [{"uid": "u1", "name": "a", "kind": "ReplicaSet", "apiVersion": "apps/v1", "controller": true},
                                                    {"uid": "u2", "name": "b", "kind": "Node", "apiVersion": "v1"}], "finalizers": ["y"]},
                   "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}],
                       "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
                       "volumeMounts": [{"mountPath": "/a", "name": "v", "readOnly": true}, {"mountPath": "/b", "name": "w"}],
                       "volumeDevices": [{"devicePath": "/dev/a", "name": "e"}, {"devicePath": "/dev/b", "name": "f"}]}]}}),
            &[
                ("/metadata/ownerReferences", "uid"),
                ("/metadata/finalizers", ""),
                ("/spec/containers/0/ports", "containerPort"),
                ("/spec/containers/0/env", "name"),
                ("/spec/containers/0/volumeMounts", "mountPath"),
                ("/spec/containers/0/volumeDevices", "devicePath"),
            ],
        );
        agrees::<Service>(
            ("", "Service"),
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}], "externalIPs": ["192.0.2.1"]},
                   "status": {"conditions": [{"type": "A", "status": "True", "reason": "x", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}),
            json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443}], "externalIPs": ["192.0.2.2"]},
                   "status": {"conditions": [{"type": "B", "status": "False", "reason": "y", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}),
            &[("/spec/ports", "port"), ("/status/conditions", "type")],
        );
        agrees::<Node>(
            ("", "Node"),
            json!({"spec": {"podCIDRs": ["10.244.1.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "conditions": [{"type": "Ready", "status": "True"}]}}),
            json!({"spec": {"podCIDRs": ["fd00::/64"], "taints": [{"key": "b", "effect": "NoExecute"}]},
                   "status": {"addresses": [{"type": "Hostname", "address": "n"}, {"type": "InternalIP", "address": "10.0.0.2"}],
                              "conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}]}}),
            &[
                ("/spec/podCIDRs", ""),
                ("/status/addresses", "type"),
                ("/status/conditions", "type"),
            ],
        );
        agrees::<Namespace>(
            ("", "Namespace"),
            json!({"status": {"phase": "Active", "conditions": [{"type": "A", "status": "True"}]}}),
            json!({"status": {"phase": "Terminating", "conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "True"}]}}),
            &[("/status/conditions", "type")],
        );
        agrees::<ServiceAccount>(
            ("", "ServiceAccount"),
            json!({"secrets": [{"name": "a", "namespace": "x"}], "imagePullSecrets": [{"name": "p"}]}),
            json!({"secrets": [{"name": "a", "uid": "u"}, {"name": "b"}], "imagePullSecrets": [{"name": "q"}]}),
            &[("/secrets", "name")],
        );
    }

    // ---- property tests: SMP on JSON == DeepMerge on typed objects (modulo list order) ----

    fn container() -> impl Strategy<Value = Container> {
        (
            prop_oneof![Just("a"), Just("b"), Just("c")],
            proptest::option::of(prop_oneof![Just("nginx:1"), Just("nginx:2")]),
            proptest::collection::btree_map(
                prop_oneof![Just("X"), Just("Y"), Just("Z")],
                proptest::option::of(prop_oneof![Just("1"), Just("2")]),
                0..3,
            ),
            proptest::collection::btree_map(
                prop_oneof![Just(80), Just(443), Just(8080)],
                proptest::option::of(prop_oneof![Just("http"), Just("https")]),
                0..3,
            ),
            proptest::option::of(prop_oneof![Just("Always"), Just("IfNotPresent")]),
        )
            .prop_map(|(name, image, env, ports, pull)| Container {
                name: name.into(),
                image: image.map(Into::into),
                image_pull_policy: pull.map(Into::into),
                env: (!env.is_empty()).then(|| {
                    env.into_iter()
                        .map(|(n, v)| EnvVar {
                            name: n.into(),
                            value: v.map(Into::into),
                            ..Default::default()
                        })
                        .collect()
                }),
                ports: (!ports.is_empty()).then(|| {
                    ports
                        .into_iter()
                        .map(|(p, n)| ContainerPort {
                            container_port: p,
                            name: n.map(Into::into),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            })
    }

    fn deployment() -> impl Strategy<Value = Deployment> {
        (
            proptest::option::of(0..5i32),
            proptest::option::of(proptest::collection::btree_map(
                prop_oneof![Just("app"), Just("tier")].prop_map(String::from),
                prop_oneof![Just("x"), Just("y")].prop_map(String::from),
                0..3,
            )),
            proptest::option::of(proptest::collection::btree_set(
                prop_oneof![Just("f1"), Just("f2"), Just("f3")].prop_map(String::from),
                0..3,
            )),
            proptest::option::of(proptest::collection::vec(container(), 0..4).prop_map(|cs| {
                let mut seen = std::collections::BTreeSet::new();
                cs.into_iter()
                    .filter(|c| seen.insert(c.name.clone()))
                    .collect::<Vec<_>>()
            })),
            proptest::option::of(proptest::collection::vec(
                prop_oneof![Just("k1"), Just("k2")].prop_map(|k| Toleration {
                    key: Some(k.into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }),
                0..3,
            )),
        )
            .prop_map(|(replicas, labels, finalizers, containers, tolerations)| {
                Deployment {
                    metadata: ObjectMeta {
                        labels,
                        finalizers: finalizers.map(|f| f.into_iter().collect()),
                        ..Default::default()
                    },
                    spec: Some(DeploymentSpec {
                        replicas,
                        template: PodTemplateSpec {
                            metadata: None,
                            spec: containers.map(|containers| PodSpec {
                                containers,
                                tolerations,
                                ..Default::default()
                            }),
                        },
                        ..Default::default()
                    }),
                    status: None,
                }
            })
    }

    /// Sorts every merge list by its key so two merges compare regardless of item order.
    fn canonical(mut d: Deployment) -> Value {
        if let Some(f) = d.metadata.finalizers.as_mut() {
            f.sort();
        }
        if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            spec.containers.sort_by(|a, b| a.name.cmp(&b.name));
            for c in &mut spec.containers {
                if let Some(env) = c.env.as_mut() {
                    env.sort_by(|a, b| a.name.cmp(&b.name));
                }
                if let Some(ports) = c.ports.as_mut() {
                    ports.sort_by_key(|p| p.container_port);
                }
            }
        }
        serde_json::to_value(d).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn agrees_with_deep_merge(original in deployment(), patch in deployment()) {
            let mut typed = original.clone();
            typed.merge_from(patch.clone());
            let patched = smp(
                ("apps", "Deployment"),
                serde_json::to_value(&original).unwrap(),
                serde_json::to_value(&patch).unwrap(),
            ).unwrap();
            let patched: Deployment = serde_json::from_value(patched).unwrap();
            prop_assert_eq!(canonical(patched), canonical(typed));
        }

        #[test]
        fn empty_patch_is_identity(original in deployment()) {
            let v = serde_json::to_value(&original).unwrap();
            prop_assert_eq!(smp(("apps", "Deployment"), v.clone(), json!({})).unwrap(), v);
        }

        // kubectl's $setElementOrder fixes the final order of the list, whatever the live order.
        #[test]
        fn set_element_order_is_honoured(original in deployment(), order in Just(vec!["c", "a", "b"]).prop_shuffle()) {
            let v = serde_json::to_value(&original).unwrap();
            let live: Vec<String> = original.spec.as_ref().and_then(|s| s.template.spec.as_ref())
                .map(|s| s.containers.iter().map(|c| c.name.clone()).collect()).unwrap_or_default();
            let wanted: Vec<&str> = order.iter().copied().filter(|n| live.iter().any(|l| l == n)).collect();
            let set_order: Vec<Value> = wanted.iter().map(|n| json!({"name": n})).collect();
            let patched = smp(("apps", "Deployment"), v,
                json!({"spec":{"template":{"spec":{"$setElementOrder/containers": set_order}}}})).unwrap();
            let names: Vec<&str> = patched["spec"]["template"]["spec"]["containers"].as_array()
                .map(|cs| cs.iter().map(|c| c["name"].as_str().unwrap()).collect()).unwrap_or_default();
            prop_assert_eq!(names, wanted);
        }

        // Arbitrary JSON as a patch never panics: it merges or is refused.
        #[test]
        fn never_panics(patch in arbitrary_json(3)) {
            let _ = smp(("", "Pod"), json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c"}]}}), json!({"spec": patch.clone(), "metadata": patch}));
        }
    }

    fn arbitrary_json(depth: u32) -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("containers"),
            Just("name"),
            Just("$patch"),
            Just("$retainKeys"),
            Just("$setElementOrder/containers"),
            Just("$deleteFromPrimitiveList/finalizers"),
            Just("finalizers"),
            Just("image"),
            Just("replace"),
            Just("delete"),
        ]
        .prop_map(String::from);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (0..3i64).prop_map(Value::from),
            prop_oneof![Just("replace"), Just("delete"), Just("merge"), Just("c")]
                .prop_map(Value::from),
        ];
        leaf.prop_recursive(depth, 32, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
