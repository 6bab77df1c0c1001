//! What real manifests and kubectl's troubleshooting commands expect of the API machinery,
//! with the real kubectl (1.33, picked by the dispatcher from /version) against a real
//! `control-plane apiserver` process: server-side apply with managed fields and conflicts,
//! OpenAPI v2, and the places where the server must answer exactly as Kubernetes does.

use serde_json::Value;
use skiff_tests::kubectl::ServerFixture;

fn start() -> ServerFixture {
    ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &[])
}

/// `kubectl get ARGS -o json --show-managed-fields`, parsed.
fn get_json(f: &ServerFixture, args: &[&str]) -> Value {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json", "--show-managed-fields"]);
    let out = f.k.ok(&a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn manager<'v>(obj: &'v Value, name: &str) -> Option<&'v Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == name)
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
";

#[test]
fn server_side_apply_conflicts_force_and_managed_fields() {
    let f = start();
    f.k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=2",
    ]);
    let d = get_json(&f, &["deploy", "web"]);
    let created = manager(&d, "kubectl-create").expect("kubectl create's entry");
    assert_eq!(created["operation"], "Update");
    assert_eq!(created["apiVersion"], "apps/v1");
    assert!(created["fieldsV1"]["f:spec"]["f:replicas"].is_object());

    // Another manager changing replicas: 409, printed as Kubernetes prints it.
    let p = f.file("web.yaml", DEPLOYMENT);
    let r = f.k.run(&["apply", "--server-side", "-f", &p]);
    assert!(!r.success, "{r:?}");
    assert!(
        r.stderr.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using apps/v1: .spec.replicas"
        ),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--force-conflicts"), "{}", r.stderr);
    assert_eq!(
        get_json(&f, &["deploy", "web"])["spec"]["replicas"],
        2,
        "nothing written"
    );

    // Forced: kubectl (Apply) owns replicas now, kubectl-create no longer does.
    let out =
        f.k.ok(&["apply", "--server-side", "--force-conflicts", "-f", &p]);
    assert!(out.contains("serverside-applied"), "{out}");
    let d = get_json(&f, &["deploy", "web"]);
    assert_eq!(d["spec"]["replicas"], 3);
    let applied = manager(&d, "kubectl").expect("kubectl's Apply entry");
    assert_eq!(applied["operation"], "Apply");
    assert!(applied["fieldsV1"]["f:spec"]["f:replicas"].is_object());
    let created = manager(&d, "kubectl-create").unwrap();
    assert!(created["fieldsV1"]["f:spec"].get("f:replicas").is_none());

    // kubectl hides managedFields unless asked.
    let plain = f.k.ok(&["get", "deploy", "web", "-o", "yaml"]);
    assert!(!plain.contains("managedFields"), "{plain}");
    let shown = f.k.ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "yaml",
        "--show-managed-fields",
    ]);
    assert!(
        shown.contains("managedFields:") && shown.contains("operation: Apply"),
        "{shown}"
    );

    // A label the applier adds, then drops, goes away; replicas it stops applying too.
    let labelled = DEPLOYMENT.replace("  name: web\n", "  name: web\n  labels: {team: a}\n");
    f.k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &f.file("web.yaml", &labelled),
    ]);
    assert_eq!(
        get_json(&f, &["deploy", "web"])["metadata"]["labels"]["team"],
        "a"
    );
    let without = DEPLOYMENT.replace("  replicas: 3\n", "");
    f.k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &f.file("web.yaml", &without),
    ]);
    let d = get_json(&f, &["deploy", "web"]);
    assert!(
        d["metadata"]
            .get("labels")
            .is_none_or(|l| l.get("team").is_none()),
        "{d}"
    );
    assert_eq!(
        d["spec"]["replicas"], 1,
        "dropped, then defaulted as Kubernetes does"
    );

    // kubectl scale takes replicas over as an update through the scale subresource.
    f.k.ok(&["scale", "deploy", "web", "--replicas=4"]);
    let d = get_json(&f, &["deploy", "web"]);
    let scale = d["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["subresource"] == "scale")
        .expect("an entry for the scale subresource");
    assert_eq!(
        scale["fieldsV1"],
        serde_json::json!({"f:spec": {"f:replicas": {}}})
    );
}

#[test]
fn an_unknown_kind_is_no_match_and_openapi_v2_answers() {
    let f = start();
    let p = f.file(
        "widget.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec: {}\n",
    );
    let r = f.k.run(&["apply", "-f", &p]);
    assert!(!r.success);
    assert!(
        r.stderr
            .contains("no matches for kind \"Widget\" in version \"example.com/v1\""),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("ensure CRDs are installed first"),
        "{}",
        r.stderr
    );
    let v2: Value = serde_json::from_str(&f.k.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    assert_eq!(v2["swagger"], "2.0");
    assert!(v2["definitions"]["io.k8s.api.apps.v1.Deployment"].is_object());
}

#[test]
fn diff_of_an_unchanged_object_shows_nothing_and_configmaps_have_no_generation() {
    let f = start();
    f.k.ok(&["create", "configmap", "c", "--from-literal=a=1"]);
    let live = f.k.ok(&["get", "configmap", "c", "-o", "yaml"]);
    assert!(!live.contains("generation"), "{live}");
    // kubectl diff sends `annotations: {}` for an object without last-applied state:
    // Kubernetes stores no empty map, so the diff is empty (exit 0).
    let p = f.file("c.yaml", &live);
    let r = f.k.run(&["diff", "-f", &p]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    // A data change is no generation either; a Deployment's spec change is.
    f.k.ok(&["patch", "configmap", "c", "-p", r#"{"data":{"a":"2"}}"#]);
    assert!(get_json(&f, &["configmap", "c"])["metadata"]
        .get("generation")
        .is_none());
    f.k.ok(&["create", "deployment", "d", "--image=nginx"]);
    f.k.ok(&["set", "image", "deployment/d", "nginx=nginx:2"]);
    assert_eq!(get_json(&f, &["deploy", "d"])["metadata"]["generation"], 2);
}

#[test]
fn services_ip_families_dry_run_allocations_and_undecodable_bodies() {
    let f = start();
    // An IPv6 Service on this IPv4-only cluster is refused, as Kubernetes refuses it.
    let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  ipFamilies: [IPv6]\n  ports:\n  - port: 80\n";
    let r = f.k.run(&["create", "-f", &f.file("s.yaml", svc)]);
    assert!(!r.success);
    assert!(
        r.stderr.contains(
            "The Service \"s\" is invalid: spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"
        ),
        "{}",
        r.stderr
    );
    let dual = svc.replace("ipFamilies: [IPv6]", "ipFamilyPolicy: RequireDualStack");
    let r = f.k.run(&["create", "-f", &f.file("s.yaml", &dual)]);
    assert!(
        r.stderr
            .contains("this cluster is not configured for dual-stack services"),
        "{}",
        r.stderr
    );
    let single = svc.replace(
        "ipFamilies: [IPv6]",
        "ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: SingleStack",
    );
    let r = f.k.run(&["create", "-f", &f.file("s.yaml", &single)]);
    assert!(
        r.stderr.contains("must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"),
        "{}",
        r.stderr
    );

    // The other differences from Kubernetes' validation found by going through it kind by
    // kind: each refused with Kubernetes' words.
    for (name, manifest, message) in [
        (
            "etp.yaml",
            svc.replace("ipFamilies: [IPv6]", "externalTrafficPolicy: Local"),
            "spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services",
        ),
        (
            "headless.yaml",
            svc.replace("ipFamilies: [IPv6]", "type: NodePort\n  clusterIP: None"),
            "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services",
        ),
        (
            "hostnet.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: h\nspec:\n  hostNetwork: true\n  containers:\n  - name: c\n    image: i\n    ports:\n    - {containerPort: 80, hostPort: 81}\n".to_string(),
            "spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true",
        ),
        (
            "resource.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: r\nspec:\n  containers:\n  - name: c\n    image: i\n    resources: {limits: {foo: \"1\"}}\n".to_string(),
            "spec.containers[0].resources.limits[foo]: Invalid value: \"foo\": must be a standard resource for containers",
        ),
    ] {
        let r = f.k.run(&["create", "-f", &f.file(name, &manifest)]);
        assert!(!r.success && r.stderr.contains(message), "{name}: {}", r.stderr);
    }

    // A server-side dry run shows the cluster IP and node port it would allocate, keeps none.
    let out = f.k.ok(&[
        "create",
        "service",
        "nodeport",
        "np",
        "--tcp=80",
        "--dry-run=server",
        "-o",
        "json",
    ]);
    let dry: Value = serde_json::from_str(&out).unwrap();
    assert!(
        dry["spec"]["clusterIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.")),
        "{dry}"
    );
    assert!(
        dry["spec"]["ports"][0]["nodePort"].as_u64().is_some(),
        "{dry}"
    );
    f.k.fails(&["get", "service", "np"]);

    // A body that does not decode is 400 BadRequest naming the field, not 422.
    let secret =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bad\ndata:\n  key: not-base64!\n";
    let r = f.k.run(&["create", "-f", &f.file("secret.yaml", secret)]);
    assert!(
        r.stderr.contains("Error from server (BadRequest)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("Secret in version \"v1\" cannot be handled as a Secret: data.key:"),
        "{}",
        r.stderr
    );
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\ndata: [a, b]\n";
    let r =
        f.k.run(&["create", "-f", &f.file("cm.yaml", cm), "--validate=false"]);
    assert!(
        r.stderr.contains("Error from server (BadRequest)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("data: invalid type: sequence"),
        "{}",
        r.stderr
    );
}

#[test]
fn kubectl_debug_adds_an_ephemeral_container_through_its_subresource() {
    let f = start();
    f.k.ok(&["run", "p", "--image=nginx:1.27"]);
    // kubectl debug patches pods/p/ephemeralcontainers (kubectl crashed on the 404 before).
    let r =
        f.k.run(&["debug", "p", "--image=busybox", "--target=p", "--", "sh"]);
    assert!(r.success, "{}{}", r.stdout, r.stderr);
    let pod = get_json(&f, &["pod", "p"]);
    let eph = &pod["spec"]["ephemeralContainers"][0];
    assert_eq!(eph["image"], "busybox");
    assert_eq!(eph["targetContainerName"], "p");
    assert_eq!(
        eph["terminationMessagePath"], "/dev/termination-log",
        "defaulted"
    );
    // A target that is not one of the pod's containers is refused as Kubernetes refuses it.
    let r =
        f.k.run(&["debug", "p", "--image=busybox", "--target=nope", "--", "sh"]);
    assert!(!r.success);
    assert!(
        r.stderr
            .contains("targetContainerName: Not found: \"nope\""),
        "{}",
        r.stderr
    );
    // Existing ephemeral containers are never removed, through the subresource or the pod.
    let r = f.k.run(&[
        "patch",
        "pod",
        "p",
        "--subresource=ephemeralcontainers",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/ephemeralContainers/0"}]"#,
    ]);
    assert!(r.stderr.contains("may not be removed"), "{}", r.stderr);
    f.k.ok(&[
        "patch",
        "pod",
        "p",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/ephemeralContainers"}]"#,
    ]);
    assert_eq!(
        get_json(&f, &["pod", "p"])["spec"]["ephemeralContainers"][0]["image"],
        "busybox"
    );
}
