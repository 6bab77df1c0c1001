//! Priority and preemption against the real API server, the real scheduler, the controllers
//! (the disruption controller keeps the budgets' status) and played nodes (see
//! controllers_support: they report pods Running and Ready and finish graceful deletions as a
//! node agent does), with the real kubectl:
//!
//! - a high-priority pod on a full cluster is nominated (kubectl's NOMINATED NODE), one
//!   low-priority victim gets the DisruptionTarget condition and is deleted with its own grace
//!   period, and the pod binds to the nominated node only after the victim is gone (a
//!   finalizer of the test's holds the victim until then); a pod with preemptionPolicy Never
//!   and a pod of equal priority preempt nothing, and keep off the room the nominee holds;
//! - a PodDisruptionBudget steers preemption to the node whose victim it does not protect;
//! - the eviction API marks the pod DisruptionTarget (EvictionByEvictionAPI) before the
//!   graceful delete.
//!
//! What happened when is read from one watch of the namespace's pods, so the order of the
//! writes is asserted without sleeping.

mod controllers_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster, Nodes};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::{json, Value};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

/// A finalizer the test removes itself.
const HOLD: &str = "skiff.test/hold";

const CLASSES: &str = r#"
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: low
value: 100
description: batch work that may be preempted
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: high
value: 1000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: high-never
value: 1000
preemptionPolicy: Never
"#;

/// Every pod event of the default namespace, in the order the watch delivered them:
/// ("apply" or "delete", the pod).
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<(&'static str, Pod)>>>);

impl Journal {
    fn start(c: &Cluster, token: CancellationToken) -> Journal {
        let journal = Journal::default();
        let j = journal.clone();
        let pods: Api<Pod> = c.api("default");
        tokio::spawn(async move {
            let stream = watcher(pods, watcher::Config::default());
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    _ = token.cancelled() => return,
                    n = stream.next() => n,
                };
                match next {
                    Some(Ok(watcher::Event::Apply(p))) | Some(Ok(watcher::Event::InitApply(p))) => {
                        j.0.lock().unwrap().push(("apply", p))
                    }
                    Some(Ok(watcher::Event::Delete(p))) => j.0.lock().unwrap().push(("delete", p)),
                    Some(_) => {}
                    None => return,
                }
            }
        });
        journal
    }

    /// The index of the first event about `name` that satisfies `want`.
    fn first(&self, name: &str, want: impl Fn(&'static str, &Pod) -> bool) -> Option<usize> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .position(|(kind, p)| p.name_any() == name && want(kind, p))
    }

    /// Waits for such an event and returns its index and the pod as it was then.
    async fn wait(
        &self,
        what: &str,
        name: &str,
        want: impl Fn(&'static str, &Pod) -> bool,
    ) -> (usize, Pod) {
        wait_until_async(what, WAIT, || async {
            let i = self.first(name, &want).ok_or("not yet")?;
            Ok::<_, &str>((i, self.0.lock().unwrap()[i].1.clone()))
        })
        .await
    }
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn nominated(p: &Pod) -> Option<&str> {
    p.status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn disruption_target(p: &Pod) -> Option<(String, String)> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget"))
        .filter(|c| c.status == "True")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// A cluster of two played nodes (4 cpu each) with the scheduler and the controllers, the
/// priority classes applied; returns it with the scheduler's metrics.
async fn cluster(nodes: &[&str]) -> (Cluster, control_plane::scheduler::Metrics) {
    let mut c = Cluster::api_only().await;
    c.nodes = Some(Nodes::start(c.client.clone(), &c.node_credentials(), nodes).await);
    let config = control_plane::scheduler::Config::default();
    let metrics = config.metrics.clone();
    c.start_scheduler_with(config);
    c.start_controllers(fast_settings()).await;
    let out = kubectl(&c).run_with_stdin(&["apply", "-f", "-"], CLASSES);
    assert!(out.success, "{}", out.stderr);
    (c, metrics)
}

fn kubectl(c: &Cluster) -> Kubectl {
    Kubectl::new(c.server().kubeconfig_path(), c.dir.path())
}

/// Creates a pod of `class` asking for `cpu`, with a 7 s grace period.
async fn pod(c: &Cluster, name: &str, class: &str, cpu: &str, labels: Value, spec: Value) {
    let mut spec = spec;
    spec["priorityClassName"] = json!(class);
    spec["terminationGracePeriodSeconds"] = json!(7);
    spec["containers"] = json!([{"name": "c", "image": "registry.local/work:v1",
        "resources": {"requests": {"cpu": cpu}}}]);
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap();
    c.api::<Pod>("default")
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

/// Waits until the pod is bound and Running; returns its node.
async fn running(c: &Cluster, name: &str) -> String {
    let pods: Api<Pod> = c.api("default");
    wait_until_async(&format!("{name} running"), WAIT, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        match (node_of(&p), phase.as_deref()) {
            (Some(n), Some("Running")) => Ok(n.to_string()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Waits for the event `reason` about `pod` whose message satisfies `want`.
async fn event(c: &Cluster, pod: &str, reason: &str, want: impl Fn(&str) -> bool) -> Event {
    let events: Api<Event> = c.api("default");
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    wait_until_async(&format!("{reason} event for {pod}"), WAIT, || async {
        let list = events.list(&lp).await.map_err(|e| vec![e.to_string()])?;
        let seen: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message.clone())
            .collect();
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason) && want(e.message.as_deref().unwrap_or(""))
            })
            .ok_or(seen)
    })
    .await
}

/// The column `header` of `name`'s row in a kubectl table.
fn column(table: &str, header: &str, name: &str) -> String {
    let mut lines = table.lines();
    let head = lines.next().unwrap_or_default();
    let at = head
        .find(header)
        .unwrap_or_else(|| panic!("no {header} column in {table}"));
    let row = lines
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in {table}"));
    row.get(at..)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_pod_preempts_on_a_full_cluster_and_binds_once_the_victim_is_gone() {
    let (c, metrics) = cluster(&["node-a", "node-b"]).await;
    let token = CancellationToken::new();
    let journal = Journal::start(&c, token.clone());
    let pods: Api<Pod> = c.api("default");
    let lows: Vec<String> = (0..4).map(|i| format!("low-{i}")).collect();

    // Four pods of 2 cpu fill both nodes. A finalizer holds each one after its node agent
    // finished it, so the test sees the preemptor wait for a victim that is terminating.
    for n in &lows {
        pod(&c, n, "low", "2", json!({"app": "low"}), json!({})).await;
        let hold = json!({"metadata": {"finalizers": [HOLD]}});
        pods.patch(n, &PatchParams::default(), &Patch::Merge(&hold))
            .await
            .unwrap();
    }
    for n in &lows {
        running(&c, n).await;
    }
    let stored = pods.get("low-0").await.unwrap();
    let spec = stored.spec.as_ref().unwrap();
    assert_eq!(
        (spec.priority, spec.preemption_policy.as_deref()),
        (Some(100), Some("PreemptLowerPriority")),
        "priority admission resolved the class"
    );

    // preemptionPolicy Never: no victim, and the message says why.
    pod(&c, "never", "high-never", "2", json!({}), json!({})).await;
    event(&c, "never", "FailedScheduling", |m| {
        m == "0/2 nodes are available: 2 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never."
    })
    .await;
    // Equal priority: nothing to preempt on either node.
    pod(&c, "peer", "low", "2", json!({}), json!({})).await;
    event(&c, "peer", "FailedScheduling", |m| {
        m == "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    })
    .await;
    for n in &lows {
        assert!(
            journal
                .first(n, |_, p| disruption_target(p).is_some())
                .is_none(),
            "{n}: neither preempted anything"
        );
    }
    assert!(metrics.preemption_attempts() >= 2);

    // The high-priority pod.
    pod(&c, "vip", "high", "2", json!({}), json!({})).await;
    let (nominated_at, p) = journal
        .wait("vip nominated", "vip", |_, p| nominated(p).is_some())
        .await;
    let node = nominated(&p).unwrap().to_string();
    assert!(node_of(&p).is_none(), "nominated before bound");

    // One victim, on that node: marked, then deleted with its own grace period.
    let marked = wait_until_async("a victim marked", WAIT, || async {
        let marked: Vec<String> = lows
            .iter()
            .filter(|n| {
                journal
                    .first(n, |_, p| disruption_target(p).is_some())
                    .is_some()
            })
            .cloned()
            .collect();
        if marked.is_empty() {
            Err(marked)
        } else {
            Ok(marked)
        }
    })
    .await;
    let victim = marked[0].clone();
    let (marked_at, marked) = journal
        .wait("victim marked", &victim, |_, p| {
            disruption_target(p).is_some()
        })
        .await;
    assert_eq!(node_of(&marked), Some(node.as_str()));
    assert_eq!(
        disruption_target(&marked).unwrap(),
        (
            "PreemptionByScheduler".to_string(),
            "default-scheduler: preempting to accommodate a higher priority pod".to_string()
        )
    );
    let (terminating_at, terminating) = journal
        .wait("victim terminating", &victim, |_, p| {
            p.metadata.deletion_timestamp.is_some()
        })
        .await;
    assert!(marked_at < terminating_at, "marked before the delete");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(7));
    // Its node agent finished it (grace 0); only the finalizer holds it now.
    journal
        .wait("victim finished by its node", &victim, |_, p| {
            p.metadata.deletion_grace_period_seconds == Some(0)
        })
        .await;
    let vip_uid = pods.get("vip").await.unwrap().uid().unwrap();
    let preempted = event(&c, &victim, "Preempted", |_| true).await;
    assert_eq!(
        preempted.message.as_deref(),
        Some(format!("Preempted by pod {vip_uid} on node {node}").as_str())
    );
    assert_eq!(preempted.type_.as_deref(), Some("Normal"));

    // What a user sees meanwhile: the nominated node, no node yet, the victim terminating.
    let k = kubectl(&c);
    let table = k.ok(&["get", "pods", "-o", "wide"]);
    assert_eq!(column(&table, "NOMINATED NODE", "vip"), node, "{table}");
    assert_eq!(column(&table, "NODE", "vip"), "<none>", "{table}");
    assert_eq!(column(&table, "STATUS", &victim), "Terminating", "{table}");
    assert_eq!(
        column(&table, "NOMINATED NODE", "never"),
        "<none>",
        "{table}"
    );
    let events = k.ok(&["get", "events"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("Preempted") && l.contains(&format!("pod/{victim}"))),
        "{events}"
    );
    assert!(
        journal.first("vip", |_, p| node_of(p).is_some()).is_none(),
        "vip waits while its victim terminates"
    );

    // The victim goes; the nominee binds to its node.
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch(&victim, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    let (gone_at, _) = journal
        .wait("victim gone", &victim, |kind, _| kind == "delete")
        .await;
    let (bound_at, bound) = journal
        .wait("vip bound", "vip", |_, p| node_of(p).is_some())
        .await;
    assert_eq!(node_of(&bound), Some(node.as_str()));
    assert!(
        nominated_at < bound_at && gone_at < bound_at,
        "nominated at {nominated_at}, victim gone at {gone_at}, bound at {bound_at}"
    );
    running(&c, "vip").await;
    for n in lows.iter().filter(|n| **n != victim) {
        let p = pods.get(n).await.unwrap();
        assert!(p.metadata.deletion_timestamp.is_none(), "{n} kept");
        assert!(disruption_target(&p).is_none(), "{n} not marked");
    }
    // Never and peer are still pending: the room was the nominee's.
    for n in ["never", "peer"] {
        assert_eq!(node_of(&pods.get(n).await.unwrap()), None, "{n} pending");
    }

    let text = metrics.render();
    assert!(
        text.contains("scheduler_preemption_victims_count 1"),
        "{text}"
    );
    assert!(metrics.preemption_attempts() >= 3);
    token.cancel();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_budget_steers_preemption_to_the_unprotected_victim() {
    let (c, _) = cluster(&["node-a", "node-b"]).await;
    let token = CancellationToken::new();
    let journal = Journal::start(&c, token.clone());
    let pods: Api<Pod> = c.api("default");
    for (name, app, node) in [
        ("guarded-0", "guarded", "node-a"),
        ("guarded-1", "guarded", "node-a"),
        ("plain-0", "plain", "node-b"),
        ("plain-1", "plain", "node-b"),
    ] {
        pod(
            &c,
            name,
            "low",
            "2",
            json!({"app": app}),
            json!({"nodeSelector": {"kubernetes.io/hostname": node}}),
        )
        .await;
    }
    for n in ["guarded-0", "guarded-1", "plain-0", "plain-1"] {
        running(&c, n).await;
    }
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
    }))
    .unwrap();
    let budgets: Api<PodDisruptionBudget> = c.api("default");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
    wait_until_async("the budget counts both pods healthy", WAIT, || async {
        let s = budgets
            .get("guard")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        if s.current_healthy == 2 && s.disruptions_allowed == 0 {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;

    // Node a's victims are protected, node b's are not: b is chosen, whatever the start.
    pod(&c, "vip", "high", "2", json!({}), json!({})).await;
    let (_, p) = journal
        .wait("vip nominated", "vip", |_, p| nominated(p).is_some())
        .await;
    assert_eq!(nominated(&p), Some("node-b"));
    assert_eq!(running(&c, "vip").await, "node-b");
    let gone: Vec<&str> = ["plain-0", "plain-1"]
        .into_iter()
        .filter(|n| journal.first(n, |kind, _| kind == "delete").is_some())
        .collect();
    assert_eq!(gone.len(), 1, "one plain pod preempted: {gone:?}");
    for n in ["guarded-0", "guarded-1"] {
        assert!(
            journal
                .first(n, |_, p| disruption_target(p).is_some())
                .is_none(),
            "{n} untouched"
        );
        assert!(pods
            .get(n)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none());
    }
    token.cancel();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_marks_the_pod_disruption_target_before_deleting_it() {
    let (c, _) = cluster(&["node-a"]).await;
    let token = CancellationToken::new();
    let journal = Journal::start(&c, token.clone());
    pod(&c, "web", "low", "1", json!({"app": "web"}), json!({})).await;
    running(&c, "web").await;
    let pods: Api<Pod> = c.api("default");
    pods.evict("web", &EvictParams::default()).await.unwrap();
    let (marked_at, marked) = journal
        .wait("web marked", "web", |_, p| disruption_target(p).is_some())
        .await;
    assert_eq!(
        disruption_target(&marked).unwrap(),
        (
            "EvictionByEvictionAPI".to_string(),
            "Eviction API: evicting".to_string()
        )
    );
    assert!(
        marked.metadata.deletion_timestamp.is_none(),
        "the condition is written before the delete"
    );
    let (terminating_at, terminating) = journal
        .wait("web terminating", "web", |_, p| {
            p.metadata.deletion_timestamp.is_some()
        })
        .await;
    assert!(marked_at < terminating_at);
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(7));
    journal
        .wait("web gone", "web", |kind, _| kind == "delete")
        .await;
    token.cancel();
    c.shutdown().await;
}
