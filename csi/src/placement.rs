//! Placement of claims of Immediate classes (the controller Deployment). A volume of this
//! driver lives on one node, and provisioning is distributed (each node's plugin provisions
//! the claims placed on its node), so a claim that no scheduler places (its class binds
//! Immediately, before any pod) is placed here: on a node whose CSINode lists the driver,
//! the one with the fewest bytes provisioned, by setting `volume.kubernetes.io/selected-node`
//! as the scheduler does for WaitForFirstConsumer claims.
//!
//! Scale: the bytes per node are kept incrementally from PersistentVolume events (each
//! event moves one volume's capacity), the registered nodes come from an index of CSINodes
//! by driver, and only claims of this driver's Immediate classes without a node are queued;
//! a placement costs O(registered nodes). The claims are reconciled one at a time by the
//! control plane's controller runtime (`control_plane::runtime::Controller`, controller name
//! `placement`), failures retried with back-off (1 s doubling to 5 min).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use control_plane::runtime::controller::{api_code, involved};
use control_plane::runtime::queue::Backoff;
use control_plane::runtime::{
    Action, Change, Controller, EventSink, EventType, Informer, Metrics, ObjectKey, ReconcileError,
    Reconciler, Recorder, WorkQueue,
};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::provisioner::{quantity_bytes, volume_node, SELECTED_NODE};
use crate::runtime::StopOnDrop;

/// Retries of one claim: 1 s doubling up to 5 min.
const RETRY: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(300),
};
/// The controller's name in the runtime's metrics and logs.
const NAME: &str = "placement";
/// CSINodes by the drivers they list.
const BY_DRIVER: &str = "placement.drivers";
/// Claims by class name.
const BY_CLASS: &str = "placement.class";

/// The bytes provisioned per node, and the claims placed but not provisioned yet (so that
/// claims placed at once spread out instead of all going to the emptiest node).
#[derive(Default)]
struct Load {
    /// Sum of the capacities of this driver's volumes, by node.
    provisioned: HashMap<String, i64>,
    /// Claims placed here and not yet provisioned: claim uid -> (node, requested bytes).
    placed: HashMap<String, (String, i64)>,
}

impl Load {
    fn of(&self, node: &str) -> i64 {
        let placed: i64 = self
            .placed
            .values()
            .filter(|(n, _)| n == node)
            .map(|(_, b)| *b)
            .sum();
        self.provisioned.get(node).copied().unwrap_or(0) + placed
    }

    fn add(&mut self, node: &str, bytes: i64) {
        let v = self.provisioned.entry(node.to_string()).or_insert(0);
        *v += bytes;
        if *v == 0 {
            self.provisioned.remove(node);
        }
    }
}

impl Load {
    /// Follows one volume change: its old capacity leaves its node, its new one arrives.
    fn track(&mut self, change: &Change<PersistentVolume>, driver: &str) {
        let (old, new) = match change {
            Change::Added(v) => (None, Some(v)),
            Change::Updated { old, new } => (Some(old), Some(new)),
            Change::Deleted(v) => (Some(v), None),
        };
        if let Some((node, bytes)) = old.and_then(|v| volume_load(v, driver)) {
            self.add(&node, -bytes);
        }
        if let Some(v) = new {
            if let Some((node, bytes)) = volume_load(v, driver) {
                self.add(&node, bytes);
            }
            // Provisioned: the volume's own capacity counts from now on.
            if let Some(uid) = volume_claim_uid(v) {
                self.placed.remove(uid);
            }
        }
    }
}

/// What a volume of `driver` adds to its node's load.
fn volume_load(pv: &PersistentVolume, driver: &str) -> Option<(String, i64)> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.as_ref()?.driver != driver {
        return None;
    }
    let node = volume_node(pv)?.to_string();
    let bytes = quantity_bytes(&spec.capacity.as_ref()?.get("storage")?.0)?;
    Some((node, bytes))
}

/// The uid of the claim a volume is (pre-)bound to.
fn volume_claim_uid(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref()
}

/// Whether a class is this driver's and binds at once.
fn immediate_class_of(class: &StorageClass, driver: &str) -> bool {
    class.provisioner == driver
        && class
            .volume_binding_mode
            .as_deref()
            .is_none_or(|m| m == "Immediate")
}

/// Whether a claim waits for a node: not being deleted, unbound, no selected node.
fn needs_node(claim: &PersistentVolumeClaim) -> bool {
    let spec = claim.spec.as_ref();
    claim.meta().deletion_timestamp.is_none()
        && spec
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
        && claim
            .annotations()
            .get(SELECTED_NODE)
            .is_none_or(|n| n.is_empty())
        && spec
            .and_then(|s| s.storage_class_name.as_deref())
            .is_some_and(|c| !c.is_empty())
}

fn claim_class(claim: &PersistentVolumeClaim) -> String {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

fn claim_request(claim: &PersistentVolumeClaim) -> i64 {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity_bytes(&q.0))
        .unwrap_or(0)
}

/// The least loaded of `nodes` (by name on a tie, so the choice is stable).
fn least_loaded<'a>(nodes: impl IntoIterator<Item = &'a str>, load: &Load) -> Option<String> {
    nodes
        .into_iter()
        .map(|n| (load.of(n), n))
        .min()
        .map(|(_, n)| n.to_string())
}

struct Placement {
    client: Client,
    driver: String,
    claims: Informer<PersistentVolumeClaim>,
    classes: Informer<StorageClass>,
    csinodes: Informer<CSINode>,
    load: Arc<Mutex<Load>>,
    recorder: Recorder,
    /// Claims that found no node with the driver: queued again when a node registers it.
    waiting: Arc<Mutex<BTreeSet<ObjectKey>>>,
}

impl Placement {
    fn lock_load(&self) -> std::sync::MutexGuard<'_, Load> {
        lock(&self.load)
    }

    /// Places the claim `key` if it still needs a node. Err: retry after back-off.
    async fn sync(&self, key: &ObjectKey) -> Result<(), String> {
        let Some(claim) = self.claims.get(key) else {
            return Ok(());
        };
        if !needs_node(&claim) {
            return Ok(());
        }
        let class_name = claim_class(&claim);
        let Some(class) = self.classes.get(&ObjectKey::cluster(&class_name)) else {
            // The class's own event brings the claim back (BY_CLASS).
            return Ok(());
        };
        if !immediate_class_of(&class, &self.driver) {
            return Ok(());
        }
        let nodes = self.csinodes.by_index(BY_DRIVER, &self.driver);
        let chosen = {
            let load = self.lock_load();
            least_loaded(
                nodes
                    .iter()
                    .map(|n| n.meta().name.as_deref().unwrap_or_default()),
                &load,
            )
        };
        let Some(node) = chosen else {
            let message = format!("no node has the driver {} registered", self.driver);
            self.recorder.event(
                claim.as_ref(),
                EventType::Warning,
                "ProvisioningFailed",
                message.clone(),
            );
            return Err(message);
        };
        let patch = json!({"metadata": {
            "annotations": {SELECTED_NODE: node},
            "resourceVersion": claim.resource_version(),
        }});
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), key.namespace_or_empty());
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => return Ok(()),
            // 409: changed meanwhile; the change comes back through the watch too.
            Err(e) => return Err(format!("setting {SELECTED_NODE} failed: {e}")),
        }
        if let Some(uid) = claim.uid() {
            self.lock_load()
                .placed
                .insert(uid, (node.clone(), claim_request(&claim)));
        }
        tracing::info!(claim = %format!("{}/{}", key.namespace_or_empty(), key.name), %node, "claim placed");
        Ok(())
    }
}

fn lock(load: &Mutex<Load>) -> std::sync::MutexGuard<'_, Load> {
    load.lock().unwrap_or_else(|p| p.into_inner())
}

impl Reconciler for Placement {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        match self.sync(key).await {
            Ok(()) => Ok(Action::AwaitChange),
            Err(error) => {
                self.waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone());
                Err(ReconcileError::Retry(error))
            }
        }
    }

    fn involved_object(&self, key: &ObjectKey) -> Option<(Recorder, ObjectReference)> {
        involved(&self.claims, key, &self.recorder)
    }
}

/// Places the claims of `driver`'s Immediate classes until the returned future is dropped;
/// `metrics` are the controller runtime's (the binary's
/// [`crate::metrics::Metrics::controllers`]).
pub async fn run(client: Client, driver: String, metrics: Metrics) -> anyhow::Result<()> {
    let token = CancellationToken::new();
    let queue: WorkQueue<ObjectKey> = WorkQueue::with_backoff(RETRY);
    let _stop = StopOnDrop {
        token: token.clone(),
        queue: queue.clone(),
    };
    let claims: Informer<PersistentVolumeClaim> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let volumes: Informer<PersistentVolume> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let classes: Informer<StorageClass> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let csinodes: Informer<CSINode> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    csinodes.add_index(BY_DRIVER, |n: &CSINode| {
        n.spec.drivers.iter().map(|d| d.name.clone()).collect()
    });
    claims.add_index(BY_CLASS, |c: &PersistentVolumeClaim| vec![claim_class(c)]);
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "skiff-csi-controller".into());
    let events = EventSink::start(client.clone(), host, token.clone());
    let component: &'static str = Box::leak(format!("{driver}_placement").into_boxed_str());
    let load = Arc::new(Mutex::new(Load::default()));
    let waiting: Arc<Mutex<BTreeSet<ObjectKey>>> = Arc::default();
    let p = Arc::new(Placement {
        client,
        driver: driver.clone(),
        claims: claims.clone(),
        classes: classes.clone(),
        csinodes: csinodes.clone(),
        load: load.clone(),
        recorder: events.recorder(component),
        waiting: waiting.clone(),
    });

    let (q, l) = (queue.clone(), load.clone());
    claims.on_change(move |c| {
        let claim = c.object();
        if let Some(uid) = claim.uid() {
            let mut load = lock(&l);
            // A claim that went, or whose node was taken back (its provisioner gave up),
            // no longer weighs on the node it was placed on.
            let stale = load.placed.get(&uid).is_some_and(|(node, _)| {
                matches!(c, Change::Deleted(_))
                    || claim.annotations().get(SELECTED_NODE) != Some(node)
            });
            if stale {
                load.placed.remove(&uid);
            }
        }
        if !matches!(c, Change::Deleted(_)) && needs_node(claim) {
            q.add(ObjectKey::of(claim.as_ref()));
        }
    });
    let (d, l) = (driver.clone(), load.clone());
    volumes.on_change(move |c| lock(&l).track(c, &d));
    let (q, d, cl) = (queue.clone(), driver.clone(), claims.clone());
    classes.on_change(move |c| {
        if let Change::Deleted(_) = c {
            return;
        }
        if immediate_class_of(c.object(), &d) {
            for claim in cl.by_index(BY_CLASS, &c.object().name_any()) {
                if needs_node(&claim) {
                    q.add(ObjectKey::of(claim.as_ref()));
                }
            }
        }
    });
    // A node registering the driver: the claims that found none are tried again (the
    // queue only holds those that failed; they are in back-off).
    let (q, d, w) = (queue.clone(), driver.clone(), waiting.clone());
    csinodes.on_change(move |c| {
        let has = |n: &CSINode| n.spec.drivers.iter().any(|x| x.name == d);
        let newly = match c {
            Change::Added(n) => has(n),
            Change::Updated { old, new } => has(new) && !has(old),
            Change::Deleted(_) => false,
        };
        if newly {
            for key in std::mem::take(&mut *w.lock().unwrap_or_else(|p| p.into_inner())) {
                q.add(key);
            }
        }
    });

    let informers = async {
        tokio::join!(
            claims.clone().run(token.clone()),
            volumes.clone().run(token.clone()),
            classes.clone().run(token.clone()),
            csinodes.clone().run(token.clone()),
        );
    };
    let controller = Controller::new(NAME, p.clone(), queue.clone(), 1, metrics);
    let worker = async {
        // The load must be complete before the first choice.
        volumes.wait_synced().await;
        csinodes.wait_synced().await;
        classes.wait_synced().await;
        claims.wait_synced().await;
        tracing::info!(driver = %p.driver, "placement started");
        controller.run(token.clone()).await;
    };
    tokio::join!(informers, worker);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "local.csi.skiff.io";

    fn pv(driver: &str, node: &str, size: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "v"},
            "spec": {"capacity": {"storage": size},
                "csi": {"driver": driver, "volumeHandle": "h"},
                "claimRef": {"uid": "c1"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": crate::provisioner::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn volumes_of_the_driver_weigh_on_their_node() {
        assert_eq!(
            volume_load(&pv(DRIVER, "n1", "2Gi"), DRIVER),
            Some(("n1".to_string(), 2 << 30))
        );
        assert_eq!(volume_load(&pv("other.csi", "n1", "2Gi"), DRIVER), None);
        assert_eq!(volume_claim_uid(&pv(DRIVER, "n1", "1Gi")), Some("c1"));
    }

    #[test]
    fn the_load_follows_volume_events() {
        let mut load = Load::default();
        load.placed.insert("c1".into(), ("n1".into(), 5));
        let a = Arc::new(pv(DRIVER, "n1", "2Gi"));
        load.track(&Change::Added(a.clone()), DRIVER);
        // The claim's reservation gave way to its volume.
        assert_eq!(load.of("n1"), 2 << 30);
        let grown = Arc::new(pv(DRIVER, "n1", "3Gi"));
        load.track(
            &Change::Updated {
                old: a,
                new: grown.clone(),
            },
            DRIVER,
        );
        assert_eq!(load.of("n1"), 3 << 30);
        load.track(
            &Change::Added(Arc::new(pv("other.csi", "n1", "7Gi"))),
            DRIVER,
        );
        assert_eq!(load.of("n1"), 3 << 30);
        load.track(&Change::Deleted(grown), DRIVER);
        assert_eq!(load.of("n1"), 0);
        assert!(load.provisioned.is_empty() && load.placed.is_empty());
    }

    #[test]
    fn the_least_loaded_node_wins_placed_claims_count_and_ties_go_by_name() {
        let mut load = Load::default();
        assert_eq!(least_loaded(["b", "a"], &load).as_deref(), Some("a"));
        load.add("a", 10);
        assert_eq!(least_loaded(["a", "b"], &load).as_deref(), Some("b"));
        load.placed.insert("u".into(), ("b".into(), 20));
        assert_eq!(least_loaded(["a", "b"], &load).as_deref(), Some("a"));
        load.add("a", -10);
        assert_eq!(load.of("a"), 0);
        assert!(load.provisioned.is_empty());
        assert_eq!(least_loaded(std::iter::empty(), &load), None);
    }

    #[test]
    fn only_unplaced_unbound_claims_of_immediate_classes_of_the_driver() {
        let class = |mode: Option<&str>, provisioner: &str| -> StorageClass {
            serde_json::from_value(
                json!({"metadata": {"name": "c"}, "provisioner": provisioner,
                "volumeBindingMode": mode}),
            )
            .unwrap()
        };
        assert!(immediate_class_of(&class(None, DRIVER), DRIVER));
        assert!(immediate_class_of(
            &class(Some("Immediate"), DRIVER),
            DRIVER
        ));
        assert!(!immediate_class_of(
            &class(Some("WaitForFirstConsumer"), DRIVER),
            DRIVER
        ));
        assert!(!immediate_class_of(&class(None, "other.csi"), DRIVER));
        let claim = |extra: serde_json::Value| -> PersistentVolumeClaim {
            let mut v = json!({"metadata": {"name": "d", "namespace": "ns"},
                "spec": {"storageClassName": "c"}});
            if let (Some(m), Some(e)) =
                (v["metadata"].as_object_mut(), extra["metadata"].as_object())
            {
                m.extend(e.clone());
            }
            if let (Some(s), Some(e)) = (v["spec"].as_object_mut(), extra["spec"].as_object()) {
                s.extend(e.clone());
            }
            serde_json::from_value(v).unwrap()
        };
        assert!(needs_node(&claim(json!({}))));
        assert!(!needs_node(&claim(json!({"spec": {"volumeName": "pv"}}))));
        assert!(!needs_node(&claim(
            json!({"metadata": {"annotations": {SELECTED_NODE: "n1"}}})
        )));
        assert!(!needs_node(&claim(
            json!({"spec": {"storageClassName": ""}})
        )));
        assert!(!needs_node(&claim(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
    }
}
