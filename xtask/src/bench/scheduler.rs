//! `cargo xtask bench scheduler`: the scheduler (release build, its own process) against the
//! API server (release build, its own process and data directory), with Node objects
//! (100, 1,000, 5,000) and pods created in bulk (1,000, 10,000, 30,000) by concurrent
//! kube-rs clients while the scheduler runs. Each cell starts from a fresh server.
//!
//! Reported per cell: pods bound per second (first create sent to last binding seen by a
//! watch), the create rate alone, scheduling latency p50/p99 (create sent to binding seen),
//! and where the time goes: the scheduler's own phase averages from its /metrics (queue wait,
//! filter, score, bind request) and CPU seconds per 1,000 pods of the API server, the
//! scheduler and the load generator (from /proc). Next to it, the decision rate of the
//! scheduling algorithm alone, in-process without an API server (the `scheduler_decisions`
//! example), so the scheduler's ceiling and the end-to-end figure can be told apart.
//!
//! Prints a table; writes bench-results/scheduler.{json,md} and scheduler-rate.svg,
//! scheduler-latency.svg (copied to docs/bench/).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::{json, Value};
use skiff_launcher::apiserver::ApiServerProcess;

use super::plot::{self, Chart, Series};
use super::{client, cpu_seconds};
use crate::setup::{root, run};

#[derive(clap::Args)]
pub struct Opts {
    /// Node counts.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    nodes: Vec<usize>,
    /// Pod counts.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,30000")]
    pods: Vec<usize>,
    /// Concurrent clients creating pods (and nodes).
    #[arg(long, default_value_t = 64)]
    creators: usize,
    /// Give up on a cell whose pods are not all bound within this many seconds.
    #[arg(long, default_value_t = 240)]
    cell_timeout_s: u64,
}

/// Pods a bench node holds (its `pods` allocatable; cpu and memory leave room for them all).
const PODS_PER_NODE: usize = 110;
const NAMESPACE: &str = "bench";

#[derive(Default)]
struct Cpu {
    apiserver: f64,
    scheduler: f64,
    bench: f64,
}

/// Averages per scheduled pod from the scheduler's /metrics.
#[derive(Default)]
struct Phases {
    attempts: f64,
    queue_wait_ms: f64,
    filter_us: f64,
    score_us: f64,
    bind_ms: f64,
}

struct Cell {
    nodes: usize,
    pods: usize,
    node_create_s: f64,
    create_s: f64,
    bound_s: f64,
    latencies: Vec<Duration>,
    phases: Phases,
    cpu: Cpu,
}

impl Cell {
    fn rate(&self) -> f64 {
        self.pods as f64 / self.bound_s.max(1e-9)
    }
    fn create_rate(&self) -> f64 {
        self.pods as f64 / self.create_s.max(1e-9)
    }
    fn pct_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i].as_secs_f64() * 1e3
    }
    fn cpu_per_1k(&self, s: f64) -> f64 {
        s * 1000.0 / self.pods as f64
    }
}

struct Decisions {
    nodes: usize,
    pods: usize,
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    filter_us: f64,
    score_us: f64,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

pub fn run_bench(opts: Opts) -> Result<()> {
    eprintln!("bench scheduler: building control-plane and scheduler_decisions (release)");
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "control-plane",
        "--bin",
        "control-plane",
        "--example",
        "scheduler_decisions",
    ]))?;
    let bin = target_dir().join("release/control-plane");
    let example = target_dir().join("release/examples/scheduler_decisions");

    let mut decisions = Vec::new();
    for &n in &opts.nodes {
        let p = opts
            .pods
            .iter()
            .copied()
            .max()
            .unwrap_or(1000)
            .min(n * PODS_PER_NODE);
        eprintln!("bench scheduler: in-process decisions, {n} nodes, {p} pods");
        decisions.push(in_process(&example, n, p)?);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    for &n in &opts.nodes {
        for &p in &opts.pods {
            if p > n * PODS_PER_NODE {
                skipped.push((n, p));
                continue;
            }
            eprintln!("bench scheduler: {n} nodes, {p} pods");
            cells.push(rt.block_on(cell(&bin, &opts, n, p))?);
        }
    }
    report(&decisions, &cells, &skipped)
}

fn in_process(example: &Path, nodes: usize, pods: usize) -> Result<Decisions> {
    let out = Command::new(example)
        .args([nodes.to_string(), pods.to_string()])
        .output()
        .context("running scheduler_decisions")?;
    if !out.status.success() {
        bail!(
            "scheduler_decisions failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Ok(Decisions {
        nodes,
        pods,
        per_s: f("decisions_per_s"),
        p50_us: f("p50_us"),
        p99_us: f("p99_us"),
        filter_us: f("filter_us_per_pod"),
        score_us: f("score_us_per_pod"),
    })
}

/// The scheduler process, killed on drop.
struct SchedulerProcess {
    child: Child,
    port: u16,
}

impl SchedulerProcess {
    fn start(bin: &Path, kubeconfig: &Path, log: &Path) -> Result<SchedulerProcess> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .args(["scheduler", "--kubeconfig"])
            .arg(kubeconfig)
            .args([
                "--bind-address",
                &format!("127.0.0.1:{port}"),
                "--leader-elect=false",
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting control-plane scheduler")?;
        Ok(SchedulerProcess { child, port })
    }

    fn metrics(&self) -> Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default())
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the series `name` (with its labels, as printed) in a metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn node(i: usize) -> Node {
    let name = format!("node-{i:05}");
    let res = json!({"cpu": "32", "memory": "128Gi", "pods": PODS_PER_NODE.to_string(), "ephemeral-storage": "100Gi"});
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "status": {"capacity": res, "allocatable": res,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .expect("a valid node")
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i}"), "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "registry.local/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }))
    .expect("a valid pod")
}

/// Runs `count` creates from `creators` tasks; returns when each one was sent.
async fn create_all<K, F>(
    api: Api<K>,
    count: usize,
    creators: usize,
    make: F,
) -> Result<Vec<Instant>>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: Fn(usize) -> K + Send + Sync + Copy + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..creators.max(1) {
        let (api, next) = (api.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(sent);
                }
                let obj = make(i);
                sent.push((i, Instant::now()));
                api.create(&PostParams::default(), &obj).await?;
            }
        }));
    }
    let mut at = vec![Instant::now(); count];
    for t in tasks {
        for (i, when) in t.await?? {
            at[i] = when;
        }
    }
    Ok(at)
}

async fn cell(bin: &Path, opts: &Opts, nodes: usize, pods: usize) -> Result<Cell> {
    let scratch = std::env::temp_dir().join(format!(
        "skiff-bench-scheduler-{}-{nodes}-{pods}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let result = cell_in(bin, opts, nodes, pods, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn cell_in(
    bin: &Path,
    opts: &Opts,
    nodes: usize,
    pods: usize,
    scratch: &Path,
) -> Result<Cell> {
    let server =
        ApiServerProcess::start(bin, &scratch.join("data"), &["--watch-history", "200000"]);
    let c = client(&server.kubeconfig()).await?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await?;

    let t = Instant::now();
    create_all(Api::<Node>::all(c.clone()), nodes, opts.creators, node).await?;
    let node_create_s = t.elapsed().as_secs_f64();
    eprintln!("  {nodes} nodes created in {node_create_s:.1} s");

    let sched = SchedulerProcess::start(bin, &server.kubeconfig(), &scratch.join("scheduler.log"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = sched.metrics().unwrap_or_default();
        if metric(&text, "scheduler_cache_size{type=\"nodes\"}") as usize == nodes {
            break;
        }
        if Instant::now() > deadline {
            bail!("the scheduler did not list {nodes} nodes within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The binding of each pod as a watch sees it.
    let bound: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let watch = {
        let (api, bound) = (Api::<Pod>::namespaced(c.clone(), NAMESPACE), bound.clone());
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(ev) = s.next().await {
                let obj = match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => p,
                    _ => continue,
                };
                let on_node = obj
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some();
                let index = obj
                    .metadata
                    .name
                    .as_deref()
                    .and_then(|n| n.strip_prefix("pod-"))
                    .and_then(|i| i.parse::<usize>().ok());
                if let (true, Some(i)) = (on_node, index) {
                    bound
                        .lock()
                        .expect("bound")
                        .entry(i)
                        .or_insert_with(Instant::now);
                }
            }
        })
    };

    let (api_pid, sched_pid) = (server.pid().unwrap_or(0), sched.child.id());
    let cpu0 = (
        cpu_seconds(api_pid),
        cpu_seconds(sched_pid),
        cpu_seconds(std::process::id()),
    );
    let m0 = sched.metrics()?;
    let started = Instant::now();
    let progress = {
        let bound = bound.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            tick.tick().await;
            loop {
                tick.tick().await;
                let n = bound.lock().expect("bound").len();
                eprintln!(
                    "  {:>5.1} s: {n}/{pods} bound",
                    started.elapsed().as_secs_f64()
                );
            }
        })
    };
    let sent = create_all(
        Api::<Pod>::namespaced(c.clone(), NAMESPACE),
        pods,
        opts.creators,
        pod,
    )
    .await?;
    let create_s = started.elapsed().as_secs_f64();
    let deadline = started + Duration::from_secs(opts.cell_timeout_s);
    loop {
        if bound.lock().expect("bound").len() >= pods {
            break;
        }
        if Instant::now() > deadline {
            progress.abort();
            watch.abort();
            bail!(
                "only {} of {pods} pods bound after {} s (scheduler log: {})",
                bound.lock().expect("bound").len(),
                opts.cell_timeout_s,
                scratch.join("scheduler.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    progress.abort();
    watch.abort();
    let cpu1 = (
        cpu_seconds(api_pid),
        cpu_seconds(sched_pid),
        cpu_seconds(std::process::id()),
    );
    let m1 = sched.metrics()?;
    let bound = bound.lock().expect("bound").clone();
    let last = bound.values().max().copied().unwrap_or(started);
    let mut latencies: Vec<Duration> = bound
        .iter()
        .map(|(i, at)| at.saturating_duration_since(sent[*i]))
        .collect();
    latencies.sort();

    let delta = |name: &str| metric(&m1, name) - metric(&m0, name);
    let attempts = delta("scheduler_schedule_attempts_total{result=\"scheduled\"}").max(1.0);
    let phase = |p: &str| {
        delta(&format!(
            "scheduler_framework_extension_point_duration_seconds_sum{{extension_point=\"{p}\"}}"
        )) / delta(&format!(
            "scheduler_framework_extension_point_duration_seconds_count{{extension_point=\"{p}\"}}"
        ))
        .max(1.0)
    };
    let phases = Phases {
        attempts,
        queue_wait_ms: delta("scheduler_queue_wait_duration_seconds_sum") * 1e3
            / delta("scheduler_queue_wait_duration_seconds_count").max(1.0),
        filter_us: phase("Filter") * 1e6,
        score_us: phase("Score") * 1e6,
        bind_ms: phase("Bind") * 1e3,
    };
    let cpu = Cpu {
        apiserver: cpu1.0 - cpu0.0,
        scheduler: cpu1.1 - cpu0.1,
        bench: cpu1.2 - cpu0.2,
    };
    let cell = Cell {
        nodes,
        pods,
        node_create_s,
        create_s,
        bound_s: (last - started).as_secs_f64(),
        latencies,
        phases,
        cpu,
    };
    eprintln!(
        "  {pods} pods bound in {:.1} s: {:.0} pods/s (created at {:.0}/s), p50 {:.0} ms, p99 {:.0} ms",
        cell.bound_s,
        cell.rate(),
        cell.create_rate(),
        cell.pct_ms(0.5),
        cell.pct_ms(0.99)
    );
    drop(sched);
    drop(server);
    Ok(cell)
}

fn report(decisions: &[Decisions], cells: &[Cell], skipped: &[(usize, usize)]) -> Result<()> {
    let mut md = String::from(
        "### End to end (API server and scheduler processes, pods created by 64 clients while the scheduler runs)\n\n\
         | nodes | pods | pods bound/s | created/s | bind/create | latency p50 ms | p99 ms | queue wait ms | filter us | score us | bind ms | CPU s per 1k pods: apiserver / scheduler / clients |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    for c in cells {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.1} | {:.2} / {:.2} / {:.2} |\n",
            c.nodes,
            c.pods,
            c.rate(),
            c.create_rate(),
            c.rate() / c.create_rate().max(1e-9),
            c.pct_ms(0.5),
            c.pct_ms(0.99),
            c.phases.queue_wait_ms,
            c.phases.filter_us,
            c.phases.score_us,
            c.phases.bind_ms,
            c.cpu_per_1k(c.cpu.apiserver),
            c.cpu_per_1k(c.cpu.scheduler),
            c.cpu_per_1k(c.cpu.bench),
        ));
        rows.push(json!({
            "nodes": c.nodes, "pods": c.pods, "node_create_seconds": c.node_create_s,
            "create_seconds": c.create_s, "bound_seconds": c.bound_s,
            "pods_bound_per_s": c.rate(), "pods_created_per_s": c.create_rate(),
            "latency_p50_ms": c.pct_ms(0.5), "latency_p99_ms": c.pct_ms(0.99),
            "scheduler": {"attempts": c.phases.attempts, "queue_wait_ms": c.phases.queue_wait_ms,
                "filter_us": c.phases.filter_us, "score_us": c.phases.score_us, "bind_ms": c.phases.bind_ms},
            "cpu_seconds": {"apiserver": c.cpu.apiserver, "scheduler": c.cpu.scheduler, "clients": c.cpu.bench},
        }));
    }
    for (n, p) in skipped {
        md.push_str(&format!(
            "| {n} | {p} | - | - | - | - | - | - | - | - | - | more pods than {n} nodes x {PODS_PER_NODE} hold |\n"
        ));
    }
    md.push_str(
        "\n### The scheduling algorithm alone (in-process, no API server; each pod assumed on its node)\n\n\
         | nodes | pods | decisions/s | p50 us | p99 us | filter us | score us |\n|---|---|---|---|---|---|---|\n",
    );
    let mut drows = Vec::new();
    for d in decisions {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            d.nodes, d.pods, d.per_s, d.p50_us, d.p99_us, d.filter_us, d.score_us
        ));
        drows.push(json!({"nodes": d.nodes, "pods": d.pods, "decisions_per_s": d.per_s,
            "p50_us": d.p50_us, "p99_us": d.p99_us, "filter_us": d.filter_us, "score_us": d.score_us}));
    }
    println!("{md}");

    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
    let mut pod_counts: Vec<usize> = cells.iter().map(|c| c.pods).collect();
    pod_counts.sort();
    pod_counts.dedup();
    let mut rate_series: Vec<Series> = pod_counts
        .iter()
        .zip(colors)
        .map(|(p, color)| Series {
            name: format!("{p} pods, bound/s"),
            color,
            points: cells
                .iter()
                .filter(|c| c.pods == *p)
                .map(|c| (c.nodes as f64, c.rate()))
                .collect(),
        })
        .collect();
    rate_series.push(Series {
        name: "in-process decisions/s".into(),
        color: colors[4],
        points: decisions
            .iter()
            .map(|d| (d.nodes as f64, d.per_s))
            .collect(),
    });
    let rate_svg = plot::svg(
        &Chart {
            title: "Scheduler throughput vs nodes",
            x_label: "nodes",
            y_label: "pods per second",
            log_x: true,
            log_y: true,
        },
        &rate_series,
    );
    let mut latency_series = Vec::new();
    for (p, color) in pod_counts.iter().zip(colors) {
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            latency_series.push(Series {
                name: format!("{p} pods {name}"),
                color,
                points: cells
                    .iter()
                    .filter(|c| c.pods == *p)
                    .map(|c| (c.nodes as f64, c.pct_ms(q)))
                    .collect(),
            });
        }
    }
    let latency_svg = plot::svg(
        &Chart {
            title: "Scheduling latency (create sent to binding seen) vs nodes",
            x_label: "nodes",
            y_label: "ms",
            log_x: true,
            log_y: true,
        },
        &latency_series,
    );
    let doc = json!({"end_to_end": rows, "in_process": drows,
        "skipped": skipped.iter().map(|(n, p)| json!({"nodes": n, "pods": p})).collect::<Vec<_>>()});
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    for dir in [&out, &docs] {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("scheduler.json"),
            serde_json::to_string_pretty(&doc)?,
        )?;
        std::fs::write(dir.join("scheduler.md"), &md)?;
        std::fs::write(dir.join("scheduler-rate.svg"), &rate_svg)?;
        std::fs::write(dir.join("scheduler-latency.svg"), &latency_svg)?;
    }
    eprintln!("bench scheduler: wrote bench-results/scheduler.{{json,md}}, scheduler-rate.svg, scheduler-latency.svg (copied to docs/bench/)");
    Ok(())
}
