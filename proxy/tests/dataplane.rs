//! The proxy end to end, as root: the real binary in eBPF and iptables mode, real
//! backends and clients in a network namespace and cgroup of each test's own, traffic
//! only inside that namespace. Behaviour tests run once per mode.

mod support;

use skiff_tests::wait_until;
use std::net::{IpAddr, SocketAddr};
use support::*;

const ECONNREFUSED: i32 = 111;

/// Runs a behaviour test in both modes.
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn ebpf() {
                super::$name(super::Mode::Ebpf)
            }
            #[test]
            fn iptables() {
                super::$name(super::Mode::Iptables)
            }
        }
    )*};
}

both_modes!(
    curl_reaches_a_backend,
    two_backends_share_the_traffic,
    an_endpoint_change_moves_new_connections,
    a_deleted_or_empty_service_refuses_at_once,
    udp_request_and_reply_through_the_service_address,
    getpeername_reports_the_service_address,
    client_ip_affinity_sticks,
    ipv6_service,
    bad_input_never_disturbs_programmed_services,
    serving_terminating_endpoints_take_over_when_none_is_ready,
);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const HTTP: &[(&str, u16, &str)] = &[("http", 80, "TCP")];
const HTTP_TARGET: &[(&str, u16, &str)] = &[("http", 8080, "TCP")];

/// A world with service `web` at vip(10):80 -> the given backends on :8080.
fn web(mode: Mode, backends: &[&str]) -> (World, SocketAddr) {
    let mut w = World::new(mode);
    let vip = w.vip(10);
    let ready: Vec<IpAddr> = backends.iter().map(|b| ip(b)).collect();
    w.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service("web", &[vip], HTTP, ""),
            slice("web-1", "web", "IPv4", HTTP_TARGET, &ready, &[])
        ),
    );
    w.start();
    (w, SocketAddr::new(vip, 80))
}

fn curl_reaches_a_backend(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b = w.http_backend(ip("127.0.0.2"), 8080, "backend-1");
    let out = w
        .client("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://{vip}/"))
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "backend-1");
}

fn two_backends_share_the_traffic(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2", "127.0.0.3"]);
    let b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    let attempts = w.probe("http", vip, 200);
    assert_eq!(attempts.len(), 200);
    assert!(attempts.iter().all(|a| a.ok), "{attempts:?}");
    // A server counts a connection once the client has closed it.
    wait_until("every connection counted", WAIT, || {
        match b1.served() + b2.served() {
            200 => Ok(()),
            n => Err(n),
        }
    });
    // Uniform choice: each gets 100 +- 40 (more than 5 standard deviations).
    for b in [&b1, &b2] {
        let n = b.served();
        assert!((60..=140).contains(&n), "{} served {n} of 200", b.addr);
    }
}

fn an_endpoint_change_moves_new_connections(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    assert_eq!(w.ask(vip), Ok("b1".into()));
    // b1 stops being ready, b2 appears: new connections go to b2 only.
    w.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service("web", &[vip.ip()], HTTP, ""),
            slice(
                "web-1",
                "web",
                "IPv4",
                HTTP_TARGET,
                &[ip("127.0.0.3")],
                &[ip("127.0.0.2")]
            )
        ),
    );
    wait_until("traffic moves to b2", WAIT, || match w.ask(vip) {
        Ok(b) if b == "b2" => Ok(()),
        other => Err(other),
    });
    let attempts = w.probe("http", vip, 30);
    assert!(
        attempts
            .iter()
            .all(|a| a.ok && a.reply.as_deref() == Some("b2")),
        "{attempts:?}"
    );
}

fn a_deleted_or_empty_service_refuses_at_once(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    assert_eq!(w.ask(vip), Ok("b1".into()));
    // No ready endpoint: refused, not hanging.
    let empty = SocketAddr::new(w.vip(11), 80);
    w.write(
        "empty.yaml",
        &format!(
            "{}---\n{}",
            service("empty", &[empty.ip()], HTTP, ""),
            slice(
                "empty-1",
                "empty",
                "IPv4",
                HTTP_TARGET,
                &[],
                &[ip("127.0.0.2")]
            )
        ),
    );
    if mode == Mode::Ebpf {
        // The refusal comes from the proxy (its counter), not from the address being local.
        wait_until("refused by the proxy", WAIT, || {
            let refused = w.metric(&format!(
                "skiff_proxy_refused_total{{service=\"default/empty\",frontend=\"{empty}/tcp\"}}"
            ));
            match w.ask(empty) {
                Err(Some(ECONNREFUSED)) if refused >= 1.0 => Ok(()),
                other => Err((other, refused)),
            }
        });
    } else {
        wait_until("refused", WAIT, || match w.ask(empty) {
            Err(Some(ECONNREFUSED)) => Ok(()),
            other => Err(other),
        });
    }
    // The service is deleted: refused too.
    w.remove("web.yaml");
    wait_until("deleted service refused", WAIT, || match w.ask(vip) {
        Err(Some(ECONNREFUSED)) => Ok(()),
        other => Err(other),
    });
}

fn udp_request_and_reply_through_the_service_address(mode: Mode) {
    let mut w = World::new(mode);
    let vip = w.vip(20);
    let _u = w.udp_backend(ip("127.0.0.2"), 5353, "udp-1");
    w.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service("dns", &[vip], &[("dns", 53, "UDP")], ""),
            slice(
                "dns-1",
                "dns",
                "IPv4",
                &[("dns", 5353, "UDP")],
                &[ip("127.0.0.2")],
                &[]
            )
        ),
    );
    w.start();
    let attempts = w.probe("udp", SocketAddr::new(vip, 53), 5);
    for a in &attempts {
        assert!(a.ok, "{a:?}");
        assert_eq!(a.reply.as_deref(), Some("udp-1"));
        // The reply appears to come from the service address.
        assert_eq!(a.peer.as_deref(), Some(format!("{vip}:53").as_str()));
    }
    assert_eq!(attempts.len(), 5);
}

fn getpeername_reports_the_service_address(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let a = w.probe("http", vip, 1).pop().unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(a.peer.as_deref(), Some(vip.to_string().as_str()));
}

fn client_ip_affinity_sticks(mode: Mode) {
    let mut w = World::new(mode);
    let vip = w.vip(30);
    let backends: Vec<IpAddr> = (2..5).map(|i| ip(&format!("127.0.0.{i}"))).collect();
    let _bs: Vec<Backend> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| w.http_backend(*b, 8080, &format!("b{i}")))
        .collect();
    w.write(
        "sticky.yaml",
        &format!(
            "{}---\n{}",
            service(
                "sticky",
                &[vip],
                HTTP,
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}\n"
            ),
            slice("sticky-1", "sticky", "IPv4", HTTP_TARGET, &backends, &[])
        ),
    );
    w.start();
    let attempts = w.probe("http", SocketAddr::new(vip, 80), 30);
    let first = attempts[0].reply.clone();
    assert!(first.is_some(), "{attempts:?}");
    // Without affinity, 30 connections over 3 backends would all land on one with
    // probability 3^-29.
    assert!(attempts.iter().all(|a| a.reply == first), "{attempts:?}");
}

fn ipv6_service(mode: Mode) {
    let mut w = World::new(mode);
    let vip = w.vip6(0x10);
    let backend = w.backend6(2);
    let _b = w.http_backend(backend, 8080, "v6-backend");
    w.write(
        "web6.yaml",
        &format!(
            "{}---\n{}",
            service("web6", &[vip], HTTP, "  ipFamilies: [IPv6]\n"),
            slice("web6-1", "web6", "IPv6", HTTP_TARGET, &[backend], &[])
        ),
    );
    w.start();
    let a = w.probe("http", SocketAddr::new(vip, 80), 1).pop().unwrap();
    assert!(a.ok, "{a:?}");
    assert_eq!(a.reply.as_deref(), Some("v6-backend"));
    assert_eq!(a.peer, Some(SocketAddr::new(vip, 80).to_string()));
}

fn bad_input_never_disturbs_programmed_services(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    assert_eq!(w.ask(vip), Ok("b1".into()));
    let input_errors = |reason: &str| {
        w.metric(&format!(
            "skiff_proxy_input_errors_total{{reason=\"{reason}\"}}"
        ))
    };
    // Each kind of bad input, in its own file.
    w.write("malformed.yaml", "kind: [unclosed\n");
    w.write(
        "configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    );
    w.write(
        "port0.yaml",
        &service("port0", &[w.vip(40)], &[("http", 0, "TCP")], ""),
    );
    // The same Service defined again, and another Service claiming web's cluster IP.
    w.write("dup.yaml", &service("web", &[w.vip(41)], HTTP, ""));
    w.write("steal.yaml", &service("thief", &[vip.ip()], HTTP, ""));
    // A slice whose service does not exist (yet).
    let later = SocketAddr::new(w.vip(42), 80);
    w.write(
        "orphan.yaml",
        &slice(
            "later-1",
            "later",
            "IPv4",
            HTTP_TARGET,
            &[ip("127.0.0.3")],
            &[],
        ),
    );
    // An edit that breaks the file of the programmed service keeps it programmed.
    w.write(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web\n",
    );
    wait_until("every bad input counted", WAIT, || {
        let counts: Vec<(&str, f64)> = [
            "malformed",
            "unknown_kind",
            "invalid",
            "duplicate",
            "missing_service",
        ]
        .into_iter()
        .map(|r| (r, input_errors(r)))
        .collect();
        if counts.iter().all(|(_, n)| *n >= 1.0) && input_errors("duplicate") >= 2.0 {
            Ok(())
        } else {
            Err(counts)
        }
    });
    assert!(w.proxy().has_log("input rejected"));
    let attempts = w.probe("http", vip, 20);
    assert!(
        attempts
            .iter()
            .all(|a| a.ok && a.reply.as_deref() == Some("b1")),
        "web must be untouched: {attempts:?}"
    );
    // The orphan slice applies once its service appears.
    w.write("later.yaml", &service("later", &[later.ip()], HTTP, ""));
    wait_until("late service routes", WAIT, || match w.ask(later) {
        Ok(b) if b == "b2" => Ok(()),
        other => Err(other),
    });
}

/// KEP-1669: a service whose every endpoint is terminating but still serving keeps
/// answering from them, instead of refusing (a single-replica rolling update).
fn serving_terminating_endpoints_take_over_when_none_is_ready(mode: Mode) {
    let (w, vip) = web(mode, &["127.0.0.2"]);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    assert_eq!(w.ask(vip), Ok("b1".into()));
    // Each write also adds a sentinel service (a new address, answered by b2): once it
    // answers, everything before it in the file has been applied.
    let sentinel = std::cell::Cell::new(20u8);
    let write = |eps: &[(IpAddr, Cond, Option<&str>)]| {
        let n = sentinel.get() + 1;
        sentinel.set(n);
        let probe = SocketAddr::new(w.vip(n), 80);
        w.write(
            "web.yaml",
            &format!(
                "{}---\n{}---\n{}---\n{}",
                service("web", &[vip.ip()], HTTP, ""),
                slice_of("web-1", "web", HTTP_TARGET, eps),
                service(&format!("sentinel{n}"), &[probe.ip()], HTTP, ""),
                slice_of(
                    &format!("sentinel{n}-1"),
                    &format!("sentinel{n}"),
                    HTTP_TARGET,
                    &[(ip("127.0.0.3"), Cond::Ready, None)]
                ),
            ),
        );
        wait_until("the change is applied", WAIT, || match w.ask(probe) {
            Ok(b) if b == "b2" => Ok(()),
            other => Err(other),
        });
    };
    // b1 terminates but still serves, and nothing else is ready: b1 keeps answering.
    write(&[(ip("127.0.0.2"), Cond::ServingTerminating, None)]);
    // b2 joins not yet ready: still b1 (the change was applied: b2 is in the file).
    write(&[
        (ip("127.0.0.2"), Cond::ServingTerminating, None),
        (ip("127.0.0.3"), Cond::NotReady, None),
    ]);
    // Every new connection is answered by `backend` (the change is applied: `write` waited).
    let only = |backend: &str| {
        let attempts = w.probe("http", vip, 20);
        assert!(
            attempts
                .iter()
                .all(|a| a.ok && a.reply.as_deref() == Some(backend)),
            "{attempts:?}"
        );
    };
    only("b1");
    // b2 becomes ready: new connections go to the ready one only.
    write(&[
        (ip("127.0.0.2"), Cond::ServingTerminating, None),
        (ip("127.0.0.3"), Cond::Ready, None),
    ]);
    only("b2");
    // b1 stops serving and b2 terminates too: only b2, still serving, answers.
    write(&[
        (ip("127.0.0.2"), Cond::Terminating, None),
        (ip("127.0.0.3"), Cond::ServingTerminating, None),
    ]);
    only("b2");
    // Nothing serving: refused.
    write(&[
        (ip("127.0.0.2"), Cond::Terminating, None),
        (ip("127.0.0.3"), Cond::Terminating, None),
    ]);
    assert_eq!(w.ask(vip), Err(Some(ECONNREFUSED)));
}

/// eBPF-only behaviour.
mod ebpf_only {
    use super::*;
    use proxy::loader::maps::BpfMaps;

    /// Translations counted by the kernel over all frontends, read from the pins (works
    /// while no proxy runs).
    fn translations(w: &World) -> u64 {
        let maps = BpfMaps::open_pinned(&proxy::loader::maps_dir(w.bpffs.path())).unwrap();
        maps.services()
            .unwrap()
            .iter()
            .map(|(_, v)| maps.counters(v.id).unwrap().translations)
            .sum()
    }

    #[test]
    fn restart_without_a_single_failed_connection() {
        let (mut w, vip) = web(Mode::Ebpf, &["127.0.0.2", "127.0.0.3"]);
        let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
        let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
        let mut client = w
            .client(PROXY)
            .args(["probe", "http", &vip.to_string(), "--until-stdin-closes"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let progressed = |w: &World, from: u64| {
            wait_until("client traffic flows", WAIT, || {
                let n = translations(w);
                if n > from + 50 {
                    Ok(n)
                } else {
                    Err(n)
                }
            })
        };
        let n = progressed(&w, 0);
        w.stop();
        // Nothing runs in user space now; the pinned programs and maps keep routing.
        let n = progressed(&w, n);
        w.start();
        assert!(
            w.proxy().has_log("attach=Replaced"),
            "{:?}",
            w.proxy().logs()
        );
        progressed(&w, n);
        drop(client.stdin.take());
        let out = client.wait_with_output().unwrap();
        let summary = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && summary.contains(" 0 failed"),
            "client saw failures: {summary}\n{}\nproxy logs: {:?}",
            String::from_utf8_lossy(&out.stdout),
            w.proxy().logs()
        );
    }

    #[test]
    fn reset_removes_the_pins_and_translation_stops() {
        let (mut w, vip) = web(Mode::Ebpf, &["127.0.0.2"]);
        let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
        w.stop();
        // Stopped, the pinned programs still translate.
        assert_eq!(w.ask(vip), Ok("b1".into()));
        let out = std::process::Command::new(PROXY)
            .args(["reset", "--bpffs"])
            .arg(w.bpffs.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for dir in ["links", "maps"] {
            assert!(!w.bpffs.path().join(dir).exists(), "{dir} still pinned");
        }
        // Detached: the service address is just a local address with nothing behind it.
        wait_until("translation stops", WAIT, || match w.ask(vip) {
            Err(Some(ECONNREFUSED)) => Ok(()),
            other => Err(other),
        });
    }

    #[test]
    fn a_hundred_thousand_services_load_and_route() {
        const N: u32 = 100_000;
        let mut w = World::new(Mode::Ebpf).with_args(&["--max-services", "131072"]);
        // 100k distinct cluster IPs: 10.251.0.0/16 and 10.252.0.0/16, local in this
        // test's namespace only.
        for cidr in ["10.251.0.0/16", "10.252.0.0/16"] {
            w.ns.ip(&["route", "add", "local", cidr, "dev", "lo"]);
        }
        let vip_of = |i: u32| -> IpAddr {
            let n = i + 1;
            format!("10.{}.{}.{}", 251 + n / 65_536, (n / 256) % 256, n % 256)
                .parse()
                .unwrap()
        };
        // Written as text directly: building 200k JSON values is slow in a debug build.
        let mut items = Vec::with_capacity(2 * N as usize);
        for i in 0..N {
            items.push(format!(
                r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"s{i}","namespace":"default"}},"spec":{{"clusterIP":"{}","ports":[{{"name":"http","port":80}}]}}}}"#,
                vip_of(i)
            ));
            items.push(format!(
                r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"s{i}-1","namespace":"default","labels":{{"kubernetes.io/service-name":"s{i}"}}}},"addressType":"IPv4","ports":[{{"name":"http","port":8080}}],"endpoints":[{{"addresses":["127.0.0.2"]}}]}}"#
            ));
        }
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
            items.join(",")
        );
        w.write("many.json", &list);
        let _b = w.http_backend(ip("127.0.0.2"), 8080, "b1");
        let t = std::time::Instant::now();
        w.start_within(std::time::Duration::from_secs(180));
        eprintln!("{N} services loaded and synced in {:?}", t.elapsed());
        assert_eq!(
            w.metric("skiff_proxy_map_entries{map=\"services\"}"),
            N as f64
        );
        for i in [0, 1, 65_535, 65_536, N / 2, N - 1] {
            assert_eq!(
                w.ask(SocketAddr::new(vip_of(i), 80)),
                Ok("b1".into()),
                "service {i}"
            );
        }
    }

    #[test]
    fn a_full_map_is_reported_and_the_rest_keeps_working() {
        let mut w = World::new(Mode::Ebpf).with_args(&["--max-services", "2"]);
        let _b = w.http_backend(ip("127.0.0.2"), 8080, "b1");
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            w.write(
                &format!("{name}.yaml"),
                &format!(
                    "{}---\n{}",
                    service(name, &[w.vip(50 + i as u8)], HTTP, ""),
                    slice(
                        &format!("{name}-1"),
                        name,
                        "IPv4",
                        HTTP_TARGET,
                        &[ip("127.0.0.2")],
                        &[]
                    )
                ),
            );
        }
        w.start();
        assert!(w.metric("skiff_proxy_errors_total{kind=\"map_full\"}") >= 1.0);
        assert_eq!(w.metric("skiff_proxy_map_entries{map=\"services\"}"), 2.0);
        let routed = (0..3)
            .filter(|i| w.ask(SocketAddr::new(w.vip(50 + i), 80)).is_ok())
            .count();
        assert_eq!(routed, 2);
    }

    #[test]
    fn dump_and_metrics_show_frontends_backends_and_counters() {
        let (w, vip) = web(Mode::Ebpf, &["127.0.0.2"]);
        let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
        assert_eq!(w.probe("http", vip, 7).iter().filter(|a| a.ok).count(), 7);
        let out = std::process::Command::new(PROXY)
            .args(["dump", "--bpffs"])
            .arg(w.bpffs.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("{vip}/tcp")), "{text}");
        assert!(text.contains("0=>127.0.0.2:8080"), "{text}");
        assert!(text.contains("1 frontends, 1 backends"), "{text}");
        let sample = format!(
            "skiff_proxy_translations_total{{service=\"default/web\",frontend=\"{vip}/tcp\"}}"
        );
        assert_eq!(w.metric(&sample), 7.0);
        assert!(w
            .metrics()
            .contains("skiff_proxy_sync_duration_seconds_bucket"));
    }
}
