//! The runtime plumbing against a real containerd: supervision, CRI calls, image pulls from
//! the local registry, CNI addresses from the node's pod CIDR.

mod common;

use common::{http_get, TestRuntime};
use k8s_cri::v1 as cri;
use skiff_tests::registry::ECHO_IMAGE;
use std::time::Duration;

async fn run_echo(rt: &TestRuntime, name: &str) -> (String, String) {
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: rt.node.pod_cgroup(&format!("uid-{name}")),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = rt.cri.run_pod_sandbox(sandbox.clone()).await.unwrap();
    rt.cri.pull_image(ECHO_IMAGE, None).await.unwrap();
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "echo".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: ECHO_IMAGE.into(),
            ..Default::default()
        }),
        envs: vec![cri::KeyValue {
            key: "POD_NAME".into(),
            value: name.into(),
        }],
        ..Default::default()
    };
    let cid = rt
        .cri
        .create_container(&id, container, sandbox)
        .await
        .unwrap();
    rt.cri.start_container(&cid).await.unwrap();
    let status = rt.cri.pod_sandbox_status(&id).await.unwrap();
    let ip = status.network.unwrap().ip;
    (id, ip)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_gets_an_ip_from_the_pod_cidr_and_answers_http() {
    let rt = TestRuntime::start("http").await;
    let (_, ip) = run_echo(&rt, "web").await;
    let cidr: node::cni::Cidr = rt.subnet.cidr().parse().unwrap();
    assert!(cidr.contains(ip.parse().unwrap()), "{ip} not in {cidr}");
    let body = skiff_tests::wait_until_async("echo answers", Duration::from_secs(10), || {
        let ip = ip.clone();
        async move { http_get(&format!("{ip}:8080"), "/").await }
    })
    .await;
    assert!(body.contains("pod=web"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn containerd_is_restarted_when_it_dies_and_pods_survive() {
    let rt = TestRuntime::start("restart").await;
    let (id, ip) = run_echo(&rt, "survivor").await;
    let containerd = rt.containerd.as_ref().unwrap();
    let old = containerd.pid();
    unsafe { libc::kill(old as i32, libc::SIGKILL) };
    skiff_tests::wait_until("containerd restarted", Duration::from_secs(20), || {
        if containerd.restarts() >= 1 && containerd.pid() != old {
            Ok(())
        } else {
            Err(containerd.pid())
        }
    });
    let cri = rt.cri.clone();
    let sandboxes =
        skiff_tests::wait_until_async("CRI answers again", Duration::from_secs(20), || {
            let cri = cri.clone();
            async move {
                cri.list_pod_sandboxes(Default::default())
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await;
    assert!(
        sandboxes.iter().any(|s| s.id == id),
        "the sandbox survived the restart"
    );
    let body = http_get(&format!("{ip}:8080"), "/").await.unwrap();
    assert!(body.contains("pod=survivor"), "{body}");
}
