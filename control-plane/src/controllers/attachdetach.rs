//! The attach/detach controller (kube-controller-manager's `attachdetach`) for CSI volumes:
//! a volume whose driver must be attached to a node before the node can stage it (its
//! CSIDriver says `attachRequired: true`, or the driver has no CSIDriver object, which
//! Kubernetes also reads as "attach required") gets a storage.k8s.io/v1 VolumeAttachment
//! for each node that runs a pod using it; the driver's external attacher acts on it
//! (ControllerPublishVolume) and reports `status.attached`. When no pod on the node uses
//! the volume any more (deleted, finished, or moved) the VolumeAttachment is deleted, which
//! the attacher answers with ControllerUnpublishVolume. skiff's own driver has
//! `attachRequired: false`: none of its volumes ever get one.
//!
//! The desired state of the world is an index kept by the informers' handlers: for every
//! pod, the `(node, volume)` pairs it needs attached, and for every pair the pods that need
//! it. A pod, claim, volume or CSIDriver event recomputes only the pods it concerns (pods
//! by the claims they mount, claims by their volume, volumes by their driver) and enqueues
//! only the pairs whose pod sets it touched, so an event costs O(what changed), never a
//! list of the cluster. The actual state is the VolumeAttachments (indexed by pair and by
//! node); reconciling a pair creates or deletes its attachment.
//!
//! A volume is detached only once its node no longer reports it in `status.volumesInUse`
//! (the kubelet's list of mounted volumes), or after [`MAX_WAIT_FOR_UNMOUNT`], as
//! Kubernetes' reconciler does, so a volume is not pulled from under a staged mount.
//!
//! As Kubernetes' controller does, `Node.status.volumesAttached` lists the node's volumes
//! whose attachment reports `attached: true` (`kubernetes.io/csi/<driver>^<volumeHandle>`),
//! written through the node's status subresource.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    AttachedVolume, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "attachdetach";
/// The component on its Events, as Kubernetes writes it.
pub const COMPONENT: &str = "attachdetach-controller";
/// The prefix of a CSI volume's unique name (`kubernetes.io/csi/<driver>^<volumeHandle>`).
pub const CSI_PLUGIN_PREFIX: &str = "kubernetes.io/csi/";

/// How long a detach waits for the node to stop reporting the volume in use
/// (kube-controller-manager's maxWaitForUnmountDuration).
pub const MAX_WAIT_FOR_UNMOUNT: Duration = Duration::from_secs(6 * 60);

/// Pods by `namespace/claim` of every claim they mount.
const POD_BY_CLAIM: &str = "attachdetach.claims";
/// Claims by the volume they are bound to (`spec.volumeName`).
const PVC_BY_VOLUME: &str = "attachdetach.volume";
/// Volumes by their CSI driver.
const PV_BY_DRIVER: &str = "attachdetach.driver";
/// VolumeAttachments by `node/volume`.
const VA_BY_PAIR: &str = "attachdetach.pair";
/// VolumeAttachments by node.
const VA_BY_NODE: &str = "attachdetach.node";

/// Kubernetes' VolumeAttachment name: `csi-` and the sha256 (hex) of the volume handle,
/// the driver and the node name, concatenated.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let mut h = Sha256::new();
    h.update(volume_handle.as_bytes());
    h.update(driver.as_bytes());
    h.update(node.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// The unique name Kubernetes gives a CSI volume in `Node.status.volumesAttached` (and the
/// kubelet in `volumesInUse`).
pub fn unique_volume_name(driver: &str, volume_handle: &str) -> String {
    format!("{CSI_PLUGIN_PREFIX}{driver}^{volume_handle}")
}

/// What the controller works on: one volume on one node, or one node's status.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Volume { node: String, pv: String },
    Node(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Volume { node, pv } => write!(f, "{pv} on {node}"),
            Key::Node(n) => write!(f, "node {n}"),
        }
    }
}

type Pair = (String, String);

fn pod_key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// `namespace/claim` of each claim `pod` mounts.
fn claims_of(pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| format!("{ns}/{}", c.claim_name))
        .collect()
}

/// The node of a pod that may still use its volumes: scheduled, not Succeeded or Failed.
fn active_node(pod: &Pod) -> Option<&str> {
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if finished {
        return None;
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// A volume's CSI driver and handle.
fn csi_source(pv: &PersistentVolume) -> Option<(&str, &str)> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    Some((csi.driver.as_str(), csi.volume_handle.as_str()))
}

fn va_pair(va: &VolumeAttachment) -> Option<Pair> {
    let pv = va.spec.source.persistent_volume_name.as_deref()?;
    Some((va.spec.node_name.clone(), pv.to_string()))
}

fn va_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

fn va_error(va: &VolumeAttachment, attach: bool) -> Option<String> {
    let s = va.status.as_ref()?;
    let e = if attach {
        s.attach_error.as_ref()
    } else {
        s.detach_error.as_ref()
    }?;
    e.message.clone().filter(|m| !m.is_empty())
}

/// The desired state of the world: which pods need which volume attached to which node.
#[derive(Default)]
struct Desired {
    /// Pod (`namespace/name`) -> the pairs it needs.
    by_pod: HashMap<String, BTreeSet<Pair>>,
    /// Pair -> the pods that need it.
    by_pair: HashMap<Pair, BTreeSet<String>>,
}

/// The caches the desired state is computed from.
#[derive(Clone)]
struct Caches {
    pods: Informer<Pod>,
    claims: Informer<PersistentVolumeClaim>,
    volumes: Informer<PersistentVolume>,
    drivers: Informer<CSIDriver>,
    attachments: Informer<VolumeAttachment>,
    nodes: Informer<Node>,
    desired: Arc<Mutex<Desired>>,
    queue: WorkQueue<Key>,
}

impl Caches {
    /// Whether volumes of `driver` must be attached: its CSIDriver's `attachRequired`
    /// (true when unset), true without a CSIDriver object.
    fn attach_required(&self, driver: &str) -> bool {
        self.drivers
            .get(&ObjectKey::cluster(driver))
            .is_none_or(|d| d.spec.attach_required.unwrap_or(true))
    }

    /// The volume claim `key` (`namespace/name`) is bound to, if it needs attaching.
    fn attachable_volume(&self, key: &str) -> Option<String> {
        let (ns, name) = key.split_once('/')?;
        let claim = self.claims.get_namespaced(ns, name)?;
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let pv_name = claim
            .spec
            .as_ref()?
            .volume_name
            .as_deref()
            .filter(|v| !v.is_empty())?;
        if !bound {
            return None;
        }
        let pv = self.volumes.get(&ObjectKey::cluster(pv_name))?;
        let (driver, _) = csi_source(&pv)?;
        self.attach_required(driver).then(|| pv_name.to_string())
    }

    /// The pairs `pod` needs now.
    fn pairs_of(&self, pod: &Pod) -> BTreeSet<Pair> {
        let Some(node) = active_node(pod) else {
            return BTreeSet::new();
        };
        claims_of(pod)
            .iter()
            .filter_map(|c| self.attachable_volume(c))
            .map(|pv| (node.to_string(), pv))
            .collect()
    }

    /// Recomputes the pods named `keys` (gone ones need nothing) and enqueues every pair
    /// whose pod set changed. Holding the lock while reading the caches serialises the
    /// handlers of different informers: the last one sees every cache updated.
    fn refresh<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let mut d = self.desired.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            let now = match key.split_once('/') {
                Some((ns, name)) => self
                    .pods
                    .get_namespaced(ns, name)
                    .map(|p| self.pairs_of(&p))
                    .unwrap_or_default(),
                None => BTreeSet::new(),
            };
            let before = if now.is_empty() {
                d.by_pod.remove(key).unwrap_or_default()
            } else {
                d.by_pod
                    .insert(key.to_string(), now.clone())
                    .unwrap_or_default()
            };
            for gone in before.difference(&now) {
                if let Some(pods) = d.by_pair.get_mut(gone) {
                    pods.remove(key);
                    if pods.is_empty() {
                        d.by_pair.remove(gone);
                        self.queue.add(Key::Volume {
                            node: gone.0.clone(),
                            pv: gone.1.clone(),
                        });
                    }
                }
            }
            for new in now.difference(&before) {
                let pods = d.by_pair.entry(new.clone()).or_default();
                let first = pods.is_empty();
                pods.insert(key.to_string());
                if first {
                    self.queue.add(Key::Volume {
                        node: new.0.clone(),
                        pv: new.1.clone(),
                    });
                }
            }
        }
    }

    fn refresh_claim(&self, claim_key: &str) {
        let pods: Vec<String> = self
            .pods
            .by_index(POD_BY_CLAIM, claim_key)
            .iter()
            .map(|p| pod_key(p))
            .collect();
        self.refresh(pods.iter().map(String::as_str));
    }

    fn refresh_volume(&self, pv: &str) {
        for claim in self.claims.by_index(PVC_BY_VOLUME, pv) {
            self.refresh_claim(&format!(
                "{}/{}",
                claim.namespace().unwrap_or_default(),
                claim.name_any()
            ));
        }
    }

    fn pods_needing(&self, pair: &Pair) -> Vec<String> {
        let d = self.desired.lock().unwrap_or_else(|p| p.into_inner());
        d.by_pair
            .get(pair)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

pub struct AttachDetach {
    client: Client,
    caches: Caches,
    recorder: Recorder,
    /// When detaching each pair still mounted on its node was first wanted.
    detach_wanted: Mutex<HashMap<Pair, Instant>>,
}

pub fn build(ctx: &Context) -> Controller<AttachDetach> {
    let pods = ctx.informers.get::<Pod>();
    let claims = ctx.informers.get::<PersistentVolumeClaim>();
    let volumes = ctx.informers.get::<PersistentVolume>();
    let drivers = ctx.informers.get::<CSIDriver>();
    let attachments = ctx.informers.get::<VolumeAttachment>();
    let nodes = ctx.informers.get::<Node>();
    pods.add_index(POD_BY_CLAIM, claims_of);
    claims.add_index(PVC_BY_VOLUME, |c| {
        c.spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty())
            .into_iter()
            .collect()
    });
    volumes.add_index(PV_BY_DRIVER, |pv| {
        csi_source(pv)
            .map(|(d, _)| d.to_string())
            .into_iter()
            .collect()
    });
    attachments.add_index(VA_BY_PAIR, |va| {
        va_pair(va)
            .map(|(n, pv)| format!("{n}/{pv}"))
            .into_iter()
            .collect()
    });
    attachments.add_index(VA_BY_NODE, |va| vec![va.spec.node_name.clone()]);
    let queue: WorkQueue<Key> = WorkQueue::new();
    let caches = Caches {
        pods: pods.clone(),
        claims: claims.clone(),
        volumes: volumes.clone(),
        drivers: drivers.clone(),
        attachments: attachments.clone(),
        nodes: nodes.clone(),
        desired: Arc::default(),
        queue: queue.clone(),
    };
    let recorder = ctx.events.recorder(COMPONENT);
    {
        let c = caches.clone();
        pods.on_change(move |ch| c.refresh([pod_key(ch.object()).as_str()]));
    }
    {
        let c = caches.clone();
        claims.on_change(move |ch| {
            let claim = ch.object();
            c.refresh_claim(&format!(
                "{}/{}",
                claim.namespace().unwrap_or_default(),
                claim.name_any()
            ));
        });
    }
    {
        let c = caches.clone();
        volumes.on_change(move |ch| c.refresh_volume(&ch.object().name_any()));
    }
    {
        let c = caches.clone();
        drivers.on_change(move |ch| {
            for pv in c.volumes.by_index(PV_BY_DRIVER, &ch.object().name_any()) {
                c.refresh_volume(&pv.name_any());
            }
        });
    }
    {
        let (c, rec) = (caches.clone(), recorder.clone());
        attachments.on_change(move |ch| {
            let va = ch.object();
            let Some(pair) = va_pair(va) else { return };
            // Created, changed or deleted by someone else: the pair is checked again.
            c.queue.add(Key::Volume {
                node: pair.0.clone(),
                pv: pair.1.clone(),
            });
            let old = match ch {
                Change::Updated { old, .. } => Some(old.as_ref()),
                _ => None,
            };
            let gone = matches!(ch, Change::Deleted(_));
            if gone || old.map(va_attached) != Some(va_attached(va)) {
                c.queue.add(Key::Node(pair.0.clone()));
            }
            if gone {
                return;
            }
            // The attacher's errors, once per new message.
            if let Some(msg) = va_error(va, true) {
                if old.and_then(|o| va_error(o, true)).as_ref() != Some(&msg) {
                    let text =
                        format!("AttachVolume.Attach failed for volume {:?} : {msg}", pair.1);
                    for p in c.pods_needing(&pair) {
                        if let Some((ns, name)) = p.split_once('/') {
                            if let Some(pod) = c.pods.get_namespaced(ns, name) {
                                rec.event(
                                    pod.as_ref(),
                                    EventType::Warning,
                                    "FailedAttachVolume",
                                    text.clone(),
                                );
                            }
                        }
                    }
                }
            }
            if let Some(msg) = va_error(va, false) {
                if old.and_then(|o| va_error(o, false)).as_ref() != Some(&msg) {
                    rec.event_ref(
                        node_ref(&c.nodes, &pair.0),
                        EventType::Warning,
                        "FailedDetachVolume",
                        format!("DetachVolume.Detach failed for volume {:?} : {msg}", pair.1),
                    );
                }
            }
        });
    }
    {
        let c = caches.clone();
        nodes.on_change(move |ch| {
            let listed = |n: &Node| n.status.as_ref().and_then(|s| s.volumes_attached.clone());
            match ch {
                Change::Added(n) => c.queue.add(Key::Node(n.name_any())),
                Change::Updated { old, new } => {
                    if listed(old) != listed(new) {
                        c.queue.add(Key::Node(new.name_any()));
                    }
                    // A volume the node stopped using may be detached now.
                    let was = in_use(old);
                    if !was.is_empty() && was != in_use(new) {
                        let node = new.name_any();
                        for va in c.attachments.by_index(VA_BY_NODE, &node) {
                            if let Some((_, pv)) = va_pair(&va) {
                                c.queue.add(Key::Volume {
                                    node: node.clone(),
                                    pv,
                                });
                            }
                        }
                    }
                }
                Change::Deleted(_) => {}
            }
        });
    }
    Controller::new(
        NAME,
        Arc::new(AttachDetach {
            client: ctx.client.clone(),
            caches,
            recorder,
            detach_wanted: Mutex::default(),
        }),
        queue,
        4,
        ctx.metrics.clone(),
    )
}

/// The volumes a node reports mounted (`status.volumesInUse`, the kubelet's unique names).
fn in_use(n: &Node) -> BTreeSet<String> {
    n.status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn node_ref(nodes: &Informer<Node>, name: &str) -> ObjectReference {
    match nodes.get(&ObjectKey::cluster(name)) {
        Some(n) => n.object_ref(&()),
        None => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..Default::default()
        },
    }
}

impl AttachDetach {
    fn attachments_api(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    /// Warning `reason` with `message` on every pod that needs the pair.
    fn tell_pods(&self, pair: &Pair, reason: &'static str, message: &str) {
        for p in self.caches.pods_needing(pair) {
            if let Some((ns, name)) = p.split_once('/') {
                if let Some(pod) = self.caches.pods.get_namespaced(ns, name) {
                    self.recorder
                        .event(pod.as_ref(), EventType::Warning, reason, message);
                }
            }
        }
    }

    async fn sync_volume(&self, node: &str, pv_name: &str) -> Result<Action, ReconcileError> {
        let pair = (node.to_string(), pv_name.to_string());
        let wanted = !self.caches.pods_needing(&pair).is_empty();
        let existing = self
            .caches
            .attachments
            .by_index(VA_BY_PAIR, &format!("{node}/{pv_name}"));
        if wanted {
            self.detach_wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&pair);
            let Some(pv) = self.caches.volumes.get(&ObjectKey::cluster(pv_name)) else {
                return Ok(Action::AwaitChange);
            };
            let Some((driver, handle)) = csi_source(&pv) else {
                return Ok(Action::AwaitChange);
            };
            let name = attachment_name(handle, driver, node);
            if existing.iter().any(|va| va.name_any() == name) {
                return Ok(Action::AwaitChange);
            }
            let va: VolumeAttachment = serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": name},
                "spec": {"attacher": driver, "nodeName": node,
                    "source": {"persistentVolumeName": pv_name}}
            }))
            .map_err(|e| ReconcileError::Invalid(e.to_string()))?;
            match self
                .attachments_api()
                .create(&PostParams::default(), &va)
                .await
            {
                Ok(_) => {
                    tracing::info!(volume = pv_name, node, attachment = %name, "attach requested");
                    Ok(Action::AwaitChange)
                }
                // Ours already (a cache behind the server): the watch brings it.
                Err(e) if api_code(&e) == Some(409) => Ok(Action::AwaitChange),
                Err(e) => {
                    self.tell_pods(
                        &pair,
                        "FailedAttachVolume",
                        &format!("AttachVolume.Attach failed for volume {pv_name:?} : {e}"),
                    );
                    Err(e.into())
                }
            }
        } else {
            if let Some(wait) = self.unmount_wait(&pair) {
                return Ok(Action::RequeueAfter(wait));
            }
            for va in existing {
                if va.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: va.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match self.attachments_api().delete(&va.name_any(), &dp).await {
                    Ok(_) => {
                        tracing::info!(volume = pv_name, node, attachment = %va.name_any(), "detach requested")
                    }
                    Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                    Err(e) => {
                        self.recorder.event_ref(
                            node_ref(&self.caches.nodes, node),
                            EventType::Warning,
                            "FailedDetachVolume",
                            format!("DetachVolume.Detach failed for volume {pv_name:?} : {e}"),
                        );
                        return Err(e.into());
                    }
                }
            }
            Ok(Action::AwaitChange)
        }
    }

    /// How long detaching the pair must still wait: while its node reports the volume in
    /// `status.volumesInUse` (still mounted), up to [`MAX_WAIT_FOR_UNMOUNT`] from the
    /// moment the detach was first wanted, as Kubernetes' reconciler waits (a node that
    /// never reports unmounting, e.g. one that is gone, does not hold the volume forever).
    fn unmount_wait(&self, pair: &Pair) -> Option<Duration> {
        let mut since = self.detach_wanted.lock().unwrap_or_else(|p| p.into_inner());
        let mounted = self
            .caches
            .nodes
            .get(&ObjectKey::cluster(&pair.0))
            .zip(self.caches.volumes.get(&ObjectKey::cluster(&pair.1)))
            .is_some_and(|(n, pv)| {
                csi_source(&pv).is_some_and(|(d, h)| in_use(&n).contains(&unique_volume_name(d, h)))
            });
        if !mounted {
            since.remove(pair);
            return None;
        }
        let first = *since.entry(pair.clone()).or_insert_with(Instant::now);
        let left = MAX_WAIT_FOR_UNMOUNT.saturating_sub(first.elapsed());
        if left.is_zero() {
            tracing::warn!(volume = %pair.1, node = %pair.0, "still in use after the maximum wait for unmount: detaching");
            since.remove(pair);
            return None;
        }
        tracing::debug!(volume = %pair.1, node = %pair.0, "volume still mounted: detach waits");
        Some(left)
    }

    /// The node's `status.volumesAttached`: its attachments that report attached.
    async fn sync_node(&self, node: &str) -> Result<Action, ReconcileError> {
        let Some(n) = self.caches.nodes.get(&ObjectKey::cluster(node)) else {
            return Ok(Action::AwaitChange);
        };
        let mut want: Vec<AttachedVolume> = self
            .caches
            .attachments
            .by_index(VA_BY_NODE, node)
            .iter()
            .filter(|va| va_attached(va))
            .filter_map(|va| {
                let pv_name = va.spec.source.persistent_volume_name.as_deref()?;
                let pv = self.caches.volumes.get(&ObjectKey::cluster(pv_name))?;
                let (driver, handle) = csi_source(&pv)?;
                Some(AttachedVolume {
                    name: unique_volume_name(driver, handle),
                    device_path: String::new(),
                })
            })
            .collect();
        want.sort_by(|a, b| a.name.cmp(&b.name));
        want.dedup_by(|a, b| a.name == b.name);
        let have = n
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.clone())
            .unwrap_or_default();
        if have == want {
            return Ok(Action::AwaitChange);
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"status": {"volumesAttached": want}});
        match nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Action::AwaitChange),
            Err(e) if api_code(&e) == Some(404) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

impl Reconciler for AttachDetach {
    type Key = Key;

    async fn reconcile(&self, key: &Key) -> Result<Action, ReconcileError> {
        match key {
            Key::Volume { node, pv } => self.sync_volume(node, pv).await,
            Key::Node(node) => self.sync_node(node).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachment_names_are_kubernetes_ones() {
        // sha256("vol-1" + "attach.example.com" + "n1"), as Kubernetes' csi attacher names it.
        // (`printf vol-1attach.example.comn1 | sha256sum`).
        let want = "csi-b8489f011cdd54032a0cfcebdf0344156831640920cbd6fae46a0722ff68ed21";
        assert_eq!(attachment_name("vol-1", "attach.example.com", "n1"), want);
        assert_ne!(
            attachment_name("vol-1", "attach.example.com", "n1"),
            attachment_name("vol-1", "attach.example.com", "n2")
        );
        assert_eq!(
            unique_volume_name("attach.example.com", "vol-1"),
            "kubernetes.io/csi/attach.example.com^vol-1"
        );
    }

    #[test]
    fn finished_and_unscheduled_pods_need_nothing() {
        let pod = |node: Option<&str>, phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"containers": [], "nodeName": node,
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        assert_eq!(active_node(&pod(Some("n1"), "Running")), Some("n1"));
        assert_eq!(active_node(&pod(Some("n1"), "Pending")), Some("n1"));
        assert_eq!(active_node(&pod(None, "Pending")), None);
        assert_eq!(active_node(&pod(Some("n1"), "Succeeded")), None);
        assert_eq!(active_node(&pod(Some("n1"), "Failed")), None);
        assert_eq!(claims_of(&pod(Some("n1"), "Running")), ["ns/c"]);
    }
}
