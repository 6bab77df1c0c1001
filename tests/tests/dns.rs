//! Cluster DNS as a workload, end to end: a cluster of two nodes brought up by the same
//! library as `cargo xtask up` with [`Spec::cluster_dns`] (deploy/dns.yaml applied with the
//! real kubectl: the skiff-dns Deployment's pods reach the API through the `kubernetes`
//! Service with their service account, the Service `kube-dns` at 10.96.0.10; node agents
//! with --cluster-dns), then, from a pod of the familiar `busybox` image (docker.io's, pulled
//! from the local registry through the nodes' docker.io mirror):
//!
//! - both DNS pods Ready, on different nodes (the manifest's topology spread);
//! - `nslookup echo.default.svc.cluster.local` answers the echo Service's cluster IP;
//! - `wget -qO- http://echo/` (the search path) reaches an echo pod, which reports the
//!   busybox pod's own address as the client (the proxy translates at connect, no SNAT);
//! - a headless Service's A records are exactly its ready pods' IPs;
//! - Services created are resolvable (condition waits; the times are printed, not asserted).
//!
//! One cluster for all the steps (CI time). Needs the daemons built and the images in the
//! local registry (`cargo xtask images`: echo, pause, skiff/dns, library/busybox).

use serde_json::Value;
use skiff_tests::cluster::{Cluster, Spec, CLUSTER_DNS_IP};
use skiff_tests::e2e::{self, binaries, ips};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_image, require_images, BUSYBOX_IMAGE, DNS_IMAGE, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

/// `kubectl exec t -- CMD...`: its output, or its failure as an error (for condition waits).
fn exec(k: &Kubectl, pod: &str, cmd: &[&str]) -> Result<String, String> {
    let mut args = vec!["exec", pod, "--"];
    args.extend(cmd);
    let r = k.run(&args);
    if r.success {
        Ok(r.stdout)
    } else {
        Err(format!("{}{}", r.stdout, r.stderr))
    }
}

/// The addresses busybox's `nslookup NAME` printed for NAME (the `Address:` lines after a
/// `Name:` line; the server's own address comes before any).
fn addresses(nslookup: &str) -> BTreeSet<String> {
    nslookup
        .lines()
        .skip_while(|l| !l.starts_with("Name:"))
        .filter_map(|l| l.strip_prefix("Address:"))
        .map(|a| a.trim().to_string())
        .collect()
}

/// The A records of `name` as the pod `pod` resolves them, once they are `want`.
fn wait_resolves(k: &Kubectl, pod: &str, name: &str, want: &BTreeSet<String>) -> Duration {
    let t0 = Instant::now();
    wait_until(&format!("{name} resolves to {want:?} in {pod}"), T, || {
        // nslookup exits non-zero when one of its queries (AAAA) has no answer: the
        // printed A records are what counts.
        let out = match exec(k, pod, &["nslookup", "-type=a", name]) {
            Ok(out) | Err(out) => out,
        };
        match addresses(&out) {
            got if &got == want => Ok(t0.elapsed()),
            _ => Err(out),
        }
    })
}

fn json(k: &Kubectl, args: &[&str]) -> Value {
    e2e::json(k, args)
}

#[test]
fn cluster_dns_runs_as_a_deployment_and_pods_resolve_services() {
    require_images();
    require_image(DNS_IMAGE);
    require_image(BUSYBOX_IMAGE);
    let lease = subnet::lease();
    let name = unique_name("dns");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    // The DNS pods reach the API (the `kubernetes` Service's endpoint is on the host).
    spec.own_pod_network(lease.octet());
    spec.cluster_dns = true;
    eprintln!("cluster {name} in {}", dir.display());
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl().within(Duration::from_secs(60));
    let nodes: BTreeSet<String> = c.state().nodes.iter().map(|n| n.name.clone()).collect();

    // 1. The DNS: two Ready pods on different nodes, as its service account; kube-dns.
    let dns = json(
        &k,
        &["get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns"],
    );
    let dns_pods = dns["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(dns_pods.len(), 2, "{dns}");
    let dns_nodes: BTreeSet<String> = dns_pods
        .iter()
        .map(|p| {
            p["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(dns_nodes, nodes, "one DNS pod per node: {dns}");
    for p in &dns_pods {
        assert_eq!(p["spec"]["serviceAccountName"], "skiff-dns", "{p}");
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{p}");
    }
    let svc = json(&k, &["get", "service", "-n", "kube-system", "kube-dns"]);
    assert_eq!(svc["spec"]["clusterIP"], CLUSTER_DNS_IP, "{svc}");

    // 2. The familiar image through the docker.io mirror, and the echo Service.
    k.ok(&[
        "create",
        "deployment",
        "echo",
        "--image",
        ECHO_IMAGE,
        "--replicas=2",
    ]);
    k.ok(&[
        "expose",
        "deployment",
        "echo",
        "--port=80",
        "--target-port=8080",
    ]);
    k.ok(&[
        "run",
        "t",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sleep",
        "3600",
    ]);
    let t = e2e::wait_ready(&k, "run=t", 1, T).remove(0);
    let t_ip = t.ip.clone().expect("a Ready pod has an IP");
    // Pulled by the runtime as docker.io/library/busybox, from the local registry.
    let t_json = json(&k, &["get", "pod", "t"]);
    let status = &t_json["status"]["containerStatuses"][0];
    assert!(
        status["image"]
            .as_str()
            .unwrap_or_default()
            .contains("busybox"),
        "{t_json}"
    );
    assert!(
        status["imageID"]
            .as_str()
            .unwrap_or_default()
            .contains("sha256:"),
        "{t_json}"
    );
    let resolv = exec(&k, "t", &["cat", "/etc/resolv.conf"]).unwrap();
    assert!(
        resolv.contains(&format!("nameserver {CLUSTER_DNS_IP}")),
        "{resolv}"
    );
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    e2e::wait_ready(&k, "app=echo", 2, T);
    let echo_ip = json(&k, &["get", "service", "echo"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();

    // 3. nslookup of the Service's full name: its cluster IP.
    let took = wait_resolves(
        &k,
        "t",
        "echo.default.svc.cluster.local",
        &BTreeSet::from([echo_ip.clone()]),
    );
    eprintln!("echo.default.svc.cluster.local resolved after {took:.2?}");

    // 4. wget by the short name (search path): an echo pod answers and saw the busybox
    // pod's own address as the client.
    let answer = wait_until("wget http://echo/ from t", T, || {
        exec(&k, "t", &["timeout", "10", "wget", "-qO-", "http://echo/"])
    });
    eprintln!("wget -qO- http://echo/: {}", answer.trim());
    assert!(answer.starts_with("pod=echo-"), "{answer}");
    let client = answer
        .split_whitespace()
        .find_map(|f| f.strip_prefix("client="))
        .unwrap_or_default();
    assert!(
        client.starts_with(&format!("{t_ip}:")),
        "client {client} is t's address {t_ip}: {answer}"
    );

    // 5. A headless Service: its A records are its ready pods' addresses.
    k.ok(&[
        "create",
        "deployment",
        "hl",
        "--image",
        ECHO_IMAGE,
        "--replicas=3",
    ]);
    k.ok(&[
        "create",
        "service",
        "clusterip",
        "hl",
        "--clusterip=None",
        "--tcp=8080:8080",
    ]);
    let hl = e2e::wait_ready(&k, "app=hl", 3, T);
    let took = wait_resolves(&k, "t", "hl.default.svc.cluster.local", &ips(&hl));
    eprintln!("headless hl: {:?} after {took:.2?}", ips(&hl));

    // 6. kubectl skiff trace: the name resolvable step from both DNS servers: per pod for
    // the headless Service (its address in the answer, after the pod turned Ready), for
    // the Service with a cluster IP once (the name answers with that address).
    let dns_names: Vec<String> = dns_pods
        .iter()
        .map(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let resolvable = |trace: &Value, object: &str| -> Vec<Value> {
        trace["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["kind"] == "resolvable" && s["object"] == object)
            .cloned()
            .collect()
    };
    let from_both = |steps: &[Value]| {
        steps.len() == dns_names.len()
            && steps.iter().all(|s| !s["at"].is_null())
            && dns_names.iter().all(|d| {
                steps.iter().any(|s| {
                    s["detail"]
                        .as_str()
                        .unwrap_or_default()
                        .contains(d.as_str())
                })
            })
    };
    let trace = wait_until(
        "the trace of hl resolves every pod on both DNS servers",
        T,
        || {
            let trace = e2e::skiff_trace(&c, "deployment/hl")?;
            match hl
                .iter()
                .all(|p| from_both(&resolvable(&trace, &format!("pod/{}", p.name))))
            {
                true => Ok(trace),
                false => Err(format!("{trace:#}")),
            }
        },
    );
    let ms = |s: &Value| s["sinceAcceptedMs"].as_i64().unwrap_or(i64::MIN);
    for p in &hl {
        let object = format!("pod/{}", p.name);
        let ready = trace["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == "ready" && s["object"] == object.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no ready step of {object}: {trace:#}"));
        for r in resolvable(&trace, &object) {
            assert!(ms(&r) >= ms(&ready), "{r} before {ready}");
            assert!(r["detail"].as_str().unwrap().contains("service/hl"), "{r}");
        }
    }
    let trace = wait_until(
        "the trace of echo resolves its name on both DNS servers",
        T,
        || {
            let trace = e2e::skiff_trace(&c, "deployment/echo")?;
            match from_both(&resolvable(&trace, "service/echo")) {
                true => Ok(trace),
                false => Err(format!("{trace:#}")),
            }
        },
    );
    for r in resolvable(&trace, "service/echo") {
        let detail = r["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("echo.default.svc.cluster.local. -> {echo_ip} ")),
            "{r}"
        );
    }
    eprintln!("{trace:#}");

    // 7. Services created resolve (the time from `kubectl create` returning to the first
    // answer seen by a kubectl exec, which itself takes part of it).
    let mut times = Vec::new();
    for i in 0..5 {
        let svc = format!("new-{i}");
        let t0 = Instant::now();
        k.ok(&["create", "service", "clusterip", &svc, "--tcp=80:8080"]);
        let ip = json(&k, &["get", "service", &svc])["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .to_string();
        wait_resolves(
            &k,
            "t",
            &format!("{svc}.default.svc.cluster.local"),
            &BTreeSet::from([ip]),
        );
        times.push(t0.elapsed());
    }
    times.sort();
    eprintln!(
        "Service created -> resolvable (through kubectl exec): min {:.2?}, median {:.2?}, max {:.2?}",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
