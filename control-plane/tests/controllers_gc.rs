//! Garbage collection and namespace deletion against a real in-process API server with the
//! controllers and scheduler in-process: deleting a Deployment in the background, in the
//! foreground (it waits, with its finalizer, for its ReplicaSets and pods) and orphaning
//! (they stay, without the owner reference); an object whose owner never existed; deleting a
//! namespace empties it, then removes it.

mod controllers_support;

use std::time::Duration;

use controllers_support::{deployment, fast_settings, Cluster};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

/// Creates the Deployment in `ns` and waits for its pods to run.
async fn running(c: &Cluster, ns: &str, name: &str, replicas: usize) {
    let api: Api<Deployment> = c.api(ns);
    api.create(&PostParams::default(), &deployment(name, replicas as i32))
        .await
        .unwrap();
    let pods: Api<Pod> = c.api(ns);
    wait_until_async("the pods to run", WAIT, || async {
        let ps = pods
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await
            .unwrap()
            .items;
        let running = ps
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        (running == replicas).then_some(()).ok_or(running)
    })
    .await;
}

async fn counts(c: &Cluster, ns: &str, app: &str) -> (usize, usize) {
    let sets: Api<ReplicaSet> = c.api(ns);
    let pods: Api<Pod> = c.api(ns);
    let lp = ListParams::default().labels(&format!("app={app}"));
    (
        sets.list(&lp).await.unwrap().items.len(),
        pods.list(&lp).await.unwrap().items.len(),
    )
}

#[tokio::test]
async fn deleting_a_deployment_cascades_in_the_background() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    running(&c, "default", "web", 3).await;
    let api: Api<Deployment> = c.api("default");
    api.delete("web", &DeleteParams::background())
        .await
        .unwrap();
    wait_until_async("ReplicaSets and pods gone", WAIT, || async {
        let n = counts(&c, "default", "web").await;
        (n == (0, 0)).then_some(()).ok_or(n)
    })
    .await;
    assert!(api.get_opt("web").await.unwrap().is_none());
    c.shutdown().await;
}

#[tokio::test]
async fn foreground_deletion_waits_for_the_dependents() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    running(&c, "default", "web", 2).await;
    let api: Api<Deployment> = c.api("default");
    api.delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    // While dependents remain the Deployment is still there, with the finalizer.
    let d = api.get("web").await.unwrap();
    assert!(d.metadata.deletion_timestamp.is_some());
    assert!(d.finalizers().iter().any(|f| f == "foregroundDeletion"));
    wait_until_async("the Deployment gone after its dependents", WAIT, || async {
        let left = api.get_opt("web").await.unwrap().is_some();
        let n = counts(&c, "default", "web").await;
        (!left && n == (0, 0)).then_some(()).ok_or((left, n))
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn orphan_deletion_keeps_the_dependents_without_owner() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    running(&c, "default", "web", 2).await;
    let api: Api<Deployment> = c.api("default");
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    api.delete("web", &dp).await.unwrap();
    wait_until_async("the Deployment gone", WAIT, || async {
        api.get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
            .ok_or(())
    })
    .await;
    let sets: Api<ReplicaSet> = c.api("default");
    let rs = wait_until_async("the ReplicaSet orphaned", WAIT, || async {
        let items = sets
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        match items.as_slice() {
            [rs] if rs.owner_references().is_empty() => Ok(rs.clone()),
            other => Err(other.len()),
        }
    })
    .await;
    assert_eq!(
        counts(&c, "default", "web").await,
        (1, 2),
        "ReplicaSet and pods stay"
    );
    // The pods still belong to the ReplicaSet.
    let pods: Api<Pod> = c.api("default");
    for p in pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
    {
        assert_eq!(p.owner_references()[0].uid, rs.uid().unwrap());
    }
    c.shutdown().await;
}

#[tokio::test]
async fn an_object_whose_owner_is_gone_is_collected() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let cms: Api<ConfigMap> = c.api("default");
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let dependent: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "dependent", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap(),
        }]},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    // An owner that never existed (a uid nobody has).
    let ghost: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "ghost-child", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-0000-0000-0000-000000000000",
        }]},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &ghost).await.unwrap();
    wait_until_async("the child of a missing owner collected", WAIT, || async {
        cms.get_opt("ghost-child")
            .await
            .unwrap()
            .is_none()
            .then_some(())
            .ok_or(())
    })
    .await;
    assert!(
        cms.get_opt("dependent").await.unwrap().is_some(),
        "an owned object with a live owner stays"
    );
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    wait_until_async("the dependent collected with its owner", WAIT, || async {
        cms.get_opt("dependent")
            .await
            .unwrap()
            .is_none()
            .then_some(())
            .ok_or(())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_content_then_itself() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let nss: Api<Namespace> = Api::all(c.client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    running(&c, "team", "api", 2).await;
    let svcs: Api<Service> = c.api("team");
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "api"}, "spec": {"selector": {"app": "api"}, "ports": [{"port": 80}]}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = c.api("team");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "settings"}})).unwrap(),
    )
    .await
    .unwrap();

    nss.delete("team", &DeleteParams::default()).await.unwrap();
    let ns = nss.get("team").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    wait_until_async("the namespace gone", WAIT, || async {
        nss.get_opt("team")
            .await
            .unwrap()
            .is_none()
            .then_some(())
            .ok_or(())
    })
    .await;
    let pods: Api<Pod> = c.api("team");
    assert!(pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(svcs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    // Other namespaces are untouched.
    assert!(nss.get_opt("default").await.unwrap().is_some());
    c.shutdown().await;
}

/// A custom object is collected when its owner goes (its kind defined while the cluster
/// runs: found by the collector's first discovery or by its 30 s resync, whichever comes
/// after the definition).
#[tokio::test]
async fn custom_objects_are_collected_with_their_owner() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let c = Cluster::start(fast_settings(), &[]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "gizmos", "kind": "Gizmo"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    wait_until_async("the definition is established", WAIT, || async {
        let d = crds.get("gizmos.example.com").await.unwrap();
        let ok = d.status.and_then(|s| s.conditions).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        ok.then_some(()).ok_or("not yet")
    })
    .await;
    let owners: Api<ConfigMap> = c.api("default");
    let owner = owners
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Gizmo"),
        "gizmos",
    );
    let gizmos: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), "default", &ar);
    let gizmo: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Gizmo",
        "metadata": {"name": "g", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "owner", "uid": owner.uid().unwrap()}]},
        "spec": {"x": 1}
    }))
    .unwrap();
    gizmos.create(&PostParams::default(), &gizmo).await.unwrap();
    owners
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    // At worst one resync (30 s) after the definition.
    wait_until_async(
        "the gizmo is collected",
        Duration::from_secs(90),
        || async {
            match gizmos.get_opt("g").await.unwrap() {
                None => Ok(()),
                Some(_) => Err("still there"),
            }
        },
    )
    .await;
}
