//! `cargo xtask bench jobs`: the Job controller on a fresh 2-node cluster with the release
//! binaries. For each size a batch/v1 Job of that many completions (trivial pods: busybox
//! `true`, restartPolicy Never) at a fixed parallelism is created with kubectl, and the time
//! from its creation to its Complete condition is measured, with pods completed per second
//! and the control plane's CPU per 100 pods. The baseline in the same run is the smallest
//! size: the ratio column shows whether the controller's rate holds as a Job grows (the
//! node agents run the pods; the nodes hold 110 pods each).
//! Writes bench-results/jobs.{json,md} and jobs-rate.svg (copied to docs/bench/).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use skiff_launcher::cluster::Cluster;
use skiff_launcher::registry::BUSYBOX_IMAGE;
use skiff_tests::e2e;

use super::plot::{self, Chart, Series};
use super::BenchCluster;
use crate::setup::root;

#[derive(clap::Args)]
pub struct Opts {
    /// Completions per Job, measured one after the other; the first is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    completions: Vec<usize>,
    /// Pods of a Job running at once.
    #[arg(long, default_value_t = 50)]
    parallelism: usize,
}

/// One Job's figures.
struct Round {
    completions: usize,
    took: Duration,
    cpu_s: f64,
    succeeded: u64,
    failed: u64,
}

impl Round {
    fn rate(&self) -> f64 {
        self.completions as f64 / self.took.as_secs_f64().max(1e-9)
    }
    fn cpu_per_100(&self) -> f64 {
        self.cpu_s * 100.0 / self.completions.max(1) as f64
    }
}

fn job(name: &str, completions: usize, parallelism: usize) -> serde_json::Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism.min(completions),
            "backoffLimit": 10,
            "template": {"spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "true", "image": BUSYBOX_IMAGE, "command": ["true"]}]
            }}
        }
    })
}

fn one(c: &Cluster, completions: usize, parallelism: usize) -> Result<Round> {
    let k = c.kubectl();
    let cp = c
        .state()
        .control_plane
        .context("the cluster has no control-plane process")?;
    let name = format!("bench-{completions}");
    eprintln!("bench jobs: a Job of {completions} completions, parallelism {parallelism}");
    let (t, cpu) = (Instant::now(), e2e::cpu_seconds(cp));
    let r = k.run_with_stdin(
        &["apply", "-f", "-"],
        &job(&name, completions, parallelism).to_string(),
    );
    if !r.success {
        bail!("kubectl apply: {}", r.stderr);
    }
    // Time for the run at a pessimistic 2 pods/s, plus start-up.
    let limit = Duration::from_secs(120 + completions as u64 / 2);
    let w = k.within(limit + Duration::from_secs(10)).run(&[
        "wait",
        "--for=condition=complete",
        &format!("job/{name}"),
        &format!("--timeout={}s", limit.as_secs()),
    ]);
    let (took, cpu_s) = (t.elapsed(), e2e::cpu_seconds(cp) - cpu);
    if !w.success {
        bail!("the Job did not complete: {}{}", w.stdout, w.stderr);
    }
    let count = |field: &str| -> u64 {
        k.ok(&[
            "get",
            "job",
            &name,
            "-o",
            &format!("jsonpath={{.status.{field}}}"),
        ])
        .trim()
        .parse()
        .unwrap_or(0)
    };
    let round = Round {
        completions,
        took,
        cpu_s,
        succeeded: count("succeeded"),
        failed: count("failed"),
    };
    if round.succeeded != completions as u64 {
        bail!(
            "the Job reports {} succeeded of {completions}",
            round.succeeded
        );
    }
    // Its pods go with it, so the next Job starts on empty nodes.
    k.within(Duration::from_secs(600)).ok(&[
        "delete",
        "job",
        &name,
        "--cascade=foreground",
        "--wait=true",
    ]);
    Ok(round)
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let binaries = super::release_binaries()?;
    let rounds = {
        let c = BenchCluster::up("bjobs", &binaries)?;
        opts.completions
            .iter()
            .map(|&n| one(&c, n, opts.parallelism))
            .collect::<Result<Vec<_>>>()?
    };
    let Some(base) = rounds.first() else {
        bail!("no sizes given");
    };
    let mut md = format!(
        "A Job of trivial pods (busybox `true`, restartPolicy Never) at parallelism {}, created with kubectl, timed to its Complete condition on 2 nodes; the smallest Job is the baseline.\n\n| completions | create -> Complete s | pods completed/s | vs baseline | control-plane CPU s / 100 pods | succeeded | failed |\n|---:|---:|---:|---:|---:|---:|---:|\n",
        opts.parallelism
    );
    for r in &rounds {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2}x | {:.2} | {} | {} |\n",
            r.completions,
            r.took.as_secs_f64(),
            r.rate(),
            r.rate() / base.rate(),
            r.cpu_per_100(),
            r.succeeded,
            r.failed
        ));
    }
    println!("\n{md}");
    let rows: Vec<_> = rounds
        .iter()
        .map(|r| {
            json!({"completions": r.completions, "parallelism": opts.parallelism,
                "create_to_complete_s": r.took.as_secs_f64(), "pods_per_s": r.rate(),
                "control_plane_cpu_s_per_100_pods": r.cpu_per_100(),
                "succeeded": r.succeeded, "failed": r.failed})
        })
        .collect();
    let svg = plot::svg(
        &Chart {
            title: "Job of trivial pods on 2 nodes: pods completed per second",
            x_label: "completions",
            y_label: "pods/s",
            log_x: true,
            log_y: false,
        },
        &[Series {
            name: "completed/s".into(),
            color: "#1f77b4",
            points: rounds
                .iter()
                .map(|r| (r.completions as f64, r.rate()))
                .collect(),
        }],
    );
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    for dir in [&out, &docs] {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("jobs.json"),
            serde_json::to_string_pretty(&json!({ "rounds": rows }))?,
        )?;
        std::fs::write(dir.join("jobs.md"), &md)?;
        std::fs::write(dir.join("jobs-rate.svg"), &svg)?;
    }
    eprintln!(
        "bench jobs: wrote bench-results/jobs.{{json,md}}, jobs-rate.svg (copied to docs/bench/)"
    );
    Ok(())
}
