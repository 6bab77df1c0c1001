//! What end-to-end tests and benchmarks ask of a running cluster, through the real kubectl
//! and the nodes' own tools: the daemons next to the running binary, pods by selector and
//! waiting for N of them Ready, a node-level probe of a service, and a client looping
//! through a service while something changes.

use crate::cluster::{Binaries, Cluster};
use crate::kubectl::Kubectl;
use crate::wait::try_wait_until;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::Duration;

/// The daemons next to the running test binary (`target/<profile>/deps/<test>` ->
/// `target/<profile>/`); panics naming what to build when one is missing.
pub fn binaries() -> Binaries {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let b = Binaries::in_dir(profile);
    assert!(
        b.missing().is_empty(),
        "build the daemons first (cargo build -p control-plane -p node -p proxy; cargo xtask test does): missing {:?}",
        b.missing()
    );
    b
}

/// `kubectl skiff trace <target> -o json` as a user runs it: the real kubectl, finding the
/// plugin (`kubectl-skiff`, next to the daemons) on PATH.
pub fn skiff_trace(c: &Cluster, target: &str) -> Result<Value, String> {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    assert!(
        dir.join("kubectl-skiff").is_file(),
        "build the plugin first (cargo build -p skiff-cli; cargo xtask test does): no kubectl-skiff in {}",
        dir.display()
    );
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let out = std::process::Command::new("kubectl")
        .args(["skiff", "trace", target, "-o", "json"])
        .env("KUBECONFIG", c.kubeconfig())
        .env("PATH", path)
        .output()
        .expect("running kubectl");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))
}

/// What a test needs of a pod.
#[derive(Debug, Clone)]
pub struct PodView {
    pub name: String,
    pub node: String,
    pub ip: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub terminating: bool,
}

/// `kubectl <args> -o json`, parsed.
pub fn json(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl printed JSON")
}

/// The pods matching a label selector.
pub fn pods(k: &Kubectl, selector: &str) -> Vec<PodView> {
    json(k, &["get", "pods", "-l", selector])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| PodView {
            name: p["metadata"]["name"].as_str().unwrap_or_default().into(),
            node: p["spec"]["nodeName"].as_str().unwrap_or_default().into(),
            ip: p["status"]["podIP"].as_str().map(str::to_string),
            phase: p["status"]["phase"].as_str().unwrap_or_default().into(),
            ready: pod_ready(p),
            terminating: terminating(p),
        })
        .collect()
}

/// Whether a pod (its JSON) has the condition Ready=True.
pub fn pod_ready(p: &Value) -> bool {
    p["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether an object (its JSON) is being deleted.
pub fn terminating(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

/// Waits (up to `timeout`) until exactly `n` pods match, all Ready with an IP and none
/// terminating.
pub fn try_wait_ready(
    k: &Kubectl,
    selector: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<PodView>, String> {
    try_wait_until(&format!("{n} pods Ready ({selector})"), timeout, || {
        let all = pods(k, selector);
        let ok = all.len() == n
            && all
                .iter()
                .all(|p| p.ready && !p.terminating && p.ip.is_some());
        if ok {
            Ok(all)
        } else {
            let ready = all.iter().filter(|p| p.ready && !p.terminating).count();
            Err(format!("{} pods, {ready} of them Ready", all.len()))
        }
    })
}

/// [`try_wait_ready`], panicking at the deadline.
pub fn wait_ready(k: &Kubectl, selector: &str, n: usize, timeout: Duration) -> Vec<PodView> {
    try_wait_ready(k, selector, n, timeout).unwrap_or_else(|e| panic!("{e}"))
}

pub fn names(pods: &[PodView]) -> BTreeSet<String> {
    pods.iter().map(|p| p.name.clone()).collect()
}

pub fn ips(pods: &[PodView]) -> BTreeSet<String> {
    pods.iter().filter_map(|p| p.ip.clone()).collect()
}

/// `pod=<name> namespace=...` (the echo server's answer) -> name.
pub fn pod_of(reply: &str) -> String {
    reply
        .split_whitespace()
        .find_map(|f| f.strip_prefix("pod="))
        .unwrap_or_default()
        .to_string()
}

/// A pod on `node` that fetches `url` `count` times (the echo image's `fetch`), which must
/// succeed every time; its log once it has finished.
pub fn client_pod(
    k: &Kubectl,
    name: &str,
    node: &str,
    url: &str,
    count: u32,
    timeout: Duration,
) -> String {
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "client"}},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "fetch", "image": crate::registry::ECHO_IMAGE,
                "command": ["/echo", "fetch", url, "--count", count.to_string()]}]}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &manifest.to_string());
    assert!(r.success, "creating {name}: {}", r.stderr);
    let phase = crate::wait::wait_until(&format!("{name} finished"), timeout, || {
        let p = pods(k, "app=client");
        match p.iter().find(|p| p.name == name).map(|p| p.phase.clone()) {
            Some(phase) if phase == "Succeeded" || phase == "Failed" => Ok(phase),
            other => Err(other),
        }
    });
    let log = k.ok(&["logs", name]);
    assert_eq!(phase, "Succeeded", "{name} failed; its log:\n{log}");
    k.ok(&["delete", "pod", name, "--wait=false"]);
    log
}

/// One `proxy probe http <addr> --count N` as a node-level client of node `i`: the replies
/// (pod names) and the number of failed attempts.
pub fn probe(c: &Cluster, i: usize, addr: &str, count: u32) -> (Vec<String>, usize) {
    let out = c
        .node_command(i, &c.state().binaries.proxy)
        .expect("node command")
        .args(["probe", "http", addr, "--count", &count.to_string()])
        .output()
        .expect("running proxy probe");
    let mut names = Vec::new();
    let mut failed = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line).expect("probe prints JSON lines");
        match v["reply"].as_str() {
            Some(r) if v["ok"] == true => names.push(pod_of(r)),
            _ => failed += 1,
        }
    }
    (names, failed)
}

/// A node-level client of node `i` requesting `addr` over HTTP in a loop (`proxy probe
/// --until-stdin-closes`) until [`LoopingClient::finish`].
pub struct LoopingClient {
    child: Child,
}

/// What a looping client saw.
#[derive(Debug)]
pub struct Loop {
    pub ok: u64,
    /// One JSON line per failed request.
    pub failures: String,
    /// The client's own summary line.
    pub summary: String,
}

/// The looping client's request timeout: an HTTP client's usual patience, not a latency
/// bound. A request fails when its connection is refused or reset, or when no reply comes in
/// this time (a black-holed backend never replies; a starved one on a loaded 2-core machine
/// may take seconds, which the client's summary reports as its slowest request).
pub const LOOP_TIMEOUT: Duration = Duration::from_secs(10);

impl LoopingClient {
    pub fn start(c: &Cluster, i: usize, addr: &str) -> LoopingClient {
        let child = c
            .node_command(i, &c.state().binaries.proxy)
            .expect("node command")
            .args(["probe", "http", addr, "--until-stdin-closes"])
            .args(["--timeout", &LOOP_TIMEOUT.as_secs().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the looping client");
        LoopingClient { child }
    }

    /// Closes the client's standard input, which ends it, and reads what it saw.
    pub fn finish(mut self) -> Loop {
        drop(self.child.stdin.take());
        let out = self
            .child
            .wait_with_output()
            .expect("the looping client ends");
        let summary = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let mut failures = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() && failures.is_empty() {
            failures = format!("the client exited with {}", out.status);
        }
        Loop {
            ok: summary
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
            failures,
            summary,
        }
    }
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc (0 if it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name (which may contain spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime: fields 14 and 15 of stat, 11 and 12 after the command name.
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// The `q` quantile (0..=1) of a Prometheus histogram in text exposition `metrics`, as the
/// upper bound of the first bucket holding it (None when the histogram is empty or absent).
pub fn histogram_quantile(metrics: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_from_buckets() {
        let text = "x_bucket{le=\"0.5\"} 50\nx_bucket{le=\"1.0\"} 99\nx_bucket{le=\"2.0\"} 100\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
        assert_eq!(histogram_quantile(text, "x", 0.5), Some(0.5));
        assert_eq!(histogram_quantile(text, "x", 0.99), Some(1.0));
        assert_eq!(histogram_quantile(text, "x", 1.0), Some(2.0));
        assert_eq!(histogram_quantile(text, "y", 0.5), None);
    }
}
