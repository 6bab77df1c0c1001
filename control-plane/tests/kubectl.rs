//! The real kubectl (the installed dispatcher picks kubectl 1.33 from /version) against a real
//! `control-plane apiserver` process: every command the issue lists, checked on what kubectl
//! prints and on what the server stored.

mod api_support;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::Value;
use skiff_tests::kubectl::ServerFixture;
use skiff_tests::wait_until;

fn start() -> ServerFixture {
    let mut args = vec!["--bookmark-interval".to_string(), "1".into()];
    args.extend(api_support::server_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &args)
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The header row of a table kubectl printed.
fn header(out: &str) -> Vec<String> {
    out.lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: site
  labels: {app: site}
spec:
  replicas: 2
  selector:
    matchLabels: {app: site}
  template:
    metadata:
      labels: {app: site}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports:
        - containerPort: 80
";

fn version_discovery_and_explain() {
    let f = start();
    let v = json(&f.k.ok(&["version", "-o", "json"]));
    assert_eq!(v["serverVersion"]["minor"], "33");
    assert_eq!(
        v["clientVersion"]["minor"], "33",
        "the dispatcher runs kubectl 1.33"
    );
    let res = f.k.ok(&["api-resources"]);
    for line in [
        "pods ",
        "deployments ",
        "endpointslices ",
        "leases ",
        "events ",
    ] {
        assert!(res.contains(line), "{line} missing from:\n{res}");
    }
    assert!(res
        .lines()
        .any(|l| l.starts_with("pods") && l.contains(" po ")));
    // `kubectl explain` reads the schemas of the OpenAPI v3 documents, descriptions included.
    let explained = f.k.ok(&["explain", "deployment.spec.replicas"]);
    assert!(
        explained.contains("FIELD: replicas <integer>")
            && explained.contains("Number of desired pods"),
        "{explained}"
    );
    let explained = f.k.ok(&["explain", "pods.spec.containers.ports"]);
    assert!(explained.contains("<[]ContainerPort>"), "{explained}");
    let explained = f.k.ok(&["explain", "endpointslices"]);
    assert!(
        explained.contains("GROUP:      discovery.k8s.io"),
        "{explained}"
    );
}

fn create_scale_label_annotate_describe_and_delete_a_deployment() {
    let f = start();
    // create deployment sends protobuf.
    f.k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=3",
    ]);
    let d = json(&f.k.ok(&["get", "deployment", "web", "-o", "json"]));
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    assert_eq!(
        d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%",
        "defaulted"
    );
    assert_eq!(d["spec"]["revisionHistoryLimit"], 10);

    let table = f.k.ok(&["get", "deployments"]);
    assert_eq!(
        header(&table),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    let wide = f.k.ok(&["get", "deployments", "-o", "wide"]);
    assert!(header(&wide).contains(&"IMAGES".to_string()), "{wide}");
    assert!(wide.contains("nginx:1.27"), "{wide}");

    f.k.ok(&["scale", "deployment", "web", "--replicas=5"]);
    f.k.ok(&["label", "deployment", "web", "tier=frontend"]);
    f.k.ok(&["annotate", "deployment", "web", "note=hello"]);
    let d = json(&f.k.ok(&["get", "deploy", "web", "-o", "json"]));
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["labels"]["tier"], "frontend");
    assert_eq!(d["metadata"]["annotations"]["note"], "hello");
    let yaml = f.k.ok(&["get", "deploy", "web", "-o", "yaml"]);
    assert!(yaml.contains("replicas: 5"), "{yaml}");
    let by_label =
        f.k.ok(&["get", "deploy", "-l", "tier=frontend", "-o", "name"]);
    assert_eq!(by_label.trim(), "deployment.apps/web");

    let described = f.k.ok(&["describe", "deployment", "web"]);
    assert!(
        described.contains("Name:") && described.contains("web"),
        "{described}"
    );
    assert!(described.contains("nginx:1.27"), "{described}");

    f.k.ok(&["delete", "deployment", "web"]);
    let err = f.k.fails(&["get", "deployment", "web"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
}

fn apply_creates_then_updates_and_delete_f_removes() {
    let f = start();
    let path = f.dir.path().join("site.yaml");
    std::fs::write(&path, DEPLOYMENT).unwrap();
    let p = path.to_str().unwrap();
    let out = f.k.ok(&["apply", "-f", p]);
    assert!(out.contains("created"), "{out}");
    std::fs::write(
        &path,
        DEPLOYMENT
            .replace("nginx:1.27", "nginx:1.28")
            .replace("replicas: 2", "replicas: 4"),
    )
    .unwrap();
    let out = f.k.ok(&["apply", "-f", p]);
    assert!(out.contains("configured"), "{out}");
    let d = json(&f.k.ok(&["get", "deploy", "site", "-o", "json"]));
    assert_eq!(d["spec"]["replicas"], 4);
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "strategic merge kept one container");
    assert_eq!(containers[0]["image"], "nginx:1.28");
    assert_eq!(d["metadata"]["generation"], 2);
    // Unchanged apply changes nothing.
    let out = f.k.ok(&["apply", "-f", p]);
    assert!(out.contains("unchanged"), "{out}");
    f.k.ok(&["delete", "-f", p]);
    f.k.fails(&["get", "deploy", "site"]);
}

fn expose_assigns_a_cluster_ip_and_tables_have_kubernetes_columns() {
    let f = start();
    f.k.ok(&["create", "deployment", "web", "--image=nginx:1.27"]);
    f.k.ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ]);
    let svc = json(&f.k.ok(&["get", "svc", "web", "-o", "json"]));
    let ip = svc["spec"]["clusterIP"].as_str().unwrap();
    assert!(ip.starts_with("10."), "{ip}");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let table = f.k.ok(&["get", "services"]);
    assert_eq!(
        header(&table),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    assert!(table.contains(ip), "{table}");

    for (what, want) in [
        ("namespaces", vec!["NAME", "STATUS", "AGE"]),
        ("pods", vec!["No"]),
        ("nodes", vec!["No"]),
        ("endpoints", vec!["No"]),
        ("replicasets", vec!["No"]),
    ] {
        let out = f.k.run(&["get", what]);
        assert!(out.success, "{what}: {}", out.stderr);
        let got = if out.stdout.is_empty() {
            out.stderr
        } else {
            out.stdout
        };
        assert_eq!(header(&got)[..want.len()], want[..], "{what}: {got}");
    }
}

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","labels":{"app":"p"}},
"spec":{"nodeName":"node-a","terminationGracePeriodSeconds":30,"containers":[{"name":"c","image":"busybox"}]}}"#;

fn pods_events_watch_and_graceful_delete() {
    let f = start();
    f.k.run_with_stdin(&["apply", "-f", "-"], POD);
    let pods = f.k.ok(&["get", "pods", "-o", "wide"]);
    let h = header(&pods);
    assert_eq!(h[..5], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert!(
        h.contains(&"NODE".to_string()) && h.contains(&"IP".to_string()),
        "{pods}"
    );
    assert!(pods.contains("node-a"), "{pods}");

    // Events, sorted by creation, with the object on each row.
    let uid = json(&f.k.ok(&["get", "pod", "p1", "-o", "json"]))["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    for (i, reason) in ["Scheduled", "Pulling", "Started"].iter().enumerate() {
        let ev = format!(
            r#"{{"apiVersion":"v1","kind":"Event","metadata":{{"name":"p1.{i}"}},
            "involvedObject":{{"kind":"Pod","name":"p1","namespace":"default","uid":"{uid}"}},
            "reason":"{reason}","message":"m{i}","type":"Normal","count":1}}"#
        );
        let r = f.k.run_with_stdin(&["create", "-f", "-"], &ev);
        assert!(r.success, "{}", r.stderr);
    }
    let events =
        f.k.ok(&["get", "events", "--sort-by=.metadata.creationTimestamp"]);
    assert!(
        events.contains("Scheduled") && events.contains("Started"),
        "{events}"
    );
    let described = f.k.ok(&["describe", "pod", "p1"]);
    assert!(
        described.contains("Events:") && described.contains("Pulling"),
        "{described}"
    );

    // A watch sees a label change.
    let mut w = f.k.spawn(&["get", "pods", "-w", "--output-watch-events"]);
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let header_line = lines.next().unwrap().unwrap();
    assert!(header_line.contains("STATUS"), "{header_line}");
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("ADDED") && first.contains("p1"), "{first}");
    f.k.ok(&["label", "pod", "p1", "x=y"]);
    let next = lines.next().unwrap().unwrap();
    assert!(next.contains("MODIFIED") && next.contains("p1"), "{next}");
    let _ = w.kill();
    let _ = w.wait();

    // Graceful delete: kubectl waits until the node agent (here: the test) finishes it.
    let mut del = f.k.spawn(&["delete", "pod", "p1", "--timeout=60s"]);
    wait_until(
        "the pod is marked for deletion",
        Duration::from_secs(20),
        || {
            let p = json(&f.k.ok(&["get", "pod", "p1", "-o", "json"]));
            p["metadata"]["deletionTimestamp"]
                .as_str()
                .map(str::to_string)
                .ok_or(p)
        },
    );
    f.k.ok(&[
        "delete",
        "pod",
        "p1",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let status = del.wait().unwrap();
    assert!(
        status.success(),
        "kubectl delete ended when the pod was gone"
    );
    f.k.fails(&["get", "pod", "p1"]);
}

fn edit_via_patch_and_bad_requests_get_statuses() {
    let f = start();
    f.k.ok(&["create", "configmap", "cm", "--from-literal=a=b"]);
    f.k.ok(&["patch", "configmap", "cm", "-p", r#"{"data":{"a":"c"}}"#]);
    f.k.ok(&[
        "patch",
        "configmap",
        "cm",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/data/d","value":"e"}]"#,
    ]);
    let cm = json(&f.k.ok(&["get", "cm", "cm", "-o", "json"]));
    assert_eq!(
        (cm["data"]["a"].as_str(), cm["data"]["d"].as_str()),
        (Some("c"), Some("e"))
    );
    let err =
        f.k.fails(&["create", "deployment", "Bad_Name", "--image=x"]);
    assert!(err.contains("Invalid") || err.contains("invalid"), "{err}");
    let err = f.k.fails(&[
        "get",
        "pods",
        "-n",
        "nope",
        "--field-selector",
        "spec.bogus=x",
    ]);
    assert!(err.contains("field label not supported"), "{err}");
}

on_both_stores!(sync: version_discovery_and_explain, create_scale_label_annotate_describe_and_delete_a_deployment, apply_creates_then_updates_and_delete_f_removes, expose_assigns_a_cluster_ip_and_tables_have_kubernetes_columns, pods_events_watch_and_graceful_delete, edit_via_patch_and_bad_requests_get_statuses);
