//! Workloads on real nodes: a cluster of two nodes brought up by the cluster library (the
//! control plane, node agents with their own containerd, the eBPF proxy), names, addresses
//! and subnet unique to this test, driven by the real kubectl:
//!
//! - a Job of 5 completions, 2 at a time, whose pods (the echo image, `exit 0`) run and
//!   finish on both nodes, and `kubectl wait --for=condition=complete` returns;
//! - an Indexed Job whose pods print their `JOB_COMPLETION_INDEX` (read back with
//!   `kubectl logs`) and carry the hostname `<job>-<index>`;
//! - a Job whose pods exit 3 stops at its backoffLimit with Failed.
//!
//! Needs the daemons built (`cargo build -p control-plane -p node -p proxy`) and the images
//! in the local registry (`cargo xtask images`); `cargo xtask test` does both.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::e2e::binaries;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};

const T: Duration = Duration::from_secs(180);

fn get(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl printed JSON")
}

fn apply(k: &Kubectl, manifest: &Value) {
    let r = k.run_with_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(r.success, "kubectl apply: {}{}", r.stdout, r.stderr);
}

/// A Job running the echo image with `args`.
fn job(name: &str, spec: Value, args: &[&str]) -> Value {
    let mut spec = spec;
    spec["template"] = json!({"spec": {"restartPolicy": "Never",
        "containers": [{"name": "main", "image": ECHO_IMAGE, "command": ["/echo"], "args": args}]}});
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
}

fn condition(job: &Value, type_: &str) -> Option<String> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")
        .map(|c| c["reason"].as_str().unwrap_or_default().to_string())
}

fn job_pods(k: &Kubectl, job: &str) -> Vec<Value> {
    get(
        k,
        &[
            "get",
            "pods",
            "-l",
            &format!("batch.kubernetes.io/job-name={job}"),
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn jobs_run_to_completion_on_real_nodes() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("wl");
    let dir = std::env::temp_dir().join(&name);
    let spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl().within(T);

    // 1. Five completions, two at a time, on both nodes.
    let t0 = Instant::now();
    apply(
        &k,
        &job(
            "five",
            json!({"completions": 5, "parallelism": 2}),
            &["exit", "0"],
        ),
    );
    let out = k.ok(&[
        "wait",
        "--for=condition=complete",
        "job/five",
        "--timeout=180s",
    ]);
    assert!(out.contains("condition met"), "{out}");
    eprintln!(
        "  job of 5 completions (parallelism 2) complete in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    let five = get(&k, &["get", "job", "five"]);
    assert_eq!(five["status"]["succeeded"], 5);
    assert_eq!(
        condition(&five, "Complete").as_deref(),
        Some("CompletionsReached")
    );
    let pods = job_pods(&k, "five");
    assert_eq!(pods.len(), 5);
    for p in &pods {
        assert_eq!(
            p["status"]["phase"], "Succeeded",
            "{}",
            p["metadata"]["name"]
        );
        let code = &p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"];
        assert_eq!(code, 0);
        assert!(p["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty()));
    }
    let nodes: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    assert_eq!(nodes.len(), 2, "both nodes ran the Job's pods: {nodes:?}");

    // 2. Indexed: each pod knows its index.
    apply(
        &k,
        &job(
            "idx",
            json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
            &["env"],
        ),
    );
    k.ok(&[
        "wait",
        "--for=condition=complete",
        "job/idx",
        "--timeout=180s",
    ]);
    let idx = get(&k, &["get", "job", "idx"]);
    assert_eq!(idx["status"]["completedIndexes"], "0-2");
    let mut seen = BTreeSet::new();
    for p in job_pods(&k, "idx") {
        let pod = p["metadata"]["name"].as_str().unwrap().to_string();
        let index = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(p["spec"]["hostname"], format!("idx-{index}"));
        let logs = k.ok(&["logs", &pod]);
        assert!(
            logs.lines()
                .any(|l| l == format!("JOB_COMPLETION_INDEX={index}")),
            "{pod}: {logs}"
        );
        seen.insert(index);
    }
    assert_eq!(seen, ["0", "1", "2"].map(String::from).into());

    // 3. Failing pods: the backoff limit ends it.
    apply(
        &k,
        &job("fails", json!({"backoffLimit": 0}), &["exit", "3"]),
    );
    let failed = wait_until("job fails Failed", T, || {
        let j = get(&k, &["get", "job", "fails"]);
        match condition(&j, "Failed") {
            Some(_) => Ok(j),
            None => Err(j["status"].clone()),
        }
    });
    assert_eq!(
        condition(&failed, "Failed").as_deref(),
        Some("BackoffLimitExceeded")
    );
    assert_eq!(failed["status"]["failed"], 1);
    let p = &job_pods(&k, "fails")[0];
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );
    let table = k.ok(&["get", "jobs"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("fails") && l.contains("Failed")),
        "{table}"
    );
}
