//! The whole path end to end, real everything: a cluster of two nodes brought up by the
//! same library as `cargo xtask up` (control plane, node agents with their own containerd
//! in network namespaces of their own, the eBPF proxy of each node watching the API), in a
//! bridge, address range and node names unique to this test, and the real kubectl:
//!
//! `kubectl create deployment echo --replicas=3` and `kubectl expose`; a pod on the second
//! node reaches the ClusterIP and every pod answers; kubectl exec, logs, port-forward and
//! run -i (attach); the node agent's HTTPS API called directly (401 without credentials,
//! 403 without nodes/proxy, a service account token with it reads logs); a
//! deleted pod is replaced and the service follows; scaling to 5 and back; a rolling update
//! with readiness gating and a preStop hook under a looping client that sees no failed
//! request; the events in order; `kubectl drain` moves every pod to the other node.
//! Each step of the path is timed (printed with `--nocapture`).
//!
//! Needs the daemons built (`cargo build -p control-plane -p node -p proxy`, which
//! `cargo xtask test` does) and the images in the local registry (`cargo xtask images`).

use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::e2e::{self, binaries, ips, names, pod_of, LoopingClient, PodView};
use skiff_tests::kubeconfig::KubeconfigAccess;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

/// Waits until exactly `n` pods match, all Ready and none terminating.
fn wait_ready(k: &Kubectl, selector: &str, n: usize) -> Vec<PodView> {
    e2e::wait_ready(k, selector, n, T)
}

/// Backends node `i`'s maps hold for `vip`:80 (from `proxy dump`).
fn programmed(c: &Cluster, i: usize, vip: &str) -> BTreeSet<String> {
    let dump = c.proxy_dump(i).unwrap_or_default();
    dump.lines()
        .find(|l| l.contains(&format!(" {vip}:80/tcp")))
        .map(|l| {
            l.split("=>")
                .skip(1)
                .filter_map(|b| b.split([',', ' ']).next())
                .filter_map(|b| b.split(':').next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn wait_programmed(c: &Cluster, vip: &str, ips: &BTreeSet<String>) -> Vec<Duration> {
    let t0 = Instant::now();
    (0..c.state().nodes.len())
        .map(|i| {
            wait_until(
                &format!("{} programs {ips:?}", c.state().nodes[i].name),
                T,
                || match programmed(c, i, vip) {
                    got if &got == ips => Ok(t0.elapsed()),
                    got => Err(got),
                },
            )
        })
        .collect()
}

fn probe(c: &Cluster, i: usize, vip: &str, count: u32) -> (Vec<String>, usize) {
    e2e::probe(c, i, &format!("{vip}:80"), count)
}

/// The service answers node `i`'s client from exactly the pods `want`.
fn wait_answered_by(c: &Cluster, i: usize, vip: &str, want: &BTreeSet<String>) {
    wait_until(&format!("{vip} answered by {want:?}"), T, || {
        let (got, failed) = probe(c, i, vip, 60);
        let got: BTreeSet<String> = got.into_iter().collect();
        if &got == want && failed == 0 {
            Ok(())
        } else {
            Err((got, failed))
        }
    });
}

/// Where every pod's service account files are (client-go and kube-rs read them there).
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A pod that says nothing about service accounts gets, from the ServiceAccount admission
/// plugin, the `default` account and its projected token volume (a bound token of 3607 s,
/// the cluster CA, the namespace), and calls the API as an in-cluster client: 200 for
/// discovery, 403 for the namespace's secrets (the default service account holds no grant);
/// its token is bound to it. A pod with `automountServiceAccountToken: false` has no token.
fn in_cluster_access(k: &Kubectl, node: &str) {
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "incluster", "labels": {"app": "incluster"}},
        "spec": {"nodeName": node,
            "containers": [{"name": "c", "image": ECHO_IMAGE}]}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &manifest.to_string());
    assert!(r.success, "creating the in-cluster pod: {}", r.stderr);
    let bare = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "no-token", "labels": {"app": "incluster"}},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": ECHO_IMAGE}]}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &bare.to_string());
    assert!(r.success, "creating the pod without a token: {}", r.stderr);
    wait_ready(k, "app=incluster", 2);
    let spec = e2e::json(k, &["get", "pod", "incluster", "-o", "json"]);
    assert_eq!(spec["spec"]["serviceAccountName"], "default", "{spec}");
    let volume = spec["spec"]["volumes"][0]["name"]
        .as_str()
        .unwrap_or_default();
    assert!(volume.starts_with("kube-api-access-"), "{spec}");
    assert_eq!(
        spec["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], SA_DIR,
        "{spec}"
    );

    let env = k.ok(&["exec", "incluster", "--", "/echo", "env"]);
    let host = env
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_SERVICE_HOST="))
        .unwrap_or_else(|| panic!("KUBERNETES_SERVICE_HOST in {env}"));
    let vip = k.ok(&[
        "get",
        "service",
        "kubernetes",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert_eq!(host, vip.trim(), "{env}");
    assert!(
        env.lines().any(|l| l == "KUBERNETES_SERVICE_PORT=443"),
        "{env}"
    );

    // The client retries while the proxies learn the new service's backends.
    let answers = wait_until("the in-cluster client's answers", T, || {
        let r = k.run(&["exec", "incluster", "--", "/echo", "incluster"]);
        if r.success && r.stdout.contains("GET /apis ") {
            Ok(r.stdout)
        } else {
            Err(format!("{}{}", r.stdout, r.stderr))
        }
    });
    assert!(answers.contains("GET /apis 200"), "{answers}");
    assert!(
        answers.contains("GET /api/v1/namespaces/default/secrets 403"),
        "{answers}"
    );

    // The token: bound to this pod, 3607 s as the admission plugin's projection asks.
    let token = k.ok(&[
        "exec",
        "incluster",
        "--",
        "/echo",
        "cat",
        &format!("{SA_DIR}/token"),
    ]);
    let claims = jwt_claims(&token);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3607,
        "{claims}"
    );
    assert_eq!(
        claims["sub"], "system:serviceaccount:default:default",
        "{claims}"
    );
    assert_eq!(
        claims["kubernetes.io"]["pod"]["name"], "incluster",
        "{claims}"
    );

    let r = k.run(&[
        "exec",
        "no-token",
        "--",
        "/echo",
        "exists",
        &format!("{SA_DIR}/token"),
    ]);
    assert!(
        !r.success,
        "automountServiceAccountToken: false mounts no token: {r:?}"
    );
    k.ok(&["delete", "pod", "incluster", "no-token", "--wait=false"]);
}

/// The claims of a JWT (its middle part), not verified: the API server verified it.
fn jwt_claims(token: &str) -> serde_json::Value {
    use base64::Engine;
    let payload = token.trim().split('.').nth(1).expect("a JWT");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url claims");
    serde_json::from_slice(&raw).expect("JSON claims")
}

/// `kubectl port-forward pod/<pod> :8080` (the API server relays to the pod's node agent
/// and its runtime's streaming server, which connects inside the pod's network namespace),
/// then one HTTP GET through the local port kubectl chose.
fn port_forward_get(k: &Kubectl, pod: &str) -> String {
    let mut pf = k.spawn(&["port-forward", &format!("pod/{pod}"), ":8080"]);
    let stdout = pf.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        // "Forwarding from 127.0.0.1:43567 -> 8080"
        let mut lines = std::io::BufReader::new(stdout).lines();
        let port = lines.by_ref().find_map(|l| {
            l.ok()?
                .strip_prefix("Forwarding from 127.0.0.1:")?
                .split(' ')
                .next()?
                .parse::<u16>()
                .ok()
        });
        let _ = tx.send(port);
        // Read on until kubectl ends: it prints a line per connection, and a closed pipe
        // would end it.
        lines.for_each(drop);
    });
    let port = match rx.recv_timeout(T) {
        Ok(Some(port)) => port,
        other => {
            let _ = pf.kill();
            let out = pf.wait_with_output().expect("kubectl port-forward ends");
            panic!(
                "kubectl port-forward printed no local port ({other:?}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let answer = skiff_tests::netns::http_get(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(10),
    );
    let _ = pf.kill();
    let out = pf.wait_with_output().expect("kubectl port-forward ends");
    answer.unwrap_or_else(|e| {
        panic!(
            "GET through the forwarded port {port}: {e}; kubectl said: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Prints a step of the path with its time since `t0`.
fn mark(table: &mut Vec<(String, f64)>, what: &str, t: Duration) {
    eprintln!("  {what:<60} {:>7.2} s", t.as_secs_f64());
    table.push((what.to_string(), t.as_secs_f64()));
}

/// The proxies (synced, so their RBAC is enough) run as `system:kube-proxy` with the
/// cluster library's proxy kubeconfig: services are readable, secrets are not (403 naming
/// that user).
fn proxies_are_kube_proxy(c: &Cluster) {
    let proxy = KubeconfigAccess::read(&c.proxy_kubeconfig()).unwrap();
    let get = |path: &str| proxy.get(path, Duration::from_secs(30)).unwrap();
    assert_eq!(get("/api/v1/services").0, 200);
    let (code, body) = get("/api/v1/secrets");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"User \"system:kube-proxy\" cannot list resource \"secrets\""#),
        "{body}"
    );
}

/// The node agent's API (HTTPS on the node's address, port 10250), called directly: no
/// credentials is 401; a certificate of the cluster CA for a user without nodes/proxy is 403
/// with the kubelet's message; a service account token granted nodes/proxy reads the pod's
/// log but not /metrics (nodes/metrics); the API server's own path (nodes/proxy) works.
fn node_api_is_secured(c: &Cluster, k: &Kubectl, pod: &str, node: &str) {
    let ip = c
        .state()
        .nodes
        .iter()
        .find(|n| n.name == node)
        .map(|n| n.ip)
        .expect("the pod's node");
    let admin = KubeconfigAccess::read(&c.kubeconfig()).unwrap();
    let as_ = |client: Option<(String, String)>, token: Option<String>| KubeconfigAccess {
        server: format!("https://{ip}:10250"),
        ca_pem: admin.ca_pem.clone(),
        client,
        token,
    };
    let get = |who: &KubeconfigAccess, path: &str| {
        who.get(path, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("GET {path} on {node}: {e}"))
    };
    let container = k.ok(&[
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.spec.containers[0].name}",
    ]);
    let logs = format!("/containerLogs/default/{pod}/{container}?tailLines=20");
    let exec = format!("/exec/default/{pod}/{container}?command=%2Fecho&command=env&stdout=true");

    let anonymous = as_(None, None);
    for path in ["/healthz", logs.as_str(), exec.as_str(), "/no-such-path"] {
        let (code, body) = get(&anonymous, path);
        assert_eq!((code, body.trim()), (401, "Unauthorized"), "{path}");
    }

    let nobody = KubeconfigAccess::read(&c.user_kubeconfig("e2e-nobody", None).unwrap()).unwrap();
    let nobody = as_(nobody.client, None);
    let (code, body) = get(&nobody, &exec);
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=e2e-nobody, verb=get, resource=nodes, subresource=proxy)"
    );
    assert_eq!(get(&nobody, &logs).0, 403);

    k.ok(&["create", "serviceaccount", "kubelet-reader"]);
    k.ok(&[
        "create",
        "clusterrole",
        "kubelet-reader",
        "--verb=get",
        "--resource=nodes/proxy",
    ]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "kubelet-reader",
        "--clusterrole=kubelet-reader",
        "--serviceaccount=default:kubelet-reader",
    ]);
    // The grant is in the API server's view before the node agent asks (a denial would be
    // cached for 30 s).
    wait_until("the grant is visible", T, || {
        let r = k.run(&[
            "auth",
            "can-i",
            "get",
            "nodes",
            "--subresource=proxy",
            "--as=system:serviceaccount:default:kubelet-reader",
        ]);
        (r.stdout.trim() == "yes").then_some(()).ok_or(r)
    });
    let token = k.ok(&["create", "token", "kubelet-reader"]);
    let reader = as_(None, Some(token.trim().to_string()));
    let (code, body) = get(&reader, &logs);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("serving on :8080"), "{body}");
    assert_eq!(get(&reader, "/healthz"), (200, "ok".to_string()));
    let (code, body) = get(&reader, "/metrics");
    assert_eq!(code, 403, "nodes/metrics is not granted: {body}");

    let raw = k.ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{node}/proxy/healthz"),
    ]);
    assert_eq!(raw.trim(), "ok");
}

#[test]
fn a_deployment_behind_a_service_on_two_nodes() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("e2e");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    // Pods reach the API server (step 9) through routes on the host back to them.
    spec.own_pod_network(lease.octet());
    eprintln!("cluster {name} in {}", dir.display());
    let t_up = Instant::now();
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let mut table = Vec::new();
    mark(&mut table, "cluster up (2 nodes)", t_up.elapsed());
    proxies_are_kube_proxy(&c);
    let k = c.kubectl();
    let (node1, node2) = (
        c.state().nodes[0].name.clone(),
        c.state().nodes[1].name.clone(),
    );
    let out = k.ok(&["get", "nodes"]);
    assert!(out.contains(&node1) && out.contains(&node2), "{out}");

    // 1. The deployment, the service, and the path to the first answer.
    let t0 = Instant::now();
    k.ok(&[
        "create",
        "deployment",
        "echo",
        "--image",
        ECHO_IMAGE,
        "--replicas=3",
    ]);
    k.ok(&[
        "expose",
        "deployment",
        "echo",
        "--port=80",
        "--target-port=8080",
    ]);
    let vip = k.ok(&["get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"]);
    let echo = wait_ready(&k, "app=echo", 3);
    mark(
        &mut table,
        "deployment created -> 3 pods Ready",
        t0.elapsed(),
    );
    let t_ready = t0.elapsed();
    for (i, took) in wait_programmed(&c, &vip, &ips(&echo))
        .into_iter()
        .enumerate()
    {
        mark(
            &mut table,
            &format!(
                "-> endpoints programmed in {}'s maps",
                c.state().nodes[i].name
            ),
            t_ready + took,
        );
    }
    wait_until("a first successful request", T, || {
        match probe(&c, 1, &vip, 1) {
            (n, 0) if n.len() == 1 => Ok(()),
            other => Err(other),
        }
    });
    mark(
        &mut table,
        "-> first successful request (node-2 client)",
        t0.elapsed(),
    );
    // (The slices' last-change-trigger-time annotation, present only on writes that a pod's
    // Ready transition triggered, is checked through what the proxies measured: step 7.)

    // 2. From a pod on the second node, through the ClusterIP: every pod answers, also
    // the ones on the first node.
    let t = Instant::now();
    let log = e2e::client_pod(&k, "client-1", &node2, &format!("http://{vip}/"), 60, T);
    mark(
        &mut table,
        "client pod on node 2: 60 requests through the ClusterIP",
        t.elapsed(),
    );
    let answered: BTreeSet<String> = log.lines().map(pod_of).collect();
    assert_eq!(answered, names(&echo), "every pod answers:\n{log}");
    assert!(
        echo.iter().any(|p| p.node == node1),
        "a backend on the other node: {echo:?}"
    );

    // kubectl exec and logs reach a pod on a node (the API server relays to that node's
    // agent and its runtime's streaming server at the node's address).
    let on_node2 = echo
        .iter()
        .find(|p| p.node == node2)
        .or(echo.first())
        .expect("an echo pod");
    let fetched = k.ok(&[
        "exec",
        &on_node2.name,
        "--",
        "/echo",
        "fetch",
        &format!("http://{vip}/"),
        "--count",
        "3",
    ]);
    assert_eq!(
        fetched.lines().filter(|l| l.starts_with("pod=")).count(),
        3,
        "{fetched}"
    );
    let log = k.ok(&["logs", &on_node2.name]);
    assert!(log.contains("serving on :8080"), "{log}");
    let answer = port_forward_get(&k, &on_node2.name);
    assert!(
        answer.starts_with(&format!("pod={} ", on_node2.name)),
        "{answer}"
    );
    // `kubectl run -i`: a container with an open stdin (stdinOnce), attached through the
    // API server; it copies what it reads until the attach closes its stdin.
    let r = k.within(T).run_with_stdin(
        &[
            "run",
            "reader",
            "--image",
            ECHO_IMAGE,
            "--restart=Never",
            "-i",
            "--command",
            "--",
            "/echo",
            "cat",
            "-",
        ],
        "hello\nthrough attach\n",
    );
    assert!(
        r.success && r.stdout.contains("hello\nthrough attach\n"),
        "kubectl run -i: {r:?}"
    );
    k.ok(&["delete", "pod", "reader", "--wait=false"]);
    let t = Instant::now();
    node_api_is_secured(&c, &k, &on_node2.name, &on_node2.node);
    mark(
        &mut table,
        "node agent API: 401, 403, a token with nodes/proxy",
        t.elapsed(),
    );

    // 3. A deleted pod is replaced; the service follows the replacement.
    let t = Instant::now();
    let victim = echo[0].name.clone();
    k.ok(&["delete", "pod", &victim]);
    let replaced = wait_ready(&k, "app=echo", 3);
    assert!(!names(&replaced).contains(&victim));
    wait_programmed(&c, &vip, &ips(&replaced));
    wait_answered_by(&c, 1, &vip, &names(&replaced));
    mark(
        &mut table,
        "pod deleted -> replaced, programmed, answering",
        t.elapsed(),
    );

    // 4. Scale to 5 and back to 3.
    let t = Instant::now();
    k.ok(&["scale", "deployment", "echo", "--replicas=5"]);
    let five = wait_ready(&k, "app=echo", 5);
    wait_programmed(&c, &vip, &ips(&five));
    wait_answered_by(&c, 0, &vip, &names(&five));
    mark(&mut table, "scaled to 5 -> all 5 answer", t.elapsed());
    let t = Instant::now();
    k.ok(&["scale", "deployment", "echo", "--replicas=3"]);
    let three = wait_ready(&k, "app=echo", 3);
    wait_programmed(&c, &vip, &ips(&three));
    wait_answered_by(&c, 0, &vip, &names(&three));
    mark(
        &mut table,
        "scaled to 3 -> only those 3 answer",
        t.elapsed(),
    );

    // 5. Rolling update under load: readiness gating brings new pods in only once they
    // serve; a terminating pod leaves the endpoints at once and keeps serving during its
    // preStop hook, so a client looping through the rollout never fails.
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
        "name": "echo",
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
        "lifecycle": {"preStop": {"exec": {"command": ["/echo", "sleep", "2"]}}}
    }]}}}});
    k.ok(&["patch", "deployment", "echo", "-p", &patch.to_string()]);
    k.ok(&["rollout", "status", "deployment/echo", "--timeout=180s"]);
    let before = wait_ready(&k, "app=echo", 3);
    let client = LoopingClient::start(&c, 1, &format!("{vip}:80"));
    let t = Instant::now();
    k.ok(&["set", "env", "deployment/echo", "VERSION=2"]);
    k.ok(&["rollout", "status", "deployment/echo", "--timeout=180s"]);
    let after = wait_ready(&k, "app=echo", 3);
    wait_programmed(&c, &vip, &ips(&after));
    mark(
        &mut table,
        "rolling update (3 pods) under a looping client",
        t.elapsed(),
    );
    assert!(
        names(&before).is_disjoint(&names(&after)),
        "all pods replaced"
    );
    let seen = client.finish();
    eprintln!("  looping client: {}", seen.summary);
    assert!(
        seen.failures.is_empty(),
        "failed requests during the rollout: {}\n{}",
        seen.summary,
        seen.failures
    );
    assert!(
        seen.ok > 100,
        "the client kept going through the rollout: {}",
        seen.summary
    );

    // 6. What users look at: the events of a pod, in order.
    // Listed in name order, which is time order: Events are named <object>.<hex nanoseconds>
    // (creationTimestamp has one-second resolution, too coarse to sort by).
    let selector = format!("involvedObject.name={}", echo[1].name);
    let events = k.ok(&["get", "events", "--field-selector", &selector]);
    let pod = format!("pod/{}", echo[1].name);
    let reasons: Vec<&str> = events
        .lines()
        .filter(|l| l.contains(&pod))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let wanted = ["Scheduled", "Pulling", "Pulled", "Created", "Started"];
    let mut next = wanted.iter().peekable();
    for r in &reasons {
        if next.peek() == Some(&r) {
            next.next();
        }
    }
    assert!(
        next.peek().is_none(),
        "{wanted:?} in order for {pod}: {reasons:?}\n{events}"
    );

    // 7. Network programming latency as each proxy measured it.
    for i in 0..2 {
        let metrics = c.proxy_get(i, "/metrics").unwrap();
        let sample = |name: &str| -> f64 {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let count = sample("skiff_proxy_network_programming_duration_seconds_count");
        let sum = sample("skiff_proxy_network_programming_duration_seconds_sum");
        assert!(count > 0.0, "{metrics}");
        eprintln!(
            "  {}: network programming latency mean {:.3} s over {count} changes (trigger times have 1 s resolution)",
            c.state().nodes[i].name,
            sum / count
        );
    }
    // 8. `kubectl drain` the first node: its pods are evicted (pods/eviction) and replaced on
    // the second; the service follows them there.
    let t = Instant::now();
    k.within(T).ok(&[
        "drain",
        &node1,
        "--ignore-daemonsets",
        "--force",
        "--timeout=100s",
    ]);
    let drained = wait_ready(&k, "app=echo", 3);
    assert!(
        drained.iter().all(|p| p.node == node2),
        "every pod on {node2} after draining {node1}: {drained:?}"
    );
    wait_programmed(&c, &vip, &ips(&drained));
    wait_answered_by(&c, 0, &vip, &names(&drained));
    mark(
        &mut table,
        "node 1 drained -> pods on node 2, answering",
        t.elapsed(),
    );
    k.ok(&["uncordon", &node1]);

    // 9. In-cluster access: a pod reads its service account token and calls the API at
    // $KUBERNETES_SERVICE_HOST (the `kubernetes` Service's ClusterIP, through the eBPF
    // proxy to the API server).
    let t = Instant::now();
    in_cluster_access(&k, &node2);
    mark(
        &mut table,
        "in-cluster client: token, discovery, denial",
        t.elapsed(),
    );

    eprintln!("\n| step | seconds |\n|---|---:|");
    for (step, s) in c
        .timings
        .iter()
        .map(|(n, d)| (n.clone(), d.as_secs_f64()))
        .chain(table)
    {
        eprintln!("| {step} | {s:.2} |");
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
