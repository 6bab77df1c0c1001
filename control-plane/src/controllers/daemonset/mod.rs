//! The DaemonSet controller: one pod per eligible node, placed by the scheduler.
//!
//! Per key: claim pods (adopt/release), group them by the node they are for, and unless
//! earlier creations/deletions are still expected: create the daemon pod on eligible nodes
//! that have none (template + default tolerations + required node affinity on
//! `metadata.name`, labels `controller-revision-hash` and `pod-template-generation`), delete
//! failed pods, surplus pods and pods on nodes that may no longer run them; then, for the
//! RollingUpdate strategy, delete old-revision pods while no more than maxUnavailable are
//! unavailable (the next pass creates their replacements). Status: desired, current,
//! misscheduled, ready, available (minReadySeconds), updated, unavailable counts.
//!
//! History: each template is kept as a ControllerRevision ([`super::history`]) named
//! `<ds>-<hash>`, labelled with the template's labels and `controller-revision-hash: <hash>`,
//! controlled by the DaemonSet, numbered in order; a template equal to an older revision's
//! (`kubectl rollout undo`) renumbers that revision instead of adding one. Pods get the
//! current revision's hash, so the pods of an undone-to revision count as updated again.
//! Revisions no pod uses beyond `revisionHistoryLimit` (10) are deleted, oldest first.
//! `kubectl rollout history|undo daemonset` read these revisions by the DaemonSet's selector.

pub mod placement;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use super::deployment::util::{pod_template_hash, scaled_value};
use super::history::{self, HashLabel};
use super::{pods, Context};
use crate::machinery::LabelSelector;
use crate::runtime::owner::{self, controller_of, BY_CONTROLLER_UID};
use crate::runtime::{
    Action, Change, Controller, EventType, Expectations, Informer, ObjectKey, ReconcileError,
    Reconciler, Recorder, WorkQueue,
};

pub const NAME: &str = "daemonset";
pub const REVISION_HASH: &str = history::POD_REVISION_LABEL;
const TEMPLATE_GENERATION: &str = "pod-template-generation";
/// The most pods created in one pass (kube-controller-manager's BurstReplicas for DaemonSets).
const BURST: usize = 250;

pub struct DaemonSetController {
    client: Client,
    sets: Informer<DaemonSet>,
    pods: Informer<Pod>,
    nodes: Informer<Node>,
    revisions: Informer<ControllerRevision>,
    expectations: Arc<Expectations<ObjectKey, ObjectKey>>,
    recorder: Recorder,
}

fn selector(ds: &DaemonSet) -> Option<LabelSelector> {
    LabelSelector::from_meta(&ds.spec.as_ref()?.selector).ok()
}

fn matching_sets(sets: &Informer<DaemonSet>, pod: &Pod) -> Vec<ObjectKey> {
    sets.in_namespace(&pod.namespace().unwrap_or_default())
        .iter()
        .filter(|ds| selector(ds).is_some_and(|s| !s.is_everything() && s.matches(pod.labels())))
        .map(|ds| ObjectKey::of(ds.as_ref()))
        .collect()
}

/// What of a node decides daemon placement.
fn placement_view(n: &Node) -> impl PartialEq + '_ {
    (
        n.labels(),
        n.spec.as_ref().map(|s| (&s.taints, &s.unschedulable)),
    )
}

pub fn build(ctx: &Context) -> Controller<DaemonSetController> {
    let sets = ctx.informers.get::<DaemonSet>();
    let pods = ctx.informers.get::<Pod>();
    let nodes = ctx.informers.get::<Node>();
    let revisions = ctx.informers.get::<ControllerRevision>();
    super::index_pods(&pods);
    revisions.add_index(
        BY_CONTROLLER_UID,
        owner::index_by_controller_uid::<ControllerRevision>,
    );
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let expectations: Arc<Expectations<ObjectKey, ObjectKey>> = Arc::default();

    let (q, exp) = (queue.clone(), expectations.clone());
    sets.on_change(move |c| {
        let key = ObjectKey::of(c.object().as_ref());
        if let Change::Deleted(_) = c {
            exp.forget(&key);
        }
        q.add(key);
    });
    let (q, exp, s) = (queue.clone(), expectations.clone(), sets.clone());
    pods.on_change(move |c| {
        let owner = |p: &Pod| {
            controller_of(p.meta())
                .and_then(|r| owner::resolve(&s, &p.namespace().unwrap_or_default(), r))
        };
        match c {
            Change::Added(p) => match owner(p) {
                Some(k) => {
                    if pods::is_terminating(p) {
                        exp.deletion_observed(&k, &ObjectKey::of(p.as_ref()));
                    } else {
                        exp.creation_observed(&k);
                    }
                    q.add(k);
                }
                None => matching_sets(&s, p).into_iter().for_each(|k| q.add(k)),
            },
            Change::Updated { old, new } => {
                if pods::is_terminating(new) && !pods::is_terminating(old) {
                    if let Some(k) = owner(new) {
                        exp.deletion_observed(&k, &ObjectKey::of(new.as_ref()));
                    }
                }
                let (a, b) = (owner(old), owner(new));
                if a != b {
                    a.into_iter().for_each(|k| q.add(k));
                }
                match b {
                    Some(k) => q.add(k),
                    None => {
                        if old.labels() != new.labels() {
                            matching_sets(&s, new).into_iter().for_each(|k| q.add(k));
                        }
                    }
                }
            }
            Change::Deleted(p) => {
                if let Some(k) = owner(p) {
                    exp.deletion_observed(&k, &ObjectKey::of(p.as_ref()));
                    q.add(k);
                }
            }
        }
    });
    let (q, s) = (queue.clone(), sets.clone());
    nodes.on_change(move |c| {
        let relevant = match c {
            Change::Updated { old, new } => placement_view(old) != placement_view(new),
            _ => true,
        };
        if relevant {
            for ds in s.list() {
                q.add(ObjectKey::of(ds.as_ref()));
            }
        }
    });

    let (q, s) = (queue.clone(), sets.clone());
    revisions.on_change(move |c| {
        // A revision deleted or changed by someone else: its DaemonSet restores its history.
        let r = c.object();
        if let Some(k) = controller_of(r.meta())
            .and_then(|o| owner::resolve(&s, &r.namespace().unwrap_or_default(), o))
        {
            q.add(k);
        }
    });

    let reconciler = DaemonSetController {
        client: ctx.client.clone(),
        sets,
        pods,
        nodes,
        revisions,
        expectations,
        recorder: ctx.events.recorder("daemonset-controller"),
    };
    Controller::new(
        NAME,
        Arc::new(reconciler),
        queue,
        ctx.settings.concurrent_daemonset_syncs,
        ctx.metrics.clone(),
    )
}

/// The daemon pod template with the default tolerations (what eligibility is judged on).
fn daemon_template(ds: &DaemonSet) -> PodTemplateSpec {
    let mut t = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let spec = t.spec.get_or_insert_with(Default::default);
    let host_network = spec.host_network.unwrap_or(false);
    placement::add_tolerations(spec, placement::default_tolerations(host_network));
    t
}

fn revision_hash(ds: &DaemonSet) -> String {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    pod_template_hash(
        &template,
        ds.status.as_ref().and_then(|s| s.collision_count),
    )
}

fn is_updated(pod: &Pod, hash: &str) -> bool {
    pod.labels().get(REVISION_HASH).map(String::as_str) == Some(hash)
}

/// Oldest first, scheduled before unscheduled (the one kept when there are several).
fn oldest_first(pods: &mut [Arc<Pod>]) {
    pods.sort_by_key(|p| {
        (
            pods::node_name(p).is_none(),
            p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            p.name_any(),
        )
    });
}

impl Reconciler for DaemonSetController {
    type Key = ObjectKey;

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        crate::runtime::controller::involved(&self.sets, key, &self.recorder)
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ds) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::AwaitChange);
        };
        let Some(sel) = selector(&ds).filter(|s| !s.is_everything()) else {
            tracing::warn!(daemonset = %key, "invalid or empty selector; not syncing");
            return Ok(Action::AwaitChange);
        };
        let deleting = ds.metadata.deletion_timestamp.is_some();
        let (hash, collisions) = if deleting {
            (
                revision_hash(&ds),
                ds.status.as_ref().and_then(|s| s.collision_count),
            )
        } else {
            let (hash, collisions) = self.current_revision(&ds).await?;
            // Kept as it was (unset) until a collision happens.
            let had = ds
                .status
                .as_ref()
                .is_some_and(|s| s.collision_count.is_some());
            (hash, (had || collisions > 0).then_some(collisions))
        };
        let template = daemon_template(&ds);
        let spec = template.spec.clone().unwrap_or_default();
        let mut nodes = self.nodes.list();
        nodes.sort_by_key(|n| n.name_any());
        let claimed = owner::claim(&self.client, ds.as_ref(), &sel, &self.pods).await?;
        let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in claimed {
            if let Some(n) = placement::target_node(&p) {
                by_node.entry(n).or_default().push(p);
            }
        }
        for v in by_node.values_mut() {
            oldest_first(v);
        }
        let now = Timestamp::now();
        let min_ready = Duration::from_secs(
            u64::try_from(
                ds.spec
                    .as_ref()
                    .and_then(|s| s.min_ready_seconds)
                    .unwrap_or(0),
            )
            .unwrap_or(0),
        );
        let mut result = Ok(false);
        if self.expectations.satisfied(key) && !deleting {
            result = self
                .manage(key, &ds, &template, &hash, &nodes, &by_node)
                .await;
            // Only after a pass that wrote nothing: `by_node` shows the cache before it.
            if matches!(result, Ok(false)) && is_rolling(&ds) {
                result = self
                    .rolling_update(key, &ds, &hash, &nodes, &spec, &by_node, min_ready, now)
                    .await
                    .map(|()| true);
            }
            if result.is_ok() {
                self.truncate_history(&ds, &hash, &by_node).await?;
            }
        }
        let counts = Placement {
            spec: &spec,
            hash: &hash,
            nodes: &nodes,
            by_node: &by_node,
        };
        self.update_status(&ds, &counts, collisions, min_ready, now)
            .await?;
        result?;
        if !min_ready.is_zero() {
            // Availability changes with time alone.
            return Ok(Action::RequeueAfter(min_ready));
        }
        Ok(Action::AwaitChange)
    }
}

fn is_rolling(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

/// What a status is counted from: the daemon pod spec, the current revision's hash, the
/// nodes and the claimed pods by node.
struct Placement<'a> {
    spec: &'a k8s_openapi::api::core::v1::PodSpec,
    hash: &'a str,
    nodes: &'a [Arc<Node>],
    by_node: &'a BTreeMap<String, Vec<Arc<Pod>>>,
}

impl DaemonSetController {
    /// The revision of the DaemonSet's template (created, or an older one renumbered) and
    /// its hash, which new pods carry; with the collision count that took.
    async fn current_revision(&self, ds: &DaemonSet) -> Result<(String, i32), ReconcileError> {
        let uid = ds.uid().unwrap_or_default();
        let ns = ds.namespace().unwrap_or_default();
        let existing = history::revisions_of(&self.revisions, &uid, &ns);
        let template = ds
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        let collisions = ds
            .status
            .as_ref()
            .and_then(|s| s.collision_count)
            .unwrap_or(0);
        let (current, collisions) = history::ensure(
            &self.client,
            ds,
            &existing,
            &template,
            collisions,
            HashLabel::PodRevision,
        )
        .await?;
        // The revision's own label, not a hash computed again: an older revision taken
        // back by an undo keeps the hash its pods were made with.
        let hash = current
            .labels()
            .get(REVISION_HASH)
            .cloned()
            .unwrap_or_else(|| revision_hash(ds));
        Ok((hash, collisions))
    }

    /// Deletes the oldest revisions beyond `revisionHistoryLimit` that neither the current
    /// template nor any of the DaemonSet's pods use.
    async fn truncate_history(
        &self,
        ds: &DaemonSet,
        hash: &str,
        by_node: &BTreeMap<String, Vec<Arc<Pod>>>,
    ) -> Result<(), ReconcileError> {
        let uid = ds.uid().unwrap_or_default();
        let ns = ds.namespace().unwrap_or_default();
        let revisions = history::revisions_of(&self.revisions, &uid, &ns);
        let limit = ds
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10);
        if revisions.len() <= usize::try_from(limit).unwrap_or(0) + 1 {
            return Ok(());
        }
        let hashes: HashSet<&str> = by_node
            .values()
            .flatten()
            .filter_map(|p| p.labels().get(REVISION_HASH).map(String::as_str))
            .chain([hash])
            .collect();
        let live: HashSet<String> = revisions
            .iter()
            .filter(|r| {
                r.labels()
                    .get(REVISION_HASH)
                    .is_some_and(|h| hashes.contains(h.as_str()))
            })
            .map(|r| r.name_any())
            .collect();
        history::truncate(&self.client, &revisions, &live, limit).await
    }
    /// Creates missing daemon pods and deletes failed, surplus and misplaced ones; true if it
    /// wrote anything.
    async fn manage(
        &self,
        key: &ObjectKey,
        ds: &DaemonSet,
        template: &PodTemplateSpec,
        hash: &str,
        nodes: &[Arc<Node>],
        by_node: &BTreeMap<String, Vec<Arc<Pod>>>,
    ) -> Result<bool, ReconcileError> {
        let spec = template.spec.clone().unwrap_or_default();
        let reference = ds.object_ref(&());
        let mut create_on: Vec<String> = Vec::new();
        let mut delete: Vec<Arc<Pod>> = Vec::new();
        for node in nodes {
            let name = node.name_any();
            let (run, keep) = placement::should_run(&spec, node);
            let here = by_node.get(&name).cloned().unwrap_or_default();
            if run && here.is_empty() {
                create_on.push(name);
            } else if keep {
                let mut running = Vec::new();
                for p in here.iter().filter(|p| !pods::is_terminating(p)) {
                    if pods::phase(p) == "Failed" {
                        self.recorder.event(
                            ds,
                            EventType::Warning,
                            "FailedDaemonPod",
                            format!(
                                "Found failed daemon pod {}/{} on node {name}, will try to kill it",
                                key.namespace_or_empty(),
                                p.name_any()
                            ),
                        );
                        delete.push(p.clone());
                    } else {
                        running.push(p.clone());
                    }
                }
                // Several on one node: keep the oldest.
                delete.extend(running.into_iter().skip(1));
            } else {
                delete.extend(here.into_iter().filter(|p| !pods::is_terminating(p)));
            }
        }
        create_on.truncate(BURST);
        if create_on.is_empty() && delete.is_empty() {
            return Ok(false);
        }
        let doomed: Vec<ObjectKey> = delete.iter().map(|p| ObjectKey::of(p.as_ref())).collect();
        self.expectations
            .expect(key, create_on.len(), doomed.clone());
        let mut first_error = None;
        let extra: BTreeMap<String, String> = [
            (REVISION_HASH.to_string(), hash.to_string()),
            (
                TEMPLATE_GENERATION.to_string(),
                ds.metadata.generation.unwrap_or(1).to_string(),
            ),
        ]
        .into();
        let mut queue = create_on.iter();
        let (created, err) = pods::slow_start_batch(create_on.len(), || {
            let node = queue.next().cloned().unwrap_or_default();
            let mut pod = pods::from_template(
                template,
                key.namespace_or_empty(),
                &ds.name_any(),
                owner::controller_ref(ds),
                &extra,
            );
            if let Some(s) = pod.spec.as_mut() {
                placement::pin_to_node(s, &node);
            }
            let (client, recorder, reference) = (&self.client, &self.recorder, &reference);
            async move {
                pods::create(client, recorder, reference, &pod)
                    .await
                    .map(|_| ())
            }
        })
        .await;
        for _ in created..create_on.len() {
            self.expectations.creation_observed(key);
        }
        if let Some(e) = err {
            first_error.get_or_insert(e);
        }
        let results = futures::future::join_all(
            delete
                .iter()
                .zip(&doomed)
                .map(|(p, k)| pods::delete(&self.client, &self.recorder, &reference, k, p.uid())),
        )
        .await;
        for (r, k) in results.into_iter().zip(&doomed) {
            if let Err(e) = r {
                self.expectations.deletion_observed(key, k);
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(true), Err)
    }

    /// Deletes old-revision pods within maxUnavailable (maxSurge 0, Kubernetes' default).
    #[allow(clippy::too_many_arguments)]
    async fn rolling_update(
        &self,
        key: &ObjectKey,
        ds: &DaemonSet,
        hash: &str,
        nodes: &[Arc<Node>],
        spec: &k8s_openapi::api::core::v1::PodSpec,
        by_node: &BTreeMap<String, Vec<Arc<Pod>>>,
        min_ready: Duration,
        now: Timestamp,
    ) -> Result<(), ReconcileError> {
        let desired = nodes
            .iter()
            .filter(|n| placement::should_run(spec, n).0)
            .count();
        let ru = ds
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref());
        let desired_i32 = i32::try_from(desired).unwrap_or(i32::MAX);
        let mut max_unavailable = scaled_value(
            ru.and_then(|r| r.max_unavailable.as_ref()),
            desired_i32,
            "1",
            true,
        );
        let max_surge = scaled_value(
            ru.and_then(|r| r.max_surge.as_ref()),
            desired_i32,
            "0",
            true,
        );
        if max_unavailable == 0 && max_surge == 0 {
            max_unavailable = 1;
        }
        let mut unavailable = 0;
        let mut replace_now: Vec<Arc<Pod>> = Vec::new();
        let mut candidates: Vec<Arc<Pod>> = Vec::new();
        // A node that should run a daemon pod and has none is unavailable too.
        let empty = Vec::new();
        let mut considered: BTreeMap<String, &Vec<Arc<Pod>>> =
            by_node.iter().map(|(n, v)| (n.clone(), v)).collect();
        for n in nodes.iter().filter(|n| placement::should_run(spec, n).0) {
            considered.entry(n.name_any()).or_insert(&empty);
        }
        for (_, here) in considered {
            let live: Vec<&Arc<Pod>> = here.iter().filter(|p| !pods::is_terminating(p)).collect();
            let new: Vec<&&Arc<Pod>> = live.iter().filter(|p| is_updated(p, hash)).collect();
            let old: Vec<&&Arc<Pod>> = live.iter().filter(|p| !is_updated(p, hash)).collect();
            match (new.len(), old.len()) {
                (0, 0) | (1, 1) => unavailable += 1,
                (1, 0) => {
                    if !pods::is_available(new[0], min_ready, now) {
                        unavailable += 1;
                    }
                }
                (0, 1) => {
                    let p = (**old[0]).clone();
                    if !pods::is_available(&p, min_ready, now) {
                        replace_now.push(p);
                    } else if unavailable < max_unavailable {
                        candidates.push(p);
                    }
                }
                _ => unavailable += 1,
            }
        }
        let room = usize::try_from((max_unavailable - unavailable).max(0))
            .unwrap_or(0)
            .min(candidates.len());
        replace_now.extend(candidates.into_iter().take(room));
        if replace_now.is_empty() {
            return Ok(());
        }
        let reference = ds.object_ref(&());
        let doomed: Vec<ObjectKey> = replace_now
            .iter()
            .map(|p| ObjectKey::of(p.as_ref()))
            .collect();
        self.expectations.expect_deletions(key, doomed.clone());
        tracing::debug!(daemonset = %key, deleting = doomed.len(), max_unavailable, unavailable, "rolling update");
        let results = futures::future::join_all(
            replace_now
                .iter()
                .zip(&doomed)
                .map(|(p, k)| pods::delete(&self.client, &self.recorder, &reference, k, p.uid())),
        )
        .await;
        let mut first = None;
        for (r, k) in results.into_iter().zip(&doomed) {
            if let Err(e) = r {
                self.expectations.deletion_observed(key, k);
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    async fn update_status(
        &self,
        ds: &DaemonSet,
        placed: &Placement<'_>,
        collision_count: Option<i32>,
        min_ready: Duration,
        now: Timestamp,
    ) -> Result<(), ReconcileError> {
        let Placement {
            spec,
            hash,
            nodes,
            by_node,
        } = *placed;
        let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) =
            (0, 0, 0, 0, 0, 0);
        for node in nodes {
            let (run, _) = placement::should_run(spec, node);
            let here = by_node.get(&node.name_any());
            let scheduled = here.is_some_and(|v| !v.is_empty());
            if run {
                desired += 1;
                let Some(pod) = here.and_then(|v| v.first()) else {
                    continue;
                };
                current += 1;
                if pods::is_ready(pod) {
                    ready += 1;
                    if pods::is_available(pod, min_ready, now) {
                        available += 1;
                    }
                }
                if is_updated(pod, hash) {
                    updated += 1;
                }
            } else if scheduled {
                misscheduled += 1;
            }
        }
        let mut status = ds.status.clone().unwrap_or_default();
        let new = DaemonSetStatus {
            desired_number_scheduled: desired,
            current_number_scheduled: current,
            number_misscheduled: misscheduled,
            number_ready: ready,
            number_available: Some(available),
            updated_number_scheduled: Some(updated),
            number_unavailable: Some(desired - available).filter(|u| *u > 0),
            observed_generation: ds.metadata.generation,
            collision_count,
            conditions: status.conditions.take(),
        };
        if ds.status.as_ref() == Some(&new) {
            return Ok(());
        }
        let api: Api<DaemonSet> =
            Api::namespaced(self.client.clone(), &ds.namespace().unwrap_or_default());
        let mut copy = ds.clone();
        copy.status = Some(new);
        api.replace_status(&ds.name_any(), &PostParams::default(), &copy)
            .await?;
        Ok(())
    }
}
