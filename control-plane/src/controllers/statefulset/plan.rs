//! What one sync of a StatefulSet does, as a pure function of the set, its pods and its two
//! revisions (Kubernetes' `updateStatefulSet`):
//!
//! - pods `<set>-<ordinal>` for ordinals `start .. start+replicas`; others are condemned;
//! - in order: a failed or succeeded pod is deleted (recreated next), a missing pod is
//!   created (at the current revision below the partition, else the update revision), a pod
//!   with the wrong identity is fixed; under OrderedReady each step waits until every pod
//!   before it is Running and Ready (and available after minReadySeconds), Parallel does not;
//! - condemned pods go from the highest ordinal down, one at a time under OrderedReady;
//! - RollingUpdate: once every pod is healthy, the highest ordinal at or above the partition
//!   that is not at the update revision is deleted (recreated at it next); with maxUnavailable
//!   up to that many at once; OnDelete leaves pods alone;
//! - status: replicas, ready, available, current and updated counts, the revisions, and the
//!   update revision becomes current once every pod runs it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::controllers::deployment::util::scaled_value;
use crate::controllers::pods;

/// The label naming the revision a pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// Which revision a new pod is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revision {
    Current,
    Update,
}

/// Why a pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// It failed or exited; it is recreated.
    Finished,
    /// Its ordinal is beyond the replicas.
    Condemned,
    /// It runs an old revision (rolling update).
    Update,
}

#[derive(Clone, Debug)]
pub enum Step {
    Create {
        ordinal: i32,
        revision: Revision,
    },
    Delete {
        pod: Arc<Pod>,
        why: Why,
    },
    /// Its labels, hostname or subdomain lost the set's identity.
    FixIdentity {
        pod: Arc<Pod>,
    },
}

#[derive(Debug)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub status: StatefulSetStatus,
    /// Look again then (minReadySeconds).
    pub requeue: Option<Duration>,
    /// Ordinals whose claims belong to condemned pods (retention whenScaled).
    pub condemned: Vec<i32>,
}

/// The revision names the sync works with.
pub struct Revisions<'a> {
    pub current: &'a str,
    pub update: &'a str,
    pub collision_count: i32,
}

/// `web-3` of set `web` -> 3.
pub fn ordinal(set: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(set)?
        .strip_prefix('-')?
        .parse::<i32>()
        .ok()
        .filter(|o| *o >= 0)
}

pub fn pod_name(set: &str, ordinal: i32) -> String {
    format!("{set}-{ordinal}")
}

pub fn revision_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
        .unwrap_or("")
}

fn running_and_ready(p: &Pod) -> bool {
    pods::phase(p) == "Running" && pods::is_ready(p)
}

fn finished(p: &Pod) -> bool {
    matches!(pods::phase(p), "Succeeded" | "Failed")
}

/// Whether the pod carries the identity the set gives it.
pub fn identity_matches(set: &StatefulSet, p: &Pod, ordinal: i32) -> bool {
    let name = set.name_any();
    let want = pod_name(&name, ordinal);
    let labels = p.labels();
    let spec = p.spec.as_ref();
    let service = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    p.name_any() == want
        && labels.get(POD_NAME_LABEL) == Some(&want)
        && labels.get(POD_INDEX_LABEL) == Some(&ordinal.to_string())
        && spec.and_then(|s| s.hostname.as_deref()) == Some(want.as_str())
        && spec
            .and_then(|s| s.subdomain.clone())
            .filter(|s| !s.is_empty())
            == service
}

/// Plans one sync of `set` with its `pods` (those it controls).
pub fn plan(
    set: &StatefulSet,
    set_pods: &[Arc<Pod>],
    revs: &Revisions<'_>,
    now: Timestamp,
) -> Plan {
    let spec = set.spec.clone().unwrap_or_default();
    let name = set.name_any();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let min_ready =
        Duration::from_secs(u64::try_from(spec.min_ready_seconds.unwrap_or(0)).unwrap_or(0));
    let available = |p: &Pod| running_and_ready(p) && pods::is_available(p, min_ready, now);
    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("RollingUpdate")
        == "RollingUpdate";
    let partition = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .max(0);

    let mut slots: BTreeMap<i32, Arc<Pod>> = BTreeMap::new();
    let mut condemned: Vec<(i32, Arc<Pod>)> = vec![];
    for p in set_pods {
        let Some(o) = ordinal(&name, &p.name_any()) else {
            continue;
        };
        if o >= start && o < start + replicas {
            slots.insert(o, p.clone());
        } else {
            condemned.push((o, p.clone()));
        }
    }
    condemned.sort_by_key(|c| std::cmp::Reverse(c.0));

    let mut plan = Plan {
        steps: vec![],
        status: status(set, set_pods, revs, rolling),
        requeue: None,
        condemned: condemned.iter().map(|(o, _)| *o).collect(),
    };
    if set.metadata.deletion_timestamp.is_some() {
        return plan;
    }
    // The first pod in order that is not healthy may still be deleted when condemned.
    let first_unhealthy = slots
        .values()
        .chain(condemned.iter().map(|(_, p)| p))
        .find(|p| !running_and_ready(p) || pods::is_terminating(p))
        .map(|p| p.name_any());

    // Replicas, in order.
    for o in start..start + replicas {
        let Some(p) = slots.get(&o) else {
            // Below the partition a recreated pod keeps the current revision.
            let revision =
                if rolling && o < start + partition.min(replicas) && revs.current != revs.update {
                    Revision::Current
                } else {
                    Revision::Update
                };
            plan.steps.push(Step::Create {
                ordinal: o,
                revision,
            });
            if monotonic {
                return plan;
            }
            continue;
        };
        if finished(p) {
            if !pods::is_terminating(p) {
                plan.steps.push(Step::Delete {
                    pod: p.clone(),
                    why: Why::Finished,
                });
            }
            if monotonic {
                return plan;
            }
            continue;
        }
        if pods::is_terminating(p) && monotonic {
            return plan;
        }
        if !running_and_ready(p) && monotonic {
            return plan;
        }
        if !available(p) && monotonic {
            plan.requeue = Some(min_ready);
            return plan;
        }
        if !pods::is_terminating(p) && !identity_matches(set, p, o) {
            plan.steps.push(Step::FixIdentity { pod: p.clone() });
        }
    }

    // Condemned pods, highest ordinal first.
    for (_, p) in &condemned {
        if pods::is_terminating(p) {
            if monotonic {
                return plan;
            }
            continue;
        }
        let is_first_unhealthy = first_unhealthy.as_deref() == Some(p.name_any().as_str());
        if monotonic && !running_and_ready(p) && !is_first_unhealthy {
            return plan;
        }
        plan.steps.push(Step::Delete {
            pod: p.clone(),
            why: Why::Condemned,
        });
        if monotonic {
            return plan;
        }
    }

    if !rolling {
        return plan;
    }
    // Rolling update: highest ordinal first, down to the partition.
    let max_unavailable = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.as_ref())
        .map(|m| scaled_value(Some(m), replicas, "1", false).max(1))
        .unwrap_or(1);
    let unavailable = slots
        .values()
        .filter(|p| !available(p) || pods::is_terminating(p))
        .count();
    let mut budget = usize::try_from(max_unavailable)
        .unwrap_or(1)
        .saturating_sub(unavailable);
    for o in (start + partition.min(replicas)..start + replicas).rev() {
        let Some(p) = slots.get(&o) else { continue };
        if revision_of(p) != revs.update && !pods::is_terminating(p) {
            if budget == 0 {
                break;
            }
            plan.steps.push(Step::Delete {
                pod: p.clone(),
                why: Why::Update,
            });
            budget -= 1;
            continue;
        }
        if !available(p) && max_unavailable == 1 {
            // Wait for the replacement before touching the next one.
            break;
        }
    }
    plan
}

/// The status of `set` with `pods` (Kubernetes counts every pod it controls).
fn status(
    set: &StatefulSet,
    set_pods: &[Arc<Pod>],
    revs: &Revisions<'_>,
    rolling: bool,
) -> StatefulSetStatus {
    let spec = set.spec.clone().unwrap_or_default();
    let min_ready =
        Duration::from_secs(u64::try_from(spec.min_ready_seconds.unwrap_or(0)).unwrap_or(0));
    let now = Timestamp::now();
    let count = |f: &dyn Fn(&Pod) -> bool| {
        i32::try_from(set_pods.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let replicas = count(&|_| true);
    let ready = count(&running_and_ready);
    let available = count(&|p| running_and_ready(p) && pods::is_available(p, min_ready, now));
    let live = |p: &Pod| !pods::is_terminating(p);
    let mut current = count(&|p| live(p) && revision_of(p) == revs.current);
    let updated = count(&|p| live(p) && revision_of(p) == revs.update);
    let mut current_revision = revs.current.to_string();
    let want = spec.replicas.unwrap_or(1);
    if rolling && updated == want && ready == want && replicas == want {
        // The rolling update is complete: the update revision is now current.
        current_revision = revs.update.to_string();
        current = updated;
    }
    StatefulSetStatus {
        replicas,
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        current_replicas: Some(current),
        updated_replicas: Some(updated),
        current_revision: Some(current_revision),
        update_revision: Some(revs.update.to_string()),
        collision_count: Some(revs.collision_count),
        observed_generation: set.metadata.generation,
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(extra: serde_json::Value) -> StatefulSet {
        let mut v = json!({"metadata": {"name": "web", "namespace": "default", "generation": 2},
            "spec": {"replicas": 3, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        if let (Some(a), serde_json::Value::Object(b)) = (v["spec"].as_object_mut(), extra) {
            a.extend(b);
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(o: i32, rev: &str, ready: bool) -> Arc<Pod> {
        let name = format!("web-{o}");
        Arc::new(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "web", REVISION_LABEL: rev,
                POD_NAME_LABEL: name, POD_INDEX_LABEL: o.to_string()}},
            "spec": {"hostname": name, "subdomain": "web", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        })).unwrap())
    }

    const SAME: Revisions<'static> = Revisions {
        current: "r1",
        update: "r1",
        collision_count: 0,
    };
    const ROLL: Revisions<'static> = Revisions {
        current: "r1",
        update: "r2",
        collision_count: 0,
    };

    fn creates(p: &Plan) -> Vec<i32> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Create { ordinal, .. } => Some(*ordinal),
                _ => None,
            })
            .collect()
    }

    fn deletes(p: &Plan) -> Vec<String> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Delete { pod, .. } => Some(pod.name_any()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn ordered_ready_starts_one_at_a_time() {
        let now = Timestamp::now();
        let s = set(json!({}));
        assert_eq!(creates(&plan(&s, &[], &SAME, now)), [0]);
        assert!(
            creates(&plan(&s, &[pod(0, "r1", false)], &SAME, now)).is_empty(),
            "waits for web-0"
        );
        assert_eq!(creates(&plan(&s, &[pod(0, "r1", true)], &SAME, now)), [1]);
        let par = set(json!({"podManagementPolicy": "Parallel"}));
        assert_eq!(creates(&plan(&par, &[], &SAME, now)), [0, 1, 2]);
        assert_eq!(ordinal("web", "web-12"), Some(12));
        assert_eq!(ordinal("web", "webx-1"), None);
    }

    #[test]
    fn scale_down_goes_from_the_highest_ordinal() {
        let now = Timestamp::now();
        let s = set(json!({"replicas": 1}));
        let all = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)];
        let p = plan(&s, &all, &SAME, now);
        assert_eq!(deletes(&p), ["web-2"]);
        assert_eq!(p.condemned, [2, 1]);
        assert_eq!(p.status.replicas, 3);
    }

    #[test]
    fn rolling_update_respects_the_partition() {
        let now = Timestamp::now();
        let s = set(
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}}),
        );
        let all = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)];
        assert_eq!(deletes(&plan(&s, &all, &ROLL, now)), ["web-2"]);
        let after = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", true)];
        let p = plan(&s, &after, &ROLL, now);
        assert_eq!(deletes(&p), ["web-1"]);
        let done = [pod(0, "r1", true), pod(1, "r2", true), pod(2, "r2", true)];
        let p = plan(&s, &done, &ROLL, now);
        assert!(deletes(&p).is_empty(), "web-0 is below the partition");
        assert_eq!(p.status.updated_replicas, Some(2));
        assert_eq!(p.status.current_revision.as_deref(), Some("r1"));
        // A recreated pod below the partition keeps the current revision.
        let missing0 = [pod(1, "r2", true), pod(2, "r2", true)];
        let p = plan(&s, &missing0, &ROLL, now);
        assert!(matches!(
            p.steps[0],
            Step::Create {
                ordinal: 0,
                revision: Revision::Current
            }
        ));
        // With partition 0 every pod moves and the update revision becomes current.
        let s0 = set(json!({}));
        let all_new = [pod(0, "r2", true), pod(1, "r2", true), pod(2, "r2", true)];
        let p = plan(&s0, &all_new, &ROLL, now);
        assert_eq!(p.status.current_revision.as_deref(), Some("r2"));
        assert_eq!(p.status.current_replicas, Some(3));
        let on_delete = set(json!({"updateStrategy": {"type": "OnDelete"}}));
        assert!(deletes(&plan(&on_delete, &all, &ROLL, now)).is_empty());
    }

    #[test]
    fn max_unavailable_rolls_several_pods_at_once() {
        let now = Timestamp::now();
        let with = |m: serde_json::Value, extra: serde_json::Value| {
            let mut v = json!({"updateStrategy": {"type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": m}}});
            if let (Some(a), serde_json::Value::Object(b)) = (v.as_object_mut(), extra) {
                a.extend(b);
            }
            set(v)
        };
        let old = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)];
        // Two at once, from the highest ordinal.
        let p = plan(&with(json!(2), json!({})), &old, &ROLL, now);
        assert_eq!(deletes(&p), ["web-2", "web-1"]);
        assert!(p.steps.iter().all(|s| matches!(
            s,
            Step::Delete {
                why: Why::Update,
                ..
            }
        )));
        // More than the replicas: every pod at once.
        let p = plan(&with(json!(5), json!({})), &old, &ROLL, now);
        assert_eq!(deletes(&p), ["web-2", "web-1", "web-0"]);
        // The partition still bounds it.
        let partitioned = set(json!({"updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 3, "partition": 1}}}));
        let p = plan(&partitioned, &old, &ROLL, now);
        assert_eq!(deletes(&p), ["web-2", "web-1"]);
        // A percentage of the replicas, rounded down: 50% of 4 is 2, 50% of 3 is 1, and
        // never less than one.
        let four = [
            pod(0, "r1", true),
            pod(1, "r1", true),
            pod(2, "r1", true),
            pod(3, "r1", true),
        ];
        let p = plan(
            &with(json!("50%"), json!({"replicas": 4})),
            &four,
            &ROLL,
            now,
        );
        assert_eq!(deletes(&p), ["web-3", "web-2"]);
        let p = plan(&with(json!("50%"), json!({})), &old, &ROLL, now);
        assert_eq!(deletes(&p), ["web-2"]);
        let p = plan(&with(json!("10%"), json!({})), &old, &ROLL, now);
        assert_eq!(deletes(&p), ["web-2"]);
        // Pods already at the update revision are skipped, not counted.
        let half = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", true)];
        let p = plan(&with(json!(2), json!({})), &half, &ROLL, now);
        assert_eq!(deletes(&p), ["web-1", "web-0"]);
    }

    #[test]
    fn max_unavailable_counts_pods_already_unavailable() {
        let now = Timestamp::now();
        // Parallel, so that an unready pod does not stop the sync before the update.
        let s = set(json!({"podManagementPolicy": "Parallel", "replicas": 4,
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}));
        let mut terminating = (*pod(3, "r1", true)).clone();
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        // web-3 is on its way out (being updated): one more may go.
        let all = [
            pod(0, "r1", true),
            pod(1, "r1", true),
            pod(2, "r1", true),
            Arc::new(terminating),
        ];
        assert_eq!(deletes(&plan(&s, &all, &ROLL, now)), ["web-2"]);
        // web-3 is back at the update revision but not Ready yet, web-2 is going: none.
        let mut going = (*pod(2, "r1", true)).clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        let all = [
            pod(0, "r1", true),
            pod(1, "r1", true),
            Arc::new(going),
            pod(3, "r2", false),
        ];
        assert!(deletes(&plan(&s, &all, &ROLL, now)).is_empty());
        // An unready pod below the partition counts as well.
        let s = set(json!({"podManagementPolicy": "Parallel", "replicas": 4,
            "updateStrategy": {"type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 2, "partition": 2}}}));
        let all = [
            pod(0, "r1", false),
            pod(1, "r1", true),
            pod(2, "r1", true),
            pod(3, "r1", true),
        ];
        assert_eq!(deletes(&plan(&s, &all, &ROLL, now)), ["web-3"]);
        // With the default of one, the update waits for the replacement to be Ready.
        let s = set(json!({"podManagementPolicy": "Parallel"}));
        let all = [pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", false)];
        assert!(deletes(&plan(&s, &all, &ROLL, now)).is_empty());
        // Under OrderedReady an unready pod stops the sync before any update.
        let s = set(json!({"updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 3}}}));
        let all = [pod(0, "r1", true), pod(1, "r1", false), pod(2, "r1", true)];
        assert!(plan(&s, &all, &ROLL, now).steps.is_empty());
    }

    #[test]
    fn failed_pods_are_replaced_and_identity_fixed() {
        let now = Timestamp::now();
        let s = set(json!({}));
        let mut failed = (*pod(1, "r1", false)).clone();
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let all = [pod(0, "r1", true), Arc::new(failed), pod(2, "r1", true)];
        let p = plan(&s, &all, &SAME, now);
        assert_eq!(deletes(&p), ["web-1"]);
        let mut lost = (*pod(0, "r1", true)).clone();
        lost.spec.as_mut().unwrap().hostname = None;
        let p = plan(
            &s,
            &[Arc::new(lost), pod(1, "r1", true), pod(2, "r1", true)],
            &SAME,
            now,
        );
        assert!(matches!(&p.steps[0], Step::FixIdentity { pod } if pod.name_any() == "web-0"));
    }
}
