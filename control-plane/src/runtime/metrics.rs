//! Prometheus metrics of the controller runtime, shared by every controller of a process (and
//! by the scheduler): reconciles by result, reconcile latency, queue depth and adds, retries,
//! and whether this process leads. Rendered in the text format by the ops server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// How one reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; wait for the next change.
    Success,
    /// Done; asked to run again after a delay.
    Requeue,
    /// Failed; retried after the key's back-off.
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Requeue => "requeue",
            Outcome::Error => "error",
        }
    }
}

/// Cheap to clone; every clone updates the same metrics.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Family<Labels, Histogram>,
    depth: Family<Labels, Gauge>,
    adds: Family<Labels, Counter>,
    leader: Family<Labels, Gauge>,
    panics: Family<Labels, Counter>,
    /// Keys whose last reconciles panicked: (controller, key) -> (times in a row, message).
    panicking: Mutex<HashMap<PanickingKey, (u32, String)>>,
}

/// A controller and one of its keys.
type PanickingKey = (&'static str, String);

/// After this many panics in a row on one key, the controller is reported unhealthy and an
/// Event is written on the object.
pub const PANICS_UNHEALTHY: u32 = 3;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("skiff_controller");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let duration = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let depth = Family::<Labels, Gauge>::default();
        let adds = Family::<Labels, Counter>::default();
        let leader = Family::<Labels, Gauge>::default();
        let panics = Family::<Labels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller and result (success, requeue, error)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by controller",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile latency by controller",
            duration.clone(),
        );
        registry.register(
            "queue_depth",
            "Keys waiting in the work queue by controller",
            depth.clone(),
        );
        registry.register(
            "queue_adds",
            "Keys handed to workers by controller",
            adds.clone(),
        );
        registry.register(
            "leader",
            "1 while this process holds the named leader-election lease",
            leader.clone(),
        );
        registry.register(
            "reconcile_panics",
            "Reconciles that panicked, by controller (a bug: the key is retried with back-off)",
            panics.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                reconciles,
                errors,
                duration,
                depth,
                adds,
                leader,
                panics,
                panicking: Mutex::default(),
            }),
        }
    }

    fn labels(controller: &str) -> Labels {
        vec![("controller", controller.to_string())]
    }

    /// Records one finished reconcile.
    pub fn reconciled(&self, controller: &str, outcome: Outcome, seconds: f64) {
        let mut l = Self::labels(controller);
        self.inner.duration.get_or_create(&l).observe(seconds);
        if outcome == Outcome::Error {
            self.inner.errors.get_or_create(&l).inc();
        }
        l.push(("result", outcome.label().to_string()));
        self.inner.reconciles.get_or_create(&l).inc();
    }

    /// Records a reconcile of `key` that panicked with `message`; returns how many times in a
    /// row that key has panicked.
    pub fn panicked(&self, controller: &'static str, key: String, message: &str) -> u32 {
        self.inner
            .panics
            .get_or_create(&Self::labels(controller))
            .inc();
        let mut p = self
            .inner
            .panicking
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = p.entry((controller, key)).or_insert((0, String::new()));
        entry.0 += 1;
        entry.1 = message.to_string();
        entry.0
    }

    /// Records a reconcile of `key` that returned (successfully or with an error): its run of
    /// panics, if any, is over.
    pub fn returned(&self, controller: &'static str, key: &str) {
        let mut p = self
            .inner
            .panicking
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !p.is_empty() {
            p.remove(&(controller, key.to_string()));
        }
    }

    /// The health check of a process's controllers: Err naming every key that panicked
    /// [`PANICS_UNHEALTHY`] times or more in a row, with the last panic's message.
    pub fn panic_health(&self) -> Result<(), String> {
        let p = self
            .inner
            .panicking
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut bad: Vec<String> = p
            .iter()
            .filter(|(_, (n, _))| *n >= PANICS_UNHEALTHY)
            .map(|((c, k), (n, m))| {
                format!("controller {c}: reconcile of {k} panicked {n} times in a row: {m}")
            })
            .collect();
        if bad.is_empty() {
            return Ok(());
        }
        bad.sort();
        Err(bad.join("; "))
    }

    /// Records a key handed to a worker and the depth left behind.
    pub fn dequeued(&self, controller: &str, depth: usize) {
        let l = Self::labels(controller);
        self.inner.adds.get_or_create(&l).inc();
        self.queue_depth(controller, depth);
    }

    pub fn queue_depth(&self, controller: &str, depth: usize) {
        self.inner
            .depth
            .get_or_create(&Self::labels(controller))
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// Sets whether this process leads under the lease `name`.
    pub fn set_leader(&self, name: &str, leading: bool) {
        self.inner
            .leader
            .get_or_create(&vec![("lease", name.to_string())])
            .set(i64::from(leading));
    }

    /// Total reconciles of `controller` so far (any result), for tests and health.
    pub fn reconcile_count(&self, controller: &str) -> u64 {
        ["success", "requeue", "error"]
            .iter()
            .map(|r| {
                let mut l = Self::labels(controller);
                l.push(("result", r.to_string()));
                self.inner.reconciles.get_or_create(&l).get()
            })
            .sum()
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
    fn renders_per_controller_series() {
        let m = Metrics::new();
        m.reconciled("replicaset", Outcome::Success, 0.01);
        m.reconciled("replicaset", Outcome::Error, 0.02);
        m.queue_depth("replicaset", 3);
        m.set_leader("kube-controller-manager", true);
        let text = m.render();
        assert!(text.contains(
            "skiff_controller_reconciles_total{controller=\"replicaset\",result=\"success\"} 1"
        ));
        assert!(
            text.contains("skiff_controller_reconcile_errors_total{controller=\"replicaset\"} 1")
        );
        assert!(text.contains("skiff_controller_queue_depth{controller=\"replicaset\"} 3"));
        assert!(text.contains("skiff_controller_leader{lease=\"kube-controller-manager\"} 1"));
        assert_eq!(m.reconcile_count("replicaset"), 2);
    }

    #[test]
    fn panics_in_a_row_make_the_controllers_unhealthy_until_the_key_returns() {
        let m = Metrics::new();
        for i in 1..PANICS_UNHEALTHY {
            assert_eq!(m.panicked("replicaset", "default/web".into(), "boom"), i);
            assert!(m.panic_health().is_ok());
        }
        m.panicked("replicaset", "default/web".into(), "index out of bounds");
        let err = m.panic_health().unwrap_err();
        assert!(err.contains("controller replicaset: reconcile of default/web panicked 3 times in a row: index out of bounds"), "{err}");
        assert!(m
            .render()
            .contains("skiff_controller_reconcile_panics_total{controller=\"replicaset\"} 3"));
        m.returned("replicaset", "default/web");
        assert!(m.panic_health().is_ok());
    }
}
