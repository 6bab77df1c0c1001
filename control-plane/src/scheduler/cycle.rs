//! The scheduling and binding cycles of one pod (kube-scheduler's `ScheduleOne`): the loop
//! thread pops a pod, decides under the cache lock, assumes the pod on the chosen node, and
//! hands the binding to a task on the async runtime so the next decision starts at once. A
//! failed binding forgets the assumption and backs the pod off. A pod no node fits runs
//! preemption (still under the lock, so the nomination is in the cache before the next
//! decision); victims are then marked and deleted, and the pod is parked with a
//! FailedScheduling event, PodScheduled=False and its nominatedNodeName, until the victims'
//! deletion brings it back.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::algorithm::{nominated_node, Algorithm, Decision, Failure};
use super::binder::{Binder, Nomination};
use super::cache::Cache;
use super::metrics::{AttemptResult, Metrics, Phase};
use super::plugins::volume_binding;
use super::pod_info::{PodInfo, PodUid};
use super::preemption::{self, Outcome};
use super::queue::{QueuedPod, SchedulingQueue};
use crate::runtime::{EventType, Recorder};

/// What preemption asks the API to do after a failed cycle.
struct PostFilter {
    nomination: Nomination,
    /// Node and victims to preempt there.
    victims: Option<(String, Vec<Arc<PodInfo>>)>,
    /// Pods of lower priority that lose their nomination to the preemptor.
    withdrawn: Vec<Arc<PodInfo>>,
}

impl PostFilter {
    fn none() -> PostFilter {
        PostFilter {
            nomination: Nomination::Keep,
            victims: None,
            withdrawn: Vec::new(),
        }
    }
}

/// The state the informer handlers, the loop and the binding tasks share.
pub struct Scheduler {
    pub(super) cache: Mutex<Cache>,
    pub(super) queue: SchedulingQueue,
    pub(super) metrics: Metrics,
    pub(super) scheduler_name: String,
    pub(super) binder: Binder,
    pub(super) recorder: Recorder,
    bind_slots: Arc<Semaphore>,
    /// Pending pods by `namespace/claim` of each claim they use: a claim event wakes its
    /// own pods only.
    claim_users: Mutex<HashMap<String, HashSet<PodUid>>>,
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
            claim_users: Mutex::new(HashMap::new()),
        }
    }

    fn claim_users_lock(&self) -> MutexGuard<'_, HashMap<String, HashSet<PodUid>>> {
        self.claim_users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records (`add`) or forgets a pending pod as a user of its claims.
    pub(super) fn track_claims(&self, uid: &PodUid, claims: &[String], add: bool) {
        if claims.is_empty() {
            return;
        }
        let mut users = self.claim_users_lock();
        for c in claims {
            if add {
                users.entry(c.clone()).or_default().insert(uid.clone());
            } else if let Some(set) = users.get_mut(c) {
                set.remove(uid);
                if set.is_empty() {
                    users.remove(c);
                }
            }
        }
    }

    /// The pending pods using the claim `namespace/name`.
    pub(super) fn users_of(&self, claim: &str) -> Vec<PodUid> {
        self.claim_users_lock()
            .get(claim)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
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
        let (result, post) = {
            let mut cache = self.cache();
            let r = algorithm.schedule(&mut cache, &pod);
            let mut post = PostFilter::none();
            match r {
                Ok(d) => {
                    cache.clear_nomination(&pod.uid);
                    cache.assume(pod.clone(), &d.node);
                    (Ok(d), post)
                }
                Err(Failure::Unfit(mut e)) => {
                    self.metrics.preemption_attempt();
                    let offset = rand::random_range(0..cache.node_count().max(1));
                    let outcome = preemption::preempt(&mut cache, &pod, offset);
                    e.diagnosis.post_filter = outcome.message();
                    match outcome {
                        Outcome::Preempt {
                            candidate,
                            lower_nominated,
                        } => {
                            cache.nominate(pod.clone(), &candidate.node);
                            for p in &lower_nominated {
                                cache.clear_nomination(&p.uid);
                            }
                            post.nomination = Nomination::Set(candidate.node.clone());
                            post.victims = Some((candidate.node, candidate.victims));
                            post.withdrawn = lower_nominated;
                        }
                        Outcome::NoCandidate(_) => {
                            if nominated_node(&cache, &pod).is_some() {
                                post.nomination = Nomination::Clear;
                            }
                            cache.clear_nomination(&pod.uid);
                        }
                        Outcome::Ineligible(_) => {}
                    }
                    (Err(Failure::Unfit(e)), post)
                }
                Err(f) => (Err(f), post),
            }
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
            Err(failure) => self.unschedulable(rt, qp, failure, started, post),
        }
    }

    fn unschedulable(
        self: &Arc<Self>,
        rt: &Handle,
        qp: QueuedPod,
        failure: Failure,
        started: Instant,
        post: PostFilter,
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
        if let Some((node, victims)) = &post.victims {
            self.metrics.preemption_victims(victims.len());
            tracing::info!(pod = %pod.key(), node = %node, victims = victims.len(), "preempting");
        }
        let me = self.clone();
        rt.spawn(async move {
            if let Some((node, victims)) = &post.victims {
                me.preempt(&pod, node, victims).await;
            }
            for p in &post.withdrawn {
                if let Err(e) = me.binder.clear_nomination(p).await {
                    tracing::warn!(pod = %p.key(), error = %e, "withdrawing a nomination failed");
                }
            }
            if let Err(e) = me
                .binder
                .mark_unschedulable(&pod, &message, &post.nomination)
                .await
            {
                tracing::debug!(pod = %pod.key(), error = %e, "setting PodScheduled=False failed");
            }
        });
    }

    /// Marks and deletes the victims (concurrently, as kube-scheduler's prepareCandidate),
    /// each with a Preempted event naming the preemptor.
    async fn preempt(&self, preemptor: &PodInfo, node: &str, victims: &[Arc<PodInfo>]) {
        let jobs = victims.iter().map(|v| async move {
            match self.binder.preempt(v, preemptor.scheduler_name()).await {
                Ok(()) => {
                    tracing::info!(victim = %v.key(), preemptor = %preemptor.key(), node, "preempted");
                    self.recorder.event(
                        v.pod.as_ref(),
                        EventType::Normal,
                        "Preempted",
                        format!("Preempted by pod {} on node {node}", preemptor.uid),
                    );
                }
                Err(e) => {
                    tracing::warn!(victim = %v.key(), error = %e, "preempting a victim failed");
                }
            }
        });
        futures::future::join_all(jobs).await;
    }

    /// VolumeBinding's PreBind: the pod's unbound WaitForFirstConsumer claims get the
    /// chosen node as their selected node (the provisioner's cue). Ok(true): every claim is
    /// bound, the pod may bind; Ok(false): it waits for its volumes.
    async fn pre_bind(&self, pod: &PodInfo, node: &str) -> Result<bool, String> {
        let Some(listers) = self.cache().volume_listers().cloned() else {
            return Ok(true);
        };
        let (to_select, unbound) = volume_binding::unbound_claims(&pod.pod, &listers);
        for claim in &to_select {
            let current = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::controllers::persistentvolume::ANN_SELECTED_NODE));
            if current.is_some_and(|n| n == node) {
                continue;
            }
            match self.binder.select_node(claim, node).await {
                Ok(()) => {}
                // The claim changed since the cache saw it: its event brings the pod back.
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
                Err(e) => return Err(e.to_string()),
            }
            tracing::info!(pod = %pod.key(), claim = ?claim.metadata.name, node, "selected node for the claim");
        }
        Ok(!unbound)
    }

    async fn bind(self: Arc<Self>, qp: QueuedPod, decision: Decision, started: Instant) {
        let pod = qp.info;
        match self.pre_bind(&pod, &decision.node).await {
            Ok(true) => {}
            Ok(false) => {
                // Not bound: its node is kept on the claims; the claims' events bring it back.
                self.cache().forget(&pod.uid);
                self.queue.wait_for_volumes(&pod.uid);
                tracing::debug!(pod = %pod.key(), node = %decision.node, "waiting for volumes");
                return;
            }
            Err(e) => {
                self.cache().forget(&pod.uid);
                self.queue.requeue_backoff(&pod.uid);
                self.metrics
                    .attempt(AttemptResult::Error, started.elapsed());
                tracing::info!(pod = %pod.key(), node = %decision.node, error = %e, "PreBind failed");
                self.recorder.event(
                    pod.pod.as_ref(),
                    EventType::Warning,
                    "FailedScheduling",
                    format!("running PreBind plugin \"VolumeBinding\": binding volumes: {e}"),
                );
                return;
            }
        }
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
                // A nomination to another node no longer holds room for anyone.
                let nominated = pod
                    .pod
                    .status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_deref())
                    .filter(|n| !n.is_empty());
                if nominated.is_some_and(|n| n != decision.node) {
                    if let Err(e) = self.binder.clear_nomination(&pod).await {
                        tracing::debug!(pod = %pod.key(), error = %e, "clearing the nomination failed");
                    }
                }
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
