//! North-south through the real proxy, as root, in both modes: a client in a namespace of
//! its own reaches NodePorts, external IPs and LoadBalancer addresses through the node's
//! interface, to a backend on the node and one on another node (namespaces of the test's
//! own, see `support::Outside`); traffic policies, source ranges, ClientIP affinity, the
//! health check node port, UDP, and a node-level client of its own node's NodePort. In
//! eBPF mode also with XDP in front of tc, and with Maglev.

mod support;

use skiff_tests::wait_until;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use support::*;

macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn ebpf() {
                super::$name(super::Mode::Ebpf, &[])
            }
            #[test]
            fn iptables() {
                super::$name(super::Mode::Iptables, &[])
            }
        }
    )*};
}

both_modes!(
    node_port_reaches_local_and_remote_backends,
    local_policy_keeps_the_client_address_and_local_endpoints,
    health_check_node_port_reports_local_endpoints,
    external_and_load_balancer_addresses_with_source_ranges,
    client_ip_affinity_from_outside,
    udp_node_port,
    the_nodes_own_clients_reach_its_node_ports,
);

mod ebpf_only {
    use super::*;

    /// XDP in front of tc: the same answers.
    #[test]
    fn with_xdp_acceleration() {
        node_port_reaches_local_and_remote_backends(
            Mode::Ebpf,
            &["--nodeport-acceleration", "native"],
        );
        local_policy_keeps_the_client_address_and_local_endpoints(
            Mode::Ebpf,
            &["--nodeport-acceleration", "native"],
        );
    }

    /// XDP hands a flow to another node over to tc (the route leaves by another
    /// interface): a reset ends the flow once, where it is sent on. (XDP deleting the
    /// flow's entries before tc saw the reset made tc take it for a new flow's first
    /// packet: the backend's connection stayed open, its SNAT port taken, and later flows
    /// given that port waited for SYN retransmits.)
    #[test]
    fn with_xdp_a_reset_ends_its_flow_once() {
        let args = &["--nodeport-acceleration", "native"];
        let (w, o, _b) = setup(Mode::Ebpf, args, |w, o| {
            format!(
                "{}---\n{}",
                web_service(w, "NodePort", ""),
                web_slice(o, false, true)
            )
        });
        o.full_checksums_from_client();
        let np = SocketAddr::new(o.node_ip(), NODE_PORT);
        wait_until("the remote backend answers from outside", WAIT, || {
            let a = o.probe("http", np, 3);
            if a.iter().all(|a| a.ok) {
                Ok(())
            } else {
                Err(a)
            }
        });
        let sample = format!(
            "skiff_proxy_translations_total{{service=\"default/web\",frontend=\"*:{NODE_PORT}/tcp (external)\"}}"
        );
        let before = w.metric(&sample);
        assert!(before >= 3.0, "{sample} = {before}:\n{}", w.metrics());
        const RESETS: u32 = 40;
        o.client.run(|| {
            for _ in 0..RESETS {
                let s = std::net::TcpStream::connect_timeout(&np, WAIT).expect("connect");
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: a valid socket and a correctly sized option value.
                let r = unsafe {
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&s),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&linger as *const libc::linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                assert_eq!(r, 0);
                // Closed with a reset.
                drop(s);
            }
        });
        // One more request behind the resets on the same link: once it is answered, every
        // reset before it went through the node's programs.
        assert!(o.probe("http", np, 1).iter().all(|a| a.ok));
        let after = w.metric(&sample);
        assert_eq!(
            after - before,
            f64::from(RESETS + 1),
            "each connection picked a backend once (a reset taken for a new flow picks again)"
        );
    }

    /// Maglev for the external frontends: the same answers (the table's properties are
    /// unit- and property-tested in `maglev`).
    #[test]
    fn with_maglev() {
        node_port_reaches_local_and_remote_backends(Mode::Ebpf, &["--lb-algorithm", "maglev"]);
    }

    /// `--bpf-log`: the programs' decisions reach the proxy's log, at the packet level (a
    /// NodePort from outside) and at the socket level (the node's own connect()).
    #[test]
    fn kernel_logging_with_bpf_log() {
        let (w, o, _b) = setup(Mode::Ebpf, &["--bpf-log"], |w, o| {
            format!(
                "{}---\n{}",
                web_service(w, "NodePort", ""),
                web_slice(o, true, true)
            )
        });
        let np = SocketAddr::new(o.node_ip(), NODE_PORT);
        wait_until("outside and node clients are answered", WAIT, || {
            let mut a = o.probe("http", np, 5);
            a.extend(w.probe("http", np, 5));
            if a.iter().all(|a| a.ok) {
                Ok(())
            } else {
                Err(a)
            }
        });
        let socket_level = format!("{np} -> ");
        wait_until("both levels logged", WAIT, || {
            let p = w.proxy();
            if p.has_log("becomes") && p.has_log(&socket_level) {
                Ok(())
            } else {
                Err(p.logs())
            }
        });
    }
}

const HTTP_TARGET: &[(&str, u16, &str)] = &[("http", 8080, "TCP")];
const NODE_PORT: u16 = 30080;

/// A Service `web` of `type` on port 80 with node port 30080 and `extra` spec lines.
fn web_service(w: &World, kind: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\nspec:\n  type: {kind}\n  clusterIP: {}\n  ports: [{{name: http, port: 80, nodePort: {NODE_PORT}}}]\n{extra}",
        w.vip(10)
    )
}

/// Endpoints: `local` on this node (.65), `remote` on the other node (.6).
fn web_slice(o: &Outside, local: bool, remote: bool) -> String {
    let mut eps = Vec::new();
    if local {
        eps.push((o.addr(65), Cond::Ready, Some(NODE)));
    }
    if remote {
        eps.push((o.addr(6), Cond::Ready, Some(OTHER_NODE)));
    }
    slice_of("web-1", "web", HTTP_TARGET, &eps)
}

/// A world with its outside, the local and remote backends, and the proxy started with
/// `args` once `manifest` is written.
fn setup(
    mode: Mode,
    args: &[&str],
    manifest: impl FnOnce(&World, &Outside) -> String,
) -> (World, Outside, Vec<Backend>) {
    let w = World::new(mode).with_args(args);
    let o = Outside::new(&w);
    let backends = vec![o.local_backend(&w, 65, "local"), o.remote_backend("remote")];
    let text = manifest(&w, &o);
    w.write("web.yaml", &text);
    let mut w = w;
    w.start();
    (w, o, backends)
}

/// The backend names of the replies, all attempts successful.
fn names(attempts: &[Attempt]) -> BTreeSet<String> {
    assert!(attempts.iter().all(|a| a.ok), "{attempts:?}");
    attempts
        .iter()
        .map(|a| {
            a.reply
                .as_deref()
                .unwrap_or_default()
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// The client address the backends reported.
fn peers(attempts: &[Attempt]) -> BTreeSet<String> {
    attempts
        .iter()
        .filter_map(|a| {
            a.reply
                .as_deref()?
                .split("peer=")
                .nth(1)
                .map(str::to_string)
        })
        .collect()
}

fn node_port_reaches_local_and_remote_backends(mode: Mode, args: &[&str]) {
    let (_w, o, _b) = setup(mode, args, |w, o| {
        format!(
            "{}---\n{}",
            web_service(w, "NodePort", ""),
            web_slice(o, true, true)
        )
    });
    if args.contains(&"native") {
        o.full_checksums_from_client();
    }
    let np = SocketAddr::new(o.node_ip(), NODE_PORT);
    // Both backends answer, the remote one through this node (the client never talks to
    // the other node itself).
    wait_until("both backends answer from outside", WAIT, || {
        let a = o.probe("http", np, 30);
        let n = names(&a);
        if n.len() == 2 {
            Ok(())
        } else {
            Err(n)
        }
    });
    // The client sees the node's address and port as its peer.
    let a = o.probe("http", np, 5);
    assert!(
        a.iter()
            .all(|a| a.peer.as_deref() == Some(np.to_string().as_str())),
        "{a:?}"
    );
}

fn local_policy_keeps_the_client_address_and_local_endpoints(mode: Mode, args: &[&str]) {
    let (_w, o, _b) = setup(mode, args, |w, o| {
        format!(
            "{}---\n{}",
            web_service(w, "NodePort", "  externalTrafficPolicy: Local\n"),
            web_slice(o, true, true)
        )
    });
    if args.contains(&"native") {
        o.full_checksums_from_client();
    }
    let np = SocketAddr::new(o.node_ip(), NODE_PORT);
    let a = o.probe("http", np, 20);
    assert_eq!(names(&a), BTreeSet::from(["local".to_string()]));
    assert_eq!(peers(&a), BTreeSet::from([o.client_ip().to_string()]));
}

fn health_check_node_port_reports_local_endpoints(mode: Mode, args: &[&str]) {
    const HC: u16 = 32100;
    let lb = |w: &World, o: &Outside, local: bool| {
        format!(
            "{}---\n{}",
            web_service(
                w,
                "LoadBalancer",
                &format!("  externalTrafficPolicy: Local\n  healthCheckNodePort: {HC}\n")
            ),
            web_slice(o, local, true)
        )
    };
    let (w, o, _b) = setup(mode, args, |w, o| lb(w, o, true));
    let hc = SocketAddr::new(o.node_ip(), HC);
    let (code, body) = wait_until("the health check answers", WAIT, || {
        o.http_get(hc, "/healthz").ok_or("no answer")
    });
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["service"]["name"], "web");
    assert_eq!(v["localEndpoints"], 1);
    assert_eq!(v["serviceProxyHealthy"], true);
    // The local endpoint goes: 503, and a client from outside is not served here.
    w.write("web.yaml", &lb(&w, &o, false));
    wait_until("503 without a local endpoint", WAIT, || {
        match o.http_get(hc, "/") {
            Some((503, b)) => Ok(b),
            other => Err(other),
        }
    });
    let a = o.probe("http", SocketAddr::new(o.node_ip(), NODE_PORT), 1);
    assert!(!a[0].ok, "{a:?}");
}

fn external_and_load_balancer_addresses_with_source_ranges(mode: Mode, args: &[&str]) {
    let lb = |w: &World, o: &Outside, range: IpAddr| {
        format!(
            "{}  externalIPs: [\"{}\"]\n  loadBalancerSourceRanges: [\"{range}/32\"]\nstatus: {{loadBalancer: {{ingress: [{{ip: \"{}\"}}]}}}}\n---\n{}",
            web_service(w, "LoadBalancer", ""),
            o.addr(100),
            o.addr(101),
            web_slice(o, true, false)
        )
    };
    let (w, o, _b) = setup(mode, args, |w, o| lb(w, o, o.client_ip()));
    let external = SocketAddr::new(o.addr(100), 80);
    let balancer = SocketAddr::new(o.addr(101), 80);
    assert_eq!(
        names(&o.probe("http", external, 5)),
        BTreeSet::from(["local".into()])
    );
    assert_eq!(
        names(&o.probe("http", balancer, 5)),
        BTreeSet::from(["local".into()])
    );
    // Another source only: the client is denied at the LoadBalancer address (dropped:
    // its connect times out), still served at the external IP.
    w.write("web.yaml", &lb(&w, &o, o.addr(6)));
    wait_until("the client is denied", WAIT, || {
        match o.probe("http", balancer, 1).pop().unwrap() {
            a if !a.ok => Ok(a),
            a => Err(a),
        }
    });
    assert_eq!(
        names(&o.probe("http", external, 3)),
        BTreeSet::from(["local".into()])
    );
    if mode == Mode::Ebpf {
        let denied: f64 = w
            .metrics()
            .lines()
            .filter(|l| l.starts_with("skiff_proxy_denied_total") && l.contains("(external)"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(denied >= 1.0, "the kernel counted the denial");
    }
}

fn client_ip_affinity_from_outside(mode: Mode, args: &[&str]) {
    let (_w, o, _b) = setup(mode, args, |w, o| {
        format!(
            "{}---\n{}",
            web_service(
                w,
                "NodePort",
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}\n"
            ),
            web_slice(o, true, true)
        )
    });
    let a = o.probe("http", SocketAddr::new(o.node_ip(), NODE_PORT), 20);
    // Without affinity 20 connections over 2 backends land on one with probability 2^-19.
    assert_eq!(names(&a).len(), 1, "{a:?}");
}

fn udp_node_port(mode: Mode, args: &[&str]) {
    let w = World::new(mode).with_args(args);
    let o = Outside::new(&w);
    let _u = o.local_udp_backend(&w, 66, "udp-local");
    w.write(
        "dns.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: dns, namespace: default}}\nspec:\n  type: NodePort\n  clusterIP: {}\n  ports: [{{name: dns, port: 53, protocol: UDP, nodePort: 30053}}]\n---\n{}",
            w.vip(20),
            slice_of(
                "dns-1",
                "dns",
                &[("dns", 5353, "UDP")],
                &[(o.addr(66), Cond::Ready, Some(NODE))]
            )
        ),
    );
    let mut w = w;
    w.start();
    let np = SocketAddr::new(o.node_ip(), 30053);
    let a = o.probe("udp", np, 5);
    assert!(
        a.iter()
            .all(|a| a.ok && a.reply.as_deref() == Some("udp-local")),
        "{a:?}"
    );
    // The reply comes from the address the client sent to.
    assert!(
        a.iter()
            .all(|a| a.peer.as_deref() == Some(np.to_string().as_str())),
        "{a:?}"
    );
}

/// A process of the node (in the proxy's cgroup) reaches the node port at the node's own
/// address: translated at connect() in eBPF mode, by the OUTPUT chain in iptables mode.
fn the_nodes_own_clients_reach_its_node_ports(mode: Mode, args: &[&str]) {
    let (w, o, _b) = setup(mode, args, |w, o| {
        format!(
            "{}---\n{}",
            web_service(w, "NodePort", ""),
            web_slice(o, true, true)
        )
    });
    let np = SocketAddr::new(o.node_ip(), NODE_PORT);
    wait_until("both backends answer the node itself", WAIT, || {
        let a = w.probe("http", np, 30);
        let n = names(&a);
        if n.len() == 2 {
            Ok(())
        } else {
            Err(n)
        }
    });
    // Kernel logging is off unless asked for.
    assert!(
        !w.proxy().has_log("skiff_proxy::bpf"),
        "{:?}",
        w.proxy().logs()
    );
}
