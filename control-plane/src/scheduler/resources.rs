//! Resource arithmetic as kube-scheduler does it: a node's allocatable resources, what a pod
//! requests (regular containers summed, init containers as a running maximum, restartable init
//! containers, i.e. sidecars, counted for the whole life of the pod, plus the pod overhead),
//! and the "non-zero" view of a request that scoring uses so that pods without requests still
//! spread (100m cpu and 200 MiB memory for a container that names none).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::machinery::Quantity;

/// kube-scheduler's `DefaultMilliCPURequest`: what scoring assumes for a container without a
/// cpu request.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// kube-scheduler's `DefaultMemoryRequest` (200 MiB).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
pub const PODS: &str = "pods";

/// Amounts of every resource the scheduler accounts for: cpu in millicores, memory and
/// ephemeral storage in bytes, a pod count, and any other (extended, hugepages) resource in
/// its integer unit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub pods: i64,
    pub scalar: BTreeMap<String, i64>,
}

fn amount(name: &str, q: &ApiQuantity) -> i64 {
    // The API server validated every quantity; an unparsable one counts as nothing rather
    // than stopping the scheduler.
    let Ok(q) = Quantity::try_from(q) else {
        return 0;
    };
    if name == CPU {
        q.milli_value()
    } else {
        q.value()
    }
}

impl Resources {
    /// A resource list (allocatable, capacity, requests, overhead).
    pub fn from_list(list: Option<&BTreeMap<String, ApiQuantity>>) -> Resources {
        let mut r = Resources::default();
        for (name, q) in list.into_iter().flatten() {
            r.set(name, amount(name, q));
        }
        r
    }

    fn set(&mut self, name: &str, v: i64) {
        match name {
            CPU => self.milli_cpu = v,
            MEMORY => self.memory = v,
            EPHEMERAL_STORAGE => self.ephemeral_storage = v,
            PODS => self.pods = v,
            other => {
                self.scalar.insert(other.to_string(), v);
            }
        }
    }

    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
        for (k, v) in &other.scalar {
            *self.scalar.entry(k.clone()).or_default() += v;
        }
    }

    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.pods -= other.pods;
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e -= v;
            if *e == 0 {
                self.scalar.remove(k);
            }
        }
    }

    fn max_with(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }

    /// The amount of `name` ("cpu" in millicores, others in their unit).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.milli_cpu,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.pods,
            other => self.scalar.get(other).copied().unwrap_or(0),
        }
    }

    /// Whether nothing but (possibly) a pod count is asked for: a BestEffort request.
    pub fn is_empty_request(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.scalar.values().all(|v| *v == 0)
    }
}

/// What a pod asks of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRequests {
    /// Exactly what the containers request (what NodeResourcesFit checks).
    pub requests: Resources,
    /// cpu in millicores with 100m for every container that names no cpu request.
    pub non_zero_milli_cpu: i64,
    /// memory with 200 MiB for every container that names no memory request.
    pub non_zero_memory: i64,
}

fn container_requests(c: &Container) -> Resources {
    Resources::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

fn non_zero(c: &Container) -> Resources {
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let named = |n: &str| requests.and_then(|r| r.get(n)).map(|q| amount(n, q));
    Resources {
        milli_cpu: named(CPU).unwrap_or(DEFAULT_MILLI_CPU_REQUEST),
        memory: named(MEMORY).unwrap_or(DEFAULT_MEMORY_REQUEST),
        ..Default::default()
    }
}

/// Kubernetes' `PodRequests`: the sum of the regular containers and the sidecars, or the
/// largest init container step (each init container runs next to the sidecars started before
/// it) if that is larger, plus the pod overhead.
fn aggregate(spec: &PodSpec, per_container: impl Fn(&Container) -> Resources) -> Resources {
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&per_container(c));
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let mut step = per_container(c);
        if c.restart_policy.as_deref() == Some("Always") {
            total.add(&step);
            sidecars.add(&step);
            step = sidecars.clone();
        } else {
            step.add(&sidecars);
        }
        init_peak.max_with(&step);
    }
    total.max_with(&init_peak);
    total
}

/// The requests of a pod, as NodeResourcesFit and the scoring plugins see them.
pub fn pod_requests(spec: &PodSpec) -> PodRequests {
    let overhead = Resources::from_list(spec.overhead.as_ref());
    let mut requests = aggregate(spec, container_requests);
    requests.add(&overhead);
    let mut nz = aggregate(spec, non_zero);
    nz.add(&overhead);
    PodRequests {
        requests,
        non_zero_milli_cpu: nz.milli_cpu,
        non_zero_memory: nz.memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn c(name: &str, requests: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "image": "x", "resources": {"requests": requests}})
    }

    #[test]
    fn node_lists_parse_every_unit() {
        let list: BTreeMap<String, ApiQuantity> = serde_json::from_value(json!({
            "cpu": "3500m", "memory": "2Gi", "ephemeral-storage": "10G", "pods": "110",
            "example.com/gpu": "2", "hugepages-2Mi": "4Mi"
        }))
        .unwrap();
        let r = Resources::from_list(Some(&list));
        assert_eq!(r.milli_cpu, 3500);
        assert_eq!(r.memory, 2 << 30);
        assert_eq!(r.ephemeral_storage, 10_000_000_000);
        assert_eq!(r.pods, 110);
        assert_eq!(r.get("example.com/gpu"), 2);
        assert_eq!(r.get("hugepages-2Mi"), 4 << 20);
    }

    #[test]
    fn containers_sum_and_init_containers_peak() {
        let s = spec(json!({
            "containers": [c("a", json!({"cpu": "100m", "memory": "1Mi"})), c("b", json!({"cpu": "200m"}))],
            "initContainers": [c("i1", json!({"cpu": "1", "memory": "512Ki"}))],
        }));
        let r = pod_requests(&s);
        assert_eq!(
            r.requests.milli_cpu, 1000,
            "the init container's peak is larger"
        );
        assert_eq!(r.requests.memory, 1 << 20);
        // b names no memory: 200 MiB in the non-zero view, init containers too.
        assert_eq!(r.non_zero_memory, (1 << 20) + DEFAULT_MEMORY_REQUEST);
        assert_eq!(r.non_zero_milli_cpu, 1000);
    }

    #[test]
    fn sidecars_count_for_the_whole_pod_and_under_later_init_containers() {
        let mut sidecar = c("s", json!({"cpu": "300m"}));
        sidecar["restartPolicy"] = json!("Always");
        let s = spec(json!({
            "containers": [c("a", json!({"cpu": "100m"}))],
            "initContainers": [sidecar, c("i", json!({"cpu": "500m"}))],
            "overhead": {"cpu": "10m"},
        }));
        let r = pod_requests(&s);
        // max(100 + 300, 300 + 500) + 10 overhead
        assert_eq!(r.requests.milli_cpu, 810);
    }

    #[test]
    fn best_effort_pods_request_nothing_but_score_as_defaults() {
        let s =
            spec(json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}));
        let r = pod_requests(&s);
        assert!(r.requests.is_empty_request());
        assert_eq!(r.non_zero_milli_cpu, 2 * DEFAULT_MILLI_CPU_REQUEST);
        assert_eq!(r.non_zero_memory, 2 * DEFAULT_MEMORY_REQUEST);
        let explicit_zero = spec(json!({"containers": [c("a", json!({"cpu": "0"}))]}));
        assert_eq!(pod_requests(&explicit_zero).non_zero_milli_cpu, 0);
    }

    #[test]
    fn add_then_sub_is_identity() {
        let mut a = Resources {
            milli_cpu: 5,
            memory: 7,
            scalar: [("x/y".to_string(), 3)].into(),
            ..Default::default()
        };
        let b = Resources {
            milli_cpu: 2,
            memory: 1,
            ephemeral_storage: 4,
            pods: 1,
            scalar: [("x/y".to_string(), 3), ("z/w".to_string(), 1)].into(),
        };
        let orig = a.clone();
        a.add(&b);
        a.sub(&b);
        a.scalar.retain(|_, v| *v != 0);
        assert_eq!(a, orig);
    }
}
