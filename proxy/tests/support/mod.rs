//! Fixtures for the proxy's integration tests: a world of the test's own (network
//! namespace with a local route for a leased VIP range, a child cgroup, a private bpffs, a
//! manifests directory), real HTTP and UDP backends inside the namespace, the real proxy
//! binary in either mode, and clients (`proxy probe`, curl) started inside the namespace
//! and the cgroup. Everything is torn down on Drop.

#![allow(dead_code)] // each test binary uses a different part

use serde::Deserialize;
use skiff_tests::cgroup::Cgroup;
use skiff_tests::netns::NetNs;
pub use skiff_tests::netns::Server as Backend;
use skiff_tests::subnet::{self, SubnetLease};
use skiff_tests::wait_until;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const PROXY: &str = env!("CARGO_BIN_EXE_proxy");
pub const WAIT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ebpf,
    Iptables,
}

/// A private bpffs mount in a temporary directory; unmounting drops every pin in it.
pub struct BpfFs {
    dir: tempfile::TempDir,
}

impl BpfFs {
    fn new() -> BpfFs {
        let dir = tempfile::tempdir().expect("tempdir");
        skiff_tests::netns::must(
            Command::new("mount")
                .args(["-t", "bpf", "bpf"])
                .arg(dir.path()),
        );
        BpfFs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).output();
    }
}

/// The test's world. Field order is drop order: the proxy stops first, the namespace goes
/// last.
pub struct World {
    pub mode: Mode,
    proxy: Option<Proxy>,
    pub cg: Cgroup,
    pub bpffs: BpfFs,
    pub manifests: tempfile::TempDir,
    pub ns: NetNs,
    lease: SubnetLease,
    extra_args: Vec<String>,
    /// `Some(kubeconfig)`: the proxy reads an API server instead of the manifests dir.
    api: Option<std::path::PathBuf>,
}

impl World {
    pub fn new(mode: Mode) -> World {
        let lease = subnet::lease();
        let ns = NetNs::new("px");
        // Service addresses are local in the namespace: a connect the proxy did not
        // translate is refused at once instead of going anywhere.
        ns.ip(&["route", "add", "local", lease.cidr(), "dev", "lo"]);
        let v6 = format!("fd00:5c1f:{}::/112", lease.octet());
        ns.ip(&["-6", "route", "add", "local", &v6, "dev", "lo"]);
        World {
            mode,
            proxy: None,
            cg: Cgroup::new("px"),
            bpffs: BpfFs::new(),
            manifests: tempfile::tempdir().expect("tempdir"),
            ns,
            lease,
            extra_args: Vec::new(),
            api: None,
        }
    }

    /// A service address in this test's own range.
    pub fn vip(&self, host: u8) -> IpAddr {
        format!("10.250.{}.{host}", self.lease.octet())
            .parse()
            .unwrap()
    }

    pub fn vip6(&self, host: u16) -> IpAddr {
        format!("fd00:5c1f:{}::{host:x}", self.lease.octet())
            .parse()
            .unwrap()
    }

    /// An IPv6 backend address, added to the namespace's loopback.
    pub fn backend6(&self, host: u16) -> IpAddr {
        let ip = format!("fd00:5c1f:{}:1::{host:x}", self.lease.octet());
        self.ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{ip}/128"),
            "dev",
            "lo",
            "nodad",
        ]);
        ip.parse().unwrap()
    }

    pub fn with_args(mut self, args: &[&str]) -> World {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The proxy will list and watch the API server of `kubeconfig` (`--source api`).
    pub fn with_api(mut self, kubeconfig: &Path) -> World {
        self.api = Some(kubeconfig.to_path_buf());
        self
    }

    /// The leased VIP range, e.g. `10.250.17.0/24` (a test API server's service CIDR).
    pub fn vip_cidr(&self) -> &str {
        self.lease.cidr()
    }

    /// Writes a manifest atomically (a hidden temp file renamed into place).
    pub fn write(&self, file: &str, text: &str) {
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests.path().join(file)).unwrap();
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.path().join(file)).unwrap();
    }

    pub fn start(&mut self) -> &Proxy {
        self.start_within(WAIT)
    }

    /// Starts the proxy and waits up to `timeout` for its initial sync.
    pub fn start_within(&mut self, timeout: Duration) -> &Proxy {
        assert!(self.proxy.is_none(), "proxy already running");
        let mode = match self.mode {
            Mode::Ebpf => "ebpf",
            Mode::Iptables => "iptables",
        };
        // In the test's namespace: iptables rules are per namespace, and the eBPF proxy's
        // node addresses and devices are the namespace's, not the machine's. An eBPF proxy
        // reading a test API server (on the host's loopback) stays outside.
        let mut cmd = if self.proxy_outside() {
            Command::new(PROXY)
        } else {
            self.ns.command(PROXY)
        };
        cmd.args(["run", "--mode", mode, "--metrics", "127.0.0.1:0"])
            .args(["--node-name", NODE]);
        if self.proxy_outside() {
            // On the host: never the machine's own interfaces.
            cmd.args(["--devices", "none"]);
        }
        match &self.api {
            Some(kubeconfig) => cmd
                .args(["--source", "api", "--kubeconfig"])
                .arg(kubeconfig),
            None => cmd.arg("--manifests").arg(self.manifests.path()),
        }
        .arg("--cgroup")
        .arg(self.cg.path())
        .arg("--bpffs")
        .arg(self.bpffs.path())
        .args(["--max-affinity", "4096"])
        .args(&self.extra_args);
        let proxy = Proxy::spawn(cmd);
        self.proxy = Some(proxy);
        let p = self.proxy.as_ref().unwrap();
        wait_until("proxy healthy", timeout, || {
            let r = self.http_get(p.metrics, "/healthz");
            match r {
                Some((200, _)) => Ok(()),
                other => Err((other, p.logs())),
            }
        });
        p
    }

    /// SIGTERM and wait; the proxy must exit cleanly.
    pub fn stop(&mut self) {
        let mut p = self.proxy.take().expect("proxy running");
        let status = p.terminate();
        assert!(
            status.success(),
            "proxy exited with {status}; logs:\n{}",
            p.logs().join("\n")
        );
    }

    pub fn proxy(&self) -> &Proxy {
        self.proxy.as_ref().expect("proxy running")
    }

    fn proxy_outside(&self) -> bool {
        self.mode == Mode::Ebpf && self.api.is_some()
    }

    /// GET on the proxy's metrics endpoint (where the proxy runs).
    pub fn http_get(&self, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        let get = move || -> Option<(u16, String)> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            let code = text.split_whitespace().nth(1)?.parse().ok()?;
            Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
        };
        if self.proxy_outside() {
            get()
        } else {
            self.ns.run(get)
        }
    }

    pub fn metrics(&self) -> String {
        self.http_get(self.proxy().metrics, "/metrics")
            .expect("metrics endpoint answers")
            .1
    }

    /// The value of one sample line of the metrics, e.g.
    /// `skiff_proxy_input_errors_total{reason="duplicate"}`.
    pub fn metric(&self, sample: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// A client command inside the namespace and the cgroup.
    pub fn client(&self, program: &str) -> Command {
        let mut cmd = self.ns.command(program);
        self.cg.enter_before_exec(&mut cmd);
        cmd
    }

    /// `proxy probe` from a client's place.
    pub fn probe(&self, proto: &str, addr: SocketAddr, count: u32) -> Vec<Attempt> {
        let out = self
            .client(PROXY)
            .args(["probe", proto])
            .arg(addr.to_string())
            .args(["--count", &count.to_string()])
            .output()
            .expect("running proxy probe");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// One HTTP probe: Ok(backend name) or Err(errno).
    pub fn ask(&self, addr: SocketAddr) -> Result<String, Option<i32>> {
        let a = self.probe("http", addr, 1).pop().expect("one attempt");
        if a.ok {
            Ok(a.reply.unwrap_or_default())
        } else {
            Err(a.errno)
        }
    }

    pub fn http_backend(&self, ip: IpAddr, port: u16, name: &str) -> Backend {
        self.ns.http_server(SocketAddr::new(ip, port), name, 1)
    }

    pub fn udp_backend(&self, ip: IpAddr, port: u16, name: &str) -> Backend {
        self.ns.udp_server(SocketAddr::new(ip, port), name)
    }
}

/// One attempt printed by `proxy probe`.
#[derive(Debug, Deserialize)]
pub struct Attempt {
    pub ok: bool,
    pub reply: Option<String>,
    pub peer: Option<String>,
    pub error: Option<String>,
    pub errno: Option<i32>,
}

/// The proxy process, its logs collected from stderr.
pub struct Proxy {
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    pub metrics: SocketAddr,
}

impl Proxy {
    fn spawn(mut cmd: Command) -> Proxy {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "info");
        let mut child = cmd.spawn().expect("starting the proxy");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line
                    .contains("metrics and /healthz listening")
                    .then(|| line.split("addr=").nth(1))
                    .flatten()
                {
                    let _ = tx.send(addr.trim().to_string());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let metrics = match rx.recv_timeout(WAIT) {
            Ok(a) => a.parse().expect("metrics address"),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "proxy did not start ({status:?}); logs:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        };
        Proxy {
            child,
            logs,
            metrics,
        }
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub fn has_log(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let pid = self.child.id();
        wait_until("proxy exits after SIGTERM", WAIT, || {
            match self.child.try_wait() {
                Ok(Some(status)) => Ok(status),
                Ok(None) => Err(format!("pid {pid} still running")),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A Service manifest.
pub fn service(name: &str, ips: &[IpAddr], ports: &[(&str, u16, &str)], extra: &str) -> String {
    let ips: Vec<String> = ips.iter().map(|i| format!("\"{i}\"")).collect();
    let ports: Vec<String> = ports
        .iter()
        .map(|(n, p, proto)| format!("{{name: \"{n}\", port: {p}, protocol: {proto}}}"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: {}\n  clusterIPs: [{}]\n  ports: [{}]\n{extra}",
        ips[0],
        ips.join(", "),
        ports.join(", ")
    )
}

/// Conditions of one endpoint in [`slice_of`].
#[derive(Clone, Copy, Debug)]
pub enum Cond {
    Ready,
    NotReady,
    /// Terminating, still passing its readiness probe.
    ServingTerminating,
    /// Terminating and no longer serving.
    Terminating,
}

/// An EndpointSlice manifest with explicit conditions (and optional node names).
pub fn slice_of(
    name: &str,
    service: &str,
    ports: &[(&str, u16, &str)],
    endpoints: &[(IpAddr, Cond, Option<&str>)],
) -> String {
    let ports: Vec<String> = ports
        .iter()
        .map(|(n, p, proto)| format!("{{name: \"{n}\", port: {p}, protocol: {proto}}}"))
        .collect();
    let eps: Vec<String> = endpoints
        .iter()
        .map(|(ip, c, node)| {
            let (ready, serving, terminating) = match c {
                Cond::Ready => (true, true, false),
                Cond::NotReady => (false, false, false),
                Cond::ServingTerminating => (false, true, true),
                Cond::Terminating => (false, false, true),
            };
            let node = node.map_or(String::new(), |n| format!(", nodeName: {n}"));
            format!("{{addresses: [\"{ip}\"], conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}{node}}}")
        })
        .collect();
    let family = if endpoints.first().is_some_and(|e| e.0.is_ipv6()) {
        "IPv6"
    } else {
        "IPv4"
    };
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: {family}\nports: [{}]\nendpoints: [{}]\n",
        ports.join(", "),
        eps.join(", ")
    )
}

/// An EndpointSlice manifest (all endpoints ready unless listed in `not_ready`).
pub fn slice(
    name: &str,
    service: &str,
    family: &str,
    ports: &[(&str, u16, &str)],
    ready: &[IpAddr],
    not_ready: &[IpAddr],
) -> String {
    let ports: Vec<String> = ports
        .iter()
        .map(|(n, p, proto)| format!("{{name: \"{n}\", port: {p}, protocol: {proto}}}"))
        .collect();
    let mut eps: Vec<String> = ready
        .iter()
        .map(|i| format!("{{addresses: [\"{i}\"], conditions: {{ready: true}}}}"))
        .collect();
    eps.extend(
        not_ready
            .iter()
            .map(|i| format!("{{addresses: [\"{i}\"], conditions: {{ready: false}}}}")),
    );
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: {family}\nports: [{}]\nendpoints: [{}]\n",
        ports.join(", "),
        eps.join(", ")
    )
}

/// Traffic from outside the node, around a [`World`] whose namespace plays the node: a
/// client namespace linked to it (the node's address on that link is where NodePorts
/// answer), and a second node's namespace behind it holding a remote backend. Addresses
/// come from a /24 leased for the test: client link .0/30 (node .1, client .2), other node
/// link .4/30 (node .5, other node .6), local backends .65 and .66 on the node, external
/// addresses routed to the node from the client (.100 and up).
pub struct Outside {
    pub client: NetNs,
    pub other: NetNs,
    lease: SubnetLease,
    client_link: skiff_tests::netns::Veth,
    _other_link: skiff_tests::netns::Veth,
}

/// The node's name in the proxy (`--node-name`) and the other node's, for slices.
pub const NODE: &str = "px-node";
pub const OTHER_NODE: &str = "px-other";

impl Outside {
    pub fn new(w: &World) -> Outside {
        let lease = subnet::lease();
        let client = NetNs::new("pc");
        let other = NetNs::new("po");
        let client_link = skiff_tests::netns::Veth::new(Some(&w.ns), &client);
        let other_link = skiff_tests::netns::Veth::new(Some(&w.ns), &other);
        let o = Outside {
            client,
            other,
            lease,
            client_link,
            _other_link: other_link,
        };
        let (cl, ol) = (&o.client_link, &o._other_link);
        w.ns.ip(&["addr", "add", &format!("{}/30", o.addr(1)), "dev", &cl.host]);
        o.client
            .ip(&["addr", "add", &format!("{}/30", o.addr(2)), "dev", &cl.peer]);
        w.ns.ip(&["addr", "add", &format!("{}/30", o.addr(5)), "dev", &ol.host]);
        o.other
            .ip(&["addr", "add", &format!("{}/30", o.addr(6)), "dev", &ol.peer]);
        for b in [65, 66] {
            w.ns.ip(&["addr", "add", &format!("{}/32", o.addr(b)), "dev", &cl.host]);
        }
        // The rest of the /24 (external addresses) is reached through the node, from both.
        let net = o.lease.cidr().to_string();
        o.client
            .ip(&["route", "add", &net, "via", &o.addr(1).to_string()]);
        o.other
            .ip(&["route", "add", &net, "via", &o.addr(5).to_string()]);
        // The node forwards between its links (iptables mode's DNAT to the other node).
        skiff_tests::netns::must(
            w.ns.command("sysctl")
                .args(["-qw", "net.ipv4.ip_forward=1"]),
        );
        o
    }

    pub fn addr(&self, host: u8) -> IpAddr {
        format!("10.250.{}.{host}", self.lease.octet())
            .parse()
            .unwrap()
    }

    /// The node's address facing the client.
    pub fn node_ip(&self) -> IpAddr {
        self.addr(1)
    }

    pub fn client_ip(&self) -> IpAddr {
        self.addr(2)
    }

    /// A backend on the node (local), port 8080, answering `name peer=<client address>`.
    pub fn local_backend(&self, w: &World, host: u8, name: &str) -> Backend {
        w.ns.http_server(
            SocketAddr::new(self.addr(host), 8080),
            &format!("{name} peer={{peer}}"),
            2,
        )
    }

    /// The backend on the other node, port 8080.
    pub fn remote_backend(&self, name: &str) -> Backend {
        self.other.http_server(
            SocketAddr::new(self.addr(6), 8080),
            &format!("{name} peer={{peer}}"),
            2,
        )
    }

    /// A UDP backend on the node.
    pub fn local_udp_backend(&self, w: &World, host: u8, name: &str) -> Backend {
        w.ns.udp_server(SocketAddr::new(self.addr(host), 5353), name)
    }

    /// `proxy probe` from the client namespace (outside the node).
    pub fn probe(&self, proto: &str, addr: SocketAddr, count: u32) -> Vec<Attempt> {
        let out = self
            .client
            .command(PROXY)
            .args(["probe", proto])
            .arg(addr.to_string())
            .args(["--count", &count.to_string()])
            .output()
            .expect("running proxy probe");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// GET `path` on `addr` from the client: (status, body).
    pub fn http_get(&self, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        self.client.run(|| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            let code = text.split_whitespace().nth(1)?.parse().ok()?;
            Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
        })
    }

    /// Turns transmit checksum offload off on the client's end of its link: its packets
    /// then carry complete checksums, as packets from a wire do (what XDP programs see on
    /// a physical NIC; a veth otherwise passes the sender's partial checksums along).
    pub fn full_checksums_from_client(&self) {
        self.client.full_checksums(&self.client_link.peer);
    }
}
