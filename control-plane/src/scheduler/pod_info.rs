//! What the scheduler knows about one pod, computed once per pod event instead of once per
//! node per scheduling cycle: its requests, host ports, tolerations, images, and its
//! inter-pod affinity terms and topology spread constraints with their label selectors parsed
//! (kube-scheduler's `PodInfo`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, Toleration, TopologySpreadConstraint};
use kube::ResourceExt;

use super::resources::{pod_requests, PodRequests};
use crate::machinery::selectors::{Operator, Requirement};
use crate::machinery::LabelSelector;

/// A pod's uid: the identity the queue and the cache track pods by (a name can be reused).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(pub Arc<str>);

impl std::fmt::Display for PodUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One host port a container binds on its node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// "0.0.0.0" when the pod names no hostIP: every address of the node.
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

/// An inter-pod (anti-)affinity term with its selectors parsed: which pods it selects and over
/// which topology domain.
#[derive(Clone, Debug)]
pub struct AffinityTerm {
    /// Namespaces named by the term (the pod's own when it names neither these nor a selector).
    pub namespaces: BTreeSet<String>,
    /// Namespaces selected by labels (`{}` selects every namespace; absent selects none).
    pub namespace_selector: LabelSelector,
    pub selector: LabelSelector,
    pub topology_key: String,
}

impl AffinityTerm {
    fn compile(owner: &Pod, term: &PodAffinityTerm) -> AffinityTerm {
        let own_ns = owner.namespace().unwrap_or_default();
        let mut namespaces: BTreeSet<String> = term.namespaces.iter().flatten().cloned().collect();
        let namespace_selector = match &term.namespace_selector {
            Some(s) => LabelSelector::from_meta(s).unwrap_or_else(|_| LabelSelector::nothing()),
            None => LabelSelector::nothing(),
        };
        if namespaces.is_empty() && term.namespace_selector.is_none() {
            namespaces.insert(own_ns);
        }
        let mut selector = LabelSelector::from_optional_meta(term.label_selector.as_ref())
            .unwrap_or_else(|_| LabelSelector::nothing());
        // matchLabelKeys / mismatchLabelKeys: `key in (own value)` / `key notin (own value)`,
        // merged as Kubernetes merges them (a no-op if the API server already did).
        let labels = owner.labels();
        let mut extra = Vec::new();
        for (keys, op) in [
            (&term.match_label_keys, Operator::In),
            (&term.mismatch_label_keys, Operator::NotIn),
        ] {
            for k in keys.iter().flatten() {
                if let Some(v) = labels.get(k) {
                    if let Ok(r) = Requirement::new(k, op, vec![v.clone()]) {
                        extra.push(r);
                    }
                }
            }
        }
        if !extra.is_empty() && !selector.is_nothing() {
            extra.extend(selector.requirements().iter().cloned());
            selector = LabelSelector::from_requirements(extra);
        }
        AffinityTerm {
            namespaces,
            namespace_selector,
            selector,
            topology_key: term.topology_key.clone(),
        }
    }

    /// Like [`AffinityTerm::matches`] without the namespace's labels: a namespace selector
    /// counts as possibly matching (for queueing hints, which may err towards a retry).
    pub fn may_match(&self, pod: &PodInfo) -> bool {
        (self.namespaces.contains(pod.namespace()) || !self.namespace_selector.is_nothing())
            && self.selector.matches(pod.labels())
    }

    /// Whether `pod` (with its namespace's labels) is selected by this term.
    pub fn matches(
        &self,
        pod: &PodInfo,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        let in_namespace = self.namespaces.contains(pod.namespace())
            || namespace_labels.is_some_and(|l| self.namespace_selector.matches(l));
        in_namespace && self.selector.matches(pod.labels())
    }
}

/// A preferred (anti-)affinity term and its weight (1-100).
#[derive(Clone, Debug)]
pub struct WeightedAffinityTerm {
    pub term: AffinityTerm,
    pub weight: i32,
}

/// `whenUnsatisfiable` of a topology spread constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenUnsatisfiable {
    DoNotSchedule,
    ScheduleAnyway,
}

/// `nodeAffinityPolicy` / `nodeTaintsPolicy`: whether a node the pod could not go to still
/// counts as a domain when skew is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InclusionPolicy {
    Honor,
    Ignore,
}

/// A topology spread constraint with its selector parsed (and matchLabelKeys merged).
#[derive(Clone, Debug)]
pub struct SpreadConstraint {
    pub max_skew: i32,
    pub topology_key: String,
    pub when: WhenUnsatisfiable,
    pub selector: LabelSelector,
    pub min_domains: i32,
    pub node_affinity_policy: InclusionPolicy,
    pub node_taints_policy: InclusionPolicy,
}

impl SpreadConstraint {
    fn compile(pod: &Pod, c: &TopologySpreadConstraint) -> SpreadConstraint {
        let mut selector = LabelSelector::from_optional_meta(c.label_selector.as_ref())
            .unwrap_or_else(|_| LabelSelector::nothing());
        let labels = pod.labels();
        let extra: Vec<Requirement> = c
            .match_label_keys
            .iter()
            .flatten()
            .filter_map(|k| {
                labels
                    .get(k)
                    .and_then(|v| Requirement::new(k, Operator::Equals, vec![v.clone()]).ok())
            })
            .collect();
        if !extra.is_empty() && !selector.is_nothing() {
            let mut all = extra;
            all.extend(selector.requirements().iter().cloned());
            selector = LabelSelector::from_requirements(all);
        }
        let policy = |p: &Option<String>, default| match p.as_deref() {
            Some("Honor") => InclusionPolicy::Honor,
            Some("Ignore") => InclusionPolicy::Ignore,
            _ => default,
        };
        SpreadConstraint {
            max_skew: c.max_skew,
            topology_key: c.topology_key.clone(),
            when: if c.when_unsatisfiable == "ScheduleAnyway" {
                WhenUnsatisfiable::ScheduleAnyway
            } else {
                WhenUnsatisfiable::DoNotSchedule
            },
            selector,
            min_domains: c.min_domains.unwrap_or(1),
            node_affinity_policy: policy(&c.node_affinity_policy, InclusionPolicy::Honor),
            node_taints_policy: policy(&c.node_taints_policy, InclusionPolicy::Ignore),
        }
    }
}

/// Everything the plugins need of a pod, computed once.
#[derive(Debug)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    pub uid: PodUid,
    pub priority: i32,
    pub requests: PodRequests,
    pub host_ports: Vec<HostPort>,
    pub tolerations: Vec<Toleration>,
    /// Normalised image names (`:latest` added when untagged), init containers included.
    pub images: Vec<String>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<WeightedAffinityTerm>,
    pub preferred_anti_affinity: Vec<WeightedAffinityTerm>,
    pub spread: Vec<SpreadConstraint>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// ImageLocality's normalisation: an image without a tag means `:latest`.
pub fn normalized_image(name: &str) -> String {
    // Option's order puts None first, as Go's LastIndex puts -1.
    if name.rfind(':') <= name.rfind('/') {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

impl PodInfo {
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let uid = PodUid(Arc::from(pod.metadata.uid.as_deref().unwrap_or_else(
            || {
                // Every stored pod has a uid; fall back to the name so a malformed one is still
                // tracked consistently.
                pod.metadata.name.as_deref().unwrap_or("")
            },
        )));
        let default_spec = Default::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let mut host_ports = Vec::new();
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        for c in spec.containers.iter().chain(sidecars) {
            for p in c.ports.iter().flatten() {
                if let Some(port) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        ip: p
                            .host_ip
                            .clone()
                            .filter(|ip| !ip.is_empty())
                            .unwrap_or_else(|| "0.0.0.0".into()),
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        port,
                    });
                }
            }
        }
        let images = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .filter_map(|c| c.image.as_deref())
            .map(normalized_image)
            .collect();
        let affinity = spec.affinity.as_ref();
        let pa = affinity.and_then(|a| a.pod_affinity.as_ref());
        let paa = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            terms
                .into_iter()
                .flatten()
                .map(|t| AffinityTerm::compile(&pod, t))
                .collect()
        };
        let preferred =
            |terms: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
                terms
                    .into_iter()
                    .flatten()
                    .map(|w| WeightedAffinityTerm {
                        term: AffinityTerm::compile(&pod, &w.pod_affinity_term),
                        weight: w.weight,
                    })
                    .collect::<Vec<_>>()
            };
        let required_affinity = required(pa.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let required_anti_affinity = required(paa.and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let preferred_affinity = preferred(pa.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let preferred_anti_affinity = preferred(paa.and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        }));
        let spread = spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .map(|c| SpreadConstraint::compile(&pod, c))
            .collect();
        PodInfo {
            uid,
            priority: spec.priority.unwrap_or(0),
            requests: pod_requests(spec),
            host_ports,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            images,
            required_affinity,
            required_anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            spread,
            pod,
        }
    }

    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or("")
    }

    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("")
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    /// The node the pod is bound to ("" while pending).
    pub fn node_name(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("")
    }

    pub fn scheduler_name(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or("default-scheduler")
    }

    /// Whether the pod is being deleted (a terminating pod is not scheduled, and spreading
    /// does not count it).
    pub fn terminating(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    /// Whether scheduling gates hold the pod back (the SchedulingGates plugin).
    pub fn gated(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty())
    }

    /// Whether the pod has any inter-pod affinity or anti-affinity term.
    pub fn has_affinity(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }

    /// "namespace/name", as events and logs name a pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    /// Whether an update from `old` to `self` could change a scheduling decision (anything but
    /// status and bookkeeping metadata), as kube-scheduler's `isPodUpdated`.
    pub fn spec_or_labels_changed(&self, old: &PodInfo) -> bool {
        self.pod.spec != old.pod.spec
            || self.pod.metadata.labels != old.pod.metadata.labels
            || self.pod.metadata.annotations != old.pod.metadata.annotations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testing::pod;
    use serde_json::json;

    #[test]
    fn images_are_normalised_like_image_locality() {
        assert_eq!(normalized_image("nginx"), "nginx:latest");
        assert_eq!(normalized_image("nginx:1.25"), "nginx:1.25");
        assert_eq!(
            normalized_image("localhost:5000/web"),
            "localhost:5000/web:latest"
        );
        assert_eq!(
            normalized_image("localhost:5000/web:v1"),
            "localhost:5000/web:v1"
        );
    }

    #[test]
    fn host_ports_default_ip_and_protocol() {
        let p = pod(json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]}
        ]}}));
        assert_eq!(
            p.host_ports,
            vec![HostPort {
                ip: "0.0.0.0".into(),
                protocol: "TCP".into(),
                port: 8080
            }]
        );
    }

    #[test]
    fn affinity_terms_default_to_the_pods_namespace_and_merge_match_label_keys() {
        let p = pod(
            json!({"metadata": {"name": "a", "namespace": "ns1", "labels": {"app": "web", "rev": "7"}},
            "spec": {"containers": [{"name": "c", "image": "i"}], "affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "matchLabelKeys": ["rev"],
                    "topologyKey": "kubernetes.io/hostname"}]}}}}),
        );
        let t = &p.required_anti_affinity[0];
        assert_eq!(t.namespaces, BTreeSet::from(["ns1".to_string()]));
        let same = pod(
            json!({"metadata": {"name": "b", "namespace": "ns1", "labels": {"app": "web", "rev": "7"}}}),
        );
        let other_rev = pod(
            json!({"metadata": {"name": "c", "namespace": "ns1", "labels": {"app": "web", "rev": "8"}}}),
        );
        let other_ns = pod(
            json!({"metadata": {"name": "d", "namespace": "ns2", "labels": {"app": "web", "rev": "7"}}}),
        );
        assert!(t.matches(&same, None));
        assert!(!t.matches(&other_rev, None));
        assert!(!t.matches(&other_ns, None));
    }

    #[test]
    fn empty_namespace_selector_selects_every_namespace() {
        let p = pod(
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "db"}}, "namespaceSelector": {},
                "topologyKey": "zone"}]}}}}),
        );
        let db =
            pod(json!({"metadata": {"name": "db", "namespace": "data", "labels": {"app": "db"}}}));
        assert!(p.required_affinity[0].matches(&db, Some(&BTreeMap::new())));
        assert!(p.has_affinity());
    }
}
