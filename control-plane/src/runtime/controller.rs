//! Running a reconciler: workers take keys from the [`WorkQueue`] one at a time per key,
//! call [`Reconciler::reconcile`], and then either wait for the next change
//! ([`Action::AwaitChange`]), run the key again later ([`Action::RequeueAfter`]), or retry a
//! failure after the key's back-off. The shape of kube-runtime's `Controller`, with the queue
//! and informers of our own so that several controllers share indexed caches.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::ObjectReference;
use tokio_util::sync::CancellationToken;

use super::events::{EventType, Recorder};
use super::metrics::{Metrics, Outcome, PANICS_UNHEALTHY};
use super::queue::{QueueKey, WorkQueue};

/// What to do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until an informer sees a change that maps to this key.
    AwaitChange,
    /// Reconcile again after this delay (e.g. when minReadySeconds or a deadline elapses).
    RequeueAfter(Duration),
}

/// Why a reconcile failed; the key is retried after its back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    #[error("object cannot be reconciled: {0}")]
    Invalid(String),
    #[error("{0}")]
    Retry(String),
}

impl ReconcileError {
    /// Whether the API answered 404 NotFound.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReconcileError::Api(kube::Error::Api(s)) if s.code == 404)
    }
}

/// The API error code of a kube error, if the server answered with a Status.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// A controller's logic for one key: read the caches, compare desired with actual, write the
/// difference through the API.
pub trait Reconciler: Send + Sync + 'static {
    type Key: QueueKey + Display;

    fn reconcile(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Action, ReconcileError>> + Send;

    /// The object `key` names, with the recorder for Events about it: where a reconcile that
    /// keeps panicking is reported to the user. None (the default): logs, metrics and health
    /// only.
    fn involved_object(&self, _key: &Self::Key) -> Option<(Recorder, ObjectReference)> {
        None
    }
}

/// [`Reconciler::involved_object`] for a controller whose keys name objects of an informer.
pub fn involved<K>(
    informer: &super::Informer<K>,
    key: &super::ObjectKey,
    recorder: &Recorder,
) -> Option<(Recorder, ObjectReference)>
where
    K: super::informer::Cached + kube::Resource<DynamicType = ()>,
{
    let obj = informer.get(key)?;
    Some((recorder.clone(), obj.object_ref(&())))
}

/// The text of a panic's payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// A reconciler with its queue and workers.
pub struct Controller<R: Reconciler> {
    name: &'static str,
    reconciler: Arc<R>,
    queue: WorkQueue<R::Key>,
    workers: usize,
    metrics: Metrics,
}

impl<R: Reconciler> Controller<R> {
    /// `workers` keys are reconciled concurrently (never the same key twice at once).
    pub fn new(
        name: &'static str,
        reconciler: Arc<R>,
        queue: WorkQueue<R::Key>,
        workers: usize,
        metrics: Metrics,
    ) -> Controller<R> {
        Controller {
            name,
            reconciler,
            queue,
            workers: workers.max(1),
            metrics,
        }
    }

    /// Runs the workers until `token` is cancelled. An in-flight reconcile is dropped at
    /// cancellation (every write it made is atomic on the server), so a process that loses
    /// its lease stops acting at once.
    pub async fn run(self, token: CancellationToken) {
        tracing::info!(
            controller = self.name,
            workers = self.workers,
            "controller started"
        );
        let mut workers = Vec::new();
        for _ in 0..self.workers {
            let w = Worker {
                name: self.name,
                reconciler: self.reconciler.clone(),
                queue: self.queue.clone(),
                metrics: self.metrics.clone(),
            };
            workers.push(tokio::spawn(w.run(token.clone())));
        }
        // The depth gauge also moves while workers are busy: sample it.
        let (queue, metrics, name) = (self.queue.clone(), self.metrics.clone(), self.name);
        let sampler = tokio::spawn({
            let token = token.clone();
            async move {
                loop {
                    metrics.queue_depth(name, queue.len());
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        });
        token.cancelled().await;
        let _ = sampler.await;
        self.queue.shut_down();
        futures::future::join_all(workers).await;
        tracing::info!(controller = self.name, "controller stopped");
    }
}

struct Worker<R: Reconciler> {
    name: &'static str,
    reconciler: Arc<R>,
    queue: WorkQueue<R::Key>,
    metrics: Metrics,
}

impl<R: Reconciler> Worker<R> {
    async fn run(self, token: CancellationToken) {
        while let Some(key) = self.queue.get().await {
            self.metrics.dequeued(self.name, self.queue.len());
            let start = Instant::now();
            let work = AssertUnwindSafe(self.reconciler.reconcile(&key)).catch_unwind();
            let result = tokio::select! {
                r = work => r,
                _ = token.cancelled() => {
                    self.queue.done(&key);
                    return;
                }
            };
            let seconds = start.elapsed().as_secs_f64();
            if result.is_ok() {
                self.metrics.returned(self.name, &key.to_string());
            }
            match result {
                Ok(Ok(Action::AwaitChange)) => {
                    self.queue.forget(&key);
                    self.metrics
                        .reconciled(self.name, Outcome::Success, seconds);
                }
                Ok(Ok(Action::RequeueAfter(d))) => {
                    self.queue.forget(&key);
                    self.queue.add_after(key.clone(), d);
                    self.metrics
                        .reconciled(self.name, Outcome::Requeue, seconds);
                }
                Ok(Err(e)) => {
                    let retries = self.queue.retries(&key);
                    // Conflicts are the normal cost of optimistic concurrency: quieter.
                    if matches!(&e, ReconcileError::Api(k) if api_code(k) == Some(409)) {
                        tracing::debug!(controller = self.name, %key, error = %e, retries, "reconcile conflicted; retrying");
                    } else {
                        tracing::warn!(controller = self.name, %key, error = %e, retries, "reconcile failed; retrying");
                    }
                    self.queue.add_rate_limited(key.clone());
                    self.metrics.reconciled(self.name, Outcome::Error, seconds);
                }
                Err(payload) => {
                    let message = panic_message(payload.as_ref());
                    let times = self.metrics.panicked(self.name, key.to_string(), &message);
                    tracing::error!(controller = self.name, %key, times, panic = %message, "reconcile panicked; retrying");
                    if times == PANICS_UNHEALTHY {
                        if let Some((recorder, object)) = self.reconciler.involved_object(&key) {
                            recorder.event_ref(
                                object,
                                EventType::Warning,
                                "ReconcilePanicked",
                                format!(
                                    "the {} controller failed {times} times in a row on this object (a bug in the controller: {message}); it keeps retrying with back-off",
                                    self.name
                                ),
                            );
                        }
                    }
                    self.queue.add_rate_limited(key.clone());
                    self.metrics.reconciled(self.name, Outcome::Error, seconds);
                }
            }
            self.queue.done(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    use super::*;

    struct Flaky {
        calls: AtomicU32,
        seen: Mutex<Vec<u32>>,
    }

    impl Reconciler for Flaky {
        type Key = u32;

        async fn reconcile(&self, key: &u32) -> Result<Action, ReconcileError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            self.seen.lock().unwrap().push(*key);
            if n == 0 {
                return Err(ReconcileError::Retry("first try fails".into()));
            }
            Ok(Action::AwaitChange)
        }
    }

    #[tokio::test]
    async fn failures_are_retried_and_counted() {
        let r = Arc::new(Flaky {
            calls: AtomicU32::new(0),
            seen: Mutex::new(vec![]),
        });
        let q = WorkQueue::new();
        let m = Metrics::new();
        q.add(5);
        let token = CancellationToken::new();
        let c = Controller::new("flaky", r.clone(), q.clone(), 2, m.clone());
        let run = tokio::spawn(c.run(token.clone()));
        skiff_tests::wait_until_async("two reconciles", Duration::from_secs(5), || async {
            (m.reconcile_count("flaky") == 2).then_some(()).ok_or(())
        })
        .await;
        assert_eq!(*r.seen.lock().unwrap(), vec![5, 5]);
        assert!(m
            .render()
            .contains("skiff_controller_reconcile_errors_total{controller=\"flaky\"} 1"));
        token.cancel();
        run.await.unwrap();
    }

    /// Panics until told to stop.
    struct Panicky {
        stop: std::sync::atomic::AtomicBool,
    }

    impl Reconciler for Panicky {
        type Key = u32;

        async fn reconcile(&self, key: &u32) -> Result<Action, ReconcileError> {
            if !self.stop.load(Ordering::SeqCst) {
                panic!("ranking of key {key} is not a total order");
            }
            Ok(Action::AwaitChange)
        }
    }

    #[tokio::test]
    async fn a_key_that_keeps_panicking_is_counted_and_unhealthy_until_it_recovers() {
        let r = Arc::new(Panicky {
            stop: Default::default(),
        });
        let q = WorkQueue::new();
        let m = Metrics::new();
        q.add(7);
        let token = CancellationToken::new();
        let run = tokio::spawn(
            Controller::new("panicky", r.clone(), q.clone(), 1, m.clone()).run(token.clone()),
        );
        let health = skiff_tests::wait_until_async(
            "the controller reports its panics",
            Duration::from_secs(10),
            || async { m.panic_health().err().ok_or(()) },
        )
        .await;
        assert!(health.contains("controller panicky: reconcile of 7 panicked 3 times in a row: ranking of key 7 is not a total order"), "{health}");
        assert!(m
            .render()
            .contains("skiff_controller_reconcile_panics_total{controller=\"panicky\"}"));
        r.stop.store(true, Ordering::SeqCst);
        q.add(7);
        skiff_tests::wait_until_async("the key recovers", Duration::from_secs(30), || async {
            m.panic_health().ok().ok_or(())
        })
        .await;
        token.cancel();
        run.await.unwrap();
    }
}
