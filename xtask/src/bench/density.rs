//! `cargo xtask bench density`: the density scenario (`skiff_tests::density`) on a fresh
//! 2-node cluster per size, with the release binaries: a Deployment created and Ready,
//! rolled with `kubectl rollout restart` under a client looping through its ClusterIP, then
//! scaled down. Reports pods Ready per second for the create and the rollout, the control
//! plane's CPU per 100 pods, and requests failed (must be 0). The baseline in the same run is
//! the smallest size: the ratio columns show how the path holds up as a deployment grows
//! (the nodes hold 110 pods each, so at 200 the rollout's surge waits for room).
//! Writes bench-results/density.{json,md} and density-rate.svg (copied to docs/bench/).

use super::plot::{self, Chart, Series};
use super::BenchCluster;
use crate::setup::root;
use anyhow::{bail, Result};
use serde_json::json;
use skiff_launcher::cluster::Binaries;
use skiff_tests::density::{self, Params, Report};

#[derive(clap::Args)]
pub struct Opts {
    /// Deployment sizes, one fresh cluster each; the first is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "20,200")]
    replicas: Vec<usize>,
}

fn one(binaries: &Binaries, replicas: usize) -> Result<Report> {
    let c = BenchCluster::up("bdens", binaries)?;
    eprintln!(
        "bench density: {replicas} pods on cluster {}",
        c.state().name
    );
    let p = Params {
        replicas,
        scale_to: (replicas / 20).max(1),
        ..Params::default()
    };
    density::run(&c, &p).map_err(anyhow::Error::msg)
}

pub fn run_bench(opts: Opts) -> Result<()> {
    let binaries = super::release_binaries()?;
    let mut reports = Vec::new();
    for &n in &opts.replicas {
        let r = one(&binaries, n)?;
        eprintln!("{r}");
        reports.push(r);
    }
    let Some(base) = reports.first().cloned() else {
        bail!("no sizes given");
    };
    let rollout_rate = |r: &Report| r.replicas as f64 / r.rollout.as_secs_f64();
    let mut md = String::from(
        "| pods | create -> all Ready s | pods Ready/s | vs baseline | rollout restart s | pods replaced/s | vs baseline | scale down s | control-plane CPU s / 100 pods (create, rollout) | requests through the ClusterIP | failed |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &reports {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}, {:.2} | {} | {} |\n",
            r.replicas,
            r.create.as_secs_f64(),
            r.ready_per_second(),
            r.ready_per_second() / base.ready_per_second(),
            r.rollout.as_secs_f64(),
            rollout_rate(r),
            rollout_rate(r) / rollout_rate(&base),
            r.scale_down.as_secs_f64(),
            r.create_cpu_per_100(),
            r.rollout_cpu_per_100(),
            r.requests_ok,
            r.failures.lines().count(),
        ));
    }
    println!("\n{md}");
    let out = root().join("bench-results");
    let docs = root().join("docs/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&docs)?;
    let rows: Vec<_> = reports
        .iter()
        .map(|r| {
            json!({
                "pods": r.replicas,
                "create_s": r.create.as_secs_f64(),
                "ready_per_s": r.ready_per_second(),
                "rollout_s": r.rollout.as_secs_f64(),
                "rollout_pods_per_s": rollout_rate(r),
                "scale_down_s": r.scale_down.as_secs_f64(),
                "create_cpu_s_per_100_pods": r.create_cpu_per_100(),
                "rollout_cpu_s_per_100_pods": r.rollout_cpu_per_100(),
                "requests_ok": r.requests_ok,
                "requests_failed": r.failures.lines().count(),
                "client": r.client_summary,
            })
        })
        .collect();
    let series = |name: &str, color: &'static str, f: &dyn Fn(&Report) -> f64| Series {
        name: name.into(),
        color,
        points: reports.iter().map(|r| (r.replicas as f64, f(r))).collect(),
    };
    let svg = plot::svg(
        &Chart {
            title: "Density on 2 nodes (110 pods each): pods per second",
            x_label: "pods in the deployment",
            y_label: "pods/s",
            log_x: true,
            log_y: false,
        },
        &[
            series("created -> Ready", "#1f77b4", &|r| r.ready_per_second()),
            series("replaced by rollout restart", "#d62728", &rollout_rate),
        ],
    );
    for dir in [&out, &docs] {
        std::fs::write(
            dir.join("density.json"),
            serde_json::to_string_pretty(&json!({ "rounds": rows }))?,
        )?;
        std::fs::write(dir.join("density.md"), &md)?;
        std::fs::write(dir.join("density-rate.svg"), &svg)?;
    }
    eprintln!("bench density: wrote bench-results/density.{{json,md}}, density-rate.svg (copied to docs/bench/)");
    Ok(())
}
