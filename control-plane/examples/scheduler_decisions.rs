//! The scheduler's decision rate without an API server: N nodes in the cache, M pods
//! scheduled one after another (each assumed on its node, as the real loop does), timed per
//! decision. `cargo xtask bench scheduler` runs it (release) next to the end-to-end runs.
//!
//! `scheduler_decisions NODES PODS` prints one JSON line: decisions/s, p50/p99 per decision,
//! and the filter and score shares.

use std::sync::Arc;
use std::time::{Duration, Instant};

use control_plane::scheduler::algorithm::Algorithm;
use control_plane::scheduler::cache::Cache;
use control_plane::scheduler::pod_info::PodInfo;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

/// The bench's node: 32 cpu, 128 GiB, 110 pods, spread over 3 zones.
pub fn node(i: usize) -> Node {
    let name = format!("node-{i:05}");
    let res = json!({"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "status": {"capacity": res, "allocatable": res},
    }))
    .expect("a valid node")
}

/// The bench's pod: one container requesting 100m cpu and 128 MiB.
pub fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
        "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "image": "registry.local/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }))
    .expect("a valid pod")
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("NODES PODS"))
        .collect();
    let (nodes, pods) = match args[..] {
        [n, p] => (n, p),
        _ => panic!("usage: scheduler_decisions NODES PODS"),
    };
    let mut cache = Cache::new();
    for i in 0..nodes {
        cache.upsert_node(Arc::new(node(i)));
    }
    let infos: Vec<Arc<PodInfo>> = (0..pods)
        .map(|i| Arc::new(PodInfo::new(Arc::new(pod(i)))))
        .collect();
    let mut alg = Algorithm::new(None);
    let mut took = Vec::with_capacity(pods);
    let (mut filter, mut score) = (Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    for p in infos {
        let t = Instant::now();
        let d = alg.schedule(&mut cache, &p).expect("every pod fits");
        cache.assume(p, &d.node);
        took.push(t.elapsed());
        let phases = alg.last_phase_times();
        filter += phases.filter;
        score += phases.score;
    }
    let total = start.elapsed();
    took.sort();
    let pct = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    println!(
        "{}",
        json!({
            "nodes": nodes, "pods": pods,
            "decisions_per_s": pods as f64 / total.as_secs_f64(),
            "p50_us": pct(0.5), "p99_us": pct(0.99),
            "filter_us_per_pod": filter.as_secs_f64() * 1e6 / pods as f64,
            "score_us_per_pod": score.as_secs_f64() * 1e6 / pods as f64,
        })
    );
}
