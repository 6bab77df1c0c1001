//! What one sync of a Job decides, as a pure function of the Job and its pods (Kubernetes'
//! `syncJob`, `manageJob` and `trackJobStatusAndRemoveFinalizers`, less the I/O):
//!
//! - which finished pods are new (they still carry the tracking finalizer and are not yet in
//!   `status.uncountedTerminatedPods`), and how each failure counts under the podFailurePolicy;
//! - whether the Job has reached a terminal state (success by completions or successPolicy;
//!   failure by backoffLimit, the kubelet's restart counts under OnFailure,
//!   activeDeadlineSeconds, the podFailurePolicy, failed indexes), which first shows as the
//!   interim condition (SuccessCriteriaMet, FailureTarget) and becomes Complete or Failed only
//!   once no pod runs or terminates any more;
//! - which pods to create (how many, or which indexes) and delete (surplus, suspension, a
//!   terminal Job's remaining pods);
//! - and, after the finalizers are removed, how `uncountedTerminatedPods` moves into the
//!   counters ([`settle`]).
//!
//! The order of writes makes the count survive a controller restart: a finished pod's uid is
//! written to `uncountedTerminatedPods` before its finalizer is removed, and moves to the
//! counters only once the finalizer is gone; a pod cannot disappear while it holds the
//! finalizer, so every finished pod is counted exactly once.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::failure::{self, Verdict};
use crate::controllers::pods;
use crate::controllers::replicaset::ranking;
use crate::machinery::index_set::IndexSet;
use crate::runtime::EventType;

/// The finalizer that keeps a Job's finished pod until the Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// The completion index of an Indexed Job's pod (annotation and label).
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// How many times the pod's index failed before this pod (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";

/// The most pods created or deleted in one sync (kube-controller-manager's burst).
const BURST: usize = 500;
/// Replacement pods wait 10 s after a failure, doubling per consecutive failure, up to 6 min.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(360);

/// Consecutive pod failures since the last success, kept by the controller per Job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    pub failures: u32,
    pub last_failure: Option<Timestamp>,
}

impl Backoff {
    /// How long replacements still wait at `now`.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        let Some(last) = self.last_failure.filter(|_| self.failures > 0) else {
            return Duration::ZERO;
        };
        let exp = self.failures.saturating_sub(1).min(16);
        let delay = BACKOFF_BASE.saturating_mul(1u32 << exp).min(BACKOFF_MAX);
        delay.saturating_sub(pods::elapsed(last, now))
    }

    /// Updates the record with the pods that finished in this sync.
    pub fn observe(&mut self, succeeded: usize, failed_at: &[Timestamp]) {
        if succeeded > 0 {
            *self = Backoff::default();
        }
        for t in failed_at {
            self.failures += 1;
            self.last_failure = Some(self.last_failure.map_or(*t, |l| l.max(*t)));
        }
    }
}

/// Which terminal state a Job is heading for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub complete: bool,
    pub reason: String,
    pub message: String,
}

impl Target {
    fn failed(reason: &str, message: impl Into<String>) -> Target {
        Target {
            complete: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
    fn complete(reason: &str, message: impl Into<String>) -> Target {
        Target {
            complete: true,
            reason: reason.into(),
            message: message.into(),
        }
    }
    /// The interim condition type (set as soon as the outcome is known).
    fn interim(&self) -> &'static str {
        if self.complete {
            "SuccessCriteriaMet"
        } else {
            "FailureTarget"
        }
    }
    /// The terminal condition type (set once no pod runs any more).
    pub fn terminal(&self) -> &'static str {
        if self.complete {
            "Complete"
        } else {
            "Failed"
        }
    }
}

/// Pods to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Creations {
    /// This many pods of a NonIndexed Job.
    Count(usize),
    /// One pod per index, with the failures its index already had.
    Indexes(Vec<(i32, i32)>),
}

impl Creations {
    pub fn len(&self) -> usize {
        match self {
            Creations::Count(n) => *n,
            Creations::Indexes(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one sync does.
#[derive(Debug)]
pub struct Plan {
    /// The status to write first: new finished pods in `uncountedTerminatedPods`, completed
    /// indexes, counts of active, ready and terminating pods, start time, conditions.
    pub status: JobStatus,
    pub delete: Vec<Arc<Pod>>,
    pub create: Creations,
    /// Finished pods (and, for a Job being deleted, every pod) whose tracking finalizer goes.
    pub release: Vec<Arc<Pod>>,
    pub events: Vec<(EventType, &'static str, String)>,
    /// Sync again after this (the active deadline, a replacement's back-off).
    pub requeue: Option<Duration>,
    /// The terminal state the Job is heading for, if known.
    pub target: Option<Target>,
    /// Pods that will still run or terminate after this sync's deletions (the terminal
    /// condition waits for none).
    pub remaining_pods: usize,
    /// The failure back-off after this sync's finished pods.
    pub backoff: Backoff,
}

pub fn has_condition(status: &JobStatus, type_: &str) -> bool {
    status
        .conditions
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn condition<'a>(status: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
    status
        .conditions
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// Sets a condition; keeps the transition time when the status does not change.
fn set_condition(
    status: &mut JobStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let value = if value { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != value {
                c.last_transition_time = Some(Time(now));
            }
            c.status = value.into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            c.last_probe_time = Some(Time(now));
        }
        None => conditions.push(JobCondition {
            type_: type_.into(),
            status: value.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_probe_time: Some(Time(now)),
            last_transition_time: Some(Time(now)),
        }),
    }
}

/// Whether the Job reached Complete or Failed.
pub fn is_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .is_some_and(|s| has_condition(s, "Complete") || has_condition(s, "Failed"))
}

/// When the Job finished (its Complete or Failed condition's transition time).
pub fn finished_at(job: &Job) -> Option<Timestamp> {
    let s = job.status.as_ref()?;
    condition(s, "Complete")
        .or_else(|| condition(s, "Failed"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .as_deref()
        .is_some_and(|f| f.iter().any(|x| x == TRACKING_FINALIZER))
}

/// The completion index of an Indexed Job's pod (None if absent or not a number).
pub fn pod_index(p: &Pod) -> Option<i32> {
    let from = |m: &Option<BTreeMap<String, String>>| {
        m.as_ref()
            .and_then(|m| m.get(COMPLETION_INDEX))
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|i| *i >= 0)
    };
    from(&p.metadata.annotations).or_else(|| from(&p.metadata.labels))
}

fn index_failures(p: &Pod) -> i32 {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INDEX_FAILURE_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// When the pod finished: the latest container termination, else `now`.
fn finish_time(p: &Pod, now: Timestamp) -> Timestamp {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[])
        .iter()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
        .max()
        .unwrap_or(now)
}

/// The sum of the restarts of a running or pending pod's containers (the kubelet's counts).
fn restarts(p: &Pod) -> i32 {
    if !matches!(pods::phase(p), "Running" | "Pending") {
        return 0;
    }
    let s = p.status.as_ref();
    let sum = |l: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        l.map_or(0, |l| l.iter().map(|c| c.restart_count).sum::<i32>())
    };
    sum(s.and_then(|s| s.init_container_statuses.as_ref()))
        + sum(s.and_then(|s| s.container_statuses.as_ref()))
}

fn indexed(spec: &JobSpec) -> bool {
    spec.completion_mode.as_deref() == Some("Indexed")
}

/// The pods of one Job, sorted by what the sync does with them.
struct Observed {
    active: Vec<Arc<Pod>>,
    terminating: usize,
    /// Finished pods still holding the finalizer.
    holding: Vec<Arc<Pod>>,
    new_succeeded: Vec<Arc<Pod>>,
    new_failed: Vec<(Arc<Pod>, Verdict)>,
}

fn observe(spec: &JobSpec, status: &JobStatus, job_pods: &[Arc<Pod>]) -> Observed {
    let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
    let known: HashSet<&str> = uncounted
        .succeeded
        .iter()
        .flatten()
        .chain(uncounted.failed.iter().flatten())
        .map(String::as_str)
        .collect();
    let replace_only_failed = spec.pod_replacement_policy.as_deref() == Some("Failed");
    let suspended = spec.suspend == Some(true);
    let mut o = Observed {
        active: vec![],
        terminating: 0,
        holding: vec![],
        new_succeeded: vec![],
        new_failed: vec![],
    };
    for p in job_pods {
        let phase = pods::phase(p);
        let deleting = pods::is_terminating(p);
        let succeeded = phase == "Succeeded";
        // A pod deleted before it finished counts as failed (it may never report Failed),
        // unless only failed pods are replaced or the Job's suspension deleted it.
        let failed =
            phase == "Failed" || (deleting && !succeeded && !replace_only_failed && !suspended);
        if !succeeded && phase != "Failed" {
            if deleting {
                o.terminating += 1;
            } else {
                o.active.push(p.clone());
            }
        }
        if !(succeeded || failed) || !has_finalizer(p) {
            continue;
        }
        o.holding.push(p.clone());
        if known.contains(uid(p).as_str()) {
            continue;
        }
        if succeeded {
            o.new_succeeded.push(p.clone());
        } else {
            let verdict = if phase == "Failed" {
                failure::judge(spec.pod_failure_policy.as_ref(), p)
            } else {
                Verdict::Count
            };
            o.new_failed.push((p.clone(), verdict));
        }
    }
    o
}

/// Plans one sync. `manage`: the pods the last sync created or deleted are all seen, so
/// pods may be created or deleted now.
pub fn plan(
    job: &Job,
    job_pods: &[Arc<Pod>],
    now: Timestamp,
    backoff: &Backoff,
    manage: bool,
) -> Plan {
    let spec = job.spec.clone().unwrap_or_default();
    let mut status = job.status.clone().unwrap_or_default();
    let mut plan = Plan {
        status: status.clone(),
        delete: vec![],
        create: Creations::Count(0),
        release: vec![],
        events: vec![],
        requeue: None,
        target: None,
        remaining_pods: 0,
        backoff: *backoff,
    };
    // A finished Job, or one being deleted, only lets go of its pods.
    if is_finished(job) || job.metadata.deletion_timestamp.is_some() {
        plan.release = job_pods
            .iter()
            .filter(|p| has_finalizer(p))
            .cloned()
            .collect();
        return plan;
    }
    let o = observe(&spec, &status, job_pods);
    let is_indexed = indexed(&spec);
    let completions = spec.completions;
    let valid_index = |i: i32| completions.is_none_or(|c| i < c);

    // Newly finished pods join the uncounted ones.
    let mut uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
    let mut fail_job: Option<String> = None;
    let mut completed = IndexSet::parse(status.completed_indexes.as_deref().unwrap_or(""), None)
        .unwrap_or_default();
    let mut failed_indexes =
        IndexSet::parse(status.failed_indexes.as_deref().unwrap_or(""), None).unwrap_or_default();
    for p in &o.new_succeeded {
        uncounted
            .succeeded
            .get_or_insert_with(Vec::new)
            .push(uid(p));
        if let Some(i) = pod_index(p).filter(|i| valid_index(*i)) {
            completed.insert(i);
        }
    }
    let mut counted_failures = vec![];
    for (p, verdict) in &o.new_failed {
        match verdict {
            Verdict::Ignore => continue,
            Verdict::FailJob(m) => {
                fail_job.get_or_insert_with(|| m.clone());
            }
            Verdict::FailIndex(_) => {
                if let Some(i) = pod_index(p) {
                    failed_indexes.insert(i);
                }
            }
            Verdict::Count => {
                if let (Some(limit), Some(i)) = (spec.backoff_limit_per_index, pod_index(p)) {
                    if index_failures(p) + 1 > limit {
                        failed_indexes.insert(i);
                    }
                }
            }
        }
        uncounted.failed.get_or_insert_with(Vec::new).push(uid(p));
        counted_failures.push(finish_time(p, now));
    }
    if is_indexed {
        status.completed_indexes = Some(completed.to_string()).filter(|s| !s.is_empty());
        if spec.backoff_limit_per_index.is_some() {
            status.failed_indexes = Some(failed_indexes.to_string());
        }
    }
    let uncounted_failed = uncounted.failed.as_ref().map_or(0, Vec::len);
    let uncounted_succeeded = uncounted.succeeded.as_ref().map_or(0, Vec::len);
    let failed = status.failed.unwrap_or(0) + i32::try_from(uncounted_failed).unwrap_or(i32::MAX);
    let succeeded = if is_indexed {
        i32::try_from(completed.len()).unwrap_or(i32::MAX)
    } else {
        status.succeeded.unwrap_or(0) + i32::try_from(uncounted_succeeded).unwrap_or(i32::MAX)
    };
    status.uncounted_terminated_pods = Some(uncounted);
    let mut record = *backoff;
    record.observe(o.new_succeeded.len(), &counted_failures);

    let suspended = spec.suspend == Some(true);
    if suspended {
        if !has_condition(&status, "Suspended") {
            set_condition(
                &mut status,
                "Suspended",
                true,
                "JobSuspended",
                "Job suspended",
                now,
            );
            plan.events
                .push((EventType::Normal, "Suspended", "Job suspended".into()));
            status.start_time = None;
        }
    } else {
        if has_condition(&status, "Suspended") {
            set_condition(
                &mut status,
                "Suspended",
                false,
                "JobResumed",
                "Job resumed",
                now,
            );
            plan.events
                .push((EventType::Normal, "Resumed", "Job resumed".into()));
            status.start_time = Some(Time(now));
        }
        if status.start_time.is_none() {
            status.start_time = Some(Time(now));
        }
    }

    // The outcome: kept once decided, else decided now.
    let active_count = o.active.len();
    let target = if let Some(c) = condition(&status, "FailureTarget") {
        Some(Target::failed(
            c.reason.as_deref().unwrap_or(""),
            c.message.clone().unwrap_or_default(),
        ))
    } else if let Some(c) = condition(&status, "SuccessCriteriaMet") {
        Some(Target::complete(
            c.reason.as_deref().unwrap_or(""),
            c.message.clone().unwrap_or_default(),
        ))
    } else {
        decide(
            &spec,
            &status,
            DecideInputs {
                fail_job,
                failed,
                succeeded,
                active: &o.active,
                completed: &completed,
                failed_indexes: &failed_indexes,
                now,
            },
        )
    };
    if let Some(t) = &target {
        if !has_condition(&status, t.interim()) {
            set_condition(&mut status, t.interim(), true, &t.reason, &t.message, now);
        }
    }
    if target.is_none() && !suspended {
        if let (Some(ads), Some(start)) = (spec.active_deadline_seconds, &status.start_time) {
            let deadline = Duration::from_secs(u64::try_from(ads).unwrap_or(0));
            let left = deadline.saturating_sub(pods::elapsed(start.0, now));
            plan.requeue = Some(left + Duration::from_millis(100));
        }
    }

    // Pods to delete and create.
    if target.is_some() || suspended {
        plan.delete = o.active.clone();
    } else if manage {
        manage_pods(
            &spec,
            &o,
            succeeded,
            &completed,
            &failed_indexes,
            &record,
            now,
            &mut plan,
        );
    }
    let deleted = plan.delete.len();
    let created = plan.create.len();
    let active_after = active_count - deleted.min(active_count) + created;
    let deleted_set: HashSet<String> = plan.delete.iter().map(|p| uid(p)).collect();
    let ready = o
        .active
        .iter()
        .filter(|p| !deleted_set.contains(&uid(p)) && pods::is_ready(p))
        .count();
    status.active = Some(i32::try_from(active_after).unwrap_or(i32::MAX));
    status.ready = Some(i32::try_from(ready).unwrap_or(i32::MAX));
    status.terminating = Some(i32::try_from(o.terminating + deleted).unwrap_or(i32::MAX));
    plan.remaining_pods = active_after + o.terminating + deleted;
    plan.release = o.holding.clone();
    plan.status = status;
    plan.target = target;
    plan.backoff = record;
    plan
}

struct DecideInputs<'a> {
    fail_job: Option<String>,
    failed: i32,
    succeeded: i32,
    active: &'a [Arc<Pod>],
    completed: &'a IndexSet,
    failed_indexes: &'a IndexSet,
    now: Timestamp,
}

/// Kubernetes' order: the podFailurePolicy, the backoff limit (with restart counts under
/// OnFailure), the active deadline, failed indexes, then success.
fn decide(spec: &JobSpec, status: &JobStatus, i: DecideInputs<'_>) -> Option<Target> {
    if let Some(m) = i.fail_job {
        return Some(Target::failed("PodFailurePolicy", m));
    }
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    let restarts: i32 = if on_failure {
        i.active.iter().map(|p| restarts(p)).sum()
    } else {
        0
    };
    let past_restarts = on_failure
        && if backoff_limit == 0 {
            restarts > 0
        } else {
            restarts >= backoff_limit
        };
    if i.failed > backoff_limit || past_restarts {
        return Some(Target::failed(
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ));
    }
    if let (Some(ads), Some(start)) = (spec.active_deadline_seconds, &status.start_time) {
        if spec.suspend != Some(true)
            && pods::elapsed(start.0, i.now) >= Duration::from_secs(u64::try_from(ads).unwrap_or(0))
        {
            return Some(Target::failed(
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ));
        }
    }
    if let Some(max) = spec.max_failed_indexes {
        if i32::try_from(i.failed_indexes.len()).unwrap_or(i32::MAX) > max {
            return Some(Target::failed(
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            ));
        }
    }
    if indexed(spec) {
        if let Some(policy) = &spec.success_policy {
            for (n, rule) in policy.rules.iter().enumerate() {
                let wanted = rule
                    .succeeded_indexes
                    .as_deref()
                    .and_then(|s| IndexSet::parse(s, None).ok());
                let hit = match (&wanted, rule.succeeded_count) {
                    (Some(w), Some(c)) => {
                        i.completed.count_in(w) >= usize::try_from(c).unwrap_or(0)
                    }
                    (Some(w), None) => i.completed.is_superset(w),
                    (None, Some(c)) => i.succeeded >= c,
                    (None, None) => false,
                };
                if hit {
                    return Some(Target::complete(
                        "SuccessPolicy",
                        format!("Matched rules at index {n}"),
                    ));
                }
            }
        }
        let total = spec.completions.unwrap_or(0);
        let done = i32::try_from(i.completed.len() + i.failed_indexes.len()).unwrap_or(i32::MAX);
        if done >= total {
            if !i.failed_indexes.is_empty() {
                return Some(Target::failed("FailedIndexes", "Job has failed indexes"));
            }
            return Some(Target::complete(
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
        }
        return None;
    }
    let complete = match spec.completions {
        Some(c) => i.succeeded >= c,
        // A work queue: done once one pod succeeded and none runs any more.
        None => i.succeeded > 0 && i.active.is_empty(),
    };
    complete.then(|| {
        Target::complete(
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        )
    })
}

/// manageJob: the active pods a running Job wants, and the creations or deletions that get
/// there (creations wait out the failure back-off).
#[allow(clippy::too_many_arguments)]
fn manage_pods(
    spec: &JobSpec,
    o: &Observed,
    succeeded: i32,
    completed: &IndexSet,
    failed_indexes: &IndexSet,
    backoff: &Backoff,
    now: Timestamp,
    plan: &mut Plan,
) {
    let parallelism = usize::try_from(spec.parallelism.unwrap_or(1)).unwrap_or(0);
    let active = o.active.len();
    // With podReplacementPolicy Failed a terminating pod is not replaced until it failed.
    let pending_replacement = if spec.pod_replacement_policy.as_deref() == Some("Failed") {
        o.terminating
    } else {
        0
    };
    if indexed(spec) {
        let completions = spec.completions.unwrap_or(0);
        // Surplus: duplicates of an index, out-of-range or finished indexes, then by rank.
        let mut seen: HashSet<i32> = HashSet::new();
        let mut keep: Vec<Arc<Pod>> = vec![];
        for p in sorted_keep_first(&o.active, now) {
            match pod_index(&p) {
                Some(i)
                    if i < completions
                        && !completed.contains(i)
                        && !failed_indexes.contains(i)
                        && seen.insert(i) =>
                {
                    keep.push(p)
                }
                _ => plan.delete.push(p),
            }
        }
        if keep.len() > parallelism {
            let surplus = keep.len() - parallelism;
            let doomed = ranking::pods_to_delete(keep.clone(), &keep, surplus, now);
            plan.delete.extend(doomed);
            return;
        }
        let room = parallelism
            .saturating_sub(keep.len() + pending_replacement)
            .min(BURST);
        if room == 0 {
            return;
        }
        let wait = backoff.remaining(now);
        if !wait.is_zero() {
            plan.requeue = Some(plan.requeue.map_or(wait, |r| r.min(wait)));
            return;
        }
        // The latest failure count of each index still visible on a finished pod.
        let mut failures: BTreeMap<i32, i32> = BTreeMap::new();
        for (p, v) in &o.new_failed {
            if let (Some(i), false) = (pod_index(p), *v == Verdict::Ignore) {
                let n = index_failures(p) + 1;
                let e = failures.entry(i).or_default();
                *e = (*e).max(n);
            }
        }
        let indexes: Vec<(i32, i32)> = (0..completions)
            .filter(|i| {
                !completed.contains(*i) && !failed_indexes.contains(*i) && !seen.contains(i)
            })
            .take(room)
            .map(|i| (i, failures.get(&i).copied().unwrap_or(0)))
            .collect();
        plan.create = Creations::Indexes(indexes);
        return;
    }
    let want = match spec.completions {
        // A work queue: once one pod succeeded, no new ones; the others finish.
        None if succeeded > 0 => active,
        None => parallelism,
        Some(c) => usize::try_from(c - succeeded).unwrap_or(0).min(parallelism),
    };
    if active > want {
        let surplus = (active - want).min(BURST);
        plan.delete = ranking::pods_to_delete(o.active.clone(), &o.active, surplus, now);
        return;
    }
    let n = want.saturating_sub(active + pending_replacement).min(BURST);
    if n == 0 {
        return;
    }
    let wait = backoff.remaining(now);
    if !wait.is_zero() {
        plan.requeue = Some(plan.requeue.map_or(wait, |r| r.min(wait)));
        return;
    }
    plan.create = Creations::Count(n);
}

/// Active pods with the ones to keep first (ready, older), so duplicates of an index lose
/// their newest pods.
fn sorted_keep_first(active: &[Arc<Pod>], now: Timestamp) -> Vec<Arc<Pod>> {
    let mut delete_order = ranking::pods_to_delete(active.to_vec(), active, active.len(), now);
    delete_order.reverse();
    delete_order
}

/// After the finalizers are removed: uncounted pods whose finalizer is gone (just removed,
/// or the pod is gone, which it cannot be while it holds the finalizer) move to the
/// counters; a Job heading for a terminal state gets it once nothing runs, terminates or
/// waits to be counted any more.
pub fn settle(
    job: &Job,
    mut status: JobStatus,
    still_held: &HashSet<String>,
    target: Option<&Target>,
    remaining_pods: usize,
    now: Timestamp,
) -> (JobStatus, Vec<(EventType, &'static str, String)>) {
    let indexed = job.spec.as_ref().is_some_and(indexed);
    let mut uncounted = status.uncounted_terminated_pods.take().unwrap_or_default();
    let moved = |list: &mut Option<Vec<String>>| -> i32 {
        let Some(l) = list.as_mut() else { return 0 };
        let before = l.len();
        l.retain(|u| still_held.contains(u));
        i32::try_from(before - l.len()).unwrap_or(i32::MAX)
    };
    let s = moved(&mut uncounted.succeeded);
    let f = moved(&mut uncounted.failed);
    status.failed = Some(status.failed.unwrap_or(0) + f);
    status.succeeded = Some(if indexed {
        IndexSet::parse(status.completed_indexes.as_deref().unwrap_or(""), None)
            .map(|c| i32::try_from(c.len()).unwrap_or(i32::MAX))
            .unwrap_or(0)
    } else {
        status.succeeded.unwrap_or(0) + s
    });
    let empty = uncounted.succeeded.as_ref().is_none_or(Vec::is_empty)
        && uncounted.failed.as_ref().is_none_or(Vec::is_empty);
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: uncounted.succeeded.filter(|l| !l.is_empty()),
        failed: uncounted.failed.filter(|l| !l.is_empty()),
    });
    let mut events = vec![];
    if let Some(t) = target {
        if empty && remaining_pods == 0 && !has_condition(&status, t.terminal()) {
            set_condition(&mut status, t.terminal(), true, &t.reason, &t.message, now);
            if t.complete {
                status.completion_time = Some(Time(now));
                events.push((EventType::Normal, "Completed", "Job completed".to_string()));
            } else {
                let reason = match t.reason.as_str() {
                    "BackoffLimitExceeded" => "BackoffLimitExceeded",
                    "DeadlineExceeded" => "DeadlineExceeded",
                    "PodFailurePolicy" => "PodFailurePolicy",
                    "MaxFailedIndexesExceeded" => "MaxFailedIndexesExceeded",
                    _ => "FailedIndexes",
                };
                events.push((EventType::Warning, reason, t.message.clone()));
            }
        }
    }
    (status, events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(spec: serde_json::Value, status: serde_json::Value) -> Job {
        let mut spec = spec;
        spec["template"] = json!({"spec": {"restartPolicy": spec.get("restart").cloned().unwrap_or(json!("Never")),
            "containers": [{"name": "main", "image": "busybox"}]}});
        serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "default", "uid": "job-uid"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, extra: serde_json::Value) -> Arc<Pod> {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "finalizers": [TRACKING_FINALIZER], "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": phase},
        });
        merge(&mut v, extra);
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn now() -> Timestamp {
        "2025-01-01T00:10:00Z".parse().unwrap()
    }

    fn uncounted(p: &Plan) -> (usize, usize) {
        let u = p
            .status
            .uncounted_terminated_pods
            .clone()
            .unwrap_or_default();
        (
            u.succeeded.map_or(0, |l| l.len()),
            u.failed.map_or(0, |l| l.len()),
        )
    }

    #[test]
    fn a_new_job_starts_parallelism_pods() {
        let j = job(json!({"completions": 5, "parallelism": 2}), json!({}));
        let p = plan(&j, &[], now(), &Backoff::default(), true);
        assert_eq!(p.create, Creations::Count(2));
        assert_eq!(p.status.active, Some(2));
        assert!(p.status.start_time.is_some());
        assert!(p.target.is_none());
        // Until the creations are seen, nothing more is created.
        let p = plan(&j, &[], now(), &Backoff::default(), false);
        assert!(p.create.is_empty());
    }

    #[test]
    fn finished_pods_are_counted_once_across_the_two_writes() {
        let j = job(
            json!({"completions": 2, "parallelism": 2}),
            json!({"startTime": "2025-01-01T00:00:00Z"}),
        );
        let pods = vec![
            pod("a", "Succeeded", json!({})),
            pod("b", "Running", json!({})),
        ];
        let p = plan(&j, &pods, now(), &Backoff::default(), true);
        assert_eq!(uncounted(&p), (1, 0));
        assert_eq!(p.release.len(), 1);
        assert!(
            p.create.is_empty(),
            "one succeeded and one running: nothing to add"
        );
        // The finalizer of `a` is gone: it moves to the counter.
        let (s, ev) = settle(
            &j,
            p.status.clone(),
            &HashSet::new(),
            p.target.as_ref(),
            p.remaining_pods,
            now(),
        );
        assert_eq!(s.succeeded, Some(1));
        assert!(ev.is_empty());
        // A sync that runs before the release (the uid already uncounted) counts nothing new.
        let mut j2 = j.clone();
        j2.status = Some(p.status.clone());
        let again = plan(&j2, &pods, now(), &Backoff::default(), true);
        assert_eq!(uncounted(&again), (1, 0));
        let held: HashSet<String> = ["uid-a".to_string()].into();
        let (s, _) = settle(&j2, again.status.clone(), &held, None, 1, now());
        assert_eq!(s.succeeded, Some(0), "still held: not counted yet");
    }

    #[test]
    fn completion_is_interim_until_no_pod_remains() {
        let j = job(
            json!({"completions": 1, "parallelism": 1}),
            json!({"startTime": "2025-01-01T00:00:00Z"}),
        );
        let pods = vec![pod("a", "Succeeded", json!({}))];
        let p = plan(&j, &pods, now(), &Backoff::default(), true);
        let t = p.target.clone().unwrap();
        assert!(t.complete);
        assert!(has_condition(&p.status, "SuccessCriteriaMet"));
        let (s, ev) = settle(
            &j,
            p.status.clone(),
            &HashSet::new(),
            Some(&t),
            p.remaining_pods,
            now(),
        );
        assert!(has_condition(&s, "Complete"));
        assert!(s.completion_time.is_some());
        assert_eq!(ev[0].1, "Completed");
        let reason = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Complete")
            .unwrap()
            .reason;
        assert_eq!(reason.as_deref(), Some("CompletionsReached"));
    }

    #[test]
    fn backoff_limit_counts_failures_and_restarts() {
        let j = job(
            json!({"completions": 1, "backoffLimit": 1}),
            json!({"startTime": "2025-01-01T00:00:00Z", "failed": 1}),
        );
        let p = plan(
            &j,
            &[pod("b", "Failed", json!({}))],
            now(),
            &Backoff::default(),
            true,
        );
        let t = p.target.unwrap();
        assert_eq!(
            (t.complete, t.reason.as_str()),
            (false, "BackoffLimitExceeded")
        );
        assert!(has_condition(&p.status, "FailureTarget"));

        let on_failure = job(
            json!({"completions": 1, "backoffLimit": 2, "restart": "OnFailure"}),
            json!({}),
        );
        let restarting = pod(
            "r",
            "Running",
            json!({"status": {"containerStatuses": [
            {"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 2}]}}),
        );
        let p = plan(
            &on_failure,
            std::slice::from_ref(&restarting),
            now(),
            &Backoff::default(),
            true,
        );
        assert_eq!(p.target.unwrap().reason, "BackoffLimitExceeded");
        assert_eq!(p.delete.len(), 1, "the restarting pod is deleted");
        assert_eq!(p.status.terminating, Some(1));
    }

    #[test]
    fn replacements_wait_out_the_backoff() {
        let j = job(
            json!({"completions": 1, "backoffLimit": 6}),
            json!({"startTime": "2025-01-01T00:00:00Z"}),
        );
        let failed = pod(
            "a",
            "Failed",
            json!({"status": {"containerStatuses": [
            {"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 1, "finishedAt": "2025-01-01T00:09:55Z"}}}]}}),
        );
        let p = plan(&j, &[failed], now(), &Backoff::default(), true);
        assert!(p.create.is_empty());
        assert_eq!(p.requeue, Some(Duration::from_secs(5)));
        assert_eq!(uncounted(&p), (0, 1));
        let mut b = Backoff::default();
        b.observe(0, &["2025-01-01T00:09:55Z".parse().unwrap()]);
        b.observe(0, &["2025-01-01T00:09:58Z".parse().unwrap()]);
        assert_eq!(b.remaining(now()), Duration::from_secs(18));
        b.observe(1, &[]);
        assert_eq!(b.remaining(now()), Duration::ZERO);
    }

    #[test]
    fn deadline_and_suspension() {
        let j = job(
            json!({"completions": 3, "parallelism": 3, "activeDeadlineSeconds": 60}),
            json!({"startTime": "2025-01-01T00:08:00Z"}),
        );
        let pods = vec![pod("a", "Running", json!({}))];
        let p = plan(&j, &pods, now(), &Backoff::default(), true);
        assert_eq!(p.target.unwrap().reason, "DeadlineExceeded");
        assert_eq!(p.delete.len(), 1);
        let j = job(
            json!({"completions": 3, "parallelism": 3, "activeDeadlineSeconds": 600}),
            json!({"startTime": "2025-01-01T00:08:00Z"}),
        );
        let p = plan(&j, &pods, now(), &Backoff::default(), true);
        assert!(p.target.is_none());
        assert_eq!(p.requeue, Some(Duration::from_millis(480_100)));
        let s = job(
            json!({"completions": 3, "parallelism": 3, "suspend": true}),
            json!({"startTime": "2025-01-01T00:08:00Z"}),
        );
        let p = plan(&s, &pods, now(), &Backoff::default(), true);
        assert_eq!(p.delete.len(), 1);
        assert!(p.create.is_empty());
        assert!(has_condition(&p.status, "Suspended"));
        assert!(p.status.start_time.is_none());
        // A pod deleted by the suspension is not a failure.
        let deleting = pod(
            "a",
            "Running",
            json!({"metadata": {"deletionTimestamp": "2025-01-01T00:09:00Z"}}),
        );
        let mut s2 = s.clone();
        s2.status = Some(p.status.clone());
        let p2 = plan(&s2, &[deleting], now(), &Backoff::default(), true);
        assert_eq!(uncounted(&p2), (0, 0));
        assert_eq!(p2.status.terminating, Some(1));
        // Resumed: a new start time, pods again.
        let mut r = s2.clone();
        r.spec.as_mut().unwrap().suspend = Some(false);
        let p3 = plan(&r, &[], now(), &Backoff::default(), true);
        assert_eq!(p3.create, Creations::Count(3));
        assert!(p3.status.start_time.is_some());
        assert!(p3.events.iter().any(|e| e.1 == "Resumed"));
    }

    #[test]
    fn indexed_jobs_fill_missing_indexes() {
        let j = job(
            json!({"completions": 4, "parallelism": 2, "completionMode": "Indexed"}),
            json!({"startTime": "2025-01-01T00:00:00Z", "completedIndexes": "0"}),
        );
        let idx = |i: i32| json!({"metadata": {"annotations": {COMPLETION_INDEX: i.to_string()}}});
        let pods = vec![
            pod("p1", "Succeeded", idx(1)),
            pod("p2", "Running", idx(2)),
            pod("p2b", "Running", idx(2)),
        ];
        let p = plan(&j, &pods, now(), &Backoff::default(), true);
        assert_eq!(p.status.completed_indexes.as_deref(), Some("0-1"));
        assert_eq!(p.delete.len(), 1, "a duplicate of index 2 goes");
        assert_eq!(p.create, Creations::Indexes(vec![(3, 0)]));
        let (s, _) = settle(&j, p.status.clone(), &HashSet::new(), None, 2, now());
        assert_eq!(s.succeeded, Some(2));
        let done = job(
            json!({"completions": 2, "parallelism": 2, "completionMode": "Indexed"}),
            json!({"startTime": "2025-01-01T00:00:00Z", "completedIndexes": "0"}),
        );
        let p = plan(
            &done,
            &[pod("x", "Succeeded", idx(1))],
            now(),
            &Backoff::default(),
            true,
        );
        assert!(p.target.unwrap().complete);
    }

    #[test]
    fn pod_failure_policy_fails_or_ignores() {
        let j = job(
            json!({"completions": 2, "parallelism": 2, "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}}),
            json!({"startTime": "2025-01-01T00:00:00Z"}),
        );
        let exit = |c: i32| {
            json!({"status": {"containerStatuses": [{"name": "main", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": c}}}]}})
        };
        let p = plan(
            &j,
            &[pod("a", "Failed", exit(42)), pod("b", "Running", json!({}))],
            now(),
            &Backoff::default(),
            true,
        );
        let t = p.target.unwrap();
        assert_eq!(t.reason, "PodFailurePolicy");
        assert!(t.message.contains("exit code 42"));
        assert_eq!(p.delete.len(), 1);
        let disrupted =
            json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]}});
        let p = plan(
            &j,
            &[pod("c", "Failed", disrupted)],
            now(),
            &Backoff::default(),
            true,
        );
        assert!(p.target.is_none());
        assert_eq!(uncounted(&p), (0, 0), "ignored: not counted");
        assert_eq!(p.release.len(), 1, "but released");
        assert_eq!(p.create, Creations::Count(2));
    }

    #[test]
    fn finished_or_deleted_jobs_release_every_pod() {
        let j = job(
            json!({"completions": 1}),
            json!({"conditions": [{"type": "Complete", "status": "True"}]}),
        );
        let p = plan(
            &j,
            &[
                pod("a", "Running", json!({})),
                pod("b", "Succeeded", json!({})),
            ],
            now(),
            &Backoff::default(),
            true,
        );
        assert_eq!(p.release.len(), 2);
        assert!(p.create.is_empty() && p.delete.is_empty());
    }
}
