//! `cargo xtask bench node`: pod startup latency on one node agent, as Kubernetes' SLO
//! measures it: from the pod bound to the node (created with spec.nodeName) to the first
//! watch event showing it Running, and Ready, for 1, 10 and 50 pods at once, with the image
//! already present (pulls excluded). The baseline in the same run is one pod alone: the ratio
//! column shows how the agent scales with concurrent pods; the SLO column is p99 / 5 s.
//! Also the agent's CPU and memory with 50 pods. Writes bench-results/node.{json,md} and
//! node-startup.svg (copied to docs/bench/).
//!
//! Real processes throughout: the release `control-plane apiserver` and `node run` binaries,
//! the agent's own containerd, the echo image from the local registry.

use super::cpu_seconds;
use super::plot::{self, Chart, Series};
use crate::images::{self, target_dir};
use crate::setup::{root, run};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use skiff_launcher::apiserver::ApiServerProcess;
use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Opts {
    /// Pod counts to start at once.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    pods: Vec<usize>,
}

const NODE: &str = "bench-node";
const SLO: Duration = Duration::from_secs(5);

/// A small client for the API server's REST interface (the kubeconfig's CA and client
/// certificate).
struct Api {
    url: String,
    http: ureq::Agent,
}

impl Api {
    fn new(url: &str, kubeconfig: &std::path::Path) -> Result<Api> {
        let http = skiff_launcher::kubeconfig::KubeconfigAccess::read(kubeconfig)
            .and_then(|a| a.agent(Duration::from_secs(600)))
            .map_err(anyhow::Error::msg)?;
        Ok(Api {
            url: url.to_string(),
            http,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<(&str, Value)>) -> Result<(u16, Value)> {
        let url = format!("{}{path}", self.url);
        let resp = match (method, body) {
            ("GET", _) => self.http.get(&url).call()?,
            ("DELETE", _) => self.http.delete(&url).call()?,
            (m, Some((ctype, b))) => {
                let req = if m == "PATCH" {
                    self.http.patch(&url)
                } else {
                    self.http.post(&url)
                };
                req.header("Content-Type", ctype)
                    .send(serde_json::to_vec(&b)?)?
            }
            (m, None) => bail!("{m} needs a body"),
        };
        let status = resp.status().as_u16();
        let body: Value =
            serde_json::from_reader(resp.into_body().into_reader()).unwrap_or(Value::Null);
        Ok((status, body))
    }
}

/// When each pod was first seen Running and Ready on the watch.
#[derive(Default)]
struct Seen {
    running: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
}

fn watch_pods(api: &Api, seen: Arc<Mutex<Seen>>) -> Result<()> {
    let url = format!(
        "{}/api/v1/namespaces/default/pods?watch=true&fieldSelector=spec.nodeName%3D{NODE}&timeoutSeconds=3600",
        api.url
    );
    let resp = api.http.get(&url).call()?;
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        for line in reader.lines().map_while(Result::ok) {
            let now = Instant::now();
            let Ok(ev) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let pod = &ev["object"];
            let name = pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let running = pod["status"]["phase"] == "Running";
            let ready = pod["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            if running {
                s.running.entry(name.clone()).or_insert(now);
            }
            if ready {
                s.ready.entry(name).or_insert(now);
            }
        }
    });
    Ok(())
}

fn pod_body(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "node"}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "echo", "image": format!("{}/skiff/echo:latest", images::REGISTRY),
                "imagePullPolicy": "IfNotPresent",
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
            }]
        }
    })
}

fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Resident memory in MiB.
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

struct Round {
    pods: usize,
    running: Vec<f64>,
    ready: Vec<f64>,
    agent_cpu_s: f64,
}

/// The agent process: stopped (SIGTERM) on drop, then `node reset` removes what it left
/// on the machine (pods, bridge, cgroups), as an agent leaves pods running by design.
struct Agent {
    child: Child,
    binary: std::path::PathBuf,
    data_dir: std::path::PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = Command::new(&self.binary)
            .args(["reset", "--name", NODE])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .env("RUST_LOG", "warn")
            .status();
    }
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let started = Instant::now();
    images::all()?;
    eprintln!("bench node: building control-plane and node (release)");
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "control-plane",
        "-p",
        "node",
    ]))?;
    let bin = target_dir().join("release");
    let scratch = tempfile_dir()?;
    let server = ApiServerProcess::start(&bin.join("control-plane"), &scratch.join("api"), &[]);
    let api = Api::new(server.url(), &server.kubeconfig())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = std::fs::File::create(scratch.join("node.log"))?;
    // The agent's API serves HTTPS with a certificate from the cluster CA.
    let pki = scratch.join("node-pki");
    run(Command::new(bin.join("control-plane"))
        .arg("kubelet-serving-cert")
        .arg("--data-dir")
        .arg(scratch.join("api"))
        .args(["--node", NODE, "--san", "127.0.0.1", "--out-dir"])
        .arg(&pki))?;
    let child = Command::new(bin.join("node"))
        .args([
            "run",
            "--name",
            NODE,
            "--node-ip",
            "127.0.0.1",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .args(skiff_launcher::cluster::kubelet_tls_args(&pki))
        .arg("--data-dir")
        .arg(scratch.join("node"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting the node agent")?;
    let agent = Agent {
        child,
        binary: bin.join("node"),
        data_dir: scratch.join("node"),
    };
    let pid = agent.child.id();
    wait("the node to register", Duration::from_secs(60), || {
        Ok(api.call("GET", &format!("/api/v1/nodes/{NODE}"), None)?.0 == 200)
    })?;
    let cidr = "10.250.255.0/24";
    api.call(
        "PATCH",
        &format!("/api/v1/nodes/{NODE}"),
        Some((
            "application/merge-patch+json",
            json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}),
        )),
    )?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    watch_pods(&api, seen.clone())?;
    // Warm-up: the image is pulled once, as the SLO excludes pulls.
    let rounds_spec: Vec<usize> = std::iter::once(1)
        .chain(opts.pods.iter().copied())
        .collect();
    let mut rounds = Vec::new();
    for (i, &n) in rounds_spec.iter().enumerate() {
        let warmup = i == 0;
        eprintln!(
            "[{:.1}s] {}{n} pods",
            started.elapsed().as_secs_f64(),
            if warmup { "warm-up: " } else { "" }
        );
        let names: Vec<String> = (0..n).map(|j| format!("bench-{i}-{j}")).collect();
        let cpu0 = cpu_seconds(pid);
        let mut created = HashMap::new();
        for name in &names {
            let (code, body) = api.call(
                "POST",
                "/api/v1/namespaces/default/pods",
                Some(("application/json", pod_body(name))),
            )?;
            if code != 201 {
                bail!("creating {name}: HTTP {code}: {body}");
            }
            created.insert(name.clone(), Instant::now());
        }
        wait("every pod Ready", Duration::from_secs(300), || {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            Ok(names.iter().all(|n| s.ready.contains_key(n)))
        })?;
        let agent_cpu_s = cpu_seconds(pid) - cpu0;
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        let lat = |m: &HashMap<String, Instant>| {
            let mut v: Vec<f64> = names
                .iter()
                .map(|n| m[n].saturating_duration_since(created[n]).as_secs_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let round = Round {
            pods: n,
            running: lat(&s.running),
            ready: lat(&s.ready),
            agent_cpu_s,
        };
        drop(s);
        let mut steady = None;
        if n == *rounds_spec.iter().max().unwrap_or(&0) && !warmup {
            // The agent's own cost with this many pods running: CPU over a quiet window, RSS.
            let c0 = cpu_seconds(pid);
            let window = Duration::from_secs(10);
            std::thread::sleep(window);
            let containerd_pid: Option<u32> =
                std::fs::read_to_string(scratch.join("node/containerd/containerd.pid"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
            steady = Some(json!({
                "pods": n,
                "agent_cpu_percent_idle": (cpu_seconds(pid) - c0) / window.as_secs_f64() * 100.0,
                "agent_rss_mib": rss_mib(pid),
                "containerd_rss_mib": containerd_pid.map(rss_mib),
            }));
        }
        for name in &names {
            api.call(
                "DELETE",
                &format!("/api/v1/namespaces/default/pods/{name}"),
                None,
            )?;
        }
        wait("the pods to go", Duration::from_secs(120), || {
            let (_, list) = api.call(
                "GET",
                "/api/v1/namespaces/default/pods?labelSelector=bench%3Dnode",
                None,
            )?;
            Ok(list["items"].as_array().is_some_and(|a| a.is_empty()))
        })?;
        if !warmup {
            rounds.push((round, steady));
        }
    }
    drop(agent);
    drop(server);
    report(&rounds)?;
    eprintln!("[{:.1}s] done", started.elapsed().as_secs_f64());
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = root().join(".skiff/bench-node");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn report(rounds: &[(Round, Option<Value>)]) -> Result<()> {
    let base = rounds
        .first()
        .map(|(r, _)| percentile(&r.running, 99.0))
        .unwrap_or(f64::NAN);
    let ms = |s: f64| s * 1000.0;
    let mut md = String::from(
        "| pods | Running p50 | Running p99 | Ready p50 | Ready p99 | p99 vs 1 pod | p99 vs SLO (5 s) | agent CPU during start |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    for (r, _) in rounds {
        let (p50, p99) = (percentile(&r.running, 50.0), percentile(&r.running, 99.0));
        let (q50, q99) = (percentile(&r.ready, 50.0), percentile(&r.ready, 99.0));
        md.push_str(&format!(
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.2}x | {:.3} | {:.2} s |\n",
            r.pods,
            ms(p50),
            ms(p99),
            ms(q50),
            ms(q99),
            p99 / base,
            p99 / SLO.as_secs_f64(),
            r.agent_cpu_s
        ));
        rows.push(json!({
            "pods": r.pods,
            "running_p50_s": p50, "running_p99_s": p99,
            "ready_p50_s": q50, "ready_p99_s": q99,
            "running_p99_vs_one_pod": p99 / base,
            "running_p99_vs_slo": p99 / SLO.as_secs_f64(),
            "agent_cpu_seconds_during_start": r.agent_cpu_s,
            "running_s": r.running, "ready_s": r.ready,
        }));
    }
    let steady: Vec<&Value> = rounds.iter().filter_map(|(_, s)| s.as_ref()).collect();
    for s in &steady {
        md.push_str(&format!(
            "\nWith {} pods running: agent {:.1} MiB RSS, {:.2}% of a core when idle; its containerd {:.1} MiB RSS.\n",
            s["pods"],
            s["agent_rss_mib"].as_f64().unwrap_or(0.0),
            s["agent_cpu_percent_idle"].as_f64().unwrap_or(0.0),
            s["containerd_rss_mib"].as_f64().unwrap_or(0.0)
        ));
    }
    println!("\n{md}");
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&docs)?;
    let json = json!({"rounds": rows, "steady": steady, "slo_seconds": SLO.as_secs_f64()});
    let series = |name: &str, color: &'static str, f: &dyn Fn(&Round) -> f64| Series {
        name: name.into(),
        color,
        points: rounds
            .iter()
            .map(|(r, _)| (r.pods as f64, ms(f(r))))
            .collect(),
    };
    let svg = plot::svg(
        &Chart {
            title: "Pod startup latency on one node (image present)",
            x_label: "pods started at once",
            y_label: "ms",
            log_x: true,
            log_y: false,
        },
        &[
            series("Running p50", "#1f77b4", &|r| percentile(&r.running, 50.0)),
            series("Running p99", "#d62728", &|r| percentile(&r.running, 99.0)),
            series("Ready p99", "#2ca02c", &|r| percentile(&r.ready, 99.0)),
        ],
    );
    for dir in [&out, &docs] {
        std::fs::write(dir.join("node.json"), serde_json::to_string_pretty(&json)?)?;
        std::fs::write(dir.join("node.md"), &md)?;
        std::fs::write(dir.join("node-startup.svg"), &svg)?;
    }
    eprintln!("bench node: wrote bench-results/node.{{json,md}}, node-startup.svg (copied to docs/bench/)");
    Ok(())
}
