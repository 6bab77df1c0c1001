//! Prometheus metrics of the API server, served at /metrics in the text format.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// Cheap to clone; every clone updates the same metrics.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    requests: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
    writes: Family<Labels, Counter>,
    listed: Family<Labels, Counter>,
    watchers: Family<Labels, Gauge>,
    watch_events: Family<Labels, Counter>,
    handshakes: Family<Labels, Counter>,
    authentications: Family<Labels, Counter>,
    audit_events: Counter,
    audit_dropped: Counter,
    audit_errors: Counter,
    metrics_scrapes: Family<Labels, Counter>,
    metrics_rounds: Histogram,
    metrics_nodes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("skiff_apiserver");
        let requests = Family::<Labels, Counter>::default();
        let latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        let writes = Family::<Labels, Counter>::default();
        let listed = Family::<Labels, Counter>::default();
        let watchers = Family::<Labels, Gauge>::default();
        let watch_events = Family::<Labels, Counter>::default();
        let handshakes = Family::<Labels, Counter>::default();
        let authentications = Family::<Labels, Counter>::default();
        let audit_events = Counter::default();
        let audit_dropped = Counter::default();
        let audit_errors = Counter::default();
        let metrics_scrapes = Family::<Labels, Counter>::default();
        let metrics_rounds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let metrics_nodes = Gauge::default();
        registry.register(
            "metrics_scrapes",
            "Scrapes of node agents' resource metrics (metrics.k8s.io), by result (ok, error)",
            metrics_scrapes.clone(),
        );
        registry.register(
            "metrics_scrape_round_seconds",
            "Time to scrape every Ready node once",
            metrics_rounds.clone(),
        );
        registry.register(
            "metrics_nodes",
            "Nodes with resource metrics served (answered within the last rounds)",
            metrics_nodes.clone(),
        );
        registry.register(
            "audit_events",
            "Audit events queued for the audit log",
            audit_events.clone(),
        );
        registry.register(
            "audit_events_dropped",
            "Audit events dropped because the audit log's queue was full",
            audit_dropped.clone(),
        );
        registry.register(
            "audit_errors",
            "Failed writes to the audit log",
            audit_errors.clone(),
        );
        registry.register(
            "tls_handshakes",
            "TLS handshakes by result (ok, failed, timeout)",
            handshakes.clone(),
        );
        registry.register(
            "authentications",
            "Requests authenticated, by result (a credential kind, or unauthorized)",
            authentications.clone(),
        );
        registry.register(
            "requests",
            "Requests by verb and HTTP code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request latency by verb (watches: until the response starts)",
            latency.clone(),
        );
        registry.register(
            "writes",
            "Durable writes by resource and verb",
            writes.clone(),
        );
        registry.register(
            "listed_objects",
            "Objects returned by lists",
            listed.clone(),
        );
        registry.register("watchers", "Open watches by resource", watchers.clone());
        registry.register(
            "watch_events",
            "Watch events sent by resource",
            watch_events.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                registry,
                requests,
                latency,
                writes,
                listed,
                watchers,
                watch_events,
                handshakes,
                authentications,
                audit_events,
                audit_dropped,
                audit_errors,
                metrics_scrapes,
                metrics_rounds,
                metrics_nodes,
            }),
        }
    }

    pub fn request(&self, verb: &'static str, code: u16, seconds: f64) {
        self.inner
            .requests
            .get_or_create(&vec![
                ("verb", verb.to_string()),
                ("code", code.to_string()),
            ])
            .inc();
        self.inner
            .latency
            .get_or_create(&vec![("verb", verb.to_string())])
            .observe(seconds);
    }

    /// One node agent scraped for metrics.k8s.io, with its result (ok, error).
    pub fn metrics_scrape(&self, result: &'static str) {
        self.inner
            .metrics_scrapes
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    pub fn metrics_scrape_round(&self, seconds: f64) {
        self.inner.metrics_rounds.observe(seconds);
    }

    pub fn metrics_nodes(&self, n: i64) {
        self.inner.metrics_nodes.set(n);
    }

    pub fn wrote(&self, resource: &'static str, verb: &'static str) {
        self.inner
            .writes
            .get_or_create(&vec![
                ("resource", resource.to_string()),
                ("verb", verb.to_string()),
            ])
            .inc();
    }

    pub fn listed(&self, resource: &'static str, n: usize) {
        self.inner
            .listed
            .get_or_create(&vec![("resource", resource.to_string())])
            .inc_by(n as u64);
    }

    pub fn watch_started(&self, resource: &'static str) {
        self.inner
            .watchers
            .get_or_create(&vec![("resource", resource.to_string())])
            .inc();
    }

    pub fn watch_ended(&self, resource: &'static str) {
        self.inner
            .watchers
            .get_or_create(&vec![("resource", resource.to_string())])
            .dec();
    }

    pub fn watch_event(&self, resource: &'static str) {
        self.inner
            .watch_events
            .get_or_create(&vec![("resource", resource.to_string())])
            .inc();
    }

    pub fn handshake(&self, result: &'static str) {
        self.inner
            .handshakes
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    pub fn authentication(&self, result: &'static str) {
        self.inner
            .authentications
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    pub fn audit_event(&self) {
        self.inner.audit_events.inc();
    }

    pub fn audit_dropped(&self) {
        self.inner.audit_dropped.inc();
    }

    pub fn audit_error(&self) {
        self.inner.audit_errors.inc();
    }

    /// The text exposition.
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
    fn renders_what_was_counted() {
        let m = Metrics::new();
        m.request("get", 200, 0.001);
        m.wrote("pods", "create");
        m.watch_started("pods");
        let text = m.render();
        assert!(
            text.contains("skiff_apiserver_requests_total{verb=\"get\",code=\"200\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("skiff_apiserver_watchers{resource=\"pods\"} 1"),
            "{text}"
        );
    }
}
