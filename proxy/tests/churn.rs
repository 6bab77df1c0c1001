//! Correctness of the eBPF data path under churn, as root with the real proxy binary:
//! connects never refused or misrouted while endpoints and services change under them,
//! reverse translations that live exactly as long as their socket, and connected UDP
//! sockets moved off a removed backend.

mod support;

use skiff_tests::wait_until;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const HTTP: &[(&str, u16, &str)] = &[("http", 80, "TCP")];
const HTTP_TARGET: &[(&str, u16, &str)] = &[("http", 8080, "TCP")];

fn web_file(vip: IpAddr, backends: &[&str]) -> String {
    let ready: Vec<IpAddr> = backends.iter().map(|b| ip(b)).collect();
    format!(
        "{}---\n{}",
        service("web", &[vip], HTTP, ""),
        slice("web-1", "web", "IPv4", HTTP_TARGET, &ready, &[])
    )
}

fn kernel_counter(w: &World, name: &str, vip: SocketAddr) -> f64 {
    w.metric(&format!(
        "skiff_proxy_{name}_total{{service=\"default/web\",frontend=\"{vip}/tcp\"}}"
    ))
}

/// A client connects in a loop while the slice flips between two and three backends every
/// 20 ms and another service comes and goes beside it (taking and freeing a frontend id
/// each time): every connect succeeds, every reply comes from one of the service's own
/// backends, and the kernel never finds an empty slot.
#[test]
fn no_connect_fails_or_strays_while_endpoints_flip() {
    let mut w = World::new(Mode::Ebpf);
    let vip = SocketAddr::new(w.vip(10), 80);
    let other = SocketAddr::new(w.vip(11), 80);
    let _b: Vec<Backend> = (2..5)
        .map(|i| w.http_backend(ip(&format!("127.0.0.{i}")), 8080, &format!("b{i}")))
        .collect();
    let stranger = w.http_backend(ip("127.0.0.9"), 8080, "stranger");
    w.write("web.yaml", &web_file(vip.ip(), &["127.0.0.2", "127.0.0.3"]));
    w.start();
    assert!(w.ask(vip).is_ok());

    // The client loops until its stdin closes, printing failed attempts only.
    let mut client = w
        .client(PROXY)
        .args(["probe", "http", &vip.to_string(), "--until-stdin-closes"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    const FLIPS: u32 = 150;
    for flip in 0..FLIPS {
        let three = flip % 2 == 0;
        let backends: &[&str] = if three {
            &["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        } else {
            &["127.0.0.3", "127.0.0.4"]
        };
        w.write("web.yaml", &web_file(vip.ip(), backends));
        // Another service takes a frontend id and gives it back.
        if three {
            w.write(
                "other.yaml",
                &format!(
                    "{}---\n{}",
                    service("other", &[other.ip()], HTTP, ""),
                    slice(
                        "other-1",
                        "other",
                        "IPv4",
                        HTTP_TARGET,
                        &[ip("127.0.0.9")],
                        &[]
                    )
                ),
            );
        } else {
            w.remove("other.yaml");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(client.stdin.take());
    let out = client.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stderr);
    eprintln!("{FLIPS} flips in {:?}: {summary}", t0.elapsed());
    let ok: u64 = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        summary.contains(" 0 failed") && ok >= 100,
        "{summary}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Every reply came from web's own backends: the stranger (another service's backend,
    // the service whose id came and went) was never reached.
    assert_eq!(
        stranger.served(),
        0,
        "connections misrouted to another service"
    );
    assert_eq!(kernel_counter(&w, "missed_slots", vip), 0.0);
    assert_eq!(kernel_counter(&w, "refused", vip), 0.0);
    // Retired slots were reclaimed after grace periods.
    wait_until("retired slots reclaimed", WAIT, || {
        match w.metric("skiff_proxy_reclaimed_slots_total") {
            n if n >= 1.0 => Ok(()),
            n => Err(n),
        }
    });
}

/// The reverse translation lives in the socket's own storage: a long-lived connection
/// still reports the service address as its peer after 300,000 other connections (the
/// LRU it replaced held 262,144 and evicted live sockets' entries).
#[test]
fn a_long_lived_connection_keeps_its_service_address() {
    let mut w = World::new(Mode::Ebpf);
    let vip = SocketAddr::new(w.vip(10), 80);
    // Accept threads enough to keep up with a connect loop on a busy machine.
    let _b =
        w.ns.http_server(SocketAddr::new(ip("127.0.0.2"), 8080), "b2", 4);
    w.write("web.yaml", &web_file(vip.ip(), &["127.0.0.2"]));
    w.start();
    let mut hold = w
        .client(PROXY)
        .args(["probe", "hold", &vip.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = hold.stdin.take().unwrap();
    let mut lines = BufReader::new(hold.stdout.take().unwrap()).lines();
    let mut peer = || -> Attempt { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let first = peer();
    assert_eq!(
        first.peer.as_deref(),
        Some(vip.to_string().as_str()),
        "{first:?}"
    );
    let t = Instant::now();
    let churn = w
        .client(PROXY)
        .args([
            "probe",
            "connect",
            &vip.to_string(),
            "--count",
            "300000",
            "--failures-only",
        ])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&churn.stderr);
    assert!(
        summary.contains("300000 ok, 0 failed"),
        "{summary}: {}",
        String::from_utf8_lossy(&churn.stdout)
    );
    eprintln!("300,000 connects in {:?}", t.elapsed());
    writeln!(input, "again").unwrap();
    let later = peer();
    assert_eq!(
        later.peer.as_deref(),
        Some(vip.to_string().as_str()),
        "{later:?}"
    );
    drop(input);
    hold.wait().unwrap();
}

/// A connected UDP socket follows its backend out of the service: the proxy destroys it
/// (the client sees an error), and the client's reconnect lands on the remaining backend.
#[test]
fn a_connected_udp_socket_moves_off_a_removed_backend() {
    let mut w = World::new(Mode::Ebpf);
    let vip = SocketAddr::new(w.vip(20), 53);
    let _u1 = w.udp_backend(ip("127.0.0.2"), 5353, "udp-1");
    let _u2 = w.udp_backend(ip("127.0.0.3"), 5353, "udp-2");
    let dns = |backend: &str| {
        format!(
            "{}---\n{}",
            service("dns", &[vip.ip()], &[("dns", 53, "UDP")], ""),
            slice(
                "dns-1",
                "dns",
                "IPv4",
                &[("dns", 5353, "UDP")],
                &[ip(backend)],
                &[]
            )
        )
    };
    w.write("dns.yaml", &dns("127.0.0.2"));
    w.start();
    let mut client = w
        .client(PROXY)
        .args(["probe", "udp-connected", &vip.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = client.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Attempt)>();
    let out = client.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), serde_json::from_str(&l).unwrap()));
        }
    });
    let (_, first) = rx.recv_timeout(WAIT).expect("a first reply");
    assert_eq!(first.reply.as_deref(), Some("udp-1"), "{first:?}");
    assert_eq!(first.peer.as_deref(), Some(vip.to_string().as_str()));
    let changed = Instant::now();
    w.write("dns.yaml", &dns("127.0.0.3"));
    let mut seen: Vec<(Instant, Attempt)> = Vec::new();
    loop {
        let (at, a) = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("the socket never moved: {seen:?}"));
        let moved = a.ok && a.reply.as_deref() == Some("udp-2");
        seen.push((at, a));
        if moved {
            break;
        }
    }
    let (error_at, error) = seen
        .iter()
        .find(|(_, a)| !a.ok)
        .unwrap_or_else(|| panic!("moved without the socket being destroyed: {seen:?}"));
    eprintln!(
        "socket destroyed {:?} and reconnected {:?} after the endpoint change",
        *error_at - changed,
        seen.last().unwrap().0 - changed
    );
    // The destroyed socket lost its peer: the next send has no destination (or the pending
    // error, ECONNABORTED, is reported first).
    assert!(matches!(error.errno, Some(89 | 103)), "{seen:?}");
    drop(input);
    client.wait().unwrap();
}
