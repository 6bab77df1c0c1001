//! The TTL-after-finished controller: deletes a finished Job (Complete or Failed)
//! `spec.ttlSecondsAfterFinished` seconds after it finished, with its pods (foreground
//! propagation, as Kubernetes does). A Job is looked at again exactly when its time is up;
//! before deleting, it is read from the API once more (the TTL may have changed since the
//! cache saw it) and deleted with its resourceVersion as precondition.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::{Client, ResourceExt};

use super::job::plan::{finished_at, is_finished};
use super::{pods, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "ttl-after-finished";

pub struct TtlAfterFinishedController {
    client: Client,
    jobs: Informer<Job>,
}

/// How long until `job` may be deleted (None: it never expires, or is being deleted).
fn time_left(job: &Job, now: Timestamp) -> Option<Duration> {
    if job.metadata.deletion_timestamp.is_some() || !is_finished(job) {
        return None;
    }
    let ttl = job.spec.as_ref()?.ttl_seconds_after_finished?;
    let finished = finished_at(job)?;
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
    Some(ttl.saturating_sub(pods::elapsed(finished, now)))
}

pub fn build(ctx: &Context) -> Controller<TtlAfterFinishedController> {
    let jobs = ctx.informers.get::<Job>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    jobs.on_change(move |c| {
        let job = c.object();
        if let Some(left) = time_left(job, Timestamp::now()) {
            q.add_after(ObjectKey::of(job.as_ref()), left);
        }
    });
    Controller::new(
        NAME,
        Arc::new(TtlAfterFinishedController {
            client: ctx.client.clone(),
            jobs,
        }),
        queue,
        ctx.settings.concurrent_ttl_syncs,
        ctx.metrics.clone(),
    )
}

impl Reconciler for TtlAfterFinishedController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(job) = self.jobs.get(key) else {
            return Ok(Action::AwaitChange);
        };
        match time_left(&job, Timestamp::now()) {
            None => return Ok(Action::AwaitChange),
            Some(left) if !left.is_zero() => return Ok(Action::RequeueAfter(left)),
            Some(_) => {}
        }
        let api: Api<Job> = Api::namespaced(self.client.clone(), key.namespace_or_empty());
        let Some(fresh) = api.get_opt(&key.name).await? else {
            return Ok(Action::AwaitChange);
        };
        match time_left(&fresh, Timestamp::now()) {
            None => return Ok(Action::AwaitChange),
            Some(left) if !left.is_zero() => return Ok(Action::RequeueAfter(left)),
            Some(_) => {}
        }
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions {
                uid: None,
                resource_version: fresh.resource_version(),
            }),
            ..Default::default()
        };
        match api.delete(&key.name, &dp).await {
            Ok(_) => {
                tracing::info!(job = %key, "deleted a finished Job whose TTL expired");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expires_ttl_after_the_terminal_condition() {
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "default"},
            "spec": {"ttlSecondsAfterFinished": 30, "template": {}},
            "status": {"conditions": [{"type": "Complete", "status": "True",
                "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(
            time_left(&job, at("2025-01-01T00:00:10Z")),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            time_left(&job, at("2025-01-01T00:01:00Z")),
            Some(Duration::ZERO)
        );
        let mut running = job.clone();
        running.status = None;
        assert_eq!(time_left(&running, at("2025-01-01T00:01:00Z")), None);
        let mut no_ttl = job.clone();
        no_ttl.spec.as_mut().unwrap().ttl_seconds_after_finished = None;
        assert_eq!(time_left(&no_ttl, at("2025-01-01T00:01:00Z")), None);
    }
}
