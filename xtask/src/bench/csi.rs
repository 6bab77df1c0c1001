//! `cargo xtask bench csi`: what a persistent volume of skiff's CSI driver adds to a pod's
//! start. On a fresh 2-node cluster with the release binaries and deploy/csi.yaml, for 1, 10
//! and 50 at once: N claims of the default class (WaitForFirstConsumer) and N busybox pods,
//! one per claim, are created in one request; each pod is timed from that request to the
//! first watch event showing it Running, which covers the scheduler choosing a node, the
//! node's provisioner creating the volume (sparse file, CreateVolume) and its PV, the
//! binder binding it, the pod bound, and the node agent staging (loop device, mkfs.ext4,
//! mount) and publishing it. The baseline in the same run is the same pods with an emptyDir
//! instead, so the difference is the volume's cost. Claims and pods are deleted between
//! rounds (their volumes with them: reclaim Delete).
//! Writes bench-results/csi.{json,md} and csi-startup.svg (copied to docs/bench/).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;
use skiff_launcher::cluster::Cluster;
use skiff_launcher::registry::BUSYBOX_IMAGE;

use super::plot::{self, Chart, Series};
use super::BenchCluster;
use crate::setup::root;

#[derive(clap::Args)]
pub struct Opts {
    /// Pods (each with its claim) created at once.
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    pods: Vec<usize>,
    /// Size of each claim.
    #[arg(long, default_value = "64Mi")]
    size: String,
}

/// One round: pods with a claim each, or with an emptyDir.
struct Round {
    pods: usize,
    csi: bool,
    running: Vec<f64>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

impl Round {
    fn p(&self, q: f64) -> f64 {
        let mut v = self.running.clone();
        v.sort_by(f64::total_cmp);
        percentile(&v, q)
    }
}

/// The objects of a round: N pods and, for CSI, N claims, as one `v1 List`.
fn objects(tag: &str, n: usize, csi: bool, size: &str) -> serde_json::Value {
    let mut items = Vec::new();
    for i in 0..n {
        let name = format!("{tag}-{i}");
        let volume = if csi {
            items.push(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "labels": {"bench": tag}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": size}}}
            }));
            json!({"name": "v", "persistentVolumeClaim": {"claimName": name}})
        } else {
            json!({"name": "v", "emptyDir": {}})
        };
        items.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"bench": tag}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": BUSYBOX_IMAGE,
                                "command": ["sleep", "3600"],
                                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                "volumes": [volume]
            }
        }));
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

async fn one(c: &Cluster, client: &kube::Client, n: usize, csi: bool, size: &str) -> Result<Round> {
    let tag = format!("{}-{n}", if csi { "csi" } else { "empty" });
    eprintln!(
        "bench csi: {n} pods with {}",
        if csi { "a claim each" } else { "an emptyDir" }
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cfg = watcher::Config::default().labels(&format!("bench={tag}"));
    let mut events = watcher::watcher(pods, cfg).boxed();
    // The watch is established (its initial list is done) before anything is created.
    while let Some(e) = events.next().await {
        if matches!(e?, watcher::Event::InitDone) {
            break;
        }
    }
    let k = c.kubectl().within(Duration::from_secs(120));
    let t0 = Instant::now();
    let r = k.run_with_stdin(
        &["apply", "-f", "-"],
        &objects(&tag, n, csi, size).to_string(),
    );
    if !r.success {
        bail!("kubectl apply: {}", r.stderr);
    }
    let mut running: HashMap<String, f64> = HashMap::new();
    let deadline = t0 + Duration::from_secs(120 + 4 * n as u64);
    while running.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(e)) = tokio::time::timeout(left, events.next()).await else {
            bail!("{} of {n} pods Running before the deadline", running.len());
        };
        if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = e? {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Running") {
                let name = p.metadata.name.unwrap_or_default();
                running
                    .entry(name)
                    .or_insert_with(|| t0.elapsed().as_secs_f64());
            }
        }
    }
    drop(events);
    // Pods first (their volumes unpublished), then the claims (reclaim Delete removes the
    // volumes), waited for so the next round starts on empty nodes.
    let sel = format!("bench={tag}");
    k.within(Duration::from_secs(600))
        .ok(&["delete", "pods", "-l", &sel, "--wait=true"]);
    if csi {
        k.within(Duration::from_secs(600))
            .ok(&["delete", "pvc", "-l", &sel, "--wait=true"]);
        skiff_launcher::wait_until(
            "the round's volumes deleted",
            Duration::from_secs(300),
            || {
                let out = k.ok(&["get", "pv", "-o", "name"]);
                if out.trim().is_empty() {
                    Ok(())
                } else {
                    Err(out)
                }
            },
        );
    }
    Ok(Round {
        pods: n,
        csi,
        running: running.into_values().collect(),
    })
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let binaries = super::release_binaries()?;
    let c = BenchCluster::up_with("bcsi", &binaries, |spec, lease| {
        spec.own_pod_network(lease.octet());
        spec.csi = true;
    })?;
    let rounds = super::api::runtime()?.block_on(async {
        let client = super::client(&c.kubeconfig()).await?;
        let mut rounds = Vec::new();
        for &n in &opts.pods {
            // The baseline first, then the same pods with volumes.
            rounds.push(one(&c, &client, n, false, &opts.size).await?);
            rounds.push(one(&c, &client, n, true, &opts.size).await?);
        }
        anyhow::Ok(rounds)
    })?;
    drop(c);
    let mut md = String::from(
        "N busybox pods created at once on 2 nodes, each timed from the create request to the watch event showing it Running; with a claim each of skiff's CSI driver (default class skiff-local, WaitForFirstConsumer: scheduling, provisioning, binding, loop device + mkfs.ext4 + mount) next to an emptyDir each, measured in the same run.\n\n| pods | emptyDir p50 s | emptyDir p99 s | CSI p50 s | CSI p99 s | added at p50 s | added at p99 s | CSI / emptyDir p99 |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut rows = Vec::new();
    for pair in rounds.chunks(2) {
        let [base, csi] = pair else { continue };
        md.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x |\n",
            base.pods,
            base.p(50.0),
            base.p(99.0),
            csi.p(50.0),
            csi.p(99.0),
            csi.p(50.0) - base.p(50.0),
            csi.p(99.0) - base.p(99.0),
            csi.p(99.0) / base.p(99.0)
        ));
        for r in [base, csi] {
            rows.push(
                json!({"pods": r.pods, "volume": if r.csi { "csi" } else { "emptyDir" },
                "running_p50_s": r.p(50.0), "running_p99_s": r.p(99.0), "running_s": r.running}),
            );
        }
    }
    println!("\n{md}");
    let series = |csi: bool, name: &str, color: &'static str| Series {
        name: name.into(),
        color,
        points: rounds
            .iter()
            .filter(|r| r.csi == csi)
            .map(|r| (r.pods as f64, r.p(99.0)))
            .collect(),
    };
    let svg = plot::svg(
        &Chart {
            title: "Pod created to Running, p99: a CSI volume each vs an emptyDir each",
            x_label: "pods at once",
            y_label: "seconds",
            log_x: true,
            log_y: false,
        },
        &[
            series(false, "emptyDir", "#1f77b4"),
            series(true, "CSI claim", "#d62728"),
        ],
    );
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    for dir in [&out, &docs] {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("csi.json"),
            serde_json::to_string_pretty(&json!({ "rounds": rows }))?,
        )?;
        std::fs::write(dir.join("csi.md"), &md)?;
        std::fs::write(dir.join("csi-startup.svg"), &svg)?;
    }
    eprintln!(
        "bench csi: wrote bench-results/csi.{{json,md}}, csi-startup.svg (copied to docs/bench/)"
    );
    Ok(())
}
