//! Preemption, kube-scheduler's DefaultPreemption PostFilter: when no node fits a pod, find
//! the nodes where removing pods of lower priority would make it fit, keep as many of those
//! pods as possible, and pick the node whose removals hurt least. Pure: it reads the cache and
//! returns the decision; [`super::cycle`] carries it out (nominatedNodeName on the preemptor,
//! DisruptionTarget and a graceful delete on each victim, Events).
//!
//! As upstream:
//! - a pod with `preemptionPolicy: Never` preempts nothing, nor does a pod whose nominated
//!   node still has a lower-priority pod terminating because of an earlier preemption (it
//!   waits for that room instead of taking more);
//! - only pods of strictly lower priority are victims; on each node all of them are removed
//!   first, and if the pod then fits they are reprieved one by one, highest priority first,
//!   those a PodDisruptionBudget protects before the others, keeping every one whose return
//!   still lets the pod fit (selectVictimsOnNode);
//! - the node chosen has the fewest budget violations, then the lowest highest-victim
//!   priority, the smallest sum of victim priorities, the fewest victims, and the latest
//!   start among its most important victims (pickOneNodeForPreemption);
//! - the search starts at a random node and stops once it has max(10% of the nodes, 100)
//!   candidates with at least one violating no budget.
//!
//! Not done (as noted in ARCHITECTURE.md): the topology spread and inter-pod affinity
//! pre-filter states are not updated as victims are removed (upstream's AddPod/RemovePod), so
//! a pod rejected only because of a lower-priority pod's affinity terms finds no candidate.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;

use super::algorithm::Cycle;
use super::cache::Cache;
use super::framework::{Code, Diagnosis, FitError};
use super::node_info::NodeInfo;
use super::plugins::node_affinity;
use super::pod_info::PodInfo;
use crate::machinery::LabelSelector;

/// A node's verdict when nothing done to its pods can help.
pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
/// A node's verdict when it has no pod of lower priority.
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
/// kube-scheduler's DisruptionTarget reason for a victim.
pub const REASON_PREEMPTION: &str = "PreemptionByScheduler";
/// The pod condition marking a pod that is about to be disrupted.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// DefaultPreemption's minCandidateNodesPercentage and minCandidateNodesAbsolute.
const MIN_CANDIDATE_NODES_PERCENTAGE: usize = 10;
const MIN_CANDIDATE_NODES_ABSOLUTE: usize = 100;

/// What preemption needs of a PodDisruptionBudget.
#[derive(Clone, Debug)]
pub struct Budget {
    pub namespace: String,
    pub name: String,
    /// An empty or absent selector protects nothing here (unlike the eviction API, as in
    /// kube-scheduler's filterPodsWithPDBViolation).
    selector: Option<LabelSelector>,
    pub disruptions_allowed: i32,
    /// Pods whose eviction the API server already counted against the budget.
    disrupted: BTreeSet<String>,
}

impl Budget {
    pub fn new(pdb: &PodDisruptionBudget) -> Budget {
        let selector = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| LabelSelector::from_meta(s).ok())
            .filter(|s| !s.requirements().is_empty());
        let status = pdb.status.as_ref();
        Budget {
            namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
            name: pdb.metadata.name.clone().unwrap_or_default(),
            selector,
            disruptions_allowed: status.map_or(0, |s| s.disruptions_allowed),
            disrupted: status
                .and_then(|s| s.disrupted_pods.as_ref())
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }

    fn protects(&self, pod: &PodInfo) -> bool {
        self.namespace == pod.namespace()
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(pod.labels()))
    }
}

/// A node where preemption makes room, and what it costs.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub node: String,
    /// Most important first.
    pub victims: Vec<Arc<PodInfo>>,
    /// Victims whose removal breaks a budget.
    pub pdb_violations: usize,
}

/// What preemption decided for a pod no node fits.
#[derive(Debug)]
pub enum Outcome {
    /// Remove `candidate.victims` and nominate the pod to `candidate.node`; the pods of lower
    /// priority nominated to that node lose their nomination.
    Preempt {
        candidate: Candidate,
        lower_nominated: Vec<Arc<PodInfo>>,
    },
    /// The pod may not preempt ("not eligible due to ...").
    Ineligible(&'static str),
    /// No node would fit even without its lower-priority pods.
    NoCandidate(FitError),
}

impl Outcome {
    /// The PostFilter message added to the pod's FitError, "preemption: ...".
    pub fn message(&self) -> Option<String> {
        match self {
            Outcome::Preempt { .. } => None,
            Outcome::Ineligible(why) => Some(format!("preemption: {why}")),
            Outcome::NoCandidate(e) => Some(format!("preemption: {e}")),
        }
    }
}

/// When the pod started, for ordering victims of equal priority: one that has not started
/// counts as the newest (kube-scheduler's GetPodStartTime uses now).
fn start_time(pod: &PodInfo) -> Timestamp {
    pod.pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(Timestamp::MAX, |t| t.0)
}

/// kube-scheduler's MoreImportantPod: higher priority, then the one running longer.
fn more_important(a: &PodInfo, b: &PodInfo) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then_with(|| start_time(a).cmp(&start_time(b)))
}

/// Whether a pod is terminating because preemption chose it.
fn terminating_by_preemption(pod: &PodInfo) -> bool {
    pod.terminating()
        && pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == DISRUPTION_TARGET && c.reason.as_deref() == Some(REASON_PREEMPTION)
                })
            })
}

/// kube-scheduler's PodEligibleToPreemptOthers.
fn eligible(cycle: &Cycle<'_>) -> Result<(), &'static str> {
    let pod = cycle.pod;
    let policy = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref());
    if policy == Some("Never") {
        return Err("not eligible due to preemptionPolicy=Never.");
    }
    let Some(node) =
        super::algorithm::nominated_node(cycle.cache, pod).and_then(|n| cycle.cache.node(n))
    else {
        return Ok(());
    };
    // A nominated node the pod can never fit on again is no reason to wait.
    if cycle
        .filter(node)
        .is_err_and(|r| r.code == Code::UnschedulableAndUnresolvable)
    {
        return Ok(());
    }
    if node
        .pods()
        .iter()
        .any(|p| p.priority < pod.priority && terminating_by_preemption(p))
    {
        return Err("not eligible due to a terminating pod on the nominated node.");
    }
    Ok(())
}

/// Splits pods (most important first) into those whose removal would break a budget and the
/// rest, spending each matching budget's allowed disruptions in order
/// (filterPodsWithPDBViolation).
fn split_by_budgets(
    pods: Vec<Arc<PodInfo>>,
    cache: &Cache,
) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: HashMap<(&str, &str), i32> = HashMap::new();
    let (mut violating, mut fine) = (Vec::new(), Vec::new());
    for p in pods {
        let mut violated = false;
        if !p.labels().is_empty() {
            for b in cache.budgets_in(p.namespace()) {
                if !b.protects(&p) || b.disrupted.contains(p.name()) {
                    continue;
                }
                let left = allowed
                    .entry((b.namespace.as_str(), b.name.as_str()))
                    .or_insert(b.disruptions_allowed);
                *left -= 1;
                if *left < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(p);
        } else {
            fine.push(p);
        }
    }
    (violating, fine)
}

/// Why a node is no candidate (the reasons of its FitError line).
type Reasons = Vec<Cow<'static, str>>;

/// The victims chosen on one node, most important first, and how many break a budget.
struct Victims {
    pods: Vec<Arc<PodInfo>>,
    pdb_violations: usize,
}

/// The fewest pods of lower priority to remove from `node` for the pod to fit
/// (selectVictimsOnNode), or the node's reasons for not being a candidate.
fn select_victims(cycle: &Cycle<'_>, node: &NodeInfo) -> Result<Victims, Reasons> {
    let pod = cycle.pod;
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods()
        .iter()
        .filter(|p| p.priority < pod.priority)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(vec![Cow::Borrowed(NO_VICTIMS)]);
    }
    let mut sim = node.clone();
    for p in &potential {
        sim.remove_pod(&p.uid);
    }
    cycle.filter(&sim).map_err(|r| r.reasons)?;
    potential.sort_by(|a, b| more_important(a, b));
    let (violating, fine) = split_by_budgets(potential, cycle.cache);
    let mixed = !violating.is_empty() && !fine.is_empty();
    let mut victims = Vec::new();
    let mut violations = 0;
    let mut reprieve = |p: Arc<PodInfo>, sim: &mut NodeInfo| -> bool {
        sim.add_pod(p.clone());
        if cycle.filter(sim).is_ok() {
            return true;
        }
        sim.remove_pod(&p.uid);
        victims.push(p);
        false
    };
    for p in violating {
        if !reprieve(p, &mut sim) {
            violations += 1;
        }
    }
    for p in fine {
        reprieve(p, &mut sim);
    }
    if mixed {
        victims.sort_by(|a, b| more_important(a, b));
    }
    Ok(Victims {
        pods: victims,
        pdb_violations: violations,
    })
}

/// The earliest start among the candidate's most important victims (GetEarliestPodStartTime).
fn earliest_start_of_most_important(c: &Candidate) -> Option<Timestamp> {
    let top = c.victims.first()?.priority;
    c.victims
        .iter()
        .filter(|p| p.priority == top)
        .map(|p| start_time(p))
        .min()
}

/// pickOneNodeForPreemption: each criterion in turn narrows the candidates to the best
/// scoring ones; the first left wins.
pub fn pick(candidates: &[Candidate]) -> Option<usize> {
    if let Some(i) = candidates.iter().position(|c| c.victims.is_empty()) {
        return Some(i);
    }
    let criteria: [&dyn Fn(&Candidate) -> i128; 5] = [
        &|c| -(c.pdb_violations as i128),
        &|c| -i128::from(c.victims.first().map_or(i32::MIN, |p| p.priority)),
        // Each priority shifted to be non-negative, so that more victims never sum lower.
        &|c| {
            -c.victims
                .iter()
                .map(|p| i128::from(p.priority) + i128::from(i32::MAX) + 1)
                .sum::<i128>()
        },
        &|c| -(c.victims.len() as i128),
        &|c| earliest_start_of_most_important(c).map_or(i128::MIN, |t| t.as_nanosecond()),
    ];
    let mut left: Vec<usize> = (0..candidates.len()).collect();
    for score in criteria {
        let best = left.iter().map(|i| score(&candidates[*i])).max()?;
        left.retain(|i| score(&candidates[*i]) == best);
        if left.len() == 1 {
            break;
        }
    }
    left.first().copied()
}

/// How many candidates to look for among `nodes` potential ones.
fn candidates_to_find(nodes: usize) -> usize {
    (nodes * MIN_CANDIDATE_NODES_PERCENTAGE / 100)
        .max(MIN_CANDIDATE_NODES_ABSOLUTE)
        .min(nodes)
}

/// Runs preemption for `pod`, which no node fits. `offset` is where the search starts (a
/// random number in production, fixed in tests).
pub fn preempt(cache: &mut Cache, pod: &PodInfo, offset: usize) -> Outcome {
    cache.refresh_order();
    let cache: &Cache = cache;
    let cycle = Cycle::new(pod, cache);
    if let Err(why) = eligible(&cycle) {
        return Outcome::Ineligible(why);
    }
    let order = cache.node_order();
    let all = order.len();
    let mut diagnosis = Diagnosis::default();
    let pinned = match node_affinity::pre_filter(pod) {
        Ok(p) => p,
        Err(_) => {
            diagnosis.record_many(
                super::framework::Plugin::NodeAffinity,
                Cow::Borrowed(NOT_HELPFUL),
                all,
            );
            return Outcome::NoCandidate(FitError {
                nodes: all,
                diagnosis,
            });
        }
    };
    let mut candidates: Vec<Candidate> = Vec::new();
    let want = candidates_to_find(all);
    let mut clean = 0;
    for i in 0..all {
        let name = &order[(offset + i) % all];
        let Some(node) = cache.node(name) else {
            continue;
        };
        if pinned.as_ref().is_some_and(|p| !p.contains(&**name)) {
            diagnosis.record_reasons([Cow::Borrowed(NOT_HELPFUL)]);
            continue;
        }
        match cycle.filter(node) {
            Err(r) if r.code == Code::UnschedulableAndUnresolvable => {
                diagnosis.record_reasons([Cow::Borrowed(NOT_HELPFUL)]);
                continue;
            }
            _ => {}
        }
        match select_victims(&cycle, node) {
            Ok(v) => {
                if v.pdb_violations == 0 {
                    clean += 1;
                }
                candidates.push(Candidate {
                    node: name.to_string(),
                    victims: v.pods,
                    pdb_violations: v.pdb_violations,
                });
                if clean > 0 && candidates.len() >= want {
                    break;
                }
            }
            Err(reasons) => diagnosis.record_reasons(reasons),
        }
    }
    let Some(best) = pick(&candidates) else {
        return Outcome::NoCandidate(FitError {
            nodes: all,
            diagnosis,
        });
    };
    let candidate = candidates.swap_remove(best);
    let lower_nominated = cache
        .nominated_on(&candidate.node)
        .iter()
        .filter(|p| p.priority < pod.priority && p.uid != pod.uid)
        .cloned()
        .collect();
    Outcome::Preempt {
        candidate,
        lower_nominated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::algorithm::Algorithm;
    use crate::scheduler::testing::{cache, node, pod};
    use serde_json::{json, Value};

    /// A pod of `priority` requesting `cpu`, with labels and an optional start time.
    fn prio(name: &str, priority: i32, cpu: &str, extra: Value) -> Arc<PodInfo> {
        let mut v = json!({"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"priority": priority, "containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}});
        if let Some(labels) = extra.get("labels") {
            v["metadata"]["labels"] = labels.clone();
        }
        if let Some(t) = extra.get("startTime") {
            v["status"] = json!({"startTime": t});
        }
        if let Some(p) = extra.get("preemptionPolicy") {
            v["spec"]["preemptionPolicy"] = p.clone();
        }
        pod(v)
    }

    fn cpu_node(name: &str, cpu: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
        node(name, cpu, "8Gi", json!({}), json!({}))
    }

    fn budget(name: &str, app: &str, allowed: i32) -> Budget {
        Budget::new(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": app}}},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 1,
                           "desiredHealthy": 1, "expectedPods": 1},
            }))
            .unwrap(),
        )
    }

    fn names(pods: &[Arc<PodInfo>]) -> Vec<&str> {
        pods.iter().map(|p| p.name()).collect()
    }

    fn preempted(outcome: Outcome) -> (Candidate, Vec<Arc<PodInfo>>) {
        match outcome {
            Outcome::Preempt {
                candidate,
                lower_nominated,
            } => (candidate, lower_nominated),
            other => panic!("expected a preemption, got {other:?}"),
        }
    }

    #[test]
    fn lowest_priority_pods_go_and_the_rest_are_reprieved() {
        // 4 cpu: 1 cpu each at priorities 1, 2, 3, 4; the preemptor wants 2 cpu.
        let pods = [
            (prio("p1", 1, "1", json!({})), "n"),
            (prio("p2", 2, "1", json!({})), "n"),
            (prio("p3", 3, "1", json!({})), "n"),
            (prio("p4", 4, "1", json!({})), "n"),
        ];
        let mut c = cache(&[cpu_node("n", "4")], &pods);
        let (cand, _) = preempted(preempt(&mut c, &prio("hi", 10, "2", json!({})), 0));
        assert_eq!(cand.node, "n");
        assert_eq!(names(&cand.victims), ["p2", "p1"], "most important first");
        assert_eq!(cand.pdb_violations, 0);

        // A preemptor of priority 3 may only remove p1 and p2.
        let (cand, _) = preempted(preempt(&mut c, &prio("mid", 3, "2", json!({})), 0));
        assert_eq!(names(&cand.victims), ["p2", "p1"]);
        match preempt(&mut c, &prio("mid", 3, "3", json!({})), 0) {
            Outcome::NoCandidate(e) => assert_eq!(
                e.to_string(),
                "0/1 nodes are available: 1 Insufficient cpu."
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn equal_priority_never_preempts_and_policy_never_is_ineligible() {
        let mut c = cache(
            &[cpu_node("a", "2"), cpu_node("b", "2")],
            &[
                (prio("x", 5, "2", json!({})), "a"),
                (prio("y", 5, "2", json!({})), "b"),
            ],
        );
        let out = preempt(&mut c, &prio("same", 5, "1", json!({})), 0);
        assert_eq!(
            out.message().unwrap(),
            "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
        );
        let never = prio("never", 100, "1", json!({"preemptionPolicy": "Never"}));
        let out = preempt(&mut c, &never, 0);
        assert!(matches!(out, Outcome::Ineligible(_)));
        assert_eq!(
            out.message().unwrap(),
            "preemption: not eligible due to preemptionPolicy=Never."
        );
    }

    #[test]
    fn unresolvable_nodes_are_not_candidates() {
        let tainted = node(
            "t",
            "2",
            "8Gi",
            json!({}),
            json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}),
        );
        let mut c = cache(
            &[tainted, cpu_node("free", "2")],
            &[
                (prio("low-t", 0, "2", json!({})), "t"),
                (prio("low-f", 0, "2", json!({})), "free"),
            ],
        );
        let (cand, _) = preempted(preempt(&mut c, &prio("hi", 10, "1", json!({})), 0));
        assert_eq!(cand.node, "free");
        let mut only_tainted = cache(
            &[node(
                "t",
                "2",
                "8Gi",
                json!({}),
                json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}),
            )],
            &[(prio("low-t", 0, "2", json!({})), "t")],
        );
        let out = preempt(&mut only_tainted, &prio("hi", 10, "1", json!({})), 0);
        assert_eq!(
            out.message().unwrap(),
            "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        );
    }

    #[test]
    fn budgets_steer_the_choice_and_the_reprieve_order() {
        // Same victims' shape on both nodes; a budget allowing no disruption protects a's.
        let mut c = cache(
            &[cpu_node("a", "2"), cpu_node("b", "2")],
            &[
                (prio("guarded", 1, "2", json!({})), "a"),
                (prio("free", 1, "2", json!({})), "b"),
            ],
        );
        c.upsert_budget(budget("keep", "guarded", 0));
        for offset in 0..2 {
            let (cand, _) = preempted(preempt(&mut c, &prio("hi", 10, "1", json!({})), offset));
            assert_eq!(cand.node, "b", "the unprotected victim is preferred");
            assert_eq!(cand.pdb_violations, 0);
        }
        // With only the protected node left, it is still chosen, counted as a violation.
        let mut c2 = cache(
            &[cpu_node("a", "2")],
            &[(prio("guarded", 1, "2", json!({})), "a")],
        );
        c2.upsert_budget(budget("keep", "guarded", 0));
        let (cand, _) = preempted(preempt(&mut c2, &prio("hi", 10, "1", json!({})), 0));
        assert_eq!((cand.node.as_str(), cand.pdb_violations), ("a", 1));

        // On one node: two pods of equal priority and room for one; the protected one is
        // reprieved first and stays, the other goes.
        let shared = [
            (prio("v1", 1, "1", json!({"labels": {"app": "db"}})), "n"),
            (prio("v2", 1, "1", json!({"labels": {"app": "web"}})), "n"),
        ];
        let mut c3 = cache(&[cpu_node("n", "2")], &shared);
        c3.upsert_budget(budget("db", "db", 0));
        let (cand, _) = preempted(preempt(&mut c3, &prio("hi", 10, "1", json!({})), 0));
        assert_eq!(names(&cand.victims), ["v2"]);
        assert_eq!(cand.pdb_violations, 0);
        // A budget that still allows one disruption does not count as violated.
        let mut c4 = cache(&[cpu_node("n", "2")], &shared);
        c4.upsert_budget(budget("db", "db", 1));
        c4.upsert_budget(budget("web", "web", 0));
        let (cand, _) = preempted(preempt(&mut c4, &prio("hi", 10, "1", json!({})), 0));
        assert_eq!(names(&cand.victims), ["v1"]);
    }

    #[test]
    fn node_choice_follows_kube_schedulers_criteria_in_order() {
        let v = |name: &str, p: i32, start: &str| prio(name, p, "1", json!({"startTime": start}));
        let cand = |node: &str, pdb: usize, victims: Vec<Arc<PodInfo>>| Candidate {
            node: node.into(),
            victims,
            pdb_violations: pdb,
        };
        let t0 = "2026-01-01T00:00:00Z";
        let t1 = "2026-01-02T00:00:00Z";
        // Fewest budget violations first, even at a higher priority.
        let c = [
            cand("a", 1, vec![v("a1", 1, t0)]),
            cand("b", 0, vec![v("b1", 9, t0)]),
        ];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        // Then the lowest highest-priority victim.
        let c = [
            cand("a", 0, vec![v("a1", 5, t0)]),
            cand("b", 0, vec![v("b1", 3, t0), v("b2", 3, t0)]),
        ];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        // Then the smallest sum of priorities (negative ones shifted).
        let c = [
            cand("a", 0, vec![v("a1", 3, t0), v("a2", 2, t0)]),
            cand("b", 0, vec![v("b1", 3, t0), v("b2", -5, t0)]),
        ];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        // Then the fewest victims.
        let c = [
            cand("a", 0, vec![v("a1", 0, t0), v("a2", 0, t0)]),
            cand("b", 0, vec![v("b1", 0, t0)]),
        ];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        // Then the latest start among the most important victims.
        let c = [
            cand("a", 0, vec![v("a1", 0, t0)]),
            cand("b", 0, vec![v("b1", 0, t1)]),
        ];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        // A node needing no victim at all wins outright.
        let c = [cand("a", 0, vec![v("a1", 0, t0)]), cand("b", 3, vec![])];
        assert_eq!(c[pick(&c).unwrap()].node, "b");
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn nominated_pods_hold_their_room_against_lower_and_equal_priority() {
        let mut c = cache(&[cpu_node("a", "4")], &[]);
        let nominee = prio("nominee", 10, "3", json!({}));
        c.nominate(nominee.clone(), "a");
        let mut alg = Algorithm::new(None);
        for p in [
            prio("low", 1, "2", json!({})),
            prio("equal", 10, "2", json!({})),
        ] {
            let err = alg.schedule(&mut c, &p).unwrap_err();
            assert_eq!(
                err.to_string(),
                "0/1 nodes are available: 1 Insufficient cpu."
            );
        }
        // A higher priority pod ignores the nomination, and the nominee itself sees no
        // double count.
        assert_eq!(
            alg.schedule(&mut c, &prio("higher", 11, "2", json!({})))
                .unwrap()
                .node,
            "a"
        );
        assert_eq!(alg.schedule(&mut c, &nominee).unwrap().node, "a");
        // Cleared (the nominee bound elsewhere, or gave up): the room is free again.
        assert_eq!(c.clear_nomination(&nominee.uid).as_deref(), Some("a"));
        assert!(c.nominated_on("a").is_empty());
        assert_eq!(
            alg.schedule(&mut c, &prio("low", 1, "2", json!({})))
                .unwrap()
                .node,
            "a"
        );
    }

    #[test]
    fn a_nominee_waits_for_its_victims_and_lower_nominees_lose_the_node() {
        let going = pod(
            json!({"metadata": {"name": "victim", "labels": {"app": "v"},
                "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"priority": 1, "containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": "2"}}}]},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "PreemptionByScheduler"}]}}),
        );
        let mut c = cache(
            &[cpu_node("a", "2"), cpu_node("b", "2")],
            &[(going, "a"), (prio("other", 1, "2", json!({})), "b")],
        );
        let hi = prio("hi", 10, "2", json!({}));
        c.nominate(hi.clone(), "a");
        assert_eq!(
            preempt(&mut c, &hi, 0).message().unwrap(),
            "preemption: not eligible due to a terminating pod on the nominated node."
        );

        // A yet higher pod preempting on the node of a lower nominee takes the nomination.
        let mut c = cache(
            &[cpu_node("a", "2")],
            &[(prio("low", 1, "2", json!({})), "a")],
        );
        let mid = prio("mid", 5, "2", json!({}));
        c.nominate(mid.clone(), "a");
        let (cand, lower) = preempted(preempt(&mut c, &prio("top", 9, "2", json!({})), 0));
        assert_eq!(cand.node, "a");
        assert_eq!(names(&lower), ["mid"]);
    }
}
