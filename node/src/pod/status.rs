//! PodStatus from what the worker knows of each container: phase (the kubelet's rules),
//! conditions with stable transition times, IPs, start time, container statuses, QoS class.
//! Pure: unit-tested without a runtime.

use k8s_openapi::api::core::v1::{
    ContainerStatus, HostIP, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Everything the status is computed from.
pub struct Inputs<'a> {
    pub spec: &'a PodSpec,
    pub init: Vec<ContainerStatus>,
    pub app: Vec<ContainerStatus>,
    pub pod_ip: Option<String>,
    pub host_ip: Option<String>,
    pub start_time: Option<Time>,
    /// The pod's sandbox is up with its network (the kubelet's PodReadyToStartContainers).
    pub sandbox_ready: bool,
    /// The previous status, whose condition transition times carry over when unchanged.
    pub previous: Option<&'a PodStatus>,
    pub now: Time,
}

fn terminated_ok(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

fn terminated_failed(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| t.exit_code != 0)
}

/// The pod phase, as the kubelet's getPhase decides it.
pub fn phase(spec: &PodSpec, init: &[ContainerStatus], app: &[ContainerStatus]) -> &'static str {
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    if !init.iter().all(terminated_ok)
        || init.len() < spec.init_containers.as_ref().map_or(0, Vec::len)
    {
        if policy == "Never" && init.iter().any(terminated_failed) {
            return "Failed";
        }
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
        {
            // Waiting to restart: it has run before.
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    let missing = spec.containers.len().saturating_sub(app.len());
    if waiting + missing > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

/// Guaranteed, Burstable or BestEffort, from the containers' requests and limits.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let containers: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let r = c.resources.clone().unwrap_or_default();
        let (req, lim) = (r.requests.unwrap_or_default(), r.limits.unwrap_or_default());
        any |= req
            .keys()
            .chain(lim.keys())
            .any(|k| k == "cpu" || k == "memory");
        for k in ["cpu", "memory"] {
            match (req.get(k), lim.get(k)) {
                (_, None) => guaranteed = false,
                (Some(a), Some(b)) if a != b => guaranteed = false,
                _ => {}
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn condition(
    previous: Option<&PodStatus>,
    now: &Time,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let last = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: Some(last.unwrap_or_else(|| now.clone())),
        reason: reason.map(Into::into),
        message,
        ..Default::default()
    }
}

/// The whole status.
pub fn compute(inputs: Inputs<'_>) -> PodStatus {
    let Inputs {
        spec,
        init,
        app,
        pod_ip,
        host_ip,
        start_time,
        sandbox_ready,
        previous,
        now,
    } = inputs;
    let phase = phase(spec, &init, &app);
    let initialized = init.iter().all(terminated_ok)
        && init.len() == spec.init_containers.as_ref().map_or(0, Vec::len);
    let unready: Vec<&str> = spec
        .containers
        .iter()
        .filter(|c| !app.iter().any(|s| s.name == c.name && s.ready))
        .map(|c| c.name.as_str())
        .collect();
    let completed = phase == "Succeeded" || phase == "Failed";
    let ready = unready.is_empty() && !completed;
    let (ready_reason, ready_message) = if completed {
        (Some("PodCompleted"), None)
    } else if ready {
        (None, None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let uninitialized: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !init.iter().any(|s| s.name == c.name && terminated_ok(s)))
        .map(|c| c.name.as_str())
        .collect();
    let conditions = vec![
        condition(previous, &now, "PodScheduled", true, None, None),
        condition(
            previous,
            &now,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
            None,
        ),
        condition(
            previous,
            &now,
            "Initialized",
            initialized,
            (!initialized).then_some("ContainersNotInitialized"),
            (!initialized).then(|| {
                format!(
                    "containers with incomplete status: [{}]",
                    uninitialized.join(" ")
                )
            }),
        ),
        condition(
            previous,
            &now,
            "ContainersReady",
            ready,
            ready_reason,
            ready_message.clone(),
        ),
        condition(previous, &now, "Ready", ready, ready_reason, ready_message),
    ];
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        host_ip: host_ip.clone(),
        host_ips: host_ip.map(|ip| vec![HostIP { ip }]),
        start_time,
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(app),
        qos_class: Some(qos_class(spec).into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting,
    };

    fn spec(policy: &str, apps: &[&str], inits: &[&str]) -> PodSpec {
        let c = |n: &&str| Container {
            name: n.to_string(),
            ..Default::default()
        };
        PodSpec {
            restart_policy: Some(policy.into()),
            containers: apps.iter().map(c).collect(),
            init_containers: (!inits.is_empty()).then(|| inits.iter().map(c).collect()),
            ..Default::default()
        }
    }

    fn running(name: &str, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(name: &str, reason: &str, ran_before: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..Default::default()
            }),
            last_state: ran_before.then(|| ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn phases() {
        let s = spec("Always", &["a", "b"], &[]);
        assert_eq!(
            phase(&s, &[], &[running("a", true)]),
            "Pending",
            "b not reported yet"
        );
        assert_eq!(
            phase(
                &s,
                &[],
                &[running("a", true), waiting("b", "ImagePullBackOff", false)]
            ),
            "Pending"
        );
        assert_eq!(
            phase(
                &s,
                &[],
                &[running("a", true), waiting("b", "CrashLoopBackOff", true)]
            ),
            "Running"
        );
        assert_eq!(
            phase(&s, &[], &[exited("a", 0), exited("b", 0)]),
            "Running",
            "Always restarts"
        );
        let s = spec("Never", &["a"], &[]);
        assert_eq!(phase(&s, &[], &[exited("a", 0)]), "Succeeded");
        assert_eq!(phase(&s, &[], &[exited("a", 137)]), "Failed");
        let s = spec("OnFailure", &["a"], &[]);
        assert_eq!(phase(&s, &[], &[exited("a", 1)]), "Running");
        let s = spec("Never", &["a"], &["i"]);
        assert_eq!(phase(&s, &[running("i", false)], &[]), "Pending");
        assert_eq!(phase(&s, &[exited("i", 2)], &[]), "Failed");
        assert_eq!(
            phase(&s, &[exited("i", 0)], &[running("a", true)]),
            "Running"
        );
    }

    #[test]
    fn readiness_conditions_keep_their_transition_time() {
        let s = spec("Always", &["a"], &[]);
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let first = compute(Inputs {
            spec: &s,
            init: vec![],
            app: vec![running("a", false)],
            pod_ip: Some("10.0.0.2".into()),
            host_ip: None,
            start_time: None,
            sandbox_ready: true,
            previous: None,
            now: t0.clone(),
        });
        let ready = |st: &PodStatus| {
            st.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .unwrap()
                .clone()
        };
        assert_eq!(ready(&first).status, "False");
        assert_eq!(
            ready(&first).message.as_deref(),
            Some("containers with unready status: [a]")
        );
        let again = compute(Inputs {
            spec: &s,
            init: vec![],
            app: vec![running("a", false)],
            pod_ip: None,
            host_ip: None,
            start_time: None,
            sandbox_ready: true,
            previous: Some(&first),
            now: t1.clone(),
        });
        assert_eq!(
            ready(&again).last_transition_time,
            Some(t0),
            "unchanged condition keeps its time"
        );
        let now_ready = compute(Inputs {
            spec: &s,
            init: vec![],
            app: vec![running("a", true)],
            pod_ip: None,
            host_ip: None,
            start_time: None,
            sandbox_ready: true,
            previous: Some(&again),
            now: t1.clone(),
        });
        assert_eq!(ready(&now_ready).status, "True");
        assert_eq!(ready(&now_ready).last_transition_time, Some(t1));
        let sandbox = first
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "PodReadyToStartContainers")
            .unwrap();
        assert_eq!(sandbox.status, "True");
        assert_eq!(
            sandbox.last_transition_time,
            ready(&first).last_transition_time
        );
        assert_eq!(first.pod_ips.unwrap()[0].ip, "10.0.0.2");
    }

    #[test]
    fn qos() {
        let mut s = spec("Always", &["a"], &[]);
        assert_eq!(qos_class(&s), "BestEffort");
        s.containers[0] = serde_json::from_value(serde_json::json!({"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}})).unwrap();
        assert_eq!(qos_class(&s), "Guaranteed");
        s.containers[0] = serde_json::from_value(
            serde_json::json!({"name": "a", "resources": {"requests": {"cpu": "1"}}}),
        )
        .unwrap();
        assert_eq!(qos_class(&s), "Burstable");
    }
}
