//! The service proxy as a DaemonSet (deploy/proxy.yaml), on one 2-node cluster brought up
//! by the cluster library with `Spec::proxy_daemonset` (the path `cargo xtask up` takes),
//! real kubectl, real containerd, the `skiff/proxy` image from the local registry:
//!
//! 1. a proxy pod Running and Ready on each node, from the ServiceAccount `skiff-proxy`; a
//!    ClusterIP Service reachable from a pod on each node;
//! 2. the proxy's identity is its ServiceAccount: the token the node agent projected into
//!    its pod lists Services and gets 403 for Secrets;
//! 3. a proxy pod deleted is replaced while a client on that node loops through the
//!    ClusterIP: zero failed requests (the pinned maps keep translating meanwhile);
//! 4. `kubectl rollout restart` under a looping client (zero failures), every pod replaced.
//! 5. the template changed (`kubectl set env`) under a looping client: `rollout history`
//!    lists the three templates (ControllerRevisions), `rollout undo` under the client
//!    returns the pods to the previous template (the env var gone) with no failure;
//! 6. `kubectl skiff trace deployment/NAME` (the plugin found by real kubectl on PATH) shows
//!    every step of a new Deployment's path, in order, "programmed" on both nodes (the
//!    proxies' /programmed through pods/proxy).
//!
//! Needs the daemons built and the images in the local registry (`cargo xtask images`,
//! which `cargo xtask test` runs), the proxy's image included.

use serde_json::Value;
use skiff_tests::cluster::proxy_daemonset::NAMESPACE;
use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::e2e::{self, binaries, LoopingClient};
use skiff_tests::kubeconfig::KubeconfigAccess;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_proxy_image, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(180);
const SELECTOR: &str = "k8s-app=skiff-proxy";
const DS: &str = "daemonset/skiff-proxy";

/// A proxy pod as the test sees it.
#[derive(Debug, Clone)]
struct ProxyPod {
    name: String,
    uid: String,
    node: String,
    ready: bool,
    terminating: bool,
    service_account: String,
}

fn proxy_pods(k: &Kubectl) -> Vec<ProxyPod> {
    e2e::json(k, &["get", "pods", "-n", NAMESPACE, "-l", SELECTOR])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            ProxyPod {
                name: s(&p["metadata"]["name"]),
                uid: s(&p["metadata"]["uid"]),
                node: s(&p["spec"]["nodeName"]),
                service_account: s(&p["spec"]["serviceAccountName"]),
                ready: e2e::pod_ready(p),
                terminating: e2e::terminating(p),
            }
        })
        .collect()
}

/// Waits for one Ready, not terminating proxy pod per node, none of them in `not`; by node.
fn wait_proxies(k: &Kubectl, nodes: &[String], not: &[String]) -> BTreeMap<String, ProxyPod> {
    wait_until("a Ready proxy pod on every node", T, || {
        let pods = proxy_pods(k);
        let by_node: BTreeMap<String, ProxyPod> = pods
            .iter()
            .filter(|p| p.ready && !p.terminating && !not.contains(&p.name))
            .map(|p| (p.node.clone(), p.clone()))
            .collect();
        if pods.len() == nodes.len() && nodes.iter().all(|n| by_node.contains_key(n)) {
            Ok(by_node)
        } else {
            Err(pods)
        }
    })
}

fn mark(what: &str, t: Duration) {
    eprintln!("  {what:<60} {:>7.2} s", t.as_secs_f64());
}

/// The token the node agent projected into the proxy pod (its kube-api-access volume).
fn projected_token(c: &Cluster, pod: &ProxyPod) -> String {
    let node = c
        .state()
        .nodes
        .iter()
        .find(|n| n.name == pod.node)
        .expect("the pod's node");
    let dir = node
        .data_dir
        .join("pods")
        .join(&pod.uid)
        .join("volumes/projected");
    let access = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("kube-api-access-")
        })
        .unwrap_or_else(|| panic!("no kube-api-access volume in {}", dir.display()));
    std::fs::read_to_string(access.path().join("token")).expect("the projected token")
}

/// The revision numbers `kubectl rollout history` lists.
fn history(k: &Kubectl) -> Vec<u64> {
    let out = k.ok(&["rollout", "history", DS, "-n", NAMESPACE]);
    out.lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The value of `MARK` in each live proxy pod's spec (None where it is not set).
fn marks(k: &Kubectl) -> Vec<Option<String>> {
    e2e::json(k, &["get", "pods", "-n", NAMESPACE, "-l", SELECTOR])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            p["spec"]["containers"][0]["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == MARK)
                .and_then(|e| e["value"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// An env var only this test sets on the proxy's template.
const MARK: &str = "SKIFF_TEST_REVISION";

fn restarted_at(k: &Kubectl) -> Option<String> {
    e2e::json(k, &["get", DS, "-n", NAMESPACE])["spec"]["template"]["metadata"]["annotations"]
        ["kubectl.kubernetes.io/restartedAt"]
        .as_str()
        .map(str::to_string)
}

/// Runs `change` while a node-level client of node `i` loops through `addr`; asserts that
/// no request failed and that the client kept going.
fn no_failure_while(c: &Cluster, i: usize, addr: &str, what: &str, change: impl FnOnce()) {
    let client = LoopingClient::start(c, i, addr);
    let t = Instant::now();
    change();
    mark(what, t.elapsed());
    let seen = client.finish();
    eprintln!("  looping client: {}", seen.summary);
    assert!(
        seen.failures.is_empty(),
        "failed requests ({what}): {}\n{}",
        seen.summary,
        seen.failures
    );
    assert!(seen.ok > 20, "the client kept going: {}", seen.summary);
}

const TRACE_STEPS: [&str; 10] = [
    "accepted",
    "replicaSetCreated",
    "podCreated",
    "scheduled",
    "sandboxReady",
    "imagePulled",
    "started",
    "ready",
    "inEndpointSlice",
    "programmed",
];

/// Every step has a time, in the path's order; "programmed" once per node.
fn complete_trace(trace: &Value, nodes: &[String]) -> Result<(), String> {
    let steps = trace["steps"].as_array().ok_or("no steps")?;
    let kinds: Vec<&str> = steps.iter().filter_map(|s| s["kind"].as_str()).collect();
    for k in TRACE_STEPS {
        if !kinds.contains(&k) {
            return Err(format!("no step {k}"));
        }
    }
    if let Some(s) = steps.iter().find(|s| s["at"].is_null()) {
        return Err(format!("pending: {s}"));
    }
    for node in nodes {
        if !steps.iter().any(|s| {
            s["kind"] == "programmed"
                && s["detail"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with(&format!("node {node}"))
        }) {
            return Err(format!("not programmed on {node}"));
        }
    }
    Ok(())
}

/// One pod: the steps form one chain, each no earlier than the one before.
fn assert_trace_ordered(trace: &Value) {
    let steps = trace["steps"].as_array().unwrap();
    let order = |s: &Value| TRACE_STEPS.iter().position(|k| s["kind"] == *k).unwrap();
    let ms = |s: &Value| s["sinceAcceptedMs"].as_i64().unwrap();
    assert!(
        steps[0]["kind"] == "accepted" && ms(&steps[0]) == 0,
        "{trace}"
    );
    for w in steps.windows(2) {
        let (prev, s) = (&w[0], &w[1]);
        assert!(
            order(prev) <= order(s),
            "out of the path's order: {prev} then {s}"
        );
        // API times are truncated to the second, the proxies' are not: a step after a
        // proxy's may show the start of that same second.
        let floor = if prev["precision"] == "fine" && s["precision"] == "second" {
            ms(prev) - ms(prev).rem_euclid(1000)
        } else {
            ms(prev)
        };
        assert!(ms(s) >= floor, "{s} before {prev}");
    }
}

#[test]
fn the_proxy_runs_as_a_daemonset() {
    require_proxy_image();
    let lease = subnet::lease();
    let name = unique_name("proxyds");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    spec.own_pod_network(lease.octet());
    spec.proxy_daemonset();
    eprintln!("cluster {name} in {}", dir.display());
    let t_up = Instant::now();
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    mark(
        "cluster up, proxy DaemonSet Ready (2 nodes)",
        t_up.elapsed(),
    );
    let k = c.kubectl();
    let nodes: Vec<String> = c.state().nodes.iter().map(|n| n.name.clone()).collect();

    // 1. One proxy pod per node, Ready, as the ServiceAccount skiff-proxy; no host process.
    let proxies = wait_proxies(&k, &nodes, &[]);
    for p in proxies.values() {
        assert_eq!(p.service_account, "skiff-proxy", "{p:?}");
    }
    assert!(c.state().nodes.iter().all(|n| n.proxy.is_none()));
    let ds = e2e::json(&k, &["get", DS, "-n", NAMESPACE]);
    assert_eq!(ds["status"]["numberReady"], 2, "{}", ds["status"]);
    let t = Instant::now();
    k.ok(&[
        "create",
        "deployment",
        "echo",
        "--image",
        ECHO_IMAGE,
        "--replicas=2",
    ]);
    k.ok(&[
        "expose",
        "deployment",
        "echo",
        "--port=80",
        "--target-port=8080",
    ]);
    let vip = k.ok(&["get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"]);
    e2e::wait_ready(&k, "app=echo", 2, T);
    for (i, node) in nodes.iter().enumerate() {
        e2e::client_pod(
            &k,
            &format!("client-{i}"),
            node,
            &format!("http://{vip}/"),
            20,
            T,
        );
    }
    mark("ClusterIP reachable from a pod on each node", t.elapsed());
    let addr = format!("{vip}:80");

    // 5 (while the cluster is fresh). A new Deployment with one pod behind a Service,
    // answering through the ClusterIP on both nodes, traced by the plugin.
    let t = Instant::now();
    k.ok(&[
        "create",
        "deployment",
        "traced",
        "--image",
        ECHO_IMAGE,
        "--replicas=1",
    ]);
    k.ok(&[
        "expose",
        "deployment",
        "traced",
        "--port=80",
        "--target-port=8080",
    ]);
    e2e::wait_ready(&k, "app=traced", 1, T);
    let traced_vip = k.ok(&[
        "get",
        "service",
        "traced",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    for i in 0..nodes.len() {
        wait_until(
            "the traced service answers through its ClusterIP",
            T,
            || match e2e::probe(&c, i, &format!("{traced_vip}:80"), 3) {
                (_, 0) => Ok(()),
                (names, failed) => Err((names, failed)),
            },
        );
    }
    let trace = wait_until("kubectl skiff trace shows every step", T, || {
        let trace = e2e::skiff_trace(&c, "deployment/traced")?;
        complete_trace(&trace, &nodes).map_err(|e| format!("{e}\n{trace:#}"))?;
        Ok::<_, String>(trace)
    });
    eprintln!("{trace:#}");
    assert_trace_ordered(&trace);
    mark("kubectl skiff trace: every step, both nodes", t.elapsed());

    // 2. The proxy's identity: the token its pod holds.
    let admin = KubeconfigAccess::read(&c.kubeconfig()).unwrap();
    let as_proxy = KubeconfigAccess {
        client: None,
        token: Some(projected_token(&c, &proxies[&nodes[1]])),
        ..admin
    };
    let get = |path: &str| as_proxy.get(path, Duration::from_secs(30)).unwrap();
    assert_eq!(get("/api/v1/services").0, 200);
    assert_eq!(get("/apis/discovery.k8s.io/v1/endpointslices").0, 200);
    let (code, body) = get("/api/v1/secrets");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:kube-system:skiff-proxy"),
        "{body}"
    );

    // 3. The proxy pod of node 2 deleted under a client on node 2: replaced, no failure.
    let old = proxies[&nodes[1]].name.clone();
    no_failure_while(
        &c,
        1,
        &addr,
        "proxy pod deleted -> replaced and Ready",
        || {
            k.ok(&["delete", "pod", "-n", NAMESPACE, &old]);
            wait_proxies(&k, &nodes, std::slice::from_ref(&old));
            c.wait_proxy_daemonset()
                .unwrap_or_else(|e| panic!("after the delete: {e}"));
        },
    );

    // 4. rollout restart under a looping client: every pod replaced, no failure.
    let before: Vec<String> = proxy_pods(&k).into_iter().map(|p| p.name).collect();
    no_failure_while(&c, 0, &addr, "rollout restart of the DaemonSet", || {
        k.ok(&["rollout", "restart", DS, "-n", NAMESPACE]);
        k.ok(&["rollout", "status", DS, "-n", NAMESPACE, "--timeout=180s"]);
        wait_proxies(&k, &nodes, &before);
        c.wait_proxy_daemonset()
            .unwrap_or_else(|e| panic!("after the restart: {e}"));
    });
    assert!(restarted_at(&k).is_some());
    let (_, failed) = e2e::probe(&c, 0, &addr, 20);
    assert_eq!(failed, 0, "the service after the restart");

    // 5. A new template under a looping client, its history, and an undo back.
    let before: Vec<String> = proxy_pods(&k).into_iter().map(|p| p.name).collect();
    no_failure_while(
        &c,
        0,
        &addr,
        "template changed (set env), rolled out",
        || {
            k.ok(&["set", "env", DS, "-n", NAMESPACE, &format!("{MARK}=2")]);
            k.ok(&["rollout", "status", DS, "-n", NAMESPACE, "--timeout=180s"]);
            wait_proxies(&k, &nodes, &before);
            c.wait_proxy_daemonset()
                .unwrap_or_else(|e| panic!("after set env: {e}"));
        },
    );
    assert_eq!(marks(&k), [Some("2".to_string()), Some("2".to_string())]);
    // The manifest's template, the restart's, this one.
    assert_eq!(history(&k), [1, 2, 3]);
    let detail = k.ok(&["rollout", "history", DS, "-n", NAMESPACE, "--revision=3"]);
    assert!(detail.contains(MARK), "{detail}");
    let before: Vec<String> = proxy_pods(&k).into_iter().map(|p| p.name).collect();
    no_failure_while(&c, 1, &addr, "rollout undo of the DaemonSet", || {
        let out = k.ok(&["rollout", "undo", DS, "-n", NAMESPACE]);
        assert!(out.contains("rolled back"), "{out}");
        k.ok(&["rollout", "status", DS, "-n", NAMESPACE, "--timeout=180s"]);
        wait_proxies(&k, &nodes, &before);
        c.wait_proxy_daemonset()
            .unwrap_or_else(|e| panic!("after the undo: {e}"));
    });
    assert_eq!(marks(&k), [None, None]);
    assert!(restarted_at(&k).is_some(), "revision 2's template is back");
    // Revision 2 taken back is renumbered 4, not copied.
    assert_eq!(history(&k), [1, 3, 4]);
}
