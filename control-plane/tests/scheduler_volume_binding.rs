//! The scheduler's VolumeBinding with the PersistentVolume binder, against a real in-process
//! API server, the controllers, the scheduler and played nodes; the test plays the external
//! provisioner (it creates the volume pre-bound to the claim, on the selected node, as the
//! CSI design's provisioner does):
//! - a pod with a WaitForFirstConsumer claim gets `volume.kubernetes.io/selected-node` set on
//!   the claim and is not bound, quietly, until the volume exists; then it binds there;
//! - a missing claim and an unbound Immediate claim give FailedScheduling with Kubernetes'
//!   messages, and a claim created later brings the pod back;
//! - a selected node taken off an unbound claim (the provisioner gave up) gives the PreBind
//!   FailedScheduling and a new selection;
//! - a bound volume's node affinity decides the node;
//! - 200 pods with a claim each all go through selection and binding.

mod controllers_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);
const SELECTED: &str = "volume.kubernetes.io/selected-node";
const DRIVER: &str = "local.csi.skiff.io";

fn class(name: &str, mode: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": name}, "provisioner": DRIVER,
        "volumeBindingMode": mode, "reclaimPolicy": "Delete",
    }))
    .unwrap()
}

fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()
}

fn pod(name: &str, claims: &[&str]) -> Pod {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.local/app:v1"}],
            "volumes": volumes}
    }))
    .unwrap()
}

/// The volume a provisioner makes for `claim` on `node`: pre-bound, with the node's
/// affinity (played nodes carry `kubernetes.io/hostname`).
fn provisioned(claim: &PersistentVolumeClaim, node: &str) -> PersistentVolume {
    let uid = claim.metadata.uid.clone().unwrap();
    let class = claim.spec.as_ref().unwrap().storage_class_name.clone();
    serde_json::from_value(json!({
        "metadata": {"name": format!("pvc-{uid}"),
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "persistentVolumeReclaimPolicy": "Delete",
            "csi": {"driver": DRIVER, "volumeHandle": uid, "fsType": "ext4"},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": claim.namespace().unwrap(), "name": claim.name_any(), "uid": uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}
    }))
    .unwrap()
}

fn selected(c: &PersistentVolumeClaim) -> Option<String> {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SELECTED))
        .cloned()
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

async fn selected_node(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
) -> (PersistentVolumeClaim, String) {
    wait_until_async(&format!("a node selected for {name}"), WAIT, || async {
        let c = claims.get(name).await.map_err(|e| e.to_string())?;
        match selected(&c) {
            Some(n) => Ok((c, n)),
            None => Err("not yet".to_string()),
        }
    })
    .await
}

async fn bound_to(pods: &Api<Pod>, name: &str) -> String {
    wait_until_async(&format!("{name} bound"), WAIT, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        node_of(&p).ok_or_else(|| "pending".to_string())
    })
    .await
}

async fn events(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Waits for an event `reason` on `name` whose message contains `text`.
async fn event_with(client: &Client, name: &str, reason: &str, text: &str) -> Event {
    wait_until_async(&format!("{reason} on {name}: {text}"), WAIT, || async {
        events(client, name, reason)
            .await
            .into_iter()
            .find(|e| e.message.as_deref().is_some_and(|m| m.contains(text)))
            .ok_or_else(|| "not yet".to_string())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_wait_for_their_volumes_and_follow_them() {
    let c = Cluster::start(fast_settings(), &["node-a", "node-b"]).await;
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let pp = PostParams::default();
    Api::<StorageClass>::all(c.client.clone())
        .create(&pp, &class("late", "WaitForFirstConsumer"))
        .await
        .unwrap();
    Api::<StorageClass>::all(c.client.clone())
        .create(&pp, &class("now", "Immediate"))
        .await
        .unwrap();

    // WaitForFirstConsumer: a node is selected for the claim, the pod is not bound yet.
    claims.create(&pp, &claim("data", "late")).await.unwrap();
    pods.create(&pp, &pod("app", &["data"])).await.unwrap();
    let (data, node) = selected_node(&claims, "data").await;
    // The binder hands it to the provisioner (it has seen the selection) ...
    event_with(&c.client, "data", "ExternalProvisioning", DRIVER).await;
    // ... and the pod still waits, quietly.
    let app = pods.get("app").await.unwrap();
    assert_eq!(node_of(&app), None, "not bound before its volume exists");
    // The provisioner (played) makes the volume on that node: the pod binds there.
    volumes
        .create(&pp, &provisioned(&data, &node))
        .await
        .unwrap();
    assert_eq!(bound_to(&pods, "app").await, node);
    let bound = claims.get("data").await.unwrap();
    assert_eq!(bound.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(
        events(&c.client, "app", "FailedScheduling")
            .await
            .is_empty(),
        "waiting for a volume is not a scheduling failure"
    );

    // A claim that does not exist.
    pods.create(&pp, &pod("orphan", &["absent"])).await.unwrap();
    let e = event_with(
        &c.client,
        "orphan",
        "FailedScheduling",
        "persistentvolumeclaim \"absent\" not found",
    )
    .await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    // (followed by what preemption found, as kube-scheduler's message is)
    let m = e.message.unwrap_or_default();
    assert!(
        m.starts_with("0/2 nodes are available: persistentvolumeclaim \"absent\" not found."),
        "{m}"
    );
    // Created, it brings the pod back: a node is selected for it.
    claims.create(&pp, &claim("absent", "late")).await.unwrap();
    selected_node(&claims, "absent").await;

    // An unbound claim of an Immediate class.
    claims.create(&pp, &claim("eager", "now")).await.unwrap();
    pods.create(&pp, &pod("impatient", &["eager"]))
        .await
        .unwrap();
    event_with(
        &c.client,
        "impatient",
        "FailedScheduling",
        "pod has unbound immediate PersistentVolumeClaims",
    )
    .await;

    // The provisioner gives up (takes the selected node off): PreBind's failure, then a
    // new selection.
    claims.create(&pp, &claim("flaky", "late")).await.unwrap();
    pods.create(&pp, &pod("unlucky", &["flaky"])).await.unwrap();
    selected_node(&claims, "flaky").await;
    let drop = json!({"metadata": {"annotations": {SELECTED: null}}});
    claims
        .patch("flaky", &PatchParams::default(), &Patch::Merge(&drop))
        .await
        .unwrap();
    let e = event_with(&c.client, "unlucky", "FailedScheduling", "PreBind").await;
    assert_eq!(
        e.message.as_deref(),
        Some("running PreBind plugin \"VolumeBinding\": binding volumes: provisioning failed for PVC \"flaky\"")
    );
    selected_node(&claims, "flaky").await;
    assert_eq!(node_of(&pods.get("unlucky").await.unwrap()), None);

    // A claim being deleted (another finalizer holds it).
    let mut held = claim("held", "late");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    claims.create(&pp, &held).await.unwrap();
    claims.delete("held", &Default::default()).await.unwrap();
    pods.create(&pp, &pod("late-comer", &["held"]))
        .await
        .unwrap();
    event_with(
        &c.client,
        "late-comer",
        "FailedScheduling",
        "persistentvolumeclaim \"held\" is being deleted",
    )
    .await;

    // Local volumes (no provisioner, WaitForFirstConsumer): only the node with a free
    // volume of the class passes; the binder binds it once the node is selected.
    let mut local = class("local", "WaitForFirstConsumer");
    local.provisioner = "kubernetes.io/no-provisioner".into();
    Api::<StorageClass>::all(c.client.clone())
        .create(&pp, &local)
        .await
        .unwrap();
    let disk: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "disk-a"},
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local", "local": {"path": "/mnt/disk-a"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}]}}}
    }))
    .unwrap();
    volumes.create(&pp, &disk).await.unwrap();
    claims
        .create(&pp, &claim("scratch", "local"))
        .await
        .unwrap();
    pods.create(&pp, &pod("local-user", &["scratch"]))
        .await
        .unwrap();
    assert_eq!(bound_to(&pods, "local-user").await, "node-a");
    let s = claims.get("scratch").await.unwrap();
    assert_eq!(s.spec.unwrap().volume_name.as_deref(), Some("disk-a"));
    // A second local claim finds no free volume on any node.
    claims
        .create(&pp, &claim("scratch-2", "local"))
        .await
        .unwrap();
    pods.create(&pp, &pod("local-user-2", &["scratch-2"]))
        .await
        .unwrap();
    event_with(
        &c.client,
        "local-user-2",
        "FailedScheduling",
        "2 node(s) didn't find available persistent volumes to bind",
    )
    .await;

    // A bound volume pinned to node-b: every pod of its claim goes to node-b.
    let pinned: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pinned"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/tmp/pinned"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}]}]}}}
    }))
    .unwrap();
    volumes.create(&pp, &pinned).await.unwrap();
    claims.create(&pp, &claim("shared", "")).await.unwrap();
    wait_until_async("shared bound", WAIT, || async {
        let c = claims.get("shared").await.map_err(|e| e.to_string())?;
        match c.spec.and_then(|s| s.volume_name) {
            Some(v) if v == "pinned" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for i in 0..6 {
        pods.create(&pp, &pod(&format!("follower-{i}"), &["shared"]))
            .await
            .unwrap();
    }
    for i in 0..6 {
        assert_eq!(bound_to(&pods, &format!("follower-{i}")).await, "node-b");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_claims_are_provisioned_on_first_use() {
    const N: usize = 200;
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let pp = PostParams::default();
    Api::<StorageClass>::all(c.client.clone())
        .create(&pp, &class("late", "WaitForFirstConsumer"))
        .await
        .unwrap();
    let names: Vec<String> = (0..N).map(|i| format!("w-{i}")).collect();
    futures::future::join_all(names.iter().map(|n| {
        let (claims, pods, pp) = (claims.clone(), pods.clone(), pp.clone());
        async move {
            claims.create(&pp, &claim(n, "late")).await.unwrap();
            pods.create(&pp, &pod(n, &[n])).await.unwrap();
        }
    }))
    .await;

    // Every claim gets a node; no pod is bound before its volume exists.
    let chosen: BTreeMap<String, PersistentVolumeClaim> = wait_until_async(
        "a node selected for every claim",
        Duration::from_secs(180),
        || async {
            let list = claims
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let with: BTreeMap<String, PersistentVolumeClaim> = list
                .items
                .into_iter()
                .filter(|c| selected(c).is_some())
                .map(|c| (c.name_any(), c))
                .collect();
            if with.len() == N {
                Ok(with)
            } else {
                Err(format!("{} of {N}", with.len()))
            }
        },
    )
    .await;
    let early = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| node_of(p).is_some())
        .count();
    assert_eq!(early, 0, "no pod binds before its volume");
    let nodes: BTreeSet<String> = chosen.values().filter_map(selected).collect();
    assert!(nodes.len() > 1, "claims spread over the nodes: {nodes:?}");

    // The provisioner (played) makes every volume; every pod binds to its claim's node.
    futures::future::join_all(chosen.values().map(|claim| {
        let (volumes, pp) = (volumes.clone(), pp.clone());
        async move {
            let node = selected(claim).unwrap();
            volumes
                .create(&pp, &provisioned(claim, &node))
                .await
                .unwrap();
        }
    }))
    .await;
    wait_until_async(
        "every pod bound to its volume's node",
        Duration::from_secs(180),
        || async {
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let mut wrong = Vec::new();
            let mut pending = 0;
            for p in &list.items {
                let want = chosen.get(&p.name_any()).and_then(selected);
                match node_of(p) {
                    None => pending += 1,
                    Some(n) if Some(&n) != want.as_ref() => wrong.push(p.name_any()),
                    Some(_) => {}
                }
            }
            assert!(wrong.is_empty(), "pods off their volume's node: {wrong:?}");
            if pending == 0 && list.items.len() == N {
                Ok(())
            } else {
                Err(format!("{pending} pending"))
            }
        },
    )
    .await;
    let bound = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .count();
    assert_eq!(bound, N);
    c.shutdown().await;
}
