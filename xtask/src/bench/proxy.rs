//! `cargo xtask bench proxy`: the service proxy against its baseline, side by side in one
//! run. For each setup a fresh network namespace (loopback only, service ranges local),
//! real HTTP backends inside it, a client cgroup, and the release proxy binary:
//!
//! - direct: the client connects to the backend itself (the physical limit);
//! - ebpf and iptables mode with 1, 1,000, 10,000 and 100,000 services.
//!
//! Per setup: new connections per second and connect() p50/p99, short HTTP requests per
//! second, and network programming: one endpoint change written to the manifests, until
//! new connections land on the new backend (end to end), and the proxy's own time to apply
//! it (its log). Medians of repeated runs. Prints a table (ratios to direct and
//! ebpf/iptables), writes JSON and SVG plots under bench-results/, copies table and plots
//! to docs/bench/.

use super::plot::{self, Chart, Series};
use crate::setup::{root, run};
use anyhow::{bail, Context, Result};
use serde_json::json;
use skiff_launcher::cgroup::Cgroup;
use skiff_launcher::netns::{NetNs, Server};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct Opts {
    /// Service counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,1000,10000,100000")]
    pub(super) services: Vec<u32>,
    /// Connections per connect() measurement.
    #[arg(long, default_value_t = 20_000)]
    pub(super) connects: usize,
    /// Requests per HTTP measurement.
    #[arg(long, default_value_t = 5000)]
    pub(super) requests: usize,
    /// Connections per chunk: the setup's client and a direct client run chunks in turn,
    /// so both see the same machine load.
    #[arg(long, default_value_t = 250)]
    pub(super) chunk: usize,
    /// Largest service count measured in iptables mode.
    #[arg(long, default_value_t = 100_000)]
    pub(super) iptables_max: u32,
    /// Give up on a setup whose initial sync takes longer (iptables-nft at 100,000
    /// services does), reporting that it did not finish.
    #[arg(long, default_value_t = 180)]
    pub(super) sync_timeout_s: u64,
    /// North-south instead: NodePort from a client namespace through the node's interface
    /// (eBPF tc, eBPF with XDP, iptables, direct), and Maglev in-process.
    #[arg(long)]
    north_south: bool,
    /// North-south paths to measure besides direct.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ebpf-tc,ebpf-xdp,iptables"
    )]
    pub(super) paths: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Direct,
    Ebpf,
    Iptables,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Ebpf => "ebpf",
            Mode::Iptables => "iptables",
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Row {
    mode: &'static str,
    services: u32,
    conn_rate: f64,
    conn_p50_us: f64,
    conn_p99_us: f64,
    http_rate: f64,
    /// Direct connections measured interleaved with this row's (same machine load).
    direct_conn_rate: f64,
    direct_http_rate: f64,
    /// Endpoint change written -> new connections on the new backend.
    change_ms: Option<f64>,
    /// The proxy's time to apply that change to the maps or rules.
    apply_ms: Option<f64>,
    /// Initial sync of all services.
    load_s: Option<f64>,
    /// The initial sync did not finish within this many seconds: nothing else measured.
    gave_up_s: Option<u64>,
    /// The kernel programs' own cost per run (eBPF: connect4 and the rest of the socket
    /// hooks), from a separate pass with the run statistics on.
    costs: Vec<super::progstats::Cost>,
}

const BACKEND_1: &str = "127.0.0.2";
const BACKEND_2: &str = "127.0.0.3";
const PORT: u16 = 8080;

/// Service addresses: 10.251.0.0/16 and 10.252.0.0/16, local only inside the bench's
/// own namespace.
pub(super) fn vip(i: u32) -> IpAddr {
    let n = i + 1;
    IpAddr::from([
        10,
        (251 + n / 65_536) as u8,
        (n / 256 % 256) as u8,
        (n % 256) as u8,
    ])
}

pub(super) fn since(t: Instant) -> String {
    format!("{:.1}s", t.elapsed().as_secs_f64())
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let started = Instant::now();
    crate::ebpf::build()?;
    eprintln!("bench proxy: building the proxy (release)");
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "proxy",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let proxy_bin = target.join("release/proxy");
    let out_dir = root().join("bench-results");
    std::fs::create_dir_all(&out_dir)?;
    if opts.north_south {
        return super::northsouth::run_bench(&opts, &proxy_bin, &out_dir, started);
    }

    let mut rows = Vec::new();
    eprintln!("[{}] direct", since(started));
    // The direct path stays set up for the whole run: every setup's chunks alternate with
    // direct ones, so each ratio compares figures taken under the same machine load.
    let direct = Bed::new()?;
    rows.push(measure(
        Mode::Direct,
        0,
        &opts,
        &proxy_bin,
        &out_dir,
        &direct,
    )?);
    for &n in &opts.services {
        for mode in [Mode::Ebpf, Mode::Iptables] {
            if mode == Mode::Iptables && n > opts.iptables_max {
                continue;
            }
            eprintln!("[{}] {} with {n} services", since(started), mode.name());
            let row = measure(mode, n, &opts, &proxy_bin, &out_dir, &direct)?;
            eprintln!(
                "    {:.0} conns/s, connect p50 {:.1} us, {:.0} req/s, change {:?} ms, apply {:?} ms",
                row.conn_rate, row.conn_p50_us, row.http_rate, row.change_ms, row.apply_ms
            );
            rows.push(row);
        }
    }
    report(&rows, &opts, &out_dir)?;
    eprintln!("[{}] done", since(started));
    Ok(())
}

/// A namespace with two backends and a client cgroup.
struct Bed {
    cg: Cgroup,
    b1: Server,
    _b2: Server,
    ns: NetNs,
}

impl Bed {
    fn new() -> Result<Bed> {
        let ns = NetNs::new("bp");
        for cidr in ["10.251.0.0/16", "10.252.0.0/16"] {
            ns.ip(&["route", "add", "local", cidr, "dev", "lo"]);
        }
        Ok(Bed {
            b1: ns.http_server(SocketAddr::new(BACKEND_1.parse()?, PORT), "b1", 8),
            _b2: ns.http_server(SocketAddr::new(BACKEND_2.parse()?, PORT), "b2", 4),
            cg: Cgroup::new("bp"),
            ns,
        })
    }

    /// The direct path: the client to the backend itself.
    fn lane(&self) -> Lane<'_> {
        Lane {
            ns: &self.ns,
            cg: Some(&self.cg),
            targets: vec![self.b1.addr],
            servers: vec![&self.b1],
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One setup (a fresh bed and proxy, unless direct) and its measurements.
fn measure(
    mode: Mode,
    n: u32,
    opts: &Opts,
    proxy_bin: &Path,
    out: &Path,
    direct: &Bed,
) -> Result<Row> {
    let own;
    let bed = if mode == Mode::Direct {
        direct
    } else {
        own = Bed::new()?;
        &own
    };
    let (ns, cg) = (&bed.ns, &bed.cg);
    let work = out.join(format!("work-{}-{n}", mode.name()));
    let _ = std::fs::remove_dir_all(&work);
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let bpffs = work.join("bpffs");
    std::fs::create_dir_all(&bpffs)?;
    let probe = n / 2;
    let target = if mode == Mode::Direct {
        bed.b1.addr
    } else {
        SocketAddr::new(vip(probe), 80)
    };
    let mut row = Row {
        mode: mode.name(),
        services: n,
        ..Row::default()
    };
    let mut proxy = None;
    let mut mounted = false;
    let result = (|| -> Result<()> {
        if mode != Mode::Direct {
            write_services(&manifests, n, probe)?;
            write_probe_slice(&manifests, probe, BACKEND_1)?;
            if mode == Mode::Ebpf {
                run(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpffs))?;
                mounted = true;
            }
            let t = Instant::now();
            let timeout = Duration::from_secs(opts.sync_timeout_s);
            let Some(p) = Proxy::start(mode, n, proxy_bin, &manifests, &bpffs, cg, ns, timeout)?
            else {
                eprintln!(
                    "    initial sync of {n} services did not finish in {timeout:?}: giving up"
                );
                row.gave_up_s = Some(opts.sync_timeout_s);
                return Ok(());
            };
            row.load_s = Some(t.elapsed().as_secs_f64());
            eprintln!(
                "    initial sync of {n} services: {:.2} s",
                t.elapsed().as_secs_f64()
            );
            proxy = Some(p);
        }
        let lane = Lane {
            ns,
            cg: Some(cg),
            targets: vec![target],
            servers: vec![&bed.b1],
        };
        let partner = (mode != Mode::Direct).then(|| direct.lane());
        // HTTP first: the connect-only run leaves the servers reaping thousands of reset
        // connections for a while, which would slow whichever measurement came next.
        let http = interleaved(&lane, partner.as_ref(), true, opts.requests, opts.chunk)?;
        let conn = interleaved(&lane, partner.as_ref(), false, opts.connects, opts.chunk)?;
        eprintln!(
            "    connect: {:.0}/s (direct {:.0}/s) p50 {:.1} us p99 {:.1} us max {:.0} us (direct max {:.0} us); http {:.0}/s (direct {:.0}/s)",
            conn.0.rate, conn.1.rate, conn.0.p50_us, conn.0.p99_us, conn.0.max_us, conn.1.max_us, http.0.rate, http.1.rate
        );
        row.conn_rate = conn.0.rate;
        row.conn_p50_us = conn.0.p50_us;
        row.conn_p99_us = conn.0.p99_us;
        row.direct_conn_rate = conn.1.rate;
        row.http_rate = http.0.rate;
        row.direct_http_rate = http.1.rate;
        if mode == Mode::Ebpf {
            // The programs' own cost: a shorter connect pass with the run statistics on
            // (they add a clock read per run: not during the rate measurement).
            let _on = super::progstats::enable()?;
            let before = super::progstats::snapshot(&bpffs)?;
            let pass = (opts.connects / 4).max(opts.chunk);
            interleaved(&lane, None, false, pass, opts.chunk)?;
            row.costs = super::progstats::costs(&before, &super::progstats::snapshot(&bpffs)?);
            eprintln!(
                "    ns per program run: {}",
                super::progstats::cell(&row.costs)
            );
        }
        if let Some(p) = &proxy {
            let (mut change, mut apply) = (vec![], vec![]);
            for (i, (ip, name)) in [
                (BACKEND_2, "b2"),
                (BACKEND_1, "b1"),
                (BACKEND_2, "b2"),
                (BACKEND_1, "b1"),
                (BACKEND_2, "b2"),
            ]
            .into_iter()
            .enumerate()
            {
                let (c, a) = endpoint_change(p, ns, cg, &manifests, target, probe, ip, name)
                    .with_context(|| format!("endpoint change {i}"))?;
                change.push(c);
                if let Some(a) = a {
                    apply.push(a);
                }
            }
            row.change_ms = Some(median(change));
            row.apply_ms = (!apply.is_empty()).then(|| median(apply));
        }
        Ok(())
    })();
    drop(proxy);
    if mounted {
        let _ = Command::new("umount").arg(&bpffs).status();
    }
    let _ = std::fs::remove_dir_all(&work);
    result?;
    Ok(row)
}

/// Rate and latency of one path.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stats {
    pub(super) rate: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) max_us: f64,
}

/// Where a load generator runs and what it reaches: its network namespace, its cgroup
/// (`None`: the proxy's hooks do not apply to it, as to a client outside the node), the
/// addresses it connects to in turn, and the servers behind them (their counts tell when
/// every connection was served).
pub(super) struct Lane<'a> {
    pub(super) ns: &'a NetNs,
    pub(super) cg: Option<&'a Cgroup>,
    pub(super) targets: Vec<SocketAddr>,
    pub(super) servers: Vec<&'a Server>,
}

impl Lane<'_> {
    fn served(&self) -> u64 {
        self.servers.iter().map(|s| s.served()).sum()
    }
}

/// A `bench-client chunks` process.
struct ChunkClient {
    child: Child,
    /// `None` once finished (closing it ends the client).
    input: Option<std::process::ChildStdin>,
    /// The client's output lines, read by a thread of their own so a stalled path is
    /// noticed within `CHUNK_DEADLINE` instead of blocking the bench.
    output: mpsc::Receiver<std::io::Result<String>>,
    lat: Vec<f64>,
}

/// The longest one chunk may take: far above any healthy chunk (milliseconds; a few SYN
/// retransmits add seconds), short enough that a path that stopped answering ends its
/// setup with "n/a" instead of hanging the bench.
const CHUNK_DEADLINE: Duration = Duration::from_secs(60);

impl ChunkClient {
    fn spawn(lane: &Lane, http: bool, chunk: usize) -> Result<ChunkClient> {
        let mut cmd = lane.ns.command(std::env::current_exe()?);
        if let Some(cg) = lane.cg {
            cg.enter_before_exec(&mut cmd);
        }
        let targets: Vec<String> = lane.targets.iter().map(|t| t.to_string()).collect();
        cmd.args([
            "bench-client",
            "chunks",
            &targets.join(","),
            &chunk.to_string(),
        ]);
        if http {
            cmd.arg("--http");
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let input = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ChunkClient {
            child,
            input: Some(input),
            output,
            lat: Vec::new(),
        })
    }

    fn chunk(&mut self) -> Result<()> {
        use std::io::Write as _;
        let input = self
            .input
            .as_mut()
            .context("bench client already finished")?;
        writeln!(input, "go")?;
        input.flush()?;
        let line = match self.output.recv_timeout(CHUNK_DEADLINE) {
            Ok(line) => line?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("stalled: a chunk not done in {CHUNK_DEADLINE:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the bench client ended early (a failed connect or request)")
            }
        };
        let v: serde_json::Value = serde_json::from_str(&line)?;
        let lat: Vec<f64> = v["lat_us"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_f64())
            .collect();
        self.lat.extend(lat);
        Ok(())
    }

    fn finish(mut self) -> Result<Stats> {
        drop(self.input.take());
        self.child.wait()?;
        self.lat.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            self.lat
                .get(((self.lat.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        // Sequential operations per second from the mean latency of the fastest 90%: the
        // slowest tenth is where a shared, busy machine preempts the client for
        // milliseconds, which says nothing about the path under test (whose cost every
        // operation pays).
        let kept = &self.lat[..(self.lat.len() * 9 / 10).max(1).min(self.lat.len())];
        let mean_us = kept.iter().sum::<f64>() / kept.len().max(1) as f64;
        Ok(Stats {
            rate: if mean_us > 0.0 { 1e6 / mean_us } else { 0.0 },
            p50_us: pct(0.5),
            p99_us: pct(0.99),
            max_us: pct(1.0),
        })
    }
}

impl Drop for ChunkClient {
    /// A client given up on (a stalled path) is ended, not waited for.
    fn drop(&mut self) {
        if self.input.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `total` operations through `lane` in chunks, alternating (order flipped each round)
/// with the same chunks through the direct path when a partner is given. Returns
/// (lane, direct) statistics; without a partner both are the lane's.
pub(super) fn interleaved(
    lane: &Lane,
    partner: Option<&Lane>,
    http: bool,
    total: usize,
    chunk: usize,
) -> Result<(Stats, Stats)> {
    let chunk = chunk.max(1);
    let served = |l: &Lane| l.served();
    let before = (served(lane), partner.map(served));
    let mut t = ChunkClient::spawn(lane, http, chunk)?;
    let mut d = match partner {
        Some(p) => Some(ChunkClient::spawn(p, http, chunk)?),
        None => None,
    };
    for round in 0..total.div_ceil(chunk) {
        if round % 2 == 1 {
            if let Some(d) = d.as_mut() {
                d.chunk()?;
            }
        }
        t.chunk()?;
        if round % 2 == 0 {
            if let Some(d) = d.as_mut() {
                d.chunk()?;
            }
        }
    }
    // connect() completes in the kernel before the server accepts: let the servers drain
    // their accept queues so the next measurement does not queue behind this one.
    let done = total.div_ceil(chunk) * chunk;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (served(lane) - before.0 < done as u64
        || partner.is_some_and(|p| served(p) - before.1.unwrap_or(0) < done as u64))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let ts = t.finish()?;
    let ds = match d {
        Some(d) => d.finish()?,
        None => ts,
    };
    Ok((ts, ds))
}

/// All services but the probe's slice, in one JSON List (the shape of `kubectl get -o
/// json`).
fn write_services(dir: &Path, n: u32, probe: u32) -> Result<()> {
    let mut text = String::with_capacity(n as usize * 420);
    text.push_str(r#"{"apiVersion":"v1","kind":"List","items":["#);
    for i in 0..n {
        if i > 0 {
            text.push(',');
        }
        let _ = write!(
            text,
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"s{i}","namespace":"bench"}},"spec":{{"clusterIP":"{}","ports":[{{"name":"http","port":80}}]}}}}"#,
            vip(i)
        );
        if i != probe {
            let _ = write!(
                text,
                r#",{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"s{i}-1","namespace":"bench","labels":{{"kubernetes.io/service-name":"s{i}"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":{PORT}}}],"endpoints":[{{"addresses":["{BACKEND_1}"]}}]}}"#
            );
        }
    }
    text.push_str("]}");
    std::fs::write(dir.join("services.json"), text)?;
    Ok(())
}

/// The probe service's slice, alone in its file so a change re-reads only it.
fn write_probe_slice(dir: &Path, probe: u32, backend: &str) -> Result<()> {
    let text = format!(
        r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"s{probe}-1","namespace":"bench","labels":{{"kubernetes.io/service-name":"s{probe}"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":{PORT}}}],"endpoints":[{{"addresses":["{backend}"]}}]}}"#
    );
    let tmp = dir.join(".probe.json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join("probe.json"))?;
    Ok(())
}

/// Moves the probe service to `backend` and measures (end to end ms, proxy apply ms).
#[allow(clippy::too_many_arguments)]
fn endpoint_change(
    p: &Proxy,
    ns: &NetNs,
    cg: &Cgroup,
    manifests: &Path,
    target: SocketAddr,
    probe: u32,
    backend: &str,
    name: &str,
) -> Result<(f64, Option<f64>)> {
    let mut cmd = ns.command(std::env::current_exe()?);
    cg.enter_before_exec(&mut cmd);
    let mut client = cmd
        .args(["bench-client", "switch"])
        .arg(target.to_string())
        .args([name, "300000"])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(client.stdout.take().expect("piped")).lines();
    // The client is polling (and not yet seeing `name`) before the change is written.
    let ready = lines.next().transpose()?.unwrap_or_default();
    if !ready.contains("ready") {
        bail!("switch client did not start: {ready}");
    }
    let logs_before = p.logs.lock().expect("logs").len();
    let t0 = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    write_probe_slice(manifests, probe, backend)?;
    let done = lines.next().transpose()?.unwrap_or_default();
    let status = client.wait()?;
    if !status.success() {
        bail!("switch client failed: {done}");
    }
    let at: serde_json::Value = serde_json::from_str(&done)?;
    let at_ns = at["at_ns"].as_u64().unwrap_or(t0);
    let change_ms = at_ns.saturating_sub(t0) as f64 / 1e6;
    // The proxy logs each applied batch with its duration.
    let deadline = Instant::now() + Duration::from_secs(5);
    let apply_ms = loop {
        let found = p.logs.lock().expect("logs")[logs_before..]
            .iter()
            .rev()
            .find_map(|l| {
                l.contains("batch applied")
                    .then(|| l.split("took_us=").nth(1))
                    .flatten()
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<f64>().ok())
            });
        if found.is_some() || Instant::now() > deadline {
            break found.map(|us| us / 1000.0);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok((change_ms, apply_ms))
}

/// The release proxy, its stderr collected.
pub(super) struct Proxy {
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Starts the proxy and waits for its initial sync; `None` if that takes longer than
    /// `timeout`.
    #[allow(clippy::too_many_arguments)]
    fn start(
        mode: Mode,
        n: u32,
        bin: &Path,
        manifests: &Path,
        bpffs: &Path,
        cg: &Cgroup,
        ns: &NetNs,
        timeout: Duration,
    ) -> Result<Option<Proxy>> {
        let mut cmd = match mode {
            Mode::Iptables => ns.command(bin),
            _ => Command::new(bin),
        };
        let capacity = (n + 1).next_power_of_two().max(1024);
        cmd.args(["run", "--mode", mode.name(), "--metrics", "127.0.0.1:0"])
            // The eBPF proxy runs on the host here: never on the machine's interfaces.
            .args(["--devices", "none"])
            .arg("--manifests")
            .arg(manifests)
            .arg("--cgroup")
            .arg(cg.path())
            .arg("--bpffs")
            .arg(bpffs)
            .args(["--max-services", &capacity.to_string()])
            .args(["--max-backends", &(2 * capacity).to_string()])
            .env("RUST_LOG", "info,proxy::daemon=debug");
        Proxy::spawn(cmd, timeout)
    }

    /// Starts `cmd` (a `proxy run`) and waits for its initial sync; `None` if that takes
    /// longer than `timeout`.
    pub(super) fn spawn(mut cmd: Command, timeout: Duration) -> Result<Option<Proxy>> {
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("starting the proxy")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let stderr = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("logs").push(line);
            }
        });
        let mut proxy = Proxy { child, logs };
        // Ready once the initial sync is logged (all services programmed).
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = proxy.child.try_wait()? {
                bail!(
                    "the proxy exited with {status}:\n{}",
                    proxy.logs.lock().expect("logs").join("\n")
                );
            }
            if proxy
                .logs
                .lock()
                .expect("logs")
                .iter()
                .any(|l| l.contains("initial sync done"))
            {
                return Ok(Some(proxy));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Proxy {
    /// CPU seconds the proxy process has used so far (user + system, from /proc).
    pub(super) fn cpu_s(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the command name (which may hold spaces) in parentheses: utime and
        // stime are the 12th and 13th.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ticks as f64 / hz as f64)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Stuck in a long iptables-restore: end it and its children (own process group).
        // SAFETY: signalling the process group we created for the child.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

pub(super) fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| {
        if v < 10.0 {
            format!("{v:.3}")
        } else {
            format!("{v:.0}")
        }
    })
}

fn report(rows: &[Row], opts: &Opts, out: &Path) -> Result<()> {
    let find = |mode: &str, n: u32| rows.iter().find(|r| r.mode == mode && r.services == n);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| path | services | new conns/s | vs direct | connect p50 us | p99 us | HTTP req/s | vs direct | ebpf / iptables conns | initial sync s | endpoint change to traffic ms | proxy apply ms | ns per program run |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in rows {
        if let Some(t) = r.gave_up_s {
            let _ = writeln!(
                md,
                "| {} | {} | - | - | - | - | - | - | - | not done in {t} | - | - | - |",
                r.mode, r.services
            );
            continue;
        }
        let vs_ipt = match r.mode {
            "ebpf" => {
                find("iptables", r.services).map_or("-".into(), |i| ratio(r.conn_rate, i.conn_rate))
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {} | {} | {} |",
            r.mode,
            if r.mode == "direct" {
                "-".to_string()
            } else {
                r.services.to_string()
            },
            r.conn_rate,
            ratio(r.conn_rate, r.direct_conn_rate),
            r.conn_p50_us,
            r.conn_p99_us,
            r.http_rate,
            ratio(r.http_rate, r.direct_http_rate),
            vs_ipt,
            match (r.load_s, r.gave_up_s) {
                (Some(s), _) => format!("{s:.2}"),
                (None, Some(t)) => format!("not done in {t}"),
                _ => "-".into(),
            },
            opt_ms(r.change_ms),
            opt_ms(r.apply_ms),
            super::progstats::cell(&r.costs),
        );
    }
    println!("\n{md}");
    let json = json!({
        "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
        "connects_per_measurement": opts.connects,
        "requests_per_measurement": opts.requests,
        "chunk": opts.chunk,
        "rows": rows.iter().map(|r| json!({
            "mode": r.mode, "services": r.services,
            "conn_rate": r.conn_rate, "conn_p50_us": r.conn_p50_us, "conn_p99_us": r.conn_p99_us,
            "http_rate": r.http_rate,
            "direct_conn_rate": r.direct_conn_rate, "direct_http_rate": r.direct_http_rate,
            "conn_rate_vs_direct": r.conn_rate / r.direct_conn_rate.max(1e-9),
            "http_rate_vs_direct": r.http_rate / r.direct_http_rate.max(1e-9),
            "initial_sync_s": r.load_s, "gave_up_after_s": r.gave_up_s, "endpoint_change_ms": r.change_ms, "apply_ms": r.apply_ms,
            "program_costs": r.costs.iter().map(|c| json!({
                "program": c.program, "runs": c.runs, "ns_per_run": c.ns_per_run,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(out.join("proxy.json"), serde_json::to_string_pretty(&json)?)?;
    std::fs::write(out.join("proxy.md"), &md)?;

    let series = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<Series> {
        let mut s = Vec::new();
        for (mode, color) in [("ebpf", "#1f77b4"), ("iptables", "#d62728")] {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.mode == mode)
                .filter_map(|r| Some((r.services as f64, f(r)?)))
                .collect();
            if !points.is_empty() {
                s.push(Series {
                    name: mode.into(),
                    color,
                    points,
                });
            }
        }
        s
    };
    let mut rate = series(&|r| (r.conn_rate > 0.0).then_some(r.conn_rate));
    let xs: Vec<f64> = opts.services.iter().map(|n| *n as f64).collect();
    rate.insert(
        0,
        Series {
            name: "direct (limit)".into(),
            color: "#2ca02c",
            // The direct rate measured alongside each setup (same machine load).
            points: xs
                .iter()
                .filter_map(|x| {
                    let d: Vec<f64> = rows
                        .iter()
                        .filter(|r| r.mode != "direct" && r.services as f64 == *x)
                        .map(|r| r.direct_conn_rate)
                        .filter(|d| *d > 0.0)
                        .collect();
                    (!d.is_empty()).then(|| (*x, d.iter().sum::<f64>() / d.len() as f64))
                })
                .collect(),
        },
    );
    let rate_svg = plot::svg(
        &Chart {
            title: "New connections per second vs number of services",
            x_label: "services",
            y_label: "connections / s",
            log_x: true,
            log_y: true,
        },
        &rate,
    );
    let change_svg = plot::svg(
        &Chart {
            title: "One endpoint change: write to new connections on the new backend",
            x_label: "services",
            y_label: "ms",
            log_x: true,
            log_y: true,
        },
        &series(&|r| r.change_ms),
    );
    std::fs::write(out.join("proxy-rate.svg"), &rate_svg)?;
    std::fs::write(out.join("proxy-change.svg"), &change_svg)?;
    // Only a full run replaces the published figures.
    let full = opts.services == [1, 1_000, 10_000, 100_000] && opts.iptables_max >= 100_000;
    if full {
        let docs = root().join("docs/bench");
        std::fs::create_dir_all(&docs)?;
        std::fs::write(docs.join("proxy-rate.svg"), &rate_svg)?;
        std::fs::write(docs.join("proxy-change.svg"), &change_svg)?;
        std::fs::write(docs.join("proxy.md"), &md)?;
        std::fs::write(
            docs.join("proxy.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
    }
    eprintln!(
        "bench proxy: wrote {}/proxy.{{json,md}}, proxy-rate.svg, proxy-change.svg{}",
        out.display(),
        if full {
            " (copied to docs/bench/)"
        } else {
            " (a partial run: docs/bench/ left as it was)"
        }
    );
    Ok(())
}
