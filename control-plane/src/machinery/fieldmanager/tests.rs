//! Field management against Kubernetes' documented behaviour, and property tests of the
//! merge against k8s-openapi's `DeepMerge` (which encodes the same list semantics).

use super::*;
use k8s_openapi::api::{apps, core};
use k8s_openapi::DeepMerge;
use proptest::prelude::*;
use schemars::JsonSchema;
use serde_json::json;

use crate::machinery::GroupKind;

fn deployment_type() -> std::sync::Arc<Type> {
    type_of(
        &GroupKind::new("apps", "Deployment"),
        apps::v1::Deployment::json_schema,
    )
}

fn pod_type() -> std::sync::Arc<Type> {
    type_of(&GroupKind::new("", "Pod"), core::v1::Pod::json_schema)
}

fn writer<'a>(manager: &'a str, operation: Operation) -> Writer<'a> {
    Writer {
        manager,
        operation,
        subresource: "",
        api_version: "apps/v1",
        now: "2026-01-01T00:00:00Z",
        ignored: Some("status"),
    }
}

fn deployment(replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]}
            }
        }
    })
}

fn managers_of(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_string(),
                        e["operation"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn fields_of<'v>(obj: &'v Value, manager: &str) -> &'v Value {
    obj["metadata"]["managedFields"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["manager"] == manager))
        .map(|e| &e["fieldsV1"])
        .unwrap_or(&Value::Null)
}

/// The deployment as `kubectl create` leaves it: one Update manager owning all of it.
fn created_by_kubectl(t: &Type, replicas: i64) -> Value {
    let mut obj = deployment(replicas, "nginx");
    record_update(
        t,
        None,
        &mut obj,
        &writer("kubectl-create", Operation::Update),
    );
    obj
}

#[test]
fn a_create_records_what_it_set_as_kubernetes_does() {
    let t = deployment_type();
    let obj = created_by_kubectl(&t, 3);
    assert_eq!(
        managers_of(&obj),
        vec![("kubectl-create".into(), "Update".into())]
    );
    let f = fields_of(&obj, "kubectl-create");
    // Labels are added (so "." marks the map), spec and template always exist (no "."),
    // the selector is an atomic struct (one leaf), a container is an item with its fields.
    assert_eq!(f["f:metadata"], json!({"f:labels": {".": {}, "f:app": {}}}));
    assert_eq!(f["f:spec"]["f:selector"], json!({}));
    assert_eq!(f["f:spec"]["f:replicas"], json!({}));
    assert!(f["f:spec"].get(".").is_none());
    assert_eq!(
        f["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"],
        json!({".": {}, "f:image": {}, "f:name": {}})
    );
    let entry = &obj["metadata"]["managedFields"][0];
    assert_eq!(entry["apiVersion"], "apps/v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert_eq!(entry["time"], "2026-01-01T00:00:00Z");
    assert!(f.get("f:apiVersion").is_none() && f["f:metadata"].get("f:name").is_none());
}

#[test]
fn apply_conflicts_with_another_managers_field_unless_forced() {
    let t = deployment_type();
    let live = created_by_kubectl(&t, 3);
    let config = deployment(5, "nginx");
    let e = apply(
        &t,
        Some(&live),
        &config,
        &writer("mine", Operation::Apply),
        false,
    )
    .unwrap_err();
    let ApplyError::Conflicts(c) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].path.to_string(), ".spec.replicas");
    assert_eq!(c[0].manager, "\"kubectl-create\" using apps/v1");
    let status = ApiError::from(e);
    assert_eq!(status.code, 409);
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-create\" using apps/v1: .spec.replicas"
    );
    assert_eq!(status.causes[0].kind, CauseType::FieldManagerConflict);
    assert_eq!(status.causes[0].field, ".spec.replicas");
    // The same values are no conflict: the managers share the fields.
    let same = apply(
        &t,
        Some(&live),
        &deployment(3, "nginx"),
        &writer("mine", Operation::Apply),
        false,
    )
    .unwrap();
    assert!(fields_of(&same, "mine")["f:spec"]["f:replicas"].is_object());
    assert!(fields_of(&same, "kubectl-create")["f:spec"]["f:replicas"].is_object());
    // Forced: the applier takes the field over.
    let forced = apply(
        &t,
        Some(&live),
        &config,
        &writer("mine", Operation::Apply),
        true,
    )
    .unwrap();
    assert_eq!(forced["spec"]["replicas"], 5);
    assert!(fields_of(&forced, "kubectl-create")["f:spec"]
        .get("f:replicas")
        .is_none());
    assert!(fields_of(&forced, "mine")["f:spec"]["f:replicas"].is_object());
}

#[test]
fn several_conflicts_are_grouped_by_manager() {
    let t = deployment_type();
    let live = created_by_kubectl(&t, 3);
    let e = apply(
        &t,
        Some(&live),
        &deployment(5, "nginx:2"),
        &writer("mine", Operation::Apply),
        false,
    )
    .unwrap_err();
    let status = ApiError::from(e);
    assert_eq!(
        status.message,
        "Apply failed with 2 conflicts: conflicts with \"kubectl-create\" using apps/v1:\n- .spec.replicas\n- .spec.template.spec.containers[name=\"web\"].image"
    );
}

#[test]
fn a_field_dropped_from_the_configuration_goes_unless_someone_else_owns_it() {
    let t = deployment_type();
    let a = writer("a", Operation::Apply);
    let mut with_label = deployment(3, "nginx");
    with_label["metadata"]["labels"]["extra"] = json!("x");
    let live = apply(&t, None, &with_label, &a, false).unwrap();
    let live = apply(&t, Some(&live), &deployment(3, "nginx"), &a, false).unwrap();
    assert!(live["metadata"]["labels"].get("extra").is_none(), "{live}");
    // Owned by another applier too: it stays, and is then only theirs.
    let live = apply(&t, None, &with_label, &a, false).unwrap();
    let b_config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"extra": "x"}}});
    let live = apply(
        &t,
        Some(&live),
        &b_config,
        &writer("b", Operation::Apply),
        false,
    )
    .unwrap();
    let live = apply(&t, Some(&live), &deployment(3, "nginx"), &a, false).unwrap();
    assert_eq!(live["metadata"]["labels"]["extra"], "x");
    // A dropped container goes with its fields; replicas dropped is removed too.
    let mut two = deployment(3, "nginx");
    two["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "side", "image": "busybox"}));
    let live = apply(&t, None, &two, &a, false).unwrap();
    let mut one = deployment(3, "nginx");
    one["spec"].as_object_mut().unwrap().remove("replicas");
    let live = apply(&t, Some(&live), &one, &a, false).unwrap();
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"],
        json!([{"name": "web", "image": "nginx"}])
    );
    assert!(live["spec"].get("replicas").is_none());
    assert_eq!(live["metadata"]["name"], "web", "metadata stays");
}

#[test]
fn an_update_takes_fields_from_appliers_and_reapplying_is_a_no_op() {
    let t = deployment_type();
    let a = writer("a", Operation::Apply);
    let live = apply(&t, None, &deployment(3, "nginx"), &a, false).unwrap();
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(7);
    let mut w = writer("kubectl", Operation::Update);
    w.subresource = "scale";
    record_update(&t, Some(&live), &mut scaled, &w);
    assert!(fields_of(&scaled, "a")["f:spec"]
        .get("f:replicas")
        .is_none());
    let entry = scaled["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "kubectl")
        .unwrap()
        .clone();
    assert_eq!(entry["subresource"], "scale");
    assert_eq!(entry["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    // An update that changes nothing leaves the managers as they were.
    let mut again = scaled.clone();
    record_update(
        &t,
        Some(&scaled),
        &mut again,
        &writer("other", Operation::Update),
    );
    assert_eq!(
        again["metadata"]["managedFields"],
        scaled["metadata"]["managedFields"]
    );
    // The applier reapplying its configuration now conflicts with the scale.
    let e = apply(&t, Some(&scaled), &deployment(3, "nginx"), &a, false).unwrap_err();
    assert!(ApiError::from(e)
        .message
        .contains("\"kubectl\" with subresource \"scale\" using apps/v1"));
    // And reapplying what is already there changes nothing.
    let same = apply(&t, Some(&live), &deployment(3, "nginx"), &a, false).unwrap();
    assert_eq!(same, live);
}

#[test]
fn clients_may_replace_or_clear_the_list_but_not_lose_it() {
    let t = deployment_type();
    let live = created_by_kubectl(&t, 3);
    // Left out: the live list is kept.
    let mut new = deployment(4, "nginx");
    record_update(
        &t,
        Some(&live),
        &mut new,
        &writer("edit", Operation::Update),
    );
    assert_eq!(managers_of(&new).len(), 2);
    // An explicit empty list clears it, then the writer's own change is recorded.
    let mut new = deployment(4, "nginx");
    new["metadata"]["managedFields"] = json!([]);
    record_update(
        &t,
        Some(&live),
        &mut new,
        &writer("edit", Operation::Update),
    );
    assert_eq!(managers_of(&new), vec![("edit".into(), "Update".into())]);
}

#[test]
fn objects_without_managers_meet_their_first_apply_as_before_first_apply() {
    let t = deployment_type();
    let live = deployment(3, "nginx");
    let e = apply(
        &t,
        Some(&live),
        &deployment(4, "nginx"),
        &writer("a", Operation::Apply),
        false,
    )
    .unwrap_err();
    assert!(ApiError::from(e)
        .message
        .contains("\"before-first-apply\" using apps/v1"));
}

#[test]
fn update_managers_are_capped_with_the_oldest_merged() {
    let t = deployment_type();
    let mut live = deployment(1, "nginx");
    record_update(&t, None, &mut live, &writer("m0", Operation::Update));
    for i in 1..=12 {
        let mut new = live.clone();
        new["metadata"]["labels"][format!("l{i}")] = json!("x");
        let name = format!("m{i}");
        let now = format!("2026-01-01T00:00:{i:02}Z");
        let mut w = writer(&name, Operation::Update);
        w.now = &now;
        record_update(&t, Some(&live), &mut new, &w);
        live = new;
    }
    let managers = managers_of(&live);
    assert_eq!(managers.len(), 11, "{managers:?}");
    assert!(managers.iter().any(|(m, _)| m == "ancient-changes"));
    assert!(managers.iter().any(|(m, _)| m == "m12"));
    assert!(!managers.iter().any(|(m, _)| m == "m0"));
}

#[test]
fn user_agents_become_manager_names() {
    assert_eq!(
        manager_from_user_agent("kubectl/v1.33.1 (linux/amd64) kubernetes/abc"),
        "kubectl"
    );
    assert_eq!(
        manager_from_user_agent("kube-controller-manager/v1.33"),
        "kube-controller-manager"
    );
    assert_eq!(manager_from_user_agent(&"x".repeat(300)).len(), 128);
    assert_eq!(manager_from_user_agent(""), "");
}

#[test]
fn apply_refuses_managed_fields_and_keyless_items() {
    let t = pod_type();
    let mut config = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "managedFields": [{}]}});
    let w = Writer {
        api_version: "v1",
        ..writer("a", Operation::Apply)
    };
    assert!(matches!(
        apply(&t, None, &config, &w, false),
        Err(ApplyError::Invalid(_))
    ));
    config["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    config["spec"] = json!({"containers": [{"image": "x"}]});
    let e = apply(&t, None, &config, &w, false).unwrap_err();
    assert!(
        matches!(&e, ApplyError::Invalid(m) if m.contains("omits key field \"name\"")),
        "{e:?}"
    );
    // Ports default their protocol key: two ports differing only by protocol are two items.
    config["spec"] = json!({"containers": [{"name": "c", "ports": [
        {"containerPort": 53}, {"containerPort": 53, "protocol": "UDP"}]}]});
    let out = apply(&t, None, &config, &w, false).unwrap();
    let f = fields_of(&out, "a");
    let ports = &f["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:ports"];
    assert!(
        ports
            .get("k:{\"containerPort\":53,\"protocol\":\"TCP\"}")
            .is_some(),
        "{ports}"
    );
    assert!(ports
        .get("k:{\"containerPort\":53,\"protocol\":\"UDP\"}")
        .is_some());
}

// ---- property tests -------------------------------------------------------------------

/// A pod whose lists exercise each list kind: containers and env (keyed), args (atomic),
/// finalizers (set), labels (a map); names from small pools so items collide.
fn arb_pod() -> impl Strategy<Value = Value> {
    let env = prop::collection::btree_map("[ab]", "[xy]", 0..3);
    let container = (
        prop::option::of("[ij]"),
        env,
        prop::option::of(prop::collection::vec("[pq]", 0..3)),
        prop::option::of(prop::sample::select(vec![80i64, 81])),
    );
    let containers = prop::collection::btree_map("[cd]", container, 0..3);
    (
        containers,
        prop::collection::btree_map("[kl]", "[uv]", 0..3),
        prop::collection::btree_set("[fg]", 0..3),
        prop::option::of(prop::sample::select(vec!["Always", "Never"])),
    )
        .prop_map(|(containers, labels, finalizers, restart)| {
            let containers: Vec<Value> = containers
                .into_iter()
                .map(|(name, (image, env, args, port))| {
                    let mut c = json!({"name": name});
                    if let Some(i) = image {
                        c["image"] = json!(i);
                    }
                    if !env.is_empty() {
                        c["env"] = json!(env
                            .into_iter()
                            .map(|(n, v)| json!({"name": n, "value": v}))
                            .collect::<Vec<_>>());
                    }
                    if let Some(a) = args {
                        c["args"] = json!(a);
                    }
                    if let Some(p) = port {
                        c["ports"] = json!([{"containerPort": p, "protocol": "TCP"}]);
                    }
                    c
                })
                .collect();
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p"}, "spec": {"containers": containers}});
            if !labels.is_empty() {
                pod["metadata"]["labels"] = json!(labels);
            }
            if !finalizers.is_empty() {
                pod["metadata"]["finalizers"] = json!(finalizers);
            }
            if let Some(r) = restart {
                pod["spec"]["restartPolicy"] = json!(r);
            }
            pod
        })
}

/// Lists in a canonical order (keyed items by name, sets sorted), to compare merges whose
/// item order may differ.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect())
        }
        Value::Array(a) => {
            let mut items: Vec<Value> = a.iter().map(canonical).collect();
            let keyed = items.iter().all(|i| i.get("name").is_some());
            let scalar = items.iter().all(|i| !i.is_object() && !i.is_array());
            if keyed {
                items.sort_by(|x, y| x["name"].to_string().cmp(&y["name"].to_string()));
            } else if scalar && a.len() > 1 {
                // Only sets are sorted; atomic lists of scalars (args) keep their order, but
                // both merges replace them whole, so their order agrees anyway.
            }
            Value::Array(items)
        }
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    // The merge of an applied configuration agrees with k8s-openapi's DeepMerge, which
    // encodes Kubernetes' list types per field (keyed, atomic, set), up to item order.
    #[test]
    fn merge_agrees_with_deep_merge(live in arb_pod(), config in arb_pod()) {
        let t = pod_type();
        let ours = typed::merge(&live, &config, &t).unwrap();
        let mut theirs: core::v1::Pod = serde_json::from_value(live.clone()).unwrap();
        theirs.merge_from(serde_json::from_value(config.clone()).unwrap());
        let mut theirs = serde_json::to_value(theirs).unwrap();
        // DeepMerge appends new set items at the end; sort finalizers on both sides.
        for v in [&mut theirs] {
            if let Some(f) = v.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                f.sort_by_key(|x| x.to_string());
            }
        }
        let mut ours_sorted = ours.clone();
        if let Some(f) = ours_sorted.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
            f.sort_by_key(|x| x.to_string());
        }
        prop_assert_eq!(canonical(&ours_sorted), canonical(&theirs));
    }

    // Everything a configuration sets is in the merged object, unchanged.
    #[test]
    fn merged_object_holds_the_configuration(live in arb_pod(), config in arb_pod()) {
        let t = pod_type();
        let merged = typed::merge(&live, &config, &t).unwrap();
        let c = typed::compare(&config, &merged, &t).unwrap();
        prop_assert!(c.modified.is_empty(), "modified: {:?}", c.modified.paths());
        prop_assert!(c.removed.is_empty(), "removed: {:?}", c.removed.paths());
        prop_assert!(typed::compare(&merged, &merged, &t).unwrap().changed().is_empty());
    }

    // Removing an object's own field set leaves nothing that sets a field (empty lists
    // set none: structured-merge-diff does not record them either).
    #[test]
    fn removing_every_field_empties_the_object(pod in arb_pod()) {
        let t = pod_type();
        let set = typed::field_set(&pod, &t).unwrap();
        let mut v = pod.clone();
        typed::remove(&mut v, &typed::with_named_fields(&set, &t), &t).unwrap();
        prop_assert!(typed::field_set(&v, &t).unwrap().is_empty(), "left {}", v);
        prop_assert!(v.get("metadata").is_none());
    }

    // Applying the same configuration twice is a no-op; a second manager applying different
    // values conflicts exactly on the fields it would change, and forcing takes them over.
    #[test]
    fn apply_ownership(first in arb_pod(), second in arb_pod()) {
        let t = pod_type();
        let a = Writer { api_version: "v1", ..writer("a", Operation::Apply) };
        let b = Writer { api_version: "v1", ..writer("b", Operation::Apply) };
        let live = apply(&t, None, &first, &a, false).unwrap();
        prop_assert_eq!(&apply(&t, Some(&live), &first, &a, false).unwrap(), &live);
        let merged = typed::merge(&bare(&live), &second, &t).unwrap();
        let changed = typed::compare(&bare(&live), &merged, &t).unwrap().changed();
        let owned_by_a = Set::from_fields_v1(fields_of(&live, "a")).unwrap_or_default();
        let expected = owned_by_a.intersection(&changed).paths();
        match apply(&t, Some(&live), &second, &b, false) {
            Ok(out) => {
                prop_assert!(expected.is_empty(), "no conflict reported for {:?}", expected);
                let b_set = Set::from_fields_v1(fields_of(&out, "b")).unwrap_or_default();
                prop_assert_eq!(b_set, strip_meta(&typed::field_set(&second, &t).unwrap()));
            }
            Err(ApplyError::Conflicts(c)) => {
                let mut got: Vec<Path> = c.iter().map(|c| c.path.clone()).collect();
                got.sort();
                prop_assert_eq!(got, expected);
                let forced = apply(&t, Some(&live), &second, &b, true).unwrap();
                let a_after = Set::from_fields_v1(fields_of(&forced, "a")).unwrap_or_default();
                prop_assert!(a_after.intersection(&changed).is_empty());
            }
            Err(e) => prop_assert!(false, "{:?}", e),
        }
    }
}
