//! Events, as client-go's recorder writes them: core/v1 Events (what `kubectl describe` and
//! `kubectl get events` show) with Kubernetes' reasons, written by one background task so a
//! reconcile never waits on them, and aggregated: the same event for the same object within
//! ten minutes bumps `count` and `lastTimestamp` of the existing Event instead of adding one.
//! When the API is slow the bounded buffer drops events (as client-go does) rather than
//! slowing controllers down.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const BUFFER: usize = 1000;
const AGGREGATE_FOR: Duration = Duration::from_secs(600);
const REMEMBERED: usize = 4096;

/// An Event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

struct Pending {
    component: &'static str,
    reference: ObjectReference,
    kind: EventType,
    reason: &'static str,
    message: String,
}

/// The writer shared by every recorder of a process.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Pending>,
}

impl EventSink {
    /// Starts the writer; it stops when `token` is cancelled. `host` identifies this process
    /// (source.host and reportingInstance).
    pub fn start(client: Client, host: String, token: CancellationToken) -> EventSink {
        let (tx, rx) = mpsc::channel(BUFFER);
        tokio::spawn(write_events(client, host, rx, token));
        EventSink { tx }
    }

    /// A recorder for one component (`deployment-controller`, `default-scheduler`, ...).
    pub fn recorder(&self, component: &'static str) -> Recorder {
        Recorder {
            sink: self.clone(),
            component,
        }
    }
}

/// Records Events on behalf of one component. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    sink: EventSink,
    component: &'static str,
}

impl Recorder {
    /// An Event about `obj`.
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        kind: EventType,
        reason: &'static str,
        message: impl Into<String>,
    ) {
        self.event_ref(obj.object_ref(&()), kind, reason, message);
    }

    /// An Event about the object `reference` points to.
    pub fn event_ref(
        &self,
        reference: ObjectReference,
        kind: EventType,
        reason: &'static str,
        message: impl Into<String>,
    ) {
        let p = Pending {
            component: self.component,
            reference,
            kind,
            reason,
            message: message.into(),
        };
        if self.sink.tx.try_send(p).is_err() {
            tracing::debug!(
                component = self.component,
                reason,
                "event buffer full; event dropped"
            );
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Identity {
    object: String,
    component: &'static str,
    kind: EventType,
    reason: &'static str,
    message: String,
}

struct Seen {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

async fn write_events(
    client: Client,
    host: String,
    mut rx: mpsc::Receiver<Pending>,
    token: CancellationToken,
) {
    let mut seen: HashMap<Identity, Seen> = HashMap::new();
    let mut order: VecDeque<Identity> = VecDeque::new();
    loop {
        let p = tokio::select! {
            _ = token.cancelled() => return,
            p = rx.recv() => match p { Some(p) => p, None => return },
        };
        let id =
            Identity {
                object: p.reference.uid.clone().unwrap_or_else(|| {
                    format!("{:?}/{:?}", p.reference.namespace, p.reference.name)
                }),
                component: p.component,
                kind: p.kind,
                reason: p.reason,
                message: p.message.clone(),
            };
        let now = Timestamp::now();
        if let Some(s) = seen.get_mut(&id).filter(|s| s.at.elapsed() < AGGREGATE_FOR) {
            let api: Api<Event> = Api::namespaced(client.clone(), &s.namespace);
            let patch = json!({"count": s.count + 1, "lastTimestamp": Time(now)});
            match api
                .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    s.count += 1;
                    s.at = Instant::now();
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "aggregating an event failed; writing a new one")
                }
            }
        }
        let namespace = p
            .reference
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let name = format!(
            "{}.{:x}",
            p.reference.name.as_deref().unwrap_or("object"),
            now.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: p.reference,
            reason: Some(p.reason.to_string()),
            message: Some(p.message),
            type_: Some(p.kind.as_str().to_string()),
            source: Some(EventSource {
                component: Some(p.component.to_string()),
                host: Some(host.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(p.component.to_string()),
            reporting_instance: Some(host.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                let fresh = Seen {
                    namespace,
                    name,
                    count: 1,
                    at: Instant::now(),
                };
                if seen.insert(id.clone(), fresh).is_none() {
                    order.push_back(id);
                    if order.len() > REMEMBERED {
                        if let Some(old) = order.pop_front() {
                            seen.remove(&old);
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, reason = p.reason, "writing an event failed"),
        }
    }
}
