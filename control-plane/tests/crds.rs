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

/// A kubectl acting as `user`, with a client certificate from the cluster CA (not
/// impersonation: the request's own identity), in a home of its own.
fn kubectl_as(f: &ServerFixture, user: &str) -> skiff_tests::kubectl::Kubectl {
    use control_plane::apiserver::kubeconfig::{self, Credentials};
    use control_plane::pki::{Ca, CertSpec};
    let pki = f.server.pki_dir();
    let ca = Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).expect("the cluster CA");
    let issued = ca
        .issue(&CertSpec::client(
            user,
            None,
            Duration::from_secs(24 * 3600),
        ))
        .expect("a client certificate");
    let home = f.dir.path().join(user);
    std::fs::create_dir_all(&home).unwrap();
    let path = home.join("kubeconfig");
    kubeconfig::write(
        &path,
        f.server.url(),
        ca.cert_pem(),
        user,
        &Credentials::Certificate(issued),
    )
    .expect("writing the user's kubeconfig");
    skiff_tests::kubectl::Kubectl::new(&path, &home)
}

/// Custom resources are authorized as any kind, by their group and plural: a user with no
/// grant gets Kubernetes' 403; a Role on `widgets` in one namespace lets them read there, and
/// only read, and only there.
fn custom_resources_are_authorized_by_group_and_plural() {
    let f = start();
    establish(&f);
    let p = f.file("small.yaml", &widget("small", "  size: 3\n"));
    f.k.ok(&["apply", "-f", &p]);
    f.k.ok(&["create", "namespace", "other"]);
    let p = f.file("elsewhere.yaml", &widget("elsewhere", "  size: 2\n"));
    f.k.ok(&["apply", "-n", "other", "-f", &p]);
    let jane = kubectl_as(&f, "jane");

    let err = jane.fails(&["get", "widgets"]);
    assert!(
        err.contains(r#"Error from server (Forbidden): widgets.example.com is forbidden: User "jane" cannot list resource "widgets" in API group "example.com" in the namespace "default""#),
        "{err}"
    );
    let err = jane.fails(&["get", "widget", "small"]);
    assert!(
        err.contains(r#"widgets.example.com "small" is forbidden: User "jane" cannot get resource "widgets" in API group "example.com" in the namespace "default""#),
        "{err}"
    );

    f.k.ok(&[
        "create",
        "role",
        "widget-reader",
        "--verb=get,list",
        "--resource=widgets.example.com",
        "-n",
        "default",
    ]);
    f.k.ok(&[
        "create",
        "rolebinding",
        "widget-reader",
        "--role=widget-reader",
        "--user=jane",
        "-n",
        "default",
    ]);
    let names = wait_until("jane may list widgets", Duration::from_secs(30), || {
        let r = jane.run(&["get", "widgets", "-o", "name"]);
        if r.success {
            Ok(r.stdout)
        } else {
            Err(r.stderr)
        }
    });
    assert_eq!(names.trim(), "widget.example.com/small");
    let w = json(&jane.ok(&["get", "widget", "small", "-o", "json"]));
    assert_eq!(w["spec"]["size"], 3);

    // Only what the Role says: no write, no other namespace, not the cluster scope, not the
    // status subresource (kubectl's patch reads it first).
    let err = jane.fails(&["delete", "widget", "small"]);
    assert!(
        err.contains(r#"widgets.example.com "small" is forbidden: User "jane" cannot delete resource "widgets" in API group "example.com" in the namespace "default""#),
        "{err}"
    );
    let err = jane.fails(&["get", "widgets", "-n", "other"]);
    assert!(
        err.contains(r#"widgets.example.com is forbidden: User "jane" cannot list resource "widgets" in API group "example.com" in the namespace "other""#),
        "{err}"
    );
    let err = jane.fails(&["get", "widgets", "--all-namespaces"]);
    assert!(
        err.contains(r#"widgets.example.com is forbidden: User "jane" cannot list resource "widgets" in API group "example.com" at the cluster scope"#),
        "{err}"
    );
    let err = jane.fails(&[
        "patch",
        "widget",
        "small",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ]);
    assert!(
        err.contains(r#"widgets.example.com "small" is forbidden: User "jane" cannot get resource "widgets/status" in API group "example.com" in the namespace "default""#),
        "{err}"
    );
    f.k.ok(&["get", "widget", "small"]);
}

/// A raw request as the admin: status code, Warning headers, body.
async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> (u16, Vec<String>, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        code,
        warnings,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// The machinery of built-in kinds on custom resources: a JSON patch (applied, and a 422 with
/// the field path when its result breaks the schema), fieldValidation=Warn (a Warning per
/// unknown field, which is pruned), and the 422 a typed client sees for an invalid object.
fn json_patch_field_validation_warn_and_422_on_custom_resources() {
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let f = start();
    establish(&f);
    let p = f.file("small.yaml", &widget("small", "  size: 3\n"));
    f.k.ok(&["apply", "-f", &p]);
    const PATH: &str = "/apis/example.com/v1/namespaces/default/widgets";
    const JSON_PATCH: &str = "application/json-patch+json";

    // kubectl's JSON patch.
    f.k.ok(&[
        "patch",
        "widget",
        "small",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/size","value":4},{"op":"add","path":"/spec/tags","value":["x"]}]"#,
    ]);
    let w = json(&f.k.ok(&["get", "widget", "small", "-o", "json"]));
    assert_eq!(
        (w["spec"]["size"].clone(), w["spec"]["tags"].clone()),
        (serde_json::json!(4), serde_json::json!(["x"])),
        "{w}"
    );
    assert_eq!(w["metadata"]["generation"], 2);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(f.server.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();

        // A JSON patch on the wire: applied; its `test` guards it.
        let (code, _, w) = raw(
            &client,
            "PATCH",
            &format!("{PATH}/small"),
            JSON_PATCH,
            serde_json::json!([{"op": "test", "path": "/spec/size", "value": 4},
                {"op": "replace", "path": "/spec/color", "value": "red"}]),
        )
        .await;
        assert_eq!(code, 200, "{w}");
        assert_eq!(w["spec"]["color"], "red");
        // A result the schema refuses: 422 Invalid, the field path in the causes; nothing
        // stored.
        let (code, _, s) = raw(
            &client,
            "PATCH",
            &format!("{PATH}/small"),
            JSON_PATCH,
            serde_json::json!([{"op": "replace", "path": "/spec/size", "value": 20}]),
        )
        .await;
        assert_eq!(code, 422, "{s}");
        assert_eq!((s["kind"].as_str(), s["reason"].as_str(), s["code"].as_i64()), (Some("Status"), Some("Invalid"), Some(422)), "{s}");
        assert!(
            s["message"].as_str().unwrap().contains(
                "spec.size: Invalid value: 20: spec.size in body should be less than or equal to 10"
            ),
            "{s}"
        );
        let causes = s["details"]["causes"].as_array().unwrap();
        assert!(causes.iter().any(|c| c["field"] == "spec.size"), "{s}");
        let (_, _, w) = raw(&client, "GET", &format!("{PATH}/small"), "application/json", Value::Null).await;
        assert_eq!(w["spec"]["size"], 4, "the refused patch stored nothing");
        // A patch that does not apply (its `test` fails) is a 422 as in Kubernetes.
        let (code, _, s) = raw(
            &client,
            "PATCH",
            &format!("{PATH}/small"),
            JSON_PATCH,
            serde_json::json!([{"op": "test", "path": "/spec/size", "value": 5}]),
        )
        .await;
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{s}");

        // fieldValidation=Warn: created, one Warning per unknown field, the fields pruned.
        let body = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "warned", "labels": {"a": "b"}},
            "spec": {"size": 2, "flavor": "sweet", "shape": "round"}});
        let (code, warnings, w) = raw(
            &client,
            "POST",
            &format!("{PATH}?fieldValidation=Warn"),
            "application/json",
            body.clone(),
        )
        .await;
        assert_eq!(code, 201, "{w}");
        assert_eq!(
            warnings,
            [
                r#"299 - "unknown field \"spec.flavor\"""#,
                r#"299 - "unknown field \"spec.shape\"""#
            ],
        );
        assert!(w["spec"].get("flavor").is_none() && w["spec"].get("shape").is_none(), "{w}");
        assert_eq!(w["spec"]["size"], 2);
        // Ignore: the same, silently; Strict: a 400 naming them.
        let mut quiet = body.clone();
        quiet["metadata"]["name"] = "quiet".into();
        let (code, warnings, _) = raw(&client, "POST", &format!("{PATH}?fieldValidation=Ignore"), "application/json", quiet).await;
        assert_eq!((code, warnings.len()), (201, 0));
        let mut strict = body.clone();
        strict["metadata"]["name"] = "strict".into();
        let (code, _, s) = raw(&client, "POST", &format!("{PATH}?fieldValidation=Strict"), "application/json", strict).await;
        assert_eq!(code, 400, "{s}");
        assert!(s["message"].as_str().unwrap().contains(r#"unknown field "spec.flavor""#), "{s}");
        // A merge patch under Warn says so as well.
        let (code, warnings, w) = raw(
            &client,
            "PATCH",
            &format!("{PATH}/warned?fieldValidation=Warn"),
            "application/merge-patch+json",
            serde_json::json!({"spec": {"size": 3, "weight": 1}}),
        )
        .await;
        assert_eq!(code, 200, "{w}");
        assert_eq!(warnings, [r#"299 - "unknown field \"spec.weight\"""#]);
        assert!(w["spec"].get("weight").is_none(), "{w}");

        // Built-in kinds warn the same way; Warn is the default when a client says nothing.
        let (code, warnings, cm) = raw(
            &client,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "nmae": "x"}, "data": {"a": "b"}}),
        )
        .await;
        assert_eq!(code, 201, "{cm}");
        assert_eq!(warnings, [r#"299 - "unknown field \"metadata.nmae\"""#]);

        // The typed client: an invalid object is a 422 Invalid with the field path.
        let ar = ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
        let bad = DynamicObject::new("bad", &ar).data(serde_json::json!({"spec": {"size": 0, "color": "green"}}));
        let err = widgets.create(&PostParams::default(), &bad).await.unwrap_err();
        let kube::Error::Api(status) = err else {
            panic!("not an API error: {err}")
        };
        assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{status:?}");
        assert!(status.message.contains("spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"), "{status:?}");
        let fields: Vec<String> = status
            .details
            .map(|d| d.causes)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert!(fields.contains(&"spec.size".to_string()) && fields.contains(&"spec.color".to_string()), "{fields:?}");
        assert!(widgets.get_opt("bad").await.unwrap().is_none());
    });

    // What a kubectl user sees under --validate=warn.
    let p = f.file(
        "extra.yaml",
        &widget("extra", "  size: 2\n  flavor: sweet\n"),
    );
    let r = f.k.run(&["create", "--validate=warn", "-f", &p]);
    assert!(r.success, "{r:?}");
    assert!(
        r.stderr.contains(r#"Warning: unknown field "spec.flavor""#),
        "{r:?}"
    );
}

on_both_stores!(
    sync: definition_validates_prunes_defaults_and_prints,
    kube_rs_derived_kind_round_trips,
    bad_definitions_are_refused_with_field_paths,
    two_versions_and_deletion_cascade,
    definitions_survive_a_restart,
    custom_resources_are_authorized_by_group_and_plural,
    json_patch_field_validation_warn_and_422_on_custom_resources,
);
