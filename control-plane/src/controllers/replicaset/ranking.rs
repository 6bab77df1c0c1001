//! Which pods a ReplicaSet deletes first when it scales down: Kubernetes' ActivePodsWithRanks
//! preferences (with the LogarithmicScaleDown and PodDeletionCost features on, as in 1.33):
//! unscheduled before scheduled, Pending before Unknown before Running, not ready before
//! ready, lower `controller.kubernetes.io/pod-deletion-cost` first, pods doubled up on a node
//! with their siblings first, ready for a shorter time first (in log2 buckets), more restarts
//! first, newer first (in log2 buckets), then by uid.
//!
//! Upstream's `Less` is not a total order: two ready times in the same log2 bucket fall back
//! to the uid while two equal ready times go on to restarts and creation, so a < b < c < a
//! can happen. Go's sort tolerates that; Rust's sorts may panic on it. Here each pod gets a
//! [`RankKey`] computed once (with one `now`), and keys compare lexicographically: a total
//! order by construction that keeps every preference above. The one refinement: ready times
//! in the same bucket go on to restarts and creation instead of straight to the uid, as
//! equal ready times already do upstream.

use std::cmp::Reverse;
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

/// log2 of the age in nanoseconds, -1 for an age of zero or less (Kubernetes'
/// logarithmicRankDiff buckets); `None` (no time at all) sorts before every bucket.
fn log_bucket(t: Option<Timestamp>, now: Timestamp) -> Option<i64> {
    t.map(|t| {
        let d = now.as_nanosecond() - t.as_nanosecond();
        if d > 0 {
            (d as f64).log2() as i64
        } else {
            -1
        }
    })
}

/// A pod's place in the deletion order: smaller keys are deleted first. Fields in order of
/// precedence; every one is totally ordered, so the tuple is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RankKey {
    scheduled: bool,
    phase: u8,
    ready: bool,
    deletion_cost: i32,
    /// More siblings on the pod's node first.
    doubled_up: Reverse<usize>,
    /// For ready pods only: the ready time's bucket, newer (smaller) first.
    ready_bucket: Option<i64>,
    restarts: Reverse<i32>,
    created_bucket: Option<i64>,
    uid: String,
}

impl RankKey {
    /// `siblings`: active pods of the same controller on the pod's node.
    pub fn of(p: &Pod, siblings: usize, now: Timestamp) -> RankKey {
        let ready = pods::is_ready(p);
        RankKey {
            scheduled: pods::node_name(p).is_some(),
            phase: phase_rank(p),
            ready,
            deletion_cost: deletion_cost(p),
            doubled_up: Reverse(siblings),
            ready_bucket: if ready {
                log_bucket(pods::ready_since(p), now)
            } else {
                None
            },
            restarts: Reverse(pods::max_restarts(p)),
            created_bucket: log_bucket(p.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
            uid: p.uid().unwrap_or_default(),
        }
    }
}

/// The `n` pods of `candidates` to delete first. `related` are the active pods of the
/// ReplicaSet and its siblings (same controller), for the doubled-up rank.
pub fn pods_to_delete(
    candidates: Vec<Arc<Pod>>,
    related: &[Arc<Pod>],
    n: usize,
    now: Timestamp,
) -> Vec<Arc<Pod>> {
    if n >= candidates.len() {
        return candidates;
    }
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for p in related {
        if let Some(node) = pods::node_name(p) {
            *on_node.entry(node).or_default() += 1;
        }
    }
    let siblings = |p: &Pod| pods::node_name(p).map_or(0, |n| on_node.get(n).copied().unwrap_or(0));
    let mut ranked: Vec<(RankKey, Arc<Pod>)> = candidates
        .into_iter()
        .map(|p| (RankKey::of(&p, siblings(&p), now), p))
        .collect();
    // Only the first n matter: partition around the n-th, then order those.
    ranked.select_nth_unstable_by(n, |a, b| a.0.cmp(&b.0));
    ranked.truncate(n);
    ranked.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    ranked.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

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

    /// A pod whose fields collide with others often: few nodes, few phases, times from a
    /// handful of values that share log2 buckets (and are sometimes equal).
    fn arb_pod(i: usize) -> impl Strategy<Value = Arc<Pod>> {
        (
            prop::option::of(0..3u8),
            0..3u8,
            prop::option::of(0..6usize),
            0..3i32,
            prop::option::of(-1..2i32),
            0..6usize,
        )
            .prop_map(move |(node, phase, ready, restarts, cost, created)| {
                // Seconds before NOW: 1000 and 1001 share a bucket, 1000 and 2000 do not.
                const AGES: [i64; 6] = [1000, 1001, 1003, 2000, 2001, 500_000];
                let node = node.map(|n| format!("n{n}"));
                let phase = ["Pending", "Unknown", "Running"][phase as usize];
                let mut p = pod(
                    &format!("p{i:03}"),
                    node.as_deref(),
                    phase,
                    ready.map(|r| NOW - AGES[r]),
                    NOW - AGES[created],
                );
                let m = Arc::make_mut(&mut p);
                if let Some(c) = cost {
                    m.metadata.annotations =
                        Some([(DELETION_COST.to_string(), c.to_string())].into());
                }
                m.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
                    name: "c".into(),
                    restart_count: restarts,
                    ..Default::default()
                }]);
                p
            })
    }

    const NOW: i64 = 1_000_000;

    fn arb_pods(max: usize) -> impl Strategy<Value = Vec<Arc<Pod>>> {
        (1..=max).prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
    }

    fn keys(all: &[Arc<Pod>]) -> Vec<RankKey> {
        let now = Timestamp::from_second(NOW).unwrap();
        let mut on_node: HashMap<String, usize> = HashMap::new();
        for p in all {
            if let Some(n) = pods::node_name(p) {
                *on_node.entry(n.to_string()).or_default() += 1;
            }
        }
        all.iter()
            .map(|p| {
                let s = pods::node_name(p).map_or(0, |n| on_node[n]);
                RankKey::of(p, s, now)
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The deletion order is a total order on pods that collide on every field.
        #[test]
        fn ranking_is_a_total_order(all in arb_pods(40)) {
            skiff_tests::order::assert_total_order(&keys(&all), |a, b| a.cmp(b));
        }

        /// Hundreds of pods: choosing never panics, returns the n first of the full order,
        /// and keeps Kubernetes' leading preferences.
        #[test]
        fn choosing_from_hundreds_keeps_the_preferences(all in arb_pods(400), frac in 0.0..1.0f64) {
            let now = Timestamp::from_second(NOW).unwrap();
            let n = (all.len() as f64 * frac) as usize;
            let chosen = pods_to_delete(all.clone(), &all, n, now);
            prop_assert_eq!(chosen.len(), n);
            let mut sorted: Vec<(RankKey, Arc<Pod>)> = keys(&all).into_iter().zip(all.iter().cloned()).collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let want: Vec<String> = sorted.iter().take(n).map(|(_, p)| p.name_any()).collect();
            prop_assert_eq!(names(&chosen), want);
            for w in sorted.windows(2) {
                let (a, b) = (&w[0].1, &w[1].1);
                // unscheduled, then less advanced phases, then not ready, come first
                let lead = |p: &Pod| (pods::node_name(p).is_some(), phase_rank(p), pods::is_ready(p));
                prop_assert!(lead(a) <= lead(b));
            }
        }
    }

    /// The cycle upstream's Less allows: a < b by uid (ready times differ within a bucket),
    /// b < c by restarts (equal ready times), c < a by uid. Keys put them in one order.
    #[test]
    fn same_bucket_ready_times_do_not_cycle() {
        let mk = |uid: &str, ready_age: i64, restarts: i32| {
            let mut p = pod(
                uid,
                Some("n1"),
                "Running",
                Some(NOW - ready_age),
                NOW - 10_000,
            );
            Arc::make_mut(&mut p)
                .status
                .as_mut()
                .unwrap()
                .container_statuses = Some(vec![ContainerStatus {
                name: "c".into(),
                restart_count: restarts,
                ..Default::default()
            }]);
            p
        };
        let (a, b, c) = (
            mk("b-uid", 1000, 0),
            mk("c-uid", 1001, 5),
            mk("a-uid", 1001, 0),
        );
        let all = vec![a, b, c];
        let k = keys(&all);
        skiff_tests::order::assert_total_order(&k, |x, y| x.cmp(y));
        // more restarts goes first; the others share every bucket, so the uid decides
        let now = Timestamp::from_second(NOW).unwrap();
        assert_eq!(
            names(&pods_to_delete(all.clone(), &all, 2, now)),
            ["c-uid", "a-uid"]
        );
    }
}
