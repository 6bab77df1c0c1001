//! The scheduler's Prometheus metrics, named as kube-scheduler names them where it has them:
//! attempts by result, attempt / algorithm / binding durations, the end-to-end latency from
//! entering the queue to being bound, pending pods per queue, cache sizes, pods moved by
//! cluster events, preemption attempts and victims; plus the time a pod waits in the active queue and the filter and score
//! phases, which say where a decision's time goes.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, linear_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::queue::QueueSizes;

type Labels = Vec<(&'static str, &'static str)>;

/// How a scheduling attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    Scheduled,
    Unschedulable,
    Error,
}

impl AttemptResult {
    fn label(self) -> &'static str {
        match self {
            AttemptResult::Scheduled => "scheduled",
            AttemptResult::Unschedulable => "unschedulable",
            AttemptResult::Error => "error",
        }
    }
}

/// A phase of one decision (kube-scheduler's extension points, coarsely).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Pre-filters and filters.
    Filter,
    /// Pre-scores, scores and normalisation.
    Score,
    /// The binding request.
    Bind,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Filter => "Filter",
            Phase::Score => "Score",
            Phase::Bind => "Bind",
        }
    }
}

struct Inner {
    registry: Registry,
    attempts: Family<Labels, Counter>,
    attempt_duration: Family<Labels, Histogram>,
    algorithm_duration: Histogram,
    phase_duration: Family<Labels, Histogram>,
    e2e: Histogram,
    queue_wait: Histogram,
    pending: Family<Labels, Gauge>,
    cache_size: Family<Labels, Gauge>,
    incoming: Family<Labels, Counter>,
    preemption_attempts: Counter,
    preemption_victims: Histogram,
}

/// Cheap to clone; all clones update the same series.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn latency() -> Histogram {
    // 50 us .. ~27 min
    Histogram::new(exponential_buckets(0.00005, 2.0, 25))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("scheduler");
        let attempts = Family::<Labels, Counter>::default();
        let attempt_duration = Family::<Labels, Histogram>::new_with_constructor(latency);
        let algorithm_duration = latency();
        let phase_duration = Family::<Labels, Histogram>::new_with_constructor(latency);
        let e2e = latency();
        let queue_wait = latency();
        let pending = Family::<Labels, Gauge>::default();
        let cache_size = Family::<Labels, Gauge>::default();
        let incoming = Family::<Labels, Counter>::default();
        let preemption_attempts = Counter::default();
        // kube-scheduler's buckets: 5, 10, ... 50.
        let preemption_victims = Histogram::new(linear_buckets(5.0, 5.0, 10));
        registry.register(
            "schedule_attempts",
            "Scheduling attempts by result (scheduled, unschedulable, error)",
            attempts.clone(),
        );
        registry.register(
            "scheduling_attempt_duration_seconds",
            "Scheduling attempt latency (decision and binding) by result",
            attempt_duration.clone(),
        );
        registry.register(
            "scheduling_algorithm_duration_seconds",
            "Time to pick a node (filters and scores)",
            algorithm_duration.clone(),
        );
        registry.register(
            "framework_extension_point_duration_seconds",
            "Time in each phase (Filter, Score, Bind)",
            phase_duration.clone(),
        );
        registry.register(
            "pod_scheduling_sli_duration_seconds",
            "End-to-end latency from a pod entering the queue to its binding",
            e2e.clone(),
        );
        registry.register(
            "queue_wait_duration_seconds",
            "Time a pod waited in the active queue before its attempt",
            queue_wait.clone(),
        );
        registry.register(
            "pending_pods",
            "Pending pods by queue (active, backoff, unschedulable, gated)",
            pending.clone(),
        );
        registry.register(
            "cache_size",
            "Objects in the scheduler cache by type (nodes, pods, assumed_pods)",
            cache_size.clone(),
        );
        registry.register(
            "queue_incoming_pods",
            "Parked pods moved back to be retried, by the cluster event that moved them",
            incoming.clone(),
        );
        registry.register(
            "preemption_attempts",
            "Total preemption attempts in the cluster till now",
            preemption_attempts.clone(),
        );
        registry.register(
            "preemption_victims",
            "Number of selected preemption victims",
            preemption_victims.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                attempts,
                attempt_duration,
                algorithm_duration,
                phase_duration,
                e2e,
                queue_wait,
                pending,
                cache_size,
                incoming,
                preemption_attempts,
                preemption_victims,
            }),
        }
    }

    pub fn attempt(&self, result: AttemptResult, took: Duration) {
        let l = vec![("result", result.label())];
        self.inner.attempts.get_or_create(&l).inc();
        self.inner
            .attempt_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    pub fn algorithm(&self, took: Duration) {
        self.inner.algorithm_duration.observe(took.as_secs_f64());
    }

    pub fn phase(&self, phase: Phase, took: Duration) {
        self.inner
            .phase_duration
            .get_or_create(&vec![("extension_point", phase.label())])
            .observe(took.as_secs_f64());
    }

    pub fn scheduled_after(&self, since_queued: Duration) {
        self.inner.e2e.observe(since_queued.as_secs_f64());
    }

    pub fn queue_wait(&self, took: Duration) {
        self.inner.queue_wait.observe(took.as_secs_f64());
    }

    pub fn moved(&self, event: &'static str, pods: usize) {
        if pods > 0 {
            self.inner
                .incoming
                .get_or_create(&vec![("event", event)])
                .inc_by(pods as u64);
        }
    }

    pub fn set_queue(&self, s: QueueSizes) {
        for (q, n) in [
            ("active", s.active + s.in_flight),
            ("backoff", s.backoff),
            ("unschedulable", s.unschedulable),
            ("gated", s.gated),
        ] {
            self.inner
                .pending
                .get_or_create(&vec![("queue", q)])
                .set(n as i64);
        }
    }

    pub fn set_cache(&self, nodes: usize, pods: usize, assumed: usize) {
        for (t, n) in [("nodes", nodes), ("pods", pods), ("assumed_pods", assumed)] {
            self.inner
                .cache_size
                .get_or_create(&vec![("type", t)])
                .set(n as i64);
        }
    }

    /// One run of preemption (the PostFilter), whatever it decided.
    pub fn preemption_attempt(&self) {
        self.inner.preemption_attempts.inc();
    }

    /// Preemption chose `victims` pods to remove.
    pub fn preemption_victims(&self, victims: usize) {
        self.inner.preemption_victims.observe(victims as f64);
    }

    /// Preemption attempts so far.
    pub fn preemption_attempts(&self) -> u64 {
        self.inner.preemption_attempts.get()
    }

    /// Attempts so far with `result` (for tests and health).
    pub fn attempts(&self, result: AttemptResult) -> u64 {
        self.inner
            .attempts
            .get_or_create(&vec![("result", result.label())])
            .get()
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.inner.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_kube_scheduler_names() {
        let m = Metrics::new();
        m.attempt(AttemptResult::Scheduled, Duration::from_millis(3));
        m.attempt(AttemptResult::Unschedulable, Duration::from_millis(1));
        m.phase(Phase::Bind, Duration::from_millis(2));
        m.set_queue(QueueSizes {
            active: 2,
            unschedulable: 1,
            ..Default::default()
        });
        m.moved("NodeAdd", 3);
        m.preemption_attempt();
        m.preemption_victims(2);
        let text = m.render();
        assert!(
            text.contains("scheduler_preemption_attempts_total 1"),
            "{text}"
        );
        assert!(
            text.contains("scheduler_preemption_victims_bucket{le=\"5.0\"} 1"),
            "{text}"
        );
        assert_eq!(m.preemption_attempts(), 1);
        assert!(text.contains("scheduler_schedule_attempts_total{result=\"scheduled\"} 1"));
        assert!(text.contains("scheduler_pending_pods{queue=\"unschedulable\"} 1"));
        assert!(text.contains("scheduler_pending_pods{queue=\"active\"} 2"));
        assert!(text.contains("scheduler_queue_incoming_pods_total{event=\"NodeAdd\"} 3"));
        assert!(text.contains("scheduler_framework_extension_point_duration_seconds_count{extension_point=\"Bind\"} 1"));
        assert_eq!(m.attempts(AttemptResult::Unschedulable), 1);
    }
}
