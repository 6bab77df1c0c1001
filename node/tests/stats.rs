//! Resource metrics on the node agent's API, from a real containerd's pods: /stats/summary
//! and /metrics/resource over TLS with a client certificate, CPU that grows while a pod
//! burns it, and 403 for an identity without nodes/stats.

mod common;

use common::cluster::{running_ready, Cluster, T};
use control_plane::resource_metrics::summary::{PodStats, Summary};
use serde_json::json;
use skiff_tests::registry::ECHO_IMAGE;
use skiff_tests::wait_until_async;
use std::time::Duration;

/// The body of an HTTP/1.1 answer (head, blank line, body; not chunked).
fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

fn pod<'a>(s: &'a Summary, name: &str) -> Option<&'a PodStats> {
    s.pods.iter().find(|p| p.pod_ref.name == name)
}

fn nano_cores(p: &PodStats) -> Option<u64> {
    p.cpu.as_ref()?.usage_nano_cores
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_and_resource_metrics_follow_a_cpu_burner() {
    let c = Cluster::start_with("stats", |config| {
        config.stats_interval = Duration::from_secs(1)
    })
    .await;
    c.assign_pod_cidr().await;
    // The burner fetches from its own server in a loop (both containers busy); the idle pod
    // sleeps.
    c.create_pod(
        "burn",
        json!({"containers": [
            {"name": "web", "image": ECHO_IMAGE},
            {"name": "burner", "image": ECHO_IMAGE,
             "command": ["/echo", "fetch", "http://127.0.0.1:8080/", "--count", "1000000000"]}
        ]}),
    )
    .await;
    c.create_pod(
        "idle",
        json!({"containers": [{"name": "sleep", "image": ECHO_IMAGE,
                               "command": ["/echo", "sleep", "0"]}]}),
    )
    .await;
    c.wait_pod("burn", "burn Running", running_ready).await;
    c.wait_pod("idle", "idle Running", running_ready).await;

    // The node's sample shows both pods, the burner's CPU rate above the idle pod's and its
    // cumulative CPU growing.
    let first = wait_until_async("both pods sampled with rates", T, || async {
        let answer = c.kubelet_get("/stats/summary").await;
        let s: Summary =
            serde_json::from_str(body(&answer)).map_err(|e| format!("{e}: {answer}"))?;
        let (Some(b), Some(i)) = (pod(&s, "burn"), pod(&s, "idle")) else {
            return Err(format!("pods missing: {answer}"));
        };
        // The agent learns its containers' ids from the pod's status as the watch brings
        // it back: wait for both.
        let containers = b.containers.iter().filter(|c| c.cpu.is_some()).count();
        match (nano_cores(b), nano_cores(i)) {
            (Some(b), Some(i)) if b > i && b > 10_000_000 && containers == 2 => Ok(s),
            rates => Err(format!(
                "rates (burn, idle) {rates:?}, {containers} containers"
            )),
        }
    })
    .await;
    assert_eq!(first.node.node_name, c.node_name());
    let node_cpu = first.node.cpu.clone().expect("the node's CPU");
    assert!(node_cpu.usage_core_nano_seconds.unwrap() > 0);
    let node_memory = first.node.memory.clone().expect("the node's memory");
    assert!(node_memory.working_set_bytes.unwrap() > 0);
    let burn = pod(&first, "burn").unwrap();
    let mut names: Vec<_> = burn.containers.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["burner", "web"]);
    let burner = burn.containers.iter().find(|c| c.name == "burner").unwrap();
    let before = burner
        .cpu
        .as_ref()
        .unwrap()
        .usage_core_nano_seconds
        .unwrap();
    assert!(burner.memory.as_ref().unwrap().working_set_bytes.unwrap() > 0);
    assert!(burner.start_time.is_some());

    wait_until_async("the burner's CPU time grows", T, || async {
        let answer = c.kubelet_get("/stats/summary").await;
        let s: Summary = serde_json::from_str(body(&answer)).map_err(|e| e.to_string())?;
        let now = pod(&s, "burn")
            .and_then(|p| p.containers.iter().find(|c| c.name == "burner"))
            .and_then(|c| c.cpu.as_ref()?.usage_core_nano_seconds)
            .ok_or("no burner CPU")?;
        // A tenth of a core-second more than before.
        if now > before + 100_000_000 {
            Ok(())
        } else {
            Err(format!("{before} -> {now}"))
        }
    })
    .await;

    let text = c.kubelet_get("/metrics/resource").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for needle in [
        "# TYPE node_cpu_usage_seconds_total counter",
        "\nnode_cpu_usage_seconds_total ",
        "\nnode_memory_working_set_bytes ",
        "\npod_cpu_usage_seconds_total{namespace=\"default\",pod=\"burn\"} ",
        "\npod_memory_working_set_bytes{namespace=\"default\",pod=\"idle\"} ",
        "\ncontainer_cpu_usage_seconds_total{container=\"burner\",namespace=\"default\",pod=\"burn\"} ",
        "\ncontainer_memory_working_set_bytes{container=\"sleep\",namespace=\"default\",pod=\"idle\"} ",
        "\ncontainer_start_time_seconds{container=\"web\",namespace=\"default\",pod=\"burn\"} ",
        "\nresource_scrape_error 0",
    ] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }

    // An authenticated identity without nodes/stats or nodes/metrics is refused.
    for (path, subresource) in [
        ("/stats/summary", "stats"),
        ("/metrics/resource", "metrics"),
    ] {
        let denied = c.kubelet_get_as(path, "nobody", None).await;
        assert!(denied.starts_with("HTTP/1.1 403"), "{path}: {denied}");
        assert!(
            denied.contains(&format!(
                "Forbidden (user=nobody, verb=get, resource=nodes, subresource={subresource})"
            )),
            "{denied}"
        );
    }
}
