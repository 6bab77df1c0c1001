//! `cargo xtask bench proxy --north-south`: traffic from outside the node to a NodePort,
//! side by side in one run, with the load generator, chunking and proxy handling of
//! `bench proxy` (`super::proxy`).
//!
//! Each setup is a world of its own (network namespaces, veth links, a leased /24): a
//! client namespace linked to a node namespace (the node's address on that link is where
//! the NodePort answers), a pod namespace behind the node (the local backend) and a second
//! node namespace with a pod namespace behind it (the remote backend). Pods are linked as
//! a CNI without a bridge links them: a veth whose node end has no address (so the proxy's
//! `--devices auto` leaves it alone), a /32 route to the pod on the node, a default route
//! in the pod through a link-local gateway answered by a static neighbour entry. The
//! client's packets carry complete checksums (transmit offload off), as packets from a
//! wire do, in every setup: XDP needs them and the comparison must be the same for all.
//!
//! Paths, each measured against the direct path in the same chunks:
//! - direct: the client to the two backends' pod addresses in turn, routed by the node, no
//!   service (the limit: the same hops without translation);
//! - ebpf-tc: the proxy's tc (TCX) programs on the node's interfaces;
//! - ebpf-xdp: the same with `--nodeport-acceleration native` (XDP in front of tc);
//! - iptables: the proxy's iptables mode (kube-proxy's KUBE-SERVICES, KUBE-NODEPORTS and
//!   KUBE-EXT chains), conntrack and MASQUERADE;
//!
//! at 1 / 1,000 / 10,000 / 100,000 services, every one a NodePort service with the same
//! two endpoints. A node port is a (port, protocol) of the whole cluster, and 100,000
//! cannot fit one protocol's 65,535 ports: service i has node port 10,000 + i/2, TCP for
//! even i and UDP for odd i (port range 10,000-59,999). The probe is the TCP service in
//! the middle.
//!
//! And in-process (`proxy maglev-bench`, release build): the Maglev table's build time per
//! service and the share of flows that move when one of 100 backends goes.

use super::plot::{self, Chart, Series};
use super::progstats::{self, Cost};
use super::proxy::{interleaved, ratio, since, vip, Lane, Opts, Proxy, Stats};
use crate::setup::{root, run};
use anyhow::{bail, Context, Result};
use serde_json::json;
use skiff_launcher::cgroup::Cgroup;
use skiff_launcher::netns::{NetNs, Server, Veth};
use skiff_tests::subnet::{self, SubnetLease};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Direct,
    EbpfTc,
    EbpfXdp,
    Iptables,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::EbpfTc => "ebpf-tc",
            Way::EbpfXdp => "ebpf-xdp",
            Way::Iptables => "iptables",
        }
    }

    fn proxy_args(self) -> &'static [&'static str] {
        match self {
            Way::Direct => &[],
            Way::EbpfTc => &["--mode", "ebpf"],
            Way::EbpfXdp => &["--mode", "ebpf", "--nodeport-acceleration", "native"],
            Way::Iptables => &["--mode", "iptables"],
        }
    }
}

const NODE: &str = "bench-node";
const OTHER_NODE: &str = "bench-other";
const BACKEND_PORT: u16 = 8080;
const FIRST_NODE_PORT: u32 = 10_000;
/// The pods' gateway: a link-local address, the node end's MAC in a static neighbour entry.
const GATEWAY: &str = "169.254.1.1";

/// Service i's node port and protocol (see the module docs).
fn node_port(i: u32) -> (u16, &'static str) {
    (
        (FIRST_NODE_PORT + i / 2) as u16,
        if i.is_multiple_of(2) { "TCP" } else { "UDP" },
    )
}

/// The TCP service in the middle of `n`.
fn probe(n: u32) -> u32 {
    (n / 2) & !1
}

/// One setup's namespaces and links. Field order is drop order: servers, then links (deleted
/// from their node's namespace), then namespaces.
struct World {
    local: Server,
    remote: Server,
    _links: Vec<Veth>,
    client: NetNs,
    node: NetNs,
    _other: NetNs,
    _pods: Vec<NetNs>,
    cg: Cgroup,
    lease: SubnetLease,
}

impl World {
    fn new() -> Result<World> {
        let lease = subnet::lease();
        let o = lease.octet();
        let a = move |h: u8| format!("10.250.{o}.{h}");
        let node = NetNs::new("bnn");
        let client = NetNs::new("bnc");
        let other = NetNs::new("bno");
        let (local_pod, remote_pod) = (NetNs::new("bnp"), NetNs::new("bnr"));
        let client_link = Veth::new(Some(&node), &client);
        let other_link = Veth::new(Some(&node), &other);
        node.ip(&[
            "addr",
            "add",
            &format!("{}/30", a(1)),
            "dev",
            &client_link.host,
        ]);
        client.ip(&[
            "addr",
            "add",
            &format!("{}/30", a(2)),
            "dev",
            &client_link.peer,
        ]);
        node.ip(&[
            "addr",
            "add",
            &format!("{}/30", a(5)),
            "dev",
            &other_link.host,
        ]);
        other.ip(&[
            "addr",
            "add",
            &format!("{}/30", a(6)),
            "dev",
            &other_link.peer,
        ]);
        // The client and the other node reach the rest of the /24 (pods) through the node.
        client.ip(&["route", "add", lease.cidr(), "via", &a(1)]);
        other.ip(&["route", "add", lease.cidr(), "via", &a(5)]);
        let local_link = pod_link(&node, &local_pod, &a(65))?;
        let remote_link = pod_link(&other, &remote_pod, &a(70))?;
        node.ip(&["route", "add", &format!("{}/32", a(70)), "via", &a(6)]);
        for ns in [&node, &other] {
            skiff_launcher::netns::must(
                ns.command("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]),
            );
        }
        client.full_checksums(&client_link.peer);
        let backend = |ns: &NetNs, h: u8, name: &str| {
            ns.http_server(
                SocketAddr::new(a(h).parse().expect("address"), BACKEND_PORT),
                name,
                4,
            )
        };
        Ok(World {
            local: backend(&local_pod, 65, "local"),
            remote: backend(&remote_pod, 70, "remote"),
            _links: vec![client_link, other_link, local_link, remote_link],
            client,
            node,
            _other: other,
            _pods: vec![local_pod, remote_pod],
            cg: Cgroup::new("bn"),
            lease,
        })
    }

    fn addr(&self, host: u8) -> IpAddr {
        IpAddr::from([10, 250, self.lease.octet(), host])
    }

    /// The node's address facing the client.
    fn node_ip(&self) -> IpAddr {
        self.addr(1)
    }

    /// A lane from the client to `targets`, served by the two backends.
    fn lane(&self, targets: Vec<SocketAddr>) -> Lane<'_> {
        Lane {
            ns: &self.client,
            // Outside the node: no socket-level hook applies to it.
            cg: None,
            targets,
            servers: vec![&self.local, &self.remote],
        }
    }

    /// The direct path: each backend's pod address in turn.
    fn direct_lane(&self) -> Lane<'_> {
        self.lane(vec![self.local.addr, self.remote.addr])
    }

    /// Waits until `backends` different backends have answered a GET to `target` from
    /// the client.
    fn wait_answering(&self, target: SocketAddr, backends: usize, within: Duration) -> Result<()> {
        let end = Instant::now() + within;
        let mut seen = BTreeSet::new();
        while seen.len() < backends {
            if Instant::now() > end {
                bail!("{target} from the client: answered by {seen:?} only within {within:?}");
            }
            let got = self
                .client
                .run(|| skiff_launcher::netns::http_get(target, Duration::from_secs(2)));
            match got {
                Ok(body) => {
                    seen.insert(body);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        Ok(())
    }
}

/// A pod namespace `pod` with address `ip`, linked to `node` (see the module docs).
fn pod_link(node: &NetNs, pod: &NetNs, ip: &str) -> Result<Veth> {
    let link = Veth::new(Some(node), pod);
    // `ip -br link`: name, state, address.
    let shown = node.ip(&["-br", "link", "show", "dev", &link.host]);
    let mac = shown
        .split_whitespace()
        .nth(2)
        .with_context(|| format!("no address in `{shown}`"))?
        .to_string();
    node.ip(&["route", "add", &format!("{ip}/32"), "dev", &link.host]);
    pod.ip(&["addr", "add", &format!("{ip}/32"), "dev", &link.peer]);
    pod.ip(&["route", "add", GATEWAY, "dev", &link.peer, "scope", "link"]);
    pod.ip(&["route", "add", "default", "via", GATEWAY, "dev", &link.peer]);
    pod.ip(&[
        "neigh",
        "add",
        GATEWAY,
        "lladdr",
        &mac,
        "dev",
        &link.peer,
        "nud",
        "permanent",
    ]);
    Ok(link)
}

#[derive(Clone, Debug, Default)]
struct Row {
    way: &'static str,
    services: u32,
    conn: Stats,
    http: Stats,
    /// The direct path's rates measured interleaved with this row's.
    direct_conn_rate: f64,
    direct_http_rate: f64,
    load_s: Option<f64>,
    gave_up_s: Option<u64>,
    /// Why the path could not be measured (it stalled, a connect failed, it never
    /// answered): the row reports "n/a" with this instead of ending the bench.
    failed: Option<String>,
    /// The kernel programs' own cost per run, from a separate pass with the kernel's run
    /// statistics on (they add a clock read per run: not during the rate measurement).
    costs: Vec<Cost>,
    /// The proxy's CPU use during the connect measurement, in cores.
    proxy_cores: Option<f64>,
}

pub fn run_bench(opts: &Opts, proxy_bin: &Path, out: &Path, started: Instant) -> Result<()> {
    eprintln!("[{}] north-south: direct", since(started));
    let direct = World::new()?;
    direct.wait_answering(direct.local.addr, 1, Duration::from_secs(10))?;
    direct.wait_answering(direct.remote.addr, 1, Duration::from_secs(10))?;
    let mut rows = vec![measure(Way::Direct, 0, opts, proxy_bin, out, &direct)?];
    for &n in &opts.services {
        for way in [Way::EbpfTc, Way::EbpfXdp, Way::Iptables] {
            if !opts.paths.iter().any(|p| p == way.name()) {
                continue;
            }
            if way == Way::Iptables && n > opts.iptables_max {
                continue;
            }
            eprintln!("[{}] {} with {n} services", since(started), way.name());
            let row = measure(way, n, opts, proxy_bin, out, &direct)?;
            if row.failed.is_some() || row.gave_up_s.is_some() {
                rows.push(row);
                continue;
            }
            eprintln!(
                "    {:.0} conns/s ({:.2}x direct), {:.0} req/s ({:.2}x direct)",
                row.conn.rate,
                row.conn.rate / row.direct_conn_rate.max(1e-9),
                row.http.rate,
                row.http.rate / row.direct_http_rate.max(1e-9),
            );
            rows.push(row);
        }
    }
    drop(direct);
    eprintln!("[{}] maglev in-process", since(started));
    let maglev = maglev(proxy_bin)?;
    report(&rows, &maglev, opts, out)?;
    eprintln!("[{}] done", since(started));
    Ok(())
}

/// One setup (a fresh world and proxy, unless direct) and its measurements.
fn measure(
    way: Way,
    n: u32,
    opts: &Opts,
    proxy_bin: &Path,
    out: &Path,
    direct: &World,
) -> Result<Row> {
    let mut row = Row {
        way: way.name(),
        services: n,
        ..Row::default()
    };
    if way == Way::Direct {
        let lane = direct.direct_lane();
        let http = interleaved(&lane, None, true, opts.requests, opts.chunk)?;
        let conn = interleaved(&lane, None, false, opts.connects, opts.chunk)?;
        row.conn = conn.0;
        row.http = http.0;
        row.direct_conn_rate = conn.0.rate;
        row.direct_http_rate = http.0.rate;
        return Ok(row);
    }
    let w = World::new()?;
    let work = out.join(format!("work-ns-{}-{n}", way.name()));
    let _ = std::fs::remove_dir_all(&work);
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let bpffs = work.join("bpffs");
    std::fs::create_dir_all(&bpffs)?;
    write_services(&manifests, n, &w)?;
    let ebpf = way != Way::Iptables;
    let mut mounted = false;
    let mut proxy = None;
    let result = (|| -> Result<()> {
        if ebpf {
            run(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpffs))?;
            mounted = true;
        }
        // Three frontends per NodePort service (cluster IP, node port at connect(), node
        // port per packet), two backends each.
        let frontends = 3 * n.max(1) + 64;
        let mut cmd = w.node.command(proxy_bin);
        cmd.arg("run")
            .args(way.proxy_args())
            .args(["--node-name", NODE, "--metrics", "127.0.0.1:0"])
            .arg("--manifests")
            .arg(&manifests)
            .arg("--cgroup")
            .arg(w.cg.path())
            .arg("--bpffs")
            .arg(&bpffs)
            .args(["--max-services", &frontends.to_string()])
            .args(["--max-backends", &(2 * frontends).to_string()])
            .env("RUST_LOG", "info");
        let t = Instant::now();
        let timeout = Duration::from_secs(opts.sync_timeout_s);
        let Some(p) = Proxy::spawn(cmd, timeout)? else {
            eprintln!("    did not sync {n} services in {timeout:?}: giving up");
            row.gave_up_s = Some(opts.sync_timeout_s);
            return Ok(());
        };
        proxy = Some(p);
        let (port, _) = node_port(probe(n));
        let target = SocketAddr::new(w.node_ip(), port);
        // Synced is not yet attached: the node's interfaces are read after the first sync.
        w.wait_answering(target, 2, Duration::from_secs(60))
            .context("the NodePort never answered")?;
        row.load_s = Some(t.elapsed().as_secs_f64());
        eprintln!(
            "    initial sync of {n} services, NodePort answering: {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let lane = w.lane(vec![target]);
        let partner = direct.direct_lane();
        // HTTP first, as in `bench proxy`: reset connections keep the servers busy a while.
        let http = interleaved(&lane, Some(&partner), true, opts.requests, opts.chunk)?;
        let p = proxy.as_ref().expect("started above");
        let (cpu0, t0) = (p.cpu_s(), Instant::now());
        let conn = interleaved(&lane, Some(&partner), false, opts.connects, opts.chunk)?;
        row.proxy_cores = p
            .cpu_s()
            .zip(cpu0)
            .map(|(b, a)| (b - a) / t0.elapsed().as_secs_f64());
        eprintln!(
            "    connect: {:.0}/s (direct {:.0}/s) p50 {:.1} us p99 {:.1} us max {:.0} us (direct max {:.0} us); http {:.0}/s (direct {:.0}/s); proxy {:.2} cores",
            conn.0.rate, conn.1.rate, conn.0.p50_us, conn.0.p99_us, conn.0.max_us, conn.1.max_us, http.0.rate, http.1.rate, row.proxy_cores.unwrap_or(f64::NAN)
        );
        row.conn = conn.0;
        row.http = http.0;
        row.direct_conn_rate = conn.1.rate;
        row.direct_http_rate = http.1.rate;
        if ebpf {
            // The programs' own cost: a shorter connect pass with the run statistics on.
            let _on = progstats::enable()?;
            let before = progstats::snapshot(&bpffs)?;
            interleaved(
                &lane,
                None,
                false,
                (opts.connects / 4).max(opts.chunk),
                opts.chunk,
            )?;
            row.costs = progstats::costs(&before, &progstats::snapshot(&bpffs)?);
            eprintln!("    ns per program run: {}", progstats::cell(&row.costs));
        }
        Ok(())
    })();
    drop(proxy);
    if mounted {
        let _ = Command::new("umount").arg(&bpffs).status();
    }
    let _ = std::fs::remove_dir_all(&work);
    drop(w);
    if let Err(e) = result {
        eprintln!("    n/a: {e:#}");
        row.failed = Some(format!("{e:#}"));
    }
    Ok(row)
}

/// `n` NodePort services with both backends (local and remote), one JSON List.
fn write_services(dir: &Path, n: u32, w: &World) -> Result<()> {
    let (local, remote) = (w.addr(65), w.addr(70));
    let mut text = String::with_capacity(n as usize * 800);
    text.push_str(r#"{"apiVersion":"v1","kind":"List","items":["#);
    for i in 0..n {
        if i > 0 {
            text.push(',');
        }
        let (np, proto) = node_port(i);
        let _ = write!(
            text,
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"s{i}","namespace":"bench"}},"spec":{{"type":"NodePort","clusterIP":"{}","ports":[{{"name":"http","port":80,"protocol":"{proto}","nodePort":{np}}}]}}}}"#,
            vip(i)
        );
        let _ = write!(
            text,
            r#",{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"s{i}-1","namespace":"bench","labels":{{"kubernetes.io/service-name":"s{i}"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":{BACKEND_PORT},"protocol":"{proto}"}}],"endpoints":[{{"addresses":["{local}"],"nodeName":"{NODE}"}},{{"addresses":["{remote}"],"nodeName":"{OTHER_NODE}"}}]}}"#
        );
    }
    text.push_str("]}");
    std::fs::write(dir.join("services.json"), text)?;
    Ok(())
}

/// `proxy maglev-bench`'s lines (one per table size).
fn maglev(proxy_bin: &Path) -> Result<Vec<serde_json::Value>> {
    let out = Command::new(proxy_bin)
        .args([
            "maglev-bench",
            "--backends",
            "100",
            "--sizes",
            "16381,65521",
        ])
        .output()
        .context("running proxy maglev-bench")?;
    if !out.status.success() {
        bail!(
            "proxy maglev-bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// An error's text for a Markdown table cell: one line, no column separators, short.
fn cell_text(s: &str) -> String {
    let one: String = s
        .chars()
        .map(|c| if c == '|' || c.is_control() { ' ' } else { c })
        .collect();
    match one.char_indices().nth(120) {
        Some((i, _)) => format!("{}...", &one[..i]),
        None => one,
    }
}

/// What each figure can and cannot say.
const LIMITS: &str = "\
- Rates are those of one sequential client (the mean of the fastest 90% of its operations, \
as in `bench proxy`): the cost each connection pays on its path, not the node's capacity. \
The client, both nodes, the backends and the proxy share the machine's 2 cores; the direct \
path (the same hops, no service) is the ceiling, measured in the same chunks. A ratio near \
1.00x says the path adds nothing this client can see, not how far it would scale.
- HTTP rates include the test servers (std threads, one connection each): noisier, and \
capped by the servers as much as by the path.
- XDP runs on a veth here: veth's native XDP gets packets the sending namespace already \
built as socket buffers, so it saves less than on a NIC driver; the tc/XDP difference here \
is a lower bound of a NIC's.
- iptables: kube-proxy's layout through the proxy's iptables mode (iptables-nft); a \
NodePort packet walks all of KUBE-SERVICES, then KUBE-NODEPORTS to the probe's rule.
- Services above 65,535 cannot all be TCP NodePorts: half are UDP (node ports 10,000-59,999).
- ns per program run: each attached program's `run_time_ns / run_cnt` from the kernel (`bpf_prog_info`, run statistics on through BPF_ENABLE_STATS only for a separate quarter-size connect pass, since they add a clock read to every run). A connect through a NodePort runs the ingress program for SYN, ACK and RST and the egress program for the SYN-ACK (a local backend; a remote one's replies come in through the other interface's ingress). With XDP both run: XDP first, then tc for whatever XDP passes up.
- proxy cores: the proxy process's CPU time over the connect measurement's wall time (the user-space proxy is idle once synced; a non-zero figure takes cores from the client).
- Maglev: in-process in the release proxy binary, one thread, 100 synthetic backends; \
build time is per service table (what a node spends per Maglev service on a full sync).";

fn report(rows: &[Row], maglev: &[serde_json::Value], opts: &Opts, out: &Path) -> Result<()> {
    let find = |way: &str, n: u32| rows.iter().find(|r| r.way == way && r.services == n);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| path | services | new conns/s | vs direct | connect p50 us | p99 us | HTTP req/s | vs direct | vs iptables conns | sync to answering s | proxy cores | ns per program run |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in rows {
        let not_measured = match (&r.gave_up_s, &r.failed) {
            (Some(t), _) => Some(format!("did not sync in {t} s")),
            (None, Some(why)) => Some(format!("n/a: {}", cell_text(why))),
            (None, None) => None,
        };
        if let Some(why) = not_measured {
            let _ = writeln!(
                md,
                "| {} | {} | {why} | - | - | - | - | - | - | {} | - | - |",
                r.way,
                r.services,
                r.load_s.map_or("-".into(), |s| format!("{s:.2}")),
            );
            continue;
        }
        let vs_ipt = match r.way {
            "ebpf-tc" | "ebpf-xdp" => find("iptables", r.services)
                .filter(|i| i.gave_up_s.is_none() && i.failed.is_none())
                .map_or("-".into(), |i| ratio(r.conn.rate, i.conn.rate)),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {} | {} |",
            r.way,
            if r.way == "direct" {
                "-".to_string()
            } else {
                r.services.to_string()
            },
            r.conn.rate,
            ratio(r.conn.rate, r.direct_conn_rate),
            r.conn.p50_us,
            r.conn.p99_us,
            r.http.rate,
            ratio(r.http.rate, r.direct_http_rate),
            vs_ipt,
            r.load_s.map_or("-".into(), |s| format!("{s:.2}")),
            r.proxy_cores.map_or("-".into(), |c| format!("{c:.2}")),
            progstats::cell(&r.costs),
        );
    }
    let _ = writeln!(
        md,
        "\n| Maglev M | backends | table build us per service | for 10,000 services s | other flows moved when 1 of 100 goes (mean) | worst | all flows moved (mean) |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    for m in maglev {
        let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.1} | {:.2}% | {:.2}% | {:.2}% |",
            m["table_size"],
            m["backends"],
            f("build_us"),
            f("build_us") * 10_000.0 / 1e6,
            f("moved_others_mean") * 100.0,
            f("moved_others_max") * 100.0,
            f("moved_total_mean") * 100.0,
        );
    }
    let _ = writeln!(md, "\nLimits of these figures:\n\n{LIMITS}");
    println!("\n{md}");
    let json = json!({
        "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
        "connects_per_measurement": opts.connects,
        "requests_per_measurement": opts.requests,
        "chunk": opts.chunk,
        "rows": rows.iter().map(|r| json!({
            "path": r.way, "services": r.services,
            "conn_rate": r.conn.rate, "conn_p50_us": r.conn.p50_us, "conn_p99_us": r.conn.p99_us,
            "http_rate": r.http.rate,
            "direct_conn_rate": r.direct_conn_rate, "direct_http_rate": r.direct_http_rate,
            "conn_rate_vs_direct": r.conn.rate / r.direct_conn_rate.max(1e-9),
            "http_rate_vs_direct": r.http.rate / r.direct_http_rate.max(1e-9),
            "sync_to_answering_s": r.load_s, "gave_up_after_s": r.gave_up_s,
            "not_measured": r.failed, "proxy_cores": r.proxy_cores,
            "program_costs": r.costs.iter().map(|c| json!({
                "program": c.program, "runs": c.runs, "ns_per_run": c.ns_per_run,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "maglev": maglev,
    });
    std::fs::write(
        out.join("northsouth.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(out.join("northsouth.md"), &md)?;

    let mut series = Vec::new();
    for (way, color) in [
        ("ebpf-tc", "#1f77b4"),
        ("ebpf-xdp", "#9467bd"),
        ("iptables", "#d62728"),
    ] {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.way == way && r.conn.rate > 0.0)
            .map(|r| (r.services as f64, r.conn.rate))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                name: way.into(),
                color,
                points,
            });
        }
    }
    // The direct rate measured alongside each service count (mean over its setups).
    let direct: Vec<(f64, f64)> = opts
        .services
        .iter()
        .filter_map(|&n| {
            let d: Vec<f64> = rows
                .iter()
                .filter(|r| r.way != "direct" && r.services == n && r.direct_conn_rate > 0.0)
                .map(|r| r.direct_conn_rate)
                .collect();
            (!d.is_empty()).then(|| (n as f64, d.iter().sum::<f64>() / d.len() as f64))
        })
        .collect();
    series.insert(
        0,
        Series {
            name: "direct (limit)".into(),
            color: "#2ca02c",
            points: direct,
        },
    );
    let svg = plot::svg(
        &Chart {
            title: "NodePort from outside: new connections per second vs services",
            x_label: "services",
            y_label: "connections / s",
            log_x: true,
            log_y: true,
        },
        &series,
    );
    std::fs::write(out.join("northsouth-rate.svg"), &svg)?;
    let full = opts.services == [1, 1_000, 10_000, 100_000] && opts.iptables_max >= 100_000;
    if full {
        let docs = root().join("docs/bench");
        std::fs::create_dir_all(&docs)?;
        std::fs::write(docs.join("northsouth-rate.svg"), &svg)?;
        std::fs::write(docs.join("northsouth.md"), &md)?;
        std::fs::write(
            docs.join("northsouth.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
    }
    eprintln!(
        "bench proxy --north-south: wrote {}/northsouth.{{json,md}}, northsouth-rate.svg{}",
        out.display(),
        if full {
            " (copied to docs/bench/)"
        } else {
            " (a partial run: docs/bench/ left as it was)"
        }
    );
    Ok(())
}
