//! `cargo xtask bench dns`: skiff-dns (release build, its own process pinned to one core)
//! answering A queries for 10,000 Services it learned from a real API server, against the
//! baseline measured in the same run: the same hickory-server listeners answering the same
//! names from a static table (`skiff-dns --static-zone`, dns/src/baseline.rs), so the ratio
//! is skiff-dns's own cost (zone lookup, metrics). Load: UDP clients on the other core, each
//! keeping a window of queries in flight (saturated: queries/s and p99), then one query at
//! a time (the unloaded latency). Then the time from a Service's creation (the POST) to its
//! name resolving, polled every millisecond, over many Services. Prints a table, writes
//! bench-results/dns.{json,md} (copied to docs/bench/).
//!
//! The load generator shares the machine's 2 cores with the server (and with whatever else
//! runs): it is on the other core, and a single core's rate is capped by the kernel's UDP
//! path on both sides as much as by the server.

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skiff_launcher::apiserver::ApiServerProcess;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client;
use crate::setup::{root, run};

#[derive(clap::Args)]
pub struct Opts {
    /// Services in the API (and names in the baseline's table).
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Client threads of the saturating load (all on the load generator's core).
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Queries each client keeps in flight when saturating.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Services created one after the other for the creation-to-resolvable time.
    #[arg(long, default_value_t = 200)]
    creations: usize,
}

const NAMESPACE: &str = "bench";
const DOMAIN: &str = "cluster.local";
/// The server's core and the load generator's.
const SERVER_CPU: usize = 1;
const CLIENT_CPU: usize = 0;

/// One measurement of one server.
#[derive(Clone, Debug)]
struct Measured {
    server: &'static str,
    mode: &'static str,
    answered: usize,
    failed: usize,
    lost: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.answered as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn pct(&self, p: f64) -> Duration {
        pct(&self.latencies, p)
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A DNS query for `name`'s A record, its id left 0 (set per send).
fn query(name: &str) -> Vec<u8> {
    let mut q = vec![0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// (id, rcode, answer count) of a response.
fn parse(resp: &[u8]) -> Option<(u16, u8, u16)> {
    if resp.len() < 12 {
        return None;
    }
    Some((
        u16::from_be_bytes([resp[0], resp[1]]),
        resp[3] & 0x0f,
        u16::from_be_bytes([resp[6], resp[7]]),
    ))
}

/// Pins the calling thread to one CPU.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
    // touch the set we own, for this thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One client: `window` queries in flight over the names in turn, for `secs`.
fn client_loop(
    addr: SocketAddr,
    queries: &[Vec<u8>],
    first: usize,
    window: usize,
    secs: Duration,
) -> Result<Measured> {
    pin(CLIENT_CPU);
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut sent_at: Vec<Option<Instant>> = vec![None; 1 << 16];
    let mut next_id: u16 = 0;
    let mut next_name = first;
    let mut m = Measured {
        server: "",
        mode: "",
        answered: 0,
        failed: 0,
        lost: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    let mut send = |sent_at: &mut Vec<Option<Instant>>| -> Result<()> {
        let mut q = queries[next_name % queries.len()].clone();
        next_name += 1;
        next_id = next_id.wrapping_add(1);
        q[0..2].copy_from_slice(&next_id.to_be_bytes());
        sent_at[next_id as usize] = Some(Instant::now());
        sock.send(&q)?;
        Ok(())
    };
    let start = Instant::now();
    for _ in 0..window {
        send(&mut sent_at)?;
    }
    let mut buf = [0u8; 1500];
    while start.elapsed() < secs {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let Some((id, rcode, answers)) = parse(&buf[..n]) else {
                    continue;
                };
                let Some(t) = sent_at[id as usize].take() else {
                    continue;
                };
                m.latencies.push(t.elapsed());
                if rcode == 0 && answers >= 1 {
                    m.answered += 1;
                } else {
                    m.failed += 1;
                }
                send(&mut sent_at)?;
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                // Lost in a full socket buffer: count them, start the window again.
                let lost = sent_at.iter_mut().filter_map(Option::take).count();
                m.lost += lost;
                for _ in 0..window {
                    send(&mut sent_at)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    m.elapsed = start.elapsed();
    Ok(m)
}

/// `clients` clients of `window` each against `addr`, merged.
fn load(
    server: &'static str,
    mode: &'static str,
    addr: SocketAddr,
    queries: &[Vec<u8>],
    clients: usize,
    window: usize,
    secs: Duration,
) -> Result<Measured> {
    let parts: Vec<Result<Measured>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let first = i * queries.len() / clients.max(1);
                s.spawn(move || client_loop(addr, queries, first, window, secs))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    let mut all = Measured {
        server,
        mode,
        answered: 0,
        failed: 0,
        lost: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for p in parts {
        let p = p?;
        all.answered += p.answered;
        all.failed += p.failed;
        all.lost += p.lost;
        all.elapsed = all.elapsed.max(p.elapsed);
        all.latencies.extend(p.latencies);
    }
    all.latencies.sort();
    Ok(all)
}

/// One A query, answered with at least one record within `timeout`?
fn resolves(sock: &UdpSocket, q: &[u8], id: u16) -> bool {
    let mut q = q.to_vec();
    q[0..2].copy_from_slice(&id.to_be_bytes());
    if sock.send(&q).is_err() {
        return false;
    }
    let mut buf = [0u8; 1500];
    while let Ok(n) = sock.recv(&mut buf) {
        if let Some((rid, rcode, answers)) = parse(&buf[..n]) {
            if rid == id {
                return rcode == 0 && answers >= 1;
            }
        }
    }
    false
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `skiff-dns ARGS` on [`SERVER_CPU`] (taskset), its log in `log`.
fn spawn_dns(bin: &Path, args: &[String], log: &Path) -> Result<Killed> {
    let out = std::fs::File::create(log)?;
    let child = Command::new("taskset")
        .args(["-c", &SERVER_CPU.to_string()])
        .arg(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting skiff-dns under taskset")?;
    Ok(Killed(child))
}

/// Waits until `addr` answers `q` (a name it has) within `timeout`.
fn wait_answers(addr: SocketAddr, q: &[u8], timeout: Duration, log: &Path) -> Result<()> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let deadline = Instant::now() + timeout;
    let mut id = 1u16;
    while !resolves(&sock, q, id) {
        if Instant::now() > deadline {
            bail!(
                "{addr} did not answer within {timeout:?}; see {}",
                log.display()
            );
        }
        id = id.wrapping_add(1);
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))?)
}

pub fn run_bench(opts: Opts) -> Result<()> {
    eprintln!("bench dns: building control-plane and skiff-dns (release)");
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "control-plane",
        "-p",
        "dns",
    ]))?;
    let target = crate::images::target_dir().join("release");
    let scratch = std::env::temp_dir().join(format!("skiff-bench-dns-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = bench(&opts, &target, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn bench(opts: &Opts, target: &Path, scratch: &Path) -> Result<()> {
    let server = ApiServerProcess::start(&target.join("control-plane"), &scratch.join("api"), &[]);
    let rt = tokio::runtime::Runtime::new()?;
    let kubeconfig = server.kubeconfig();
    let names: Vec<String> = (0..opts.services).map(|i| format!("svc-{i}")).collect();
    let t0 = Instant::now();
    let ips: Vec<(String, String)> = rt.block_on(async {
        let c = client(&kubeconfig).await?;
        super::api::namespace(&c, NAMESPACE).await?;
        let api: Api<Service> = Api::namespaced(c.clone(), NAMESPACE);
        futures::stream::iter(names.iter())
            .map(|n| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &service(n)?)
                        .await
                        .map_err(anyhow::Error::from)
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let list = api.list(&ListParams::default()).await?;
        Ok::<_, anyhow::Error>(
            list.items
                .into_iter()
                .filter_map(|s| {
                    let ip = s.spec?.cluster_ip?;
                    Some((s.metadata.name?, ip))
                })
                .collect(),
        )
    })?;
    eprintln!(
        "bench dns: {} Services created in {:.1?}",
        ips.len(),
        t0.elapsed()
    );
    if ips.len() != opts.services {
        bail!("{} Services listed, {} created", ips.len(), opts.services);
    }
    let fqdn = |name: &str| format!("{name}.{NAMESPACE}.svc.{DOMAIN}.");
    let table: String = ips
        .iter()
        .map(|(n, ip)| format!("{} {ip}\n", fqdn(n)))
        .collect();
    let zone = scratch.join("zone");
    std::fs::write(&zone, table)?;
    // No upstream: every query here is in the cluster domain, and nothing may leave.
    let resolv = scratch.join("resolv.conf");
    std::fs::write(&resolv, "options ndots:1\n")?;
    let queries: Vec<Vec<u8>> = ips.iter().map(|(n, _)| query(&fqdn(n))).collect();

    let bin = target.join("skiff-dns");
    let skiff_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let skiff_log = scratch.join("skiff-dns.log");
    let started = Instant::now();
    let _skiff = spawn_dns(
        &bin,
        &[
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--listen".into(),
            skiff_addr.to_string(),
            "--metrics-listen".into(),
            metrics_addr.to_string(),
            "--resolv-conf".into(),
            resolv.display().to_string(),
        ],
        &skiff_log,
    )?;
    // The last name listed answering means the first listing is in.
    wait_answers(
        skiff_addr,
        &queries[queries.len() - 1],
        Duration::from_secs(120),
        &skiff_log,
    )?;
    let synced = started.elapsed();
    eprintln!(
        "bench dns: skiff-dns serves {} names after {synced:.1?}",
        queries.len()
    );
    let base_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let base_log = scratch.join("baseline.log");
    let _base = spawn_dns(
        &bin,
        &[
            "--static-zone".into(),
            zone.display().to_string(),
            "--listen".into(),
            base_addr.to_string(),
        ],
        &base_log,
    )?;
    wait_answers(base_addr, &queries[0], Duration::from_secs(30), &base_log)?;

    let secs = Duration::from_secs(opts.secs);
    let mut rows = Vec::new();
    for (mode, clients, window) in [
        ("saturated", opts.clients, opts.window),
        ("one at a time", 1, 1),
    ] {
        for (server, addr) in [
            ("static zone (baseline)", base_addr),
            ("skiff-dns", skiff_addr),
        ] {
            eprintln!("bench dns: {server}, {mode}");
            rows.push(load(server, mode, addr, &queries, clients, window, secs)?);
        }
    }

    // Creation to resolvable: POST, then the name polled every millisecond.
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(skiff_addr)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut creation: Vec<Duration> = Vec::new();
    let mut id = 0u16;
    let api: Api<Service> = Api::namespaced(rt.block_on(client(&kubeconfig))?, NAMESPACE);
    for i in 0..opts.creations {
        let name = format!("new-{i}");
        let q = query(&fqdn(&name));
        let svc = service(&name)?;
        let t0 = Instant::now();
        rt.block_on(api.create(&PostParams::default(), &svc))?;
        loop {
            id = id.wrapping_add(1);
            if resolves(&sock, &q, id) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!(
                    "{name} did not resolve within 30 s; see {}",
                    skiff_log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        creation.push(t0.elapsed());
    }
    creation.sort();
    report(opts, &rows, &creation, synced)
}

fn report(opts: &Opts, rows: &[Measured], creation: &[Duration], synced: Duration) -> Result<()> {
    let base = |mode: &str| {
        rows.iter()
            .find(|r| r.mode == mode && r.server.starts_with("static"))
            .cloned()
    };
    let mut md = String::new();
    md.push_str(&format!(
        "A queries for {} Services' names over UDP; server pinned to one core, load generator on the other ({} clients x {} in flight when saturated; {} s each).\n\n",
        opts.services, opts.clients, opts.window, opts.secs
    ));
    md.push_str("| load | server | queries/s | vs baseline | p50 ms | p99 ms | p99 vs baseline | failed | lost |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut json_rows = Vec::new();
    for r in rows {
        let b = base(r.mode);
        let rate_ratio = b.as_ref().map(|b| r.rate() / b.rate().max(1e-9));
        let p99_ratio = b
            .as_ref()
            .map(|b| r.pct(0.99).as_secs_f64() / b.pct(0.99).as_secs_f64().max(1e-9));
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.2} | {} | {} |\n",
            r.mode,
            r.server,
            r.rate(),
            rate_ratio.unwrap_or(1.0),
            ms(r.pct(0.5)),
            ms(r.pct(0.99)),
            p99_ratio.unwrap_or(1.0),
            r.failed,
            r.lost
        ));
        json_rows.push(json!({
            "load": r.mode, "server": r.server, "queries_per_second": r.rate(),
            "rate_vs_baseline": rate_ratio, "p50_ms": ms(r.pct(0.5)), "p99_ms": ms(r.pct(0.99)),
            "p99_vs_baseline": p99_ratio, "answered": r.answered, "failed": r.failed, "lost": r.lost,
        }));
    }
    md.push_str(&format!(
        "\nService created (POST) -> its name resolves at skiff-dns (polled every 1 ms), {} Services: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms. skiff-dns's first sync of {} Services: {:.2} s.\n",
        creation.len(),
        ms(pct(creation, 0.5)),
        ms(pct(creation, 0.99)),
        ms(pct(creation, 1.0)),
        opts.services,
        synced.as_secs_f64()
    ));
    eprintln!();
    eprint!("{md}");
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&docs)?;
    let json = json!({
        "services": opts.services, "secs": opts.secs, "clients": opts.clients, "window": opts.window,
        "rows": json_rows,
        "creation_to_resolvable_ms": {"count": creation.len(), "p50": ms(pct(creation, 0.5)),
            "p99": ms(pct(creation, 0.99)), "max": ms(pct(creation, 1.0))},
        "first_sync_seconds": synced.as_secs_f64(),
    });
    let text = format!("# cargo xtask bench dns\n\n{md}");
    for dir in [&out, &docs] {
        std::fs::write(dir.join("dns.json"), serde_json::to_vec_pretty(&json)?)?;
        std::fs::write(dir.join("dns.md"), &text)?;
    }
    eprintln!("bench dns: wrote bench-results/dns.{{json,md}} (copied to docs/bench/)");
    Ok(())
}
