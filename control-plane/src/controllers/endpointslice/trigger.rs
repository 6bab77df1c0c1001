//! The `endpoints.kubernetes.io/last-change-trigger-time` annotation, computed as
//! Kubernetes' TriggerTimeTracker does: per Service, the earliest trigger time that changed
//! since the previous sync, where a pod's trigger time is its Ready condition's last
//! transition and the Service's is its creation. A Service seen for the first time reports
//! its creation time. Service proxies measure network programming latency from it.
//!
//! Pure: the controller calls [`TriggerTimes::compute`] once per sync of a Service (never
//! concurrently for the same Service: the work queue guarantees it) and writes the result
//! on every slice it creates or updates in that sync.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::jiff::Timestamp;

use crate::runtime::ObjectKey;

pub const ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

#[derive(Default)]
struct State {
    pods: HashMap<String, Timestamp>,
    service: Option<Timestamp>,
}

/// What each Service's previous sync saw.
#[derive(Default)]
pub struct TriggerTimes {
    services: Mutex<HashMap<ObjectKey, State>>,
}

fn pod_trigger(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

fn service_trigger(svc: &Service) -> Option<Timestamp> {
    svc.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

impl TriggerTimes {
    /// The trigger time for this sync of `svc` over its `pods`, or `None` when nothing that
    /// triggers changed (the annotation is then removed from written slices).
    pub fn compute<'a>(
        &self,
        key: &ObjectKey,
        svc: &Service,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Option<Timestamp> {
        let mut map = self.services.lock().unwrap_or_else(|p| p.into_inner());
        let known = map.contains_key(key);
        let state = map.entry(key.clone()).or_default();
        let mut earliest: Option<Timestamp> = None;
        let mut now_pods = HashMap::new();
        for pod in pods {
            let Some(t) = pod_trigger(pod) else { continue };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if state.pods.get(&name).is_none_or(|prev| t > *prev) {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
            now_pods.insert(name, t);
        }
        let svc_time = service_trigger(svc);
        if let Some(t) = svc_time.filter(|t| state.service.is_none_or(|prev| *t > prev)) {
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        }
        state.pods = now_pods;
        state.service = svc_time;
        if known {
            earliest
        } else {
            svc_time
        }
    }

    /// The Service is gone: forget what its syncs saw.
    pub fn forget(&self, key: &ObjectKey) {
        self.services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// Kubernetes' format: RFC 3339 with nanoseconds, UTC.
pub fn format(t: Timestamp) -> String {
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn svc(created: i64) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                creation_timestamp: Some(Time(ts(created))),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(name: &str, ready_at: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                conditions: ready_at.map(|s| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(ts(s))),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_service_reports_its_creation_then_only_changes_count() {
        let t = TriggerTimes::default();
        let key = ObjectKey::namespaced("default", "web");
        let s = svc(0);
        let (a, b) = (pod("a", Some(5)), pod("b", Some(7)));
        assert_eq!(t.compute(&key, &s, [&a, &b]), Some(ts(0)), "first sync");
        assert_eq!(t.compute(&key, &s, [&a, &b]), None, "nothing changed");
        // b flips at 20, a new pod c becomes ready at 15: the earliest change wins.
        let (b2, c) = (pod("b", Some(20)), pod("c", Some(15)));
        assert_eq!(t.compute(&key, &s, [&a, &b2, &c]), Some(ts(15)));
        // A pod that disappears triggers nothing by itself (as in Kubernetes).
        assert_eq!(t.compute(&key, &s, [&a, &b2]), None);
        // Pods without a Ready condition are not triggers.
        assert_eq!(t.compute(&key, &s, [&a, &b2, &pod("d", None)]), None);
    }

    #[test]
    fn a_recreated_service_counts_as_new() {
        let t = TriggerTimes::default();
        let key = ObjectKey::namespaced("default", "web");
        assert_eq!(t.compute(&key, &svc(0), []), Some(ts(0)));
        t.forget(&key);
        assert_eq!(t.compute(&key, &svc(30), []), Some(ts(30)));
        assert_eq!(
            t.compute(&key, &svc(40), []),
            Some(ts(40)),
            "newer creation"
        );
    }

    #[test]
    fn formats_as_rfc3339_utc() {
        let s = format(Timestamp::from_millisecond(1_700_000_000_250).unwrap());
        assert_eq!(s, "2023-11-14T22:13:20.25Z");
    }
}
