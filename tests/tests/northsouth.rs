//! Traffic from outside the cluster, end to end: a cluster of two nodes (the library of
//! `cargo xtask up`, with names, addresses and a LoadBalancer pool of this test's own), the
//! real kubectl, and the test process on the host as the outside client. Through either
//! node's address a NodePort reaches every pod on both nodes; externalTrafficPolicy Local
//! keeps the client's address and serves only the node's own pods, its health check node
//! port answering 200 where there are some and 503 where there are none; a LoadBalancer
//! gets an address from the pool that answers from the host; loadBalancerSourceRanges keep
//! other clients out; a pod reaches its own service through its node's NodePort (hairpin).
//!
//! Needs the daemons built and the images in the local registry, as `e2e.rs` does.

use serde_json::Value;
use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::{e2e, subnet, wait_until};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

fn json(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl printed JSON")
}

/// GET `path` from the host: (status, body), or why not.
fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP reply: {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    Ok((code, body.unwrap_or_default()))
}

/// A field of the echo pod's identity line (`pod=`, `node=`, `remote=`).
fn field(body: &str, key: &str) -> String {
    body.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string()
}

/// The pods (by name) that answer `count` requests to `addr`, and the client addresses
/// they saw; every request must succeed.
fn answered(
    addr: SocketAddr,
    count: usize,
) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
    let mut pods = BTreeSet::new();
    let mut remotes = BTreeSet::new();
    for _ in 0..count {
        let (code, body) = get(addr, "/remote")?;
        if code != 200 {
            return Err(format!("{addr}: {code} {body}"));
        }
        pods.insert(field(&body, "pod"));
        remotes.insert(field(&body, "remote"));
    }
    Ok((pods, remotes))
}

/// name -> node of the Ready pods matching `selector`, once there are `n`.
fn ready_pods(k: &Kubectl, selector: &str, n: usize) -> Vec<(String, String)> {
    wait_until(&format!("{n} pods Ready ({selector})"), T, || {
        let v = json(k, &["get", "pods", "-l", selector]);
        let pods: Vec<(String, String)> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| !e2e::terminating(p) && e2e::pod_ready(p))
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        if pods.len() == n {
            Ok(pods)
        } else {
            Err(pods)
        }
    })
}

fn node_port(k: &Kubectl, svc: &str) -> u16 {
    json(k, &["get", "service", svc])["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .expect("a node port") as u16
}

fn apply(k: &Kubectl, manifest: Value) {
    let r = k.run_with_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(r.success, "kubectl apply: {}", r.stderr);
}

fn load_balancer(name: &str, app: &str, local: bool, ranges: &[String]) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": app},
            "ports": [{"port": 80, "targetPort": 8080}],
            "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
            "loadBalancerSourceRanges": ranges,
        }
    })
}

#[test]
fn traffic_from_outside_reaches_the_pods() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("ns");
    let dir = std::env::temp_dir().join(&name);
    let octet = lease.octet();
    let mut spec = Spec::new(
        &name,
        2,
        &dir,
        lease.cidr().parse().unwrap(),
        skiff_tests::e2e::binaries(),
    );
    // The pool is part of the nodes' own subnet: the host reaches it on the bridge, and the
    // node that announces an address answers ARP for it.
    spec.control_plane_args = vec![
        "--service-lb-pool".into(),
        format!("10.250.{octet}.200-10.250.{octet}.210"),
    ];
    eprintln!("cluster {name} in {}", dir.display());
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl();
    let nodes: Vec<(String, IpAddr)> = c
        .state()
        .nodes
        .iter()
        .map(|n| (n.name.clone(), IpAddr::V4(n.ip)))
        .collect();
    let host: IpAddr = format!("10.250.{octet}.1").parse().unwrap();
    let t0 = Instant::now();

    // Four echo pods over the two nodes.
    k.ok(&[
        "create",
        "deployment",
        "echo",
        &format!("--image={ECHO_IMAGE}"),
        "--replicas=4",
    ]);
    let pods = ready_pods(&k, "app=echo", 4);
    let on = |node: &str| -> BTreeSet<String> {
        pods.iter()
            .filter(|(_, n)| n == node)
            .map(|(p, _)| p.clone())
            .collect()
    };
    let all: BTreeSet<String> = pods.iter().map(|(p, _)| p.clone()).collect();
    assert!(
        nodes.iter().all(|(n, _)| !on(n).is_empty()),
        "the scheduler spreads the pods over both nodes: {pods:?}"
    );

    // 1. NodePort, externalTrafficPolicy Cluster: every pod through either node.
    k.ok(&[
        "expose",
        "deployment",
        "echo",
        "--name=web",
        "--type=NodePort",
        "--port=80",
        "--target-port=8080",
    ]);
    let np = node_port(&k, "web");
    for (node, ip) in &nodes {
        let addr = SocketAddr::new(*ip, np);
        wait_until(
            &format!("every pod through {node}'s node port"),
            T,
            || match answered(addr, 40) {
                Ok((got, _)) if got == all => Ok(()),
                other => Err(other),
            },
        );
    }
    eprintln!(
        "  NodePort through both nodes: {:.2} s",
        t0.elapsed().as_secs_f64()
    );

    // 2. LoadBalancer with externalTrafficPolicy Local: an address from the pool, the
    // client's own address kept, only the node's pods, and the health check node port.
    apply(&k, load_balancer("lb", "echo", true, &[]));
    let svc = wait_until("a LoadBalancer address from the pool", T, || {
        let v = json(&k, &["get", "service", "lb"]);
        match v["status"]["loadBalancer"]["ingress"][0]["ip"].as_str() {
            Some(_) => Ok(v.clone()),
            None => Err(v["status"].clone()),
        }
    });
    let lb_ip: IpAddr = svc["status"]["loadBalancer"]["ingress"][0]["ip"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        lb_ip.to_string().starts_with(&format!("10.250.{octet}.2")),
        "{lb_ip} is not from the pool"
    );
    let hc = svc["spec"]["healthCheckNodePort"]
        .as_u64()
        .expect("a health check node port") as u16;
    let lb_np = node_port(&k, "lb");
    for (node, ip) in &nodes {
        let (got, remotes) = wait_until(&format!("{node}'s own pods"), T, || {
            match answered(SocketAddr::new(*ip, lb_np), 30) {
                Ok((got, remotes)) if got == on(node) => Ok((got, remotes)),
                other => Err(other),
            }
        });
        assert_eq!(
            remotes,
            BTreeSet::from([host.to_string()]),
            "{node}: {got:?}"
        );
        let (code, body) = get(SocketAddr::new(*ip, hc), "/").unwrap();
        assert_eq!(code, 200, "{node}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["localEndpoints"], on(node).len(), "{node}: {body}");
    }
    // The address from the pool answers from the host, with the node's own pods.
    let (got, remotes) = wait_until("the LoadBalancer address answers", T, || {
        answered(SocketAddr::new(lb_ip, 80), 20)
    });
    assert!(got.is_subset(&all) && !got.is_empty(), "{got:?}");
    assert_eq!(remotes, BTreeSet::from([host.to_string()]));

    // A service with its only pod on the first node: 503 on the second.
    // Created with its node selector, so no pod ever runs elsewhere.
    apply(
        &k,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "solo"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "solo"}},
                "template": {
                    "metadata": {"labels": {"app": "solo"}},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": nodes[0].0},
                        "containers": [{"name": "echo", "image": ECHO_IMAGE}],
                    },
                },
            },
        }),
    );
    let solo = ready_pods(&k, "app=solo", 1);
    assert_eq!(solo[0].1, nodes[0].0);
    apply(&k, load_balancer("solo", "solo", true, &[]));
    let solo_hc = wait_until("solo's health check node port", T, || {
        json(&k, &["get", "service", "solo"])["spec"]["healthCheckNodePort"]
            .as_u64()
            .ok_or("not yet")
    }) as u16;
    for (i, expect) in [(0, 200), (1, 503)] {
        let addr = SocketAddr::new(nodes[i].1, solo_hc);
        wait_until(
            &format!("{} answers {expect}", nodes[i].0),
            T,
            || match get(addr, "/") {
                Ok((code, body)) if code == expect => Ok(body),
                other => Err(other),
            },
        );
    }

    // 3. loadBalancerSourceRanges: a range without the host keeps it out at the address;
    // with the host's address it gets in again.
    apply(
        &k,
        load_balancer("lb", "echo", true, &["192.0.2.0/24".into()]),
    );
    wait_until("the host is kept out", T, || {
        match get(SocketAddr::new(lb_ip, 80), "/") {
            Err(e) => Ok(e),
            Ok(r) => Err(r),
        }
    });
    apply(
        &k,
        load_balancer("lb", "echo", true, &[format!("{host}/32")]),
    );
    wait_until("the host is let in", T, || {
        answered(SocketAddr::new(lb_ip, 80), 5)
    });

    // 4. Hairpin: a pod reaches its own service through its node's address.
    let (pod, node) = &pods[0];
    let node_ip = nodes.iter().find(|(n, _)| n == node).unwrap().1;
    let out = k.ok(&[
        "exec",
        pod,
        "--",
        "/echo",
        "fetch",
        &format!("http://{node_ip}:{np}/"),
        "--count",
        "10",
    ]);
    assert!(
        out.lines().filter(|l| l.contains("pod=")).count() >= 10,
        "{out}"
    );
    eprintln!(
        "  north-south checks done: {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}
