//! The scheduling and binding cycles of one pod (kube-scheduler's `ScheduleOne`): the loop
//! thread pops a pod, decides under the cache lock, assumes the pod on the chosen node, and
//! hands the binding to a task on the async runtime so the next decision starts at once. A
//! failed binding forgets the assumption and backs the pod off; a pod no node fits is parked
//! with a FailedScheduling event and PodScheduled=False.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::algorithm::{Algorithm, Decision, Failure};
use super::binder::Binder;
use super::cache::Cache;
use super::metrics::{AttemptResult, Metrics, Phase};
use super::queue::{QueuedPod, SchedulingQueue};
use crate::runtime::{EventType, Recorder};

/// The state the informer handlers, the loop and the binding tasks share.
pub struct Scheduler {
    pub(super) cache: Mutex<Cache>,
    pub(super) queue: SchedulingQueue,
    pub(super) metrics: Metrics,
    pub(super) scheduler_name: String,
    binder: Binder,
    recorder: Recorder,
    bind_slots: Arc<Semaphore>,
}

impl Scheduler {
    pub fn new(
        scheduler_name: String,
        queue: SchedulingQueue,
        metrics: Metrics,
        binder: Binder,
        recorder: Recorder,
        parallel_binds: usize,
    ) -> Scheduler {
        Scheduler {
            cache: Mutex::new(Cache::new()),
            queue,
            metrics,
            scheduler_name,
            binder,
            recorder,
            bind_slots: Arc::new(Semaphore::new(parallel_binds.max(1))),
        }
    }

    pub(super) fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Schedules pods until `stop` is cancelled (blocking: run it on its own thread).
    pub fn scheduling_loop(
        self: &Arc<Self>,
        algorithm: &mut Algorithm,
        rt: &Handle,
        stop: &CancellationToken,
    ) {
        tracing::info!("scheduling loop started");
        while let Some(qp) = self.queue.pop(&|| stop.is_cancelled()) {
            self.schedule_one(algorithm, rt, qp);
        }
        tracing::info!("scheduling loop stopped");
    }

    fn schedule_one(self: &Arc<Self>, algorithm: &mut Algorithm, rt: &Handle, qp: QueuedPod) {
        let pod = qp.info.clone();
        if pod.terminating() {
            // A pod being deleted is not placed (kube-scheduler's skipPodSchedule).
            self.queue.done(&pod.uid);
            return;
        }
        let started = Instant::now();
        self.metrics
            .queue_wait(started.saturating_duration_since(qp.activated));
        let result = {
            let mut cache = self.cache();
            let r = algorithm.schedule(&mut cache, &pod);
            if let Ok(d) = &r {
                cache.assume(pod.clone(), &d.node);
            }
            r
        };
        let times = algorithm.last_phase_times();
        self.metrics.algorithm(started.elapsed());
        self.metrics.phase(Phase::Filter, times.filter);
        if !times.score.is_zero() {
            self.metrics.phase(Phase::Score, times.score);
        }
        match result {
            Ok(decision) => {
                let me = self.clone();
                rt.spawn(async move { me.bind(qp, decision, started).await });
            }
            Err(failure) => self.unschedulable(rt, qp, failure, started),
        }
    }

    fn unschedulable(
        self: &Arc<Self>,
        rt: &Handle,
        qp: QueuedPod,
        failure: Failure,
        started: Instant,
    ) {
        let pod = qp.info;
        let message = failure.to_string();
        tracing::info!(pod = %pod.key(), attempts = qp.attempts, reason = %message, "unable to schedule pod; waiting");
        self.queue
            .requeue_unschedulable(&pod.uid, failure.rejected_by());
        self.metrics
            .attempt(AttemptResult::Unschedulable, started.elapsed());
        self.recorder.event(
            pod.pod.as_ref(),
            EventType::Warning,
            "FailedScheduling",
            message.clone(),
        );
        let binder = self.binder.clone();
        rt.spawn(async move {
            if let Err(e) = binder.mark_unschedulable(&pod, &message).await {
                tracing::debug!(pod = %pod.key(), error = %e, "setting PodScheduled=False failed");
            }
        });
    }

    async fn bind(self: Arc<Self>, qp: QueuedPod, decision: Decision, started: Instant) {
        let pod = qp.info;
        let result = {
            let _slot = self.bind_slots.acquire().await;
            let t = Instant::now();
            let r = self.binder.bind(&pod, &decision.node).await;
            self.metrics.phase(Phase::Bind, t.elapsed());
            r
        };
        match result {
            Ok(()) => {
                let now = Instant::now();
                self.cache().finish_binding(&pod.uid, now);
                self.queue.done(&pod.uid);
                self.metrics
                    .attempt(AttemptResult::Scheduled, now - started);
                self.metrics.scheduled_after(now - qp.first_queued);
                tracing::debug!(pod = %pod.key(), node = %decision.node, evaluated = decision.evaluated,
                    feasible = decision.feasible, "bound");
                self.recorder.event(
                    pod.pod.as_ref(),
                    EventType::Normal,
                    "Scheduled",
                    format!("Successfully assigned {} to {}", pod.key(), decision.node),
                );
            }
            Err(e) => {
                self.cache().forget(&pod.uid);
                self.queue.requeue_backoff(&pod.uid);
                self.metrics
                    .attempt(AttemptResult::Error, started.elapsed());
                let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                tracing::info!(pod = %pod.key(), node = %decision.node, error = %e, "binding failed");
                if !gone {
                    self.recorder.event(
                        pod.pod.as_ref(),
                        EventType::Warning,
                        "FailedScheduling",
                        format!("Binding rejected: {e}"),
                    );
                }
            }
        }
    }
}
