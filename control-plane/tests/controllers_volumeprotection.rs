//! Storage objects in use are protected, against a real in-process API server with the
//! controllers: a claim deleted while a pod mounts it stays (Terminating, its
//! `kubernetes.io/pvc-protection` finalizer kept) until that pod is gone, then goes; a
//! claim nobody mounts goes at once; a volume goes once it is not Bound, and stays while it
//! is.

mod controllers_support;

use std::time::Duration;

use control_plane::controllers::ControllerName;
use controllers_support::{without, Cluster};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()
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
async fn claims_and_volumes_stay_while_in_use() {
    // The binder would make the volume below Available (it has no claim) behind the test's
    // back: the phases here are the test's own.
    let c = Cluster::start(without(&[ControllerName::PersistentVolumeBinder]), &[]).await;
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    let pp = PostParams::default();

    // A claim a pod mounts.
    let used = claims.create(&pp, &claim("used")).await.unwrap();
    assert!(used
        .finalizers()
        .contains(&"kubernetes.io/pvc-protection".to_string()));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "used"}}]}
    }))
    .unwrap();
    pods.create(&pp, &pod).await.unwrap();
    claims
        .delete("used", &DeleteParams::default())
        .await
        .unwrap();
    // A claim nobody mounts, deleted after: once it is gone, the controller has seen both.
    claims.create(&pp, &claim("free")).await.unwrap();
    claims
        .delete("free", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, "free").await;
    let still = claims.get("used").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    assert!(still
        .finalizers()
        .contains(&"kubernetes.io/pvc-protection".to_string()));
    // The pod goes (no node ran it): so does the claim.
    pods.delete("user", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(&claims, "used").await;

    // A Bound volume stays; once Released it goes.
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "v1"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/tmp/v1"}}
    }))
    .unwrap();
    let pv = volumes.create(&pp, &pv).await.unwrap();
    assert!(pv
        .finalizers()
        .contains(&"kubernetes.io/pv-protection".to_string()));
    let phase = |p: &str| json!({"status": {"phase": p}});
    volumes
        .patch_status("v1", &PatchParams::default(), &Patch::Merge(phase("Bound")))
        .await
        .unwrap();
    volumes
        .delete("v1", &DeleteParams::default())
        .await
        .unwrap();
    // The controller has looked at it once a later claim deletion went through.
    claims.create(&pp, &claim("marker")).await.unwrap();
    claims
        .delete("marker", &DeleteParams::default())
        .await
        .unwrap();
    gone(&claims, "marker").await;
    assert!(
        volumes.get_opt("v1").await.unwrap().is_some(),
        "a Bound volume stays"
    );
    volumes
        .patch_status(
            "v1",
            &PatchParams::default(),
            &Patch::Merge(phase("Released")),
        )
        .await
        .unwrap();
    gone(&volumes, "v1").await;
    c.shutdown().await;
}
