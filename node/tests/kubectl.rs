//! The real kubectl (1.33) against an in-process API server and a real node agent with its
//! own containerd: `kubectl exec` (output, stdin, exit codes; kubectl's WebSocket attempt is
//! refused and it falls back to SPDY) and `kubectl logs` (-f, --tail, --previous), through
//! the API server's pods/exec and pods/log relays to the agent's kubelet API; and the
//! agent's repeated Events as one Event with a count, as `kubectl describe` shows them.

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
