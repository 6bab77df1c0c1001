//! The density scenario, at the size users reach: a Deployment of hundreds of pods on a
//! cluster whose nodes hold 110 pods each (so a rollout's surge pods wait for room, as in a
//! full cluster), behind a Service; created, rolled with `kubectl rollout restart` while a
//! node-level client loops through the ClusterIP, then scaled down. Every step must
//! complete and no request fail. Shared by the end-to-end test (which asserts on the
//! [`Report`]) and `cargo xtask bench density` (which prints and plots it).

use crate::cluster::Cluster;
use crate::e2e::{self, LoopingClient};
use crate::registry::ECHO_IMAGE;
use crate::wait::try_wait_until;
use std::time::{Duration, Instant};

/// The scenario's sizes.
#[derive(Clone, Debug)]
pub struct Params {
    pub name: String,
    pub replicas: usize,
    /// What the Deployment is scaled down to at the end.
    pub scale_to: usize,
    /// The deadline of each step.
    pub step_timeout: Duration,
    /// The node whose node-level client loops through the ClusterIP.
    pub client_node: usize,
    /// The pods' preStop pause (see [`deployment`]); their grace period is 20 s longer.
    pub pre_stop_secs: u64,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            name: "dens".into(),
            replicas: 200,
            scale_to: 10,
            step_timeout: Duration::from_secs(600),
            client_node: 1,
            pre_stop_secs: 10,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Report {
    pub replicas: usize,
    /// From `kubectl apply` of the Deployment to every pod Ready.
    pub create: Duration,
    /// From `kubectl rollout restart` to `kubectl rollout status` done and every new pod
    /// Ready.
    pub rollout: Duration,
    /// From `kubectl scale` to exactly `scale_to` pods left.
    pub scale_down: Duration,
    /// The control plane's CPU seconds (API server, controllers, scheduler: one process)
    /// during the create and the rollout.
    pub create_cpu: f64,
    pub rollout_cpu: f64,
    /// Requests the looping client made through the ClusterIP during the rollout and the
    /// scale-down, and the failures it saw (one JSON line each).
    pub requests_ok: u64,
    pub failures: String,
    /// The client's own summary: also how many requests took a second or more, and the
    /// slowest that succeeded.
    pub client_summary: String,
    /// The client node's proxy: network programming latency (an endpoint change's trigger
    /// time, 1 s resolution, to its maps) p50 and p99 over the whole run, in seconds.
    pub programming_p50: Option<f64>,
    pub programming_p99: Option<f64>,
}

impl Report {
    pub fn ready_per_second(&self) -> f64 {
        self.replicas as f64 / self.create.as_secs_f64()
    }

    /// Control-plane CPU seconds per 100 pods created.
    pub fn create_cpu_per_100(&self) -> f64 {
        self.create_cpu * 100.0 / self.replicas as f64
    }

    /// Control-plane CPU seconds per 100 pods replaced by the rollout.
    pub fn rollout_cpu_per_100(&self) -> f64 {
        self.rollout_cpu * 100.0 / self.replicas as f64
    }
}

/// The Deployment: the echo server with a readiness probe (a new pod takes traffic only once
/// it serves) and a preStop pause (a terminating pod leaves the endpoints first and keeps
/// serving the connections it has), as a rollout without dropped requests needs. The pause
/// must outlast the endpoint change's way to every proxy (Kubernetes' advice for any
/// Service): on a 2-core machine running 250 containers, the control plane's writes take
/// seconds while dozens of containers start (see the report's programming latency), so the
/// pause is 10 s, well within the usual 30 s grace period.
fn deployment(p: &Params) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": p.name},
        "spec": {
            "replicas": p.replicas,
            "selector": {"matchLabels": {"app": p.name}},
            "template": {
                "metadata": {"labels": {"app": p.name}},
                "spec": {
                    "terminationGracePeriodSeconds": p.pre_stop_secs + 20,
                    "containers": [{
                        "name": "echo", "image": ECHO_IMAGE,
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
                        "lifecycle": {"preStop": {"exec": {"command": ["/echo", "sleep", p.pre_stop_secs.to_string()]}}}
                    }]
                }
            }
        }
    })
}

/// Runs the scenario on `c`; Err names the step that did not complete in time.
pub fn run(c: &Cluster, p: &Params) -> Result<Report, String> {
    let k = c.kubectl();
    let cp = c
        .state()
        .control_plane
        .ok_or("the cluster has no control-plane process")?;
    let selector = format!("app={}", p.name);

    let (t, cpu) = (Instant::now(), e2e::cpu_seconds(cp));
    let r = k.run_with_stdin(&["apply", "-f", "-"], &deployment(p).to_string());
    if !r.success {
        return Err(format!("kubectl apply: {}", r.stderr));
    }
    e2e::try_wait_ready(&k, &selector, p.replicas, p.step_timeout)?;
    let (create, create_cpu) = (t.elapsed(), e2e::cpu_seconds(cp) - cpu);

    k.ok(&[
        "expose",
        "deployment",
        &p.name,
        "--port=80",
        "--target-port=8080",
    ]);
    let vip = k.ok(&[
        "get",
        "service",
        &p.name,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let addr = format!("{vip}:80");
    try_wait_until(
        "the client's node answers through the ClusterIP",
        p.step_timeout,
        || match e2e::probe(c, p.client_node, &addr, 1) {
            (n, 0) if n.len() == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )?;
    let client = LoopingClient::start(c, p.client_node, &addr);

    let (t, cpu) = (Instant::now(), e2e::cpu_seconds(cp));
    let before = e2e::names(&e2e::pods(&k, &selector));
    k.ok(&["rollout", "restart", &format!("deployment/{}", p.name)]);
    let status = k.within(p.step_timeout + Duration::from_secs(10)).run(&[
        "rollout",
        "status",
        &format!("deployment/{}", p.name),
        &format!("--timeout={}s", p.step_timeout.as_secs()),
    ]);
    if !status.success {
        return Err(format!(
            "kubectl rollout status: {}{}",
            status.stdout, status.stderr
        ));
    }
    let after = e2e::try_wait_ready(&k, &selector, p.replicas, p.step_timeout)?;
    let (rollout, rollout_cpu) = (t.elapsed(), e2e::cpu_seconds(cp) - cpu);
    if !before.is_disjoint(&e2e::names(&after)) {
        return Err("the rollout left pods of the old template".into());
    }

    let t = Instant::now();
    k.ok(&[
        "scale",
        "deployment",
        &p.name,
        &format!("--replicas={}", p.scale_to),
    ]);
    try_wait_until(
        &format!("exactly {} pods left", p.scale_to),
        p.step_timeout,
        || match e2e::pods(&k, &selector) {
            all if all.len() == p.scale_to && all.iter().all(|x| x.ready) => Ok(()),
            all => Err(format!("{} pods", all.len())),
        },
    )?;
    let scale_down = t.elapsed();
    let seen = client.finish();
    let metrics = c.proxy_get(p.client_node, "/metrics").unwrap_or_default();
    let programming = |q| {
        e2e::histogram_quantile(
            &metrics,
            "skiff_proxy_network_programming_duration_seconds",
            q,
        )
    };

    Ok(Report {
        replicas: p.replicas,
        create,
        rollout,
        scale_down,
        create_cpu,
        rollout_cpu,
        requests_ok: seen.ok,
        failures: seen.failures,
        client_summary: seen.summary,
        programming_p50: programming(0.5),
        programming_p99: programming(0.99),
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "| step | seconds | pods/s | control-plane CPU s per 100 pods |"
        )?;
        writeln!(f, "|---|---:|---:|---:|")?;
        writeln!(
            f,
            "| create {} pods -> all Ready | {:.1} | {:.1} | {:.2} |",
            self.replicas,
            self.create.as_secs_f64(),
            self.ready_per_second(),
            self.create_cpu_per_100()
        )?;
        writeln!(
            f,
            "| rollout restart of {} pods | {:.1} | {:.1} | {:.2} |",
            self.replicas,
            self.rollout.as_secs_f64(),
            self.replicas as f64 / self.rollout.as_secs_f64(),
            self.rollout_cpu_per_100()
        )?;
        writeln!(
            f,
            "| scale down | {:.1} | - | - |",
            self.scale_down.as_secs_f64()
        )?;
        writeln!(
            f,
            "network programming latency at the client's node: p50 <= {:?} s, p99 <= {:?} s",
            self.programming_p50, self.programming_p99
        )?;
        write!(
            f,
            "looping client through the ClusterIP ({} s request timeout): {}",
            e2e::LOOP_TIMEOUT.as_secs(),
            self.client_summary
        )
    }
}
