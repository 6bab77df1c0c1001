//! The Endpoints controller: the legacy core/v1 Endpoints object (what `kubectl get
//! endpoints` shows) for each Service with a selector, named as the Service: ready pod
//! addresses in `addresses`, the others in `notReadyAddresses`, terminating pods left out,
//! subsets grouped by the ports each pod resolves (Kubernetes' RepackSubsets), at most 1000
//! addresses (the rest truncated, with the over-capacity annotation). The object is written
//! only when it changes, and deleted with its Service.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use super::serviceendpoints as members;
use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "endpoint";
const MAX_ADDRESSES: usize = 1000;
const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

pub struct EndpointsController {
    client: Client,
    services: Informer<Service>,
    pods: Informer<Pod>,
    endpoints: Informer<Endpoints>,
}

pub fn build(ctx: &Context) -> Controller<EndpointsController> {
    let services = ctx.informers.get::<Service>();
    let pods = ctx.informers.get::<Pod>();
    let endpoints = ctx.informers.get::<Endpoints>();
    super::index_pods(&pods);
    members::index_services(&services);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    services.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
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
    // Someone else changed or removed an Endpoints object of a Service: put it back.
    let (q, svcs) = (queue.clone(), services.clone());
    endpoints.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        if svcs.get(&key).is_some() {
            q.add(key);
        }
    });
    let reconciler = EndpointsController {
        client: ctx.client.clone(),
        services,
        pods,
        endpoints,
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_endpoint_syncs,
        ctx.metrics.clone(),
    )
}

impl Reconciler for EndpointsController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), key.namespace_or_empty());
        let Some(svc) = self.services.get(key) else {
            if self.endpoints.get(key).is_some() {
                match api.delete(&key.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(Action::AwaitChange);
        };
        if members::selector(&svc).is_none() {
            return Ok(Action::AwaitChange);
        }
        let (subsets, truncated) = self.subsets(&svc);
        let mut labels: BTreeMap<String, String> = svc.labels().clone();
        if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
            labels.insert(HEADLESS_LABEL.into(), String::new());
        } else {
            labels.remove(HEADLESS_LABEL);
        }
        let current = self.endpoints.get(key);
        let mut annotations = current
            .as_ref()
            .map(|c| c.annotations().clone())
            .unwrap_or_default();
        if truncated {
            annotations.insert(OVER_CAPACITY.into(), "truncated".into());
        } else {
            annotations.remove(OVER_CAPACITY);
        }
        let subsets = Some(subsets).filter(|s| !s.is_empty());
        if let Some(cur) = &current {
            let cur_labels = cur.metadata.labels.clone().unwrap_or_default();
            if cur.subsets == subsets && cur_labels == labels && cur.annotations() == &annotations {
                return Ok(Action::AwaitChange);
            }
        }
        let mut desired = Endpoints {
            metadata: ObjectMeta {
                name: Some(key.name.clone()),
                namespace: Some(key.namespace_or_empty().to_string()),
                labels: Some(labels).filter(|l| !l.is_empty()),
                annotations: Some(annotations).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            subsets,
        };
        match current {
            Some(cur) => {
                desired.metadata.resource_version = cur.resource_version();
                api.replace(&key.name, &PostParams::default(), &desired)
                    .await?;
            }
            // A 409 means it was created meanwhile (cache behind): retried.
            None => {
                api.create(&PostParams::default(), &desired).await?;
            }
        }
        Ok(Action::AwaitChange)
    }
}

impl EndpointsController {
    /// The subsets of a Service and whether addresses were truncated.
    fn subsets(&self, svc: &Service) -> (Vec<EndpointSubset>, bool) {
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default();
        // Port set -> (ready, not ready) addresses, keyed by IP for a stable order.
        type Addrs = BTreeMap<String, EndpointAddress>;
        type PortKey = Vec<(String, i32, String)>;
        let mut groups: BTreeMap<PortKey, (Vec<EndpointPort>, Addrs, Addrs)> = BTreeMap::new();
        let mut total = 0usize;
        let mut truncated = false;
        let mut selected = members::pods_for_service(&self.pods, svc);
        selected.sort_by_key(|p| (p.namespace(), p.name_any()));
        for pod in selected {
            if !members::should_include(&pod, false) {
                continue;
            }
            let Some(ip) = members::pod_ip(&pod) else {
                continue;
            };
            let eps: Vec<EndpointPort> = ports
                .iter()
                .filter_map(|sp| {
                    Some(EndpointPort {
                        name: sp.name.clone().filter(|n| !n.is_empty()),
                        port: members::find_port(&pod, sp)?,
                        protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                        app_protocol: sp.app_protocol.clone(),
                    })
                })
                .collect();
            if !ports.is_empty() && eps.is_empty() {
                continue;
            }
            if total >= MAX_ADDRESSES {
                truncated = true;
                continue;
            }
            total += 1;
            let address = EndpointAddress {
                ip: ip.clone(),
                hostname: members::hostname(&pod, svc),
                node_name: super::pods::node_name(&pod).map(str::to_string),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: pod.namespace(),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                    ..Default::default()
                }),
            };
            let (ready, _, _) = members::conditions(&pod, svc);
            let mut key: PortKey = eps
                .iter()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port,
                        p.protocol.clone().unwrap_or_default(),
                    )
                })
                .collect();
            key.sort();
            let g = groups
                .entry(key)
                .or_insert_with(|| (eps.clone(), BTreeMap::new(), BTreeMap::new()));
            if ready {
                g.1.insert(ip, address);
            } else {
                g.2.insert(ip, address);
            }
        }
        let subsets = groups
            .into_values()
            .map(|(mut ports, ready, not_ready)| {
                ports.sort_by(|a, b| a.name.cmp(&b.name).then(a.port.cmp(&b.port)));
                EndpointSubset {
                    addresses: Some(ready.into_values().collect::<Vec<_>>())
                        .filter(|a| !a.is_empty()),
                    not_ready_addresses: Some(not_ready.into_values().collect::<Vec<_>>())
                        .filter(|a| !a.is_empty()),
                    ports: Some(ports).filter(|p| !p.is_empty()),
                }
            })
            .collect();
        (subsets, truncated)
    }
}
