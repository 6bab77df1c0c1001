//! The agent's Prometheus metrics (served at /metrics by the kubelet API server).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Mutex;

pub struct Metrics {
    registry: Mutex<Registry>,
    /// Pods with a live worker on this node.
    pub pods: Gauge,
    pub pod_status_writes: Counter,
    pub api_errors: Counter,
    pub events_sent: Counter,
    /// Repeats of an Event written as an update of its count.
    pub events_aggregated: Counter,
    /// Events dropped by the per-object rate limit.
    pub events_dropped: Counter,
    /// Seconds from a pod's first sight to the first status with phase Running.
    pub pod_start_seconds: Histogram,
    pub runtime_gc_removed: Counter,
    /// Requests to the node agent's API by outcome (allowed, unauthorized, forbidden, error).
    api_requests: Family<Vec<(String, String)>, Counter>,
    /// The kubelet's `kubelet_volume_stats_*` of the CSI volumes published on the node.
    pub volume_stats: VolumeStats,
}

type ClaimLabels = Vec<(String, String)>;

/// The kubelet's volume metrics (NodeGetVolumeStats of each published claim), by
/// `namespace` and `persistentvolumeclaim`, under the kubelet's own names.
#[derive(Default)]
pub struct VolumeStats {
    capacity_bytes: Family<ClaimLabels, Gauge>,
    available_bytes: Family<ClaimLabels, Gauge>,
    used_bytes: Family<ClaimLabels, Gauge>,
    inodes: Family<ClaimLabels, Gauge>,
    inodes_free: Family<ClaimLabels, Gauge>,
    inodes_used: Family<ClaimLabels, Gauge>,
}

fn claim_labels(namespace: &str, claim: &str) -> ClaimLabels {
    vec![
        ("namespace".to_string(), namespace.to_string()),
        ("persistentvolumeclaim".to_string(), claim.to_string()),
    ]
}

impl VolumeStats {
    fn families(&self) -> [(&'static str, &'static str, &Family<ClaimLabels, Gauge>); 6] {
        [
            (
                "kubelet_volume_stats_capacity_bytes",
                "Capacity in bytes of the volume",
                &self.capacity_bytes,
            ),
            (
                "kubelet_volume_stats_available_bytes",
                "Number of available bytes in the volume",
                &self.available_bytes,
            ),
            (
                "kubelet_volume_stats_used_bytes",
                "Number of used bytes in the volume",
                &self.used_bytes,
            ),
            (
                "kubelet_volume_stats_inodes",
                "Maximum number of inodes in the volume",
                &self.inodes,
            ),
            (
                "kubelet_volume_stats_inodes_free",
                "Number of free inodes in the volume",
                &self.inodes_free,
            ),
            (
                "kubelet_volume_stats_inodes_used",
                "Number of used inodes in the volume",
                &self.inodes_used,
            ),
        ]
    }

    /// The claim's latest usage (units the driver did not report are left out).
    pub fn set(&self, namespace: &str, claim: &str, u: &crate::csi::volumes::VolumeUsage) {
        let labels = claim_labels(namespace, claim);
        let values = [
            u.capacity_bytes,
            u.available_bytes,
            u.used_bytes,
            u.inodes,
            u.inodes_free,
            u.inodes_used,
        ];
        for ((_, _, family), value) in self.families().into_iter().zip(values) {
            if let Some(v) = value {
                family.get_or_create(&labels).set(v);
            }
        }
    }

    /// The claim's volume is no longer published on the node.
    pub fn remove(&self, namespace: &str, claim: &str) {
        let labels = claim_labels(namespace, claim);
        for (_, _, family) in self.families() {
            family.remove(&labels);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        // The agent's own metrics are `skiff_node_*`; the kubelet's keep the kubelet's names.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("skiff_node");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            pods: Gauge::default(),
            pod_status_writes: Counter::default(),
            api_errors: Counter::default(),
            events_sent: Counter::default(),
            events_aggregated: Counter::default(),
            events_dropped: Counter::default(),
            pod_start_seconds: Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]),
            runtime_gc_removed: Counter::default(),
            api_requests: Family::default(),
            volume_stats: VolumeStats::default(),
        };
        registry.register("pods", "Pods with a worker on this node", m.pods.clone());
        registry.register(
            "pod_status_writes",
            "Pod status writes to the API",
            m.pod_status_writes.clone(),
        );
        registry.register("api_errors", "Failed API requests", m.api_errors.clone());
        registry.register("events", "Events sent to the API", m.events_sent.clone());
        registry.register(
            "events_aggregated",
            "Repeated Events written as a count update",
            m.events_aggregated.clone(),
        );
        registry.register(
            "events_dropped",
            "Events dropped by the per-object rate limit",
            m.events_dropped.clone(),
        );
        registry.register(
            "pod_start_seconds",
            "Pod first seen to Running",
            m.pod_start_seconds.clone(),
        );
        registry.register(
            "runtime_gc_removed_sandboxes",
            "Sandboxes no pod wanted, removed",
            m.runtime_gc_removed.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the node agent's API by authentication and authorization outcome",
            m.api_requests.clone(),
        );
        for (name, help, family) in m.volume_stats.families() {
            root.register(name, help, family.clone());
        }
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = root;
        m
    }
}

impl Metrics {
    /// Counts a request to the node agent's API with its outcome.
    pub fn api_request(&self, outcome: &str) {
        self.api_requests
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// Registers, as `skiff_node_<name>`, a metric made outside the agent (the API
    /// balancer's, which runs before the agent starts).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.register(format!("skiff_node_{name}"), help, metric);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = encode(&mut out, &registry);
        out
    }
}
