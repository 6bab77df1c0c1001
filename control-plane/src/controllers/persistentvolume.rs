//! The PersistentVolume binder (kube-controller-manager's `persistentvolume-binder`): binds
//! claims to volumes, asks external provisioners for volumes, and moves volumes through
//! Available, Bound, Released and Failed.
//!
//! - A claim without `spec.volumeName` takes a volume pre-bound to it (`spec.claimRef`, the
//!   provisioner's or an admin's), else the smallest Available volume of its class that
//!   satisfies it (capacity, access modes, volumeMode, selector; for a WaitForFirstConsumer
//!   class, one whose node affinity admits the node the scheduler selected). Binding writes,
//!   in Kubernetes' order, the volume's claimRef, the volume's phase, the claim's volumeName
//!   and annotations, then the claim's phase, capacity and access modes: a crash between
//!   steps leaves a state the next sync completes.
//! - A claim no volume satisfies is handed to the class's external provisioner
//!   (`volume.kubernetes.io/storage-provisioner`): at once for an Immediate class, once the
//!   scheduler has set `volume.kubernetes.io/selected-node` for a WaitForFirstConsumer one.
//! - A volume whose claim is gone is Released, then reclaimed by its policy: Retain keeps
//!   it; Delete is the external provisioner's for volumes it provisioned (a volume nobody
//!   provisioned has no deleter: Failed, as Kubernetes does for in-tree volumes without a
//!   deleter plugin); Recycle is refused (Failed).
//! - A bound claim asking for more storage than its volume has, in a class that allows
//!   expansion, gets `status.allocatedResources` and `volume.kubernetes.io/storage-resizer`
//!   (the volume's CSI driver), the state an external resizer acts on.
//!
//! Scale: volumes are indexed by the claim they name and (unclaimed ones) by class, claims
//! waiting for a volume by class, so a claim event looks at its own pre-bound volumes and
//! at the free volumes of its class, and a volume event at its claim, or (a free volume)
//! at the claims waiting in its class. Writes carry the resourceVersion read, so two
//! workers never bind one volume to two claims: the loser gets a conflict and retries from
//! the cache.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::Context;
use crate::machinery::{node_selector_matches, LabelSelector, Quantity};
use crate::runtime::controller::{api_code, involved};
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "persistentvolume-binder";
/// The component on its Events, as Kubernetes writes it.
pub const COMPONENT: &str = "persistentvolume-controller";

pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const ANN_STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";
/// On a volume the resizer grew before its node grew the filesystem: the claim's capacity
/// before the resize (Kubernetes' name).
pub const PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";
/// The class annotation that preceded `storageClassName` (still honoured).
pub const ANN_BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The provisioner of classes whose volumes are only ever created by hand.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

pub const MSG_NO_CLASS: &str =
    "no persistent volumes available for this claim and no storage class is set";
pub const MSG_WAIT_FOR_FIRST_CONSUMER: &str =
    "waiting for first consumer to be created before binding";

/// Volumes by `namespace/name` of the claim their claimRef names.
const PV_BY_CLAIM: &str = "pvbinder.claim";
/// Volumes without a claimRef, by class ("" for none).
const PV_FREE_BY_CLASS: &str = "pvbinder.free";
/// Claims without a volumeName, by class.
const PVC_WAITING_BY_CLASS: &str = "pvbinder.waiting";

fn annotation<'a, K: Resource>(o: &'a K, key: &str) -> Option<&'a str> {
    o.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// A claim's class: `spec.storageClassName`, else the beta annotation, else "" (none).
pub fn claim_class(c: &PersistentVolumeClaim) -> String {
    if let Some(a) = annotation(c, ANN_BETA_CLASS) {
        return a.to_string();
    }
    c.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// A volume's class, read as a claim's is.
pub fn volume_class(pv: &PersistentVolume) -> String {
    if let Some(a) = annotation(pv, ANN_BETA_CLASS) {
        return a.to_string();
    }
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// `namespace/name` of a claim.
pub fn claim_key(c: &PersistentVolumeClaim) -> String {
    format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())
}

/// `namespace/name` of the claim a volume's claimRef names.
pub fn claim_ref_key(pv: &PersistentVolume) -> Option<String> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    let name = r.name.as_deref().filter(|n| !n.is_empty())?;
    Some(format!(
        "{}/{name}",
        r.namespace.as_deref().unwrap_or_default()
    ))
}

fn claim_ref_uid(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()?
        .claim_ref
        .as_ref()?
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
}

/// Whether `pv`'s claimRef names `claim` (by name, and by uid when it has one).
pub fn is_bound_to(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    claim_ref_key(pv).as_deref() == Some(claim_key(claim).as_str())
        && claim_ref_uid(pv).is_none_or(|u| Some(u) == claim.metadata.uid.as_deref())
}

pub fn volume_phase(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub fn claim_phase(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The volume a claim is bound to (its non-empty `spec.volumeName`).
pub fn volume_name(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
}

fn nanos(q: &ApiQuantity) -> Option<i128> {
    Quantity::parse(&q.0).ok().map(|q| q.nano_value())
}

/// The storage a claim asks for (0 if none).
pub fn claim_request(c: &PersistentVolumeClaim) -> i128 {
    c.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(nanos)
        .unwrap_or(0)
}

/// A volume's storage capacity (0 if none).
pub fn volume_capacity(pv: &PersistentVolume) -> i128 {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(nanos)
        .unwrap_or(0)
}

fn volume_mode_of(mode: Option<&String>) -> &str {
    mode.map(String::as_str)
        .filter(|m| !m.is_empty())
        .unwrap_or("Filesystem")
}

/// Whether `pv` can serve `claim`: the same class, enough capacity, every access mode the
/// claim asks for, the same volumeMode, and labels the claim's selector matches. Err says
/// why not.
pub fn volume_satisfies(
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<(), String> {
    let spec = pv.spec.clone().unwrap_or_default();
    let cs = claim.spec.clone().unwrap_or_default();
    let (pv_class, class) = (volume_class(pv), claim_class(claim));
    if pv_class != class {
        return Err(format!(
            "storageClassName does not match: volume has {pv_class:?}, claim asks for {class:?}"
        ));
    }
    if volume_capacity(pv) < claim_request(claim) {
        return Err("requested PV is too small".into());
    }
    let have: HashSet<&str> = spec
        .access_modes
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if let Some(m) = cs
        .access_modes
        .iter()
        .flatten()
        .find(|m| !have.contains(m.as_str()))
    {
        return Err(format!("access mode {m} is not offered by the volume"));
    }
    if volume_mode_of(spec.volume_mode.as_ref()) != volume_mode_of(cs.volume_mode.as_ref()) {
        return Err("incompatible volumeMode".into());
    }
    if let Some(sel) = cs.selector.as_ref() {
        let matches = LabelSelector::from_meta(sel)
            .map(|s| s.matches(pv.labels()))
            .unwrap_or(false);
        if !matches {
            return Err("the claim's selector does not match the volume's labels".into());
        }
    }
    Ok(())
}

/// Whether the volume's required node affinity admits `node` (a volume without one is
/// reachable from every node).
pub fn node_affinity_admits(pv: &PersistentVolume, node: &Node) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    static NONE: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&NONE);
    node_selector_matches(
        required,
        labels,
        node.metadata.name.as_deref().unwrap_or(""),
    )
}

/// A volume a claim could take now: no claimRef, not being deleted, Available (or not yet
/// synced: Pending).
pub fn is_free(pv: &PersistentVolume) -> bool {
    claim_ref_key(pv).is_none()
        && pv.metadata.deletion_timestamp.is_none()
        && matches!(volume_phase(pv), "" | "Pending" | "Available")
}

/// Of `candidates`, the smallest free volume that satisfies `claim` and `admits` (ties by
/// name, so two binders agree).
pub fn best_match(
    candidates: &[Arc<PersistentVolume>],
    claim: &PersistentVolumeClaim,
    admits: impl Fn(&PersistentVolume) -> bool,
) -> Option<Arc<PersistentVolume>> {
    candidates
        .iter()
        .filter(|pv| is_free(pv) && volume_satisfies(pv, claim).is_ok() && admits(pv))
        .min_by(|a, b| {
            volume_capacity(a)
                .cmp(&volume_capacity(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        })
        .cloned()
}

/// Whether a class delays binding until a pod using the claim is scheduled.
pub fn delays_binding(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER)
}

/// The free volumes of `class` (`volumes` must carry the binder's indexes).
pub fn free_volumes_of_class(
    volumes: &Informer<PersistentVolume>,
    class: &str,
) -> Vec<Arc<PersistentVolume>> {
    volumes.by_index(PV_FREE_BY_CLASS, class)
}

/// Adds the binder's volume indexes (by claim, free ones by class) to `volumes`.
pub fn index_volumes(volumes: &Informer<PersistentVolume>) {
    volumes.add_index(PV_BY_CLAIM, |pv| claim_ref_key(pv).into_iter().collect());
    volumes.add_index(PV_FREE_BY_CLASS, |pv| {
        if claim_ref_key(pv).is_none() {
            vec![volume_class(pv)]
        } else {
            vec![]
        }
    });
}

pub struct Binder {
    client: Client,
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    classes: Informer<StorageClass>,
    nodes: Informer<Node>,
    recorder: Recorder,
    /// Claims (by uid) told they wait for their first consumer: that Event is written once.
    told_to_wait: Mutex<HashSet<String>>,
}

fn claim_object_key(key: &str) -> Option<ObjectKey> {
    key.split_once('/')
        .map(|(ns, name)| ObjectKey::namespaced(ns, name))
}

pub fn build(ctx: &Context) -> Controller<Binder> {
    let claims = ctx.informers.get::<PersistentVolumeClaim>();
    let volumes = ctx.informers.get::<PersistentVolume>();
    let classes = ctx.informers.get::<StorageClass>();
    let nodes = ctx.informers.get::<Node>();
    index_volumes(&volumes);
    claims.add_index(PVC_WAITING_BY_CLASS, |c| {
        if volume_name(c).is_none() {
            vec![claim_class(c)]
        } else {
            vec![]
        }
    });
    // Claims are namespaced keys, volumes cluster-scoped ones: one queue serves both.
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    {
        let (q, vols) = (queue.clone(), volumes.clone());
        claims.on_change(move |c| {
            let claim = c.object();
            q.add(ObjectKey::of(claim.as_ref()));
            if matches!(c, Change::Deleted(_)) {
                // Its volumes are released.
                for pv in vols.by_index(PV_BY_CLAIM, &claim_key(claim)) {
                    q.add(ObjectKey::of(pv.as_ref()));
                }
            }
        });
    }
    {
        let (q, waiting) = (queue.clone(), claims.clone());
        volumes.on_change(move |c| {
            let pv = c.object();
            q.add(ObjectKey::of(pv.as_ref()));
            match claim_ref_key(pv) {
                Some(k) => {
                    if let Some(key) = claim_object_key(&k) {
                        q.add(key);
                    }
                }
                None if !matches!(c, Change::Deleted(_)) => {
                    // A free volume: the claims waiting in its class may take it.
                    for claim in waiting.by_index(PVC_WAITING_BY_CLASS, &volume_class(pv)) {
                        q.add(ObjectKey::of(claim.as_ref()));
                    }
                }
                None => {}
            }
        });
    }
    {
        let (q, waiting) = (queue.clone(), claims.clone());
        classes.on_change(move |c| {
            for claim in waiting.by_index(PVC_WAITING_BY_CLASS, &c.object().name_any()) {
                q.add(ObjectKey::of(claim.as_ref()));
            }
        });
    }
    Controller::new(
        NAME,
        Arc::new(Binder {
            client: ctx.client.clone(),
            claims,
            volumes,
            classes,
            nodes,
            recorder: ctx.events.recorder(COMPONENT),
            told_to_wait: Mutex::new(HashSet::new()),
        }),
        queue,
        4,
        ctx.metrics.clone(),
    )
}

impl Binder {
    fn claims_api(&self, ns: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn volumes_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectKey::cluster(name))
    }

    async fn sync_claim(
        &self,
        claim: Arc<PersistentVolumeClaim>,
    ) -> Result<Action, ReconcileError> {
        match volume_name(&claim) {
            None => self.sync_unbound_claim(&claim).await,
            Some(v) => {
                let v = v.to_string();
                self.sync_claim_with_volume(&claim, &v).await
            }
        }
    }

    async fn sync_unbound_claim(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Action, ReconcileError> {
        if claim.metadata.deletion_timestamp.is_some() {
            return Ok(Action::AwaitChange);
        }
        // A volume pre-bound to this claim (by the provisioner or an admin) is its own.
        let pre_bound = self
            .volumes
            .by_index(PV_BY_CLAIM, &claim_key(claim))
            .into_iter()
            .filter(|pv| is_bound_to(pv, claim) && pv.metadata.deletion_timestamp.is_none())
            .min_by_key(|pv| pv.name_any());
        if let Some(pv) = pre_bound {
            return match volume_satisfies(&pv, claim) {
                Ok(()) => self.bind(&pv, claim).await,
                Err(why) => {
                    self.recorder.event(
                        claim,
                        EventType::Warning,
                        "VolumeMismatch",
                        format!("Cannot bind to requested volume {:?}: {why}", pv.name_any()),
                    );
                    Ok(Action::AwaitChange)
                }
            };
        }
        let class_name = claim_class(claim);
        let class = (!class_name.is_empty())
            .then(|| self.class(&class_name))
            .flatten();
        let delayed = class.as_deref().is_some_and(delays_binding);
        let selected = annotation(claim, ANN_SELECTED_NODE);
        if delayed && selected.is_none() {
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            let first = self
                .told_to_wait
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uid);
            if first {
                self.recorder.event(
                    claim,
                    EventType::Normal,
                    "WaitForFirstConsumer",
                    MSG_WAIT_FOR_FIRST_CONSUMER,
                );
            }
            return Ok(Action::AwaitChange);
        }
        if let Some(uid) = claim.metadata.uid.as_deref() {
            // Past waiting (a node is selected): a later wait is told again.
            self.told_to_wait
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(uid);
        }
        // A free volume of the class; for a delayed class, one the selected node reaches.
        let node = selected.and_then(|n| self.nodes.get(&ObjectKey::cluster(n)));
        let candidates = free_volumes_of_class(&self.volumes, &class_name);
        let best = best_match(&candidates, claim, |pv| {
            !delayed || node.as_deref().is_some_and(|n| node_affinity_admits(pv, n))
        });
        if let Some(pv) = best {
            return self.bind(&pv, claim).await;
        }
        if class_name.is_empty() {
            self.recorder
                .event(claim, EventType::Normal, "FailedBinding", MSG_NO_CLASS);
            return Ok(Action::AwaitChange);
        }
        let Some(class) = class else {
            self.recorder.event(
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!("storageclass.storage.k8s.io {class_name:?} not found"),
            );
            return Ok(Action::AwaitChange);
        };
        self.provision(claim, &class).await
    }

    /// Hands the claim to its class's external provisioner (the annotations it watches
    /// for), as Kubernetes does for a provisioner without an in-tree plugin.
    async fn provision(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<Action, ReconcileError> {
        let provisioner = class.provisioner.as_str();
        if provisioner.starts_with("kubernetes.io/") {
            // No in-tree plugins here: no-provisioner classes and the like never provision.
            self.recorder.event(
                claim,
                EventType::Warning,
                "ProvisioningFailed",
                format!(
                    "Failed to create provisioner: no volume plugin matched name: {provisioner}"
                ),
            );
            return Ok(Action::AwaitChange);
        }
        let set = annotation(claim, ANN_STORAGE_PROVISIONER) == Some(provisioner)
            && annotation(claim, ANN_BETA_STORAGE_PROVISIONER) == Some(provisioner);
        if set {
            return Ok(Action::AwaitChange);
        }
        let patch = json!({"metadata": {
            "resourceVersion": claim.resource_version(),
            "annotations": {
                ANN_STORAGE_PROVISIONER: provisioner,
                ANN_BETA_STORAGE_PROVISIONER: provisioner,
            }
        }});
        let api = self.claims_api(&claim.namespace().unwrap_or_default());
        match api
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(claim = %claim_key(claim), provisioner, "waiting for the external provisioner");
                self.recorder.event(
                    claim,
                    EventType::Normal,
                    "ExternalProvisioning",
                    format!(
                        "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator"
                    ),
                );
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }

    /// The claim names a volume: complete the binding, or notice the volume is lost.
    async fn sync_claim_with_volume(
        &self,
        claim: &PersistentVolumeClaim,
        volume: &str,
    ) -> Result<Action, ReconcileError> {
        let bound = claim_phase(claim) == "Bound";
        let Some(pv) = self.volumes.get(&ObjectKey::cluster(volume)) else {
            if bound {
                self.set_claim_phase(claim, "Lost").await?;
                self.recorder.event(
                    claim,
                    EventType::Warning,
                    "ClaimLost",
                    "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                );
            }
            // Not yet bound: the user asked for a volume that does not exist (yet).
            return Ok(Action::AwaitChange);
        };
        if claim_ref_key(&pv).is_none() {
            // The user asked for this volume; it is free.
            return match volume_satisfies(&pv, claim) {
                Ok(()) if is_free(&pv) => self.bind(&pv, claim).await,
                Ok(()) => Ok(Action::AwaitChange),
                Err(why) => {
                    self.recorder.event(
                        claim,
                        EventType::Warning,
                        "VolumeMismatch",
                        format!("Cannot bind to requested volume {volume:?}: {why}"),
                    );
                    Ok(Action::AwaitChange)
                }
            };
        }
        if is_bound_to(&pv, claim) {
            let action = self.bind(&pv, claim).await?;
            self.sync_resize(claim, &pv).await?;
            return Ok(action);
        }
        if bound {
            self.set_claim_phase(claim, "Lost").await?;
            self.recorder.event(
                claim,
                EventType::Warning,
                "ClaimMisbound",
                "Two claims are bound to the same volume, this one is bound incorrectly",
            );
        } else {
            self.recorder.event(
                claim,
                EventType::Warning,
                "FailedBinding",
                format!("volume {volume:?} already bound to a different claim."),
            );
        }
        Ok(Action::AwaitChange)
    }

    /// Binds `pv` and `claim`, each step only if not done yet (so it also completes a
    /// binding another sync began).
    async fn bind(
        &self,
        pv: &PersistentVolume,
        claim: &PersistentVolumeClaim,
    ) -> Result<Action, ReconcileError> {
        let ns = claim.namespace().unwrap_or_default();
        let pv_name = pv.name_any();
        let volumes = self.volumes_api();
        let mut pv = pv.clone();
        // 1. The volume's claimRef (with the claim's uid).
        let uid_set = claim_ref_uid(&pv).is_some_and(|u| Some(u) == claim.metadata.uid.as_deref());
        if !uid_set {
            let mut meta = json!({"resourceVersion": pv.resource_version()});
            if claim_ref_key(&pv).is_none() {
                meta["annotations"] = json!({ANN_BOUND_BY_CONTROLLER: "yes"});
            }
            let patch = json!({"metadata": meta, "spec": {"claimRef": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": ns,
                "name": claim.name_any(),
                "uid": claim.metadata.uid,
                "resourceVersion": claim.resource_version(),
            }}});
            pv = match volumes
                .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(p) => p,
                Err(e) if api_code(&e) == Some(409) => {
                    // Someone else changed (or took) it first: retry from the cache.
                    return Err(ReconcileError::Retry(format!(
                        "volume {pv_name} changed while binding"
                    )));
                }
                Err(e) => return Err(e.into()),
            };
        }
        // 2. The volume's phase.
        if volume_phase(&pv) != "Bound" {
            let patch = json!({"status": {"phase": "Bound", "message": null, "reason": null}});
            volumes
                .patch_status(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        // 3. The claim's volumeName and annotations.
        let claims = self.claims_api(&ns);
        let mut claim = claim.clone();
        let needs_name = volume_name(&claim) != Some(pv_name.as_str());
        if needs_name || annotation(&claim, ANN_BIND_COMPLETED).is_none() {
            let mut annotations = json!({ANN_BIND_COMPLETED: "yes"});
            if needs_name {
                annotations[ANN_BOUND_BY_CONTROLLER] = json!("yes");
            }
            let patch = json!({
                "metadata": {"resourceVersion": claim.resource_version(), "annotations": annotations},
                "spec": {"volumeName": pv_name},
            });
            claim = match claims
                .patch(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(c) => c,
                Err(e) if api_code(&e) == Some(404) => return Ok(Action::AwaitChange),
                Err(e) if api_code(&e) == Some(409) => {
                    return Err(ReconcileError::Retry(format!(
                        "claim {} changed while binding",
                        claim_key(&claim)
                    )));
                }
                Err(e) => return Err(e.into()),
            };
        }
        // 4. The claim's phase, capacity and access modes, from the volume. The capacity is
        // set when the claim becomes Bound (or has none): later, a resize grows the volume
        // before the node grows its filesystem, and the claim's capacity is what the node
        // reports, as Kubernetes does. A volume mid-resize gives its size before the resize.
        let spec = pv.spec.clone().unwrap_or_default();
        let status = claim.status.clone().unwrap_or_default();
        let capacity = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PRE_RESIZE_CAPACITY))
            .map(|q| ApiQuantity(q.clone()))
            .or_else(|| {
                spec.capacity
                    .as_ref()
                    .and_then(|c| c.get("storage"))
                    .cloned()
            });
        let modes = spec.access_modes.clone().unwrap_or_default();
        let has_capacity = status
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .is_some();
        let done = status.phase.as_deref() == Some("Bound")
            && has_capacity
            && status.access_modes.as_deref().unwrap_or_default() == modes.as_slice();
        if !done {
            let mut patch = json!({"status": {"phase": "Bound", "accessModes": modes}});
            let becomes_bound = status.phase.as_deref() != Some("Bound") || !has_capacity;
            if let Some(q) = capacity.filter(|_| becomes_bound) {
                patch["status"]["capacity"] = json!({"storage": q});
            }
            match claims
                .patch_status(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(claim = %claim_key(&claim), volume = %pv_name, "bound");
                }
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::AwaitChange)
    }

    async fn set_claim_phase(
        &self,
        claim: &PersistentVolumeClaim,
        phase: &str,
    ) -> Result<(), ReconcileError> {
        if claim_phase(claim) == phase {
            return Ok(());
        }
        let patch = json!({"status": {"phase": phase}});
        match self
            .claims_api(&claim.namespace().unwrap_or_default())
            .patch_status(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Err(e) if api_code(&e) != Some(404) => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// A bound claim asking for more than its volume has, in a class that allows
    /// expansion: the state an external resizer acts on.
    async fn sync_resize(
        &self,
        claim: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<(), ReconcileError> {
        let want = claim_request(claim);
        let status = claim.status.clone().unwrap_or_default();
        let has = status
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .and_then(nanos)
            .unwrap_or_else(|| volume_capacity(pv));
        if want <= has || claim_phase(claim) != "Bound" {
            return Ok(());
        }
        let expandable = self
            .class(&claim_class(claim))
            .is_some_and(|c| c.allow_volume_expansion == Some(true));
        if !expandable {
            return Ok(());
        }
        let Some(driver) = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.driver.clone())
        else {
            return Ok(());
        };
        let Some(request) = claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned()
        else {
            return Ok(());
        };
        let api = self.claims_api(&claim.namespace().unwrap_or_default());
        let name = claim.name_any();
        if annotation(claim, ANN_STORAGE_RESIZER) != Some(driver.as_str()) {
            let patch = json!({"metadata": {"annotations": {ANN_STORAGE_RESIZER: driver}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            self.recorder.event(
                claim,
                EventType::Normal,
                "ExternalExpanding",
                "waiting for an external controller to expand this PVC",
            );
        }
        let allocated = status
            .allocated_resources
            .as_ref()
            .and_then(|a| a.get("storage"))
            .and_then(nanos);
        if allocated != nanos(&request) {
            let patch = json!({"status": {"allocatedResources": {"storage": request}}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    async fn sync_volume(&self, pv: Arc<PersistentVolume>) -> Result<Action, ReconcileError> {
        if pv.metadata.deletion_timestamp.is_some() {
            return Ok(Action::AwaitChange);
        }
        let Some(key) = claim_ref_key(&pv) else {
            // Nobody's: Available.
            return self.set_volume_phase(&pv, "Available", None).await;
        };
        let Some(uid) = claim_ref_uid(&pv).map(str::to_string) else {
            // Pre-bound by name only: Available until its claim binds it.
            return self.set_volume_phase(&pv, "Available", None).await;
        };
        let claim = match self.claim(&key).await? {
            Some(c) if c.metadata.uid.as_deref() == Some(uid.as_str()) => c,
            _ => return self.release(&pv).await,
        };
        match volume_name(&claim) {
            // The claim binds it on its own sync.
            None => Ok(Action::AwaitChange),
            Some(v) if v == pv.name_any() => self.set_volume_phase(&pv, "Bound", None).await,
            Some(_) => {
                // The claim went to another volume.
                if annotation(pv.as_ref(), ANN_BOUND_BY_CONTROLLER).is_some() {
                    let patch = json!({
                        "metadata": {"resourceVersion": pv.resource_version(),
                            "annotations": {ANN_BOUND_BY_CONTROLLER: null}},
                        "spec": {"claimRef": null},
                    });
                    self.volumes_api()
                        .patch(
                            &pv.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?;
                }
                self.set_volume_phase(&pv, "Available", None).await
            }
        }
    }

    /// The claim `namespace/name`: the cache, else the API (a claim just created may not
    /// be cached yet, and releasing its volume would be wrong).
    async fn claim(&self, key: &str) -> Result<Option<Arc<PersistentVolumeClaim>>, ReconcileError> {
        let Some(k) = claim_object_key(key) else {
            return Ok(None);
        };
        if let Some(c) = self.claims.get(&k) {
            return Ok(Some(c));
        }
        Ok(self
            .claims_api(k.namespace_or_empty())
            .get_opt(&k.name)
            .await?
            .map(Arc::new))
    }

    async fn set_volume_phase(
        &self,
        pv: &PersistentVolume,
        phase: &str,
        message: Option<&str>,
    ) -> Result<Action, ReconcileError> {
        let current = pv.status.as_ref();
        if volume_phase(pv) == phase && current.and_then(|s| s.message.as_deref()) == message {
            return Ok(Action::AwaitChange);
        }
        let patch = json!({"status": {"phase": phase, "message": message}});
        match self
            .volumes_api()
            .patch_status(
                &pv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(volume = %pv.name_any(), phase, "volume phase");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }

    /// The volume's claim is gone: Released, then its reclaim policy.
    async fn release(&self, pv: &PersistentVolume) -> Result<Action, ReconcileError> {
        if volume_phase(pv) == "Failed" {
            return Ok(Action::AwaitChange);
        }
        if volume_phase(pv) != "Released" {
            self.set_volume_phase(pv, "Released", None).await?;
        }
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        match policy {
            "Delete" if annotation(pv, ANN_PROVISIONED_BY).is_some() => {
                // The provisioner that made it deletes it.
                Ok(Action::AwaitChange)
            }
            "Delete" => {
                let msg = format!(
                    "error getting deleter volume plugin for volume {:?}: no deletable volume plugin matched",
                    pv.name_any()
                );
                self.recorder
                    .event(pv, EventType::Warning, "VolumeFailedDelete", msg.clone());
                self.set_volume_phase(pv, "Failed", Some(&msg)).await
            }
            "Recycle" => {
                let msg = "No recycler plugin found for the volume!";
                self.recorder
                    .event(pv, EventType::Warning, "VolumeFailedRecycle", msg);
                self.set_volume_phase(pv, "Failed", Some(msg)).await
            }
            _ => Ok(Action::AwaitChange),
        }
    }
}

impl Reconciler for Binder {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        if key.namespace.is_some() {
            match self.claims.get(key) {
                Some(c) => self.sync_claim(c).await,
                None => Ok(Action::AwaitChange),
            }
        } else {
            match self.volumes.get(key) {
                Some(pv) => self.sync_volume(pv).await,
                None => Ok(Action::AwaitChange),
            }
        }
    }

    fn involved_object(
        &self,
        key: &ObjectKey,
    ) -> Option<(Recorder, k8s_openapi::api::core::v1::ObjectReference)> {
        if key.namespace.is_some() {
            involved(&self.claims, key, &self.recorder)
        } else {
            involved(&self.volumes, key, &self.recorder)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    fn claim(v: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }

    fn volume(name: &str, size: &str, class: &str, modes: &[&str]) -> Arc<PersistentVolume> {
        Arc::new(pv(json!({
            "metadata": {"name": name, "labels": {"tier": "fast"}},
            "spec": {"capacity": {"storage": size}, "accessModes": modes,
                "storageClassName": class, "hostPath": {"path": "/x"}},
            "status": {"phase": "Available"}
        })))
    }

    #[test]
    fn the_smallest_volume_that_satisfies_the_claim_wins() {
        let c = claim(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                "resources": {"requests": {"storage": "2Gi"}}}
        }));
        let vols = vec![
            volume("huge", "100Gi", "", &["ReadWriteOnce"]),
            volume("small", "1Gi", "", &["ReadWriteOnce"]),
            volume("fits", "3Gi", "", &["ReadWriteOnce", "ReadOnlyMany"]),
            volume("rox", "2Gi", "", &["ReadOnlyMany"]),
            volume("other-class", "2Gi", "gold", &["ReadWriteOnce"]),
        ];
        let best = best_match(&vols, &c, |_| true).unwrap();
        assert_eq!(best.name_any(), "fits");
        assert!(volume_satisfies(&vols[3], &c)
            .unwrap_err()
            .contains("ReadWriteOnce"));
        assert!(volume_satisfies(&vols[4], &c)
            .unwrap_err()
            .contains("storageClassName"));
        assert!(best_match(&vols, &c, |pv| pv.name_any() == "huge").is_some());
        assert!(best_match(&vols, &c, |_| false).is_none());
    }

    #[test]
    fn selectors_modes_and_claim_refs() {
        let c = claim(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                "selector": {"matchLabels": {"tier": "slow"}},
                "resources": {"requests": {"storage": "1Gi"}}}
        }));
        let v = volume("v", "1Gi", "", &["ReadWriteOnce"]);
        assert!(volume_satisfies(&v, &c).unwrap_err().contains("volumeMode"));
        let mut pre = (*v).clone();
        pre.spec.as_mut().unwrap().claim_ref =
            Some(serde_json::from_value(json!({"namespace": "ns", "name": "c"})).unwrap());
        assert!(is_bound_to(&pre, &c), "a name-only claimRef binds any uid");
        assert!(!is_free(&pre));
        pre.spec.as_mut().unwrap().claim_ref = Some(
            serde_json::from_value(json!({"namespace": "ns", "name": "c", "uid": "other"}))
                .unwrap(),
        );
        assert!(
            !is_bound_to(&pre, &c),
            "a claim of the same name but another uid"
        );
        assert_eq!(claim_ref_key(&pre).as_deref(), Some("ns/c"));
    }

    #[test]
    fn node_affinity_admits_only_matching_nodes() {
        let v = pv(json!({
            "metadata": {"name": "v"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.local.csi.skiff.io/node", "operator": "In", "values": ["b"]}]}]}}}
        }));
        let node = |name: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"topology.local.csi.skiff.io/node": name}}}))
            .unwrap()
        };
        assert!(node_affinity_admits(&v, &node("b")));
        assert!(!node_affinity_admits(&v, &node("a")));
        assert!(node_affinity_admits(
            &volume("free", "1Gi", "", &[]),
            &node("a")
        ));
    }
}
