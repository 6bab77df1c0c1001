//! The scheduler against the real API server (in-process), through kube-rs and the real
//! kubectl: pods spread over nodes, FailedScheduling with Kubernetes' reasons (and, as
//! kube-scheduler's, what preemption found: every pod here has priority 0) and the pod
//! scheduled once a big enough node appears, taints and tolerations, nodeSelector, required
//! anti-affinity with a retry when a blocking pod goes, and leader election between two
//! schedulers. No node agent runs: the tests register Node objects themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use control_plane::apiserver::{Config as ApiConfig, RunningServer, Server};
use control_plane::runtime::LeaderElectionConfig;
use control_plane::scheduler::metrics::AttemptResult;
use control_plane::scheduler::{self, Config, Metrics};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    server: RunningServer,
    /// The admin's.
    client: Client,
    /// The scheduler's own (system:kube-scheduler).
    scheduler_client: Client,
    dir: tempfile::TempDir,
}

/// A running scheduler; stops when dropped.
struct Running {
    token: CancellationToken,
    task: Option<JoinHandle<Result<(), scheduler::SchedulerError>>>,
    metrics: Metrics,
}

impl Running {
    async fn stop(mut self) {
        self.token.cancel();
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl Fixture {
    async fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let config = ApiConfig::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
        let server = Server::start(config).await.unwrap();
        let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
            .await
            .unwrap();
        let scheduler_client = control_plane::runtime::client::from_kubeconfig(
            &server.component_kubeconfig(control_plane::apiserver::SCHEDULER_KUBECONFIG),
        )
        .await
        .unwrap();
        Fixture {
            server,
            client,
            scheduler_client,
            dir,
        }
    }

    fn scheduler(&self, config: Config) -> Running {
        let token = CancellationToken::new();
        let metrics = config.metrics.clone();
        let task = tokio::spawn(scheduler::run(
            self.scheduler_client.clone(),
            config,
            token.clone(),
        ));
        Running {
            token,
            task: Some(task),
            metrics,
        }
    }

    fn kubectl(&self) -> Kubectl {
        Kubectl::new(self.server.kubeconfig_path(), self.dir.path())
    }

    async fn node(&self, name: &str, cpu: &str, labels: Value, taints: Value) {
        let mut labels = labels;
        if labels.is_null() {
            labels = json!({});
        }
        labels["kubernetes.io/hostname"] = json!(name);
        let resources = json!({"cpu": cpu, "memory": "8Gi", "pods": "110"});
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    async fn pod(&self, name: &str, spec: Value) {
        self.pod_labelled(name, json!({"app": "web"}), spec).await
    }

    async fn pod_labelled(&self, name: &str, labels: Value, spec: Value) {
        let mut spec = spec;
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "registry.local/web:v1"}]);
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Waits until the pod is bound and returns its node.
    async fn bound(&self, name: &str) -> String {
        let pods = self.pods();
        wait_until_async(&format!("{name} bound"), WAIT, || async {
            let p = pods.get(name).await.map_err(|e| e.to_string())?;
            p.spec
                .and_then(|s| s.node_name)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| "pending".to_string())
        })
        .await
    }

    async fn node_of(&self, name: &str) -> Option<String> {
        self.pods()
            .get(name)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .filter(|n| !n.is_empty())
    }

    /// Waits for an event about `pod` with `reason` and returns its message.
    async fn event(&self, pod: &str, reason: &str) -> Event {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        wait_until_async(&format!("{reason} event for {pod}"), WAIT, || async {
            let list = events.list(&lp).await.map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .ok_or_else(|| "no such event yet".to_string())
        })
        .await
    }

    async fn delete_now(&self, name: &str) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        self.pods().delete(name, &dp).await.unwrap();
        let pods = self.pods();
        wait_until_async(&format!("{name} gone"), WAIT, || async {
            match pods.get_opt(name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

fn fast_config() -> Config {
    let mut c = Config::default();
    c.queue.initial_backoff = Duration::from_millis(100);
    c.queue.max_backoff = Duration::from_millis(500);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_spread_over_three_nodes_and_say_where_they_went() {
    let f = Fixture::start().await;
    for n in ["node-1", "node-2", "node-3"] {
        f.node(n, "4", Value::Null, Value::Null).await;
    }
    let running = f.scheduler(fast_config());
    for i in 0..3 {
        let requests = json!({"cpu": "500m", "memory": "256Mi"});
        f.pod(
            &format!("web-{i}"),
            json!({"containers": [{"name": "c", "image": "web:v1", "resources": {"requests": requests}}]}),
        )
        .await;
    }
    let mut nodes = BTreeSet::new();
    for i in 0..3 {
        nodes.insert(f.bound(&format!("web-{i}")).await);
    }
    assert_eq!(nodes.len(), 3, "one pod per node: {nodes:?}");

    let node = f.node_of("web-1").await.unwrap();
    let scheduled = f.event("web-1", "Scheduled").await;
    assert_eq!(
        scheduled.message.as_deref(),
        Some(format!("Successfully assigned default/web-1 to {node}").as_str())
    );
    assert_eq!(scheduled.type_.as_deref(), Some("Normal"));
    assert_eq!(
        scheduled.source.and_then(|s| s.component).as_deref(),
        Some("default-scheduler")
    );
    let pod = f.pods().get("web-1").await.unwrap();
    let condition = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .expect("PodScheduled condition");
    assert_eq!(condition.status, "True");

    // What a user sees.
    let out = f
        .kubectl()
        .run(&["get", "events", "--sort-by=.metadata.creationTimestamp"]);
    assert!(out.success, "{}", out.stderr);
    assert!(out.stdout.contains("Scheduled"), "{}", out.stdout);
    assert!(out
        .stdout
        .contains(&format!("Successfully assigned default/web-1 to {node}")));
    let out = f.kubectl().run(&["get", "pods", "-o", "wide"]);
    assert!(out.stdout.contains(&node), "{}", out.stdout);

    wait_until_async("attempts counted", WAIT, || async {
        let n = running.metrics.attempts(AttemptResult::Scheduled);
        if n == 3 {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;
    assert!(running
        .metrics
        .render()
        .contains("scheduler_pod_scheduling_sli_duration_seconds_count 3"));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_pods_fail_with_the_reason_then_fit_on_a_bigger_node() {
    let f = Fixture::start().await;
    f.node("small-1", "2", Value::Null, Value::Null).await;
    f.node("small-2", "2", Value::Null, Value::Null).await;
    let running = f.scheduler(fast_config());
    f.pod(
        "big",
        json!({"containers": [{"name": "c", "image": "web:v1", "resources": {"requests": {"cpu": "3"}}}]}),
    )
    .await;

    let failed = f.event("big", "FailedScheduling").await;
    assert_eq!(
        failed.message.as_deref(),
        Some("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    );
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    let pods = f.pods();
    let condition = wait_until_async("PodScheduled=False", WAIT, || async {
        let p = pods.get("big").await.map_err(|e| e.to_string())?;
        p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .ok_or_else(|| "no condition yet".to_string())
    })
    .await;
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(
        condition.message.as_deref(),
        Some("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    );
    let out = f.kubectl().run(&["describe", "pod", "big"]);
    assert!(out.success, "{}", out.stderr);
    assert!(out.stdout.contains("FailedScheduling"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."),
        "{}",
        out.stdout
    );
    assert!(f.node_of("big").await.is_none());

    // A node that is still too small changes nothing; a big one takes the pod.
    f.node("small-3", "2", Value::Null, Value::Null).await;
    f.node("large", "8", Value::Null, Value::Null).await;
    assert_eq!(f.bound("big").await, "large");
    assert!(running
        .metrics
        .render()
        .contains("scheduler_queue_incoming_pods_total{event=\"NodeAdd\"} 1"));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_tolerations_and_node_selectors_are_honoured() {
    let f = Fixture::start().await;
    f.node(
        "gpu",
        "8",
        json!({"accelerator": "gpu"}),
        json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
    )
    .await;
    f.node("ssd", "4", json!({"disk": "ssd"}), Value::Null)
        .await;
    f.node("plain", "4", Value::Null, Value::Null).await;
    let running = f.scheduler(fast_config());

    for i in 0..6 {
        f.pod(&format!("any-{i}"), json!({})).await;
    }
    f.pod(
        "trainer",
        json!({"nodeSelector": {"accelerator": "gpu"},
               "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}),
    )
    .await;
    f.pod("db", json!({"nodeSelector": {"disk": "ssd"}})).await;
    f.pod("nowhere", json!({"nodeSelector": {"disk": "nvme"}}))
        .await;

    for i in 0..6 {
        assert_ne!(
            f.bound(&format!("any-{i}")).await,
            "gpu",
            "the taint keeps plain pods off"
        );
    }
    assert_eq!(f.bound("trainer").await, "gpu");
    assert_eq!(f.bound("db").await, "ssd");
    let failed = f.event("nowhere", "FailedScheduling").await;
    assert_eq!(
        failed.message.as_deref(),
        Some("0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    );
    running.stop().await;
}

fn anti_affinity() -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affinity_keeps_replicas_apart_until_one_goes() {
    let f = Fixture::start().await;
    for n in ["n1", "n2", "n3"] {
        f.node(n, "4", Value::Null, Value::Null).await;
    }
    let running = f.scheduler(fast_config());
    for i in 0..4 {
        f.pod(&format!("web-{i}"), anti_affinity()).await;
    }
    let failed = f.event("web-3", "FailedScheduling").await;
    assert_eq!(
        failed.message.as_deref(),
        Some("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.")
    );
    let mut placed = BTreeMap::new();
    for i in 0..3 {
        placed.insert(f.bound(&format!("web-{i}")).await, i);
    }
    assert_eq!(placed.len(), 3, "{placed:?}");
    // A pod without terms of its own is kept off by the existing pods' anti-affinity.
    f.pod_labelled("plain-web", json!({"app": "web"}), json!({}))
        .await;
    let failed = f.event("plain-web", "FailedScheduling").await;
    assert_eq!(
        failed.message.as_deref(),
        Some(
            "0/3 nodes are available: 3 node(s) didn't satisfy existing pods anti-affinity rules. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
        )
    );
    f.pod_labelled("db", json!({"app": "db"}), json!({})).await;
    f.bound("db").await;

    // Deleting a replica frees its node for the waiting one.
    let freed = f.node_of("web-0").await.unwrap();
    f.delete_now("web-0").await;
    let first = wait_until_async("a waiting web pod bound", WAIT, || async {
        for name in ["web-3", "plain-web"] {
            if let Some(n) = f.node_of(name).await {
                return Ok((name, n));
            }
        }
        Err("both still pending")
    })
    .await;
    assert_eq!(first.1, freed);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_schedules_and_a_standby_takes_over() {
    let f = Fixture::start().await;
    f.node("n1", "4", Value::Null, Value::Null).await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(f.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kube-system"}})).unwrap(),
        )
        .await;
    let election = |id: &str| {
        let mut le = LeaderElectionConfig::new("kube-scheduler");
        le.identity = id.to_string();
        le.lease_duration = Duration::from_secs(3);
        le.renew_deadline = Duration::from_secs(2);
        le.retry_period = Duration::from_millis(500);
        Config {
            leader_election: Some(le),
            ..fast_config()
        }
    };
    let a = f.scheduler(election("scheduler-a"));
    let leases: Api<Lease> = Api::namespaced(f.client.clone(), "kube-system");
    let holder = || async {
        leases
            .get_opt("kube-scheduler")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
            .ok_or("no holder")
    };
    assert_eq!(
        wait_until_async("a leads", WAIT, holder).await,
        "scheduler-a"
    );
    let b = f.scheduler(election("scheduler-b"));
    f.pod("p1", json!({})).await;
    f.bound("p1").await;
    // Counted once the binding call has returned, which may be after a reader sees it.
    wait_until_async("a counted its decision", WAIT, || async {
        let n = a.metrics.attempts(AttemptResult::Scheduled);
        (n == 1).then_some(()).ok_or(n)
    })
    .await;
    assert_eq!(
        b.metrics.attempts(AttemptResult::Scheduled),
        0,
        "the standby never acts"
    );

    // The leader stops (and releases the lease): the standby takes over.
    a.stop().await;
    assert_eq!(
        wait_until_async("b leads", WAIT, holder).await,
        "scheduler-b"
    );
    f.pod("p2", json!({})).await;
    f.bound("p2").await;
    wait_until_async("b counted its decision", WAIT, || async {
        let n = b.metrics.attempts(AttemptResult::Scheduled);
        (n == 1).then_some(()).ok_or(n)
    })
    .await;
    b.stop().await;
}
