//! The replica calculator of kube-controller-manager's HPA, pure: from the target's pods and
//! their resource metrics, the replica count one Resource metric proposes. Usage and requests
//! are in milli-units (millicores, millibytes) as Kubernetes' MilliValue. Pods are grouped as
//! Kubernetes groups them: deleted or failed pods are ignored; pending pods, and (for CPU)
//! pods not ready or whose sample predates their readiness, are unready; pods without a
//! sample are missing. Inside the tolerance nothing changes; missing pods count as 100% of
//! their request (the target if higher) on scale-down and 0 on scale-up; unready pods count
//! as 0 on scale-up; a correction that flips the direction keeps the current count.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::pods;
use crate::machinery::quantity::Quantity;

/// kube-controller-manager's --horizontal-pod-autoscaler-tolerance.
pub const TOLERANCE: f64 = 0.1;
/// --horizontal-pod-autoscaler-cpu-initialization-period.
pub const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);
/// --horizontal-pod-autoscaler-initial-readiness-delay.
pub const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);

/// One pod's sample of one resource: the sum over its containers.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub milli: i64,
    pub timestamp: Timestamp,
    pub window: Duration,
}

/// A metric target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Percent of the pods' requests.
    Utilization(i32),
    /// Average usage per pod, in milli-units.
    AverageValue(i64),
}

/// What one metric proposes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub replicas: i32,
    /// The utilization in percent of request (Utilization targets).
    pub utilization: Option<i32>,
    /// The average usage per pod, in milli-units.
    pub average_milli: i64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    #[error("missing request for {resource} in container {container} of Pod {pod}")]
    MissingRequest {
        resource: String,
        container: String,
        pod: String,
    },
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoReadyMetrics,
    #[error("no metrics returned matched known pods")]
    NoMatchingMetrics,
}

/// How each pod counts.
#[derive(Default, Debug)]
struct Groups {
    ready: usize,
    unready: Vec<String>,
    missing: Vec<String>,
    ignored: Vec<String>,
}

fn group(
    pods: &[&Pod],
    metrics: &BTreeMap<String, Sample>,
    resource: &str,
    now: Timestamp,
) -> Groups {
    let mut g = Groups::default();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let phase = pods::phase(pod);
        if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
            g.ignored.push(name);
            continue;
        }
        if phase == "Pending" {
            g.unready.push(name);
            continue;
        }
        let Some(sample) = metrics.get(&name) else {
            g.missing.push(name);
            continue;
        };
        if resource == "cpu" && cpu_unready(pod, sample, now) {
            g.unready.push(name);
            continue;
        }
        g.ready += 1;
    }
    g
}

/// Kubernetes' CPU readiness rule: inside the initialization period a sample counts only
/// from a ready pod and taken a full window after it became ready; after it, only a pod that
/// never became ready is left out.
fn cpu_unready(pod: &Pod, sample: &Sample, now: Timestamp) -> bool {
    let condition = pods::condition(pod, "Ready");
    let start = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0);
    let (Some(c), Some(start)) = (condition, start) else {
        return true;
    };
    let Some(transition) = c.last_transition_time.as_ref().map(|t| t.0) else {
        return c.status != "True";
    };
    if pods::elapsed(start, now) < CPU_INITIALIZATION_PERIOD {
        c.status == "False" || pods::elapsed(transition, sample.timestamp) < sample.window
    } else {
        c.status == "False" && pods::elapsed(start, transition) < INITIAL_READINESS_DELAY
    }
}

/// The sum of the pod's containers' requests of `resource`, in milli-units.
pub fn pod_request(pod: &Pod, resource: &str) -> Result<i64, CalcError> {
    let mut sum = 0i64;
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| Quantity::try_from(q).ok());
        match request {
            Some(q) => sum = sum.saturating_add(q.milli_value()),
            None => {
                return Err(CalcError::MissingRequest {
                    resource: resource.into(),
                    container: c.name.clone(),
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                })
            }
        }
    }
    Ok(sum)
}

/// The usage ratio of the samples against the target, and the utilization (percent) or the
/// average (milli-units) it comes from.
fn ratio(
    samples: &BTreeMap<String, i64>,
    requests: &BTreeMap<String, i64>,
    target: Target,
) -> Result<(f64, Option<i32>, i64), CalcError> {
    match target {
        Target::Utilization(percent) => {
            let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
            for (pod, value) in samples {
                if let Some(r) = requests.get(pod) {
                    used = used.saturating_add(*value);
                    requested = requested.saturating_add(*r);
                    n += 1;
                }
            }
            if requested == 0 {
                return Err(CalcError::NoMatchingMetrics);
            }
            let utilization =
                i32::try_from(used.saturating_mul(100) / requested).unwrap_or(i32::MAX);
            Ok((
                f64::from(utilization) / f64::from(percent.max(1)),
                Some(utilization),
                used / n.max(1),
            ))
        }
        Target::AverageValue(milli) => {
            let n = i64::try_from(samples.len()).unwrap_or(i64::MAX).max(1);
            let average = samples.values().sum::<i64>() / n;
            Ok((average as f64 / milli.max(1) as f64, None, average))
        }
    }
}

/// The replica count one Resource metric proposes for a target at `current` replicas.
pub fn propose(
    current: i32,
    target: Target,
    resource: &str,
    pods: &[&Pod],
    metrics: &BTreeMap<String, Sample>,
    now: Timestamp,
) -> Result<Proposal, CalcError> {
    if pods.is_empty() {
        return Err(CalcError::NoPods);
    }
    let g = group(pods, metrics, resource, now);
    let mut requests = BTreeMap::new();
    if matches!(target, Target::Utilization(_)) {
        for pod in pods {
            requests.insert(
                pod.metadata.name.clone().unwrap_or_default(),
                pod_request(pod, resource)?,
            );
        }
    }
    let mut samples: BTreeMap<String, i64> = metrics
        .iter()
        .filter(|(name, _)| !g.ignored.contains(name) && !g.unready.contains(name))
        .map(|(name, s)| (name.clone(), s.milli))
        .collect();
    if samples.is_empty() {
        return Err(CalcError::NoReadyMetrics);
    }
    let (usage_ratio, utilization, average_milli) = ratio(&samples, &requests, target)?;
    let proposal = |replicas| Proposal {
        replicas,
        utilization,
        average_milli,
    };
    let scale_up_with_unready = !g.unready.is_empty() && usage_ratio > 1.0;
    if !scale_up_with_unready && g.missing.is_empty() {
        if (1.0 - usage_ratio).abs() <= TOLERANCE {
            return Ok(proposal(current));
        }
        return Ok(proposal(ceil_replicas(usage_ratio * g.ready as f64)));
    }
    for pod in &g.missing {
        let value = if usage_ratio < 1.0 {
            match target {
                Target::Utilization(percent) => {
                    requests.get(pod).copied().unwrap_or(0) * i64::from(percent.max(100)) / 100
                }
                Target::AverageValue(milli) => milli,
            }
        } else {
            0
        };
        samples.insert(pod.clone(), value);
    }
    if scale_up_with_unready {
        for pod in &g.unready {
            samples.insert(pod.clone(), 0);
        }
    }
    let (new_ratio, _, _) = ratio(&samples, &requests, target)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (usage_ratio < 1.0 && new_ratio > 1.0)
        || (usage_ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(proposal(current));
    }
    let replicas = ceil_replicas(new_ratio * samples.len() as f64);
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(proposal(current));
    }
    Ok(proposal(replicas))
}

fn ceil_replicas(x: f64) -> i32 {
    let c = x.ceil();
    if c >= f64::from(i32::MAX) {
        i32::MAX
    } else {
        c as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// A running pod started long ago, ready since `ready_at`, requesting `cpu` and `memory`.
    pub fn pod(name: &str, ready: bool, request: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "echo",
                "resources": {"requests": {"cpu": request, "memory": request}}}]},
            "status": {"phase": "Running", "startTime": "2025-01-01T00:00:00Z",
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                    "lastTransitionTime": "2025-01-01T00:00:10Z"}]}
        }))
        .unwrap()
    }

    fn sample(milli: i64) -> Sample {
        Sample {
            milli,
            timestamp: at("2025-01-01T01:00:00Z"),
            window: Duration::from_secs(15),
        }
    }

    fn now() -> Timestamp {
        at("2025-01-01T01:00:05Z")
    }

    fn run(
        current: i32,
        target: Target,
        resource: &str,
        pods: &[Pod],
        metrics: &[(&str, i64)],
    ) -> Result<Proposal, CalcError> {
        let refs: Vec<&Pod> = pods.iter().collect();
        let m = metrics
            .iter()
            .map(|(n, v)| (n.to_string(), sample(*v)))
            .collect();
        propose(current, target, resource, &refs, &m, now())
    }

    #[test]
    fn ratio_scales_and_tolerance_holds() {
        let pods = [pod("a", true, "100m"), pod("b", true, "100m")];
        // 90% of request against 50%: ceil(1.8 * 2) = 4.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 90), ("b", 90)],
        )
        .unwrap();
        assert_eq!(p.replicas, 4);
        assert_eq!(p.utilization, Some(90));
        assert_eq!(p.average_milli, 90);
        // 54% against 50%: ratio 1.08, inside the tolerance.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 54), ("b", 54)],
        )
        .unwrap();
        assert_eq!(p.replicas, 2);
        // 56%: 1.12, outside: ceil(2.24) = 3.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 56), ("b", 56)],
        )
        .unwrap();
        assert_eq!(p.replicas, 3);
        // Scale down: 10% against 50%: ceil(0.2 * 2) = 1.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 10), ("b", 10)],
        )
        .unwrap();
        assert_eq!(p.replicas, 1);
    }

    #[test]
    fn average_value_targets() {
        let mib = 1024 * 1024 * 1000;
        let pods = [pod("a", true, "64Mi"), pod("b", true, "64Mi")];
        let p = run(
            2,
            Target::AverageValue(20 * mib),
            "memory",
            &pods,
            &[("a", 60 * mib), ("b", 40 * mib)],
        )
        .unwrap();
        assert_eq!(p.replicas, 5);
        assert_eq!(p.average_milli, 50 * mib);
        assert_eq!(p.utilization, None);
    }

    #[test]
    fn missing_pods_count_against_the_direction() {
        let pods = [
            pod("a", true, "100m"),
            pod("b", true, "100m"),
            pod("c", true, "100m"),
        ];
        // Scale-up: the missing pod counts as 0: (100+100+0)/300 = 66% vs 50% -> ceil(1.32*3) = 4.
        let p = run(
            3,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 100), ("b", 100)],
        )
        .unwrap();
        assert_eq!(p.replicas, 4);
        // Without the correction it would be ceil(2 * 2) = 4 too; a smaller excess shows it:
        // (60+60)/200 = 60% -> 1.2 up; with c at 0: 40% -> direction flips: keep 3.
        let p = run(
            3,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 60), ("b", 60)],
        )
        .unwrap();
        assert_eq!(p.replicas, 3);
        // Scale-down: the missing pod counts as 100% of its request: (10+10+100)/300 = 40%
        // vs 50% -> ceil(0.8 * 3) = 3, not ceil(0.2 * 2) = 1.
        let p = run(
            3,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 10), ("b", 10)],
        )
        .unwrap();
        assert_eq!(p.replicas, 3);
        // Scale-down by an average value: the missing pod counts at the target:
        // (10+10+100)/3 = 40 vs 100 -> ceil(0.4 * 3) = 2, not ceil(0.1 * 2) = 1.
        let p = run(
            3,
            Target::AverageValue(100),
            "memory",
            &pods,
            &[("a", 10), ("b", 10)],
        )
        .unwrap();
        assert_eq!(p.replicas, 2);
    }

    #[test]
    fn unready_pods_are_ignored_on_scale_up_only() {
        let pods = [pod("a", true, "100m"), pod("b", false, "100m")];
        // CPU: b is unready; a at 100% vs 50% is a scale-up, b counts as 0:
        // (100+0)/200 = 50% -> inside the tolerance: keep 2.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 100), ("b", 100)],
        )
        .unwrap();
        assert_eq!(p.replicas, 2);
        // Scale-down: the unready pod is left out: a at 10% -> ceil(0.2 * 1) = 1.
        let p = run(
            2,
            Target::Utilization(50),
            "cpu",
            &pods,
            &[("a", 10), ("b", 90)],
        )
        .unwrap();
        assert_eq!(p.replicas, 1);
        // Memory has no readiness rule: both count.
        let p = run(
            2,
            Target::Utilization(50),
            "memory",
            &pods,
            &[("a", 100), ("b", 100)],
        )
        .unwrap();
        assert_eq!(p.replicas, 4);
        // A pending pod is unready for every resource; a deleted one is ignored.
        let mut pending = pod("c", false, "100m");
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        let mut gone = pod("d", true, "100m");
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        let p = run(
            2,
            Target::Utilization(50),
            "memory",
            &[pod("a", true, "100m"), pending, gone],
            &[("a", 200), ("d", 500)],
        )
        .unwrap();
        // a alone at 200% -> up; c (pending) counts as 0, d not at all: 100% -> ceil(2 * 2).
        assert_eq!(p.replicas, 4);
    }

    #[test]
    fn errors_as_kubernetes_words_them() {
        let pods = [pod("a", true, "100m")];
        assert_eq!(
            run(1, Target::Utilization(50), "cpu", &[], &[]),
            Err(CalcError::NoPods)
        );
        assert_eq!(
            run(1, Target::Utilization(50), "cpu", &pods, &[])
                .unwrap_err()
                .to_string(),
            "did not receive metrics for targeted pods (pods might be unready)"
        );
        let mut bare = pod("a", true, "100m");
        bare.spec.as_mut().unwrap().containers[0].resources = None;
        assert_eq!(
            run(1, Target::Utilization(50), "cpu", &[bare], &[("a", 1)])
                .unwrap_err()
                .to_string(),
            "missing request for cpu in container app of Pod a"
        );
    }
}
