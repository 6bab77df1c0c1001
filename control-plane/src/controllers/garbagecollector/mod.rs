//! The garbage collector: deletes objects whose owners are gone, and carries out the
//! propagation policy of a deletion (Kubernetes' garbage collector).
//!
//! - Monitors: a metadata-only informer per resource that can be listed, watched and deleted
//!   (from discovery), feeding one [`graph::Graph`] of owner references in event order.
//! - attemptToDelete (keyed by uid): re-reads the object; if it waits in a foreground
//!   deletion and no dependent blocks it any more, removes its `foregroundDeletion`
//!   finalizer; otherwise classifies its owners as solid, dangling (gone, or another uid) or
//!   waiting for their dependents (being deleted in the foreground). With a solid owner it
//!   only drops the references to the others; with none it is deleted itself, in the
//!   foreground if an owner waits on it and it has dependents of its own, else as its
//!   finalizers ask (`orphan`, `foregroundDeletion`) or in the background.
//! - attemptToOrphan: removes the owner's references from its dependents, then the owner's
//!   `orphan` finalizer.
//!
//! Background deletion of a Deployment: the Deployment goes at once, its ReplicaSets find
//! their owner dangling and go, then their pods. Foreground: the Deployment stays (with the
//! finalizer) until they are gone. Orphan: they stay, without the owner reference.

pub mod graph;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::graph::{Graph, Identity, Observed, Work, FOREGROUND, ORPHAN};
use super::discovery::{self, Resources, Served};
use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, Metrics, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "garbagecollector";
const ABSENT_REMEMBERED: usize = 10_000;

type Meta = PartialObjectMeta<DynamicObject>;

/// Owners verified absent (Kubernetes' absentOwnerCache), bounded.
#[derive(Default)]
struct Absent {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Absent {
    fn add(&mut self, uid: &str) {
        if self.set.insert(uid.to_string()) {
            self.order.push_back(uid.to_string());
            if self.order.len() > ABSENT_REMEMBERED {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// What the workers share.
struct Shared {
    client: Client,
    /// What discovery found last (re-read every [`RESYNC`], as Kubernetes' collector does, so
    /// custom resources defined later are collected too).
    resources: std::sync::RwLock<Resources>,
    graph: Mutex<Graph>,
    absent: Mutex<Absent>,
    deletes: WorkQueue<String>,
    orphans: WorkQueue<String>,
}

impl Shared {
    fn graph(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn absent(&self) -> std::sync::MutexGuard<'_, Absent> {
        self.absent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn schedule(&self, work: Vec<Work>) {
        for w in work {
            match w {
                Work::Delete(uid) => self.deletes.add(uid),
                Work::Orphan(uid) => self.orphans.add(uid),
            }
        }
    }

    /// A metadata client for the object `identity` names (None: its kind is not served).
    fn api_for(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Option<Api<Meta>> {
        let resources = self.resources.read().unwrap_or_else(|p| p.into_inner());
        let served = resources.by_kind(api_version, kind)?;
        Some(metadata_api(&self.client, served, namespace))
    }

    /// The object with this identity, if it exists with that uid.
    async fn live(&self, identity: &Identity) -> Result<Option<Meta>, ReconcileError> {
        let Some(api) = self.api_for(
            &identity.api_version,
            &identity.kind,
            identity.namespace.as_deref(),
        ) else {
            return Err(ReconcileError::Invalid(format!(
                "{} {} is not served",
                identity.api_version, identity.kind
            )));
        };
        let found = api.get_opt(&identity.name).await?;
        Ok(found.filter(|o| o.uid().as_deref() == Some(identity.uid.as_str())))
    }
}

fn metadata_api(client: &Client, served: &Served, namespace: Option<&str>) -> Api<Meta> {
    match (served.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &served.resource),
        _ => Api::all_with(client.clone(), &served.resource),
    }
}

fn observed(served: &Served, o: &Meta) -> Option<Observed> {
    Some(Observed {
        identity: Identity {
            api_version: served.resource.api_version.clone(),
            kind: served.resource.kind.clone(),
            namespace: o.namespace(),
            name: o.name_any(),
            uid: o.uid()?,
        },
        owners: o.owner_references().to_vec(),
        being_deleted: o.metadata.deletion_timestamp.is_some(),
        finalizers: o.finalizers().to_vec(),
    })
}

/// Discovers the resources, starts the monitors and runs the collector until cancelled.
pub fn start(ctx: &Context, token: CancellationToken) -> BoxFuture<'static, ()> {
    let client = ctx.client.clone();
    let metrics = ctx.metrics.clone();
    let workers = ctx.settings.concurrent_gc_syncs;
    Box::pin(run(client, metrics, workers, token))
}

async fn run(client: Client, metrics: Metrics, workers: usize, token: CancellationToken) {
    let Some(resources) = discovery::discover(&client, &token).await else {
        return;
    };
    let shared = Arc::new(Shared {
        client: client.clone(),
        resources: std::sync::RwLock::new(resources.clone()),
        graph: Mutex::new(Graph::default()),
        absent: Mutex::new(Absent::default()),
        deletes: WorkQueue::new(),
        orphans: WorkQueue::new(),
    });

    // One ordered stream of graph changes from every monitor.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Served, Change<Meta>)>();
    let mut monitors = Monitors::default();
    for served in resources.collectable() {
        monitors.start(&client, served, &tx, &token);
    }
    let builder = {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some((served, change)) = rx.recv().await {
                let work = match &change {
                    Change::Added(o) | Change::Updated { new: o, .. } => match observed(&served, o)
                    {
                        Some(obs) => shared.graph().upsert(obs),
                        None => Vec::new(),
                    },
                    Change::Deleted(o) => match o.uid() {
                        Some(uid) => {
                            if !o.owner_references().is_empty()
                                || shared
                                    .graph()
                                    .get(&uid)
                                    .is_some_and(|n| !n.dependents.is_empty())
                            {
                                tracing::debug!(kind = %served.resource.kind, name = %o.name_any(), "owner graph: object deleted");
                            }
                            shared.graph().remove(&uid)
                        }
                        None => Vec::new(),
                    },
                };
                shared.schedule(work);
            }
        })
    };
    tokio::select! {
        _ = futures::future::join_all(monitors.running.values().map(|(m, _, _)| m.wait_synced())) => {
            tracing::info!(resources = monitors.running.len(), objects = shared.graph().len(), "garbage collector synced");
        }
        _ = token.cancelled() => {}
    }
    let resync = tokio::spawn(resync(
        client.clone(),
        shared.clone(),
        monitors,
        tx,
        token.clone(),
    ));
    if !token.is_cancelled() {
        let deleter = Controller::new(
            "garbagecollector",
            Arc::new(AttemptToDelete {
                shared: shared.clone(),
            }),
            shared.deletes.clone(),
            workers,
            metrics.clone(),
        );
        let orphaner = Controller::new(
            "garbagecollector-orphan",
            Arc::new(AttemptToOrphan {
                shared: shared.clone(),
            }),
            shared.orphans.clone(),
            1,
            metrics,
        );
        futures::future::join(deleter.run(token.clone()), orphaner.run(token.clone())).await;
    }
    if let Ok(monitors) = resync.await {
        futures::future::join_all(monitors.running.into_values().map(|(_, _, t)| t)).await;
    }
    builder.abort();
}

/// How often discovery is read again for resources that came or went.
const RESYNC: Duration = Duration::from_secs(30);

/// The running monitors, by resource (group/version/plural).
#[derive(Default)]
struct Monitors {
    running: HashMap<
        String,
        (
            Informer<Meta>,
            CancellationToken,
            tokio::task::JoinHandle<()>,
        ),
    >,
}

fn monitor_key(s: &Served) -> String {
    format!("{}/{}", s.resource.api_version, s.resource.plural)
}

impl Monitors {
    fn start(
        &mut self,
        client: &Client,
        served: Served,
        tx: &mpsc::UnboundedSender<(Served, Change<Meta>)>,
        token: &CancellationToken,
    ) {
        let informer: Informer<Meta> = Informer::new(
            metadata_api(client, &served, None),
            watcher::Config::default(),
        );
        let (tx, s) = (tx.clone(), served.clone());
        informer.on_change(move |c| {
            let change = match c {
                Change::Added(o) => Change::Added(o.clone()),
                Change::Updated { old, new } => Change::Updated {
                    old: old.clone(),
                    new: new.clone(),
                },
                Change::Deleted(o) => Change::Deleted(o.clone()),
            };
            let _ = tx.send((s.clone(), change));
        });
        let child = token.child_token();
        let task = tokio::spawn(informer.clone().run(child.clone()));
        self.running
            .insert(monitor_key(&served), (informer, child, task));
    }
}

/// Re-reads discovery every [`RESYNC`]: monitors start for new resources (a custom resource
/// defined since) and stop for resources no longer served. Returns the monitors when
/// cancelled.
async fn resync(
    client: Client,
    shared: Arc<Shared>,
    mut monitors: Monitors,
    tx: mpsc::UnboundedSender<(Served, Change<Meta>)>,
    token: CancellationToken,
) -> Monitors {
    loop {
        tokio::select! {
            _ = token.cancelled() => return monitors,
            _ = tokio::time::sleep(RESYNC) => {}
        }
        let Some(found) = discovery::discover(&client, &token).await else {
            return monitors;
        };
        let wanted: HashMap<String, Served> = found
            .collectable()
            .into_iter()
            .map(|s| (monitor_key(&s), s))
            .collect();
        let gone: Vec<String> = monitors
            .running
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some((_, t, _)) = monitors.running.remove(&k) {
                tracing::info!(resource = %k, "garbage collector stops monitoring");
                t.cancel();
            }
        }
        for (k, s) in wanted {
            if !monitors.running.contains_key(&k) {
                tracing::info!(resource = %k, "garbage collector monitors a new resource");
                monitors.start(&client, s, &tx, &token);
            }
        }
        *shared.resources.write().unwrap_or_else(|p| p.into_inner()) = found;
    }
}

struct AttemptToDelete {
    shared: Arc<Shared>,
}

/// How an owner reference stands.
enum OwnerState {
    Solid,
    Dangling,
    WaitingForDependents,
}

impl AttemptToDelete {
    async fn classify(
        &self,
        dependent: &Identity,
        r: &OwnerReference,
    ) -> Result<OwnerState, ReconcileError> {
        if self.shared.absent().set.contains(&r.uid) {
            return Ok(OwnerState::Dangling);
        }
        let known = self
            .shared
            .graph()
            .get(&r.uid)
            .filter(|n| n.observed)
            .map(|n| (n.being_deleted, n.deleting_dependents));
        if let Some((deleting, foreground)) = known {
            return Ok(if deleting && foreground {
                OwnerState::WaitingForDependents
            } else {
                OwnerState::Solid
            });
        }
        // Not seen by the monitors (yet): ask the API.
        let Some(api) =
            self.shared
                .api_for(&r.api_version, &r.kind, dependent.namespace.as_deref())
        else {
            // A kind the server does not serve cannot be verified: keep the reference.
            return Ok(OwnerState::Solid);
        };
        match api.get_opt(&r.name).await? {
            Some(o) if o.uid().as_deref() == Some(r.uid.as_str()) => Ok(
                if o.metadata.deletion_timestamp.is_some()
                    && o.finalizers().iter().any(|f| f == FOREGROUND)
                {
                    OwnerState::WaitingForDependents
                } else {
                    OwnerState::Solid
                },
            ),
            _ => {
                self.shared.absent().add(&r.uid);
                Ok(OwnerState::Dangling)
            }
        }
    }
}

impl Reconciler for AttemptToDelete {
    type Key = String;

    async fn reconcile(&self, uid: &String) -> Result<Action, ReconcileError> {
        let Some(node) = self.shared.graph().get(uid).cloned() else {
            return Ok(Action::AwaitChange);
        };
        if !node.observed {
            // A virtual owner: does it exist?
            let exists = match self.shared.live(&node.identity).await {
                Ok(found) => found.is_some(),
                Err(ReconcileError::Invalid(_)) => true,
                Err(e) => return Err(e),
            };
            if !exists {
                self.shared.absent().add(uid);
                let work = self.shared.graph().remove_virtual(uid);
                self.shared.schedule(work);
            }
            return Ok(Action::AwaitChange);
        }
        if node.being_deleted && !node.deleting_dependents {
            return Ok(Action::AwaitChange);
        }
        let Some(latest) = self.shared.live(&node.identity).await? else {
            // Gone (or replaced): the watch will tell the graph.
            return Ok(Action::AwaitChange);
        };
        if node.deleting_dependents && latest.finalizers().iter().any(|f| f == FOREGROUND) {
            let blocking = self.shared.graph().blocking_dependents(uid);
            if blocking.is_empty() {
                remove_finalizer(&self.shared, &node.identity, &latest, FOREGROUND).await?;
            } else {
                for d in blocking {
                    let deleting = self
                        .shared
                        .graph()
                        .get(&d)
                        .is_some_and(|n| n.deleting_dependents);
                    if !deleting {
                        self.shared.deletes.add(d);
                    }
                }
            }
            return Ok(Action::AwaitChange);
        }
        let owners = latest.owner_references().to_vec();
        if owners.is_empty() {
            return Ok(Action::AwaitChange);
        }
        let (mut solid, mut dangling, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        for r in &owners {
            match self.classify(&node.identity, r).await? {
                OwnerState::Solid => solid.push(r),
                OwnerState::Dangling => dangling.push(r),
                OwnerState::WaitingForDependents => waiting.push(r),
            }
        }
        let api = self
            .shared
            .api_for(
                &node.identity.api_version,
                &node.identity.kind,
                node.identity.namespace.as_deref(),
            )
            .ok_or_else(|| ReconcileError::Invalid("kind not served".into()))?;
        if !solid.is_empty() {
            if dangling.is_empty() && waiting.is_empty() {
                return Ok(Action::AwaitChange);
            }
            let removals: Vec<_> = dangling
                .iter()
                .chain(waiting.iter())
                .map(|r| json!({"$patch": "delete", "uid": r.uid}))
                .collect();
            let patch =
                json!({"metadata": {"ownerReferences": removals, "uid": node.identity.uid}});
            tracing::debug!(object = %node.identity.name, kind = %node.identity.kind, "removing references to absent or deleting owners");
            return match api
                .patch(
                    &node.identity.name,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
            {
                Ok(_) => Ok(Action::AwaitChange),
                Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
                Err(e) => Err(e.into()),
            };
        }
        let policy = if !waiting.is_empty() && !node.dependents.is_empty() {
            PropagationPolicy::Foreground
        } else if latest.finalizers().iter().any(|f| f == ORPHAN) {
            PropagationPolicy::Orphan
        } else if latest.finalizers().iter().any(|f| f == FOREGROUND) {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        tracing::debug!(object = %node.identity.name, kind = %node.identity.kind, ?policy, "deleting an object whose owners are gone");
        let dp = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(Preconditions {
                uid: Some(node.identity.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&node.identity.name, &dp).await {
            Ok(_) => Ok(Action::AwaitChange),
            Err(e) if matches!(api_code(&e), Some(404) | Some(409)) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

/// Removes `finalizer` from the object (optimistically, against its resourceVersion).
async fn remove_finalizer(
    shared: &Shared,
    identity: &Identity,
    latest: &Meta,
    finalizer: &str,
) -> Result<(), ReconcileError> {
    let Some(api) = shared.api_for(
        &identity.api_version,
        &identity.kind,
        identity.namespace.as_deref(),
    ) else {
        return Ok(());
    };
    let rest: Vec<&String> = latest
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizer)
        .collect();
    let patch =
        json!({"metadata": {"finalizers": rest, "resourceVersion": latest.resource_version()}});
    match api
        .patch(
            &identity.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

struct AttemptToOrphan {
    shared: Arc<Shared>,
}

impl Reconciler for AttemptToOrphan {
    type Key = String;

    async fn reconcile(&self, uid: &String) -> Result<Action, ReconcileError> {
        let Some(node) = self.shared.graph().get(uid).cloned() else {
            return Ok(Action::AwaitChange);
        };
        let dependents: Vec<Identity> = {
            let g = self.shared.graph();
            node.dependents
                .iter()
                .filter_map(|d| g.get(d).map(|n| n.identity.clone()))
                .collect()
        };
        for d in dependents {
            let Some(api) = self
                .shared
                .api_for(&d.api_version, &d.kind, d.namespace.as_deref())
            else {
                continue;
            };
            let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": d.uid}});
            match api
                .patch(&d.name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if matches!(api_code(&e), Some(404) | Some(409) | Some(422)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(latest) = self.shared.live(&node.identity).await? {
            if latest.finalizers().iter().any(|f| f == ORPHAN) {
                remove_finalizer(&self.shared, &node.identity, &latest, ORPHAN).await?;
            }
        }
        Ok(Action::AwaitChange)
    }
}
