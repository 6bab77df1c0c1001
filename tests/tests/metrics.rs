//! Resource metrics end to end on a cluster of two nodes (the library `cargo xtask up`
//! uses: the control plane and node agents as processes, real containerd) with the real
//! kubectl: `kubectl top nodes` lists both nodes; `kubectl top pods` shows a pod burning CPU
//! above an idle one; `--containers`, `-A` and label selectors; the `view` role (through
//! system:aggregated-metrics-reader) may read metrics, an unprivileged user gets 403. On the
//! same cluster, the HorizontalPodAutoscaler: the real `kubectl autoscale deployment`, a
//! memory target, a pod holding memory above it: the Deployment is scaled to the count
//! Kubernetes' formula gives for the utilization the HPA reported, `kubectl get hpa` shows
//! the target, and the SuccessfulRescale Event says why. Then on CPU, both ways: a
//! Deployment left on kubectl's CPU target, its pod made to burn CPU on demand: the HPA
//! scales it up, and back down to one replica once the load stops (a scale-down
//! stabilization window of 0 instead of 5 minutes), with a SuccessfulRescale Event each way.
//! The control plane syncs HPAs and scrapes the node agents every 5 s (15 s by default) to
//! keep this short.
//!
//! Needs the daemons built (`cargo build -p control-plane -p node -p proxy`, which
//! `cargo xtask test` does) and the images in the local registry (`cargo xtask images`).

use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::e2e::binaries;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::collections::BTreeMap;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Node agents sample every 10 s and the API server scrapes every 5 s here: a figure that
/// moves shows within a minute on an idle machine; loaded CI machines get more.
const T: Duration = Duration::from_secs(180);

/// `kubectl top ... --no-headers` rows as their columns.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .filter(|r: &Vec<String>| !r.is_empty())
        .collect()
}

/// Millicores from `kubectl top`'s CPU column (`125m`, or whole cores `2`).
fn millicores(cpu: &str) -> Option<u64> {
    match cpu.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => cpu.parse::<u64>().ok().map(|c| c * 1000),
    }
}

/// kubectl as `user` (a client certificate of the cluster CA) against this cluster's API
/// server (`control-plane kubeconfig` writes the default address: this test's is another).
fn kubectl_as(c: &Cluster, user: &str, scratch: &std::path::Path) -> Kubectl {
    let path = c.user_kubeconfig(user, None).unwrap();
    let admin = std::fs::read_to_string(c.kubeconfig()).unwrap();
    let server = admin
        .lines()
        .find(|l| l.trim_start().starts_with("server:"))
        .expect("the admin kubeconfig names its server");
    let text: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                server.to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    Kubectl::new(&path, &scratch.join(user))
}

fn create_pod(k: &Kubectl, name: &str, node: &str, containers: serde_json::Value) {
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": containers}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &manifest.to_string());
    assert!(r.success, "creating {name}: {}", r.stderr);
}

#[test]
fn kubectl_top_shows_nodes_pods_and_containers() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("top");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    // kube-controller-manager's and metrics-server's flags, shorter than their defaults.
    spec.control_plane_args.extend([
        "--horizontal-pod-autoscaler-sync-period=5s".to_string(),
        "--metric-resolution=5".to_string(),
    ]);
    eprintln!("cluster {name} in {}", dir.display());
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl();
    let (node1, node2) = (
        c.state().nodes[0].name.clone(),
        c.state().nodes[1].name.clone(),
    );

    // The burner fetches from its own server in a loop; the idle pod sleeps, on the other
    // node (so both nodes have pods in their cgroups).
    create_pod(
        &k,
        "burn",
        &node1,
        serde_json::json!([
            {"name": "web", "image": ECHO_IMAGE},
            {"name": "burner", "image": ECHO_IMAGE,
             "command": ["/echo", "fetch", "http://127.0.0.1:8080/", "--count", "1000000000"]}
        ]),
    );
    create_pod(
        &k,
        "idle",
        &node2,
        serde_json::json!([{"name": "sleep", "image": ECHO_IMAGE,
                            "command": ["/echo", "sleep", "0"]}]),
    );
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/burn",
        "pod/idle",
        "--timeout=120s",
    ]);

    // Discovery lists the group at v1beta1, as kubectl top looks for it.
    let groups = k.ok(&["api-versions"]);
    assert!(groups.contains("metrics.k8s.io/v1beta1"), "{groups}");

    let nodes = wait_until("kubectl top nodes shows both nodes", T, || {
        let r = k.run(&["top", "nodes", "--no-headers"]);
        let rows = rows(&r.stdout);
        let known = |n: &str| {
            rows.iter()
                .any(|r| r[0] == n && r.len() >= 5 && millicores(&r[1]).is_some())
        };
        if r.success && known(&node1) && known(&node2) {
            Ok(rows)
        } else {
            Err(format!("{}{}", r.stdout, r.stderr))
        }
    });
    assert_eq!(nodes.len(), 2, "{nodes:?}");

    let cpu = wait_until("the burner's CPU above the idle pod's", T, || {
        let r = k.run(&["top", "pods", "--no-headers"]);
        let cpu: BTreeMap<String, u64> = rows(&r.stdout)
            .into_iter()
            .filter_map(|r| Some((r.first()?.clone(), millicores(r.get(1)?)?)))
            .collect();
        match (cpu.get("burn"), cpu.get("idle")) {
            (Some(&b), Some(&i)) if b > i && b >= 20 => Ok(cpu),
            _ => Err(format!("{}{}", r.stdout, r.stderr)),
        }
    });
    eprintln!("CPU (millicores): {cpu:?}");

    // Per container: both of the burner's, each with CPU and memory.
    let containers = rows(&k.ok(&["top", "pod", "burn", "--containers", "--no-headers"]));
    let mut names: Vec<&str> = containers.iter().map(|r| r[1].as_str()).collect();
    names.sort();
    assert_eq!(names, ["burner", "web"], "{containers:?}");
    assert!(containers
        .iter()
        .all(|r| r[0] == "burn" && millicores(&r[2]).is_some() && r[3].ends_with("Mi")));

    // Every namespace; a label selector.
    let all = k.ok(&["top", "pods", "-A", "--no-headers"]);
    assert!(
        rows(&all)
            .iter()
            .any(|r| r[0] == "default" && r[1] == "burn"),
        "{all}"
    );
    let selected = rows(&k.ok(&["top", "pods", "-l", "app=idle", "--no-headers"]));
    assert_eq!(selected.len(), 1, "{selected:?}");
    assert_eq!(selected[0][0], "idle");

    // The API as metrics-server serves it: a PodMetrics by name, watch refused.
    let pod = c
        .api_get("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/burn")
        .unwrap();
    assert_eq!(pod["kind"], "PodMetrics");
    assert!(pod["containers"][0]["usage"]["cpu"].is_string(), "{pod}");
    let watch = k.run(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/pods?watch=true",
    ]);
    assert!(!watch.success, "{}", watch.stdout);

    // RBAC: nobody is refused; the view role reads metrics (aggregated from
    // system:aggregated-metrics-reader).
    let scratch = dir.join("scratch");
    let nobody = kubectl_as(&c, "top-nobody", &scratch);
    let denied = nobody.fails(&["top", "pods"]);
    assert!(
        denied.contains("forbidden") || denied.contains("Forbidden"),
        "{denied}"
    );
    k.ok(&[
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        "--user=top-viewer",
    ]);
    let viewer = kubectl_as(&c, "top-viewer", &scratch);
    wait_until("the view role reads pod metrics", T, || {
        let r = viewer.run(&["top", "pods", "--no-headers"]);
        if r.success && r.stdout.contains("burn") {
            Ok(())
        } else {
            Err(r.stderr)
        }
    });

    autoscale_on_memory(&k);
    autoscale_on_cpu(&k);
}

/// `kubectl get hpa NAME -o json --watch`: the process and each version of the HPA it prints.
fn watch_hpa(k: &Kubectl, name: &str) -> (std::process::Child, Receiver<serde_json::Value>) {
    let mut watch = k.spawn(&["get", "hpa", name, "-o", "json", "--watch"]);
    let stdout = watch.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for v in serde_json::Deserializer::from_reader(stdout).into_iter::<serde_json::Value>() {
            let Ok(v) = v else { break };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    (watch, rx)
}

/// The first status the watch shows that `done` accepts, within `timeout`.
fn hpa_status_until(
    rx: &Receiver<serde_json::Value>,
    what: &str,
    timeout: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    let mut last = serde_json::Value::Null;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) if done(&v["status"]) => return v["status"].clone(),
            Ok(v) => last = v["status"].clone(),
            Err(e) => panic!("{what}: not within {timeout:?} ({e}); last status: {last}"),
        }
    }
}

/// Creates a Deployment `name` of one echo pod with these requests and waits for its rollout.
fn echo_deployment(k: &Kubectl, name: &str, cpu: &str, memory: &str) {
    let manifest = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": ECHO_IMAGE,
                    "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &manifest.to_string());
    assert!(r.success, "creating {name}: {}", r.stderr);
    k.ok(&[
        "rollout",
        "status",
        &format!("deployment/{name}"),
        "--timeout=120s",
    ]);
}

/// Percent of its memory request the pod's target is (Utilization).
const MEMORY_TARGET: i64 = 50;

/// A Deployment of one echo pod requesting 64Mi, made to hold 80 MiB (about 130% of its
/// request), autoscaled by `kubectl autoscale` and then on memory: the first rescale goes from
/// 1 to ceil(utilization / 50) (at most 4, Kubernetes' scale-up limit from one replica).
fn autoscale_on_memory(k: &Kubectl) {
    echo_deployment(k, "grow", "20m", "64Mi");
    let held = k.ok(&[
        "exec",
        "deploy/grow",
        "--",
        "/echo",
        "fetch",
        "http://127.0.0.1:8080/control/alloc/80",
    ]);
    assert!(held.contains("allocated 80 MiB"), "{held}");

    // kubectl 1.33 posts autoscaling/v1 (a CPU target); the target is then memory (v2).
    let out = k.ok(&[
        "autoscale",
        "deployment",
        "grow",
        "--cpu-percent=50",
        "--min=1",
        "--max=5",
    ]);
    assert!(out.contains("autoscaled"), "{out}");
    let (mut watch, rx) = watch_hpa(k, "grow");
    let metrics = serde_json::json!({"spec": {"metrics": [{"type": "Resource", "resource":
        {"name": "memory", "target": {"type": "Utilization", "averageUtilization": MEMORY_TARGET}}}]}});
    k.ok(&[
        "patch",
        "hpa",
        "grow",
        "--type=merge",
        "-p",
        &metrics.to_string(),
    ]);

    // The status the controller wrote with its first rescale: what it measured and chose.
    let status = hpa_status_until(
        &rx,
        "a rescale of hpa/grow",
        Duration::from_secs(300),
        |s| s["lastScaleTime"].is_string(),
    );
    let _ = watch.kill();
    let _ = watch.wait();
    eprintln!("hpa/grow status at its first rescale: {status}");
    assert_eq!(status["currentReplicas"], 1, "{status}");
    let current = &status["currentMetrics"][0]["resource"];
    assert_eq!(current["name"], "memory", "{status}");
    let utilization = current["current"]["averageUtilization"]
        .as_i64()
        .unwrap_or_else(|| panic!("{status}"));
    assert!(utilization > MEMORY_TARGET * 11 / 10, "{status}");
    let expected = ((utilization + MEMORY_TARGET - 1) / MEMORY_TARGET).min(4);
    assert_eq!(status["desiredReplicas"], expected, "{status}");
    let conditions = status["conditions"].to_string();
    for c in ["SucceededRescale", "ValidMetricFound"] {
        assert!(conditions.contains(c), "{conditions}");
    }

    let replicas = k.ok(&[
        "get",
        "deployment",
        "grow",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert!(
        replicas.trim().parse::<i64>().unwrap() >= expected,
        "{replicas}"
    );
    let row = wait_until("kubectl get hpa shows the measured memory", T, || {
        let out = k.ok(&["get", "hpa", "grow", "--no-headers"]);
        let w: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        let shown = w
            .get(3)
            .is_some_and(|t| t.ends_with("%/50%") && !t.starts_with('<'));
        if w.get(1).map(String::as_str) == Some("Deployment/grow")
            && w.get(2).map(String::as_str) == Some("memory:")
            && shown
        {
            Ok(out)
        } else {
            Err(out)
        }
    });
    eprintln!("{row}");
    let events = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=grow,reason=SuccessfulRescale",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    let want = format!(
        "New size: {expected}; reason: memory resource utilization (percentage of request) above target"
    );
    assert!(events.lines().any(|l| l == want), "{want}\n{events}");
}

/// Percent of its CPU request the CPU test's target is (kubectl autoscale --cpu-percent).
const CPU_TARGET: i64 = 50;
/// What the loaded pod burns: six times its 50m request.
const BURN_MILLICORES: u64 = 300;

/// The CPU utilization (percent of request) a status reports, if it reports one.
fn cpu_utilization(status: &serde_json::Value) -> Option<i64> {
    status["currentMetrics"]
        .as_array()?
        .iter()
        .find(|m| m["resource"]["name"] == "cpu")?["resource"]["current"]["averageUtilization"]
        .as_i64()
}

fn has_condition(status: &serde_json::Value, type_: &str, reason: &str) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["reason"] == reason)
    })
}

/// A Deployment of one echo pod requesting 50m CPU, autoscaled by `kubectl autoscale
/// --cpu-percent=50 --min=1 --max=3` (left on CPU) with a scale-down stabilization window of
/// 0: idle, the HPA measures it under the target and keeps one replica; made to burn 300m
/// (`/control/burn/300`), it is scaled above one and `kubectl get hpa` shows the CPU
/// percentage; the load stopped, it is scaled back to one. A SuccessfulRescale Event each way.
fn autoscale_on_cpu(k: &Kubectl) {
    let started = Instant::now();
    let phase = |what: &str| eprintln!("hpa/spin: {what} after {:.1?}", started.elapsed());
    echo_deployment(k, "spin", "50m", "16Mi");
    let pod = k.ok(&[
        "get",
        "pods",
        "-l",
        "app=spin",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let pod = pod.trim().to_string();
    assert!(!pod.is_empty());

    let out = k.ok(&[
        "autoscale",
        "deployment",
        "spin",
        &format!("--cpu-percent={CPU_TARGET}"),
        "--min=1",
        "--max=3",
    ]);
    assert!(out.contains("autoscaled"), "{out}");
    let (mut watch, rx) = watch_hpa(k, "spin");
    let behavior = serde_json::json!({"spec": {"behavior":
        {"scaleDown": {"stabilizationWindowSeconds": 0}}}});
    k.ok(&[
        "patch",
        "hpa",
        "spin",
        "--type=merge",
        "-p",
        &behavior.to_string(),
    ]);
    let hpa: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "hpa", "spin", "-o", "json"])).unwrap();
    let spec = &hpa["spec"];
    assert_eq!(spec["metrics"][0]["resource"]["name"], "cpu", "{spec}");
    assert_eq!(
        spec["metrics"][0]["resource"]["target"]["averageUtilization"], CPU_TARGET,
        "{spec}"
    );
    assert_eq!(
        spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"], 0,
        "{spec}"
    );
    phase("autoscaled");

    // Idle: measured, under the target, one replica.
    let idle = hpa_status_until(&rx, "hpa/spin measuring the idle pod", T, |s| {
        cpu_utilization(s).is_some() && has_condition(s, "ScalingActive", "ValidMetricFound")
    });
    phase(&format!("idle pod measured: {idle}"));
    assert!(cpu_utilization(&idle).unwrap() < CPU_TARGET, "{idle}");
    assert_eq!(idle["desiredReplicas"], 1, "{idle}");

    // Load: one replica burning six times its request.
    let burning = k.ok(&[
        "exec",
        &pod,
        "--",
        "/echo",
        "fetch",
        &format!("http://127.0.0.1:8080/control/burn/{BURN_MILLICORES}"),
    ]);
    assert!(
        burning.contains(&format!("burning {BURN_MILLICORES}m")),
        "{burning}"
    );
    let up = hpa_status_until(&rx, "hpa/spin scaling up", T, |s| {
        s["desiredReplicas"].as_i64().is_some_and(|d| d > 1)
    });
    phase(&format!("scaled up: {up}"));
    let up_to = up["desiredReplicas"].as_i64().unwrap();
    assert!(up_to <= 3, "{up}");
    assert_eq!(up["currentReplicas"], 1, "{up}");
    assert!(up["lastScaleTime"].is_string(), "{up}");
    assert!(cpu_utilization(&up).unwrap() > CPU_TARGET * 11 / 10, "{up}");
    assert!(
        has_condition(&up, "AbleToScale", "SucceededRescale"),
        "{up}"
    );
    let replicas = k.ok(&[
        "get",
        "deployment",
        "spin",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert!(
        replicas.trim().parse::<i64>().unwrap() >= up_to,
        "{replicas}"
    );
    // TARGETS: `cpu: <measured>%/50%`.
    let row = k.ok(&["get", "hpa", "spin", "--no-headers"]);
    let w: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(w.get(1), Some(&"Deployment/spin"), "{row}");
    assert_eq!(w.get(2), Some(&"cpu:"), "{row}");
    let measured = w
        .get(3)
        .and_then(|t| t.strip_suffix(&format!("%/{CPU_TARGET}%")))
        .and_then(|p| p.parse::<i64>().ok())
        .unwrap_or_else(|| panic!("{row}"));
    assert!(measured > CPU_TARGET, "{row}");
    eprintln!("{row}");

    // The load stopped, every replica up (so each has its own sample): back to one.
    let stopped = k.ok(&[
        "exec",
        &pod,
        "--",
        "/echo",
        "fetch",
        "http://127.0.0.1:8080/control/burn/0",
    ]);
    assert!(stopped.contains("burning 0m"), "{stopped}");
    k.ok(&["rollout", "status", "deployment/spin", "--timeout=120s"]);
    phase("load stopped");
    let down = hpa_status_until(&rx, "hpa/spin scaling back down to 1", T, |s| {
        s["desiredReplicas"] == 1
    });
    phase(&format!("scaled down: {down}"));
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(cpu_utilization(&down).unwrap() < CPU_TARGET, "{down}");
    assert!(
        has_condition(&down, "AbleToScale", "SucceededRescale"),
        "{down}"
    );
    let replicas = k.ok(&[
        "get",
        "deployment",
        "spin",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert_eq!(replicas.trim(), "1");

    let events = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=spin,reason=SuccessfulRescale",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    let up_event = format!(
        "New size: {up_to}; reason: cpu resource utilization (percentage of request) above target"
    );
    assert!(
        events.lines().any(|l| l == up_event),
        "{up_event}\n{events}"
    );
    assert!(
        events
            .lines()
            .any(|l| l == "New size: 1; reason: All metrics below target"),
        "{events}"
    );
    phase("done");
}
