//! `control-plane scheduler --kubeconfig PATH` as a process against the in-process API
//! server: it binds pods, serves /healthz and /metrics, stops cleanly on SIGTERM, and after a
//! restart rebuilds its cache from the watch so a new pod still sees the old ones.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use control_plane::apiserver::{Config as ApiConfig, Server};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_tests::{wait_until, wait_until_async};

const WAIT: Duration = Duration::from_secs(30);

/// The scheduler process; killed if still running when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use skiff_tests::etcd::free_port;

fn start(kubeconfig: &std::path::Path, port: u16) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .args(["scheduler", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--bind-address", &format!("127.0.0.1:{port}")])
        .args(["--leader-elect=false"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting control-plane scheduler");
    Proc(child)
}

fn get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad response: {out}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

fn sigterm(p: &Proc) {
    let status = Command::new("kill")
        .args(["-TERM", &p.0.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_process_binds_serves_metrics_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(ApiConfig::new(
        dir.path().join("data"),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["a", "b"] {
        let res = json!({"cpu": "1", "memory": "1Gi", "pods": "110"});
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": res, "allocatable": res},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "image": "web:v1", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap()
    };
    let bound = |name: &'static str| {
        let pods = pods.clone();
        async move {
            wait_until_async(&format!("{name} bound"), WAIT, || async {
                pods.get(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .spec
                    .and_then(|s| s.node_name)
                    .ok_or_else(|| "pending".to_string())
            })
            .await
        }
    };

    // The scheduler as itself (system:kube-scheduler), not the admin.
    let identity = server.component_kubeconfig(control_plane::apiserver::SCHEDULER_KUBECONFIG);
    let port = free_port();
    let mut p = start(&identity, port);
    pods.create(&PostParams::default(), &pod("first"))
        .await
        .unwrap();
    let first = bound("first").await;
    let (code, body) = wait_until("healthz", WAIT, || get(port, "/healthz"));
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, metrics) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("scheduler_schedule_attempts_total{result=\"scheduled\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("scheduler_pending_pods{queue=\"active\"}"),
        "{metrics}"
    );

    sigterm(&p);
    let status = wait_until("the scheduler to exit", WAIT, || match p.0.try_wait() {
        Ok(Some(s)) => Ok(s),
        other => Err(format!("{other:?}")),
    });
    assert!(status.success(), "{status:?}");

    // A new process learns from the watch that `first` holds its node's only cpu.
    let port = free_port();
    p = start(&identity, port);
    pods.create(&PostParams::default(), &pod("second"))
        .await
        .unwrap();
    let second = bound("second").await;
    assert_ne!(first, second);
    drop(p);
}
