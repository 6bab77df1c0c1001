//! Owner references: finding an object's controller, making a controller reference, the
//! "children by controller uid" index, and adoption and release of children (client-go's
//! ControllerRefManager): a controller adopts orphans its selector matches and releases the
//! children it owns that no longer match, with strategic-merge patches keyed by uid, the
//! child's uid as a precondition (so a recreated child of the same name is never touched).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::controller::{api_code, ReconcileError};
use super::informer::{Cached, Informer};
use super::key::ObjectKey;
use crate::machinery::LabelSelector;

/// The index of children by the uid of their controller.
pub const BY_CONTROLLER_UID: &str = "controller-uid";

/// The index of children without a controller, by namespace (adoption candidates).
pub const ORPHANS_BY_NAMESPACE: &str = "orphans-by-namespace";

/// The owner reference marked `controller: true`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// A controller reference to `owner` (blockOwnerDeletion set, as Kubernetes' controllers do).
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The cached object of kind `K` that reference `r` (from an object in `namespace`) names:
/// same kind and API group, same name, and the same uid (a recreated object of the same name
/// is not the owner).
pub fn resolve<K: Cached + Resource<DynamicType = ()>>(
    informer: &Informer<K>,
    namespace: &str,
    r: &OwnerReference,
) -> Option<ObjectKey> {
    let group = K::group(&());
    let group_matches = match r.api_version.split_once('/') {
        Some((g, _)) => g == group,
        None => group.is_empty(),
    };
    if r.kind != K::kind(&()) || !group_matches {
        return None;
    }
    let owner = informer.get_namespaced(namespace, &r.name)?;
    (owner.uid().as_deref() == Some(r.uid.as_str())).then(|| ObjectKey::of(owner.as_ref()))
}

/// Index function: the uid of the object's controller.
pub fn index_by_controller_uid<K: Resource>(obj: &K) -> Vec<String> {
    controller_of(obj.meta())
        .map(|r| r.uid.clone())
        .into_iter()
        .collect()
}

/// Index function: the namespace of an object that has no controller.
pub fn index_orphans_by_namespace<K: Resource>(obj: &K) -> Vec<String> {
    if controller_of(obj.meta()).is_none() {
        vec![obj.namespace().unwrap_or_default()]
    } else {
        Vec::new()
    }
}

/// Makes `owner` the controller of `child` (which must have no controller now).
pub async fn adopt<C, O>(api: &Api<C>, owner: &O, child: &C) -> Result<(), ReconcileError>
where
    C: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    O: Resource<DynamicType = ()>,
{
    let patch = json!({
        "metadata": {
            "ownerReferences": [controller_ref(owner)],
            "uid": child.uid(),
        }
    });
    patch_ignoring_gone(api, &child.name_any(), patch).await
}

/// Removes `owner_uid`'s reference from `child` (its labels no longer match).
pub async fn release<C>(api: &Api<C>, owner_uid: &str, child: &C) -> Result<(), ReconcileError>
where
    C: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": owner_uid}],
            "uid": child.uid(),
        }
    });
    patch_ignoring_gone(api, &child.name_any(), patch).await
}

/// A gone child (404) or a different one under the same name (uid precondition, 409/422)
/// needs nothing more: the next reconcile sees the truth.
async fn patch_ignoring_gone<C>(
    api: &Api<C>,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), ReconcileError>
where
    C: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// client-go's ControllerRefManager claim: the children `owner` controls once those its
/// `selector` no longer matches are released and matching orphans (not being deleted) are
/// adopted. An owner being deleted only keeps what it has; orphans are adopted only while the
/// owner, read again from the API, is still live with the same uid (the cache may lag a
/// deletion: client-go's RecheckDeletionTimestamp). An empty selector adopts nothing.
pub async fn claim<O, C>(
    client: &Client,
    owner: &O,
    selector: &LabelSelector,
    children: &Informer<C>,
) -> Result<Vec<Arc<C>>, ReconcileError>
where
    O: Cached + Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    C: Cached + Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    let ns = owner.namespace().unwrap_or_default();
    let uid = owner.uid().unwrap_or_default();
    let api: Api<C> = Api::namespaced(client.clone(), &ns);
    let deleting = owner.meta().deletion_timestamp.is_some();
    let mut claimed = Vec::new();
    for child in children.by_index(BY_CONTROLLER_UID, &uid) {
        if child.namespace().as_deref() != Some(ns.as_str()) {
            continue;
        }
        if selector.matches(child.labels()) {
            claimed.push(child);
        } else if !deleting {
            release(&api, &uid, child.as_ref()).await?;
        }
    }
    if deleting || selector.is_everything() {
        return Ok(claimed);
    }
    let orphans: Vec<Arc<C>> = children
        .by_index(ORPHANS_BY_NAMESPACE, &ns)
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none() && selector.matches(c.labels()))
        .collect();
    if orphans.is_empty() {
        return Ok(claimed);
    }
    let fresh = Api::<O>::namespaced(client.clone(), &ns)
        .get_opt(&owner.name_any())
        .await?;
    if fresh
        .as_ref()
        .is_none_or(|f| f.uid() != owner.uid() || f.meta().deletion_timestamp.is_some())
    {
        return Ok(claimed);
    }
    for child in orphans {
        adopt(&api, owner, child.as_ref()).await?;
        claimed.push(child);
    }
    Ok(claimed)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    #[test]
    fn finds_the_controller_among_owners() {
        let mut rs = ReplicaSet::default();
        rs.metadata.name = Some("web-1".into());
        rs.metadata.uid = Some("u1".into());
        let r = controller_ref(&rs);
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str()),
            ("apps/v1", "ReplicaSet")
        );
        let mut pod = Pod::default();
        assert!(index_by_controller_uid(&pod).is_empty());
        assert_eq!(index_orphans_by_namespace(&pod), vec![String::new()]);
        let mut other = r.clone();
        other.controller = None;
        other.uid = "u0".into();
        pod.metadata.owner_references = Some(vec![other, r]);
        assert_eq!(controller_of(&pod.metadata).unwrap().uid, "u1");
        assert_eq!(index_by_controller_uid(&pod), vec!["u1".to_string()]);
        assert!(index_orphans_by_namespace(&pod).is_empty());
    }
}
