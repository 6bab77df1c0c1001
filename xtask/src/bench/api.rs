//! `cargo xtask bench api`: the API server (release build, its own process and data
//! directory) under load from kube-rs clients: create/update/get/list latency and throughput
//! at 1, 16 and 64 concurrent clients; creates paced at 100/s; watch delivery latency (write
//! to event) with 1, 100 and 1,000 watchers; server memory with 100,000 objects stored.
//! The latency and watch tables are measured twice in the same run, each cell one after the
//! other on two servers: plain HTTP without authorization (`--plain-http --authorization-mode
//! AlwaysAllow`, a static token: the baseline) and TLS with a client certificate authorized
//! by RBAC (the default), with the ratio of their p99s. Also TLS handshakes per second
//! (`api_tls`) and the authorization decisions (`api_authz`). Mutating p99s are compared
//! with Kubernetes' SLO (p99 <= 1 s) as a ratio. Prints a table, writes
//! bench-results/api.{json,md} and api-latency.svg (copied to docs/bench/).
//!
//! `--store etcd` compares the stores instead: both servers TLS+RBAC, one on the embedded
//! store (the baseline) and one on a real etcd cluster (`--etcd-members`, Debian's etcd on
//! loopback, etcd's default election timing), the same latency, watch and memory phases on both, etcd's own memory, and the
//! fail-over time: the etcd leader killed (SIGKILL) `--failovers` times, each time measured
//! from the kill to the first write through the API server that succeeds. Writes
//! bench-results/api-etcd.{json,md} and api-etcd-latency.svg.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;
use serde_json::json;
use skiff_launcher::apiserver::ApiServerProcess;
use skiff_tests::etcd::EtcdCluster;

use super::client;
use super::plot::{self, Chart, Series};
use crate::setup::{root, run};

#[derive(clap::Args)]
pub struct Opts {
    /// Operations per (operation, concurrency) cell.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Objects stored for the memory figure.
    #[arg(long, default_value_t = 100_000)]
    objects: usize,
    /// Watcher counts for the delivery latency.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    watchers: Vec<usize>,
    /// Seconds of TLS handshakes per case.
    #[arg(long, default_value_t = 5)]
    handshake_secs: u64,
    /// What the run compares: `embedded` (plain HTTP vs TLS+RBAC, both on the embedded
    /// store) or `etcd` (the embedded store vs etcd, both TLS+RBAC).
    #[arg(long, value_enum, default_value_t = StoreArg::Embedded)]
    store: StoreArg,
    /// Members of the etcd cluster (`--store etcd`).
    #[arg(long, default_value_t = 3)]
    etcd_members: usize,
    /// Leader kills measured for the fail-over time (`--store etcd`, 3 or more members).
    #[arg(long, default_value_t = 10)]
    failovers: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreArg {
    Embedded,
    Etcd,
}

/// One server set-up of the run: how it is reached, who decides, where it stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    /// Plain HTTP, a static token, `--authorization-mode AlwaysAllow`, embedded store.
    Plain,
    /// TLS, a client certificate, RBAC (a ClusterRoleBinding; not the system:masters
    /// bypass), embedded store: the default server.
    TlsRbac,
    /// As `TlsRbac`, on etcd.
    Etcd,
}

impl Variant {
    fn key(self) -> &'static str {
        match self {
            Variant::Plain => "plain_http_always_allow",
            Variant::TlsRbac => "tls_client_cert_rbac",
            Variant::Etcd => "etcd_tls_client_cert_rbac",
        }
    }
}

/// The two set-ups a run compares, each cell measured on both one after the other.
#[derive(Clone, Copy)]
struct Comparison {
    baseline: Variant,
    measured: Variant,
    baseline_label: &'static str,
    measured_label: &'static str,
    /// What the report says the pair is.
    intro: &'static str,
    /// Output file stem under bench-results/ and docs/bench/.
    stem: &'static str,
}

impl Comparison {
    const SECURITY: Comparison = Comparison {
        baseline: Variant::Plain,
        measured: Variant::TlsRbac,
        baseline_label: "plain",
        measured_label: "TLS+RBAC",
        intro: "Each cell measured on two servers one after the other: plain HTTP with AlwaysAllow (a static token; the baseline) and TLS with a client certificate authorized by RBAC.",
        stem: "api",
    };
    const STORE: Comparison = Comparison {
        baseline: Variant::TlsRbac,
        measured: Variant::Etcd,
        baseline_label: "embedded",
        measured_label: "etcd",
        intro: "Each cell measured on two servers one after the other, both TLS with a client certificate authorized by RBAC: one on the embedded store (the baseline), one on etcd.",
        stem: "api-etcd",
    };

    fn both(&self) -> [Variant; 2] {
        [self.baseline, self.measured]
    }
}

/// Aim for the cost of TLS and RBAC: create p99 within this factor of the baseline's.
const CREATE_P99_AIM: f64 = 1.15;
/// Aim for etcd: mutating p99 at 64 clients (issue 11).
const ETCD_P99_AIM: Duration = Duration::from_millis(50);
/// Aim: the embedded store's mutating throughput at least this factor of etcd's.
const EMBEDDED_THROUGHPUT_AIM: f64 = 1.5;

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Kubernetes' API call latency SLO for mutating calls (p99).
const SLO_MUTATING: Duration = Duration::from_secs(1);

/// Latency samples of one measurement.
pub(super) struct Sample {
    name: String,
    variant: Variant,
    concurrency: usize,
    pub(super) latencies: Vec<Duration>,
    pub(super) elapsed: Duration,
}

impl Sample {
    /// Latencies measured elsewhere, over `elapsed` of wall-clock time.
    pub(super) fn of(name: &str, latencies: Vec<Duration>, elapsed: Duration) -> Sample {
        Sample {
            name: name.to_string(),
            variant: Variant::TlsRbac,
            concurrency: 1,
            latencies,
            elapsed,
        }
    }
    pub(super) fn pct(&self, p: f64) -> Duration {
        let mut v = self.latencies.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    pub(super) fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn cm(name: &str, annotations: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "annotations": annotations, "labels": {"bench": "api"}},
        "data": {"key": "value", "other": "a small configuration value"},
    }))
    .expect("a valid ConfigMap")
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let bin = release_control_plane()?;
    let scratch = tempdir()?;
    let result = match opts.store {
        StoreArg::Embedded => security_run(&opts, &bin, &scratch),
        StoreArg::Etcd => store_run(&opts, &bin, &scratch),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Builds the release `control-plane` (with the authorization example: `bench api` and
/// `bench crd` share one build) and returns its path.
pub(super) fn release_control_plane() -> Result<PathBuf> {
    eprintln!("bench: building control-plane (release; cargo's progress follows)");
    // The server and the authorization example in one build: the example pulls the
    // package's dev-dependencies in, which changes feature unification, so building them
    // apart compiles the control-plane library (the longest crate) twice.
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "control-plane",
        "--bins",
        "--example",
        "authz_decision",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    Ok(target.join("release/control-plane"))
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// A TLS+RBAC server's bench user, its kubeconfig written under `dir`.
async fn rbac_user(
    bin: &std::path::Path,
    server: &ApiServerProcess,
    data_dir: &std::path::Path,
    admin: &Client,
    dir: &std::path::Path,
) -> Result<(Client, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let path = super::api_tls::rbac_kubeconfig(bin, server, data_dir, admin, dir).await?;
    Ok((client(&path).await?, path))
}

/// Plain HTTP vs TLS+RBAC on the embedded store, then TLS handshakes.
fn security_run(opts: &Opts, bin: &std::path::Path, scratch: &std::path::Path) -> Result<()> {
    let tls_data = scratch.join("tls-data");
    let server = ApiServerProcess::start(bin, &tls_data, &["--bookmark-interval", "60"]);
    let mut plain_args = vec!["--bookmark-interval".to_string(), "60".to_string()];
    plain_args.extend(super::api_tls::plain_args(scratch)?);
    let plain_args: Vec<&str> = plain_args.iter().map(String::as_str).collect();
    let plain = ApiServerProcess::start(bin, &scratch.join("plain-data"), &plain_args);
    let result = runtime()?.block_on(async {
        let admin = client(&server.kubeconfig()).await?;
        let plain_kubeconfig = super::api_tls::plain_kubeconfig(&plain, scratch)?;
        let servers = Servers {
            cmp: Comparison::SECURITY,
            measured: &server,
            measured_user: rbac_user(bin, &server, &tls_data, &admin, scratch).await?,
            baseline_user: (client(&plain_kubeconfig).await?, plain_kubeconfig),
            admin,
        };
        measure(opts, &servers).await
    });
    drop(plain);
    let (r, h) = result.and_then(|r| {
        eprintln!("bench api: TLS handshakes");
        let access = server.admin();
        let secs = Duration::from_secs(opts.handshake_secs.max(1));
        let mut h = Vec::new();
        for client_cert in [false, true] {
            h.push(super::api_tls::handshakes(&access, client_cert, secs)?);
        }
        Ok((r, h))
    })?;
    drop(server);
    report(Comparison::SECURITY, r, &h, None)
}

/// The embedded store vs etcd, both TLS+RBAC, then the fail-over time.
fn store_run(opts: &Opts, bin: &std::path::Path, scratch: &std::path::Path) -> Result<()> {
    eprintln!(
        "bench api: starting {} etcd member(s) (Debian's etcd on loopback)",
        opts.etcd_members
    );
    // etcd's default election timing, as in production (the tests' fast elections would
    // flatter the fail-over time and, on a loaded machine, cost spurious elections).
    let mut etcd = EtcdCluster::start_with_default_elections(opts.etcd_members.max(1));
    let embedded_data = scratch.join("embedded-data");
    let embedded = ApiServerProcess::start(bin, &embedded_data, &["--bookmark-interval", "60"]);
    let etcd_data = scratch.join("etcd-data");
    let on_etcd = ApiServerProcess::start(
        bin,
        &etcd_data,
        &["--bookmark-interval", "60", "--store", &etcd.url()],
    );
    let rt = runtime()?;
    let r = rt.block_on(async {
        let embedded_admin = client(&embedded.kubeconfig()).await?;
        let admin = client(&on_etcd.kubeconfig()).await?;
        let servers = Servers {
            cmp: Comparison::STORE,
            measured: &on_etcd,
            measured_user: rbac_user(bin, &on_etcd, &etcd_data, &admin, &scratch.join("u-etcd"))
                .await?,
            baseline_user: rbac_user(
                bin,
                &embedded,
                &embedded_data,
                &embedded_admin,
                &scratch.join("u-embedded"),
            )
            .await?,
            admin,
        };
        let mut r = measure(opts, &servers).await?;
        // The same load on the baseline, for its memory and load rate.
        let pid = embedded.pid().context("embedded server pid")?;
        let empty = rss_kib(pid)?;
        let load = load_objects(&embedded_admin, opts.objects).await?;
        r.baseline_memory = Some(Memory {
            rss_empty_kib: empty,
            rss_full_kib: rss_kib(pid)?,
            objects: load.latencies.len(),
            load_secs: load.elapsed.as_secs_f64(),
        });
        r.etcd_rss_kib = etcd
            .members()
            .iter()
            .filter_map(|m| m.pid().and_then(|p| rss_kib(p).ok()))
            .sum();
        Ok::<_, anyhow::Error>(r)
    })?;
    drop(embedded);
    let failovers = if opts.etcd_members >= 3 {
        rt.block_on(failover_times(&mut etcd, &on_etcd, opts.failovers))?
    } else {
        eprintln!("bench api: fail-over needs 3 or more etcd members: skipped");
        Vec::new()
    };
    drop(on_etcd);
    report(Comparison::STORE, r, &[], Some(&failovers))
}

/// Kills the etcd leader `n` times; each time, from the kill to the first write through the
/// API server that succeeds. A write is started every 20 ms (each with its own deadline), so
/// one stuck on the dead leader does not hide the first one that gets through.
async fn failover_times(
    etcd: &mut EtcdCluster,
    server: &ApiServerProcess,
    n: usize,
) -> Result<Vec<Duration>> {
    let c = client(&server.kubeconfig()).await?;
    namespace(&c, "bench-failover").await?;
    let api: Api<ConfigMap> = Api::namespaced(c, "bench-failover");
    let mut times = Vec::new();
    for k in 0..n {
        let leader = etcd.leader().context("no etcd leader before a kill")?;
        eprintln!(
            "bench api: fail-over {}/{n}: killing etcd member {leader}",
            k + 1
        );
        etcd.kill(leader);
        let killed = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut attempt = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        let took = loop {
            tokio::select! {
                _ = tick.tick() => {
                    anyhow::ensure!(killed.elapsed() < Duration::from_secs(60),
                        "no write succeeded within 60 s of killing the etcd leader");
                    attempt += 1;
                    let (a, tx) = (api.clone(), tx.clone());
                    let name = format!("f-{k}-{attempt}");
                    tokio::spawn(async move {
                        let r = tokio::time::timeout(Duration::from_secs(10),
                            a.create(&PostParams::default(), &cm(&name, json!({})))).await;
                        if matches!(r, Ok(Ok(_))) {
                            let _ = tx.send(killed.elapsed());
                        }
                    });
                }
                Some(t) = rx.recv() => break t,
            }
        };
        times.push(took);
        etcd.restart(leader);
    }
    Ok(times)
}
/// The two servers of the run and their measured clients (with their kubeconfigs).
struct Servers<'a> {
    cmp: Comparison,
    /// The measured server (TLS + RBAC; on etcd for `--store etcd`).
    measured: &'a ApiServerProcess,
    /// The bench user on it: a client certificate, authorized by RBAC.
    measured_user: (Client, PathBuf),
    /// The admin of the measured server (system:masters): memory and authorization rows.
    admin: Client,
    /// The bench user on the baseline server.
    baseline_user: (Client, PathBuf),
}

impl Servers<'_> {
    fn of(&self, v: Variant) -> &(Client, PathBuf) {
        if v == self.cmp.baseline {
            &self.baseline_user
        } else {
            &self.measured_user
        }
    }
}

pub(super) fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("skiff-bench-api-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

pub(super) async fn namespace(c: &Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

struct Results {
    samples: Vec<Sample>,
    watch: Vec<Sample>,
    /// The measured server's memory and load.
    memory: Memory,
    /// The baseline's (`--store etcd` only).
    baseline_memory: Option<Memory>,
    /// The etcd members' RSS summed, after the load (`--store etcd` only).
    etcd_rss_kib: u64,
    authz: Vec<super::api_authz::Row>,
}

/// A server's RSS before and after `objects` ConfigMaps were stored by 64 clients.
struct Memory {
    rss_empty_kib: u64,
    rss_full_kib: u64,
    objects: usize,
    load_secs: f64,
}

impl Memory {
    fn per_object(&self) -> f64 {
        (self.rss_full_kib.saturating_sub(self.rss_empty_kib)) as f64 * 1024.0
            / self.objects.max(1) as f64
    }

    fn load_rate(&self) -> f64 {
        self.objects as f64 / self.load_secs.max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        json!({"objects": self.objects, "rss_empty_kib": self.rss_empty_kib,
            "rss_full_kib": self.rss_full_kib, "bytes_per_object": self.per_object(),
            "load_seconds": self.load_secs, "load_per_s": self.load_rate()})
    }
}

/// Runs `ops` operations from `concurrency` tasks; `op(task, i)` does operation i of a task.
pub(super) async fn drive<F, Fut>(
    name: &str,
    concurrency: usize,
    ops: usize,
    op: F,
) -> Result<Sample>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let op = Arc::new(op);
    let per_task = ops.div_ceil(concurrency);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let t0 = Instant::now();
                op(t, i).await?;
                lat.push(t0.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    Ok(Sample {
        name: name.to_string(),
        variant: Variant::TlsRbac,
        concurrency,
        latencies,
        elapsed: started.elapsed(),
    })
}

/// `conc` requests at once on `c`, so its connection pool holds `conc` open connections.
async fn warm_pool(c: &Client, ns: &str, conc: usize) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let calls = (0..conc).map(|_| {
        let a = api.clone();
        async move { a.list(&ListParams::default().limit(1)).await }
    });
    for r in futures::future::join_all(calls).await {
        r?;
    }
    Ok(())
}

/// One (operation, concurrency) cell on one server's namespace.
async fn cell(api: &Api<ConfigMap>, op: &str, conc: usize, ops: usize) -> Result<Sample> {
    let a = api.clone();
    match op {
        "create" => {
            drive(op, conc, ops, move |t, i| {
                let a = a.clone();
                async move {
                    a.create(
                        &PostParams::default(),
                        &cm(&format!("o-{t}-{i}"), json!({})),
                    )
                    .await?;
                    Ok(())
                }
            })
            .await
        }
        "update" => {
            drive(op, conc, ops, move |t, i| {
                let a = a.clone();
                async move {
                    // Each task rewrites its own objects: no conflicts, a real CAS each time.
                    let o = cm(&format!("o-{t}-{i}"), json!({"rev": i.to_string()}));
                    a.replace(&format!("o-{t}-{i}"), &PostParams::default(), &o)
                        .await?;
                    Ok(())
                }
            })
            .await
        }
        "get" => {
            drive(op, conc, ops, move |t, i| {
                let a = a.clone();
                async move {
                    a.get(&format!("o-{t}-{i}")).await?;
                    Ok(())
                }
            })
            .await
        }
        _ => {
            drive(op, conc, ops / 4, move |_, _| {
                let a = a.clone();
                async move {
                    a.list(&ListParams::default().limit(100)).await?;
                    Ok(())
                }
            })
            .await
        }
    }
}

const OPERATIONS: [&str; 4] = ["create", "update", "get", "list (100)"];

async fn measure(opts: &Opts, servers: &Servers<'_>) -> Result<Results> {
    let c = &servers.admin;
    let both = servers.cmp.both();
    let pid = servers.measured.pid().context("server pid")?;
    let rss_empty_kib = rss_kib(pid)?;
    let mut samples = Vec::new();
    for &conc in &CONCURRENCY {
        let ns = format!("bench-c{conc}");
        for v in both {
            namespace(&servers.of(v).0, &ns).await?;
        }
        eprintln!("bench api: {conc} clients");
        // Open the connections this concurrency needs before timing anything: otherwise the
        // first cell (create) pays one TLS handshake per new client connection, a cost the
        // handshake rows measure on their own, and its p99 measures connection set-up.
        for v in both {
            warm_pool(&servers.of(v).0, &ns, conc).await?;
        }
        // Each cell on both servers one after the other, so both see the same machine load.
        for op in OPERATIONS {
            for v in both {
                let api: Api<ConfigMap> = Api::namespaced(servers.of(v).0.clone(), &ns);
                let mut s = cell(&api, op, conc, opts.ops).await?;
                s.variant = v;
                samples.push(s);
            }
        }
    }
    for v in both {
        samples.push(paced_creates(&servers.of(v).0, v, 100, Duration::from_secs(10)).await?);
    }
    let mut watch = Vec::new();
    for &w in &opts.watchers {
        for v in both {
            let (c, kubeconfig) = servers.of(v);
            let mut s = watch_latency(c, kubeconfig, w, 100).await?;
            s.variant = v;
            watch.push(s);
        }
    }
    let load = load_objects(c, opts.objects).await?;
    let memory = Memory {
        rss_empty_kib,
        rss_full_kib: rss_kib(pid)?,
        objects: load.latencies.len(),
        load_secs: load.elapsed.as_secs_f64(),
    };
    let authz = if servers.cmp.measured == Variant::TlsRbac {
        super::api_authz::measure(c, servers.measured).await?
    } else {
        Vec::new()
    };
    Ok(Results {
        samples,
        watch,
        memory,
        baseline_memory: None,
        etcd_rss_kib: 0,
        authz,
    })
}

/// Stores `objects` ConfigMaps from 64 clients (the memory figure's load).
async fn load_objects(c: &Client, objects: usize) -> Result<Sample> {
    eprintln!("bench api: storing {objects} objects");
    namespace(c, "bench-mem").await?;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "bench-mem");
    drive("load", 64, objects, move |t, i| {
        let a = api.clone();
        async move {
            a.create(
                &PostParams::default(),
                &cm(&format!("m-{t}-{i}"), json!({})),
            )
            .await?;
            Ok(())
        }
    })
    .await
}

/// Creates at a fixed rate (the "p99 under 25 ms at 100 writes/s").
async fn paced_creates(
    c: &Client,
    variant: Variant,
    per_sec: u64,
    for_: Duration,
) -> Result<Sample> {
    eprintln!("bench api: creates paced at {per_sec}/s ({variant:?})");
    namespace(c, "bench-paced").await?;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "bench-paced");
    let n = per_sec * for_.as_secs();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        tick.tick().await;
        let a = api.clone();
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            a.create(&PostParams::default(), &cm(&format!("p-{i}"), json!({})))
                .await?;
            Ok::<_, anyhow::Error>(t0.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.push(t.await??);
    }
    Ok(Sample {
        name: format!("create @{per_sec}/s"),
        variant,
        concurrency: 0,
        latencies,
        elapsed: started.elapsed(),
    })
}

/// `watchers` watches on one namespace, then `writes` creates 20 ms apart; each event's
/// latency is its arrival minus its write's start (sent in an annotation, same clock).
async fn watch_latency(
    c: &Client,
    kubeconfig: &std::path::Path,
    watchers: usize,
    writes: usize,
) -> Result<Sample> {
    eprintln!("bench api: watch delivery to {watchers} watchers");
    let ns = format!("bench-w{watchers}");
    namespace(c, &ns).await?;
    let base = Instant::now();
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), &ns);
    let rv = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut tasks = Vec::new();
    // Watchers get their own clients (connection pools) so they do not queue behind writes.
    let watch_client = client(kubeconfig).await?;
    for _ in 0..watchers {
        let api: Api<ConfigMap> = Api::namespaced(watch_client.clone(), &ns);
        let mut stream = api
            .watch(&WatchParams::default().timeout(120), &rv)
            .await?
            .boxed();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(writes);
            while lat.len() < writes {
                match stream.try_next().await? {
                    Some(WatchEvent::Added(o)) => {
                        let sent: u64 = o
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("sent-us"))
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        let now = base.elapsed().as_micros() as u64;
                        lat.push(Duration::from_micros(now.saturating_sub(sent)));
                    }
                    Some(_) => {}
                    None => anyhow::bail!("watch ended early"),
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for i in 0..writes {
        tick.tick().await;
        let sent = base.elapsed().as_micros().to_string();
        api.create(
            &PostParams::default(),
            &cm(&format!("w-{i}"), json!({"sent-us": sent})),
        )
        .await?;
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(tokio::time::timeout(Duration::from_secs(120), t).await???);
    }
    Ok(Sample {
        name: "watch delivery".into(),
        variant: Variant::TlsRbac,
        concurrency: watchers,
        latencies,
        elapsed: started.elapsed(),
    })
}

pub(super) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The baseline's sample of the same cell as `s`.
fn baseline_of<'a>(all: &'a [Sample], baseline: Variant, s: &Sample) -> Option<&'a Sample> {
    all.iter()
        .find(|b| b.variant == baseline && b.name == s.name && b.concurrency == s.concurrency)
}

fn report(
    cmp: Comparison,
    r: Results,
    handshakes: &[super::api_tls::Handshakes],
    failovers: Option<&[Duration]>,
) -> Result<()> {
    let (bl, ml) = (cmp.baseline_label, cmp.measured_label);
    let mut md = format!(
        "{}\n\n| operation | clients | {bl} ops/s | {bl} p50 ms | {bl} p99 ms | {ml} ops/s | {ml} p50 ms | {ml} p99 ms | p99 {ml} / {bl} | {ml} p99 / SLO (1 s) |\n|---|---|---|---|---|---|---|---|---|---|\n",
        cmp.intro
    );
    let mut rows = Vec::new();
    let mut create_ratios = Vec::new();
    let mut throughput_ratios = Vec::new();
    for s in r.samples.iter().filter(|s| s.variant == cmp.measured) {
        let Some(b) = baseline_of(&r.samples, cmp.baseline, s) else {
            continue;
        };
        let mutating = s.name.starts_with("create") || s.name.starts_with("update");
        let slo = if mutating {
            format!(
                "{:.4}",
                s.pct(0.99).as_secs_f64() / SLO_MUTATING.as_secs_f64()
            )
        } else {
            "-".into()
        };
        let clients = if s.concurrency == 0 {
            "paced".to_string()
        } else {
            s.concurrency.to_string()
        };
        let ratio = s.pct(0.99).as_secs_f64() / b.pct(0.99).as_secs_f64().max(1e-9);
        if s.name.starts_with("create") {
            create_ratios.push(format!("{ratio:.2}x ({clients})"));
        }
        if mutating && s.concurrency > 0 {
            throughput_ratios.push(format!(
                "{} {clients}: {:.2}x",
                s.name,
                b.rate() / s.rate().max(1e-9)
            ));
        }
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2}x | {} |\n",
            s.name,
            clients,
            b.rate(),
            ms(b.pct(0.5)),
            ms(b.pct(0.99)),
            s.rate(),
            ms(s.pct(0.5)),
            ms(s.pct(0.99)),
            ratio,
            slo
        ));
        for x in [b, s] {
            rows.push(json!({"operation": x.name, "server": x.variant.key(),
                "clients": x.concurrency, "ops": x.latencies.len(), "ops_per_s": x.rate(),
                "p50_ms": ms(x.pct(0.5)), "p99_ms": ms(x.pct(0.99))}));
        }
    }
    if cmp.measured == Variant::Etcd {
        md.push_str(&format!(
            "\ncreate p99, etcd over embedded: {}. Mutating throughput, embedded over etcd: {} (aim: at least {EMBEDDED_THROUGHPUT_AIM}x; etcd's mutating p99 at 64 clients within {} ms).\n",
            create_ratios.join(", "),
            throughput_ratios.join(", "),
            ETCD_P99_AIM.as_millis()
        ));
    } else {
        md.push_str(&format!(
            "\ncreate p99, TLS+RBAC over plain: {} (aim: within {CREATE_P99_AIM}x).\n",
            create_ratios.join(", ")
        ));
    }
    md.push_str(&format!("\n| watchers | events delivered | {bl} p50 ms | {bl} p99 ms | {ml} p50 ms | {ml} p99 ms | p99 {ml} / {bl} |\n|---|---|---|---|---|---|---|\n"));
    let mut watch_rows = Vec::new();
    for s in r.watch.iter().filter(|s| s.variant == cmp.measured) {
        let Some(b) = baseline_of(&r.watch, cmp.baseline, s) else {
            continue;
        };
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |\n",
            s.concurrency,
            s.latencies.len(),
            ms(b.pct(0.5)),
            ms(b.pct(0.99)),
            ms(s.pct(0.5)),
            ms(s.pct(0.99)),
            s.pct(0.99).as_secs_f64() / b.pct(0.99).as_secs_f64().max(1e-9)
        ));
        for x in [b, s] {
            watch_rows.push(json!({"watchers": x.concurrency, "server": x.variant.key(),
                "events": x.latencies.len(), "p50_ms": ms(x.pct(0.5)), "p99_ms": ms(x.pct(0.99))}));
        }
    }
    let mut handshake_rows = Vec::new();
    if !handshakes.is_empty() {
        md.push_str(
            "\n| TLS handshakes (full, no resumption) | client threads | handshakes | per second | p50 ms | p99 ms |\n|---|---|---|---|---|---|\n",
        );
    }
    for h in handshakes {
        let what = if h.client_cert {
            "with a client certificate"
        } else {
            "server certificate only"
        };
        md.push_str(&format!(
            "| {what} | {} | {} | {:.0} | {:.2} | {:.2} |\n",
            h.threads,
            h.count,
            h.per_sec(),
            ms(h.pct(0.5)),
            ms(h.pct(0.99))
        ));
        handshake_rows.push(json!({"client_certificate": h.client_cert, "threads": h.threads,
            "handshakes": h.count, "per_s": h.per_sec(), "p50_ms": ms(h.pct(0.5)), "p99_ms": ms(h.pct(0.99))}));
    }
    let memory_line = |label: &str, m: &Memory| {
        format!(
            "\nMemory ({label} server): {} objects stored by 64 clients in {:.1} s ({:.0}/s); server RSS {:.1} MiB empty, {:.1} MiB full ({:.0} bytes per object).\n",
            m.objects,
            m.load_secs,
            m.load_rate(),
            m.rss_empty_kib as f64 / 1024.0,
            m.rss_full_kib as f64 / 1024.0,
            m.per_object()
        )
    };
    if let Some(b) = &r.baseline_memory {
        md.push_str(&memory_line(bl, b));
    }
    md.push_str(&memory_line(ml, &r.memory));
    if r.etcd_rss_kib > 0 {
        md.push_str(&format!(
            "etcd members' RSS (summed) after the load: {:.1} MiB.\n",
            r.etcd_rss_kib as f64 / 1024.0
        ));
    }
    if let Some(b) = &r.baseline_memory {
        md.push_str(&format!(
            "Load rate, {bl} over {ml}: {:.2}x.\n",
            b.load_rate() / r.memory.load_rate().max(1e-9)
        ));
    }
    let mut failover_json = serde_json::Value::Null;
    if let Some(f) = failovers.filter(|f| !f.is_empty()) {
        let mut v = f.to_vec();
        v.sort();
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        md.push_str(&format!(
            "\nFail-over, etcd leader killed (SIGKILL) to the first write through the API server that succeeds, {} kills: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (writes started every 20 ms).\n",
            v.len(),
            ms(at(0.5)),
            ms(at(0.99)),
            ms(v[v.len() - 1])
        ));
        failover_json = json!({"kills": v.len(), "p50_ms": ms(at(0.5)), "p99_ms": ms(at(0.99)),
            "all_ms": v.iter().map(|d| ms(*d)).collect::<Vec<_>>()});
    }
    let (authz_md, authz_rows) = super::api_authz::report(&r.authz);
    if !r.authz.is_empty() {
        md.push_str(&authz_md);
    }
    println!("{md}");
    let out = root().join("bench-results");
    std::fs::create_dir_all(&out)?;
    let doc = json!({
        "baseline": cmp.baseline.key(),
        "measured": cmp.measured.key(),
        "latency": rows,
        "watch": watch_rows,
        "tls_handshakes": handshake_rows,
        "create_p99_aim_vs_plain": CREATE_P99_AIM,
        "memory": r.memory.json(),
        "baseline_memory": r.baseline_memory.as_ref().map(Memory::json),
        "etcd_rss_kib": r.etcd_rss_kib,
        "failover": failover_json,
        "slo_mutating_p99_seconds": SLO_MUTATING.as_secs_f64(),
        "authorization": authz_rows,
    });
    let colors = [
        ("#1f77b4", "#aec7e8"),
        ("#d62728", "#ff9896"),
        ("#2ca02c", "#98df8a"),
        ("#9467bd", "#c5b0d5"),
    ];
    let mut series: Vec<Series> = Vec::new();
    for (op, (measured_color, baseline_color)) in OPERATIONS.iter().zip(colors) {
        for (variant, color, label) in [
            (cmp.measured, measured_color, ml),
            (cmp.baseline, baseline_color, bl),
        ] {
            series.push(Series {
                name: format!("{op} p99 {label}"),
                color,
                points: r
                    .samples
                    .iter()
                    .filter(|s| s.name == *op && s.variant == variant)
                    .map(|s| (s.concurrency as f64, ms(s.pct(0.99))))
                    .collect(),
            });
        }
    }
    let title = format!("API server p99 latency vs concurrent clients ({ml} and {bl})");
    let svg = plot::svg(
        &Chart {
            title: &title,
            x_label: "concurrent clients",
            y_label: "p99 ms",
            log_x: true,
            log_y: true,
        },
        &series,
    );
    let docs = root().join("docs/bench");
    std::fs::create_dir_all(&docs)?;
    let stem = cmp.stem;
    for dir in [&out, &docs] {
        std::fs::write(
            dir.join(format!("{stem}.json")),
            serde_json::to_string_pretty(&doc)?,
        )?;
        std::fs::write(dir.join(format!("{stem}.md")), &md)?;
        std::fs::write(dir.join(format!("{stem}-latency.svg")), &svg)?;
    }
    eprintln!("bench api: wrote bench-results/{stem}.{{json,md}} and {stem}-latency.svg (copied to docs/bench/)");
    Ok(())
}
