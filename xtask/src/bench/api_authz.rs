//! `cargo xtask bench api`'s authorization figures: the cost of one RBAC decision with 10,000
//! RoleBindings present, next to the same decision with only the bindings it needs, measured
//! in the same run.
//!
//! - In-process: the release `authz_decision` example times `Policy::allows` over the real
//!   index with Kubernetes' bootstrap roles (allowed and refused requests; p50/p99 in us).
//! - End to end: SelfSubjectAccessReviews over HTTP for an impersonated user (the request's
//!   own authorization and the review's decision), before and after 10,000 RoleBindings are
//!   created through the API in the running server.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::{json, Value};
use skiff_launcher::apiserver::ApiServerProcess;

use crate::setup::{root, run};

/// RoleBindings created for the loaded case.
pub const BINDINGS: usize = 10_000;
const NAMESPACES: usize = 100;
const REVIEWS: usize = 2000;

/// One row of the authorization table.
pub struct Row {
    pub path: String,
    pub outcome: String,
    pub bindings: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    /// p99 over the same path's baseline p99 (same run).
    pub vs_baseline: f64,
}

/// Both measurements; `server` is the bench's API server, `c` its admin client.
pub async fn measure(c: &Client, server: &ApiServerProcess) -> Result<Vec<Row>> {
    let mut rows = in_process()?;
    rows.extend(end_to_end(c, server).await?);
    Ok(rows)
}

fn in_process() -> Result<Vec<Row>> {
    eprintln!("bench api: authorization decisions in-process ({BINDINGS} RoleBindings)");
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--release",
        "-p",
        "control-plane",
        "--example",
        "authz_decision",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let out = Command::new(target.join("release/examples/authz_decision"))
        .args([
            "--bindings",
            &BINDINGS.to_string(),
            "--namespaces",
            &NAMESPACES.to_string(),
        ])
        .output()
        .context("running authz_decision")?;
    anyhow::ensure!(
        out.status.success(),
        "authz_decision failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout)?;
    let cases = doc["decisions"].as_array().context("decisions")?;
    let p99 = |case: &str, outcome: &str| {
        cases
            .iter()
            .find(|c| c["case"] == case && c["outcome"] == outcome)
            .and_then(|c| c["p99_us"].as_f64())
            .unwrap_or(f64::NAN)
    };
    Ok(cases
        .iter()
        .map(|c| {
            let outcome = c["outcome"].as_str().unwrap_or("").to_string();
            let p = c["p99_us"].as_f64().unwrap_or(f64::NAN);
            Row {
                path: "decision, in-process".into(),
                bindings: c["bindings"].as_u64().unwrap_or(0) as usize,
                p50_us: c["p50_us"].as_f64().unwrap_or(f64::NAN),
                p99_us: p,
                vs_baseline: p / p99("baseline", &outcome),
                outcome,
            }
        })
        .collect())
}

async fn impersonating(server: &ApiServerProcess, user: &str) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(server.kubeconfig())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    config.auth_info.impersonate = Some(user.to_string());
    Ok(Client::try_from(config)?)
}

/// The role every binding grants. Not `view`: that one is aggregated, its rules filled in by
/// the controller manager, which this bench (an API server alone) does not run.
const READER: &str = "bench-pod-reader";

fn reader() -> Result<ClusterRole> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": READER},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }))?)
}

fn binding(ns: &str, name: &str, user: &str) -> Result<RoleBinding> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }))?)
}

/// Waits until the "measured" binding has reached the authorizer (its RBAC index follows
/// the store by a watch: a review right after the create may still see the old rules).
async fn effective(c: &Client) -> Result<()> {
    let api: Api<SelfSubjectAccessReview> = Api::all(c.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some("authz-0".into()),
                verb: Some("list".into()),
                resource: Some("pods".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = api.create(&PostParams::default(), &review).await?;
        if r.status.is_some_and(|s| s.allowed) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the RoleBinding of user \"measured\" did not take effect within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `REVIEWS` reviews, one at a time; latencies sorted.
async fn reviews(c: &Client, verb: &str, want: bool) -> Result<Vec<Duration>> {
    let api: Api<SelfSubjectAccessReview> = Api::all(c.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some("authz-0".into()),
                verb: Some(verb.into()),
                resource: Some("pods".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut lat = Vec::with_capacity(REVIEWS);
    for _ in 0..REVIEWS {
        let t0 = Instant::now();
        let r = api.create(&PostParams::default(), &review).await?;
        lat.push(t0.elapsed());
        anyhow::ensure!(
            r.status.map(|s| s.allowed) == Some(want),
            "review of {verb} pods"
        );
    }
    lat.sort();
    Ok(lat)
}

async fn end_to_end(c: &Client, server: &ApiServerProcess) -> Result<Vec<Row>> {
    for i in 0..NAMESPACES {
        super::api::namespace(c, &format!("authz-{i}")).await?;
    }
    Api::<ClusterRole>::all(c.clone())
        .create(&PostParams::default(), &reader()?)
        .await?;
    Api::<RoleBinding>::namespaced(c.clone(), "authz-0")
        .create(
            &PostParams::default(),
            &binding("authz-0", "measured", "measured")?,
        )
        .await?;
    let measured = impersonating(server, "measured").await?;
    effective(&measured).await?;
    let mut base = vec![];
    for (verb, want) in [("list", true), ("delete", false)] {
        base.push(reviews(&measured, verb, want).await?);
    }
    eprintln!("bench api: creating {BINDINGS} RoleBindings");
    let c2 = c.clone();
    super::api::drive("bindings", 64, BINDINGS, move |t, i| {
        let c = c2.clone();
        async move {
            let n = t * BINDINGS + i;
            let ns = format!("authz-{}", n % NAMESPACES);
            Api::<RoleBinding>::namespaced(c, &ns)
                .create(
                    &PostParams::default(),
                    &binding(&ns, &format!("b-{n}"), &format!("user-{n}"))?,
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    eprintln!("bench api: SelfSubjectAccessReviews with {BINDINGS} RoleBindings present");
    let mut rows = vec![];
    for ((verb, want), baseline) in [("list", true), ("delete", false)].into_iter().zip(base) {
        let loaded = reviews(&measured, verb, want).await?;
        let pct =
            |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
        let outcome = if want { "allowed" } else { "refused" };
        for (bindings, v) in [(1, &baseline), (BINDINGS + 1, &loaded)] {
            rows.push(Row {
                path: "SelfSubjectAccessReview over HTTP".into(),
                outcome: outcome.into(),
                bindings,
                p50_us: pct(v, 0.5),
                p99_us: pct(v, 0.99),
                vs_baseline: pct(v, 0.99) / pct(&baseline, 0.99),
            });
        }
    }
    Ok(rows)
}

/// The markdown table and the JSON rows.
pub fn report(rows: &[Row]) -> (String, Vec<Value>) {
    let mut md = String::from(
        "\n| authorization | outcome | RoleBindings | p50 us | p99 us | p99 vs same run without |\n|---|---|---|---|---|---|\n",
    );
    let mut json_rows = vec![];
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2}x |\n",
            r.path, r.outcome, r.bindings, r.p50_us, r.p99_us, r.vs_baseline
        ));
        json_rows.push(
            json!({"path": r.path, "outcome": r.outcome, "role_bindings": r.bindings,
            "p50_us": r.p50_us, "p99_us": r.p99_us, "p99_vs_baseline": r.vs_baseline}),
        );
    }
    (md, json_rows)
}
