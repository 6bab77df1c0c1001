//! A container's `resources` as CRI Linux resources, which runc enforces as cgroup limits:
//! cpu requests -> shares, cpu limits -> CFS quota, memory limits -> the memory limit.

use control_plane::machinery::quantity::Quantity;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;

/// The CFS period the kubelet uses (100 ms).
const CPU_PERIOD_US: i64 = 100_000;
/// Kernel bounds on cpu.shares.
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;

fn quantity(
    map: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
    name: &str,
) -> Option<Quantity> {
    map.and_then(|m| m.get(name))
        .and_then(|q| Quantity::parse(&q.0).ok())
}

/// The cgroup settings for a container.
pub fn linux_resources(c: &Container) -> cri::LinuxContainerResources {
    let res = c.resources.as_ref();
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());
    let cpu_limit = quantity(limits, "cpu").map(|q| q.milli_value());
    // A limit without a request requests the limit (as API defaulting does).
    let cpu_request = quantity(requests, "cpu")
        .map(|q| q.milli_value())
        .or(cpu_limit);
    let memory_limit = quantity(limits, "memory").map(|q| q.value());
    cri::LinuxContainerResources {
        cpu_shares: cpu_request.map_or(MIN_SHARES, |m| {
            (m * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
        }),
        cpu_period: cpu_limit.map_or(0, |_| CPU_PERIOD_US),
        // Quota of at least 1 ms, as the kernel refuses less.
        cpu_quota: cpu_limit.map_or(0, |m| (m * CPU_PERIOD_US / 1000).max(1000)),
        memory_limit_in_bytes: memory_limit.unwrap_or(0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Q(v.to_string())))
                    .collect(),
            )
        };
        Container {
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cpu_and_memory() {
        let r = linux_resources(&container(
            &[("cpu", "250m")],
            &[("cpu", "500m"), ("memory", "64Mi")],
        ));
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
    }

    #[test]
    fn best_effort_gets_minimal_shares_and_no_limits() {
        let r = linux_resources(&Container::default());
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2, 0, 0)
        );
        let r = linux_resources(&container(&[], &[("cpu", "2")]));
        assert_eq!(r.cpu_shares, 2048, "the limit is the request");
    }
}
