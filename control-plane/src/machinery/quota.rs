//! What an object counts against a ResourceQuota (Kubernetes' quota evaluators): a pod's
//! compute requests and limits and its object count, a Service's node ports and load
//! balancers, a PersistentVolumeClaim's storage (per storage class too), any object's `count/<resource>[.<group>]`; which quotas an object falls under
//! (scopes); and the arithmetic on resource lists. Pure: the ResourceQuota admission plugin
//! and the quota controller share it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceQuotaSpec, ScopedResourceSelectorRequirement};
use serde_json::Value;

use super::quantity::{Format, Quantity};

/// Resource name -> amount.
pub type Usage = BTreeMap<String, Quantity>;

/// What a quota keeps for one kind of object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evaluator {
    /// Compute resources and counts, with scopes.
    Pods,
    /// Counts, node ports and load balancers.
    Services,
    /// Counts and requested storage, in total and per storage class.
    PersistentVolumeClaims,
    /// A count only (`count/<resource>.<group>`, and the legacy name some kinds have).
    Count,
}

impl Evaluator {
    pub fn of(group: &str, plural: &str) -> Evaluator {
        match (group, plural) {
            ("", "pods") => Evaluator::Pods,
            ("", "services") => Evaluator::Services,
            ("", "persistentvolumeclaims") => Evaluator::PersistentVolumeClaims,
            _ => Evaluator::Count,
        }
    }
}

/// `count/deployments.apps`, `count/pods`.
pub fn count_name(group: &str, plural: &str) -> String {
    match group {
        "" => format!("count/{plural}"),
        g => format!("count/{plural}.{g}"),
    }
}

/// The pre-`count/` names of core kinds' object counts.
fn legacy_count_name(group: &str, plural: &str) -> Option<&'static str> {
    if !group.is_empty() {
        return None;
    }
    Some(match plural {
        "pods" => "pods",
        "services" => "services",
        "configmaps" => "configmaps",
        "secrets" => "secrets",
        "resourcequotas" => "resourcequotas",
        "replicationcontrollers" => "replicationcontrollers",
        "persistentvolumeclaims" => "persistentvolumeclaims",
        _ => return None,
    })
}

/// `<class>.storageclass.storage.k8s.io/requests.storage`: a storage class's share.
const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";
/// The storage class annotation older claims name theirs with, as a JSON pointer segment
/// (`volume.beta.kubernetes.io/storage-class`, its `/` escaped).
const BETA_CLASS_POINTER: &str = "volume.beta.kubernetes.io~1storage-class";

fn one() -> Quantity {
    Quantity::from_value(1, Format::DecimalSI)
}

fn count(n: i64) -> Quantity {
    Quantity::from_value(n, Format::DecimalSI)
}

/// Whether a quota resource is one objects of `group`/`plural` can use (MatchingResources).
pub fn handles(group: &str, plural: &str, resource: &str) -> bool {
    if resource == count_name(group, plural) || legacy_count_name(group, plural) == Some(resource) {
        return true;
    }
    match Evaluator::of(group, plural) {
        Evaluator::Pods => {
            let compute = |r: &str| {
                matches!(r, "cpu" | "memory" | "ephemeral-storage") || r.starts_with("hugepages-")
            };
            compute(resource)
                || resource
                    .strip_prefix("requests.")
                    .is_some_and(|r| compute(r) || is_extended(r))
                || resource.strip_prefix("limits.").is_some_and(compute)
        }
        Evaluator::Services => {
            matches!(resource, "services.nodeports" | "services.loadbalancers")
        }
        Evaluator::PersistentVolumeClaims => {
            resource == "requests.storage"
                || resource
                    .split_once(STORAGE_CLASS_SUFFIX)
                    .is_some_and(|(_, r)| {
                        matches!(r, "requests.storage" | "persistentvolumeclaims")
                    })
        }
        Evaluator::Count => false,
    }
}

/// Whether a pod's phase ends its claim on compute resources.
pub fn pod_is_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// What one object of `group`/`plural` uses.
pub fn usage(group: &str, plural: &str, obj: &Value) -> Usage {
    let mut u = Usage::new();
    u.insert(count_name(group, plural), one());
    match Evaluator::of(group, plural) {
        Evaluator::Pods => {
            if !pod_is_terminal(obj) {
                if let Ok(pod) = serde_json::from_value::<Pod>(obj.clone()) {
                    let (requests, limits) = pod_requests_limits(&pod);
                    add(&mut u, &compute_usage(&requests, &limits));
                }
            }
        }
        Evaluator::Services => {
            let ty = obj
                .pointer("/spec/type")
                .and_then(Value::as_str)
                .unwrap_or("ClusterIP");
            let ports = obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map_or(0, Vec::len) as i64;
            u.insert("services".into(), one());
            let (node_ports, lbs) = match ty {
                "NodePort" => (ports, 0),
                "LoadBalancer" => {
                    let allocate = obj
                        .pointer("/spec/allocateLoadBalancerNodePorts")
                        .and_then(Value::as_bool)
                        .unwrap_or(true);
                    let n = if allocate {
                        ports
                    } else {
                        obj.pointer("/spec/ports")
                            .and_then(Value::as_array)
                            .map_or(0, |p| {
                                p.iter()
                                    .filter(|p| {
                                        p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0
                                    })
                                    .count()
                            }) as i64
                    };
                    (n, 1)
                }
                _ => (0, 0),
            };
            u.insert("services.nodeports".into(), count(node_ports));
            u.insert("services.loadbalancers".into(), count(lbs));
        }
        Evaluator::PersistentVolumeClaims => {
            u.insert("persistentvolumeclaims".into(), one());
            let storage = obj
                .pointer("/spec/resources/requests/storage")
                .and_then(Value::as_str)
                .and_then(|s| Quantity::parse(s).ok());
            let class = obj
                .pointer("/spec/storageClassName")
                .or_else(|| obj.pointer(&format!("/metadata/annotations/{BETA_CLASS_POINTER}")))
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty());
            if let Some(class) = class {
                u.insert(
                    format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"),
                    one(),
                );
            }
            if let Some(q) = storage {
                if let Some(class) = class {
                    u.insert(
                        format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"),
                        q.clone(),
                    );
                }
                u.insert("requests.storage".into(), q);
            }
        }
        Evaluator::Count => {
            if let Some(legacy) = legacy_count_name(group, plural) {
                u.insert(legacy.into(), one());
            }
        }
    }
    u
}

fn parsed(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Usage {
    list.into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), Quantity::parse(&q.0).ok()?)))
        .collect()
}

/// A pod's requests and limits as the scheduler and quota see them: its containers summed,
/// at least each init container's, plus the pod overhead.
pub fn pod_requests_limits(pod: &Pod) -> (Usage, Usage) {
    let spec = pod.spec.as_ref();
    let (mut requests, mut limits) = (Usage::new(), Usage::new());
    for c in spec.iter().flat_map(|s| s.containers.iter()) {
        let r = c.resources.as_ref();
        add(&mut requests, &parsed(r.and_then(|r| r.requests.as_ref())));
        add(&mut limits, &parsed(r.and_then(|r| r.limits.as_ref())));
    }
    for c in spec.iter().flat_map(|s| s.init_containers.iter().flatten()) {
        let r = c.resources.as_ref();
        at_least(&mut requests, &parsed(r.and_then(|r| r.requests.as_ref())));
        at_least(&mut limits, &parsed(r.and_then(|r| r.limits.as_ref())));
    }
    let overhead = parsed(spec.and_then(|s| s.overhead.as_ref()));
    add(&mut requests, &overhead);
    add(&mut limits, &overhead);
    (requests, limits)
}

/// podComputeUsageHelper: `pods`, cpu/memory/ephemeral-storage under their plain and
/// `requests.` names, `limits.`, hugepages, and extended resources as `requests.<name>`.
pub fn compute_usage(requests: &Usage, limits: &Usage) -> Usage {
    let mut u = Usage::new();
    u.insert("pods".into(), one());
    for r in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(q) = requests.get(r) {
            u.insert(r.into(), q.clone());
            u.insert(format!("requests.{r}"), q.clone());
        }
        if let Some(q) = limits.get(r) {
            u.insert(format!("limits.{r}"), q.clone());
        }
    }
    for (r, q) in requests {
        if r.starts_with("hugepages-") {
            u.insert(r.clone(), q.clone());
            u.insert(format!("requests.{r}"), q.clone());
        } else if is_extended(r) {
            u.insert(format!("requests.{r}"), q.clone());
        }
    }
    u
}

/// An extended resource: domain-qualified, outside `kubernetes.io/`, not `requests.`.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The pod facts quota scopes look at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodScopes {
    /// activeDeadlineSeconds is set (`Terminating`).
    pub terminating: bool,
    pub best_effort: bool,
    pub priority_class: String,
    /// Any pod (anti-)affinity term names other namespaces.
    pub cross_namespace_affinity: bool,
}

impl PodScopes {
    pub fn of(pod: &Pod) -> PodScopes {
        let spec = pod.spec.clone().unwrap_or_default();
        let affinity = spec.affinity.as_ref();
        let terms = affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .map(|a| {
                let req = a
                    .required_during_scheduling_ignored_during_execution
                    .iter()
                    .flatten()
                    .cloned();
                let pref = a
                    .preferred_during_scheduling_ignored_during_execution
                    .iter()
                    .flatten()
                    .map(|w| w.pod_affinity_term.clone());
                req.chain(pref).collect::<Vec<_>>()
            })
            .into_iter()
            .flatten()
            .chain(
                affinity
                    .and_then(|a| a.pod_anti_affinity.as_ref())
                    .map(|a| {
                        let req = a
                            .required_during_scheduling_ignored_during_execution
                            .iter()
                            .flatten()
                            .cloned();
                        let pref = a
                            .preferred_during_scheduling_ignored_during_execution
                            .iter()
                            .flatten()
                            .map(|w| w.pod_affinity_term.clone());
                        req.chain(pref).collect::<Vec<_>>()
                    })
                    .into_iter()
                    .flatten(),
            );
        let cross = terms
            .into_iter()
            .any(|t| t.namespace_selector.is_some() || t.namespaces.is_some_and(|n| !n.is_empty()));
        PodScopes {
            terminating: spec.active_deadline_seconds.is_some_and(|d| d >= 0),
            best_effort: super::kinds::qos_class(&spec) == "BestEffort",
            priority_class: spec.priority_class_name.unwrap_or_default(),
            cross_namespace_affinity: cross,
        }
    }

    fn matches_scope(&self, scope: &str) -> bool {
        match scope {
            "Terminating" => self.terminating,
            "NotTerminating" => !self.terminating,
            "BestEffort" => self.best_effort,
            "NotBestEffort" => !self.best_effort,
            "PriorityClass" => !self.priority_class.is_empty(),
            "CrossNamespacePodAffinity" => self.cross_namespace_affinity,
            _ => false,
        }
    }

    fn matches_requirement(&self, r: &ScopedResourceSelectorRequirement) -> bool {
        let values = r.values.clone().unwrap_or_default();
        if r.scope_name == "PriorityClass" {
            let set = !self.priority_class.is_empty();
            return match r.operator.as_str() {
                "In" => set && values.contains(&self.priority_class),
                "NotIn" => !(set && values.contains(&self.priority_class)),
                "Exists" => set,
                "DoesNotExist" => !set,
                _ => false,
            };
        }
        let m = self.matches_scope(&r.scope_name);
        match r.operator.as_str() {
            "Exists" | "In" => m,
            "DoesNotExist" | "NotIn" => !m,
            _ => false,
        }
    }
}

/// Whether a quota with these scopes covers an object: a quota with scopes covers only pods
/// that match every one of them; a quota without covers everything.
pub fn matches_scopes(spec: &ResourceQuotaSpec, pod: Option<&PodScopes>) -> bool {
    let scopes = spec.scopes.as_deref().unwrap_or_default();
    let exprs = spec
        .scope_selector
        .as_ref()
        .and_then(|s| s.match_expressions.as_deref())
        .unwrap_or_default();
    if scopes.is_empty() && exprs.is_empty() {
        return true;
    }
    let Some(pod) = pod else { return false };
    scopes.iter().all(|s| pod.matches_scope(s)) && exprs.iter().all(|r| pod.matches_requirement(r))
}

/// `a += b`, resource by resource.
pub fn add(a: &mut Usage, b: &Usage) {
    for (k, v) in b {
        let sum = match a.get(k) {
            // A zero takes the other's format, as Kubernetes' Quantity.Add does (so used
            // storage reads 1Gi, not 1073741824).
            Some(have) if have.is_zero() => v.clone(),
            Some(have) => have.checked_add(v).unwrap_or_else(|| v.clone()),
            None => v.clone(),
        };
        a.insert(k.clone(), sum);
    }
}

/// `a -= b`, resource by resource (resources only in `b` become negative).
pub fn subtract(a: &mut Usage, b: &Usage) {
    for (k, v) in b {
        let zero = Quantity::from_value(0, v.format());
        let diff = a.get(k).unwrap_or(&zero).checked_sub(v).unwrap_or(zero);
        a.insert(k.clone(), diff);
    }
}

fn at_least(a: &mut Usage, b: &Usage) {
    for (k, v) in b {
        if a.get(k).is_none_or(|have| have < v) {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// Only the resources named in `keys`.
pub fn mask<'a>(u: &Usage, keys: impl IntoIterator<Item = &'a String>) -> Usage {
    keys.into_iter()
        .filter_map(|k| Some((k.clone(), u.get(k)?.clone())))
        .collect()
}

/// `a - b` where positive (SubtractWithNonNegativeResult), zeros dropped.
pub fn positive_delta(a: &Usage, b: &Usage) -> Usage {
    a.iter()
        .filter_map(|(k, v)| {
            let d = match b.get(k) {
                Some(o) => v.checked_sub(o)?,
                None => v.clone(),
            };
            (d.nano_value() > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// `cpu=500m,pods=1`: sorted, as Kubernetes' quota messages print lists.
pub fn pretty(u: &Usage) -> String {
    u.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a ResourceList of the API.
pub fn from_api(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Usage {
    parsed(list)
}

/// A ResourceList for the API.
pub fn to_api(
    u: &Usage,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    u.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.to_string()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn claims_use_storage_in_total_and_per_class() {
        let pvc = json!({"metadata":{"name":"c"},"spec":{"storageClassName":"fast",
            "resources":{"requests":{"storage":"1Gi"}}}});
        let u = usage("", "persistentvolumeclaims", &pvc);
        assert_eq!(u["persistentvolumeclaims"], q("1"));
        assert_eq!(u["count/persistentvolumeclaims"], q("1"));
        assert_eq!(u["requests.storage"], q("1Gi"));
        assert_eq!(
            u["fast.storageclass.storage.k8s.io/requests.storage"],
            q("1Gi")
        );
        assert_eq!(
            u["fast.storageclass.storage.k8s.io/persistentvolumeclaims"],
            q("1")
        );
        let beta = json!({"metadata":{"name":"c","annotations":{
            "volume.beta.kubernetes.io/storage-class":"slow"}},
            "spec":{"resources":{"requests":{"storage":"2Gi"}}}});
        let u = usage("", "persistentvolumeclaims", &beta);
        assert_eq!(
            u["slow.storageclass.storage.k8s.io/requests.storage"],
            q("2Gi")
        );
        let plain = json!({"metadata":{"name":"c"},"spec":{}});
        let u = usage("", "persistentvolumeclaims", &plain);
        assert!(!u.contains_key("requests.storage"));
        for r in [
            "requests.storage",
            "persistentvolumeclaims",
            "count/persistentvolumeclaims",
            "fast.storageclass.storage.k8s.io/requests.storage",
        ] {
            assert!(handles("", "persistentvolumeclaims", r), "{r}");
        }
        assert!(!handles("", "persistentvolumeclaims", "requests.cpu"));
        assert!(!handles("", "pods", "requests.storage"));
    }

    #[test]
    fn pods_use_compute_and_counts() {
        let pod = json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"a","image":"i","resources":{"requests":{"cpu":"250m","memory":"64Mi","example.com/gpu":"1"},"limits":{"cpu":"500m"}}},
            {"name":"b","image":"i","resources":{"requests":{"cpu":"250m"}}}],
            "initContainers":[{"name":"i","image":"i","resources":{"requests":{"cpu":"1"}}}]}});
        let u = usage("", "pods", &pod);
        assert_eq!(u["pods"], q("1"));
        assert_eq!(u["count/pods"], q("1"));
        assert_eq!(u["requests.cpu"], q("1"), "at least the init container's");
        assert_eq!(u["cpu"], q("1"));
        assert_eq!(u["requests.memory"], q("64Mi"));
        assert_eq!(u["limits.cpu"], q("500m"));
        assert_eq!(u["requests.example.com/gpu"], q("1"));
        assert!(!u.contains_key("limits.memory"));
        let mut done = pod.clone();
        done["status"] = json!({"phase": "Succeeded"});
        let u = usage("", "pods", &done);
        assert_eq!(
            u.keys().collect::<Vec<_>>(),
            vec!["count/pods"],
            "finished pods only count as objects"
        );
    }

    #[test]
    fn services_and_other_kinds() {
        let svc = json!({"spec":{"type":"NodePort","ports":[{"port":80},{"port":81}]}});
        let u = usage("", "services", &svc);
        assert_eq!(u["services.nodeports"], q("2"));
        assert_eq!(u["services.loadbalancers"], q("0"));
        assert_eq!(u["services"], q("1"));
        let u = usage("apps", "deployments", &json!({}));
        assert_eq!(pretty(&u), "count/deployments.apps=1");
        let u = usage("", "configmaps", &json!({}));
        assert_eq!(pretty(&u), "configmaps=1,count/configmaps=1");
        assert!(handles("", "pods", "requests.cpu"));
        assert!(!handles("", "configmaps", "requests.cpu"));
        assert!(handles("apps", "deployments", "count/deployments.apps"));
    }

    #[test]
    fn scopes() {
        let spec = |v: Value| serde_json::from_value::<ResourceQuotaSpec>(v).unwrap();
        let pod = |v: Value| PodScopes::of(&serde_json::from_value(v).unwrap());
        let best = pod(json!({"spec":{"containers":[{"name":"a"}]}}));
        let burst = pod(
            json!({"spec":{"activeDeadlineSeconds":10,"priorityClassName":"high",
            "containers":[{"name":"a","resources":{"requests":{"cpu":"1"}}}]}}),
        );
        assert!(matches_scopes(&spec(json!({})), None));
        assert!(!matches_scopes(
            &spec(json!({"scopes":["BestEffort"]})),
            None
        ));
        assert!(matches_scopes(
            &spec(json!({"scopes":["BestEffort"]})),
            Some(&best)
        ));
        assert!(!matches_scopes(
            &spec(json!({"scopes":["BestEffort"]})),
            Some(&burst)
        ));
        assert!(matches_scopes(
            &spec(json!({"scopes":["Terminating","NotBestEffort"]})),
            Some(&burst)
        ));
        let high = spec(
            json!({"scopeSelector":{"matchExpressions":[{"scopeName":"PriorityClass","operator":"In","values":["high"]}]}}),
        );
        assert!(matches_scopes(&high, Some(&burst)));
        assert!(!matches_scopes(&high, Some(&best)));
    }

    #[test]
    fn arithmetic() {
        let a: Usage = [("cpu".to_string(), q("1")), ("pods".to_string(), q("2"))].into();
        let b: Usage = [("cpu".to_string(), q("1500m"))].into();
        assert_eq!(pretty(&positive_delta(&a, &b)), "pods=2");
        let mut c = a.clone();
        add(&mut c, &b);
        assert_eq!(pretty(&c), "cpu=2500m,pods=2");
        subtract(&mut c, &a);
        assert_eq!(pretty(&c), "cpu=1500m,pods=0");
    }
}
