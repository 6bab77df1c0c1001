//! etcd members as skiff runs them (Debian's etcd-server): the command line of one member
//! of a cluster on loopback (with TLS for clients and peers, or plain for tests), and the
//! probes (health, who leads, its revision) over plain HTTP. The clusters of
//! several control planes (`cluster`, `xtask up --control-planes 3`) and the tests' etcd
//! (skiff-tests) are both made of these.

use std::path::Path;
use std::process::Command;

/// One member's identity in its cluster.
pub struct MemberSpec<'a> {
    pub name: &'a str,
    pub data_dir: &'a Path,
    pub client_port: u16,
    pub peer_port: u16,
    /// `name=peer-url,...` of every member.
    pub initial_cluster: &'a str,
    /// Unique per cluster on the machine.
    pub token: &'a str,
    /// TLS for clients and peers, both checked against the CA: a directory written by
    /// `control-plane etcd-certs` (`ca.crt`, `<name>.crt`, `<name>.key`).
    pub tls: Option<&'a Path>,
    /// Plain-HTTP /health and /metrics on this loopback port (how a TLS member is probed).
    pub metrics_port: Option<u16>,
    /// Elections in a tenth of etcd's default time (heartbeat 10 ms, election 100 ms), for
    /// tests that kill leaders; else etcd's defaults (100 ms, 1 s), which a loaded machine
    /// does not mistake for a dead leader.
    pub fast_elections: bool,
}

/// `http://127.0.0.1:<port>`
pub fn loopback_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// `etcd ...` for a member listening on loopback only (clients and peers): no address a
/// node or a pod can reach.
pub fn member_command(m: &MemberSpec<'_>) -> Command {
    let scheme = if m.tls.is_some() { "https" } else { "http" };
    let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
    let peer = format!("{scheme}://127.0.0.1:{}", m.peer_port);
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", m.name])
        .arg("--data-dir")
        .arg(m.data_dir)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", m.initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", m.token])
        .args(["--logger", "zap", "--log-outputs", "stderr"]);
    if m.fast_elections {
        cmd.args(["--heartbeat-interval", "10", "--election-timeout", "100"]);
    }
    if let Some(dir) = m.tls {
        let (crt, key) = (
            dir.join(format!("{}.crt", m.name)),
            dir.join(format!("{}.key", m.name)),
        );
        let ca = dir.join("ca.crt");
        cmd.arg("--cert-file")
            .arg(&crt)
            .arg("--key-file")
            .arg(&key)
            .arg("--trusted-ca-file")
            .arg(&ca)
            .arg("--client-cert-auth")
            .arg("--peer-cert-file")
            .arg(&crt)
            .arg("--peer-key-file")
            .arg(&key)
            .arg("--peer-trusted-ca-file")
            .arg(&ca)
            .arg("--peer-client-cert-auth");
    }
    if let Some(port) = m.metrics_port {
        cmd.args(["--listen-metrics-urls", &loopback_url(port)]);
    }
    cmd
}

/// The peer URL of a member listening on loopback `port`.
pub fn peer_url(port: u16, tls: bool) -> String {
    match tls {
        true => format!("https://127.0.0.1:{port}"),
        false => loopback_url(port),
    }
}

/// `GET /health` on a plain-HTTP loopback port (the client port of a member without TLS,
/// or a member's metrics port) says `"health":"true"`.
pub fn health(client_port: u16) -> Result<(), String> {
    let body = ureq::get(&format!("{}/health", loopback_url(client_port)))
        .call()
        .map_err(|e| e.to_string())?
        .into_body()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if body.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(body)
    }
}

/// The member's `/v3/maintenance/status` (its header carries its revision and member id).
pub fn status(client_port: u16) -> Result<serde_json::Value, String> {
    let body = ureq::post(&format!(
        "{}/v3/maintenance/status",
        loopback_url(client_port)
    ))
    .send("{}")
    .map_err(|e| e.to_string())?
    .into_body()
    .read_to_string()
    .map_err(|e| e.to_string())?;
    serde_json::from_str(&body).map_err(|e| e.to_string())
}

/// The newest revision the member on `client_port` has applied.
pub fn revision(client_port: u16) -> Result<u64, String> {
    let v = status(client_port)?;
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| format!("no revision in {v}"))
}

/// Whether the member on `client_port` is the leader (its status says the leader is
/// itself).
pub fn is_leader(client_port: u16) -> Result<bool, String> {
    let v = status(client_port)?;
    let member = v["header"]["member_id"].as_str().unwrap_or_default();
    let leader = v["leader"].as_str().unwrap_or("-");
    Ok(!member.is_empty() && member == leader)
}

/// A free loopback port for a member to take: chosen below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768 and up here), so that no `bind(0)` and no outgoing
/// connection elsewhere can be handed the port between this check and the member's bind (a
/// port taken from the ephemeral range and released was once taken by another test's server
/// in that gap), and below the NodePort range. A process walks the range from a random
/// start, so its callers never get the same port twice, and concurrent processes rarely
/// meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    const LOW: u32 = 20_000;
    // Below NodePorts too (30000-32767): a proxy's socket hooks on this machine may
    // translate connections to a NodePort on any local address.
    let high = ephemeral_low().clamp(LOW + 1_000, 30_000);
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
            ^ std::process::id().wrapping_mul(2_654_435_761);
        AtomicU32::new(seed)
    });
    for _ in 0..(high - LOW) {
        let port = (LOW + next.fetch_add(1, Ordering::Relaxed) % (high - LOW)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{high}")
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
