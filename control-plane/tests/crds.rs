//! CustomResourceDefinitions end to end against a real `control-plane apiserver` process (on
//! both stores): the real kubectl applies a definition with a structural schema, CEL rules,
//! printer columns, short names and the status and scale subresources, waits for it to be
//! Established, and then uses its objects as any kind: validation with field paths, pruning,
//! defaults, columns, explain, field selectors, status and scale, server-side apply; a
//! second version served with conversion None; deleting the definition deletes its objects.
//! kube-rs's `#[derive(CustomResource)]` drives the same through the typed client and a
//! watcher.

mod api_support;

use std::time::Duration;

use serde_json::Value;
use skiff_tests::kubectl::ServerFixture;
use skiff_tests::wait_until;

fn start() -> ServerFixture {
    let args = api_support::server_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &args)
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
    categories: [all]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - name: Size
      type: integer
      jsonPath: .spec.size
    - name: Color
      type: string
      jsonPath: .spec.color
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: What a widget should be.
            required: [size]
            x-kubernetes-validations:
            - rule: "self.size <= 5 || self.color == 'red'"
              message: only red widgets may be larger than 5
            properties:
              size:
                type: integer
                minimum: 1
                maximum: 10
                description: How big the widget is.
              color:
                type: string
                enum: [red, blue]
                default: blue
              replicas:
                type: integer
                default: 1
              tags:
                type: array
                x-kubernetes-list-type: set
                items: {type: string}
          status:
            type: object
            properties:
              replicas: {type: integer}
              ready: {type: boolean}
"#;

fn widget(name: &str, spec: &str) -> String {
    format!("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

fn establish(f: &ServerFixture) {
    let p = f.file("crd.yaml", CRD);
    f.k.ok(&["apply", "-f", &p]);
    f.k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
}

fn definition_validates_prunes_defaults_and_prints() {
    let f = start();
    establish(&f);
    let crd = json(&f.k.ok(&["get", "crd", "widgets.example.com", "-o", "json"]));
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
    assert!(crd["metadata"]["finalizers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == "customresourcecleanup.apiextensions.k8s.io"));

    // A valid object: stored, defaulted.
    let p = f.file("small.yaml", &widget("small", "  size: 3\n"));
    f.k.ok(&["apply", "-f", &p]);
    let w = json(&f.k.ok(&["get", "widget", "small", "-o", "json"]));
    assert_eq!(w["spec"]["color"], "blue", "{w}");
    assert_eq!(w["spec"]["replicas"], 1, "{w}");
    assert_eq!(w["metadata"]["generation"], 1);

    // Printer columns, short name, category.
    let table = f.k.ok(&["get", "wd"]);
    let head: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["NAME", "SIZE", "COLOR", "AGE"], "{table}");
    assert!(
        table.lines().nth(1).unwrap().starts_with("small"),
        "{table}"
    );
    assert!(table.contains(" 3 "), "{table}");
    let all = f.k.ok(&["get", "all"]);
    assert!(all.contains("widget.example.com/small"), "{all}");

    // Out of range, not in the enum, and a CEL rule: 422 with the field paths.
    let p = f.file("bad.yaml", &widget("bad", "  size: 20\n  color: green\n"));
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(
        err.contains(
            "spec.size: Invalid value: 20: spec.size in body should be less than or equal to 10"
        ),
        "{err}"
    );
    assert!(
        err.contains("spec.color: Unsupported value: \"green\""),
        "{err}"
    );
    let p = f.file("big.yaml", &widget("big", "  size: 7\n  color: blue\n"));
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(
        err.contains("only red widgets may be larger than 5"),
        "{err}"
    );
    let p = f.file("nosize.yaml", &widget("nosize", "  color: red\n"));
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(err.contains("spec.size: Required value"), "{err}");
    f.k.fails(&["get", "widget", "bad"]);

    // Unknown fields: Strict (kubectl's default) refuses them, naming each; Ignore prunes.
    let p = f.file(
        "extra.yaml",
        &widget("extra", "  size: 2\n  flavor: sweet\n"),
    );
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(err.contains("unknown field \"spec.flavor\""), "{err}");
    f.k.ok(&["apply", "--validate=false", "-f", &p]);
    let w = json(&f.k.ok(&["get", "widget", "extra", "-o", "json"]));
    assert!(w["spec"].get("flavor").is_none(), "{w}");
    assert_eq!(w["spec"]["size"], 2);

    // explain reads the published schema.
    let ex = f.k.ok(&["explain", "widget.spec.size"]);
    assert!(ex.contains("How big the widget is."), "{ex}");

    // Field selectors on metadata.
    let names = f.k.ok(&[
        "get",
        "widgets",
        "--field-selector",
        "metadata.name=small",
        "-o",
        "name",
    ]);
    assert_eq!(names.trim(), "widget.example.com/small");
    let err =
        f.k.fails(&["get", "widgets", "--field-selector", "spec.size=3"]);
    assert!(err.contains("field label not supported"), "{err}");

    // Status: the main resource ignores it, the subresource writes only it.
    f.k.ok(&[
        "patch",
        "widget",
        "small",
        "--type=merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ]);
    let w = json(&f.k.ok(&["get", "widget", "small", "-o", "json"]));
    assert!(w["status"].get("ready").is_none(), "{w}");
    f.k.ok(&[
        "patch",
        "widget",
        "small",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ready":true,"replicas":1},"spec":{"size":9}}"#,
    ]);
    let w = json(&f.k.ok(&["get", "widget", "small", "-o", "json"]));
    assert_eq!(w["status"]["ready"], true);
    assert_eq!(w["spec"]["size"], 3, "a status write leaves the spec");
    assert_eq!(
        w["metadata"]["generation"], 1,
        "status writes keep the generation"
    );

    // Scale through the subresource.
    f.k.ok(&["scale", "widget", "small", "--replicas=4"]);
    let w = json(&f.k.ok(&["get", "widget", "small", "-o", "json"]));
    assert_eq!(w["spec"]["replicas"], 4);
    assert_eq!(w["metadata"]["generation"], 2);
    let scale = json(&f.k.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets/small/scale",
    ]));
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 4);
    assert_eq!(scale["status"]["replicas"], 1);

    // A strategic merge patch is refused as Kubernetes refuses it; merge patches work.
    let err = f.k.fails(&[
        "patch",
        "widget",
        "small",
        "--type=strategic",
        "-p",
        r#"{"spec":{"size":4}}"#,
    ]);
    assert!(err.contains("accepted media types include: application/json-patch+json, application/merge-patch+json"), "{err}");

    // Server-side apply owns fields per manager.
    let p = f.file("ssa.yaml", &widget("small", "  size: 3\n  tags: [a, b]\n"));
    f.k.ok(&["apply", "--server-side", "--force-conflicts", "-f", &p]);
    let w = json(&f.k.ok(&[
        "get",
        "widget",
        "small",
        "-o",
        "json",
        "--show-managed-fields",
    ]));
    assert_eq!(w["spec"]["tags"], serde_json::json!(["a", "b"]));
    let managers: Vec<&str> = w["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"kubectl"), "{managers:?}");

    // dryRun stores nothing.
    let p = f.file("dry.yaml", &widget("dry", "  size: 1\n"));
    f.k.ok(&["apply", "--dry-run=server", "-f", &p]);
    f.k.fails(&["get", "widget", "dry"]);
}

fn bad_definitions_are_refused_with_field_paths() {
    let f = start();
    let bad = CRD
        .replace("name: widgets.example.com", "name: gadgets.example.com")
        .replace(
            "enum: [red, blue]",
            "enum: [red, blue]\n                pattern: \"[\"",
        );
    let p = f.file("bad.yaml", &bad);
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(err.contains("metadata.name: Invalid value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group"), "{err}");
    let nogroupdot = CRD
        .replace("widgets.example.com", "widgets.example")
        .replace("group: example.com", "group: example");
    let p = f.file("nodot.yaml", &nogroupdot);
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(
        err.contains("should be a domain with at least one dot"),
        "{err}"
    );
    let untyped = CRD.replace(
        "                type: integer\n                minimum: 1",
        "                minimum: 1",
    );
    let p = f.file("untyped.yaml", &untyped);
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value"), "{err}");
    let webhook = CRD.replace(
        "  versions:\n",
        "  conversion:\n    strategy: Webhook\n  versions:\n",
    );
    let p = f.file("webhook.yaml", &webhook);
    let err = f.k.fails(&["apply", "-f", &p]);
    assert!(
        err.contains("spec.conversion.strategy: Unsupported value: \"Webhook\""),
        "{err}"
    );
    let out = f.k.ok(&["get", "crd", "-o", "name"]);
    assert!(out.trim().is_empty(), "nothing stored: {out}");
}

fn two_versions_and_deletion_cascade() {
    let f = start();
    establish(&f);
    for i in 0..5 {
        let p = f.file(
            &format!("w{i}.yaml"),
            &widget(&format!("w{i}"), "  size: 2\n"),
        );
        f.k.ok(&["apply", "-f", &p]);
    }
    // A second version (conversion None): the same objects, at either version.
    let two = CRD.replace(
        "  versions:\n  - name: v1\n    served: true\n    storage: true\n",
        "  versions:\n  - name: v2\n    served: true\n    storage: false\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n  - name: v1\n    served: true\n    storage: true\n",
    );
    let p = f.file("crd2.yaml", &two);
    f.k.ok(&["apply", "-f", &p]);
    wait_until("v2 is served", Duration::from_secs(30), || {
        let r = f.k.run(&[
            "get",
            "--raw",
            "/apis/example.com/v2/namespaces/default/widgets/w0",
        ]);
        if r.success {
            Ok(())
        } else {
            Err(r.stderr)
        }
    });
    let v2 = json(&f.k.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v2/namespaces/default/widgets/w0",
    ]));
    assert_eq!(v2["apiVersion"], "example.com/v2");
    assert_eq!(v2["spec"]["size"], 2);
    let list = json(&f.k.ok(&["get", "--raw", "/apis/example.com/v1/widgets"]));
    assert_eq!(list["items"].as_array().unwrap().len(), 5);
    assert_eq!(list["items"][0]["apiVersion"], "example.com/v1");
    // v2 is the preferred version (Kubernetes' version priority).
    let group = json(&f.k.ok(&["get", "--raw", "/apis/example.com"]));
    assert_eq!(group["preferredVersion"]["version"], "v2", "{group}");

    // Deleting the definition deletes its objects, then the definition.
    f.k.ok(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    let err = f.k.fails(&["get", "--raw", "/apis/example.com/v1/widgets"]);
    assert!(
        err.contains("NotFound") || err.contains("not found") || err.contains("404"),
        "{err}"
    );
    // Defined again: none of the old objects come back.
    establish(&f);
    let list = json(&f.k.ok(&["get", "--raw", "/apis/example.com/v1/widgets"]));
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
}

fn definitions_survive_a_restart() {
    let mut f = start();
    establish(&f);
    let p = f.file("a.yaml", &widget("a", "  size: 2\n"));
    f.k.ok(&["apply", "-f", &p]);
    f.server.restart();
    // Served from the first request after the restart, not after a controller pass.
    let w = json(&f.k.ok(&["get", "widget", "a", "-o", "json"]));
    assert_eq!(w["spec"]["size"], 2);
}

/// A kind declared in Rust, as operators declare theirs.
#[derive(
    kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, schemars::JsonSchema,
)]
#[kube(
    group = "kube.example.com",
    version = "v1",
    kind = "Gadget",
    namespaced,
    status = "GadgetStatus",
    shortname = "gd",
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#
)]
pub struct GadgetSpec {
    size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(default)]
    parts: Vec<String>,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
pub struct GadgetStatus {
    ready: bool,
}

fn kube_rs_derived_kind_round_trips() {
    use futures::StreamExt;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use kube::runtime::{conditions, wait::await_condition, watcher, WatchStreamExt};
    use kube::CustomResourceExt;

    let f = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(f.server.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &Gadget::crd())
            .await
            .unwrap();
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(
                crds,
                "gadgets.kube.example.com",
                conditions::is_crd_established(),
            ),
        )
        .await
        .expect("established in time")
        .unwrap();

        let gadgets: Api<Gadget> = Api::namespaced(client.clone(), "default");
        let mut events = watcher(gadgets.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        let mut g = Gadget::new(
            "one",
            GadgetSpec {
                size: 3,
                note: None,
                parts: vec![],
            },
        );
        g.spec.note = Some("first".into());
        let created = gadgets.create(&PostParams::default(), &g).await.unwrap();
        assert_eq!(created.spec.size, 3);
        let seen = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the watcher sees the object")
            .unwrap()
            .unwrap();
        assert_eq!(seen.metadata.name.as_deref(), Some("one"));

        // Status through the subresource; server-side apply of the spec.
        gadgets
            .patch_status(
                "one",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"ready": true}})),
            )
            .await
            .unwrap();
        let applied = serde_json::json!({"apiVersion": "kube.example.com/v1", "kind": "Gadget",
            "metadata": {"name": "one"}, "spec": {"size": 4, "parts": ["a"]}});
        let after = gadgets
            .patch(
                "one",
                &PatchParams::apply("gadget-test").force(),
                &Patch::Apply(applied),
            )
            .await
            .unwrap();
        assert_eq!(after.spec.size, 4);
        assert_eq!(after.spec.parts, vec!["a".to_string()]);
        assert!(after.status.unwrap().ready);

        // A second object; a field selector on the name; delete.
        gadgets
            .create(
                &PostParams::default(),
                &Gadget::new(
                    "two",
                    GadgetSpec {
                        size: 1,
                        note: None,
                        parts: vec![],
                    },
                ),
            )
            .await
            .unwrap();
        let one = gadgets
            .list(&ListParams::default().fields("metadata.name=two"))
            .await
            .unwrap();
        assert_eq!(one.items.len(), 1);
        assert_eq!(
            gadgets
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            2
        );
        gadgets
            .delete("one", &DeleteParams::default())
            .await
            .unwrap();
        assert!(gadgets.get_opt("one").await.unwrap().is_none());
    });
    let table = f.k.ok(&["get", "gd"]);
    assert!(table.lines().next().unwrap().contains("SIZE"), "{table}");
}

on_both_stores!(
    sync: definition_validates_prunes_defaults_and_prints,
    kube_rs_derived_kind_round_trips,
    bad_definitions_are_refused_with_field_paths,
    two_versions_and_deletion_cascade,
    definitions_survive_a_restart,
);
