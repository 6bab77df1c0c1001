//! The pod workers' outputs written to the API: statuses (coalesced per pod, so a burst of
//! changes is one write), Events (through the correlating writer in `events.rs`), and the
//! final removal of a gracefully deleted pod; and their inputs read from it: ConfigMaps,
//! Secrets and service account tokens (Services come from the agent's cache).

use super::services::ServiceCache;
use crate::metrics::Metrics;
use crate::names::NodeName;
use crate::pod::events::PodEvent;
use crate::pod::token::IssuedToken;
use crate::pod::{now, Objects, PodRef, Reporter};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, EventSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
    PodStatus, Secret, Service, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tracing::{debug, warn};

enum Out {
    Status(PodRef, Box<PodStatus>),
    Terminated(PodRef),
}

/// The [`Reporter`] the agent gives its workers: queues to one writer task.
pub struct ApiReporter {
    tx: mpsc::UnboundedSender<Out>,
    node: NodeName,
    /// Events go through a queue of their own, in order, so they never delay a status.
    events: mpsc::UnboundedSender<Event>,
}

impl Reporter for ApiReporter {
    fn status(&self, pod: &PodRef, status: &PodStatus) {
        let _ = self
            .tx
            .send(Out::Status(pod.clone(), Box::new(status.clone())));
    }
    fn event(&self, pod: &PodRef, event: PodEvent) {
        let _ = self.events.send(pod_event(&self.node, pod, event, now()));
    }
    fn terminated(&self, pod: &PodRef) {
        let _ = self.tx.send(Out::Terminated(pod.clone()));
    }
}

/// Startup timing of pods (first seen -> Running), for the metric and the benchmark.
#[derive(Default)]
pub struct StartTimes {
    pending: std::sync::Mutex<HashMap<String, Instant>>,
}

impl StartTimes {
    pub fn seen(&self, uid: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_string())
            .or_insert_with(Instant::now);
    }

    fn running(&self, uid: &str) -> Option<f64> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid)
            .map(|t| t.elapsed().as_secs_f64())
    }
}

/// Starts the writer task; returns the reporter to hand to workers.
pub fn start(
    client: Client,
    node: NodeName,
    metrics: Arc<Metrics>,
    starts: Arc<StartTimes>,
) -> ApiReporter {
    let (tx, rx) = mpsc::unbounded_channel();
    let (events, events_rx) = mpsc::unbounded_channel();
    let (c, m) = (client.clone(), metrics.clone());
    tokio::spawn(async move { super::events::run(c, events_rx, &m).await });
    tokio::spawn(writer(client, metrics, starts, rx));
    ApiReporter { tx, node, events }
}

/// How long a failed write waits before it is tried again when nothing else comes (an API
/// server that died mid-request, its clients failing over; the kubelet's status manager
/// resyncs every 10 s).
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

async fn writer(
    client: Client,
    metrics: Arc<Metrics>,
    starts: Arc<StartTimes>,
    mut rx: mpsc::UnboundedReceiver<Out>,
) {
    // Writes that failed, tried again with the next batch (a newer status of the same pod
    // replaces its failed one).
    let mut retry: Vec<(PodRef, Box<PodStatus>)> = Vec::new();
    let mut retry_finish: Vec<PodRef> = Vec::new();
    loop {
        let first = if retry.is_empty() && retry_finish.is_empty() {
            match rx.recv().await {
                Some(o) => Some(o),
                None => return,
            }
        } else {
            tokio::select! {
                o = rx.recv() => match o {
                    Some(o) => Some(o),
                    None => return,
                },
                _ = tokio::time::sleep(RETRY) => None,
            }
        };
        // Take everything queued: only the newest status of each pod is written.
        let mut batch: Vec<Out> = first.into_iter().collect();
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let mut statuses = std::mem::take(&mut retry);
        let mut finished = std::mem::take(&mut retry_finish);
        for out in batch {
            match out {
                Out::Status(p, s) => match statuses.iter_mut().find(|(q, _)| q.uid == p.uid) {
                    Some(slot) => slot.1 = s,
                    None => statuses.push((p, s)),
                },
                Out::Terminated(p) => finished.push(p),
            }
        }
        let writes = statuses.into_iter().map(|(p, s)| {
            let (client, metrics, starts) = (client.clone(), metrics.clone(), starts.clone());
            async move {
                let done = write_status(&client, &p, &s, &metrics).await;
                if done && s.phase.as_deref() == Some("Running") {
                    if let Some(secs) = starts.running(&p.uid) {
                        metrics.pod_start_seconds.observe(secs);
                    }
                }
                (!done).then_some((p, s))
            }
        });
        retry = futures::future::join_all(writes)
            .await
            .into_iter()
            .flatten()
            .collect();
        // After the statuses: a pod's last status is written before its object goes.
        for p in finished {
            if !finish_deletion(&client, &p, &metrics).await {
                retry_finish.push(p);
            }
        }
    }
}

/// Writes a pod's status; false when it should be tried again (the pod being gone is done).
async fn write_status(client: &Client, p: &PodRef, status: &PodStatus, metrics: &Metrics) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let patch = serde_json::json!({ "status": status });
    match api
        .patch_status(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            metrics.pod_status_writes.inc();
            true
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            debug!(pod = %p, "status for a pod that is gone");
            true
        }
        Err(e) => {
            metrics.api_errors.inc();
            warn!(pod = %p, error = %e, "writing pod status failed; trying again");
            false
        }
    }
}

/// The Event the kubelet writes for `e`, emitted at `t`, named `<pod>.<t in hex nanoseconds>`
/// as client-go names them: a pod's Events list (in name order) in the order they happened.
fn pod_event(node: &NodeName, p: &PodRef, e: PodEvent, t: Time) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", p.name, t.0.as_nanosecond())),
            namespace: Some(p.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            uid: Some(p.uid.clone()),
            field_path: e.field_path,
            ..Default::default()
        },
        reason: Some(e.reason.as_str().into()),
        message: Some(e.message),
        type_: Some(e.reason.severity().as_str().into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.to_string()),
        first_timestamp: Some(t.clone()),
        last_timestamp: Some(t),
        count: Some(1),
        ..Default::default()
    }
}

/// The pod is gone from the node: remove its object (grace 0, only this incarnation);
/// false when it should be tried again.
async fn finish_deletion(client: &Client, p: &PodRef, metrics: &Metrics) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(p.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&p.name, &dp).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
        Err(e) => {
            metrics.api_errors.inc();
            warn!(pod = %p, error = %e, "removing the deleted pod failed; trying again");
            false
        }
    }
}

/// ConfigMaps, Secrets and tokens requested from the API when a pod needs them; Services
/// from the agent's cache.
pub struct ApiObjects {
    pub client: Client,
    pub services: ServiceCache,
}

impl Objects for ApiObjects {
    fn config_map<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConfigMap>, String>> {
        Box::pin(async move {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
            api.get_opt(name).await.map_err(|e| e.to_string())
        })
    }
    fn secret<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, String>> {
        Box::pin(async move {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            api.get_opt(name).await.map_err(|e| e.to_string())
        })
    }
    fn service_account_token<'a>(
        &'a self,
        ns: &'a str,
        account: &'a str,
        request: TokenRequest,
    ) -> BoxFuture<'a, Result<IssuedToken, String>> {
        Box::pin(async move {
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
            let answer = api
                .create_token_request(account, &PostParams::default(), &request)
                .await
                .map_err(|e| e.to_string())?;
            let status = answer
                .status
                .ok_or("the TokenRequest was answered without a status")?;
            Ok(IssuedToken {
                token: status.token,
                expires: status.expiration_timestamp.0.into(),
            })
        })
    }
    fn service(&self, ns: &str, name: &str) -> Result<Option<Service>, String> {
        self.services.get(ns, name)
    }
    fn persistent_volume_claim<'a>(
        &'a self,
        ns: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PersistentVolumeClaim>, String>> {
        Box::pin(async move {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
            api.get_opt(name).await.map_err(|e| e.to_string())
        })
    }
    fn persistent_volume<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PersistentVolume>, String>> {
        Box::pin(async move {
            let api: Api<PersistentVolume> = Api::all(self.client.clone());
            api.get_opt(name).await.map_err(|e| e.to_string())
        })
    }
    fn services(&self, ns: &str) -> Result<Vec<Service>, String> {
        self.services.in_namespace(ns)
    }
}
