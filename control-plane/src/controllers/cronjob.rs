//! The CronJob controller (Kubernetes' cronjob controller v2): creates a Job for each
//! scheduled time of a CronJob's schedule in its time zone, as it comes due.
//!
//! Per key: bring `status.active` up to date with the Jobs the CronJob controls (finished
//! ones leave it, with SawCompletedJob and lastSuccessfulTime), then, unless suspended or
//! being deleted, find the most recent scheduled time not yet run (no further back than
//! startingDeadlineSeconds; a schedule missed more than 100 times is reported and only its
//! latest time considered), apply the concurrencyPolicy ([`at_due_time`]: Allow; Forbid
//! skips while a Job runs, with a JobAlreadyActive event; Replace deletes the running ones),
//! create the Job `<name>-<minutes since epoch>` (so a restart never makes a second Job for
//! the same time), delete finished Jobs beyond the history limits, and come back exactly at the next scheduled time. No polling: the
//! work queue's delayed add is the only clock.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::{Client, Resource, ResourceExt};

use super::job::plan::{has_condition, is_finished};
use super::Context;
use crate::machinery::cron::Schedule;
use crate::runtime::controller::api_code;
use crate::runtime::owner::{self, controller_of, BY_CONTROLLER_UID};
use crate::runtime::{
    Action, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler, Recorder,
    WorkQueue,
};

pub const NAME: &str = "cronjob";
/// The annotation on a Job with the scheduled time it runs for.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Missed start times beyond which the controller stops counting them.
const MISSED_LIMIT: usize = 100;
/// A little after the scheduled time, so the next sync finds it due.
const SLACK: Duration = Duration::from_millis(100);

pub struct CronJobController {
    client: Client,
    cron_jobs: Informer<CronJob>,
    jobs: Informer<Job>,
    recorder: Recorder,
}

fn cron_job_of(r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference) -> bool {
    r.kind == "CronJob" && r.api_version.starts_with("batch/")
}

pub fn build(ctx: &Context) -> Controller<CronJobController> {
    let cron_jobs = ctx.informers.get::<CronJob>();
    let jobs = ctx.informers.get::<Job>();
    jobs.add_index(BY_CONTROLLER_UID, owner::index_by_controller_uid::<Job>);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    cron_jobs.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    let q = queue.clone();
    jobs.on_change(move |c| {
        let job = c.object();
        if let Some(r) = controller_of(job.meta()).filter(|r| cron_job_of(r)) {
            q.add(ObjectKey::namespaced(
                job.namespace().unwrap_or_default(),
                r.name.clone(),
            ));
        }
    });
    Controller::new(
        NAME,
        Arc::new(CronJobController {
            client: ctx.client.clone(),
            cron_jobs,
            jobs,
            recorder: ctx.events.recorder("cronjob-controller"),
        }),
        queue,
        ctx.settings.concurrent_cron_job_syncs,
        ctx.metrics.clone(),
    )
}

/// `<name>-<minutes since the epoch of the scheduled time>`, Kubernetes' Job name.
pub fn job_name(cron_job: &str, scheduled: Timestamp) -> String {
    format!("{cron_job}-{}", scheduled.as_second().div_euclid(60))
}

/// The most recent scheduled time that is due and not yet run, and whether more than
/// [`MISSED_LIMIT`] were missed (Kubernetes' `mostRecentScheduleTime`).
pub fn due_time(cj: &CronJob, schedule: &Schedule, now: Timestamp) -> (Option<Timestamp>, bool) {
    let spec = cj.spec.as_ref();
    let status = cj.status.as_ref();
    let mut earliest = status
        .and_then(|s| s.last_schedule_time.as_ref())
        .or(cj.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    if let Some(sds) = spec.and_then(|s| s.starting_deadline_seconds) {
        let floor = now
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(sds))
            .unwrap_or(now);
        earliest = earliest.max(floor);
    }
    let missed = schedule.missed(earliest, now, MISSED_LIMIT);
    (missed.most_recent, missed.count > MISSED_LIMIT)
}

/// What the concurrencyPolicy makes of a due scheduled time, given the Jobs the CronJob
/// controls (Kubernetes' cronjob controller v2).
#[derive(Debug, PartialEq)]
pub enum AtDueTime<'a> {
    /// Create the Job (Allow; or nothing runs).
    Create,
    /// Forbid while a Job runs: skip this time (Kubernetes' JobAlreadyActive event).
    Skip,
    /// Replace: delete these running Jobs, then create.
    Replace(Vec<&'a Job>),
}

/// The decision at a due time under `policy` (None is Allow): running Jobs are the
/// unfinished ones not being deleted.
pub fn at_due_time<'a>(policy: Option<&str>, owned: &'a [Arc<Job>]) -> AtDueTime<'a> {
    let running: Vec<&Job> = owned
        .iter()
        .map(AsRef::as_ref)
        .filter(|j| !is_finished(j) && j.metadata.deletion_timestamp.is_none())
        .collect();
    match policy {
        _ if running.is_empty() => AtDueTime::Create,
        Some("Forbid") => AtDueTime::Skip,
        Some("Replace") => AtDueTime::Replace(running),
        _ => AtDueTime::Create,
    }
}

/// The Job a CronJob makes for `scheduled`: the template's metadata and spec, a controller
/// reference, the scheduled-timestamp annotation (in the CronJob's time zone).
pub fn job_for(cj: &CronJob, scheduled: Timestamp, zone: Option<&str>) -> Job {
    let spec = cj.spec.clone().unwrap_or_default();
    let template = spec.job_template;
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let shown = match zone.and_then(|z| k8s_openapi::jiff::tz::TimeZone::get(z).ok()) {
        Some(tz) => scheduled
            .to_zoned(tz)
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string(),
        None => scheduled.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    };
    annotations.insert(SCHEDULED_TIMESTAMP.into(), shown);
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&cj.name_any(), scheduled)),
            namespace: cj.namespace(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![owner::controller_ref(cj)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        field_path: None,
    }
}

fn job_state(job: &Job) -> &'static str {
    let status = job.status.clone().unwrap_or_default();
    if has_condition(&status, "Complete") {
        "Complete"
    } else if has_condition(&status, "Failed") {
        "Failed"
    } else {
        "Running"
    }
}

impl Reconciler for CronJobController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(cj) = self.cron_jobs.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let now = Timestamp::now();
        let uid = cj.uid().unwrap_or_default();
        let mut owned: Vec<Arc<Job>> = self
            .jobs
            .by_index(BY_CONTROLLER_UID, &uid)
            .into_iter()
            .filter(|j| j.namespace() == cj.namespace())
            .collect();
        owned.sort_by_key(|j| j.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let mut status = cj.status.clone().unwrap_or_default();

        // Active Jobs: the running ones it controls; finished ones are seen completed.
        let mut active: Vec<ObjectReference> = vec![];
        for j in &owned {
            let was_active = status
                .active
                .iter()
                .flatten()
                .any(|r| r.uid == j.metadata.uid);
            if is_finished(j) {
                if was_active {
                    self.recorder.event(
                        cj.as_ref(),
                        EventType::Normal,
                        "SawCompletedJob",
                        format!(
                            "Saw completed job: {}, condition: {}",
                            j.name_any(),
                            job_state(j)
                        ),
                    );
                }
                if job_state(j) == "Complete" {
                    let done = j.status.as_ref().and_then(|s| s.completion_time.clone());
                    if done.as_ref().map(|t| t.0)
                        > status.last_successful_time.as_ref().map(|t| t.0)
                    {
                        status.last_successful_time = done;
                    }
                }
            } else if j.metadata.deletion_timestamp.is_none() {
                active.push(reference(j));
            }
        }
        status.active = Some(active).filter(|a| !a.is_empty());

        let spec = cj.spec.clone().unwrap_or_default();
        let mut requeue = None;
        if cj.metadata.deletion_timestamp.is_none() && spec.suspend != Some(true) {
            requeue = self.run_due(&cj, &mut status, &owned, now).await?;
        }
        self.write_status(&cj, status).await?;
        self.clean_history(&cj, &owned).await?;
        Ok(requeue.map_or(Action::AwaitChange, Action::RequeueAfter))
    }
}

impl CronJobController {
    /// Starts the Job for the due scheduled time, if any; returns when to look again.
    async fn run_due(
        &self,
        cj: &Arc<CronJob>,
        status: &mut CronJobStatus,
        owned: &[Arc<Job>],
        now: Timestamp,
    ) -> Result<Option<Duration>, ReconcileError> {
        let spec = cj.spec.clone().unwrap_or_default();
        let schedule = match Schedule::new(&spec.schedule, spec.time_zone.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                let reason = match e {
                    crate::machinery::cron::ScheduleError::UnknownTimeZone(_) => "UnknownTimeZone",
                    _ => "UnparseableSchedule",
                };
                self.recorder
                    .event(cj.as_ref(), EventType::Warning, reason, e.to_string());
                return Ok(None);
            }
        };
        let next = |after: Timestamp| {
            schedule
                .next_after(after)
                .map(|t| crate::controllers::pods::elapsed(now, t) + SLACK)
        };
        let (due, too_many) = due_time(cj, &schedule, now);
        if too_many {
            self.recorder.event(
                cj.as_ref(),
                EventType::Warning,
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
            );
        }
        let Some(scheduled) = due else {
            return Ok(next(now));
        };
        if let Some(sds) = spec.starting_deadline_seconds {
            let late = crate::controllers::pods::elapsed(scheduled, now);
            if late > Duration::from_secs(u64::try_from(sds).unwrap_or(0)) {
                self.recorder.event(
                    cj.as_ref(),
                    EventType::Warning,
                    "MissSchedule",
                    format!(
                        "Missed scheduled time to start a job: {}",
                        scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")
                    ),
                );
                return Ok(next(now));
            }
        }
        let name = job_name(&cj.name_any(), scheduled);
        if owned.iter().any(|j| j.name_any() == name) {
            // Already started for this time (the status write that said so was lost).
            status.last_schedule_time = Some(Time(scheduled));
            return Ok(next(now));
        }
        match at_due_time(spec.concurrency_policy.as_deref(), owned) {
            AtDueTime::Skip => {
                self.recorder.event(
                    cj.as_ref(),
                    EventType::Normal,
                    "JobAlreadyActive",
                    "Not starting job because prior execution is running and concurrency policy is Forbid",
                );
                return Ok(next(now));
            }
            AtDueTime::Replace(running) => {
                for j in running {
                    self.delete_job(cj, j).await?;
                }
                status.active = None;
            }
            AtDueTime::Create => {}
        }
        let job = job_for(cj, scheduled, spec.time_zone.as_deref());
        let api: Api<Job> =
            Api::namespaced(self.client.clone(), &cj.namespace().unwrap_or_default());
        match api.create(&PostParams::default(), &job).await {
            Ok(created) => {
                self.recorder.event(
                    cj.as_ref(),
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!("Created job {}", created.name_any()),
                );
                status
                    .active
                    .get_or_insert_with(Vec::new)
                    .push(reference(&created));
            }
            Err(e) if api_code(&e) == Some(409) => {}
            Err(e) => {
                self.recorder.event(
                    cj.as_ref(),
                    EventType::Warning,
                    "FailedCreate",
                    format!(
                        "Error creating job: {}",
                        crate::controllers::pods::error_message(&e)
                    ),
                );
                return Err(e.into());
            }
        }
        status.last_schedule_time = Some(Time(scheduled));
        Ok(next(now))
    }

    async fn delete_job(&self, cj: &CronJob, job: &Job) -> Result<(), ReconcileError> {
        let api: Api<Job> =
            Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match api.delete(&job.name_any(), &dp).await {
            Ok(_) => {
                self.recorder.event(
                    cj,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted job {}", job.name_any()),
                );
                Ok(())
            }
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Finished Jobs beyond the history limits go, oldest first.
    async fn clean_history(&self, cj: &CronJob, owned: &[Arc<Job>]) -> Result<(), ReconcileError> {
        let spec = cj.spec.clone().unwrap_or_default();
        for (state, limit) in [
            ("Complete", spec.successful_jobs_history_limit),
            ("Failed", spec.failed_jobs_history_limit),
        ] {
            let Some(limit) = limit.and_then(|l| usize::try_from(l).ok()) else {
                continue;
            };
            let mut done: Vec<&Arc<Job>> = owned
                .iter()
                .filter(|j| job_state(j) == state && j.metadata.deletion_timestamp.is_none())
                .collect();
            done.sort_by_key(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref().or(s.completion_time.as_ref()))
                    .map(|t| t.0)
            });
            let surplus = done.len().saturating_sub(limit);
            for j in &done[..surplus] {
                self.delete_job(cj, j).await?;
            }
        }
        Ok(())
    }

    async fn write_status(
        &self,
        cj: &CronJob,
        status: CronJobStatus,
    ) -> Result<(), ReconcileError> {
        if cj.status.clone().unwrap_or_default() == status {
            return Ok(());
        }
        let api: Api<CronJob> =
            Api::namespaced(self.client.clone(), &cj.namespace().unwrap_or_default());
        let mut next = cj.clone();
        next.status = Some(status);
        api.replace_status(&cj.name_any(), &PostParams::default(), &next)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cron_job(extra: serde_json::Value) -> CronJob {
        let mut v = json!({
            "metadata": {"name": "tick", "namespace": "default", "uid": "cj-uid",
                "creationTimestamp": "2025-01-01T00:00:30Z"},
            "spec": {"schedule": "*/1 * * * *", "jobTemplate": {
                "metadata": {"labels": {"app": "tick"}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}},
        });
        if let (Some(a), serde_json::Value::Object(b)) = (v["spec"].as_object_mut(), extra) {
            a.extend(b);
        }
        serde_json::from_value(v).unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn due_times_follow_the_last_schedule_and_the_deadline() {
        let s = Schedule::new("*/1 * * * *", None).unwrap();
        let cj = cron_job(json!({}));
        // Created at 00:00:30: the first time is 00:01:00.
        assert_eq!(due_time(&cj, &s, ts("2025-01-01T00:00:59Z")), (None, false));
        assert_eq!(
            due_time(&cj, &s, ts("2025-01-01T00:03:10Z")),
            (Some(ts("2025-01-01T00:03:00Z")), false)
        );
        let mut ran = cj.clone();
        ran.status = Some(CronJobStatus {
            last_schedule_time: Some(Time(ts("2025-01-01T00:03:00Z"))),
            ..Default::default()
        });
        assert_eq!(due_time(&ran, &s, ts("2025-01-01T00:03:40Z")).0, None);
        // Down for a day: more than 100 missed, unless the deadline bounds the search.
        assert!(due_time(&ran, &s, ts("2025-01-02T00:00:10Z")).1);
        let bounded = cron_job(json!({"startingDeadlineSeconds": 30}));
        assert_eq!(
            due_time(&bounded, &s, ts("2025-01-02T00:00:10Z")),
            (Some(ts("2025-01-02T00:00:00Z")), false)
        );
    }

    #[test]
    fn jobs_are_named_by_their_minute_and_carry_the_template() {
        let cj = cron_job(json!({"timeZone": "Europe/Berlin"}));
        let j = job_for(&cj, ts("2025-01-01T00:05:00Z"), Some("Europe/Berlin"));
        assert_eq!(j.metadata.name.as_deref(), Some("tick-28928165"));
        assert_eq!(j.labels()["app"], "tick");
        assert_eq!(
            j.annotations()[SCHEDULED_TIMESTAMP],
            "2025-01-01T01:05:00+01:00"
        );
        let r = &j.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((r.kind.as_str(), r.controller), ("CronJob", Some(true)));
        assert!(j.spec.is_some());
    }

    fn owned(name: &str, condition: Option<&str>, deleting: bool) -> Arc<Job> {
        let mut j = json!({"metadata": {"name": name, "namespace": "default"}});
        if let Some(c) = condition {
            j["status"] = json!({"conditions": [{"type": c, "status": "True"}]});
        }
        if deleting {
            j["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(j).unwrap())
    }

    #[test]
    fn the_concurrency_policy_decides_at_a_due_time() {
        let none: Vec<Arc<Job>> = vec![];
        // Nothing runs: every policy creates.
        for p in [None, Some("Allow"), Some("Forbid"), Some("Replace")] {
            assert_eq!(at_due_time(p, &none), AtDueTime::Create, "{p:?}");
        }
        // Finished Jobs and ones being deleted do not count as running.
        let done = vec![
            owned("a", Some("Complete"), false),
            owned("b", Some("Failed"), false),
            owned("c", None, true),
        ];
        for p in [None, Some("Forbid"), Some("Replace")] {
            assert_eq!(at_due_time(p, &done), AtDueTime::Create, "{p:?}");
        }
        // One runs among them: Allow creates beside it, Forbid skips, Replace names it alone.
        let mut with_running = done.clone();
        with_running.push(owned("d", None, false));
        assert_eq!(at_due_time(None, &with_running), AtDueTime::Create);
        assert_eq!(at_due_time(Some("Allow"), &with_running), AtDueTime::Create);
        assert_eq!(at_due_time(Some("Forbid"), &with_running), AtDueTime::Skip);
        match at_due_time(Some("Replace"), &with_running) {
            AtDueTime::Replace(js) => {
                let names: Vec<String> = js.iter().map(|j| j.name_any()).collect();
                assert_eq!(names, ["d"]);
            }
            other => panic!("{other:?}"),
        }
        // Several running: Replace deletes all of them.
        with_running.push(owned("e", Some("Suspended"), false));
        match at_due_time(Some("Replace"), &with_running) {
            AtDueTime::Replace(js) => assert_eq!(js.len(), 2),
            other => panic!("{other:?}"),
        }
    }
}
