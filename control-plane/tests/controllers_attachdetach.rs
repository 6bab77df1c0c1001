//! The attach/detach controller against a real in-process API server with the controllers
//! and two played nodes: a pod on a node using a bound claim of a CSI driver that must be
//! attached (attachRequired true, or no CSIDriver object at all) gets a VolumeAttachment with
//! Kubernetes' name and spec; it stays while any pod on the node uses the volume and goes
//! with the last one; a driver with attachRequired false gets none; the attacher's
//! `status.attached` shows in Node.status.volumesAttached and its attachError as a
//! FailedAttachVolume Event on the pod; 100 pods with 100 claims on 2 nodes get 100
//! attachments, all gone once the pods are.

mod controllers_support;

use std::time::Duration;

use control_plane::controllers::attachdetach::attachment_name;
use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);
const ATTACH: &str = "attach.example.com";
const NO_ATTACH: &str = "noattach.example.com";
const UNREGISTERED: &str = "unregistered.example.com";

async fn create_driver(client: &Client, name: &str, attach_required: bool) {
    let api: Api<CSIDriver> = Api::all(client.clone());
    let d: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": attach_required, "podInfoOnMount": false}
    }))
    .unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
}

/// A PV of `driver` (handle `vol-<name>`) pre-bound to claim `name`, and the claim, once Bound.
async fn bound_claim(client: &Client, ns: &str, name: &str, driver: &str) {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("pv-{name}")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "csi": {"driver": driver, "volumeHandle": format!("vol-{name}")},
            "claimRef": {"namespace": ns, "name": name}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "volumeName": format!("pv-{name}"),
            "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
}

async fn wait_bound(client: &Client, ns: &str, name: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_until_async(&format!("claim {name} Bound"), WAIT, || async {
        let c = claims.get(name).await.map_err(|e| e.to_string())?;
        let phase = c.status.and_then(|s| s.phase);
        if phase.as_deref() == Some("Bound") {
            Ok(())
        } else {
            Err(format!("{phase:?}"))
        }
    })
    .await;
}

async fn create_pod(client: &Client, ns: &str, name: &str, node: &str, claim: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

async fn delete_pod(client: &Client, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    wait_until_async(&format!("pod {name} gone"), WAIT, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
}

async fn attachment(client: &Client, name: &str) -> VolumeAttachment {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until_async(&format!("VolumeAttachment {name}"), WAIT, || async {
        api.get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await
}

async fn attachment_gone(client: &Client, name: &str) {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until_async(&format!("VolumeAttachment {name} gone"), WAIT, || async {
        match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
}

async fn attachment_count(client: &Client, want: usize) {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until_async(&format!("{want} VolumeAttachments"), WAIT, || async {
        let n = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if n == want {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_follow_the_pods_on_each_node() {
    let c = Cluster::start(fast_settings(), &["n1", "n2"]).await;
    let client = c.client.clone();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    create_driver(&client, ATTACH, true).await;
    create_driver(&client, NO_ATTACH, false).await;
    for (claim, driver) in [("a", ATTACH), ("b", NO_ATTACH), ("u", UNREGISTERED)] {
        bound_claim(&client, "default", claim, driver).await;
    }
    for claim in ["a", "b", "u"] {
        wait_bound(&client, "default", claim).await;
    }

    // A pod on n1 of the attach-required driver: Kubernetes' name and spec.
    create_pod(&client, "default", "p1", "n1", "a").await;
    let name = attachment_name("vol-a", ATTACH, "n1");
    let va = attachment(&client, &name).await;
    assert_eq!(va.spec.attacher, ATTACH);
    assert_eq!(va.spec.node_name, "n1");
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some("pv-a")
    );
    assert!(va.spec.source.inline_volume_spec.is_none());

    // The attacher reports it attached: the node lists it; its error reaches the pod.
    let status = json!({"status": {"attached": true}});
    vas.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until_async("n1 volumesAttached", WAIT, || async {
        let n = nodes.get("n1").await.map_err(|e| e.to_string())?;
        let listed = n
            .status
            .and_then(|s| s.volumes_attached)
            .unwrap_or_default();
        match listed.as_slice() {
            [v] if v.name == format!("kubernetes.io/csi/{ATTACH}^vol-a")
                && v.device_path.is_empty() =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let status = json!({"status": {"attachError": {"message": "rpc error: code = Internal desc = disk busy"}}});
    vas.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().fields("involvedObject.name=p1");
    let ev = wait_until_async("FailedAttachVolume on p1", WAIT, || async {
        events
            .list(&lp)
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedAttachVolume"))
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let msg = ev.message.unwrap_or_default();
    assert!(msg.contains("pv-a") && msg.contains("disk busy"), "{msg}");

    // A second pod of the claim on n1: the first going leaves the attachment.
    create_pod(&client, "default", "p2", "n1", "a").await;
    delete_pod(&client, "default", "p1").await;
    // p2 still uses it; a pod of the no-attach driver meanwhile shows the controller acts.
    create_pod(&client, "default", "pb", "n1", "b").await;
    create_pod(&client, "default", "pu", "n2", "u").await;
    let unregistered = attachment_name("vol-u", UNREGISTERED, "n2");
    let va = attachment(&client, &unregistered).await;
    assert_eq!(va.spec.attacher, UNREGISTERED);
    assert_eq!(va.spec.node_name, "n2");
    assert!(
        vas.get_opt(&name).await.unwrap().is_some(),
        "p2 still uses pv-a"
    );
    // attachRequired false: no attachment for pv-b, ever (the other two are all there is).
    attachment_count(&client, 2).await;
    assert!(vas
        .get_opt(&attachment_name("vol-b", NO_ATTACH, "n1"))
        .await
        .unwrap()
        .is_none());

    // The last pod on n1 goes while n1 still reports the volume mounted (volumesInUse):
    // the detach waits. A later attachment on n1 (claim u) shows the controller has moved
    // on meanwhile.
    let mounted =
        json!({"status": {"volumesInUse": [format!("kubernetes.io/csi/{ATTACH}^vol-a")]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&mounted))
        .await
        .unwrap();
    wait_until_async("n1 reports vol-a in use", WAIT, || async {
        let n = nodes.get("n1").await.map_err(|e| e.to_string())?;
        match n.status.and_then(|s| s.volumes_in_use) {
            Some(v) if !v.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    delete_pod(&client, "default", "p2").await;
    create_pod(&client, "default", "ps", "n1", "u").await;
    attachment(&client, &attachment_name("vol-u", UNREGISTERED, "n1")).await;
    assert!(
        vas.get_opt(&name).await.unwrap().is_some(),
        "detached while n1 still reports the volume in use"
    );
    // Unmounted: detached, and n1 lists nothing of pv-a attached.
    let unmounted = json!({"status": {"volumesInUse": []}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&unmounted))
        .await
        .unwrap();
    attachment_gone(&client, &name).await;
    delete_pod(&client, "default", "ps").await;
    attachment_gone(&client, &attachment_name("vol-u", UNREGISTERED, "n1")).await;
    wait_until_async("n1 volumesAttached empty", WAIT, || async {
        let n = nodes.get("n1").await.map_err(|e| e.to_string())?;
        let listed = n
            .status
            .and_then(|s| s.volumes_attached)
            .unwrap_or_default();
        if listed.is_empty() {
            Ok(())
        } else {
            Err(format!("{listed:?}"))
        }
    })
    .await;

    // An attachment deleted behind the controller's back while needed comes back.
    vas.delete(&unregistered, &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async("attachment recreated", WAIT, || async {
        let va = vas
            .get_opt(&unregistered)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("gone")?;
        if va.metadata.deletion_timestamp.is_none() {
            Ok(())
        } else {
            Err("being deleted".to_string())
        }
    })
    .await;
    delete_pod(&client, "default", "pu").await;
    attachment_gone(&client, &unregistered).await;
    attachment_count(&client, 0).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_pods_on_two_nodes() {
    let c = Cluster::start(fast_settings(), &["n1", "n2"]).await;
    let client = c.client.clone();
    create_driver(&client, ATTACH, true).await;
    let names: Vec<String> = (0..100).map(|i| format!("c{i}")).collect();
    for n in &names {
        bound_claim(&client, "default", n, ATTACH).await;
    }
    for n in &names {
        wait_bound(&client, "default", n).await;
    }
    for (i, n) in names.iter().enumerate() {
        let node = if i % 2 == 0 { "n1" } else { "n2" };
        create_pod(&client, "default", &format!("p{i}"), node, n).await;
    }
    attachment_count(&client, 100).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let list = vas.list(&ListParams::default()).await.unwrap();
    let mut got: Vec<String> = list
        .items
        .iter()
        .map(|v| v.metadata.name.clone().unwrap())
        .collect();
    let mut want: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            attachment_name(
                &format!("vol-{n}"),
                ATTACH,
                if i % 2 == 0 { "n1" } else { "n2" },
            )
        })
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let pods: Api<Pod> = c.api("default");
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    attachment_count(&client, 0).await;
    c.shutdown().await;
}
