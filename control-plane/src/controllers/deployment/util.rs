//! The pure arithmetic of Deployments (Kubernetes' deploymentutil): the pod-template hash,
//! revision and replica annotations, maxSurge/maxUnavailable fenceposts, how many replicas a
//! new ReplicaSet may have, proportional scaling, status and the Progressing/Available
//! conditions, and when a rollout is complete, progressing or timed out.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const DEPRECATED_ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
/// The longest revision-history annotation kept (Kubernetes' maxRevHistoryLengthInChars).
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

// Condition types and reasons, as Kubernetes spells them.
pub const PROGRESSING: &str = "Progressing";
pub const AVAILABLE: &str = "Available";
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";
pub const MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// Kubernetes' rand.SafeEncodeString alphabet: no vowels, no look-alikes.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The pod-template-hash of a template, as Kubernetes' ComputeHash: FNV-32a over the
/// template (here its canonical JSON) and the collision count (little-endian, 8 bytes), the
/// decimal of the sum encoded with the safe alphabet.
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let mut write = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    write(&serde_json::to_vec(template).unwrap_or_default());
    if let Some(c) = collision_count {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&(c as u32).to_le_bytes());
        write(&bytes);
    }
    h.to_string()
        .bytes()
        .map(|d| SAFE_ALPHABET[usize::from(d) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// Whether two templates are equal apart from the pod-template-hash label.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    fn strip(t: &PodTemplateSpec) -> PodTemplateSpec {
        let mut t = t.clone();
        if let Some(m) = t.metadata.as_mut() {
            if let Some(l) = m.labels.as_mut() {
                l.remove(POD_TEMPLATE_HASH);
                if l.is_empty() {
                    m.labels = None;
                }
            }
        }
        t
    }
    strip(a) == strip(b)
}

pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

/// The revision annotation of a ReplicaSet (0 if absent or unparsable).
pub fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn max_revision(sets: &[Arc<ReplicaSet>]) -> i64 {
    sets.iter().map(|rs| revision(rs)).max().unwrap_or(0)
}

pub fn is_rolling(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

pub fn is_recreate(d: &Deployment) -> bool {
    !is_rolling(d)
}

/// An int-or-percent of `total` (percentages rounded up or down).
pub fn scaled_value(v: Option<&IntOrString>, total: i32, default: &str, round_up: bool) -> i32 {
    let v = v
        .cloned()
        .unwrap_or_else(|| IntOrString::String(default.into()));
    match v {
        IntOrString::Int(i) => i,
        IntOrString::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let scaled = pct * i64::from(total);
            let value = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(value).unwrap_or(i32::MAX)
        }
    }
}

/// (maxSurge, maxUnavailable) resolved against the replica count; both zero means 1
/// unavailable (Kubernetes' ResolveFenceposts).
pub fn fenceposts(d: &Deployment) -> (i32, i32) {
    let desired = replicas(d);
    let ru = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = scaled_value(ru.and_then(|r| r.max_surge.as_ref()), desired, "25%", true);
    let unavailable = scaled_value(
        ru.and_then(|r| r.max_unavailable.as_ref()),
        desired,
        "25%",
        false,
    );
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling(d) {
        return 0;
    }
    fenceposts(d).0
}

pub fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling(d) || replicas(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(replicas(d))
}

/// Sum of spec.replicas.
pub fn replica_count(sets: &[Arc<ReplicaSet>]) -> i32 {
    sets.iter().map(|rs| rs_replicas(rs)).sum()
}

/// Sum of status.replicas.
pub fn actual_replica_count(sets: &[Arc<ReplicaSet>]) -> i32 {
    sets.iter()
        .map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas))
        .sum()
}

pub fn available_replica_count(sets: &[Arc<ReplicaSet>]) -> i32 {
    sets.iter().map(|rs| rs_available(rs)).sum()
}

pub fn ready_replica_count(sets: &[Arc<ReplicaSet>]) -> i32 {
    sets.iter()
        .map(|rs| {
            rs.status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
        })
        .sum()
}

/// ReplicaSets with replicas wanted.
pub fn active(sets: &[Arc<ReplicaSet>]) -> Vec<Arc<ReplicaSet>> {
    sets.iter()
        .filter(|rs| rs_replicas(rs) > 0)
        .cloned()
        .collect()
}

fn created(rs: &ReplicaSet) -> Option<Timestamp> {
    rs.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// Oldest first; ties by name.
pub fn by_creation(a: &Arc<ReplicaSet>, b: &Arc<ReplicaSet>) -> Ordering {
    created(a)
        .cmp(&created(b))
        .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// Larger first; ties newer first (ReplicaSetsBySizeNewer).
pub fn by_size_newer(a: &Arc<ReplicaSet>, b: &Arc<ReplicaSet>) -> Ordering {
    rs_replicas(b)
        .cmp(&rs_replicas(a))
        .then_with(|| by_creation(b, a))
}

/// Larger first; ties older first (ReplicaSetsBySizeOlder).
pub fn by_size_older(a: &Arc<ReplicaSet>, b: &Arc<ReplicaSet>) -> Ordering {
    rs_replicas(b)
        .cmp(&rs_replicas(a))
        .then_with(|| by_creation(a, b))
}

/// Lower revision first; ties by creation (ReplicaSetsByRevision).
pub fn by_revision(a: &Arc<ReplicaSet>, b: &Arc<ReplicaSet>) -> Ordering {
    revision(a)
        .cmp(&revision(b))
        .then_with(|| by_creation(a, b))
}

/// The new ReplicaSet: the oldest whose template equals the Deployment's.
pub fn find_new(d: &Deployment, sets: &[Arc<ReplicaSet>]) -> Option<Arc<ReplicaSet>> {
    let template = d.spec.as_ref()?.template.clone();
    let mut sorted = sets.to_vec();
    sorted.sort_by(by_creation);
    sorted.into_iter().find(|rs| {
        rs.spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .is_some_and(|t| equal_ignore_hash(t, &template))
    })
}

/// How many replicas the new ReplicaSet should have now, `total` being the pods the
/// Deployment has (Kubernetes counts spec.replicas; the caller also counts pods of
/// scaled-down ReplicaSets not yet marked for deletion, so that maxSurge holds for pods and
/// not only for ReplicaSet sizes).
pub fn new_rs_new_replicas(d: &Deployment, total: i32, new_rs: &ReplicaSet) -> i32 {
    let want = replicas(d);
    if !is_rolling(d) {
        return want;
    }
    let current = rs_replicas(new_rs);
    let max_total = want + max_surge(d);
    if total >= max_total {
        return current;
    }
    let up = (max_total - total).min(want - current).max(0);
    current + up
}

/// Sets the desired- and max-replicas annotations; true if they changed.
pub fn set_replicas_annotations(
    annotations: &mut BTreeMap<String, String>,
    desired: i32,
    max: i32,
) -> bool {
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if annotations.get(k) != Some(&v) {
            annotations.insert(k.to_string(), v);
            changed = true;
        }
    }
    changed
}

pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    let a = rs.annotations();
    a.get(DESIRED_REPLICAS) != Some(&desired.to_string())
        || a.get(MAX_REPLICAS) != Some(&max.to_string())
}

pub fn desired_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    rs.annotations().get(DESIRED_REPLICAS)?.parse().ok()
}

fn max_replicas_annotation(rs: &ReplicaSet) -> Option<i32> {
    rs.annotations().get(MAX_REPLICAS)?.parse().ok()
}

fn skip_copy(key: &str) -> bool {
    matches!(
        key,
        LAST_APPLIED
            | REVISION
            | REVISION_HISTORY
            | DESIRED_REPLICAS
            | MAX_REPLICAS
            | DEPRECATED_ROLLBACK_TO
    )
}

/// Copies the Deployment's annotations onto the new ReplicaSet, raises its revision to
/// `new_revision` (keeping the old one in revision-history on a rollback), and for a
/// ReplicaSet about to be created sets the replica annotations. True if anything changed.
pub fn set_new_rs_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
) -> bool {
    let mut changed = false;
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.annotations() {
        if skip_copy(k) || annotations.get(k) == Some(v) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
        changed = true;
    }
    let old = annotations.get(REVISION).cloned();
    let old_int = match old.as_deref() {
        None | Some("") => 0,
        Some(s) => match s.parse::<i64>() {
            Ok(v) => v,
            Err(_) => return changed,
        },
    };
    if old_int < new_revision {
        annotations.insert(REVISION.to_string(), new_revision.to_string());
        changed = true;
        if let Some(old) = old.filter(|o| !o.is_empty()) {
            let history = annotations
                .get(REVISION_HISTORY)
                .cloned()
                .unwrap_or_default();
            let mut parts: Vec<&str> = history.split(',').filter(|s| !s.is_empty()).collect();
            parts.push(&old);
            while parts.join(",").len() > MAX_REVISION_HISTORY_CHARS && parts.len() > 1 {
                parts.remove(0);
            }
            let joined = parts.join(",");
            annotations.insert(REVISION_HISTORY.to_string(), joined);
        }
    }
    if !exists && set_replicas_annotations(annotations, replicas(d), replicas(d) + max_surge(d)) {
        changed = true;
    }
    changed
}

/// Whether the new ReplicaSet runs every replica, all available.
pub fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    let Some(rs) = rs else { return false };
    desired_replicas_annotation(rs) == Some(replicas(d))
        && rs_available(rs) == replicas(d)
        && rs_replicas(rs) == replicas(d)
}

/// The one active ReplicaSet, or the newest if none is active; None if several are active.
pub fn find_active_or_latest(
    new_rs: Option<&Arc<ReplicaSet>>,
    old: &[Arc<ReplicaSet>],
) -> Option<Arc<ReplicaSet>> {
    if new_rs.is_none() && old.is_empty() {
        return None;
    }
    let mut old = old.to_vec();
    old.sort_by(|a, b| by_creation(b, a));
    let mut all: Vec<Arc<ReplicaSet>> = old.clone();
    all.extend(new_rs.cloned());
    let live = active(&all);
    match live.len() {
        0 => new_rs.cloned().or_else(|| old.first().cloned()),
        1 => live.into_iter().next(),
        _ => None,
    }
}

/// The share of `to_add` (negative: to remove) a ReplicaSet gets in proportional scaling.
pub fn proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = fraction(rs, d);
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

fn fraction(rs: &ReplicaSet, d: &Deployment) -> i32 {
    if replicas(d) == 0 {
        return -rs_replicas(rs);
    }
    let deployment_replicas = replicas(d) + max_surge(d);
    let annotated = max_replicas_annotation(rs)
        .unwrap_or_else(|| d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
    if annotated == 0 {
        return 0;
    }
    let new_size =
        f64::from(rs_replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated);
    (new_size.round() as i32) - rs_replicas(rs)
}

pub fn condition<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets a condition, keeping the old one when status and reason are unchanged and the old
/// transition time when only the reason changes.
pub fn set_condition(status: &mut DeploymentStatus, mut c: DeploymentCondition) {
    if let Some(cur) = condition(status, &c.type_) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_condition(status, &c.type_);
    status.conditions.get_or_insert_with(Vec::new).push(c);
}

pub fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(cs) = status.conditions.as_mut() {
        cs.retain(|c| c.type_ != type_);
    }
}

pub fn progress_deadline(d: &Deployment) -> Option<Duration> {
    let s = d.spec.as_ref()?.progress_deadline_seconds?;
    (s != i32::MAX).then(|| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
}

/// The status the Deployment has given its ReplicaSets (conditions carried over, Available
/// recomputed).
pub fn calculate_status(
    all: &[Arc<ReplicaSet>],
    new_rs: Option<&Arc<ReplicaSet>>,
    d: &Deployment,
    now: Timestamp,
) -> DeploymentStatus {
    let available = available_replica_count(all);
    let total = replica_count(all);
    let old = d.status.clone().unwrap_or_default();
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(actual_replica_count(all)),
        updated_replicas: Some(
            new_rs.map_or(0, |rs| actual_replica_count(std::slice::from_ref(rs))),
        ),
        ready_replicas: Some(ready_replica_count(all)),
        available_replicas: Some(available),
        unavailable_replicas: Some((total - available).max(0)),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: old.terminating_replicas,
    };
    if available >= replicas(d) - max_unavailable(d) {
        set_condition(
            &mut status,
            new_condition(
                AVAILABLE,
                "True",
                MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut status,
            new_condition(
                AVAILABLE,
                "False",
                MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }
    status
}

fn num(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Every replica updated and available, none old, and the latest spec observed.
pub fn is_complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let want = replicas(d);
    num(s.updated_replicas) == want
        && num(s.replicas) == want
        && num(s.available_replicas) == want
        && s.observed_generation >= d.metadata.generation
}

/// Whether `new` shows progress over the Deployment's current status.
pub fn is_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let old_old = num(old.replicas) - num(old.updated_replicas);
    let new_old = num(new.replicas) - num(new.updated_replicas);
    num(new.updated_replicas) > num(old.updated_replicas)
        || new_old < old_old
        || num(new.ready_replicas) > num(old.ready_replicas)
        || num(new.available_replicas) > num(old.available_replicas)
}

/// Whether the progress deadline has passed since the Progressing condition last changed.
pub fn is_timed_out(d: &Deployment, s: &DeploymentStatus, now: Timestamp) -> bool {
    let Some(deadline) = progress_deadline(d) else {
        return false;
    };
    let Some(c) = condition(s, PROGRESSING) else {
        return false;
    };
    match c.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => c
            .last_update_time
            .as_ref()
            .is_some_and(|t| super::super::pods::elapsed(t.0, now) > deadline),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{
        DeploymentSpec, DeploymentStrategy, ReplicaSetSpec, ReplicaSetStatus,
        RollingUpdateDeployment,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn deployment(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(surge),
                        max_unavailable: Some(unavailable),
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn rs(
        name: &str,
        replicas: i32,
        available: i32,
        created: i64,
        max_annotation: Option<i32>,
    ) -> Arc<ReplicaSet> {
        let mut annotations = BTreeMap::new();
        if let Some(m) = max_annotation {
            annotations.insert(MAX_REPLICAS.to_string(), m.to_string());
        }
        Arc::new(ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(ReplicaSetStatus {
                replicas,
                available_replicas: Some(available),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn hash_is_stable_safe_and_changes_with_the_collision_count() {
        let t = PodTemplateSpec::default();
        let h = pod_template_hash(&t, None);
        assert_eq!(h, pod_template_hash(&t, None));
        assert!(h.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
        assert_ne!(h, pod_template_hash(&t, Some(1)));
        assert!((1..=10).contains(&h.len()));
    }

    #[test]
    fn templates_compare_without_the_hash_label() {
        let a = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        };
        let mut b = a.clone();
        b.metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(POD_TEMPLATE_HASH.into(), "abc".into());
        assert!(equal_ignore_hash(&a, &b));
        b.metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert("v".into(), "2".into());
        assert!(!equal_ignore_hash(&a, &b));
    }

    #[test]
    fn fenceposts_round_surge_up_and_unavailable_down() {
        let d = deployment(
            10,
            IntOrString::String("25%".into()),
            IntOrString::String("25%".into()),
        );
        assert_eq!(fenceposts(&d), (3, 2));
        let d = deployment(
            1,
            IntOrString::String("25%".into()),
            IntOrString::String("25%".into()),
        );
        assert_eq!((max_surge(&d), max_unavailable(&d)), (1, 0));
        let d = deployment(3, IntOrString::Int(0), IntOrString::Int(0));
        assert_eq!(fenceposts(&d), (0, 1));
        let d = deployment(2, IntOrString::Int(0), IntOrString::Int(5));
        assert_eq!(max_unavailable(&d), 2);
    }

    #[test]
    fn new_replica_set_grows_within_the_surge() {
        let d = deployment(4, IntOrString::Int(1), IntOrString::Int(1));
        let old = rs("old", 4, 4, 1, None);
        let new = rs("new", 0, 0, 2, None);
        assert_eq!(
            new_rs_new_replicas(&d, replica_count(&[old.clone(), new.clone()]), &new),
            1
        );
        let old3 = rs("old", 3, 3, 1, None);
        let new1 = rs("new", 1, 0, 2, None);
        assert_eq!(
            new_rs_new_replicas(&d, replica_count(&[old3, new1.clone()]), &new1),
            2
        );
        // Old pods not yet deleted count too.
        assert_eq!(new_rs_new_replicas(&d, 5, &new1), 1);
        let mut recreate = d.clone();
        recreate.spec.as_mut().unwrap().strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
        assert_eq!(
            new_rs_new_replicas(&recreate, replica_count(&[old, new.clone()]), &new),
            4
        );
    }

    #[test]
    fn proportional_scaling_follows_the_max_replicas_annotation() {
        // 10 replicas, surge 3: sets annotated with 13 total; scaling to 20 (+3 surge = 23).
        let d = deployment(20, IntOrString::Int(3), IntOrString::Int(0));
        let a = rs("a", 8, 8, 1, Some(13));
        let b = rs("b", 5, 0, 2, Some(13));
        let to_add = 23 - 13;
        let pa = proportion(&a, &d, to_add, 0);
        let pb = proportion(&b, &d, to_add, pa);
        assert_eq!((pa, pb), (6, 4));
    }

    #[test]
    fn revision_annotations_raise_and_record_history() {
        let d = deployment(1, IntOrString::Int(1), IntOrString::Int(0));
        let mut r = (*rs("r", 1, 1, 1, None)).clone();
        assert!(set_new_rs_annotations(&d, &mut r, 1, false));
        assert_eq!(r.annotations()[REVISION], "1");
        assert_eq!(r.annotations()[DESIRED_REPLICAS], "1");
        assert_eq!(r.annotations()[MAX_REPLICAS], "2");
        // A rollback to this template later: revision 3, history keeps 1.
        assert!(set_new_rs_annotations(&d, &mut r, 3, true));
        assert_eq!(r.annotations()[REVISION], "3");
        assert_eq!(r.annotations()[REVISION_HISTORY], "1");
        assert!(!set_new_rs_annotations(&d, &mut r, 3, true));
    }

    #[test]
    fn conditions_keep_transition_times() {
        let t0 = Timestamp::from_second(100).unwrap();
        let t1 = Timestamp::from_second(200).unwrap();
        let mut s = DeploymentStatus::default();
        set_condition(
            &mut s,
            new_condition(PROGRESSING, "True", RS_UPDATED, "a".into(), t0),
        );
        set_condition(
            &mut s,
            new_condition(PROGRESSING, "True", NEW_RS_AVAILABLE, "b".into(), t1),
        );
        let c = condition(&s, PROGRESSING).unwrap();
        assert_eq!(c.reason.as_deref(), Some(NEW_RS_AVAILABLE));
        assert_eq!(c.last_transition_time.as_ref().unwrap().0, t0);
        assert_eq!(c.last_update_time.as_ref().unwrap().0, t1);
        assert_eq!(s.conditions.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn completion_progress_and_timeout() {
        let mut d = deployment(2, IntOrString::Int(1), IntOrString::Int(0));
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(10);
        let mut s = DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(2),
            updated_replicas: Some(2),
            available_replicas: Some(2),
            ..Default::default()
        };
        assert!(is_complete(&d, &s));
        s.available_replicas = Some(1);
        assert!(!is_complete(&d, &s));
        assert!(is_progressing(&d, &s));
        let t0 = Timestamp::from_second(100).unwrap();
        set_condition(
            &mut s,
            new_condition(PROGRESSING, "True", RS_UPDATED, "x".into(), t0),
        );
        assert!(!is_timed_out(&d, &s, Timestamp::from_second(105).unwrap()));
        assert!(is_timed_out(&d, &s, Timestamp::from_second(111).unwrap()));
    }

    #[test]
    fn active_or_latest() {
        let old = rs("old", 0, 0, 1, None);
        let new = rs("new", 3, 3, 2, None);
        assert_eq!(
            find_active_or_latest(Some(&new), std::slice::from_ref(&old))
                .unwrap()
                .name_any(),
            "new"
        );
        let both = rs("old2", 1, 1, 1, None);
        assert!(find_active_or_latest(Some(&new), &[both]).is_none());
        assert_eq!(
            find_active_or_latest(None, &[old]).unwrap().name_any(),
            "old"
        );
    }

    /// Every ReplicaSet comparator the controller sorts with is a total order, on sets that
    /// collide in size, creation time and revision (names are unique, as in a namespace).
    #[test]
    fn replicaset_orders_are_total() {
        let mut sets = Vec::new();
        for i in 0..27 {
            let mut r = (*rs(&format!("rs-{i:02}"), i % 3, 0, (i / 3 % 3) as i64, None)).clone();
            r.annotations_mut()
                .insert(REVISION.to_string(), (i / 9).to_string());
            sets.push(Arc::new(r));
        }
        for cmp in [by_creation, by_size_newer, by_size_older, by_revision] {
            skiff_tests::order::assert_total_order(&sets, cmp);
        }
    }
}
