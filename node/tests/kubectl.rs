//! The real kubectl (1.33) against an in-process API server and a real node agent with its
//! own containerd: `kubectl exec` (output, stdin, exit codes; kubectl's WebSocket attempt is
//! refused and it falls back to SPDY) and `kubectl logs` (-f, --tail, --previous), through
//! the API server's pods/exec and pods/log relays to the agent's kubelet API; and the
//! agent's repeated Events as one Event with a count, as `kubectl describe` shows them; and
//! pods/proxy, services/proxy and nodes/proxy through `kubectl get --raw` and `kubectl proxy`
//! (the API server reaching the pod through its node agent's tunnel).

mod common;

use common::cluster::{running_ready, Cluster, T};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;
use skiff_tests::kubectl::{Kubectl, Run};
use skiff_tests::registry::ECHO_IMAGE;
use skiff_tests::{wait_until, wait_until_async};
use std::io::Read;
use std::process::Child;
use std::sync::{Arc, Mutex};

/// Runs kubectl without blocking the in-process API server's runtime.
fn kubectl(k: &Kubectl, args: &[&str]) -> Run {
    tokio::task::block_in_place(|| k.run(args))
}

fn kubectl_ok(k: &Kubectl, args: &[&str]) -> String {
    let r = kubectl(k, args);
    assert!(
        r.success,
        "kubectl {args:?} failed:\n{}{}",
        r.stdout, r.stderr
    );
    r.stdout
}

/// A long-running `kubectl logs -f`: what it printed so far; killed on drop.
struct Follower {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Follower {
    fn start(k: &Kubectl, args: &[&str]) -> Follower {
        let mut child = k.spawn(args);
        let mut stdout = child.stdout.take().expect("piped stdout");
        let out = Arc::new(Mutex::new(String::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Follower { child, out }
    }

    fn wait_for(&self, text: &str) {
        wait_until(&format!("{text:?} in the followed log"), T, || {
            let out = self.out.lock().unwrap().clone();
            if out.contains(text) {
                Ok(())
            } else {
                Err(out)
            }
        });
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_and_logs_reach_the_container() {
    let c = Cluster::start("kubectl").await;
    c.assign_pod_cidr().await;
    // A liveness probe the test can fail (/control/unhealthy) to make a previous container.
    c.create_pod(
        "web",
        json!({"containers": [{"name": "echo", "image": ECHO_IMAGE,
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080},
                              "periodSeconds": 1, "failureThreshold": 3}}]}),
    )
    .await;
    c.wait_pod("web", "web Running and Ready", running_ready)
        .await;
    let k = Kubectl::new(&c.kubeconfig(), &c.scratch());

    // exec: output, the WebSocket attempt refused and SPDY used instead, stdin, exit codes.
    let hostname = kubectl(
        &k,
        &["-v=4", "exec", "web", "--", "/echo", "cat", "/etc/hostname"],
    );
    assert!(hostname.success, "{}", hostname.stderr);
    assert_eq!(hostname.stdout, "web\n");
    assert!(
        hostname.stderr.contains("RemoteCommand fallback"),
        "kubectl fell back from WebSocket to SPDY: {}",
        hostname.stderr
    );
    let piped = tokio::task::block_in_place(|| {
        k.run_with_stdin(
            &[
                "exec",
                "-i",
                "web",
                "-c",
                "echo",
                "--",
                "/echo",
                "cat",
                "/dev/stdin",
            ],
            "through stdin\nand a second line\n",
        )
    });
    assert!(piped.success, "{}", piped.stderr);
    assert_eq!(piped.stdout, "through stdin\nand a second line\n");
    let failed = kubectl(&k, &["exec", "web", "--", "/echo", "exit", "7"]);
    assert_eq!(failed.code, Some(7), "{failed:?}");
    assert!(
        failed
            .stderr
            .contains("command terminated with exit code 7"),
        "{}",
        failed.stderr
    );
    let wrong = kubectl(&k, &["exec", "web", "-c", "nope", "--", "/echo", "env"]);
    assert!(!wrong.success);
    assert!(
        wrong
            .stderr
            .contains("container nope is not valid for pod web"),
        "{}",
        wrong.stderr
    );

    // logs, and -f while a line is written to the container's stdout.
    assert!(kubectl_ok(&k, &["logs", "web"]).contains("echo: serving on :8080"));
    let follower = Follower::start(&k, &["logs", "-f", "web"]);
    follower.wait_for("echo: serving on :8080");
    kubectl_ok(
        &k,
        &[
            "exec",
            "web",
            "--",
            "/echo",
            "write",
            "/proc/1/fd/1",
            "a followed line\n",
        ],
    );
    follower.wait_for("a followed line\n");
    assert_eq!(
        kubectl_ok(&k, &["logs", "web", "--tail=1"]),
        "a followed line\n"
    );
    let no_previous = kubectl(&k, &["logs", "web", "--previous"]);
    assert!(!no_previous.success);
    assert!(
        no_previous
            .stderr
            .contains("previous terminated container \"echo\" in pod \"web\""),
        "a Status with the agent's reason: {}",
        no_previous.stderr
    );

    // The liveness probe fails: the container restarts, -f ends, --previous shows the old log.
    kubectl_ok(
        &k,
        &[
            "exec",
            "web",
            "--",
            "/echo",
            "fetch",
            "http://127.0.0.1:8080/control/unhealthy",
        ],
    );
    c.wait_pod("web", "web restarted and Ready again", |p| {
        running_ready(p)
            && p.status.as_ref().is_some_and(|s| {
                s.container_statuses
                    .iter()
                    .flatten()
                    .any(|c| c.restart_count >= 1)
            })
    })
    .await;
    let mut follower = follower;
    let ended = wait_until(
        "kubectl logs -f to end with its container",
        T,
        || match follower.child.try_wait() {
            Ok(Some(status)) => Ok(status),
            other => Err(format!("{other:?}")),
        },
    );
    assert!(ended.success(), "{ended:?}");
    let previous = kubectl_ok(&k, &["logs", "web", "--previous"]);
    assert!(previous.contains("a followed line"), "{previous}");
    let current = kubectl_ok(&k, &["logs", "web"]);
    assert!(current.contains("echo: serving on :8080"), "{current}");
    assert!(!current.contains("a followed line"), "{current}");
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_events_are_one_event_with_a_count() {
    let c = Cluster::start("events").await;
    c.assign_pod_cidr().await;
    // A readiness probe that fails the same way every second: nothing listens on 8081.
    c.create_pod(
        "unready",
        json!({"containers": [{"name": "echo", "image": ECHO_IMAGE,
            "readinessProbe": {"tcpSocket": {"port": 8081}, "periodSeconds": 1}}]}),
    )
    .await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let selector = ListParams::default().fields("involvedObject.name=unready,reason=Unhealthy");
    let unhealthy = wait_until_async("one Unhealthy Event counted 4 times", T, || {
        let (events, selector) = (events.clone(), selector.clone());
        async move {
            let list = events.list(&selector).await.map_err(|e| e.to_string())?;
            match list.items.as_slice() {
                [one] if one.count.unwrap_or(0) >= 4 => Ok(one.clone()),
                other => Err(format!(
                    "{:?}",
                    other
                        .iter()
                        .map(|e| (&e.metadata.name, e.count))
                        .collect::<Vec<_>>()
                )),
            }
        }
    })
    .await;
    let message = unhealthy.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Readiness probe failed: dial tcp ") && message.contains(":8081: "),
        "{message}"
    );
    assert!(
        unhealthy.first_timestamp < unhealthy.last_timestamp,
        "{unhealthy:?}"
    );
    assert_eq!(
        unhealthy.involved_object.field_path.as_deref(),
        Some("spec.containers{echo}")
    );

    let k = Kubectl::new(&c.kubeconfig(), &c.scratch());
    let describe = kubectl_ok(&k, &["describe", "pod", "unready"]);
    let line = describe
        .lines()
        .find(|l| l.contains("Unhealthy"))
        .unwrap_or_else(|| panic!("an Unhealthy event in:\n{describe}"));
    assert!(
        line.contains("(x") && line.contains(" over "),
        "a count in kubectl describe: {line}"
    );
    let wide = kubectl_ok(
        &k,
        &[
            "get",
            "events",
            "-o",
            "wide",
            "--field-selector",
            "reason=Unhealthy",
        ],
    );
    assert!(wide.contains("COUNT"), "{wide}");
    assert_eq!(wide.lines().count(), 2, "one Event:\n{wide}");
}

/// `kubectl proxy` on a port of its own: the address it serves on; killed on drop.
struct KubectlProxy {
    child: Child,
    addr: String,
}

impl KubectlProxy {
    fn start(k: &Kubectl) -> KubectlProxy {
        let mut child = k.spawn(&["proxy", "--port=0"]);
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                // "Starting to serve on 127.0.0.1:PORT"
                if let Some(addr) = line.strip_prefix("Starting to serve on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(T).expect("kubectl proxy serving");
        KubectlProxy { child, addr }
    }

    /// A browser-style GET through the proxy: (status line, body).
    fn get(&self, path: &str) -> (String, String) {
        use std::io::Write;
        let mut conn = std::net::TcpStream::connect(&self.addr).expect("kubectl proxy");
        conn.set_read_timeout(Some(T)).unwrap();
        write!(
            conn,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: text/html\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).expect("an answer");
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head.lines().next().unwrap_or_default().to_string();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        (
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        )
    }
}

/// The data of a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for KubectlProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_proxy_reaches_pods_services_and_the_node() {
    use control_plane::controllers::{ControllerName, Settings};

    let c = Cluster::start("proxy").await;
    c.assign_pod_cidr().await;
    c.create_pod(
        "web",
        json!({"containers": [{"name": "echo", "image": ECHO_IMAGE,
            "env": [{"name": "GREETING", "value": "hello through the proxy"}],
            "ports": [{"name": "http", "containerPort": 8080}]}]}),
    )
    .await;
    c.pods()
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
        )
        .await
        .unwrap();
    // The Endpoints controller, for services/proxy.
    let _controllers = common::controllers(
        c.client.clone(),
        Settings {
            enabled: [ControllerName::Endpoints].into(),
            ..Settings::default()
        },
    )
    .await;
    c.wait_pod("web", "web Running and Ready", running_ready)
        .await;
    let k = Kubectl::new(&c.kubeconfig(), &c.scratch());
    let raw = |path: &str| kubectl(&k, &["get", "--raw", path]);

    // pods/proxy: a port given, or the pod's first container port; the path goes on.
    let pods = "/api/v1/namespaces/default/pods";
    let r = raw(&format!("{pods}/web:8080/proxy/env/GREETING"));
    assert!(r.success, "{}", r.stderr);
    assert_eq!(r.stdout, "hello through the proxy\n");
    let r = raw(&format!("{pods}/web/proxy/healthz"));
    assert_eq!(r.stdout, "ok\n", "{}", r.stderr);
    // `.../proxy` without a path is redirected to `.../proxy/` (the client follows it).
    let r = raw(&format!("{pods}/web:8080/proxy"));
    assert!(r.stdout.starts_with("pod=web namespace="), "{r:?}");
    // The backend's own statuses pass through; a port nobody listens on cannot be reached.
    let r = raw(&format!("{pods}/web:8080/proxy/env/NOPE"));
    assert!(!r.success);
    assert!(r.stderr.contains("NotFound"), "{}", r.stderr);
    let r = raw(&format!("{pods}/web:8081/proxy/"));
    assert!(
        r.stderr.contains("error trying to reach service: dial tcp") && r.stderr.contains(":8081"),
        "{}",
        r.stderr
    );
    let r = raw(&format!("{pods}/ftp:web:21/proxy/"));
    assert!(r.stderr.contains("invalid pod request"), "{}", r.stderr);
    let r = raw(&format!("{pods}/nope:8080/proxy/"));
    assert!(r.stderr.contains("pods \"nope\" not found"), "{}", r.stderr);

    // services/proxy: to a ready endpoint, the port by name or by number.
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
    let manifest = c.scratch().join("svc.json");
    std::fs::create_dir_all(c.scratch()).unwrap();
    std::fs::write(&manifest, svc.to_string()).unwrap();
    kubectl_ok(&k, &["apply", "-f", manifest.to_str().unwrap()]);
    let services = "/api/v1/namespaces/default/services";
    wait_until("services/proxy through a ready endpoint", T, || {
        let r = raw(&format!("{services}/web:http/proxy/env/GREETING"));
        if r.stdout == "hello through the proxy\n" {
            Ok(())
        } else {
            Err(r.stderr)
        }
    });
    let r = raw(&format!("{services}/web:80/proxy/healthz"));
    assert_eq!(r.stdout, "ok\n", "{}", r.stderr);
    let r = raw(&format!("{services}/web:81/proxy/"));
    assert!(
        r.stderr
            .contains("no service port 81 found for service \"web\""),
        "{}",
        r.stderr
    );

    // An `https:` backend: a pod serving TLS with a certificate from a CA the cluster does
    // not know (as Kubernetes, the proxy does not verify it), through pods/proxy and
    // services/proxy.
    let ca = skiff_tests::tls::TestCa::new("a pod's own CA");
    let issued = ca.issue(&["tls.default.svc"]);
    let tls = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"},
         "stringData": {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tls", "labels": {"app": "tls"}},
         "spec": {"nodeName": c.node_name(),
            "containers": [{"name": "tls", "image": ECHO_IMAGE,
                "args": ["webhook", "--cert", "/tls/tls.crt", "--key", "/tls/tls.key",
                         "--sidecar-image", ECHO_IMAGE, "--port", "8443"],
                "ports": [{"name": "https", "containerPort": 8443}],
                "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}]}],
            "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tls"},
         "spec": {"selector": {"app": "tls"},
                  "ports": [{"name": "https", "port": 443, "targetPort": "https"}]}}]});
    let manifest = c.scratch().join("tls.json");
    std::fs::write(&manifest, tls.to_string()).unwrap();
    kubectl_ok(&k, &["apply", "-f", manifest.to_str().unwrap()]);
    c.wait_pod("tls", "tls Running", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await;
    wait_until("pods/proxy to an https backend", T, || {
        let r = raw(&format!("{pods}/https:tls:8443/proxy/healthz"));
        if r.stdout == "ok\n" {
            Ok(())
        } else {
            Err(r.stderr)
        }
    });
    // The scheme matters: plain HTTP to the TLS port gets no HTTP answer.
    let r = raw(&format!("{pods}/http:tls:8443/proxy/healthz"));
    assert!(!r.success, "{r:?}");
    wait_until("services/proxy to an https backend", T, || {
        let r = raw(&format!("{services}/https:tls:https/proxy/healthz"));
        if r.stdout == "ok\n" {
            Ok(())
        } else {
            Err(r.stderr)
        }
    });

    // nodes/proxy: the node agent's own API.
    let r = raw(&format!("/api/v1/nodes/{}/proxy/healthz", c.node_name()));
    assert_eq!(r.stdout, "ok", "{}", r.stderr);
    let r = raw(&format!("/api/v1/nodes/{}/proxy/metrics", c.node_name()));
    assert!(r.success && r.stdout.contains("# TYPE"), "{}", r.stderr);

    // kubectl proxy, then GETs through it as a browser sends them.
    let proxy = tokio::task::block_in_place(|| KubectlProxy::start(&k));
    let (status, body) = tokio::task::block_in_place(|| {
        proxy.get("/api/v1/namespaces/default/pods/web:8080/proxy/env/GREETING")
    });
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body, "hello through the proxy\n");
    let (status, body) = tokio::task::block_in_place(|| {
        proxy.get("/api/v1/namespaces/default/services/web:http/proxy/")
    });
    assert!(status.contains(" 200 "), "{status}");
    assert!(body.starts_with("pod=web namespace="), "{body}");
    let (status, _) = tokio::task::block_in_place(|| {
        proxy.get("/api/v1/namespaces/default/services/web:http/proxy")
    });
    assert!(status.contains(" 301 "), "{status}");
}

/// The state of ephemeral container `name` in a pod's status.
fn ephemeral_state(p: &k8s_openapi::api::core::v1::Pod, name: &str) -> Option<String> {
    let s = p
        .status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)?
        .state
        .clone()?;
    Some(if s.running.is_some() {
        "running".into()
    } else if let Some(t) = s.terminated {
        format!("terminated:{}", t.exit_code)
    } else {
        "waiting".into()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_debug_adds_ephemeral_containers() {
    let c = Cluster::start("debug").await;
    c.assign_pod_cidr().await;
    c.create_pod(
        "web",
        json!({"containers": [{"name": "echo", "image": ECHO_IMAGE}]}),
    )
    .await;
    c.wait_pod("web", "web Running and Ready", running_ready)
        .await;
    let k = Kubectl::new(&c.kubeconfig(), &c.scratch());

    // An ephemeral container targeting the app container sees its processes: its PID 1 is
    // the echo server, not the debugger's own command.
    kubectl_ok(
        &k,
        &[
            "debug",
            "web",
            "--image",
            ECHO_IMAGE,
            "--target=echo",
            "--container=dbg",
            "--",
            "/echo",
            "cat",
            "/proc/1/cmdline",
        ],
    );
    let p = c
        .wait_pod("web", "dbg ran to completion", |p| {
            ephemeral_state(p, "dbg").as_deref() == Some("terminated:0")
        })
        .await;
    assert!(running_ready(&p), "the pod keeps running: {:?}", p.status);
    let pid1 = kubectl_ok(&k, &["logs", "web", "-c", "dbg"]);
    assert!(
        pid1.starts_with("/echo") && !pid1.contains("cat"),
        "PID 1 seen from the debugger is the target's: {pid1:?}"
    );

    // Interactive: kubectl waits for the container to run, then attaches to it; what it
    // sends reaches the debugger's stdin (its `cat -` writes it to the container's log;
    // kubectl debug leaves stdin open, so the debugger keeps running), and exec reaches it.
    let attached = tokio::task::block_in_place(|| {
        k.run_with_stdin(
            &[
                "debug",
                "-i",
                "web",
                "--image",
                ECHO_IMAGE,
                "--container=dbg2",
                "--",
                "/echo",
                "cat",
                "-",
            ],
            "typed into the debugger\n",
        )
    });
    assert!(attached.success, "{attached:?}");
    wait_until("the typed line in dbg2's log", T, || {
        let log = kubectl(&k, &["logs", "web", "-c", "dbg2"]).stdout;
        if log.contains("typed into the debugger") {
            Ok(())
        } else {
            Err(log)
        }
    });
    let p = c
        .wait_pod("web", "dbg2 running", |p| {
            ephemeral_state(p, "dbg2").as_deref() == Some("running")
        })
        .await;
    assert_eq!(
        p.status
            .unwrap()
            .ephemeral_container_statuses
            .unwrap()
            .len(),
        2
    );
    let own = kubectl_ok(
        &k,
        &[
            "exec",
            "web",
            "-c",
            "dbg2",
            "--",
            "/echo",
            "cat",
            "/proc/1/cmdline",
        ],
    );
    assert!(
        own.contains("cat"),
        "dbg2 has its own PID namespace: {own:?}"
    );

    // A copy of the pod with a shared process namespace: the debugger sees the sandbox's
    // pause process as PID 1.
    kubectl_ok(
        &k,
        &[
            "debug",
            "web",
            "--copy-to=web-copy",
            "--same-node",
            "--share-processes",
            "--image",
            ECHO_IMAGE,
            "--container=dbg",
            "--",
            "/echo",
            "cat",
            "/proc/1/cmdline",
        ],
    );
    c.wait_pod("web-copy", "the copy's debugger ran", |p| {
        p.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .any(|s| s.name == "dbg" && s.state.as_ref().is_some_and(|st| st.terminated.is_some()))
    })
    .await;
    // The runtime may write the last (unterminated) output after reporting the exit.
    wait_until("the copy's debugger saw pause as PID 1", T, || {
        let log = kubectl(&k, &["logs", "web-copy", "-c", "dbg"]).stdout;
        if log.contains("pause") {
            Ok(())
        } else {
            Err(log)
        }
    });

    // A node debugging pod: the node's root at /host, its PID namespace.
    let node = c.node_name();
    let out = kubectl_ok(
        &k,
        &[
            "debug",
            &format!("node/{node}"),
            "--image",
            ECHO_IMAGE,
            "--",
            "/echo",
            "cat",
            "/host/etc/hostname",
            "/proc/1/cmdline",
        ],
    );
    let pod = out
        .split_whitespace()
        .find(|w| w.starts_with("node-debugger-"))
        .unwrap_or_else(|| panic!("the debugging pod's name in {out:?}"))
        .to_string();
    let p = c
        .wait_pod(&pod, "the node debugger ran", |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
        })
        .await;
    let spec = p.spec.unwrap();
    assert_eq!(spec.host_pid, Some(true));
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.host_ipc, Some(true));
    assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap();
    let init = std::fs::read("/proc/1/cmdline").unwrap();
    let seen = wait_until("the node debugger's output", T, || {
        let log = kubectl(&k, &["logs", &pod]).stdout;
        if log.len() >= hostname.len() + init.len() {
            Ok(log)
        } else {
            Err(log)
        }
    });
    assert!(seen.starts_with(&hostname), "{seen:?}");
    assert!(
        seen.ends_with(&*String::from_utf8_lossy(&init)),
        "the host's PID 1: {seen:?}"
    );
}
