//! The node lifecycle controller: node health from heartbeats, and the taints that follow.
//!
//! Every `--node-monitor-period` each node is checked: a new Ready heartbeat
//! (`lastHeartbeatTime`) or a renewal of its Lease in `kube-node-lease` counts as a probe,
//! timed on our own clock. A node not probed for `--node-monitor-grace-period` gets its
//! conditions set to Unknown ("Kubelet stopped posting node status."), and its pods are
//! marked not ready (so endpoints drop them). Taints follow the conditions as Kubernetes sets
//! them: Ready=Unknown -> `node.kubernetes.io/unreachable` NoExecute and NoSchedule,
//! Ready=False -> `node.kubernetes.io/not-ready`, pressure conditions and
//! `spec.unschedulable` -> their NoSchedule taints; a node that is healthy again is
//! untainted. NoExecute taints are rate-limited per zone and held back in disruptions (see
//! `disruption`). Evicting pods from NoExecute-tainted nodes is the taint-eviction
//! controller's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::disruption::{self, Rates, Verdict, Zones};
use super::{pods, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "nodelifecycle";
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Conditions set to Unknown when the node stops reporting.
const REPORTED: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
/// Taints this controller owns (others on the node are left alone).
const MANAGED: [&str; 7] = [
    NOT_READY,
    UNREACHABLE,
    UNSCHEDULABLE,
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
];

/// What we last saw of a node's heartbeats, on our clock.
struct Health {
    probed: Instant,
    heartbeat: Option<Timestamp>,
    lease_renewed: Option<Timestamp>,
    ready: String,
}

pub struct NodeLifecycleController {
    client: Client,
    nodes: Informer<Node>,
    leases: Informer<Lease>,
    pods: Informer<Pod>,
    health: Mutex<HashMap<String, Health>>,
    zones: Mutex<Zones>,
    rates: Rates,
    grace: Duration,
    period: Duration,
    recorder: Recorder,
}

pub fn build(ctx: &Context) -> Controller<NodeLifecycleController> {
    let nodes = ctx.informers.get::<Node>();
    let leases = ctx.informers.get::<Lease>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let recorder = ctx.events.recorder("node-controller");
    let (q, r) = (queue.clone(), recorder.clone());
    nodes.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        match c {
            Change::Added(n) => {
                r.event(
                    n.as_ref(),
                    EventType::Normal,
                    "RegisteredNode",
                    format!(
                        "Node {} event: Registered Node {} in Controller",
                        key.name, key.name
                    ),
                );
                q.add(key);
            }
            Change::Updated { .. } => q.add(key),
            Change::Deleted(n) => {
                r.event(
                    n.as_ref(),
                    EventType::Normal,
                    "RemovingNode",
                    format!(
                        "Node {} event: Removing Node {} from Controller",
                        key.name, key.name
                    ),
                );
                q.add(key);
            }
        }
    });
    let reconciler = NodeLifecycleController {
        client: ctx.client.clone(),
        nodes,
        leases,
        pods,
        health: Mutex::new(HashMap::new()),
        zones: Mutex::new(Zones::default()),
        rates: ctx.settings.eviction_rates,
        grace: ctx.settings.node_monitor_grace_period,
        period: ctx.settings.node_monitor_period,
        recorder,
    };
    Controller::new(NAME, Arc::new(reconciler), queue, 2, ctx.metrics.clone())
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn condition_status(node: &Node, type_: &str) -> String {
    condition(node, type_)
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "Unknown".into())
}

/// The controller-owned taints a node should carry.
pub fn desired_taints(node: &Node) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    match condition_status(node, "Ready").as_str() {
        "True" => {}
        "False" => out.extend([(NOT_READY, "NoExecute"), (NOT_READY, "NoSchedule")]),
        _ => out.extend([(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")]),
    }
    for (cond, key) in [
        ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
        ("DiskPressure", "node.kubernetes.io/disk-pressure"),
        ("PIDPressure", "node.kubernetes.io/pid-pressure"),
        (
            "NetworkUnavailable",
            "node.kubernetes.io/network-unavailable",
        ),
    ] {
        if condition_status(node, cond) == "True" {
            out.push((key, "NoSchedule"));
        }
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        out.push((UNSCHEDULABLE, "NoSchedule"));
    }
    out
}

/// The node's taints with the managed ones replaced by `desired` (existing ones keep their
/// timeAdded); None if nothing changes.
pub fn reconcile_taints(
    current: &[Taint],
    desired: &[(&str, &str)],
    now: Timestamp,
) -> Option<Vec<Taint>> {
    let managed = |t: &Taint| MANAGED.contains(&t.key.as_str());
    let mut out: Vec<Taint> = current.iter().filter(|t| !managed(t)).cloned().collect();
    for (key, effect) in desired {
        match current
            .iter()
            .find(|t| t.key == *key && t.effect == *effect)
        {
            Some(t) => out.push(t.clone()),
            None => out.push(Taint {
                key: key.to_string(),
                effect: effect.to_string(),
                value: None,
                time_added: (*effect == "NoExecute").then_some(Time(now)),
            }),
        }
    }
    let same = out.len() == current.len() && out.iter().all(|t| current.contains(t));
    (!same).then_some(out)
}

impl Reconciler for NodeLifecycleController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(node) = self.nodes.get(key) else {
            self.health().remove(&key.name);
            self.zones().remove(&key.name);
            return Ok(Action::AwaitChange);
        };
        let mut node = (*node).clone();
        let was_ready = self.observe(&node);
        if self.stale(&node.name_any()) {
            if let Some(updated) = self.mark_unknown(&node).await? {
                node = updated;
            }
        }
        let ready = condition_status(&node, "Ready");
        if ready != was_ready {
            self.transition(&node, &was_ready, &ready).await?;
        }
        let zone = disruption::zone_of(&node);
        self.zones().set(&node.name_any(), &zone, ready == "True");
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let mut desired = desired_taints(&node);
        let mut next = self.period;
        let new_no_execute = desired.iter().any(|(k, e)| {
            *e == "NoExecute" && !taints.iter().any(|t| t.key == *k && t.effect == *e)
        });
        let all_down = self.zones().all_fully_disrupted(&self.rates);
        if all_down || new_no_execute {
            // (Every zone down: a Hold, whether or not this node still needs its taint.)
            match self.zones().admit(&zone, &self.rates, Instant::now()) {
                Verdict::Taint => {}
                Verdict::Wait(wait) => {
                    desired.retain(|(_, e)| *e != "NoExecute");
                    next = next.min(wait.max(Duration::from_millis(10)));
                }
                Verdict::Hold(why) => {
                    // Held back, and in a cluster-wide outage lifted where already set.
                    if all_down || !taints.iter().any(|t| t.effect == "NoExecute") {
                        desired.retain(|(_, e)| *e != "NoExecute");
                    }
                    tracing::debug!(node = %node.name_any(), zone, why, "not tainting NoExecute");
                }
            }
        }
        if let Some(new) = reconcile_taints(&taints, &desired, Timestamp::now()) {
            let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": new}});
            let api: Api<Node> = Api::all(self.client.clone());
            match api
                .patch(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => return Ok(Action::AwaitChange),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::RequeueAfter(next))
    }
}

impl NodeLifecycleController {
    fn health(&self) -> std::sync::MutexGuard<'_, HashMap<String, Health>> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn zones(&self) -> std::sync::MutexGuard<'_, Zones> {
        self.zones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records heartbeats; returns the Ready status we last acted on.
    fn observe(&self, node: &Node) -> String {
        let name = node.name_any();
        let heartbeat = condition(node, "Ready")
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0);
        let lease_renewed = self
            .leases
            .get_namespaced(NODE_LEASE_NAMESPACE, &name)
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
        let mut health = self.health();
        let h = health.entry(name).or_insert_with(|| Health {
            probed: Instant::now(),
            heartbeat,
            lease_renewed,
            ready: condition_status(node, "Ready"),
        });
        if h.heartbeat != heartbeat || h.lease_renewed != lease_renewed {
            h.probed = Instant::now();
            h.heartbeat = heartbeat;
            h.lease_renewed = lease_renewed;
        }
        h.ready.clone()
    }

    fn stale(&self, name: &str) -> bool {
        self.health()
            .get(name)
            .is_some_and(|h| h.probed.elapsed() > self.grace)
    }

    /// Sets the reported conditions to Unknown; returns the node as written (None if nothing
    /// changed).
    async fn mark_unknown(&self, node: &Node) -> Result<Option<Node>, ReconcileError> {
        let now = Time(Timestamp::now());
        let mut updated = node.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let mut changed = false;
        for type_ in REPORTED {
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                Some(c) if c.status != "Unknown" => {
                    c.status = "Unknown".into();
                    c.reason = Some("NodeStatusUnknown".into());
                    c.message = Some("Kubelet stopped posting node status.".into());
                    c.last_transition_time = Some(now.clone());
                    changed = true;
                }
                Some(_) => {}
                None => {
                    conditions.push(NodeCondition {
                        type_: type_.into(),
                        status: "Unknown".into(),
                        reason: Some("NodeStatusNeverUpdated".into()),
                        message: Some("Kubelet never posted node status.".into()),
                        last_heartbeat_time: Some(now.clone()),
                        last_transition_time: Some(now.clone()),
                    });
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(None);
        }
        tracing::info!(node = %node.name_any(), grace = ?self.grace, "node stopped posting status; conditions now Unknown");
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .replace_status(&node.name_any(), &PostParams::default(), &updated)
            .await
        {
            Ok(n) => Ok(Some(n)),
            Err(e) if api_code(&e) == Some(404) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Ready changed since we last acted: Events, and pods marked not ready when it is lost.
    async fn transition(&self, node: &Node, was: &str, now: &str) -> Result<(), ReconcileError> {
        let name = node.name_any();
        if now == "True" {
            self.recorder.event(
                node,
                EventType::Normal,
                "NodeReady",
                format!("Node {name} status is now: NodeReady"),
            );
        } else if was == "True" {
            self.recorder.event(
                node,
                EventType::Normal,
                "NodeNotReady",
                format!("Node {name} status is now: NodeNotReady"),
            );
            self.mark_pods_not_ready(&name).await?;
        }
        if let Some(h) = self.health().get_mut(&name) {
            h.ready = now.to_string();
        }
        Ok(())
    }

    async fn mark_pods_not_ready(&self, node: &str) -> Result<(), ReconcileError> {
        for pod in self.pods.by_index(pods::BY_NODE, node) {
            if !pods::is_ready(&pod) {
                continue;
            }
            let mut p = (*pod).clone();
            let now = Time(Timestamp::now());
            if let Some(cs) = p.status.as_mut().and_then(|s| s.conditions.as_mut()) {
                for c in cs.iter_mut().filter(|c| c.type_ == "Ready") {
                    c.status = "False".into();
                    c.last_transition_time = Some(now.clone());
                }
            }
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api
                .replace_status(&pod.name_any(), &PostParams::default(), &p)
                .await
            {
                Ok(_) => self.recorder.event(
                    pod.as_ref(),
                    EventType::Warning,
                    "NodeNotReady",
                    "Node is not ready",
                ),
                Err(e) if matches!(api_code(&e), Some(404) | Some(409)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};

    use super::*;

    fn node(ready: Option<&str>, unschedulable: bool) -> Node {
        Node {
            spec: Some(NodeSpec {
                unschedulable: Some(unschedulable),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|r| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: r.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn taints_follow_conditions() {
        assert!(desired_taints(&node(Some("True"), false)).is_empty());
        assert_eq!(
            desired_taints(&node(Some("Unknown"), false)),
            vec![(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")]
        );
        assert_eq!(
            desired_taints(&node(Some("False"), true))[0],
            (NOT_READY, "NoExecute")
        );
        assert!(desired_taints(&node(Some("False"), true)).contains(&(UNSCHEDULABLE, "NoSchedule")));
        assert_eq!(desired_taints(&node(None, false))[0].0, UNREACHABLE);
    }

    #[test]
    fn taint_updates_keep_foreign_taints_and_times() {
        let t0 = Timestamp::from_second(1000).unwrap();
        let foreign = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            value: Some("gpu".into()),
            time_added: None,
        };
        let added = reconcile_taints(
            std::slice::from_ref(&foreign),
            &[(UNREACHABLE, "NoExecute")],
            t0,
        )
        .unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[1].time_added.as_ref().unwrap().0, t0);
        // Already there: no change, time kept.
        assert!(reconcile_taints(
            &added,
            &[(UNREACHABLE, "NoExecute")],
            Timestamp::from_second(2000).unwrap()
        )
        .is_none());
        // Healthy again: only the foreign taint stays.
        assert_eq!(reconcile_taints(&added, &[], t0).unwrap(), vec![foreign]);
    }
}
