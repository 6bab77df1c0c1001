//! The PersistentVolume binder against a real in-process API server with the controllers:
//! static binding takes the smallest volume that fits and both sides reach Bound with
//! Kubernetes' annotations; a volume pre-bound to a claim serves only that claim; a deleted
//! claim leaves its volume Released (Retain) or Failed (Delete with no deleter); claims of
//! classes with an external provisioner get `volume.kubernetes.io/storage-provisioner` at
//! once (Immediate) or once a node is selected (WaitForFirstConsumer), with the Events
//! Kubernetes writes; a volume the test provisions (pre-bound, as a provisioner makes it)
//! binds; a growing claim of an expandable class gets the resizer's annotation.

mod controllers_support;

use std::collections::BTreeMap;
use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn pv(name: &str, size: &str, modes: &[&str], extra: Value) -> PersistentVolume {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": size}, "accessModes": modes,
            "hostPath": {"path": format!("/tmp/{name}")}}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn claim(name: &str, size: &str, extra: Value) -> PersistentVolumeClaim {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "resources": {"requests": {"storage": size}}}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn annotations<K: kube::Resource>(o: &K) -> BTreeMap<String, String> {
    o.meta().annotations.clone().unwrap_or_default()
}

async fn claim_phase(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    phase: &str,
) -> PersistentVolumeClaim {
    wait_until_async(&format!("claim {name} {phase}"), WAIT, || async {
        let c = claims.get(name).await.map_err(|e| e.to_string())?;
        let got = c.status.as_ref().and_then(|s| s.phase.clone());
        if got.as_deref() == Some(phase) {
            Ok(c)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await
}

async fn volume_phase(
    volumes: &Api<PersistentVolume>,
    name: &str,
    phase: &str,
) -> PersistentVolume {
    wait_until_async(&format!("volume {name} {phase}"), WAIT, || async {
        let v = volumes.get(name).await.map_err(|e| e.to_string())?;
        let got = v.status.as_ref().and_then(|s| s.phase.clone());
        if got.as_deref() == Some(phase) {
            Ok(v)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await
}

/// The message of the first Event with `reason` about the object `name` in `ns`.
async fn event(client: &Client, ns: &str, name: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    wait_until_async(&format!("{reason} event for {name}"), WAIT, || async {
        let list = events.list(&lp).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
            .ok_or_else(|| "no such event yet".to_string())
    })
    .await
}

async fn gone<K>(api: &Api<K>, name: &str)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until_async(&format!("{name} gone"), WAIT, || async {
        match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_binding_prebinding_and_reclaim() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let pp = PostParams::default();
    for v in [
        pv("pv-1g", "1Gi", &["ReadWriteOnce"], json!({})),
        pv("pv-10g", "10Gi", &["ReadWriteOnce"], json!({})),
        pv(
            "pv-5g",
            "5Gi",
            &["ReadWriteOnce", "ReadOnlyMany"],
            json!({}),
        ),
        pv("pv-3g-rox", "3Gi", &["ReadOnlyMany"], json!({})),
        pv(
            "pv-3g-gold",
            "3Gi",
            &["ReadWriteOnce"],
            json!({"spec": {"storageClassName": "gold"}}),
        ),
        pv(
            "pv-4g-labelled",
            "4Gi",
            &["ReadWriteOnce"],
            json!({"metadata": {"labels": {"tier": "slow"}}}),
        ),
    ] {
        volumes.create(&pp, &v).await.unwrap();
    }
    for v in ["pv-1g", "pv-10g", "pv-5g"] {
        volume_phase(&volumes, v, "Available").await;
    }

    // 2Gi RWO, no class, selecting fast volumes: the 1Gi is too small, the 3Gi ones have the
    // wrong mode or class, the 4Gi the wrong labels; of 5Gi and 10Gi the smaller wins.
    let fast = json!({"spec": {"selector": {"matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["slow"]}]}}});
    let created = claims
        .create(&pp, &claim("data", "2Gi", fast))
        .await
        .unwrap();
    let bound = claim_phase(&claims, "data", "Bound").await;
    let spec = bound.spec.clone().unwrap();
    assert_eq!(spec.volume_name.as_deref(), Some("pv-5g"));
    let status = bound.status.clone().unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "5Gi");
    assert_eq!(
        status.access_modes.unwrap(),
        ["ReadWriteOnce", "ReadOnlyMany"]
    );
    let a = annotations(&bound);
    assert_eq!(
        a.get("pv.kubernetes.io/bind-completed").map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        a.get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    let v = volume_phase(&volumes, "pv-5g", "Bound").await;
    let r = v.spec.clone().unwrap().claim_ref.unwrap();
    assert_eq!(
        (r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref()),
        (
            Some("default"),
            Some("data"),
            created.metadata.uid.as_deref()
        )
    );
    assert_eq!(
        annotations(&v)
            .get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    for other in [
        "pv-1g",
        "pv-10g",
        "pv-3g-rox",
        "pv-3g-gold",
        "pv-4g-labelled",
    ] {
        let o = volumes.get(other).await.unwrap();
        assert!(o.spec.unwrap().claim_ref.is_none(), "{other} stays free");
    }

    // A volume pre-bound (by an admin, name only) to "wanted" serves no one else: a 15Gi
    // claim fits only it, and stays Pending with Kubernetes' event.
    volumes
        .create(
            &pp,
            &pv(
                "pre",
                "20Gi",
                &["ReadWriteOnce"],
                json!({"spec": {"claimRef": {
                "namespace": "default", "name": "wanted"}}}),
            ),
        )
        .await
        .unwrap();
    volume_phase(&volumes, "pre", "Available").await;
    claims
        .create(&pp, &claim("sneaky", "15Gi", json!({})))
        .await
        .unwrap();
    let e = event(&c.client, "default", "sneaky", "FailedBinding").await;
    assert_eq!(
        e.message.as_deref(),
        Some("no persistent volumes available for this claim and no storage class is set")
    );
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    // "wanted" asks for 1Gi (pv-1g would fit) and gets its own pre-bound volume.
    let wanted = claims
        .create(&pp, &claim("wanted", "1Gi", json!({})))
        .await
        .unwrap();
    let b = claim_phase(&claims, "wanted", "Bound").await;
    assert_eq!(b.spec.unwrap().volume_name.as_deref(), Some("pre"));
    let v = volume_phase(&volumes, "pre", "Bound").await;
    assert_eq!(
        v.spec.clone().unwrap().claim_ref.unwrap().uid,
        wanted.metadata.uid,
        "the claim's uid is recorded"
    );
    assert!(
        !annotations(&v).contains_key("pv.kubernetes.io/bound-by-controller"),
        "an admin's claimRef is not the controller's"
    );
    assert_eq!(
        claim_phase(&claims, "sneaky", "Pending")
            .await
            .spec
            .unwrap()
            .volume_name,
        None
    );

    // The claim goes: Retain keeps the volume, Released.
    claims
        .delete("wanted", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, "wanted").await;
    let v = volume_phase(&volumes, "pre", "Released").await;
    assert_eq!(
        v.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    // A new claim of the same name is another claim (another uid): it does not get it back.
    claims
        .create(&pp, &claim("wanted", "1Gi", json!({})))
        .await
        .unwrap();
    let b = claim_phase(&claims, "wanted", "Bound").await;
    assert_eq!(b.spec.unwrap().volume_name.as_deref(), Some("pv-1g"));
    assert_eq!(
        volume_phase(&volumes, "pre", "Released")
            .await
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Released")
    );

    // Delete with no deleter (nobody provisioned it): Failed, with the event.
    volumes
        .create(
            &pp,
            &pv(
                "doomed",
                "1Gi",
                &["ReadWriteMany"],
                json!({"spec": {
                "persistentVolumeReclaimPolicy": "Delete"}}),
            ),
        )
        .await
        .unwrap();
    claims
        .create(
            &pp,
            &claim(
                "shortlived",
                "1Gi",
                json!({"spec": {"accessModes": ["ReadWriteMany"]}}),
            ),
        )
        .await
        .unwrap();
    let b = claim_phase(&claims, "shortlived", "Bound").await;
    assert_eq!(b.spec.unwrap().volume_name.as_deref(), Some("doomed"));
    claims
        .delete("shortlived", &DeleteParams::default())
        .await
        .unwrap();
    let v = volume_phase(&volumes, "doomed", "Failed").await;
    let msg = "error getting deleter volume plugin for volume \"doomed\": no deletable volume plugin matched";
    assert_eq!(v.status.unwrap().message.as_deref(), Some(msg));
    let e = event(&c.client, "default", "doomed", "VolumeFailedDelete").await;
    assert_eq!(e.message.as_deref(), Some(msg));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    c.shutdown().await;
}

fn class(name: &str, mode: &str, provisioner: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": true,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_provisioning_hands_claims_to_the_provisioner() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let classes: Api<StorageClass> = Api::all(c.client.clone());
    let pp = PostParams::default();
    classes
        .create(&pp, &class("now", "Immediate", "example.com/now"))
        .await
        .unwrap();
    classes
        .create(
            &pp,
            &class("late", "WaitForFirstConsumer", "local.csi.skiff.io"),
        )
        .await
        .unwrap();

    // Immediate: handed to the provisioner at once.
    claims
        .create(
            &pp,
            &claim("eager", "1Gi", json!({"spec": {"storageClassName": "now"}})),
        )
        .await
        .unwrap();
    let e = event(&c.client, "default", "eager", "ExternalProvisioning").await;
    assert_eq!(
        e.message.as_deref(),
        Some("Waiting for a volume to be created either by the external provisioner 'example.com/now' or manually by the system administrator")
    );
    let a = annotations(&claims.get("eager").await.unwrap());
    assert_eq!(
        a.get("volume.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("example.com/now")
    );
    assert_eq!(
        a.get("volume.beta.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("example.com/now")
    );

    // WaitForFirstConsumer: waits, with one event and no provisioner yet.
    let lazy = claims
        .create(
            &pp,
            &claim("lazy", "1Gi", json!({"spec": {"storageClassName": "late"}})),
        )
        .await
        .unwrap();
    let e = event(&c.client, "default", "lazy", "WaitForFirstConsumer").await;
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(
        e.message.as_deref(),
        Some("waiting for first consumer to be created before binding")
    );
    // The binder has synced "eager2" after "lazy" once its event is there; "lazy" is still
    // not handed over.
    claims
        .create(
            &pp,
            &claim(
                "eager2",
                "1Gi",
                json!({"spec": {"storageClassName": "now"}}),
            ),
        )
        .await
        .unwrap();
    event(&c.client, "default", "eager2", "ExternalProvisioning").await;
    let l = claims.get("lazy").await.unwrap();
    assert!(!annotations(&l).contains_key("volume.kubernetes.io/storage-provisioner"));
    assert_eq!(l.status.unwrap().phase.as_deref(), Some("Pending"));

    // The scheduler (played) selects a node: now the provisioner is asked.
    let select =
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-a"}}});
    claims
        .patch("lazy", &PatchParams::default(), &Patch::Merge(&select))
        .await
        .unwrap();
    let e = event(&c.client, "default", "lazy", "ExternalProvisioning").await;
    assert_eq!(
        e.message.as_deref(),
        Some("Waiting for a volume to be created either by the external provisioner 'local.csi.skiff.io' or manually by the system administrator")
    );
    wait_until_async("lazy handed to the provisioner", WAIT, || async {
        let a = annotations(&claims.get("lazy").await.map_err(|e| e.to_string())?);
        match a.get("volume.kubernetes.io/storage-provisioner") {
            Some(p) if p == "local.csi.skiff.io" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The provisioner (played) creates the volume pre-bound to the claim: it binds.
    let uid = lazy.metadata.uid.clone().unwrap();
    let name = format!("pvc-{uid}");
    let provisioned: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": "local.csi.skiff.io"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "late", "persistentVolumeReclaimPolicy": "Delete",
            "csi": {"driver": "local.csi.skiff.io", "volumeHandle": uid, "fsType": "ext4"},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": "default", "name": "lazy", "uid": uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.local.csi.skiff.io/node", "operator": "In", "values": ["node-a"]}]}]}}}
    }))
    .unwrap();
    volumes.create(&pp, &provisioned).await.unwrap();
    let b = claim_phase(&claims, "lazy", "Bound").await;
    assert_eq!(b.spec.unwrap().volume_name.as_deref(), Some(name.as_str()));
    volume_phase(&volumes, &name, "Bound").await;

    // It grows: the class allows expansion, so the resizer's state is laid down.
    let grow = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    claims
        .patch("lazy", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    wait_until_async("resize requested", WAIT, || async {
        let c = claims.get("lazy").await.map_err(|e| e.to_string())?;
        let resizer = annotations(&c)
            .get("volume.kubernetes.io/storage-resizer")
            .cloned();
        let allocated = c
            .status
            .as_ref()
            .and_then(|s| s.allocated_resources.as_ref())
            .and_then(|a| a.get("storage"))
            .map(|q| q.0.clone());
        if resizer.as_deref() == Some("local.csi.skiff.io") && allocated.as_deref() == Some("2Gi") {
            Ok(())
        } else {
            Err(format!("{resizer:?} {allocated:?}"))
        }
    })
    .await;
    event(&c.client, "default", "lazy", "ExternalExpanding").await;
    // Shrinking is refused by the API.
    let shrink = json!({"spec": {"resources": {"requests": {"storage": "512Mi"}}}});
    let err = claims
        .patch("lazy", &PatchParams::default(), &Patch::Merge(&shrink))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("can not be less than"), "{err}");

    // Deleted: Released, and left to the provisioner that made it (not Failed).
    claims
        .delete("lazy", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, "lazy").await;
    volume_phase(&volumes, &name, "Released").await;
    // Once the binder has synced a later claim, the volume is still Released.
    claims
        .create(
            &pp,
            &claim(
                "marker",
                "1Gi",
                json!({"spec": {"storageClassName": "now"}}),
            ),
        )
        .await
        .unwrap();
    event(&c.client, "default", "marker", "ExternalProvisioning").await;
    assert_eq!(
        volumes
            .get(&name)
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Released")
    );

    // A class that does not exist.
    claims
        .create(
            &pp,
            &claim("lost", "1Gi", json!({"spec": {"storageClassName": "nope"}})),
        )
        .await
        .unwrap();
    let e = event(&c.client, "default", "lost", "ProvisioningFailed").await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.message.as_deref(),
        Some("storageclass.storage.k8s.io \"nope\" not found")
    );
    // Created later, the class takes the claim over.
    classes
        .create(&pp, &class("nope", "Immediate", "example.com/late"))
        .await
        .unwrap();
    wait_until_async("lost handed over", WAIT, || async {
        let a = annotations(&claims.get("lost").await.map_err(|e| e.to_string())?);
        match a.get("volume.kubernetes.io/storage-provisioner") {
            Some(p) if p == "example.com/late" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    c.shutdown().await;
}
