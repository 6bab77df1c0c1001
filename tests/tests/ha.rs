//! Several control planes (issue 11): a cluster of three `control-plane server`s on a
//! 3-member etcd (`Spec::control_planes`, what `cargo xtask up --control-planes 3` runs), two
//! nodes whose agents join through their own API balancers (TLS bootstrap included), the
//! proxies on those balancers, the real kubectl through the host's relay. One test, sharing
//! the cluster:
//!
//! 1. The three servers publish themselves as the `kubernetes` Service's endpoints.
//! 2. The API server every client prefers (the first) is SIGKILLed during a rolling update
//!    of 20 pods while a node-level client loops through the Service's ClusterIP: kubectl,
//!    the node agents (the rollout's new pods run; both renew their Leases afterwards) and
//!    the proxies (the client's requests reach the new pods) carry on, and the service
//!    loses no request. The pods
//!    pause 25 s in preStop: the killed server usually runs the leading controller-manager
//!    too, whose endpoint updates stop until a standby takes its Lease.
//! 3. The server whose controller-manager leads (the Lease's holder) is SIGKILLed: another
//!    takes the Lease, within its duration + 5 s of the kill (a standby watches the Lease and
//!    tries right at its expiry; the 5 s are for a loaded machine), and the Deployment scaled
//!    afterwards gets exactly its replicas (no ReplicaSet made extra pods).
//!
//! Needs the daemons built, the images in the local registry and Debian's etcd
//! (`cargo xtask test` sees to all three).

use std::time::{Duration, Instant};

use serde_json::Value;
use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::density::{self, Params};
use skiff_tests::e2e::{self, binaries};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::require_images;
use skiff_tests::wait::try_wait_until;
use skiff_tests::{subnet, wait_until};

const T: Duration = Duration::from_secs(180);
/// The controllers' Lease duration (`control-plane server`'s default, as Kubernetes').
const LEASE: Duration = Duration::from_secs(15);

fn json(k: &Kubectl, args: &[&str]) -> Value {
    e2e::json(k, args)
}

fn holder(k: &Kubectl) -> String {
    json(
        k,
        &[
            "-n",
            "kube-system",
            "get",
            "lease",
            "kube-controller-manager",
        ],
    )["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The index of the server whose log says it became leader as `identity`.
fn server_of(c: &Cluster, identity: &str) -> Option<usize> {
    c.state()
        .servers
        .iter()
        .position(|s| std::fs::read_to_string(&s.log).is_ok_and(|log| log.contains(identity)))
}

#[test]
fn three_control_planes_survive_the_loss_of_one_then_of_the_leader() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("ha");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    spec.control_planes = 3;
    spec.tls_bootstrap = true;
    spec.own_pod_network(lease.octet());
    let mut c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl().within(T);
    assert_eq!(c.state().servers.len(), 3);
    assert_eq!(c.state().etcd.len(), 3);

    // 1. Every server is an endpoint of the `kubernetes` Service.
    let servers: Vec<String> = c
        .state()
        .servers
        .iter()
        .map(|s| s.addr.ip().to_string())
        .collect();
    wait_until("the three servers as the kubernetes endpoints", T, || {
        let slice = json(&k, &["get", "endpointslice", "kubernetes"]);
        let mut seen: Vec<String> = slice["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["addresses"][0].as_str().map(str::to_string))
            .collect();
        seen.sort();
        let mut want = servers.clone();
        want.sort();
        match seen == want {
            true => Ok(()),
            false => Err(format!("endpoints {seen:?}")),
        }
    });

    // 2. The first server killed during the rolling update under the looping client.
    let first = c.state().servers[0].pid.expect("server 0 runs");
    let (kubeconfig, scratch) = (c.kubeconfig(), c.state_dir().join("killer"));
    std::fs::create_dir_all(&scratch).unwrap();
    let killer = std::thread::spawn(move || {
        let k = Kubectl::new(&kubeconfig, &scratch).within(Duration::from_secs(30));
        // The rollout has begun once the Deployment has a second ReplicaSet.
        try_wait_until(
            "the rollout's new ReplicaSet",
            Duration::from_secs(600),
            || {
                let out = k.run(&["get", "replicasets", "-l", "app=ha", "-o", "name"]);
                match out.stdout.lines().count() {
                    n if n >= 2 => Ok(()),
                    n => Err(format!("{n} ReplicaSets")),
                }
            },
        )
        .expect("the rollout starts");
        // SAFETY: kill(2) on the cluster's own server process.
        unsafe { libc::kill(first as i32, libc::SIGKILL) };
        Instant::now()
    });
    let report = density::run(
        &c,
        &Params {
            name: "ha".into(),
            replicas: 20,
            scale_to: 5,
            step_timeout: Duration::from_secs(300),
            client_node: 1,
            // The killed server may run the leading controller-manager (the first server
            // usually wins the first election): endpoint removals then wait for a standby
            // to take the Lease (up to its 15 s duration and a retry). A pod that is
            // deleted meanwhile must keep serving until its endpoint is gone, as
            // Kubernetes advises for any rollout without lost requests: a preStop pause
            // longer than that.
            pre_stop_secs: 25,
        },
    )
    .unwrap_or_else(|e| panic!("the rollout with a server killed: {e}"));
    let killed_at = killer.join().expect("the killer thread");
    eprintln!("{report}");
    assert!(
        killed_at.elapsed() > report.scale_down,
        "the server was killed during the rollout"
    );
    c.kill_server(0).unwrap();
    assert!(report.requests_ok > 0, "{}", report.client_summary);
    assert!(
        report.failures.is_empty(),
        "the service lost requests while a server died:\n{}",
        report.failures
    );
    // Both node agents carried on through their balancers: Ready, and each renews its
    // Lease again now that the first server is dead.
    let renewed = |k: &Kubectl| -> Vec<String> {
        json(k, &["-n", "kube-node-lease", "get", "leases"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                l["spec"]["renewTime"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    let before = renewed(&k);
    assert_eq!(before.len(), 2, "two node Leases");
    wait_until("both node agents renew their Leases again", T, || {
        let now = renewed(&k);
        match now.iter().zip(&before).all(|(a, b)| a != b) {
            true => Ok(()),
            false => Err(format!("{before:?} -> {now:?}")),
        }
    });
    let nodes = json(&k, &["get", "nodes"]);
    for n in nodes["items"].as_array().unwrap() {
        let ready = n["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{} not Ready", n["metadata"]["name"]);
    }

    // 3. The leading controller-manager's server SIGKILLed: another takes the Lease.
    let leader = holder(&k);
    let i = server_of(&c, &leader)
        .unwrap_or_else(|| panic!("no server log names the holder {leader:?}"));
    assert_ne!(i, 0, "server 0 is dead and cannot hold the Lease");
    c.kill_server(i).unwrap();
    let killed = Instant::now();
    let next = wait_until(
        "another controller-manager takes the Lease",
        LEASE + Duration::from_secs(5),
        || match holder(&k) {
            h if h != leader && !h.is_empty() => Ok(h),
            h => Err(format!("holder {h}")),
        },
    );
    eprintln!(
        "  controller-manager Lease taken over in {:.1} s (lease {} s), by {next}",
        killed.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    assert!(server_of(&c, &next).is_some_and(|j| j != i && j != 0));
    // Its controllers act, and no extra pod comes from a ReplicaSet.
    k.ok(&["scale", "deployment", "ha", "--replicas=8"]);
    e2e::wait_ready(&k, "app=ha", 8, T);
    let rs = json(&k, &["get", "replicasets", "-l", "app=ha"]);
    let total: u64 = rs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"]["replicas"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 8, "ReplicaSets' replicas: {rs}");
    let live = e2e::pods(&k, "app=ha")
        .into_iter()
        .filter(|p| !p.terminating)
        .count();
    assert_eq!(live, 8, "exactly 8 pods after the takeover");
}
