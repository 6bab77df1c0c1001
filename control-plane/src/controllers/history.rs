//! ControllerRevisions: the history of a StatefulSet's or a DaemonSet's pod template, which
//! `kubectl rollout history` lists and `kubectl rollout undo` applies back (Kubernetes'
//! controller history, shared by both controllers).
//!
//! A revision holds the template as the patch that restores it
//! (`{"spec":{"template":{...,"$patch":"replace"}}}`), is named `<parent>-<hash>` (the
//! template's pod-template-hash, the same function Deployments use, with a collision count),
//! carries the template's labels (kubectl finds revisions by the parent's selector), the hash
//! under the parent kind's label ([`HashLabel`]) and the parent's annotations, and is
//! controlled by its parent. A template equal to an older revision's reuses it with the next
//! revision number, so an undo does not grow the history.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{json, Value};

use super::deployment::util::pod_template_hash;
use crate::runtime::controller::api_code;
use crate::runtime::owner::{self, BY_CONTROLLER_UID};
use crate::runtime::{Informer, ReconcileError};

/// The label with a revision's hash.
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// Which label of a revision carries its hash: Kubernetes' StatefulSet controller uses the
/// generic one, the DaemonSet controller the label its pods carry too, so a pod names the
/// revision it was made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashLabel {
    /// `controller.kubernetes.io/hash` ([`HASH_LABEL`]).
    Generic,
    /// `controller-revision-hash`, shared with the pods.
    PodRevision,
}

impl HashLabel {
    pub fn key(self) -> &'static str {
        match self {
            HashLabel::Generic => HASH_LABEL,
            HashLabel::PodRevision => POD_REVISION_LABEL,
        }
    }
}

/// The label of a DaemonSet's pods (and of its revisions) with the revision's hash.
pub const POD_REVISION_LABEL: &str = "controller-revision-hash";
/// Names longer than this leave no room for the hash.
const MAX_PREFIX: usize = 223;

/// The patch a revision of `template` holds.
pub fn patch_of(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Some(o) = t.as_object_mut() {
        o.insert("$patch".into(), json!("replace"));
    }
    json!({ "spec": { "template": t } })
}

/// The template a revision restores.
pub fn template_of(cr: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = cr.data.as_ref()?.0.pointer("/spec/template")?.clone();
    if let Some(o) = t.as_object_mut() {
        o.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// `<parent>-<hash>` (Kubernetes' ControllerRevisionName).
pub fn revision_name(parent: &str, hash: &str) -> String {
    let prefix = if parent.len() > MAX_PREFIX {
        &parent[..MAX_PREFIX]
    } else {
        parent
    };
    format!("{prefix}-{hash}")
}

fn same_template(cr: &ControllerRevision, template: &PodTemplateSpec) -> bool {
    template_of(cr).as_ref() == Some(template)
}

/// The revisions `parent` controls, oldest first.
pub fn revisions_of(
    revisions: &Informer<ControllerRevision>,
    uid: &str,
    ns: &str,
) -> Vec<Arc<ControllerRevision>> {
    let mut out: Vec<Arc<ControllerRevision>> = revisions
        .by_index(BY_CONTROLLER_UID, uid)
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(ns))
        .collect();
    out.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    out
}

/// The revision for `template` (created, or reused with the next number), and the collision
/// count it took; the hash goes under `label`.
pub async fn ensure<K>(
    client: &Client,
    parent: &K,
    existing: &[Arc<ControllerRevision>],
    template: &PodTemplateSpec,
    collision_count: i32,
    label: HashLabel,
) -> Result<(ControllerRevision, i32), ReconcileError>
where
    K: Resource<DynamicType = ()>,
{
    let ns = parent.namespace().unwrap_or_default();
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let next = existing.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    if let Some(latest) = existing.last().filter(|r| same_template(r, template)) {
        return Ok((latest.as_ref().clone(), collision_count));
    }
    if let Some(older) = existing.iter().rev().find(|r| same_template(r, template)) {
        // An undo: the old revision becomes the newest.
        let updated = api
            .patch(
                &older.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "revision": next })),
            )
            .await?;
        return Ok((updated, collision_count));
    }
    let mut collisions = collision_count;
    loop {
        let hash = pod_template_hash(template, Some(collisions).filter(|c| *c > 0));
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(label.key().into(), hash.clone());
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(revision_name(&parent.name_any(), &hash)),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: parent.meta().annotations.clone().filter(|a| !a.is_empty()),
                owner_references: Some(vec![owner::controller_ref(parent)]),
                ..Default::default()
            },
            data: Some(RawExtension(patch_of(template))),
            revision: next,
        };
        match api.create(&PostParams::default(), &cr).await {
            Ok(created) => return Ok((created, collisions)),
            Err(e) if api_code(&e) == Some(409) => {
                let found = api.get(&cr.name_any()).await?;
                let ours =
                    owner::controller_of(found.meta()).map(|r| &r.uid) == parent.uid().as_ref();
                if ours && same_template(&found, template) {
                    return Ok((found, collisions));
                }
                // Another template (or parent) holds this name: hash again.
                collisions += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Deletes the oldest revisions no pod uses beyond `limit` (`live` names the ones in use).
pub async fn truncate(
    client: &Client,
    revisions: &[Arc<ControllerRevision>],
    live: &HashSet<String>,
    limit: i32,
) -> Result<(), ReconcileError> {
    let history: Vec<&Arc<ControllerRevision>> = revisions
        .iter()
        .filter(|r| !live.contains(&r.name_any()))
        .collect();
    let surplus = history
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(0));
    for r in &history[..surplus] {
        let api: Api<ControllerRevision> =
            Api::namespaced(client.clone(), &r.namespace().unwrap_or_default());
        match api.delete(&r.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_restores_its_template() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
        }))
        .unwrap();
        let data = patch_of(&template);
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        let cr = ControllerRevision {
            data: Some(RawExtension(data)),
            ..Default::default()
        };
        assert_eq!(template_of(&cr), Some(template.clone()));
        assert!(same_template(&cr, &template));
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "h").len(), MAX_PREFIX + 2);
    }
}
