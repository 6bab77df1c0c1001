//! The EndpointSlice controller: for each Service with a selector, discovery.k8s.io/v1
//! EndpointSlices of at most `--max-endpoints-per-slice` (100) endpoints listing the selected
//! pods with their ready/serving/terminating conditions, node name and zone, grouped by the
//! ports they resolve to (a named targetPort resolves per pod). Slices carry the
//! `kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by` labels and a
//! controller reference to the Service (the garbage collector removes them with it).
//!
//! A pod event reaches only the Services in its namespace that select it; a Service event
//! looks up its pods through the label index. [`plan`] decides the minimal writes. Because
//! the slice cache may lag our own writes, a tracker remembers the generation of every slice
//! we wrote and the slices we deleted; a Service whose cached slices are older than that is
//! retried instead of planned from a stale view (which would create duplicates).
//! Every slice written carries the `endpoints.kubernetes.io/last-change-trigger-time`
//! annotation of its sync ([`trigger`]), from which proxies measure programming latency.

pub mod plan;
pub mod trigger;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use self::plan::{port_key, Desired, SliceTemplate};
use super::serviceendpoints as members;
use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    owner, Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "endpointslice";
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Index of slices by `<namespace>/<service>`.
const BY_SERVICE: &str = "service";

/// Generations of the slices we wrote, per Service (`None`: we deleted it).
#[derive(Default)]
struct Tracker {
    by_service: Mutex<HashMap<ObjectKey, HashMap<String, Option<i64>>>>,
}

impl Tracker {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, HashMap<String, Option<i64>>>> {
        self.by_service.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wrote(&self, svc: &ObjectKey, s: &EndpointSlice) {
        if let Some(name) = s.metadata.name.clone() {
            self.map()
                .entry(svc.clone())
                .or_default()
                .insert(name, Some(s.metadata.generation.unwrap_or(0)));
        }
    }

    fn deleted(&self, svc: &ObjectKey, name: &str) {
        self.map()
            .entry(svc.clone())
            .or_default()
            .insert(name.to_string(), None);
    }

    /// A slice left the cache: nothing more to wait for.
    fn gone(&self, svc: &ObjectKey, name: &str) {
        if let Some(m) = self.map().get_mut(svc) {
            m.remove(name);
        }
    }

    fn forget(&self, svc: &ObjectKey) {
        self.map().remove(svc);
    }

    /// Whether the cache shows at least what we wrote; settled entries are dropped.
    fn cache_current(&self, svc: &ObjectKey, cached: &[Arc<EndpointSlice>]) -> bool {
        let mut map = self.map();
        let Some(written) = map.get_mut(svc) else {
            return true;
        };
        let in_cache: HashMap<&str, i64> = cached
            .iter()
            .filter_map(|s| {
                Some((
                    s.metadata.name.as_deref()?,
                    s.metadata.generation.unwrap_or(0),
                ))
            })
            .collect();
        written.retain(|name, gen| match (gen, in_cache.get(name.as_str())) {
            (Some(g), Some(c)) => c < g,
            (Some(_), None) => true,
            (None, Some(_)) => true,
            (None, None) => false,
        });
        written.is_empty()
    }
}

pub struct EndpointSliceController {
    client: Client,
    services: Informer<Service>,
    pods: Informer<Pod>,
    slices: Informer<EndpointSlice>,
    nodes: Informer<Node>,
    tracker: Arc<Tracker>,
    triggers: trigger::TriggerTimes,
    recorder: Recorder,
    max_per_slice: usize,
}

fn service_of_slice(s: &EndpointSlice) -> Option<ObjectKey> {
    let labels = s.metadata.labels.as_ref()?;
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
        return None;
    }
    Some(ObjectKey::namespaced(
        s.namespace().unwrap_or_default(),
        labels.get(SERVICE_NAME_LABEL)?.clone(),
    ))
}

pub fn build(ctx: &Context) -> Controller<EndpointSliceController> {
    let services = ctx.informers.get::<Service>();
    let pods = ctx.informers.get::<Pod>();
    let slices = ctx.informers.get::<EndpointSlice>();
    let nodes = ctx.informers.get::<Node>();
    super::index_pods(&pods);
    members::index_services(&services);
    slices.add_index(BY_SERVICE, |s: &EndpointSlice| {
        service_of_slice(s)
            .map(|k| k.to_string())
            .into_iter()
            .collect()
    });
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let tracker: Arc<Tracker> = Arc::default();

    let (q, tr) = (queue.clone(), tracker.clone());
    services.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        if let Change::Deleted(_) = c {
            tr.forget(&key);
        }
        q.add(key);
    });
    let (q, svcs) = (queue.clone(), services.clone());
    pods.on_change(move |c| match c {
        Change::Added(p) | Change::Deleted(p) => members::services_for_pod(&svcs, p)
            .into_iter()
            .for_each(|k| q.add(k)),
        Change::Updated { old, new } => {
            if members::relevant_change(old, new) {
                let mut keys = members::services_for_pod(&svcs, new);
                if old.labels() != new.labels() {
                    keys.extend(members::services_for_pod(&svcs, old));
                }
                keys.into_iter().for_each(|k| q.add(k));
            }
        }
    });
    let (q, tr) = (queue.clone(), tracker.clone());
    slices.on_change(move |c| {
        if let Some(svc) = service_of_slice(c.object()) {
            if let Change::Deleted(s) = c {
                tr.gone(&svc, &s.name_any());
            }
            q.add(svc);
        }
    });

    let reconciler = EndpointSliceController {
        client: ctx.client.clone(),
        services,
        pods,
        slices,
        nodes,
        tracker,
        triggers: trigger::TriggerTimes::default(),
        recorder: ctx.events.recorder("endpoint-slice-controller"),
        max_per_slice: ctx.settings.max_endpoints_per_slice,
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_endpoint_syncs,
        ctx.metrics.clone(),
    )
}

impl Reconciler for EndpointSliceController {
    type Key = ObjectKey;

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        crate::runtime::controller::involved(&self.services, key, &self.recorder)
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let started = std::time::Instant::now();
        let Some(svc) = self.services.get(key) else {
            // Its slices go with it (owner references).
            self.tracker.forget(key);
            self.triggers.forget(key);
            return Ok(Action::AwaitChange);
        };
        let spec = svc.spec.clone().unwrap_or_default();
        if members::selector(&svc).is_none() || spec.type_.as_deref() == Some("ExternalName") {
            return Ok(Action::AwaitChange);
        }
        let existing: Vec<Arc<EndpointSlice>> = self
            .slices
            .by_index(BY_SERVICE, &key.to_string())
            .into_iter()
            .filter(|s| s.address_type == "IPv4")
            .collect();
        if !self.tracker.cache_current(key, &existing) {
            return Err(ReconcileError::Retry(
                "the EndpointSlice cache is behind our own writes".into(),
            ));
        }
        let pods = members::pods_for_service(&self.pods, &svc);
        let trigger = self
            .triggers
            .compute(key, &svc, pods.iter().map(|p| p.as_ref()));
        let desired = self.desired(&svc, pods);
        let template = self.template(&svc);
        let plan = plan::plan(&existing, desired, &template, self.max_per_slice);
        if plan.is_empty() {
            return Ok(Action::AwaitChange);
        }
        let planned = started.elapsed();
        if let Err(e) = self.apply(key, plan, trigger, planned).await {
            self.recorder.event(
                svc.as_ref(),
                EventType::Warning,
                "FailedToUpdateEndpointSlices",
                format!("Error updating Endpoint Slices for Service {key}: {e}"),
            );
            return Err(e);
        }
        Ok(Action::AwaitChange)
    }
}

impl EndpointSliceController {
    fn desired(&self, svc: &Service, pods: Vec<Arc<Pod>>) -> BTreeMap<String, Desired> {
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        let mut out: BTreeMap<String, Desired> = BTreeMap::new();
        for pod in pods {
            if !members::should_include(&pod, true) {
                continue;
            }
            let Some(ip) = members::pod_ip(&pod) else {
                continue;
            };
            let eps: Vec<EndpointPort> = ports
                .iter()
                .filter_map(|sp| {
                    Some(EndpointPort {
                        name: Some(sp.name.clone().unwrap_or_default()),
                        port: Some(members::find_port(&pod, sp)?),
                        protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                        app_protocol: sp.app_protocol.clone(),
                    })
                })
                .collect();
            let (ready, serving, terminating) = members::conditions(&pod, svc);
            let node = super::pods::node_name(&pod).map(str::to_string);
            let zone = node
                .as_deref()
                .and_then(|n| self.nodes.get(&ObjectKey::cluster(n)))
                .and_then(|n| n.labels().get(ZONE_LABEL).cloned());
            let endpoint = Endpoint {
                addresses: vec![ip],
                conditions: Some(EndpointConditions {
                    ready: Some(ready),
                    serving: Some(serving),
                    terminating: Some(terminating),
                }),
                hostname: members::hostname(&pod, svc),
                node_name: node,
                zone,
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: pod.namespace(),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let d = out.entry(port_key(&eps)).or_default();
            d.ports = eps;
            d.endpoints.push(endpoint);
        }
        out
    }

    fn template(&self, svc: &Service) -> SliceTemplate {
        let mut labels: BTreeMap<String, String> = svc
            .labels()
            .iter()
            .filter(|(k, _)| k.as_str() != SERVICE_NAME_LABEL && k.as_str() != MANAGED_BY_LABEL)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(SERVICE_NAME_LABEL.into(), svc.name_any());
        labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
            labels.insert(HEADLESS_LABEL.into(), String::new());
        }
        let name = svc.name_any();
        // A generateName prefix must leave room for the random suffix.
        let prefix = if name.len() <= 57 {
            format!("{name}-")
        } else {
            name.clone()
        };
        SliceTemplate {
            namespace: svc.namespace().unwrap_or_default(),
            generate_name: prefix,
            labels,
            owner: owner::controller_ref(svc),
            address_type: "IPv4".into(),
        }
    }

    async fn apply(
        &self,
        key: &ObjectKey,
        mut p: plan::Plan,
        trigger: Option<k8s_openapi::jiff::Timestamp>,
        planned: std::time::Duration,
    ) -> Result<(), ReconcileError> {
        let started = std::time::Instant::now();
        for s in p.update.iter_mut().chain(p.create.iter_mut()) {
            let annotations = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
            match trigger {
                Some(t) => {
                    annotations.insert(trigger::ANNOTATION.into(), trigger::format(t));
                }
                None => {
                    annotations.remove(trigger::ANNOTATION);
                }
            }
        }
        let api: Api<EndpointSlice> =
            Api::namespaced(self.client.clone(), key.namespace_or_empty());
        // Creates and updates first, all at once (concurrent writes share the store's
        // commits: one fsync instead of one per slice, which under a loaded disk is what an
        // endpoint change waits for), deletes last: an endpoint moving to another slice is
        // never missing from every slice meanwhile.
        let (api, tracker) = (&api, &self.tracker);
        let writes = p
            .update
            .iter()
            .map(|s| (s, true))
            .chain(p.create.iter().map(|s| (s, false)))
            .map(|(s, existing)| async move {
                let written = if existing {
                    api.replace(&s.name_any(), &PostParams::default(), s)
                        .await?
                } else {
                    api.create(&PostParams::default(), s).await?
                };
                tracker.wrote(key, &written);
                Ok::<_, kube::Error>(())
            });
        futures::future::join_all(writes)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()?;
        let deletes = p.delete.iter().map(|s| async move {
            let name = s.name_any();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracker.deleted(key, &name),
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e),
            }
            Ok(())
        });
        futures::future::join_all(deletes)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()?;
        tracing::debug!(service = %key, created = p.create.len(), updated = p.update.len(), deleted = p.delete.len(), planned_ms = planned.as_millis() as u64, written_ms = started.elapsed().as_millis() as u64, "endpoint slices written");
        Ok(())
    }
}
