//! Which pods back a Service and how (shared by the EndpointSlice and Endpoints
//! controllers): the Services selecting a pod, the pods a Service selects (through the pod
//! label index, never a scan of every pod), whether a pod belongs in endpoints, its ready /
//! serving / terminating state, and its port for each service port (a named targetPort is
//! resolved against that pod's container ports, so it may differ from pod to pod).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::pods;
use crate::runtime::{Informer, ObjectKey};

/// The selector of a Service that has one (Services without are not managed).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

fn selects(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Index of Services by each `<namespace>/<key>=<value>` pair of their selector.
pub const BY_SELECTOR_LABEL: &str = "selector-label";

/// Adds the selector index to the Service informer (idempotent).
pub fn index_services(services: &Informer<Service>) {
    services.add_index(BY_SELECTOR_LABEL, index_by_selector_label);
}

fn index_by_selector_label(svc: &Service) -> Vec<String> {
    let ns = svc.namespace().unwrap_or_default();
    selector(svc)
        .map(|sel| {
            sel.iter()
                .map(|(k, v)| pods::label_index_value(&ns, k, v))
                .collect()
        })
        .unwrap_or_default()
}

/// The Services in the pod's namespace whose selector matches its labels: candidates come
/// from the selector index ([`index_services`]) through the pod's own labels
/// (O(labels + candidates), not O(Services in the namespace)).
pub fn services_for_pod(services: &Informer<Service>, pod: &Pod) -> Vec<ObjectKey> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out: Vec<ObjectKey> = pod
        .labels()
        .iter()
        .flat_map(|(k, v)| {
            services.by_index(BY_SELECTOR_LABEL, &pods::label_index_value(&ns, k, v))
        })
        .filter(|s| selector(s).is_some_and(|sel| selects(sel, pod.labels())))
        .map(|s| ObjectKey::of(s.as_ref()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The pods the Service selects, looked up through the smallest label bucket.
pub fn pods_for_service(pods: &Informer<Pod>, svc: &Service) -> Vec<Arc<Pod>> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.namespace().unwrap_or_default();
    let Some(bucket) = sel
        .iter()
        .map(|(k, v)| pods::label_index_value(&ns, k, v))
        .min_by_key(|b| pods.count_by_index(pods::BY_LABEL, b))
    else {
        return Vec::new();
    };
    pods.by_index(pods::BY_LABEL, &bucket)
        .into_iter()
        .filter(|p| selects(sel, p.labels()))
        .collect()
}

/// Whether the pod belongs in endpoints at all: it has an IP and will not run again when it
/// is finished (ShouldPodBeInEndpoints); terminating pods only where asked for.
pub fn should_include(pod: &Pod, include_terminating: bool) -> bool {
    if pod_ip(pod).is_none() {
        return false;
    }
    if !include_terminating && pods::is_terminating(pod) {
        return false;
    }
    let restart = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    match restart {
        "Never" => !matches!(pods::phase(pod), "Failed" | "Succeeded"),
        "OnFailure" => pods::phase(pod) != "Succeeded",
        _ => true,
    }
}

/// The pod's IPv4 address.
pub fn pod_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ips = status.pod_ips.iter().flatten().map(|p| p.ip.clone());
    std::iter::once(status.pod_ip.clone().unwrap_or_default())
        .chain(ips)
        .find(|ip| !ip.is_empty() && ip.parse::<std::net::Ipv4Addr>().is_ok())
}

/// (ready, serving, terminating) as EndpointSlices report them.
pub fn conditions(pod: &Pod, svc: &Service) -> (bool, bool, bool) {
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let serving = publish || pods::is_ready(pod);
    let terminating = pods::is_terminating(pod);
    (publish || (serving && !terminating), serving, terminating)
}

/// The pod's port for a service port (FindPort): a number as is, a name through the pod's
/// container ports of the same protocol. None when the name matches nothing.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match port.target_port.as_ref() {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => {
                let spec = pod.spec.as_ref()?;
                // Sidecars (init containers that keep running) count as well.
                let sidecars = spec
                    .init_containers
                    .iter()
                    .flatten()
                    .filter(|c| c.restart_policy.as_deref() == Some("Always"));
                spec.containers
                    .iter()
                    .chain(sidecars)
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|p| {
                        p.name.as_deref() == Some(name.as_str())
                            && p.protocol.as_deref().unwrap_or("TCP") == protocol
                    })
                    .map(|p| p.container_port)
            }
        },
    }
}

/// Whether the pod should set the endpoint's hostname (its subdomain is the Service).
pub fn hostname(pod: &Pod, svc: &Service) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let host = spec.hostname.as_ref().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == Some(svc.name_any().as_str())).then(|| host.clone())
}

/// Whether a pod update can change any endpoint (so unrelated status churn costs nothing).
pub fn relevant_change(old: &Pod, new: &Pod) -> bool {
    old.labels() != new.labels()
        || pod_ip(old) != pod_ip(new)
        || pods::is_ready(old) != pods::is_ready(new)
        || pods::is_terminating(old) != pods::is_terminating(new)
        || pods::phase(old) != pods::phase(new)
        || pods::node_name(old) != pods::node_name(new)
        || old
            .spec
            .as_ref()
            .map(|s| (&s.hostname, &s.subdomain, &s.containers))
            != new
                .spec
                .as_ref()
                .map(|s| (&s.hostname, &s.subdomain, &s.containers))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec, PodStatus, ServiceSpec};

    use super::*;

    fn pod_with_port(name: &str, port: i32) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![ContainerPort {
                        name: Some(name.into()),
                        container_port: port,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some("10.244.1.5".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn named_target_ports_resolve_per_pod() {
        let sp = ServicePort {
            port: 80,
            target_port: Some(IntOrString::String("http".into())),
            ..Default::default()
        };
        assert_eq!(find_port(&pod_with_port("http", 8080), &sp), Some(8080));
        assert_eq!(find_port(&pod_with_port("http", 9090), &sp), Some(9090));
        assert_eq!(find_port(&pod_with_port("other", 8080), &sp), None);
        let udp = ServicePort {
            protocol: Some("UDP".into()),
            ..sp.clone()
        };
        assert_eq!(find_port(&pod_with_port("http", 8080), &udp), None);
        let numbered = ServicePort {
            port: 80,
            target_port: Some(IntOrString::Int(8443)),
            ..Default::default()
        };
        assert_eq!(find_port(&Pod::default(), &numbered), Some(8443));
    }

    #[test]
    fn endpoints_carry_the_hostname_of_pods_in_the_services_subdomain() {
        let svc = |name: &str| Service {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = |hostname: Option<&str>, subdomain: Option<&str>| {
            let mut p = pod_with_port("http", 80);
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = hostname.map(String::from);
            spec.subdomain = subdomain.map(String::from);
            p
        };
        // A StatefulSet's pod: hostname web-1 in the subdomain of its headless Service web.
        let member = pod(Some("web-1"), Some("web"));
        assert_eq!(hostname(&member, &svc("web")), Some("web-1".into()));
        // Another Service selecting the same pod does not name it.
        assert_eq!(hostname(&member, &svc("other")), None);
        // No subdomain, or no (or an empty) hostname: no name.
        assert_eq!(hostname(&pod(Some("web-1"), None), &svc("web")), None);
        assert_eq!(hostname(&pod(None, Some("web")), &svc("web")), None);
        assert_eq!(hostname(&pod(Some(""), Some("web")), &svc("web")), None);
        assert_eq!(hostname(&Pod::default(), &svc("web")), None);
        // A change of hostname or subdomain reaches the endpoints.
        assert!(relevant_change(&member, &pod(Some("web-1"), Some("other"))));
        assert!(relevant_change(&member, &pod(Some("web-2"), Some("web"))));
        assert!(!relevant_change(&member, &member.clone()));
    }

    #[test]
    fn terminating_pods_are_serving_but_not_ready() {
        let mut p = pod_with_port("http", 80);
        p.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]);
        let svc = Service {
            spec: Some(ServiceSpec::default()),
            ..Default::default()
        };
        assert_eq!(conditions(&p, &svc), (true, true, false));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_eq!(conditions(&p, &svc), (false, true, true));
        assert!(should_include(&p, true));
        assert!(!should_include(&p, false));
        assert!(!should_include(&Pod::default(), true));
    }
}
