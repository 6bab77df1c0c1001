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
}

/// How the server is reached and who decides, the two ways the table is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Security {
    /// Plain HTTP, a static token, `--authorization-mode AlwaysAllow` (the baseline).
    Plain,
    /// TLS, a client certificate, RBAC (a ClusterRoleBinding; not the system:masters bypass).
    TlsRbac,
}

impl Security {
    const BOTH: [Security; 2] = [Security::Plain, Security::TlsRbac];

    fn key(self) -> &'static str {
        match self {
            Security::Plain => "plain_http_always_allow",
            Security::TlsRbac => "tls_client_cert_rbac",
        }
    }
}

/// Aim for the cost of TLS and RBAC: create p99 within this factor of the baseline's.
const CREATE_P99_AIM: f64 = 1.15;

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Kubernetes' API call latency SLO for mutating calls (p99).
const SLO_MUTATING: Duration = Duration::from_secs(1);

/// Latency samples of one measurement.
pub(super) struct Sample {
    name: String,
    security: Security,
    concurrency: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Sample {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.latencies.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    fn rate(&self) -> f64 {
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
    eprintln!("bench api: building control-plane (release)");
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
    let bin = target.join("release/control-plane");
    let scratch = tempdir()?;
    let tls_data = scratch.join("tls-data");
    let server = ApiServerProcess::start(&bin, &tls_data, &["--bookmark-interval", "60"]);
    let mut plain_args = vec!["--bookmark-interval".to_string(), "60".to_string()];
    plain_args.extend(super::api_tls::plain_args(&scratch)?);
    let plain_args: Vec<&str> = plain_args.iter().map(String::as_str).collect();
    let plain = ApiServerProcess::start(&bin, &scratch.join("plain-data"), &plain_args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let admin = client(&server.kubeconfig()).await?;
        let user =
            |path: PathBuf| async move { Ok::<_, anyhow::Error>((client(&path).await?, path)) };
        let servers = Servers {
            tls: &server,
            tls_user: user(
                super::api_tls::rbac_kubeconfig(&bin, &server, &tls_data, &admin, &scratch).await?,
            )
            .await?,
            plain_user: user(super::api_tls::plain_kubeconfig(&plain, &scratch)?).await?,
            admin,
        };
        measure(&opts, &servers).await
    });
    drop(plain);
    let handshakes = result.and_then(|r| {
        eprintln!("bench api: TLS handshakes");
        let access = server.admin();
        let secs = Duration::from_secs(opts.handshake_secs.max(1));
        let mut h = Vec::new();
        for client_cert in [false, true] {
            h.push(super::api_tls::handshakes(&access, client_cert, secs)?);
        }
        Ok((r, h))
    });
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
    let (r, h) = handshakes?;
    report(r, &h)
}

/// The two servers of the run and their measured clients (with their kubeconfigs).
struct Servers<'a> {
    /// TLS + RBAC (the default server).
    tls: &'a ApiServerProcess,
    /// The bench user on it: a client certificate, authorized by RBAC.
    tls_user: (Client, PathBuf),
    /// The admin of the TLS server (system:masters): memory and authorization rows.
    admin: Client,
    /// The bench user on the plain HTTP, AlwaysAllow server: a static token.
    plain_user: (Client, PathBuf),
}

impl Servers<'_> {
    fn of(&self, s: Security) -> &(Client, PathBuf) {
        match s {
            Security::Plain => &self.plain_user,
            Security::TlsRbac => &self.tls_user,
        }
    }
}

fn tempdir() -> Result<PathBuf> {
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
    rss_empty_kib: u64,
    rss_full_kib: u64,
    objects: usize,
    load_secs: f64,
    authz: Vec<super::api_authz::Row>,
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
        security: Security::TlsRbac,
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
    let pid = servers.tls.pid().context("server pid")?;
    let rss_empty_kib = rss_kib(pid)?;
    let mut samples = Vec::new();
    for &conc in &CONCURRENCY {
        let ns = format!("bench-c{conc}");
        for security in Security::BOTH {
            namespace(&servers.of(security).0, &ns).await?;
        }
        eprintln!("bench api: {conc} clients");
        // Open the connections this concurrency needs before timing anything: otherwise the
        // first cell (create) pays one TLS handshake per new client connection, a cost the
        // handshake rows measure on their own, and its p99 measures connection set-up.
        for security in Security::BOTH {
            warm_pool(&servers.of(security).0, &ns, conc).await?;
        }
        // Each cell on both servers one after the other, so both see the same machine load.
        for op in OPERATIONS {
            for security in Security::BOTH {
                let api: Api<ConfigMap> = Api::namespaced(servers.of(security).0.clone(), &ns);
                let mut s = cell(&api, op, conc, opts.ops).await?;
                s.security = security;
                samples.push(s);
            }
        }
    }
    for security in Security::BOTH {
        samples.push(
            paced_creates(
                &servers.of(security).0,
                security,
                100,
                Duration::from_secs(10),
            )
            .await?,
        );
    }
    let mut watch = Vec::new();
    for &w in &opts.watchers {
        for security in Security::BOTH {
            let (c, kubeconfig) = servers.of(security);
            let mut s = watch_latency(c, kubeconfig, w, 100).await?;
            s.security = security;
            watch.push(s);
        }
    }
    eprintln!("bench api: storing {} objects", opts.objects);
    namespace(c, "bench-mem").await?;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "bench-mem");
    let load = drive("load", 64, opts.objects, move |t, i| {
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
    .await?;
    let rss_full_kib = rss_kib(pid)?;
    let authz = super::api_authz::measure(c, servers.tls).await?;
    Ok(Results {
        samples,
        watch,
        rss_empty_kib,
        rss_full_kib,
        objects: load.latencies.len(),
        load_secs: load.elapsed.as_secs_f64(),
        authz,
    })
}

/// Creates at a fixed rate (the "p99 under 25 ms at 100 writes/s").
async fn paced_creates(
    c: &Client,
    security: Security,
    per_sec: u64,
    for_: Duration,
) -> Result<Sample> {
    eprintln!("bench api: creates paced at {per_sec}/s ({security:?})");
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
        security,
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
        security: Security::TlsRbac,
        concurrency: watchers,
        latencies,
        elapsed: started.elapsed(),
    })
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The baseline's sample of the same cell as `s`.
fn baseline_of<'a>(all: &'a [Sample], s: &Sample) -> Option<&'a Sample> {
    all.iter().find(|b| {
        b.security == Security::Plain && b.name == s.name && b.concurrency == s.concurrency
    })
}

fn report(r: Results, handshakes: &[super::api_tls::Handshakes]) -> Result<()> {
    let mut md = String::from(
        "Each cell measured on two servers one after the other: plain HTTP with AlwaysAllow (a static token; the baseline) and TLS with a client certificate authorized by RBAC.\n\n\
         | operation | clients | plain ops/s | plain p50 ms | plain p99 ms | TLS+RBAC ops/s | TLS+RBAC p50 ms | TLS+RBAC p99 ms | p99 TLS+RBAC / plain | TLS+RBAC p99 / SLO (1 s) |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut rows = Vec::new();
    let mut create_ratios = Vec::new();
    for s in r.samples.iter().filter(|s| s.security == Security::TlsRbac) {
        let Some(b) = baseline_of(&r.samples, s) else {
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
            rows.push(json!({"operation": x.name, "security": x.security.key(),
                "clients": x.concurrency, "ops": x.latencies.len(), "ops_per_s": x.rate(),
                "p50_ms": ms(x.pct(0.5)), "p99_ms": ms(x.pct(0.99))}));
        }
    }
    md.push_str(&format!(
        "\ncreate p99, TLS+RBAC over plain: {} (aim: within {CREATE_P99_AIM}x).\n",
        create_ratios.join(", ")
    ));
    md.push_str("\n| watchers | events delivered | plain p50 ms | plain p99 ms | TLS+RBAC p50 ms | TLS+RBAC p99 ms | p99 TLS+RBAC / plain |\n|---|---|---|---|---|---|---|\n");
    let mut watch_rows = Vec::new();
    for s in r.watch.iter().filter(|s| s.security == Security::TlsRbac) {
        let Some(b) = baseline_of(&r.watch, s) else {
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
            watch_rows.push(
                json!({"watchers": x.concurrency, "security": x.security.key(),
                "events": x.latencies.len(), "p50_ms": ms(x.pct(0.5)), "p99_ms": ms(x.pct(0.99))}),
            );
        }
    }
    md.push_str(
        "\n| TLS handshakes (full, no resumption) | client threads | handshakes | per second | p50 ms | p99 ms |\n|---|---|---|---|---|---|\n",
    );
    let mut handshake_rows = Vec::new();
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
    let per_object =
        (r.rss_full_kib.saturating_sub(r.rss_empty_kib)) as f64 * 1024.0 / r.objects.max(1) as f64;
    md.push_str(&format!(
        "\nMemory (TLS server): {} objects stored in {:.1} s ({:.0}/s); server RSS {:.1} MiB empty, {:.1} MiB full ({:.0} bytes per object).\n",
        r.objects,
        r.load_secs,
        r.objects as f64 / r.load_secs.max(1e-9),
        r.rss_empty_kib as f64 / 1024.0,
        r.rss_full_kib as f64 / 1024.0,
        per_object
    ));
    let (authz_md, authz_rows) = super::api_authz::report(&r.authz);
    md.push_str(&authz_md);
    println!("{md}");
    let out = root().join("bench-results");
    std::fs::create_dir_all(&out)?;
    let doc = json!({
        "latency": rows,
        "watch": watch_rows,
        "tls_handshakes": handshake_rows,
        "create_p99_aim_vs_plain": CREATE_P99_AIM,
        "memory": {"objects": r.objects, "rss_empty_kib": r.rss_empty_kib, "rss_full_kib": r.rss_full_kib,
            "bytes_per_object": per_object, "load_seconds": r.load_secs},
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
    for (op, (tls_color, plain_color)) in OPERATIONS.iter().zip(colors) {
        for (security, color, label) in [
            (Security::TlsRbac, tls_color, "TLS+RBAC"),
            (Security::Plain, plain_color, "plain"),
        ] {
            series.push(Series {
                name: format!("{op} p99 {label}"),
                color,
                points: r
                    .samples
                    .iter()
                    .filter(|s| s.name == *op && s.security == security)
                    .map(|s| (s.concurrency as f64, ms(s.pct(0.99))))
                    .collect(),
            });
        }
    }
    let svg = plot::svg(
        &Chart {
            title: "API server p99 latency vs concurrent clients (TLS+RBAC and plain HTTP)",
            x_label: "concurrent clients",
            y_label: "p99 ms",
            log_x: true,
            log_y: true,
        },
        &series,
    );
    let docs = root().join("docs/bench");
    std::fs::create_dir_all(&docs)?;
    for dir in [&out, &docs] {
        std::fs::write(dir.join("api.json"), serde_json::to_string_pretty(&doc)?)?;
        std::fs::write(dir.join("api.md"), &md)?;
        std::fs::write(dir.join("api-latency.svg"), &svg)?;
    }
    eprintln!("bench api: wrote bench-results/api.{{json,md}} and api-latency.svg (copied to docs/bench/)");
    Ok(())
}
