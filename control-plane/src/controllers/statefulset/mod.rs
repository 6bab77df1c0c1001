//! The StatefulSet controller: pods with stable names (`web-0`, `web-1`...), stable network
//! identities (hostname, the headless Service's subdomain) and stable storage (one claim per
//! volumeClaimTemplate and ordinal, `www-web-0`), started and stopped in order.
//!
//! Per key: claim pods (adopt/release by selector), make sure a ControllerRevision holds the
//! current template ([`super::history`]), [`plan::plan`] the sync, then carry it out: claims
//! before their pod, pods created with the revision's template, deleted gracefully, identity
//! fixed; claims' owner references follow the retention policy (whenDeleted: owned by the set;
//! whenScaled: owned by the condemned pod, so the garbage collector removes them with it);
//! status; old revisions beyond revisionHistoryLimit deleted.

pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use self::plan::{Revision, Step, Why, POD_INDEX_LABEL, POD_NAME_LABEL, REVISION_LABEL};
use super::{history, pods, Context};
use crate::machinery::LabelSelector;
use crate::runtime::controller::api_code;
use crate::runtime::owner::{self, controller_of, BY_CONTROLLER_UID};
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "statefulset";

pub struct StatefulSetController {
    client: Client,
    sets: Informer<StatefulSet>,
    pods: Informer<Pod>,
    revisions: Informer<ControllerRevision>,
    claims: Informer<PersistentVolumeClaim>,
    recorder: Recorder,
}

fn selector(s: &StatefulSet) -> Option<LabelSelector> {
    LabelSelector::from_meta(&s.spec.as_ref()?.selector).ok()
}

pub fn build(ctx: &Context) -> Controller<StatefulSetController> {
    let sets = ctx.informers.get::<StatefulSet>();
    let pods = ctx.informers.get::<Pod>();
    let revisions = ctx.informers.get::<ControllerRevision>();
    let claims = ctx.informers.get::<PersistentVolumeClaim>();
    super::index_pods(&pods);
    revisions.add_index(
        BY_CONTROLLER_UID,
        owner::index_by_controller_uid::<ControllerRevision>,
    );
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    sets.on_change(move |c| q.add(ObjectKey::of(c.object().as_ref())));
    let (q, s) = (queue.clone(), sets.clone());
    pods.on_change(move |c| {
        let p = c.object();
        let ns = p.namespace().unwrap_or_default();
        match controller_of(p.meta()).and_then(|r| owner::resolve(&s, &ns, r)) {
            Some(k) => q.add(k),
            None if controller_of(p.meta()).is_none() => {
                // An orphan: the sets whose selector matches may adopt it.
                for set in s.in_namespace(&ns) {
                    if selector(&set)
                        .is_some_and(|sel| !sel.is_everything() && sel.matches(p.labels()))
                    {
                        q.add(ObjectKey::of(set.as_ref()));
                    }
                }
            }
            None => {}
        }
        if let Change::Updated { old, .. } = c {
            if let Some(k) = controller_of(old.meta()).and_then(|r| owner::resolve(&s, &ns, r)) {
                q.add(k);
            }
        }
    });
    let (q, s) = (queue.clone(), sets.clone());
    revisions.on_change(move |c| {
        let r = c.object();
        if let Some(k) = controller_of(r.meta())
            .and_then(|o| owner::resolve(&s, &r.namespace().unwrap_or_default(), o))
        {
            q.add(k);
        }
    });
    Controller::new(
        NAME,
        Arc::new(StatefulSetController {
            client: ctx.client.clone(),
            sets,
            pods,
            revisions,
            claims,
            recorder: ctx.events.recorder("statefulset-controller"),
        }),
        queue,
        ctx.settings.concurrent_statefulset_syncs,
        ctx.metrics.clone(),
    )
}

/// `<template>-<set>-<ordinal>`, a claim's name.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// The pod of `ordinal` from `template` (a revision's), with the set's identity and claims.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let name = set.name_any();
    let pod_name = plan::pod_name(&name, ordinal);
    let spec = set.spec.clone().unwrap_or_default();
    let mut extra = BTreeMap::new();
    extra.insert(REVISION_LABEL.to_string(), revision.to_string());
    extra.insert(POD_NAME_LABEL.to_string(), pod_name.clone());
    extra.insert(POD_INDEX_LABEL.to_string(), ordinal.to_string());
    let mut pod = pods::from_template(
        template,
        &set.namespace().unwrap_or_default(),
        &name,
        owner::controller_ref(set),
        &extra,
    );
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(pod_name.clone());
    let ps = pod.spec.get_or_insert_with(Default::default);
    ps.hostname = Some(pod_name);
    ps.subdomain = spec.service_name.clone().filter(|s| !s.is_empty());
    for claim in spec.volume_claim_templates.iter().flatten() {
        let tname = claim.metadata.name.clone().unwrap_or_default();
        let volumes = ps.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| v.name != tname);
        volumes.push(Volume {
            name: tname.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&tname, &name, ordinal),
                read_only: None,
            }),
            ..Default::default()
        });
    }
    pod
}

/// The owner references a claim should have under the retention policy: whenDeleted: Delete
/// makes the set its owner; whenScaled: Delete makes a condemned pod its only owner (the
/// garbage collector deletes an object only once every owner is gone, so the set's
/// reference would keep it).
fn claim_owners(set: &StatefulSet, pod: Option<&Pod>, condemned: bool) -> Vec<OwnerReference> {
    let policy = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.clone())
        .unwrap_or_default();
    let plain = |mut r: OwnerReference| {
        r.controller = None;
        r.block_owner_deletion = None;
        r
    };
    if condemned && policy.when_scaled.as_deref() == Some("Delete") {
        if let Some(p) = pod {
            return vec![plain(owner::controller_ref(p))];
        }
    }
    if policy.when_deleted.as_deref() == Some("Delete") {
        return vec![plain(owner::controller_ref(set))];
    }
    vec![]
}

/// A claim's owner references with the ones this controller manages (the set's and the
/// pod's) replaced by `want`, or None when they already are `want`. A reference to a pod of
/// the same name with another UID (the ordinal's pod, since replaced) is managed too: left in
/// place, that pod's deletion would let the garbage collector take the claim the new pod
/// uses. References to anything else are kept.
fn merged_claim_owners(
    have: &[OwnerReference],
    want: &[OwnerReference],
    set_uids: &HashSet<String>,
    pod: &Pod,
) -> Option<Vec<OwnerReference>> {
    let pod_name = pod.name_any();
    let pod_uid = pod.uid();
    let managed = |r: &OwnerReference| {
        set_uids.contains(&r.uid)
            || Some(&r.uid) == pod_uid.as_ref()
            || (r.kind == "Pod" && r.api_version == "v1" && r.name == pod_name)
    };
    let mine: Vec<&OwnerReference> = have.iter().filter(|r| managed(r)).collect();
    if mine.len() == want.len() && want.iter().all(|w| mine.iter().any(|m| m.uid == w.uid)) {
        return None;
    }
    let mut refs: Vec<OwnerReference> = have.iter().filter(|r| !managed(r)).cloned().collect();
    refs.extend(want.iter().cloned());
    Some(refs)
}

impl StatefulSetController {
    async fn ensure_claims(
        &self,
        set: &StatefulSet,
        ordinal: i32,
        pod: Option<&Pod>,
    ) -> Result<(), ReconcileError> {
        let ns = set.namespace().unwrap_or_default();
        let name = set.name_any();
        let spec = set.spec.clone().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let set_labels = spec.selector.match_labels.clone().unwrap_or_default();
        for t in spec.volume_claim_templates.iter().flatten() {
            let tname = t.metadata.name.clone().unwrap_or_default();
            let cname = claim_name(&tname, &name, ordinal);
            if self.claims.get_namespaced(&ns, &cname).is_some() {
                continue;
            }
            let mut labels = t.metadata.labels.clone().unwrap_or_default();
            labels.extend(set_labels.clone());
            let owners = claim_owners(set, pod, false);
            let claim = PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(cname.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(labels),
                    annotations: t.metadata.annotations.clone(),
                    owner_references: Some(owners).filter(|o| !o.is_empty()),
                    ..Default::default()
                },
                spec: t.spec.clone(),
                status: None,
            };
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => self.recorder.event(
                    set,
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!(
                        "create Claim {cname} Pod {} in StatefulSet {name} success",
                        plan::pod_name(&name, ordinal)
                    ),
                ),
                Err(e) if api_code(&e) == Some(409) => {}
                Err(e) => {
                    self.recorder.event(
                        set,
                        EventType::Warning,
                        "FailedCreate",
                        format!(
                            "create Claim {cname} for Pod {} in StatefulSet {name} failed error: {}",
                            plan::pod_name(&name, ordinal),
                            pods::error_message(&e)
                        ),
                    );
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Brings the owner references of the set's claims in line with the retention policy.
    async fn reconcile_claim_owners(
        &self,
        set: &StatefulSet,
        set_pods: &[Arc<Pod>],
        condemned: &[i32],
    ) -> Result<(), ReconcileError> {
        let ns = set.namespace().unwrap_or_default();
        let name = set.name_any();
        let spec = set.spec.clone().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let uid_set: HashSet<String> = [set.uid().unwrap_or_default()].into();
        for p in set_pods {
            let Some(o) = plan::ordinal(&name, &p.name_any()) else {
                continue;
            };
            let doomed = condemned.contains(&o);
            let want = claim_owners(set, Some(p), doomed);
            for t in spec.volume_claim_templates.iter().flatten() {
                let cname = claim_name(t.metadata.name.as_deref().unwrap_or_default(), &name, o);
                let Some(claim) = self.claims.get_namespaced(&ns, &cname) else {
                    continue;
                };
                let have = claim
                    .metadata
                    .owner_references
                    .as_deref()
                    .unwrap_or_default();
                let Some(refs) = merged_claim_owners(have, &want, &uid_set, p) else {
                    continue;
                };
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": claim.uid()}});
                match api
                    .patch(&cname, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    async fn write_status(
        &self,
        set: &StatefulSet,
        status: StatefulSetStatus,
    ) -> Result<(), ReconcileError> {
        if set.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let api: Api<StatefulSet> =
            Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default());
        let mut next = set.clone();
        next.status = Some(status);
        match api
            .replace_status(&set.name_any(), &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete_pod(
        &self,
        set: &StatefulSet,
        pod: &Pod,
        why: Why,
    ) -> Result<(), ReconcileError> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let dp = DeleteParams {
            preconditions: pod.uid().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        if why == Why::Finished {
            self.recorder.event(
                set,
                EventType::Warning,
                "RecreatingFailedPod",
                format!(
                    "StatefulSet {}/{} is recreating failed Pod {}",
                    set.namespace().unwrap_or_default(),
                    set.name_any(),
                    pod.name_any()
                ),
            );
        }
        match api.delete(&pod.name_any(), &dp).await {
            Ok(_) => {
                self.recorder.event(
                    set,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!(
                        "delete Pod {} in StatefulSet {} successful",
                        pod.name_any(),
                        set.name_any()
                    ),
                );
                Ok(())
            }
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => {
                self.recorder.event(
                    set,
                    EventType::Warning,
                    "FailedDelete",
                    format!(
                        "delete Pod {} in StatefulSet {} failed error: {}",
                        pod.name_any(),
                        set.name_any(),
                        pods::error_message(&e)
                    ),
                );
                Err(e.into())
            }
        }
    }

    async fn create_pod(
        &self,
        set: &StatefulSet,
        pod: &Pod,
        ordinal: i32,
    ) -> Result<(), ReconcileError> {
        self.ensure_claims(set, ordinal, None).await?;
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &set.namespace().unwrap_or_default());
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => {
                self.recorder.event(
                    set,
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!(
                        "create Pod {} in StatefulSet {} successful",
                        created.name_any(),
                        set.name_any()
                    ),
                );
                Ok(())
            }
            // The previous pod of this ordinal is still being deleted.
            Err(e) if api_code(&e) == Some(409) => Ok(()),
            Err(e) => {
                if api_code(&e) != Some(403) {
                    self.recorder.event(
                        set,
                        EventType::Warning,
                        "FailedCreate",
                        format!(
                            "create Pod {} in StatefulSet {} failed error: {}",
                            pod.name_any(),
                            set.name_any(),
                            pods::error_message(&e)
                        ),
                    );
                }
                Err(e.into())
            }
        }
    }

    async fn fix_identity(&self, set: &StatefulSet, pod: &Pod) -> Result<(), ReconcileError> {
        let name = set.name_any();
        let Some(o) = plan::ordinal(&name, &pod.name_any()) else {
            return Ok(());
        };
        let pod_name = plan::pod_name(&name, o);
        let service = set
            .spec
            .as_ref()
            .and_then(|s| s.service_name.clone())
            .filter(|s| !s.is_empty());
        let patch = json!({
            "metadata": {"labels": {POD_NAME_LABEL: pod_name, POD_INDEX_LABEL: o.to_string()}},
            "spec": {"hostname": pod_name, "subdomain": service},
        });
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 422)) => {
                // A pod's hostname cannot change once it runs: recreate it instead.
                self.delete_pod(set, pod, Why::Finished).await
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Reconciler for StatefulSetController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(set) = self.sets.get(key) else {
            return Ok(Action::AwaitChange);
        };
        let Some(sel) = selector(&set) else {
            tracing::warn!(statefulset = %key, "invalid selector; not syncing");
            return Ok(Action::AwaitChange);
        };
        let ns = key.namespace_or_empty().to_string();
        let uid = set.uid().unwrap_or_default();
        let claimed = owner::claim(&self.client, set.as_ref(), &sel, &self.pods).await?;
        let spec = set.spec.clone().unwrap_or_default();
        let existing = history::revisions_of(&self.revisions, &uid, &ns);
        let collisions = set
            .status
            .as_ref()
            .and_then(|s| s.collision_count)
            .unwrap_or(0);
        let (update, collisions) = history::ensure(
            &self.client,
            set.as_ref(),
            &existing,
            &spec.template,
            collisions,
            history::HashLabel::Generic,
        )
        .await?;
        let update_name = update.name_any();
        let current_name = set
            .status
            .as_ref()
            .and_then(|s| s.current_revision.clone())
            .filter(|c| existing.iter().any(|r| r.name_any() == *c))
            .unwrap_or_else(|| update_name.clone());
        let current = existing
            .iter()
            .find(|r| r.name_any() == current_name)
            .map(|r| r.as_ref().clone())
            .unwrap_or_else(|| update.clone());
        let revs = plan::Revisions {
            current: &current_name,
            update: &update_name,
            collision_count: collisions,
        };
        let plan = plan::plan(&set, &claimed, &revs, k8s_openapi::jiff::Timestamp::now());
        let mut result = Ok(());
        for step in &plan.steps {
            let r = match step {
                Step::Create { ordinal, revision } => {
                    let (rev, name) = match revision {
                        Revision::Current => (&current, &current_name),
                        Revision::Update => (&update, &update_name),
                    };
                    let template =
                        history::template_of(rev).unwrap_or_else(|| spec.template.clone());
                    let pod = new_pod(&set, &template, name, *ordinal);
                    self.create_pod(&set, &pod, *ordinal).await
                }
                Step::Delete { pod, why } => {
                    if *why == Why::Condemned {
                        let doomed =
                            [plan::ordinal(&set.name_any(), &pod.name_any()).unwrap_or(-1)];
                        self.reconcile_claim_owners(&set, std::slice::from_ref(pod), &doomed)
                            .await?;
                    }
                    self.delete_pod(&set, pod, *why).await
                }
                Step::FixIdentity { pod } => self.fix_identity(&set, pod).await,
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        self.reconcile_claim_owners(&set, &claimed, &plan.condemned)
            .await?;
        self.write_status(&set, plan.status.clone()).await?;
        result?;
        let live: HashSet<String> = claimed
            .iter()
            .map(|p| plan::revision_of(p).to_string())
            .chain([current_name.clone(), update_name.clone()])
            .collect();
        let after = history::revisions_of(&self.revisions, &uid, &ns);
        history::truncate(
            &self.client,
            &after,
            &live,
            spec.revision_history_limit.unwrap_or(10),
        )
        .await?;
        Ok(plan
            .requeue
            .map_or(Action::AwaitChange, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_identity_and_claims() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"]}}],
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}}
        }))
        .unwrap();
        let template = set.spec.clone().unwrap().template;
        let p = new_pod(&set, &template, "web-abc", 2);
        assert_eq!(p.metadata.name.as_deref(), Some("web-2"));
        assert_eq!(p.labels()[REVISION_LABEL], "web-abc");
        assert_eq!(p.labels()[POD_INDEX_LABEL], "2");
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let v = &spec.volumes.unwrap()[0];
        assert_eq!(
            v.persistent_volume_claim.as_ref().unwrap().claim_name,
            "www-web-2"
        );
        let owners = claim_owners(&set, None, false);
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "StatefulSet");
        assert_eq!(owners[0].controller, None);
    }

    #[test]
    fn condemned_claims_are_owned_by_their_pod_alone_under_when_scaled_delete() {
        let with = |when_scaled: &str, when_deleted: &str| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default", "uid": "set-uid"},
                "spec": {"serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]}},
                    "persistentVolumeClaimRetentionPolicy":
                        {"whenScaled": when_scaled, "whenDeleted": when_deleted}}
            }))
            .unwrap()
        };
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2", "namespace": "default", "uid": "pod-uid"}
        }))
        .unwrap();
        let owners = |set: &StatefulSet, condemned: bool| -> Vec<(String, String)> {
            claim_owners(set, Some(&pod), condemned)
                .into_iter()
                .map(|r| (r.kind, r.uid))
                .collect()
        };
        let set_ref = || ("StatefulSet".to_string(), "set-uid".to_string());
        let pod_ref = || ("Pod".to_string(), "pod-uid".to_string());
        // Both Delete: the set owns the claims of its replicas; a condemned pod's claim moves
        // to the pod alone, or the set's reference would keep it after the pod is gone.
        let both = with("Delete", "Delete");
        assert_eq!(owners(&both, false), [set_ref()]);
        assert_eq!(owners(&both, true), [pod_ref()]);
        let scaled = with("Delete", "Retain");
        assert!(owners(&scaled, false).is_empty());
        assert_eq!(owners(&scaled, true), [pod_ref()]);
        let deleted = with("Retain", "Delete");
        assert_eq!(owners(&deleted, false), [set_ref()]);
        assert_eq!(owners(&deleted, true), [set_ref()]);
        let retain = with("Retain", "Retain");
        assert!(owners(&retain, false).is_empty());
        assert!(owners(&retain, true).is_empty());
        // No pod to own it yet: the set's reference stays until there is one.
        assert_eq!(claim_owners(&both, None, true).len(), 1);
    }

    #[test]
    fn a_replaced_pods_reference_on_its_claim_is_replaced_and_others_kept() {
        let r = |kind: &str, name: &str, uid: &str| OwnerReference {
            api_version: if kind == "Pod" { "v1" } else { "apps/v1" }.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        };
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2", "namespace": "default", "uid": "new-pod"}
        }))
        .unwrap();
        let set_uids: HashSet<String> = ["set-uid".to_string()].into();
        let other = r("ConfigMap", "keep", "cm-uid");
        let uids = |refs: &[OwnerReference]| -> Vec<String> {
            refs.iter().map(|r| r.uid.clone()).collect()
        };
        // The old web-2 (deleted, re-created) still owns the claim under whenScaled: Delete:
        // its reference goes, the new pod's comes, an unrelated owner stays.
        let have = [other.clone(), r("Pod", "web-2", "old-pod")];
        let want = [r("Pod", "web-2", "new-pod")];
        let merged = merged_claim_owners(&have, &want, &set_uids, &pod).unwrap();
        assert_eq!(uids(&merged), ["cm-uid", "new-pod"]);
        // Already as wanted: nothing to write.
        assert_eq!(merged_claim_owners(&merged, &want, &set_uids, &pod), None);
        // The pod's claim back to the set (scaled up again): the pod's goes, the set's comes.
        let want = [r("StatefulSet", "web", "set-uid")];
        let merged = merged_claim_owners(&merged, &want, &set_uids, &pod).unwrap();
        assert_eq!(uids(&merged), ["cm-uid", "set-uid"]);
        // Retain: every managed reference removed, a pod of another name untouched.
        let have = [r("Pod", "web-1", "p1"), r("StatefulSet", "web", "set-uid")];
        let merged = merged_claim_owners(&have, &[], &set_uids, &pod).unwrap();
        assert_eq!(uids(&merged), ["p1"]);
    }
}
