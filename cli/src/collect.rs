//! Reads a trace from the cluster: the traced object and what it owns from the API server,
//! the pods' conditions, container states and Events, the EndpointSlices of the Services
//! selecting them, and from each node's service proxy (DaemonSet `skiff-proxy` in
//! kube-system) when it programmed them (`GET /programmed` on the proxy's status port), and
//! from each cluster DNS server (`k8s-app=kube-dns`) when it learned their names (`GET
//! /learned` on its metrics port), both through the API server's pods/proxy subresource
//! (authenticated and authorized as the caller; no connection to a node from the plugin).

use crate::trace::{Step, StepKind, Trace};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::Client;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Where an add-on's pods run and the port they answer on (reached through pods/proxy).
#[derive(Clone, Debug)]
pub struct AddOn {
    pub namespace: String,
    pub selector: String,
    pub port: u16,
}

impl AddOn {
    /// The service proxies (deploy/proxy.yaml): `/programmed` on their status port.
    pub fn proxies() -> AddOn {
        AddOn {
            namespace: "kube-system".into(),
            selector: "k8s-app=skiff-proxy".into(),
            port: 10256,
        }
    }

    /// The cluster DNS (deploy/dns.yaml): `/learned` on its metrics port.
    pub fn dns() -> AddOn {
        AddOn {
            namespace: "kube-system".into(),
            selector: "k8s-app=kube-dns".into(),
            port: 9153,
        }
    }

    /// This add-on's pods.
    async fn pods(&self, client: &Client) -> Result<Vec<Pod>, TraceError> {
        Ok(Api::<Pod>::namespaced(client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&self.selector))
            .await
            .map_err(api_err(format!("listing the pods {}", self.selector)))?
            .items)
    }

    /// Every pod of this add-on (`what`, e.g. "service proxy") asked `GET
    /// /<endpoint>?namespace=&name=` through pods/proxy for each of `services`.
    /// A pod that does not answer, or no pod at all, is a note: the `step` steps are then
    /// unknown.
    async fn ask_each<T: serde::de::DeserializeOwned>(
        &self,
        client: &Client,
        (what, step): (&str, &str),
        endpoint: &str,
        namespace: &str,
        services: &[String],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer<T>>, TraceError> {
        let pods = self.pods(client).await?;
        if pods.is_empty() {
            notes.push(format!(
                "no {what} pods ({} in {}): {step} steps unknown",
                self.selector, self.namespace
            ));
        }
        let mut answers = Vec::new();
        for pod in &pods {
            let (name, node) = (name_of(&pod.metadata), node_of(pod));
            for svc in services {
                let path = format!(
                    "/api/v1/namespaces/{}/pods/{}:{}/proxy/{endpoint}?namespace={namespace}&name={svc}",
                    self.namespace,
                    name,
                    self.port
                );
                match get_json::<T>(client, &path).await {
                    Ok(report) => answers.push(Answer {
                        service: svc.clone(),
                        pod: name.clone(),
                        node: node.clone(),
                        report,
                    }),
                    Err(e) => notes.push(format!(
                        "{what} {name} on {node} did not answer for service/{svc}: {e}"
                    )),
                }
            }
        }
        Ok(answers)
    }
}

/// One add-on pod's answer about one service (None: 404, nothing recorded there).
struct Answer<T> {
    service: String,
    pod: String,
    node: String,
    report: Option<T>,
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// What `kubectl skiff trace` traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Deployment(String),
    Service(String),
    Pod(String),
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{0:?}: expected deployment/NAME, service/NAME or pod/NAME")]
    BadTarget(String),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl std::str::FromStr for Target {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let bad = || TraceError::BadTarget(s.to_string());
        let (kind, name) = s.split_once('/').ok_or_else(bad)?;
        if name.is_empty() || name.contains('/') {
            return Err(bad());
        }
        let name = name.to_string();
        match kind.to_ascii_lowercase().as_str() {
            "deployment" | "deployments" | "deploy" | "deployment.apps" => {
                Ok(Target::Deployment(name))
            }
            "service" | "services" | "svc" => Ok(Target::Service(name)),
            "pod" | "pods" | "po" => Ok(Target::Pod(name)),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Deployment(n) => write!(f, "deployment/{n}"),
            Target::Service(n) => write!(f, "service/{n}"),
            Target::Pod(n) => write!(f, "pod/{n}"),
        }
    }
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TraceError {
    let what = what.into();
    move |source| TraceError::Api { what, source }
}

fn created(m: &ObjectMeta) -> Option<Timestamp> {
    m.creation_timestamp.as_ref().map(|t| t.0)
}

fn name_of(m: &ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

fn uid_of(m: &ObjectMeta) -> String {
    m.uid.clone().unwrap_or_default()
}

fn owned_by(m: &ObjectMeta, uid: &str) -> bool {
    m.owner_references.iter().flatten().any(|o| o.uid == uid)
}

/// `matchLabels` as a list selector (matchExpressions are checked by ownership instead).
fn label_selector(labels: Option<&BTreeMap<String, String>>) -> String {
    labels
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a Service's selector picks a pod.
pub fn selects(service: &Service, pod: &Pod) -> bool {
    let Some(sel) = service.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    let labels = pod.metadata.labels.as_ref();
    !sel.is_empty()
        && sel
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The pod's steps from its own object: created, scheduled, sandbox, started, Ready.
pub fn pod_steps(pod: &Pod) -> Vec<Step> {
    let object = format!("pod/{}", name_of(&pod.metadata));
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let condition = |type_: &str| -> Option<Timestamp> {
        pod.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")?
            .last_transition_time
            .as_ref()
            .map(|t| t.0)
    };
    // The last container to start is when the pod's containers all run.
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| {
            cs.iter()
                .map(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.running.as_ref())
                        .and_then(|r| r.started_at.as_ref())
                        .map(|t| t.0)
                })
                .collect::<Option<Vec<_>>>()
        })
        .and_then(|ts| ts.into_iter().max());
    vec![
        Step::new(StepKind::PodCreated, &object, created(&pod.metadata)),
        Step::new(StepKind::Scheduled, &object, condition("PodScheduled")).detail(node.clone()),
        Step::new(
            StepKind::SandboxReady,
            &object,
            condition("PodReadyToStartContainers"),
        )
        .detail(node.clone()),
        Step::new(StepKind::Started, &object, started).detail(node.clone()),
        Step::new(StepKind::Ready, &object, condition("Ready")).detail(node),
    ]
}

/// The event's time: when it first happened.
fn event_time(e: &Event) -> Option<Timestamp> {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.first_timestamp.as_ref().map(|t: &Time| t.0))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
}

/// The latest `Pulled` event of the pod's containers (the last image in place).
pub fn pulled(events: &[Event]) -> Option<Timestamp> {
    events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Pulled"))
        .filter_map(event_time)
        .max()
}

/// Whether a slice lists the pod ready, and when the slice was last written (its newest
/// managedFields time: the EndpointSlice controller's last write; a later write for
/// another pod moves it, which the trace states).
pub fn slice_lists(slice: &EndpointSlice, pod_uid: &str) -> Option<Option<Timestamp>> {
    let listed = slice.endpoints.iter().any(|e| {
        e.target_ref.as_ref().and_then(|r| r.uid.as_deref()) == Some(pod_uid)
            && e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
    });
    listed.then(|| {
        slice
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.time.as_ref().map(|t| t.0))
            .max()
            .or_else(|| created(&slice.metadata))
    })
}

/// One proxy's answer of `/programmed`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgrammedReport {
    pub node: Option<String>,
    pub last_programmed: String,
    pub endpoints: Vec<ProgrammedEndpoint>,
}

#[derive(Debug, Deserialize)]
pub struct ProgrammedEndpoint {
    pub ip: String,
    pub programmed: String,
}

/// One DNS server's answer of `/learned`.
#[derive(Debug, Deserialize)]
pub struct LearnedReport {
    pub name: String,
    pub learned: String,
    pub addresses: Vec<LearnedAddress>,
}

#[derive(Debug, Deserialize)]
pub struct LearnedAddress {
    pub ip: String,
    pub learned: String,
}

/// Reads the trace of `target` in `namespace`.
pub async fn trace(
    client: Client,
    namespace: &str,
    target: &Target,
    proxies: &AddOn,
    dns: &AddOn,
) -> Result<Trace, TraceError> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let services_api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let target_name = target.to_string();
    let (pods, services): (Vec<Pod>, Vec<Service>) = match target {
        Target::Deployment(name) => {
            let d = Api::<Deployment>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .map_err(api_err(format!("getting {target}")))?;
            steps.push(Step::new(
                StepKind::Accepted,
                &target_name,
                created(&d.metadata),
            ));
            let selector = label_selector(
                d.spec
                    .as_ref()
                    .and_then(|s| s.selector.match_labels.as_ref()),
            );
            let lp = ListParams::default().labels(&selector);
            let mut sets: Vec<ReplicaSet> =
                Api::<ReplicaSet>::namespaced(client.clone(), namespace)
                    .list(&lp)
                    .await
                    .map_err(api_err("listing ReplicaSets"))?
                    .items
                    .into_iter()
                    .filter(|rs| owned_by(&rs.metadata, &uid_of(&d.metadata)))
                    .collect();
            sets.sort_by_key(|rs| created(&rs.metadata));
            for rs in &sets {
                steps.push(Step::new(
                    StepKind::ReplicaSetCreated,
                    format!("replicaset/{}", name_of(&rs.metadata)),
                    created(&rs.metadata),
                ));
            }
            let uids: Vec<String> = sets.iter().map(|rs| uid_of(&rs.metadata)).collect();
            let pods: Vec<Pod> = pods_api
                .list(&lp)
                .await
                .map_err(api_err("listing pods"))?
                .items
                .into_iter()
                .filter(|p| uids.iter().any(|u| owned_by(&p.metadata, u)))
                .collect();
            let services = services_api
                .list(&ListParams::default())
                .await
                .map_err(api_err("listing services"))?
                .items
                .into_iter()
                .filter(|s| pods.iter().any(|p| selects(s, p)))
                .collect();
            (pods, services)
        }
        Target::Service(name) => {
            let s = services_api
                .get(name)
                .await
                .map_err(api_err(format!("getting {target}")))?;
            steps.push(Step::new(
                StepKind::Accepted,
                &target_name,
                created(&s.metadata),
            ));
            let selector = label_selector(s.spec.as_ref().and_then(|s| s.selector.as_ref()));
            let pods = if selector.is_empty() {
                notes.push(format!("{target} has no selector: no pods to trace"));
                Vec::new()
            } else {
                pods_api
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(api_err("listing pods"))?
                    .items
            };
            (pods, vec![s])
        }
        Target::Pod(name) => {
            let p = pods_api
                .get(name)
                .await
                .map_err(api_err(format!("getting {target}")))?;
            steps.push(Step::new(
                StepKind::Accepted,
                &target_name,
                created(&p.metadata),
            ));
            let services = services_api
                .list(&ListParams::default())
                .await
                .map_err(api_err("listing services"))?
                .items
                .into_iter()
                .filter(|s| selects(s, &p))
                .collect();
            (vec![p], services)
        }
    };
    let mut pods = pods;
    pods.sort_by_key(|p| (created(&p.metadata), name_of(&p.metadata)));

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let mut slices_of: Vec<(String, Vec<EndpointSlice>)> = Vec::new();
    for s in &services {
        let svc = name_of(&s.metadata);
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
        let items = slices
            .list(&lp)
            .await
            .map_err(api_err(format!(
                "listing the EndpointSlices of service/{svc}"
            )))?
            .items;
        slices_of.push((svc, items));
    }

    // Every proxy's record of every service (None: not programmed there yet), and every
    // DNS server's record of every service's name: one call per pod and service.
    let names: Vec<String> = slices_of.iter().map(|(svc, _)| svc.clone()).collect();
    let (mut programmed, mut learned) = (Vec::new(), Vec::new());
    if !services.is_empty() {
        programmed = proxies
            .ask_each::<ProgrammedReport>(
                &client,
                ("service proxy", "programmed"),
                "programmed",
                namespace,
                &names,
                &mut notes,
            )
            .await?;
        learned = dns
            .ask_each::<LearnedReport>(
                &client,
                ("cluster DNS", "name resolvable"),
                "learned",
                namespace,
                &names,
                &mut notes,
            )
            .await?;
    }
    let headless: Vec<String> = services
        .iter()
        .filter(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None"))
        .map(|s| name_of(&s.metadata))
        .collect();

    for pod in &pods {
        let object = format!("pod/{}", name_of(&pod.metadata));
        let uid = uid_of(&pod.metadata);
        let mut own = pod_steps(pod);
        let events = Api::<Event>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
            .await
            .map_err(api_err(format!("listing the events of {object}")))?
            .items;
        let at = own
            .iter()
            .position(|s| s.kind == StepKind::Started)
            .unwrap_or(own.len());
        own.insert(
            at,
            Step::new(StepKind::ImagePulled, &object, pulled(&events)),
        );
        steps.extend(own);
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        for (svc, items) in &slices_of {
            let listed = items
                .iter()
                .find_map(|sl| slice_lists(sl, &uid).map(|t| (name_of(&sl.metadata), t)));
            let step = match listed {
                Some((slice, t)) => Step::new(StepKind::InEndpointSlice, &object, t)
                    .detail(format!("service/{svc} slice/{slice} (last written)")),
                None => Step::new(StepKind::InEndpointSlice, &object, None)
                    .detail(format!("service/{svc}")),
            };
            steps.push(step);
            for Answer { node, report, .. } in programmed.iter().filter(|a| &a.service == svc) {
                let at = ip.as_deref().zip(report.as_ref()).and_then(|(ip, report)| {
                    report
                        .endpoints
                        .iter()
                        .find(|e| e.ip == ip)
                        .and_then(|e| e.programmed.parse::<Timestamp>().ok())
                });
                let node = report
                    .as_ref()
                    .and_then(|r| r.node.clone())
                    .unwrap_or_else(|| node.clone());
                steps.push(
                    Step::new(StepKind::Programmed, &object, at)
                        .detail(format!("service/{svc} node {node}"))
                        .fine(),
                );
            }
            if headless.contains(svc) {
                // A headless Service's name answers with the pod's own address.
                for Answer {
                    pod: dns,
                    node,
                    report,
                    ..
                } in learned.iter().filter(|a| &a.service == svc)
                {
                    let at = ip.as_deref().zip(report.as_ref()).and_then(|(ip, r)| {
                        r.addresses
                            .iter()
                            .find(|a| a.ip == ip)
                            .and_then(|a| a.learned.parse::<Timestamp>().ok())
                    });
                    steps.push(
                        Step::new(StepKind::Resolvable, &object, at)
                            .detail(format!("service/{svc} dns {dns} on {node}"))
                            .fine(),
                    );
                }
            }
        }
    }
    // A Service with a cluster IP: its name resolves to that, whatever its pods.
    for Answer {
        service: svc,
        pod: dns,
        node,
        report,
    } in learned.iter().filter(|a| !headless.contains(&a.service))
    {
        let answer = report
            .as_ref()
            .map(|r| {
                let ips: Vec<&str> = r.addresses.iter().map(|a| a.ip.as_str()).collect();
                format!("{} -> {}", r.name, ips.join(","))
            })
            .unwrap_or_else(|| format!("service/{svc}"));
        steps.push(
            Step::new(
                StepKind::Resolvable,
                format!("service/{svc}"),
                report.as_ref().and_then(|r| r.learned.parse().ok()),
            )
            .detail(format!("{answer} dns {dns} on {node}"))
            .fine(),
        );
    }
    if pods.is_empty() {
        // A Service without pods: when each node programmed it at all.
        for Answer {
            service: svc,
            node,
            report,
            ..
        } in &programmed
        {
            steps.push(
                Step::new(
                    StepKind::Programmed,
                    format!("service/{svc}"),
                    report.as_ref().and_then(|r| r.last_programmed.parse().ok()),
                )
                .detail(format!("node {node}"))
                .fine(),
            );
        }
    }
    Ok(Trace {
        target: target_name,
        namespace: namespace.to_string(),
        steps,
        notes,
    }
    .finish())
}

/// GET `path` on the API server as JSON; None for 404 (not programmed or learned there).
async fn get_json<T: serde::de::DeserializeOwned>(
    client: &Client,
    path: &str,
) -> Result<Option<T>, kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    match client.request::<T>(req).await {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_kubectl_names_them() {
        assert_eq!(
            "deployment/web".parse::<Target>().unwrap(),
            Target::Deployment("web".into())
        );
        assert_eq!(
            "svc/web".parse::<Target>().unwrap(),
            Target::Service("web".into())
        );
        assert_eq!(
            "po/w-1".parse::<Target>().unwrap(),
            Target::Pod("w-1".into())
        );
        for bad in ["web", "node/n1", "pod/", "pod/a/b"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_steps_come_from_conditions_and_container_states() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web-1", "uid": "u1", "creationTimestamp": "2026-12-02T10:00:00Z"},
            "spec": {"nodeName": "node-2", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-02T10:00:01Z"},
                    {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-12-02T10:00:02Z"},
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-02T10:00:02Z"}
                ],
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                     "state": {"running": {"startedAt": "2026-12-02T10:00:03Z"}}},
                    {"name": "b", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                     "state": {"running": {"startedAt": "2026-12-02T10:00:04Z"}}}
                ]
            }
        }));
        let steps = pod_steps(&p);
        let at = |k: StepKind| steps.iter().find(|s| s.kind == k).unwrap().at;
        assert_eq!(
            at(StepKind::Scheduled),
            Some("2026-12-02T10:00:01Z".parse().unwrap())
        );
        assert_eq!(
            at(StepKind::SandboxReady),
            Some("2026-12-02T10:00:02Z".parse().unwrap())
        );
        assert_eq!(
            at(StepKind::Started),
            Some("2026-12-02T10:00:04Z".parse().unwrap())
        );
        // Not Ready: no time, not the False condition's.
        assert_eq!(at(StepKind::Ready), None);
        assert_eq!(steps[1].detail, "node-2");
    }

    #[test]
    fn a_slice_lists_a_pod_only_when_ready() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-abc", "creationTimestamp": "2026-12-02T10:00:00Z",
                "managedFields": [{"manager": "endpointslice-controller", "operation": "Update",
                    "apiVersion": "discovery.k8s.io/v1", "time": "2026-12-02T10:00:05Z"}]},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.5"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "uid": "u1"}},
                {"addresses": ["10.1.0.6"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "uid": "u2"}}
            ]
        }))
        .unwrap();
        assert_eq!(
            slice_lists(&slice, "u1"),
            Some(Some("2026-12-02T10:00:05Z".parse().unwrap()))
        );
        assert_eq!(slice_lists(&slice, "u2"), None);
        assert_eq!(slice_lists(&slice, "u3"), None);
    }

    #[test]
    fn services_select_by_every_label() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"}, "spec": {"selector": {"app": "web", "tier": "fe"}}
        }))
        .unwrap();
        let p = |labels| pod(serde_json::json!({"metadata": {"name": "p", "labels": labels}}));
        assert!(selects(
            &svc,
            &p(serde_json::json!({"app": "web", "tier": "fe", "x": "y"}))
        ));
        assert!(!selects(&svc, &p(serde_json::json!({"app": "web"}))));
    }

    #[test]
    fn the_last_pull_counts() {
        let ev = |reason: &str, t: &str| -> Event {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "e"}, "involvedObject": {}, "reason": reason, "firstTimestamp": t
            }))
            .unwrap()
        };
        let events = [
            ev("Pulled", "2026-12-02T10:00:02Z"),
            ev("Pulled", "2026-12-02T10:00:03Z"),
            ev("Started", "2026-12-02T10:00:09Z"),
        ];
        assert_eq!(
            pulled(&events),
            Some("2026-12-02T10:00:03Z".parse().unwrap())
        );
        assert_eq!(pulled(&[]), None);
    }
}
