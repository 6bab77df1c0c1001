//! The disruption controller (kube-controller-manager's `disruption`): keeps each
//! PodDisruptionBudget's status, which the eviction handler of the API server reads to answer
//! 429 or to let a pod go. Per budget: the pods its selector matches in its namespace;
//! expectedPods from the scale of the pods' controllers (a Deployment through its ReplicaSet,
//! a ReplicaSet, a StatefulSet) when maxUnavailable or a percentage is used, else the matched
//! pod count; currentHealthy (Ready pods neither terminating nor recently evicted);
//! desiredHealthy; disruptionsAllowed; disruptedPods, the evictions not yet seen as deletions
//! (dropped after two minutes, as Kubernetes does); the DisruptionAllowed condition.
//!
//! Not to be confused with [`super::disruption`], the node lifecycle's zone disruption states.
//!
//! Scale: budgets are found through the informer's namespace index; a pod change requeues
//! only the budgets of its namespace whose selector matches the pod (before or after the
//! change), and a budget's pods come from the pod label index (the smallest bucket of its
//! selector's equality requirements), never a scan of every pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{pods, Context};
use crate::machinery::kinds::policy::{set_disruption_allowed, DISRUPTION_ALLOWED};
use crate::machinery::selectors::LabelSelector;
use crate::runtime::controller::api_code;
use crate::runtime::informer::Change;
use crate::runtime::owner::{controller_of, resolve};
use crate::runtime::{
    Action, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler, Recorder,
    WorkQueue,
};

pub const NAME: &str = "disruption";

/// How long an eviction recorded in disruptedPods keeps the pod out of currentHealthy
/// before the controller decides the deletion is not coming (Kubernetes' DeletionTimeout).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// Workers (kube-controller-manager runs the disruption controller with one, plus its
/// recheck queue).
const WORKERS: usize = 2;

pub struct DisruptionBudgetController {
    client: Client,
    budgets: Informer<PodDisruptionBudget>,
    pods: Informer<Pod>,
    replica_sets: Informer<ReplicaSet>,
    deployments: Informer<Deployment>,
    stateful_sets: Informer<StatefulSet>,
    recorder: Recorder,
}

/// The budget's selector: absent selects nothing, empty everything (policy/v1).
fn selector(b: &PodDisruptionBudget) -> LabelSelector {
    LabelSelector::from_optional_meta(b.spec.as_ref().and_then(|s| s.selector.as_ref()))
        .unwrap_or_else(|_| LabelSelector::nothing())
}

/// The budgets of the pod's namespace whose selector matches its labels.
fn budgets_for_pod(budgets: &Informer<PodDisruptionBudget>, pod: &Pod) -> Vec<ObjectKey> {
    budgets
        .in_namespace(&pod.namespace().unwrap_or_default())
        .into_iter()
        .filter(|b| selector(b).matches(pod.labels()))
        .map(|b| ObjectKey::of(b.as_ref()))
        .collect()
}

pub fn build(ctx: &Context) -> Controller<DisruptionBudgetController> {
    let budgets = ctx.informers.get::<PodDisruptionBudget>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    budgets.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    let (q, b) = (queue.clone(), budgets.clone());
    pods.on_change(move |c| {
        let mut keys = budgets_for_pod(&b, c.object());
        if let Change::Updated { old, new } = c {
            if old.labels() != new.labels() {
                keys.extend(budgets_for_pod(&b, old));
            }
        }
        keys.sort();
        keys.dedup();
        for k in keys {
            q.add(k);
        }
    });
    Controller::new(
        NAME,
        Arc::new(DisruptionBudgetController {
            client: ctx.client.clone(),
            budgets,
            pods,
            replica_sets: ctx.informers.get::<ReplicaSet>(),
            deployments: ctx.informers.get::<Deployment>(),
            stateful_sets: ctx.informers.get::<StatefulSet>(),
            recorder: ctx.events.recorder("controllermanager"),
        }),
        queue,
        WORKERS,
        ctx.metrics.clone(),
    )
}

// ---------------------------------------------------------------- arithmetic

/// Kubernetes' GetScaledValueFromIntOrPercent rounding up: an int as is, `p%` of `total`
/// rounded up.
pub fn scaled(v: &IntOrString, total: i32) -> Result<i32, String> {
    match v {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let p: i64 = s
                .strip_suffix('%')
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            let total = i64::from(total.max(0));
            i32::try_from((p * total + 99) / 100).map_err(|e| e.to_string())
        }
    }
}

/// (expectedPods, desiredHealthy) for a budget matching `matched` pods, as Kubernetes'
/// getExpectedPodCount: maxUnavailable and percentages of minAvailable count against the
/// controllers' scale (`scale`, asked only then), an int minAvailable against the pods.
pub fn expected_and_desired(
    spec: &PodDisruptionBudgetSpec,
    matched: i32,
    scale: impl FnOnce() -> Result<i32, String>,
) -> Result<(i32, i32), String> {
    if let Some(max) = &spec.max_unavailable {
        let expected = scale()?;
        let unavailable = scaled(max, expected)?;
        return Ok((expected, (expected - unavailable).max(0)));
    }
    match &spec.min_available {
        Some(IntOrString::Int(n)) => Ok((matched, *n)),
        Some(min) => {
            let expected = scale()?;
            Ok((expected, scaled(min, expected)?))
        }
        None => Ok((0, 0)),
    }
}

/// currentHealthy - desiredHealthy, never negative, and 0 while the budget expects no pods
/// (its first pods appearing before its status is updated stay safe).
pub fn disruptions_allowed(current: i32, desired: i32, expected: i32) -> i32 {
    if expected <= 0 {
        return 0;
    }
    (current - desired).max(0)
}

/// The evictions still expected to become deletions (the rest expired), and when the next
/// one expires.
pub fn pending_disruptions(
    pods: &[Arc<Pod>],
    recorded: Option<&BTreeMap<String, Time>>,
    now: Timestamp,
) -> (BTreeMap<String, Time>, Option<Duration>) {
    let mut out = BTreeMap::new();
    let mut recheck: Option<Duration> = None;
    let Some(recorded) = recorded else {
        return (out, None);
    };
    for p in pods.iter().filter(|p| !pods::is_terminating(p)) {
        let Some(at) = recorded.get(&p.name_any()) else {
            continue;
        };
        let elapsed = pods::elapsed(at.0, now);
        if elapsed < DELETION_TIMEOUT {
            let left = DELETION_TIMEOUT - elapsed;
            recheck = Some(recheck.map_or(left, |r| r.min(left)));
            out.insert(p.name_any(), at.clone());
        }
    }
    (out, recheck)
}

/// Ready pods neither terminating nor recently evicted (Kubernetes' countHealthyPods).
pub fn count_healthy(pods: &[Arc<Pod>], disrupted: &BTreeMap<String, Time>) -> i32 {
    let n = pods
        .iter()
        .filter(|p| !pods::is_terminating(p))
        .filter(|p| !disrupted.contains_key(&p.name_any()))
        .filter(|p| pods::is_ready(p))
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

// ---------------------------------------------------------------- reconcile

impl DisruptionBudgetController {
    /// The pods the budget selects, from the smallest label bucket of its selector when it
    /// pins a label, else its namespace's pods.
    fn pods_for(&self, b: &PodDisruptionBudget) -> Vec<Arc<Pod>> {
        let sel = selector(b);
        if sel.is_nothing() {
            return Vec::new();
        }
        let ns = b.namespace().unwrap_or_default();
        let bucket = sel
            .requirements()
            .iter()
            .filter_map(|r| {
                sel.required_value(r.key())
                    .map(|v| pods::label_index_value(&ns, r.key(), v))
            })
            .min_by_key(|v| self.pods.count_by_index(pods::BY_LABEL, v));
        let candidates = match bucket {
            Some(v) => self.pods.by_index(pods::BY_LABEL, &v),
            None => self.pods.in_namespace(&ns),
        };
        candidates
            .into_iter()
            .filter(|p| sel.matches(p.labels()))
            .collect()
    }

    /// The scale of the controller of `pod`: (its uid, its replicas); a ReplicaSet a
    /// Deployment controls counts as the Deployment (Kubernetes' finders).
    fn controller_scale(&self, pod: &Pod) -> Option<(String, i32)> {
        let r = controller_of(&pod.metadata)?;
        let ns = pod.namespace().unwrap_or_default();
        if let Some(rs) =
            resolve(&self.replica_sets, &ns, r).and_then(|k| self.replica_sets.get(&k))
        {
            if let Some(d) = controller_of(&rs.metadata).filter(|d| d.kind == "Deployment") {
                let dep =
                    resolve(&self.deployments, &ns, d).and_then(|k| self.deployments.get(&k))?;
                let replicas = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                return Some((d.uid.clone(), replicas));
            }
            let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            return Some((r.uid.clone(), replicas));
        }
        let set = resolve(&self.stateful_sets, &ns, r).and_then(|k| self.stateful_sets.get(&k))?;
        let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        Some((r.uid.clone(), replicas))
    }

    /// Kubernetes' getExpectedScale: the sum of the scales of the pods' controllers (each
    /// once); pods without a controller are left out (and reported), a controller that is
    /// not found is an error.
    fn expected_scale(&self, b: &PodDisruptionBudget, matched: &[Arc<Pod>]) -> Result<i32, String> {
        let mut scales: HashMap<String, i32> = HashMap::new();
        let mut unmanaged = 0;
        for p in matched {
            if controller_of(&p.metadata).is_none() {
                unmanaged += 1;
                continue;
            }
            let (uid, replicas) = self
                .controller_scale(p)
                .ok_or_else(|| format!("found no controllers for pod {:?}", p.name_any()))?;
            scales.insert(uid, replicas);
        }
        if unmanaged > 0 {
            self.recorder.event(
                b,
                EventType::Warning,
                "UnmanagedPods",
                format!("Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.", selector(b)),
            );
        }
        Ok(scales.values().sum())
    }
}

impl Reconciler for DisruptionBudgetController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(budget) = self.budgets.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if budget.metadata.deletion_timestamp.is_some() {
            return Ok(Action::AwaitChange);
        }
        let now = Timestamp::now();
        let matched = self.pods_for(&budget);
        if matched.is_empty() {
            self.recorder.event(
                budget.as_ref(),
                EventType::Normal,
                "NoPods",
                "No matching pods found",
            );
        }
        let old = budget.status.clone().unwrap_or_default();
        let (disrupted, recheck) = pending_disruptions(&matched, old.disrupted_pods.as_ref(), now);
        let spec = budget.spec.clone().unwrap_or_default();
        let count = i32::try_from(matched.len()).unwrap_or(i32::MAX);
        let generation = budget.metadata.generation.unwrap_or(0);
        let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let conditions = serde_json::to_value(&old.conditions).unwrap_or_default();
        let status =
            match expected_and_desired(&spec, count, || self.expected_scale(&budget, &matched)) {
                Ok((expected, desired)) => {
                    let current = count_healthy(&matched, &disrupted);
                    let mut s = json!({
                        "currentHealthy": current,
                        "desiredHealthy": desired,
                        "expectedPods": expected,
                        "disruptionsAllowed": disruptions_allowed(current, desired, expected),
                        "observedGeneration": generation,
                        "conditions": conditions,
                    });
                    if !disrupted.is_empty() {
                        s["disruptedPods"] = serde_json::to_value(&disrupted).unwrap_or_default();
                    }
                    set_disruption_allowed(&mut s, &stamp);
                    s
                }
                Err(why) => {
                    // Kubernetes' failSafe: no disruption until the budget can be computed.
                    self.recorder.event(
                        budget.as_ref(),
                        EventType::Warning,
                        "CalculateExpectedPodCountFailed",
                        format!("Failed to calculate the number of expected pods: {why}"),
                    );
                    let mut s = serde_json::to_value(&old).unwrap_or_default();
                    s["disruptionsAllowed"] = json!(0);
                    s["observedGeneration"] = json!(generation);
                    set_disruption_allowed(&mut s, &stamp);
                    if let Some(c) = s["conditions"]
                        .as_array_mut()
                        .and_then(|cs| cs.iter_mut().find(|c| c["type"] == DISRUPTION_ALLOWED))
                    {
                        c["reason"] = json!("SyncFailed");
                        c["message"] = json!(why);
                    }
                    s
                }
            };
        let status: PodDisruptionBudgetStatus = serde_json::from_value(status)
            .map_err(|e| ReconcileError::Invalid(format!("the status does not encode: {e}")))?;
        if status != old {
            let mut updated = (*budget).clone();
            updated.status = Some(status);
            let api: Api<PodDisruptionBudget> =
                Api::namespaced(self.client.clone(), key.namespace_or_empty());
            match api
                .replace_status(&key.name, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => return Ok(Action::AwaitChange),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(recheck.map_or(Action::AwaitChange, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn spec(min: Option<IntOrString>, max: Option<IntOrString>) -> PodDisruptionBudgetSpec {
        PodDisruptionBudgetSpec {
            min_available: min,
            max_unavailable: max,
            ..Default::default()
        }
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn percentages_round_up_as_kubernetes() {
        assert_eq!(scaled(&pct("50%"), 3), Ok(2));
        assert_eq!(scaled(&pct("34%"), 3), Ok(2));
        assert_eq!(scaled(&pct("33%"), 3), Ok(1));
        assert_eq!(scaled(&pct("1%"), 1), Ok(1));
        assert_eq!(scaled(&pct("0%"), 10), Ok(0));
        assert_eq!(scaled(&pct("100%"), 7), Ok(7));
        assert_eq!(scaled(&IntOrString::Int(4), 7), Ok(4));
        assert!(scaled(&pct("half"), 3).is_err());
    }

    #[test]
    fn expected_pods_come_from_the_scale_only_when_needed() {
        let never = || -> Result<i32, String> { panic!("scale asked for an int minAvailable") };
        assert_eq!(
            expected_and_desired(&spec(Some(IntOrString::Int(2)), None), 3, never),
            Ok((3, 2))
        );
        // maxUnavailable 1 of a Deployment of 5 with 3 pods matched so far.
        assert_eq!(
            expected_and_desired(&spec(None, Some(IntOrString::Int(1))), 3, || Ok(5)),
            Ok((5, 4))
        );
        assert_eq!(
            expected_and_desired(&spec(None, Some(pct("50%"))), 3, || Ok(3)),
            Ok((3, 1))
        );
        assert_eq!(
            expected_and_desired(&spec(Some(pct("50%")), None), 2, || Ok(3)),
            Ok((3, 2))
        );
        assert_eq!(
            expected_and_desired(&spec(None, Some(IntOrString::Int(9))), 3, || Ok(3)),
            Ok((3, 0))
        );
        assert_eq!(
            expected_and_desired(&spec(None, Some(pct("10%"))), 3, || Err("no".into())),
            Err("no".to_string())
        );
        assert_eq!(
            expected_and_desired(&spec(None, None), 3, never),
            Ok((0, 0))
        );
    }

    #[test]
    fn disruptions_allowed_never_negative_nor_without_expected_pods() {
        assert_eq!(disruptions_allowed(3, 2, 3), 1);
        assert_eq!(disruptions_allowed(2, 2, 3), 0);
        assert_eq!(disruptions_allowed(1, 2, 3), 0);
        assert_eq!(disruptions_allowed(3, 0, 0), 0);
    }

    fn pod(name: &str, ready: bool, terminating: bool) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                deletion_timestamp: terminating.then(|| Time(Timestamp::now())),
                ..Default::default()
            },
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn evicted_pods_stop_counting_until_their_record_expires() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let pods = vec![
            pod("a", true, false),
            pod("b", true, false),
            pod("c", true, false),
            pod("d", false, false),
            pod("e", true, true),
        ];
        let recorded: BTreeMap<String, Time> = [
            ("a".to_string(), Time(at("2025-01-01T12:00:00Z"))),
            ("b".to_string(), Time(at("2025-01-01T11:57:00Z"))),
            ("e".to_string(), Time(at("2025-01-01T12:00:00Z"))),
            ("gone".to_string(), Time(at("2025-01-01T12:00:00Z"))),
        ]
        .into();
        let now = at("2025-01-01T12:00:30Z");
        let (pending, recheck) = pending_disruptions(&pods, Some(&recorded), now);
        // b expired (3.5 min ago); e is terminating; "gone" matches no pod.
        assert_eq!(pending.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(recheck, Some(Duration::from_secs(90)));
        // b and c: a is being evicted, d is not ready, e is terminating.
        assert_eq!(count_healthy(&pods, &pending), 2);
        assert_eq!(count_healthy(&pods, &BTreeMap::new()), 3);
    }
}
