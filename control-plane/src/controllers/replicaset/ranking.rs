//! Which pods a ReplicaSet deletes first when it scales down: Kubernetes' ActivePodsWithRanks
//! order (with the LogarithmicScaleDown and PodDeletionCost features on, as in 1.33):
//! unscheduled before scheduled, Pending before Unknown before Running, not ready before
//! ready, lower `controller.kubernetes.io/pod-deletion-cost` first, pods doubled up on a node
//! with their siblings first, ready for a shorter time first (in log2 buckets), more restarts
//! first, newer first (in log2 buckets), then by uid.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::controllers::pods;

const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn phase_rank(p: &Pod) -> u8 {
    match pods::phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn deletion_cost(p: &Pod) -> i32 {
    p.annotations()
        .get(DELETION_COST)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// log2 of the age in nanoseconds, -1 for no age (Kubernetes' logarithmicRankDiff buckets).
fn log_bucket(t: Timestamp, now: Timestamp) -> i64 {
    let d = now.as_nanosecond() - t.as_nanosecond();
    if d > 0 {
        (d as f64).log2() as i64
    } else {
        -1
    }
}

/// Orders two optional times: a missing one first, then the later (newer) one first.
fn newer_first(a: Option<Timestamp>, b: Option<Timestamp>, now: Timestamp) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => log_bucket(a, now).cmp(&log_bucket(b, now)),
    }
}

/// Compares two pods; `Less` means "delete `a` before `b`". `rank` counts the siblings on the
/// pod's node.
fn compare(a: &Pod, ra: usize, b: &Pod, rb: usize, now: Timestamp) -> Ordering {
    let (na, nb) = (pods::node_name(a), pods::node_name(b));
    if na != nb && (na.is_none() || nb.is_none()) {
        return if na.is_none() {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    let by_phase = phase_rank(a).cmp(&phase_rank(b));
    if by_phase != Ordering::Equal {
        return by_phase;
    }
    let (ready_a, ready_b) = (pods::is_ready(a), pods::is_ready(b));
    if ready_a != ready_b {
        return if ready_a {
            Ordering::Greater
        } else {
            Ordering::Less
        };
    }
    let by_cost = deletion_cost(a).cmp(&deletion_cost(b));
    if by_cost != Ordering::Equal {
        return by_cost;
    }
    if ra != rb {
        return rb.cmp(&ra);
    }
    let uid = || a.uid().cmp(&b.uid());
    if ready_a {
        let (ta, tb) = (pods::ready_since(a), pods::ready_since(b));
        if ta != tb {
            return match newer_first(ta, tb, now) {
                Ordering::Equal => uid(),
                o => o,
            };
        }
    }
    let by_restarts = pods::max_restarts(b).cmp(&pods::max_restarts(a));
    if by_restarts != Ordering::Equal {
        return by_restarts;
    }
    let (ca, cb) = (
        a.metadata.creation_timestamp.as_ref().map(|t| t.0),
        b.metadata.creation_timestamp.as_ref().map(|t| t.0),
    );
    if ca != cb {
        return match newer_first(ca, cb, now) {
            Ordering::Equal => uid(),
            o => o,
        };
    }
    Ordering::Equal
}

/// The `n` pods of `candidates` to delete first. `related` are the active pods of the
/// ReplicaSet and its siblings (same controller), for the doubled-up rank.
pub fn pods_to_delete(
    mut candidates: Vec<Arc<Pod>>,
    related: &[Arc<Pod>],
    n: usize,
    now: Timestamp,
) -> Vec<Arc<Pod>> {
    if n < candidates.len() {
        let mut on_node: HashMap<&str, usize> = HashMap::new();
        for p in related {
            if let Some(node) = pods::node_name(p) {
                *on_node.entry(node).or_default() += 1;
            }
        }
        let rank = |p: &Pod| pods::node_name(p).map_or(0, |n| on_node.get(n).copied().unwrap_or(0));
        candidates.sort_by(|a, b| compare(a, rank(a), b, rank(b), now));
    }
    candidates.truncate(n);
    candidates
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(
        name: &str,
        node: Option<&str>,
        phase: &str,
        ready_at: Option<i64>,
        created: i64,
    ) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(name.into());
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        p.spec = Some(PodSpec {
            node_name: node.map(str::to_string),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: ready_at.map(|t| {
                vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(Timestamp::from_second(t).unwrap())),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        Arc::new(p)
    }

    fn names(v: &[Arc<Pod>]) -> Vec<String> {
        v.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn unscheduled_pending_and_unready_go_first() {
        let now = Timestamp::from_second(100_000).unwrap();
        let all = vec![
            pod("running-ready", Some("n1"), "Running", Some(10), 1),
            pod("unscheduled", None, "Pending", None, 1),
            pod("running-unready", Some("n1"), "Running", None, 1),
            pod("pending", Some("n1"), "Pending", None, 1),
        ];
        let order = pods_to_delete(all.clone(), &all, 3, now);
        assert_eq!(names(&order), ["unscheduled", "pending", "running-unready"]);
    }

    #[test]
    fn doubled_up_then_newer_go_first() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let a = pod("alone", Some("n1"), "Running", Some(10), 1);
        let b = pod("crowded", Some("n2"), "Running", Some(10), 1);
        let sibling = pod("sibling", Some("n2"), "Running", Some(10), 1);
        let order = pods_to_delete(vec![a.clone(), b.clone()], &[a, b, sibling], 1, now);
        assert_eq!(names(&order), ["crowded"]);

        // Ready much more recently (another log2 bucket): deleted first.
        let old = pod("old", Some("n1"), "Running", Some(10), 1);
        let young = pod("young", Some("n2"), "Running", Some(999_990), 1);
        let order = pods_to_delete(vec![old.clone(), young.clone()], &[old, young], 1, now);
        assert_eq!(names(&order), ["young"]);
    }

    #[test]
    fn deleting_everything_keeps_the_input() {
        let now = Timestamp::from_second(10).unwrap();
        let all = vec![
            pod("a", None, "Pending", None, 1),
            pod("b", None, "Pending", None, 2),
        ];
        assert_eq!(pods_to_delete(all.clone(), &all, 2, now).len(), 2);
    }
}
