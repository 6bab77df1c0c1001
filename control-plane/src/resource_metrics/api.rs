//! metrics.k8s.io/v1beta1 NodeMetrics and PodMetrics, as metrics-server serves them, and
//! how a node's Summary becomes them (CPU: the node agent's rate over its sampling window,
//! in nanocores; memory: the working set). Readers of the API (kubectl top, the
//! HorizontalPodAutoscaler) deserialize these types.

use super::summary::{CpuStats, MemoryStats, PodStats, Summary};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "metrics.k8s.io/v1beta1";

/// CPU and memory in use.
pub type Usage = BTreeMap<String, Quantity>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetrics {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    /// When the figures were measured.
    pub timestamp: Time,
    /// The window the CPU rate was computed over (a duration, `10s`).
    pub window: String,
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMetrics {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub timestamp: Time,
    pub window: String,
    pub containers: Vec<ContainerMetrics>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerMetrics {
    pub name: String,
    pub usage: Usage,
}

/// `{"cpu": "<n>n", "memory": "<bytes>"}` when both are known.
fn usage(cpu: &Option<CpuStats>, memory: &Option<MemoryStats>) -> Option<(Time, Usage)> {
    let cpu = cpu.as_ref()?;
    let nano_cores = cpu.usage_nano_cores?;
    let working_set = memory.as_ref()?.working_set_bytes?;
    Some((
        cpu.time.clone(),
        [
            ("cpu".to_string(), Quantity(format!("{nano_cores}n"))),
            ("memory".to_string(), Quantity(working_set.to_string())),
        ]
        .into(),
    ))
}

/// The node's metrics from its summary (None until its agent has a CPU rate).
pub fn node_metrics(
    summary: &Summary,
    labels: Option<BTreeMap<String, String>>,
    window: &str,
) -> Option<NodeMetrics> {
    let (timestamp, usage) = usage(&summary.node.cpu, &summary.node.memory)?;
    Some(NodeMetrics {
        api_version: API_VERSION.into(),
        kind: "NodeMetrics".into(),
        metadata: ObjectMeta {
            name: Some(summary.node.node_name.clone()),
            labels,
            ..Default::default()
        },
        timestamp,
        window: window.into(),
        usage,
    })
}

/// A pod's metrics: every container with both figures (None when none has them yet).
pub fn pod_metrics(
    pod: &PodStats,
    labels: Option<BTreeMap<String, String>>,
    window: &str,
) -> Option<PodMetrics> {
    let mut timestamp = None;
    let containers: Vec<ContainerMetrics> = pod
        .containers
        .iter()
        .filter_map(|c| {
            let (t, usage) = usage(&c.cpu, &c.memory)?;
            timestamp.get_or_insert(t);
            Some(ContainerMetrics {
                name: c.name.clone(),
                usage,
            })
        })
        .collect();
    Some(PodMetrics {
        api_version: API_VERSION.into(),
        kind: "PodMetrics".into(),
        metadata: ObjectMeta {
            name: Some(pod.pod_ref.name.clone()),
            namespace: Some(pod.pod_ref.namespace.clone()),
            labels,
            ..Default::default()
        },
        timestamp: timestamp?,
        window: window.into(),
        containers,
    })
}

/// The OpenAPI schema of a metrics kind (for `kubectl explain`), written here: the types
/// are not in k8s-openapi.
fn schema(description: &str, per_container: bool) -> schemars::Schema {
    let usage = serde_json::json!({
        "type": "object",
        "description": "The memory (working set, bytes) and CPU (cores) in use.",
        "additionalProperties": {"type": "string", "format": "quantity"},
    });
    let mut properties = serde_json::json!({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object", "description": "Standard object metadata."},
        "timestamp": {"type": "string", "format": "date-time",
                      "description": "When the figures were measured."},
        "window": {"type": "string",
                   "description": "The window the CPU rate was computed over."},
    });
    if per_container {
        properties["containers"] = serde_json::json!({
            "type": "array",
            "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "usage": usage}},
        });
    } else {
        properties["usage"] = usage;
    }
    let value = serde_json::json!({
        "type": "object",
        "description": description,
        "properties": properties,
    });
    schemars::Schema::try_from(value).unwrap_or_default()
}

impl schemars::JsonSchema for NodeMetrics {
    fn schema_name() -> Cow<'static, str> {
        "io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schema("The resource usage of a node.", false)
    }
}

impl schemars::JsonSchema for PodMetrics {
    fn schema_name() -> Cow<'static, str> {
        "io.k8s.metrics.pkg.apis.metrics.v1beta1.PodMetrics".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schema("The resource usage of a pod's containers.", true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource_metrics::summary::*;

    fn t() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
    }

    fn cpu(rate: Option<u64>) -> Option<CpuStats> {
        Some(CpuStats {
            time: t(),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(5),
        })
    }

    fn memory(ws: u64) -> Option<MemoryStats> {
        Some(MemoryStats {
            time: t(),
            usage_bytes: Some(ws * 2),
            working_set_bytes: Some(ws),
            rss_bytes: None,
        })
    }

    #[test]
    fn summaries_become_metrics_when_rates_are_known() {
        let container = |name: &str, rate| ContainerStats {
            name: name.into(),
            start_time: None,
            cpu: cpu(rate),
            memory: memory(1024),
        };
        let s = Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: None,
                cpu: cpu(Some(250_000_000)),
                memory: memory(1 << 20),
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                start_time: None,
                containers: vec![container("a", Some(7)), container("b", None)],
                cpu: None,
                memory: None,
            }],
        };
        let n = node_metrics(&s, None, "10s").unwrap();
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["apiVersion"], "metrics.k8s.io/v1beta1");
        assert_eq!(v["kind"], "NodeMetrics");
        assert_eq!(v["usage"]["cpu"], "250000000n");
        assert_eq!(v["usage"]["memory"], "1048576");
        assert_eq!(v["window"], "10s");
        let p = pod_metrics(&s.pods[0], None, "10s").unwrap();
        assert_eq!(p.containers.len(), 1, "only containers with a rate");
        assert_eq!(p.containers[0].usage["cpu"].0, "7n");
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));

        let mut idle = s.clone();
        idle.node.cpu = cpu(None);
        idle.pods[0].containers.truncate(0);
        assert!(node_metrics(&idle, None, "10s").is_none());
        assert!(pod_metrics(&idle.pods[0], None, "10s").is_none());
    }
}
