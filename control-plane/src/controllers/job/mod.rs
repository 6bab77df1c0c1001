//! The Job controller: runs a Job's pods to completion with finalizer-based tracking.
//!
//! Per key: claim the Job's pods, [`plan::plan`] the sync (new finished pods, the outcome,
//! creations and deletions), write the status with the new finished pods in
//! `uncountedTerminatedPods`, create and delete pods (creations wait until earlier ones are
//! seen, and for the failure back-off), remove the tracking finalizer from the finished pods,
//! then [`plan::settle`] them into the counters and, once nothing runs any more, write
//! Complete or Failed. Pod events reach their Job through the controller reference, batched
//! for a second as Kubernetes does, so a Job of many pods is synced once per batch rather
//! than once per pod change. Pods that still carry the finalizer but whose Job is gone (or
//! is another Job by now) are released by the same key.

pub mod failure;
pub mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use self::plan::{Backoff, Creations, COMPLETION_INDEX, INDEX_FAILURE_COUNT, TRACKING_FINALIZER};
use super::{pods, Context};
use crate::machinery::LabelSelector;
use crate::runtime::controller::api_code;
use crate::runtime::owner::{self, controller_of};
use crate::runtime::{
    Action, Change, Controller, Expectations, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "job";
/// Pods of a Job by `<namespace>/<job name>` of their controller reference (also after the
/// Job is gone, to release their finalizers).
const BY_JOB_NAME: &str = "job-name";
/// Pod changes reach their Job at most once per this period (Kubernetes' syncJobBatchPeriod).
const BATCH_PERIOD: Duration = Duration::from_secs(1);
/// Finalizer removals in flight at once.
const RELEASE_CONCURRENCY: usize = 16;

pub struct JobController {
    client: Client,
    jobs: Informer<Job>,
    pods: Informer<Pod>,
    expectations: Arc<Expectations<ObjectKey, ObjectKey>>,
    backoff: Mutex<HashMap<String, Backoff>>,
    recorder: Recorder,
}

fn job_of(reference: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference) -> bool {
    reference.kind == "Job" && reference.api_version.starts_with("batch/")
}

fn index_by_job_name(p: &Pod) -> Vec<String> {
    controller_of(p.meta())
        .filter(|r| job_of(r))
        .map(|r| format!("{}/{}", p.namespace().unwrap_or_default(), r.name))
        .into_iter()
        .collect()
}

/// Registers the controller's informers and handlers.
pub fn build(ctx: &Context) -> Controller<JobController> {
    let jobs = ctx.informers.get::<Job>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    pods.add_index(BY_JOB_NAME, index_by_job_name);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let expectations: Arc<Expectations<ObjectKey, ObjectKey>> = Arc::default();

    let (q, exp) = (queue.clone(), expectations.clone());
    jobs.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        if let Change::Deleted(_) = c {
            exp.forget(&key);
        }
        q.add(key);
    });
    let (q, exp) = (queue.clone(), expectations.clone());
    pods.on_change(move |c| on_pod_change(c, &q, &exp));

    let reconciler = JobController {
        client: ctx.client.clone(),
        jobs,
        pods,
        expectations,
        backoff: Mutex::default(),
        recorder: ctx.events.recorder("job-controller"),
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_job_syncs,
        ctx.metrics.clone(),
    )
}

fn on_pod_change(
    c: &Change<Pod>,
    queue: &WorkQueue<ObjectKey>,
    exp: &Expectations<ObjectKey, ObjectKey>,
) {
    let pod = c.object();
    let Some(r) = controller_of(pod.meta()).filter(|r| job_of(r)) else {
        return;
    };
    let key = ObjectKey::namespaced(pod.namespace().unwrap_or_default(), r.name.clone());
    match c {
        Change::Added(p) if !pods::is_terminating(p) => exp.creation_observed(&key),
        Change::Added(p) | Change::Deleted(p) => {
            exp.deletion_observed(&key, &ObjectKey::of(p.as_ref()))
        }
        Change::Updated { old, new } => {
            if pods::is_terminating(new) && !pods::is_terminating(old) {
                exp.deletion_observed(&key, &ObjectKey::of(new.as_ref()));
            }
        }
    }
    queue.add_after(key, BATCH_PERIOD);
}

impl Reconciler for JobController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let job = self.jobs.get(key);
        let uid = job.as_ref().and_then(|j| j.uid());
        // Pods that hold the finalizer for a Job that is gone, or was another Job of the
        // same name, are let go.
        let strays: Vec<Arc<Pod>> = self
            .pods
            .by_index(BY_JOB_NAME, &key.to_string())
            .into_iter()
            .filter(|p| plan::has_finalizer(p))
            .filter(|p| controller_of(p.meta()).map(|r| Some(&r.uid)) != Some(uid.as_ref()))
            .collect();
        self.release(&strays).await?;
        let Some(job) = job else {
            self.expectations.forget(key);
            if let Some(u) = uid {
                self.forget_backoff(&u);
            }
            return Ok(Action::AwaitChange);
        };
        self.sync(key, &job).await
    }
}

impl JobController {
    async fn sync(&self, key: &ObjectKey, job: &Arc<Job>) -> Result<Action, ReconcileError> {
        let uid = job.uid().unwrap_or_default();
        let spec = job.spec.clone().unwrap_or_default();
        let claimed = match spec.selector.as_ref().map(LabelSelector::from_meta) {
            Some(Ok(sel)) => owner::claim(&self.client, job.as_ref(), &sel, &self.pods).await?,
            _ => {
                tracing::warn!(job = %key, "invalid selector; not syncing");
                return Ok(Action::AwaitChange);
            }
        };
        let now = Timestamp::now();
        let backoff = self.backoff_of(&uid);
        let manage = self.expectations.satisfied(key);
        let plan = plan::plan(job, &claimed, now, &backoff, manage);
        self.set_backoff(&uid, plan.backoff);

        // 1. The new finished pods are recorded before their finalizers go.
        let mut current = self.write_status(job, &plan.status).await?;
        for (kind, reason, message) in &plan.events {
            self.recorder
                .event(job.as_ref(), *kind, reason, message.clone());
        }
        // 2. Pods.
        let result = self.manage(key, job, &plan).await;
        // 3. Release the finished pods, then count them.
        let released = self.release(&plan.release).await;
        let still_held: HashSet<String> = claimed
            .iter()
            .filter(|p| plan::has_finalizer(p))
            .filter_map(|p| p.uid())
            .filter(|u| !released.as_ref().is_ok_and(|r| r.contains(u)))
            .collect();
        let (status, events) = plan::settle(
            job,
            current.status.clone().unwrap_or_default(),
            &still_held,
            plan.target.as_ref(),
            plan.remaining_pods,
            now,
        );
        current = self.write_status(&current, &status).await?;
        for (kind, reason, message) in events {
            self.recorder.event(current.as_ref(), kind, reason, message);
        }
        result?;
        released?;
        if let Some(t) = plan
            .target
            .as_ref()
            .filter(|_| !plan::is_finished(&current))
        {
            tracing::debug!(job = %key, outcome = t.terminal(), "waiting for the pods to end");
        }
        Ok(plan
            .requeue
            .map_or(Action::AwaitChange, Action::RequeueAfter))
    }

    fn backoff_of(&self, uid: &str) -> Backoff {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .copied()
            .unwrap_or_default()
    }

    fn set_backoff(&self, uid: &str, b: Backoff) {
        let mut m = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        if b == Backoff::default() {
            m.remove(uid);
        } else {
            m.insert(uid.to_string(), b);
        }
    }

    fn forget_backoff(&self, uid: &str) {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Writes `status` unless the Job has it already; the cached resourceVersion makes a
    /// concurrent change a conflict (the sync then runs again on fresh state).
    async fn write_status(
        &self,
        job: &Job,
        status: &JobStatus,
    ) -> Result<Arc<Job>, ReconcileError> {
        if job.status.as_ref() == Some(status) {
            return Ok(Arc::new(job.clone()));
        }
        let api: Api<Job> =
            Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
        let mut next = job.clone();
        next.status = Some(status.clone());
        let written = api
            .replace_status(&job.name_any(), &PostParams::default(), &next)
            .await?;
        Ok(Arc::new(written))
    }

    async fn manage(
        &self,
        key: &ObjectKey,
        job: &Job,
        plan: &plan::Plan,
    ) -> Result<(), ReconcileError> {
        let reference = job.object_ref(&());
        if !plan.delete.is_empty() {
            let keys: Vec<ObjectKey> = plan
                .delete
                .iter()
                .map(|p| ObjectKey::of(p.as_ref()))
                .collect();
            self.expectations.expect_deletions(key, keys.clone());
            let results =
                futures::future::join_all(plan.delete.iter().zip(&keys).map(|(p, k)| {
                    pods::delete(&self.client, &self.recorder, &reference, k, p.uid())
                }))
                .await;
            let mut first = None;
            for (r, k) in results.into_iter().zip(&keys) {
                if let Err(e) = r {
                    self.expectations.deletion_observed(key, k);
                    first.get_or_insert(e);
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
        }
        let n = plan.create.len();
        if n == 0 {
            return Ok(());
        }
        self.expectations.expect_creations(key, n);
        let mut templates: Vec<Pod> = match &plan.create {
            Creations::Count(n) => vec![job_pod(job, None); *n],
            Creations::Indexes(ix) => ix
                .iter()
                .map(|&(i, f)| job_pod(job, Some((i, f))))
                .collect(),
        };
        templates.reverse();
        let next = Mutex::new(templates);
        let (created, err) = pods::slow_start_batch(n, || {
            let pod = next.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let reference = &reference;
            async move {
                match pod {
                    Some(pod) => pods::create(&self.client, &self.recorder, reference, &pod)
                        .await
                        .map(|_| ()),
                    None => Ok(()),
                }
            }
        })
        .await;
        for _ in created..n {
            self.expectations.creation_observed(key);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Removes the tracking finalizer from `pods`; the uids it was removed from (or whose pod
    /// is gone already).
    async fn release(&self, targets: &[Arc<Pod>]) -> Result<HashSet<String>, ReconcileError> {
        let patch =
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
        let patch = &patch;
        let results: Vec<Result<Option<String>, ReconcileError>> =
            futures::stream::iter(targets.iter().cloned())
                .map(|p| async move {
                    let api: Api<Pod> =
                        Api::namespaced(self.client.clone(), &p.namespace().unwrap_or_default());
                    match api
                        .patch(
                            &p.name_any(),
                            &PatchParams::default(),
                            &Patch::Strategic(patch),
                        )
                        .await
                    {
                        Ok(_) => Ok(p.uid()),
                        Err(e) if api_code(&e) == Some(404) => Ok(p.uid()),
                        Err(e) => Err(e.into()),
                    }
                })
                .buffer_unordered(RELEASE_CONCURRENCY)
                .collect()
                .await;
        let mut done = HashSet::new();
        let mut first = None;
        for r in results {
            match r {
                Ok(Some(u)) => {
                    done.insert(u);
                }
                Ok(None) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }
}

/// A pod of `job` (of completion index `index`, with the failures its index had): the
/// template, a controller reference, the tracking finalizer; for Indexed Jobs the index as
/// annotation, label and `JOB_COMPLETION_INDEX`, and the hostname `<job>-<index>`.
pub fn job_pod(job: &Job, index: Option<(i32, i32)>) -> Pod {
    let spec = job.spec.clone().unwrap_or_default();
    let name = job.name_any();
    let prefix = match index {
        Some((i, _)) => format!("{name}-{i}"),
        None => name.clone(),
    };
    let mut extra = BTreeMap::new();
    if let Some((i, _)) = index {
        extra.insert(COMPLETION_INDEX.to_string(), i.to_string());
    }
    let mut pod = pods::from_template(
        &spec.template,
        &job.namespace().unwrap_or_default(),
        &prefix,
        owner::controller_ref(job),
        &extra,
    );
    pod.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push(TRACKING_FINALIZER.into());
    if let Some((i, failures)) = index {
        let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(COMPLETION_INDEX.into(), i.to_string());
        if spec.backoff_limit_per_index.is_some() {
            annotations.insert(INDEX_FAILURE_COUNT.into(), failures.to_string());
        }
        if let Some(ps) = pod.spec.as_mut() {
            if ps.hostname.is_none() {
                ps.hostname = Some(format!("{name}-{i}"));
            }
            let env = EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                    }),
                    ..Default::default()
                }),
            };
            for c in ps
                .containers
                .iter_mut()
                .chain(ps.init_containers.iter_mut().flatten())
            {
                let e = c.env.get_or_insert_with(Vec::new);
                if !e.iter().any(|v| v.name == env.name) {
                    e.push(env.clone());
                }
            }
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexed_pods_carry_their_index() {
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "sq", "namespace": "default", "uid": "u"},
            "spec": {"completionMode": "Indexed", "completions": 3,
                "template": {"metadata": {"labels": {"app": "sq"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}
        }))
        .unwrap();
        let p = job_pod(&job, Some((2, 0)));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("sq-2-"));
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[COMPLETION_INDEX],
            "2"
        );
        assert_eq!(p.metadata.labels.as_ref().unwrap()[COMPLETION_INDEX], "2");
        assert_eq!(
            p.metadata.finalizers.as_deref(),
            Some(&[TRACKING_FINALIZER.to_string()][..])
        );
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("sq-2"));
        let env = &spec.containers[0].env.as_ref().unwrap()[0];
        assert_eq!(env.name, "JOB_COMPLETION_INDEX");
        let plain = job_pod(&job, None);
        assert_eq!(plain.metadata.generate_name.as_deref(), Some("sq-"));
        assert!(plain.spec.unwrap().hostname.is_none());
    }
}
