//! The Deployment controller: one ReplicaSet per pod template, rolled from old to new.
//!
//! Per key, as Kubernetes' syncDeployment: claim ReplicaSets (adopt/release by selector);
//! a Deployment being deleted only gets its status; a paused one or a pure scaling event is
//! scaled proportionally across its ReplicaSets; otherwise the strategy runs
//! ([`rolling`] within maxSurge/maxUnavailable, or [`recreate`]). Along the way the new
//! ReplicaSet is found or created (name `<deployment>-<pod-template-hash>`), revisions and
//! replica annotations are kept, old ReplicaSets beyond revisionHistoryLimit are deleted, and
//! status with the Progressing and Available conditions is written so that `kubectl rollout
//! status` ends, including ProgressDeadlineExceeded when the rollout stalls.

mod recreate;
mod rolling;
pub mod util;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use self::util::*;
use super::{pods, Context};
use crate::machinery::LabelSelector;
use crate::runtime::controller::api_code;
use crate::runtime::owner::{self, controller_of, BY_CONTROLLER_UID, ORPHANS_BY_NAMESPACE};
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "deployment";

pub struct DeploymentController {
    client: Client,
    deployments: Informer<Deployment>,
    sets: Informer<ReplicaSet>,
    pods: Informer<Pod>,
    recorder: Recorder,
}

pub fn build(ctx: &Context) -> Controller<DeploymentController> {
    let deployments = ctx.informers.get::<Deployment>();
    let sets = ctx.informers.get::<ReplicaSet>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    sets.add_index(
        BY_CONTROLLER_UID,
        owner::index_by_controller_uid::<ReplicaSet>,
    );
    sets.add_index(
        ORPHANS_BY_NAMESPACE,
        owner::index_orphans_by_namespace::<ReplicaSet>,
    );
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();

    let q = queue.clone();
    deployments.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));

    let (q, ds) = (queue.clone(), deployments.clone());
    sets.on_change(move |c| on_rs_change(c, &ds, &q));

    // Recreate waits for every old pod to be gone before it creates new ones.
    let (q, ds, rss) = (queue.clone(), deployments.clone(), sets.clone());
    pods.on_change(move |c| {
        if let Change::Deleted(pod) = c {
            let ns = pod.namespace().unwrap_or_default();
            let Some(rs) = controller_of(pod.meta())
                .filter(|r| r.kind == "ReplicaSet")
                .and_then(|r| rss.get_namespaced(&ns, &r.name))
            else {
                return;
            };
            if let Some(key) = controller_of(rs.meta()).and_then(|r| owner::resolve(&ds, &ns, r)) {
                if ds.get(&key).is_some_and(|d| is_recreate(&d)) {
                    q.add(key);
                }
            }
        }
    });

    let reconciler = DeploymentController {
        client: ctx.client.clone(),
        deployments,
        sets,
        pods,
        recorder: ctx.events.recorder("deployment-controller"),
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_deployment_syncs,
        ctx.metrics.clone(),
    )
}

fn selector_of(d: &Deployment) -> Option<LabelSelector> {
    LabelSelector::from_meta(&d.spec.as_ref()?.selector).ok()
}

fn matching_deployments(ds: &Informer<Deployment>, rs: &ReplicaSet) -> Vec<ObjectKey> {
    ds.in_namespace(&rs.namespace().unwrap_or_default())
        .iter()
        .filter(|d| selector_of(d).is_some_and(|s| !s.is_everything() && s.matches(rs.labels())))
        .map(|d| ObjectKey::of(d.as_ref()))
        .collect()
}

fn on_rs_change(c: &Change<ReplicaSet>, ds: &Informer<Deployment>, q: &WorkQueue<ObjectKey>) {
    let enqueue_owner = |rs: &ReplicaSet| {
        let ns = rs.namespace().unwrap_or_default();
        match controller_of(rs.meta()) {
            Some(r) => owner::resolve(ds, &ns, r)
                .into_iter()
                .for_each(|k| q.add(k)),
            None => matching_deployments(ds, rs)
                .into_iter()
                .for_each(|k| q.add(k)),
        }
    };
    match c {
        Change::Added(rs) | Change::Deleted(rs) => enqueue_owner(rs),
        Change::Updated { old, new } => {
            let ns = new.namespace().unwrap_or_default();
            let (old_ref, new_ref) = (controller_of(old.meta()), controller_of(new.meta()));
            if old_ref != new_ref {
                if let Some(k) = old_ref.and_then(|r| owner::resolve(ds, &ns, r)) {
                    q.add(k);
                }
            }
            match new_ref {
                Some(r) => owner::resolve(ds, &ns, r)
                    .into_iter()
                    .for_each(|k| q.add(k)),
                None => {
                    if old.labels() != new.labels() || old_ref.is_some() {
                        matching_deployments(ds, new)
                            .into_iter()
                            .for_each(|k| q.add(k));
                    }
                }
            }
        }
    }
}

/// One sync's view: the Deployment being worked on (updated in place after each write).
struct Sync<'a> {
    c: &'a DeploymentController,
    d: Deployment,
    key: &'a ObjectKey,
    now: Timestamp,
}

impl Reconciler for DeploymentController {
    type Key = ObjectKey;

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        crate::runtime::controller::involved(&self.deployments, key, &self.recorder)
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let Some(selector) = selector_of(&d) else {
            tracing::warn!(deployment = %key, "invalid selector; not syncing");
            return Ok(Action::AwaitChange);
        };
        if selector.is_everything() {
            self.recorder.event(
                d.as_ref(),
                EventType::Warning,
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            );
            if d.metadata.generation != d.status.as_ref().and_then(|s| s.observed_generation) {
                let mut s = Sync {
                    c: self,
                    d: (*d).clone(),
                    key,
                    now: Timestamp::now(),
                };
                let mut status = s.d.status.clone().unwrap_or_default();
                status.observed_generation = s.d.metadata.generation;
                s.write_status(status).await?;
            }
            return Ok(Action::AwaitChange);
        }
        let sets = owner::claim(&self.client, d.as_ref(), &selector, &self.sets).await?;
        let mut s = Sync {
            c: self,
            d: (*d).clone(),
            key,
            now: Timestamp::now(),
        };
        if d.metadata.deletion_timestamp.is_some() {
            s.sync_status_only(&sets).await?;
            return Ok(Action::AwaitChange);
        }
        s.check_paused_conditions().await?;
        let paused = d.spec.as_ref().and_then(|sp| sp.paused).unwrap_or(false);
        if paused || s.is_scaling_event(&sets).await? {
            s.scale_sync(&sets).await?;
            return Ok(Action::AwaitChange);
        }
        if is_recreate(&d) {
            s.rollout_recreate(&sets).await
        } else {
            s.rollout_rolling(&sets).await
        }
    }
}

impl Sync<'_> {
    fn api(&self) -> Api<Deployment> {
        Api::namespaced(self.c.client.clone(), self.key.namespace_or_empty())
    }

    fn rs_api(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.c.client.clone(), self.key.namespace_or_empty())
    }

    fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    /// Writes the Deployment's status (optimistic: a conflict retries the whole sync).
    async fn write_status(&mut self, status: DeploymentStatus) -> Result<(), ReconcileError> {
        let mut d = self.d.clone();
        d.status = Some(status);
        self.d = self
            .api()
            .replace_status(&self.d.name_any(), &PostParams::default(), &d)
            .await?;
        Ok(())
    }

    /// Sets the Deployment's revision annotation. Kubernetes writes it with the status
    /// update; this API server's status subresource changes only status, so it is a
    /// metadata patch of its own (which works against either).
    async fn set_revision(&mut self, revision: &str) -> Result<(), ReconcileError> {
        if self.d.annotations().get(REVISION).map(String::as_str) == Some(revision) {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {REVISION: revision}, "resourceVersion": self.d.resource_version()}});
        self.d = self
            .api()
            .patch(
                &self.d.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    async fn check_paused_conditions(&mut self) -> Result<(), ReconcileError> {
        if progress_deadline(&self.d).is_none() {
            return Ok(());
        }
        let paused = self.d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false);
        let mut status = self.status();
        let reason = condition(&status, PROGRESSING).and_then(|c| c.reason.clone());
        let c = if paused
            && reason.as_deref() != Some(TIMED_OUT)
            && reason.as_deref() != Some(PAUSED)
        {
            new_condition(
                PROGRESSING,
                "Unknown",
                PAUSED,
                "Deployment is paused".into(),
                self.now,
            )
        } else if !paused && reason.as_deref() == Some(PAUSED) {
            new_condition(
                PROGRESSING,
                "Unknown",
                RESUMED,
                "Deployment is resumed".into(),
                self.now,
            )
        } else {
            return Ok(());
        };
        set_condition(&mut status, c);
        self.write_status(status).await
    }

    /// Splits `sets` into the new ReplicaSet (found, or created when `create`) and the old
    /// ones, keeping revision annotations in step (getAllReplicaSetsAndSyncRevision).
    async fn new_and_old(
        &mut self,
        sets: &[Arc<ReplicaSet>],
        create: bool,
    ) -> Result<(Option<Arc<ReplicaSet>>, Vec<Arc<ReplicaSet>>), ReconcileError> {
        let existing = find_new(&self.d, sets);
        let old: Vec<Arc<ReplicaSet>> = sets
            .iter()
            .filter(|rs| existing.as_ref().is_none_or(|n| n.uid() != rs.uid()))
            .cloned()
            .collect();
        let new = self.new_replica_set(existing, &old, create).await?;
        Ok((new, old))
    }

    async fn new_replica_set(
        &mut self,
        existing: Option<Arc<ReplicaSet>>,
        old: &[Arc<ReplicaSet>],
        create: bool,
    ) -> Result<Option<Arc<ReplicaSet>>, ReconcileError> {
        let new_revision = max_revision(old) + 1;
        if let Some(existing) = existing {
            let mut copy = (*existing).clone();
            let annotations_changed =
                set_new_rs_annotations(&self.d, &mut copy, new_revision, true);
            let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
            let spec = copy.spec.get_or_insert_with(Default::default);
            let min_ready_changed = spec.min_ready_seconds != min_ready;
            let rs = if annotations_changed || min_ready_changed {
                spec.min_ready_seconds = min_ready;
                Arc::new(
                    self.rs_api()
                        .replace(&copy.name_any(), &PostParams::default(), &copy)
                        .await?,
                )
            } else {
                existing
            };
            let revision = rs.annotations().get(REVISION).cloned().unwrap_or_default();
            self.set_revision(&revision).await?;
            let mut status = self.status();
            if progress_deadline(&self.d).is_some() && condition(&status, PROGRESSING).is_none() {
                set_condition(
                    &mut status,
                    new_condition(
                        PROGRESSING,
                        "True",
                        FOUND_NEW_RS,
                        format!("Found new replica set \"{}\"", rs.name_any()),
                        self.now,
                    ),
                );
                self.write_status(status).await?;
            }
            return Ok(Some(rs));
        }
        if !create {
            return Ok(None);
        }
        let spec = self.d.spec.clone().unwrap_or_default();
        let collision_count = self.d.status.as_ref().and_then(|s| s.collision_count);
        let hash = pod_template_hash(&spec.template, collision_count);
        let mut template = spec.template.clone();
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(POD_TEMPLATE_HASH.into(), hash.clone());
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels = Some(labels.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{}-{hash}", self.d.name_any())),
                namespace: Some(self.key.namespace_or_empty().to_string()),
                owner_references: Some(vec![owner::controller_ref(&self.d)]),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let count = new_rs_new_replicas(&self.d, self.pod_count(old), &rs);
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(count);
        }
        set_new_rs_annotations(&self.d, &mut rs, new_revision, false);
        let (created, already) = match self.rs_api().create(&PostParams::default(), &rs).await {
            Ok(c) => (c, false),
            Err(e) if api_code(&e) == Some(409) => {
                let name = rs.name_any();
                let found = self.rs_api().get_opt(&name).await?;
                let ours = found.as_ref().is_some_and(|f| {
                    controller_of(f.meta()).is_some_and(|r| Some(r.uid.clone()) == self.d.uid())
                        && f.spec
                            .as_ref()
                            .and_then(|s| s.template.as_ref())
                            .is_some_and(|t| equal_ignore_hash(&spec.template, t))
                });
                match found {
                    Some(f) if ours => (f, true),
                    _ => {
                        // A hash collision: bump the count so the next hash differs.
                        let mut status = self.status();
                        status.collision_count = Some(collision_count.unwrap_or(0) + 1);
                        self.write_status(status).await?;
                        tracing::info!(deployment = %self.key, replicaset = %name, "pod-template-hash collision; bumping collisionCount");
                        return Err(e.into());
                    }
                }
            }
            Err(e) => {
                let msg = format!(
                    "Failed to create new replica set \"{}\": {}",
                    rs.name_any(),
                    pods::error_message(&e)
                );
                if progress_deadline(&self.d).is_some() {
                    let mut status = self.status();
                    set_condition(
                        &mut status,
                        new_condition(
                            PROGRESSING,
                            "False",
                            FAILED_RS_CREATE,
                            msg.clone(),
                            self.now,
                        ),
                    );
                    let _ = self.write_status(status).await;
                }
                self.c
                    .recorder
                    .event(&self.d, EventType::Warning, FAILED_RS_CREATE, msg);
                return Err(e.into());
            }
        };
        if !already && count > 0 {
            self.c.recorder.event(
                &self.d,
                EventType::Normal,
                "ScalingReplicaSet",
                format!(
                    "Scaled up replica set {} from 0 to {count}",
                    created.name_any()
                ),
            );
        }
        self.set_revision(&new_revision.to_string()).await?;
        if !already && progress_deadline(&self.d).is_some() {
            let mut status = self.status();
            set_condition(
                &mut status,
                new_condition(
                    PROGRESSING,
                    "True",
                    NEW_RS_CREATED,
                    format!("Created new replica set \"{}\"", created.name_any()),
                    self.now,
                ),
            );
            self.write_status(status).await?;
        }
        Ok(Some(Arc::new(created)))
    }

    /// The pods of `sets`: per ReplicaSet its size, or more while pods of a scaled-down
    /// ReplicaSet are not yet marked for deletion in the cache.
    fn pod_count(&self, sets: &[Arc<ReplicaSet>]) -> i32 {
        sets.iter()
            .map(|rs| {
                let active = self
                    .c
                    .pods
                    .by_index(BY_CONTROLLER_UID, &rs.uid().unwrap_or_default())
                    .iter()
                    .filter(|p| pods::is_active(p))
                    .count();
                rs_replicas(rs).max(i32::try_from(active).unwrap_or(i32::MAX))
            })
            .sum()
    }

    /// Scales `rs` to `size` unless it has that size already (scaleReplicaSetAndRecordEvent).
    async fn scale_if_needed(
        &self,
        rs: &Arc<ReplicaSet>,
        size: i32,
    ) -> Result<(bool, Arc<ReplicaSet>), ReconcileError> {
        if rs_replicas(rs) == size {
            return Ok((false, rs.clone()));
        }
        self.scale(rs, size).await
    }

    /// Scales `rs` to `size`, keeping its replica annotations current; records
    /// ScalingReplicaSet. Returns the ReplicaSet as written.
    async fn scale(
        &self,
        rs: &Arc<ReplicaSet>,
        size: i32,
    ) -> Result<(bool, Arc<ReplicaSet>), ReconcileError> {
        let current = rs_replicas(rs);
        let desired = replicas(&self.d);
        let max = desired + max_surge(&self.d);
        let size_changes = current != size;
        if !size_changes && !replicas_annotations_need_update(rs, desired, max) {
            return Ok((false, rs.clone()));
        }
        let mut copy = (**rs).clone();
        copy.spec.get_or_insert_with(Default::default).replicas = Some(size);
        set_replicas_annotations(
            copy.metadata.annotations.get_or_insert_with(BTreeMap::new),
            desired,
            max,
        );
        let written = self
            .rs_api()
            .replace(&copy.name_any(), &PostParams::default(), &copy)
            .await?;
        tracing::debug!(deployment = %self.key, replicaset = %copy.name_any(), from = current, to = size, rv = ?rs.resource_version(), written_rv = ?written.resource_version(), "scaled a replica set");
        if size_changes {
            let op = if current < size { "up" } else { "down" };
            self.c.recorder.event(
                &self.d,
                EventType::Normal,
                "ScalingReplicaSet",
                format!(
                    "Scaled {op} replica set {} from {current} to {size}",
                    copy.name_any()
                ),
            );
        }
        Ok((size_changes, Arc::new(written)))
    }

    /// Whether some active ReplicaSet was sized for a different replica count.
    async fn is_scaling_event(&mut self, sets: &[Arc<ReplicaSet>]) -> Result<bool, ReconcileError> {
        let (new, old) = self.new_and_old(sets, false).await?;
        let mut all = old;
        all.extend(new);
        let want = replicas(&self.d);
        Ok(active(&all)
            .iter()
            .any(|rs| desired_replicas_annotation(rs).is_some_and(|d| d != want)))
    }

    /// Scaling and paused Deployments: resize proportionally, clean up when paused, status.
    async fn scale_sync(&mut self, sets: &[Arc<ReplicaSet>]) -> Result<(), ReconcileError> {
        let (new, old) = self.new_and_old(sets, false).await?;
        let (new, old) = self.scale_sets(new, old).await?;
        let paused = self.d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false);
        if paused {
            self.cleanup(&old).await?;
        }
        let mut all = old;
        all.extend(new.clone());
        self.sync_status(&all, new.as_ref()).await
    }

    /// Kubernetes' `scale`: one active (or the latest) ReplicaSet takes the whole count; a
    /// saturated new one drains the old; otherwise the difference is spread proportionally.
    async fn scale_sets(
        &mut self,
        new: Option<Arc<ReplicaSet>>,
        old: Vec<Arc<ReplicaSet>>,
    ) -> Result<(Option<Arc<ReplicaSet>>, Vec<Arc<ReplicaSet>>), ReconcileError> {
        let want = replicas(&self.d);
        let replace = |sets: &mut Vec<Arc<ReplicaSet>>,
                       new: &mut Option<Arc<ReplicaSet>>,
                       w: Arc<ReplicaSet>| {
            if new.as_ref().is_some_and(|n| n.uid() == w.uid()) {
                *new = Some(w);
            } else if let Some(slot) = sets.iter_mut().find(|s| s.uid() == w.uid()) {
                *slot = w;
            }
        };
        let (mut new, mut old) = (new, old);
        if let Some(one) = find_active_or_latest(new.as_ref(), &old) {
            if rs_replicas(&one) != want {
                let (_, w) = self.scale_if_needed(&one, want).await?;
                replace(&mut old, &mut new, w);
            }
            return Ok((new, old));
        }
        if is_saturated(&self.d, new.as_deref()) {
            for rs in active(&old) {
                let (_, w) = self.scale_if_needed(&rs, 0).await?;
                replace(&mut old, &mut new, w);
            }
            return Ok((new, old));
        }
        if is_rolling(&self.d) {
            let mut all = old.clone();
            all.extend(new.clone());
            let mut all = active(&all);
            let allowed = if want > 0 {
                want + max_surge(&self.d)
            } else {
                0
            };
            let to_add = allowed - replica_count(&all);
            if to_add > 0 {
                all.sort_by(by_size_newer);
            } else {
                all.sort_by(by_size_older);
            }
            let mut added = 0;
            let mut sizes: Vec<i32> = Vec::with_capacity(all.len());
            for rs in &all {
                let p = if to_add != 0 {
                    proportion(rs, &self.d, to_add, added)
                } else {
                    0
                };
                added += p;
                sizes.push(rs_replicas(rs) + p);
            }
            if to_add != 0 {
                if let Some(first) = sizes.first_mut() {
                    *first = (*first + to_add - added).max(0);
                }
            }
            for (rs, size) in all.iter().zip(sizes) {
                let (_, w) = self.scale(rs, size).await?;
                replace(&mut old, &mut new, w);
            }
        }
        Ok((new, old))
    }

    /// Deletes the oldest unused ReplicaSets beyond revisionHistoryLimit.
    async fn cleanup(&self, old: &[Arc<ReplicaSet>]) -> Result<(), ReconcileError> {
        let Some(limit) = self.d.spec.as_ref().and_then(|s| s.revision_history_limit) else {
            return Ok(());
        };
        let mut cleanable: Vec<Arc<ReplicaSet>> = old
            .iter()
            .filter(|rs| rs.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        let excess = cleanable.len() as i64 - i64::from(limit);
        if excess <= 0 {
            return Ok(());
        }
        cleanable.sort_by(by_revision);
        for rs in cleanable.iter().take(usize::try_from(excess).unwrap_or(0)) {
            let status = rs.status.clone().unwrap_or_default();
            if status.replicas != 0
                || rs_replicas(rs) != 0
                || rs.metadata.generation > status.observed_generation
            {
                continue;
            }
            tracing::debug!(deployment = %self.key, replicaset = %rs.name_any(), "deleting an old replica set beyond the revision history limit");
            match self
                .rs_api()
                .delete(&rs.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn sync_status_only(&mut self, sets: &[Arc<ReplicaSet>]) -> Result<(), ReconcileError> {
        let (new, old) = self.new_and_old(sets, false).await?;
        let mut all = old;
        all.extend(new.clone());
        self.sync_status(&all, new.as_ref()).await
    }

    async fn sync_status(
        &mut self,
        all: &[Arc<ReplicaSet>],
        new: Option<&Arc<ReplicaSet>>,
    ) -> Result<(), ReconcileError> {
        let status = calculate_status(all, new, &self.d, self.now);
        if self.d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.write_status(status).await
    }

    /// Status plus the Progressing condition (syncRolloutStatus); asks to be run again when
    /// the progress deadline would pass.
    async fn sync_rollout_status(
        &mut self,
        all: &[Arc<ReplicaSet>],
        new: Option<&Arc<ReplicaSet>>,
    ) -> Result<Action, ReconcileError> {
        let mut status = calculate_status(all, new, &self.d, self.now);
        let deadline = progress_deadline(&self.d);
        if deadline.is_none() {
            remove_condition(&mut status, PROGRESSING);
        }
        let current = condition(&status, PROGRESSING).cloned();
        let complete_already = status.replicas == status.updated_replicas
            && current.as_ref().and_then(|c| c.reason.as_deref()) == Some(NEW_RS_AVAILABLE);
        if deadline.is_some() && !complete_already {
            let name = new.map(|n| n.name_any()).unwrap_or_default();
            if is_complete(&self.d, &status) {
                let msg = if name.is_empty() {
                    "Deployment has successfully progressed.".to_string()
                } else {
                    format!("ReplicaSet \"{name}\" has successfully progressed.")
                };
                set_condition(
                    &mut status,
                    new_condition(PROGRESSING, "True", NEW_RS_AVAILABLE, msg, self.now),
                );
            } else if is_progressing(&self.d, &status) {
                let msg = if name.is_empty() {
                    "Deployment is progressing.".to_string()
                } else {
                    format!("ReplicaSet \"{name}\" is progressing.")
                };
                let mut c = new_condition(PROGRESSING, "True", RS_UPDATED, msg, self.now);
                if let Some(cur) = current.as_ref().filter(|cur| cur.status == "True") {
                    c.last_transition_time = cur.last_transition_time.clone();
                }
                remove_condition(&mut status, PROGRESSING);
                set_condition(&mut status, c);
            } else if is_timed_out(&self.d, &status, self.now) {
                let msg = if name.is_empty() {
                    "Deployment has timed out progressing.".to_string()
                } else {
                    format!("ReplicaSet \"{name}\" has timed out progressing.")
                };
                set_condition(
                    &mut status,
                    new_condition(PROGRESSING, "False", TIMED_OUT, msg, self.now),
                );
            }
        }
        // ReplicaFailure mirrors the first failure among the ReplicaSets.
        let failure = new.into_iter().chain(all.iter()).find_map(|rs| {
            rs.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == REPLICA_FAILURE)
                .cloned()
        });
        match failure {
            Some(f) => set_condition(
                &mut status,
                new_condition(
                    REPLICA_FAILURE,
                    &f.status,
                    f.reason.as_deref().unwrap_or(""),
                    f.message.unwrap_or_default(),
                    self.now,
                ),
            ),
            None => remove_condition(&mut status, REPLICA_FAILURE),
        }
        if self.d.status.as_ref() == Some(&status) {
            return Ok(self.requeue_if_stuck(&status));
        }
        self.write_status(status).await?;
        Ok(Action::AwaitChange)
    }

    /// When a rollout is in progress, come back when its deadline passes.
    fn requeue_if_stuck(&self, status: &DeploymentStatus) -> Action {
        let (Some(deadline), Some(c)) =
            (progress_deadline(&self.d), condition(status, PROGRESSING))
        else {
            return Action::AwaitChange;
        };
        if is_complete(&self.d, status) || c.reason.as_deref() == Some(TIMED_OUT) {
            return Action::AwaitChange;
        }
        let since = c
            .last_update_time
            .as_ref()
            .map_or(Duration::ZERO, |t| pods::elapsed(t.0, self.now));
        Action::RequeueAfter(deadline.saturating_sub(since).max(Duration::from_secs(1)))
    }
}
