//! The whole agent against a real API server (in-process) and a real containerd: node
//! registration and Lease, pods bound to the node run and report status and Events through
//! the API, the kubelet API serves logs and exec, a restarted agent adopts running pods and
//! removes sandboxes no pod wants, and a deleted pod stops and disappears.

mod common;

use common::cluster::{running_ready, Cluster, T};
use common::{http_get, http_get_owned};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, ListParams};
use node::agent::LEASE_NAMESPACE;
use serde_json::json;
use skiff_tests::registry::ECHO_IMAGE;
use skiff_tests::wait_until_async;

fn node_ready(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_run_report_and_survive_an_agent_restart() {
    let mut c = Cluster::start("life").await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes.get(&c.node_name()).await.unwrap();
    assert_eq!(
        node_ready(&node).as_deref(),
        Some("False"),
        "no podCIDR yet: NotReady"
    );
    let info = node.status.as_ref().unwrap().node_info.clone().unwrap();
    let endpoint = node
        .status
        .as_ref()
        .unwrap()
        .daemon_endpoints
        .clone()
        .unwrap()
        .kubelet_endpoint
        .unwrap();
    assert_eq!(
        endpoint.port,
        i32::from(c.agent().addr().port()),
        "the kubelet API port is published"
    );
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{info:?}"
    );
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), LEASE_NAMESPACE);
    let lease = wait_until_async("a lease", T, || {
        let (leases, name) = (leases.clone(), c.node_name());
        async move { leases.get_opt(&name).await.ok().flatten().ok_or(()) }
    })
    .await;
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(c.node_name().as_str())
    );

    c.assign_pod_cidr().await;
    wait_until_async("node Ready", T, || {
        let (nodes, name) = (nodes.clone(), c.node_name());
        async move {
            let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
            if node_ready(&n).as_deref() == Some("True") {
                Ok(())
            } else {
                Err(format!("{:?}", node_ready(&n)))
            }
        }
    })
    .await;

    c.create_pod("web", json!({"containers": [{"name": "echo", "image": ECHO_IMAGE,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]})).await;
    let pod = c
        .wait_pod("web", "web Running and Ready", running_ready)
        .await;
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    // Ready (no readiness probe) means started, not yet listening: wait for the first answer.
    let body = wait_until_async("web answers", T, || http_get_owned(format!("{ip}:8080"))).await;
    assert!(body.starts_with("pod=web "), "{body}");

    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let reasons = wait_until_async("events", T, || {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| vec![e.to_string()])?;
            let mut items: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("web"))
                .collect();
            items.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
            let r: Vec<String> = items.iter().filter_map(|e| e.reason.clone()).collect();
            if r.len() >= 4 {
                Ok(r)
            } else {
                Err(r)
            }
        }
    })
    .await;
    for reason in ["Pulling", "Pulled", "Created", "Started"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }

    // The kubelet API over HTTPS: logs, exec, metrics.
    let ok = |r: &str| r.starts_with("HTTP/1.1 200");
    let logs = c
        .kubelet_get("/containerLogs/default/web/echo?tailLines=5")
        .await;
    assert!(
        ok(&logs) && logs.contains("echo: serving on :8080"),
        "{logs}"
    );
    let metrics = c.kubelet_get("/metrics").await;
    assert!(
        ok(&metrics) && metrics.contains("skiff_node_pods"),
        "{metrics}"
    );
    assert!(
        metrics.contains("skiff_node_api_requests_total{outcome=\"allowed\"}"),
        "{metrics}"
    );
    let exec = c
        .kubelet_get("/exec/default/web/echo?command=%2Fecho&command=env&stdout=true")
        .await;
    assert!(exec.starts_with("HTTP/1.1 302"), "{exec}");
    assert!(
        exec.to_lowercase().contains("location: http://127.0.0.1:"),
        "{exec}"
    );

    // A sandbox nobody wants (left by some earlier pod) and an agent restart.
    let cri = c.agent().cri();
    let stray = k8s_cri::v1::PodSandboxConfig {
        metadata: Some(k8s_cri::v1::PodSandboxMetadata {
            name: "stray".into(),
            uid: "stray-uid".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: [("io.kubernetes.pod.uid".to_string(), "stray-uid".to_string())].into(),
        linux: Some(k8s_cri::v1::LinuxPodSandboxConfig {
            cgroup_parent: c.config.name.pod_cgroup("stray-uid"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let stray_id = cri.run_pod_sandbox(stray).await.unwrap();
    let before = pod.status.clone().unwrap();
    let ready_since = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .and_then(|c| c.last_transition_time.clone())
    };
    let ready_at = ready_since(&nodes.get(&c.node_name()).await.unwrap()).unwrap();
    // Let the clock pass the transition's second, so a rewritten time would differ.
    skiff_tests::wait_until("a second after Ready", T, || {
        (k8s_openapi::jiff::Timestamp::now().as_second() > ready_at.0.as_second())
            .then_some(())
            .ok_or(())
    });
    c.restart_agent().await;
    let cri = c.agent().cri();
    wait_until_async("the stray sandbox removed", T, || {
        let (cri, id) = (cri.clone(), stray_id.clone());
        async move {
            let all = cri
                .list_pod_sandboxes(Default::default())
                .await
                .map_err(|e| e.to_string())?;
            if all.iter().any(|s| s.id == id) {
                Err(format!("{} sandboxes", all.len()))
            } else {
                Ok(())
            }
        }
    })
    .await;
    let after = c
        .wait_pod("web", "web still Running", running_ready)
        .await
        .status
        .unwrap();
    let cid = |s: &k8s_openapi::api::core::v1::PodStatus| {
        s.container_statuses.as_ref().unwrap()[0]
            .container_id
            .clone()
    };
    assert_eq!(cid(&after), cid(&before), "the same container, adopted");
    assert_eq!(
        ready_since(&nodes.get(&c.node_name()).await.unwrap()),
        Some(ready_at),
        "the restarted agent keeps the Ready condition's transition time"
    );
    assert_eq!(
        after.container_statuses.as_ref().unwrap()[0].restart_count,
        0
    );
    // The echo line ends with the client's address (its port differs per connection).
    let identity = |b: &str| b.split(" client=").next().unwrap_or_default().to_string();
    assert_eq!(
        identity(&http_get(&format!("{ip}:8080"), "/").await.unwrap()),
        identity(&body),
        "served throughout"
    );

    // Graceful deletion: the agent stops the pod, then removes its object.
    let deleting = c
        .pods()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        deleting.is_left(),
        "a bound pod is deleted gracefully: the agent finishes it"
    );
    wait_until_async("web gone", T, || {
        let api = c.pods();
        async move {
            if api
                .get_opt("web")
                .await
                .map_err(|e| e.to_string())?
                .is_none()
            {
                Ok(())
            } else {
                Err("still there".to_string())
            }
        }
    })
    .await;
    wait_until_async("web's sandbox removed", T, || {
        let cri = cri.clone();
        async move {
            let left = cri
                .list_pod_sandboxes(Default::default())
                .await
                .map_err(|e| e.to_string())?;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        }
    })
    .await;
}

/// The raw response head and body, without following redirects.
#[tokio::test(flavor = "multi_thread")]
async fn pressure_conditions_follow_the_eviction_thresholds() {
    // Thresholds this machine cannot meet (more memory and pids free than exist) raise
    // MemoryPressure and PIDPressure; one it always meets (less than a byte of disk left)
    // keeps DiskPressure False, whatever the disk holds.
    let c = Cluster::start_with("pressure", |config| {
        config.eviction_hard = "memory.available<1000Ti,pid.available<100%,nodefs.available<1"
            .parse()
            .unwrap();
    })
    .await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let conditions = wait_until_async("the node's conditions", T, || {
        let nodes = nodes.clone();
        let name = c.node_name();
        async move {
            let node = nodes.get(&name).await.map_err(|e| e.to_string())?;
            let conditions: std::collections::BTreeMap<String, (String, String)> = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.type_, (c.status, c.reason.unwrap_or_default())))
                .collect();
            if conditions.len() == 5 {
                Ok(conditions)
            } else {
                Err(format!("{conditions:?}"))
            }
        }
    })
    .await;
    let of = |t: &str| conditions[t].clone();
    assert_eq!(
        of("MemoryPressure"),
        ("True".into(), "KubeletHasInsufficientMemory".into())
    );
    assert_eq!(
        of("PIDPressure"),
        ("True".into(), "KubeletHasInsufficientPID".into())
    );
    assert_eq!(
        of("DiskPressure"),
        ("False".into(), "KubeletHasNoDiskPressure".into())
    );
}
