//! When a write finishes a deletion, as Kubernetes decides it (the generic registry's
//! ShouldDeleteDuringUpdate): an object with a deletionTimestamp goes once nothing holds it
//! (finalizers; a namespace's spec finalizers) and no grace period runs. A pod under graceful
//! deletion survives every status and main-resource write until the node agent's final
//! DELETE with grace 0. An eviction (pods/eviction, as `kubectl drain` sends it) is a
//! graceful delete with the Eviction's options.

mod api_support;

use control_plane::apiserver::{Config, RunningServer, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

async fn start() -> (RunningServer, Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    api_support::configure(&mut config);
    let server = Server::start(config).await.unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    (server, client, dir)
}

fn bound_pod(name: &str, finalizers: &[&str]) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

/// A status write as the node agent makes it (merge patch on pods/status).
async fn write_status(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap()
}

async fn a_gracefully_deleted_pod_survives_status_writes_until_its_final_delete() {
    let (server, client, _dir) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &bound_pod("graceful", &[]))
        .await
        .unwrap();
    write_status(&pods, "graceful", "Running").await;
    pods.delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    let deleting = pods.get("graceful").await.unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));

    // The kubelet keeps reporting while the containers stop: the pod stays.
    let written = write_status(&pods, "graceful", "Running").await;
    assert!(written.metadata.deletion_timestamp.is_some());
    assert!(
        pods.get_opt("graceful").await.unwrap().is_some(),
        "a status write never removes a pod under graceful deletion"
    );
    // So does a write to the main resource (a label).
    pods.patch(
        "graceful",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    write_status(&pods, "graceful", "Succeeded").await;
    let last = pods.get("graceful").await.unwrap();
    assert_eq!(
        last.status.unwrap().phase.as_deref(),
        Some("Succeeded"),
        "the last status is written before the object goes"
    );

    // The node agent's final DELETE (grace 0) removes it.
    pods.delete("graceful", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("graceful").await.unwrap().is_none());
    server.shutdown().await;
}

async fn finalizers_hold_pods_and_objects_until_removed_and_no_grace_period_runs() {
    let (server, client, _dir) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let no_finalizers = Patch::Merge(json!({"metadata": {"finalizers": null}}));

    // Deleted with grace 0 but held by a finalizer: status writes keep it (they cannot
    // change finalizers); removing the finalizer removes it.
    pods.create(
        &PostParams::default(),
        &bound_pod("held", &["skiff.test/hold"]),
    )
    .await
    .unwrap();
    pods.delete("held", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let held = pods.get("held").await.unwrap();
    assert_eq!(held.metadata.deletion_grace_period_seconds, Some(0));
    write_status(&pods, "held", "Failed").await;
    assert!(pods.get_opt("held").await.unwrap().is_some());
    pods.patch("held", &PatchParams::default(), &no_finalizers)
        .await
        .unwrap();
    assert!(
        pods.get_opt("held").await.unwrap().is_none(),
        "gone with its last finalizer"
    );

    // Deleted gracefully and held: removing the finalizer during the grace period leaves the
    // pod to the node agent's final DELETE.
    pods.create(
        &PostParams::default(),
        &bound_pod("held-graceful", &["skiff.test/hold"]),
    )
    .await
    .unwrap();
    pods.delete("held-graceful", &DeleteParams::default())
        .await
        .unwrap();
    pods.patch("held-graceful", &PatchParams::default(), &no_finalizers)
        .await
        .unwrap();
    assert!(
        pods.get_opt("held-graceful").await.unwrap().is_some(),
        "the grace period still runs"
    );
    pods.delete("held-graceful", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("held-graceful").await.unwrap().is_none());

    // Any kind: a finalizer's removal finishes the deletion; other writes do not.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm", "finalizers": ["skiff.test/a", "skiff.test/b"]}}))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("cm", &DeleteParams::default()).await.unwrap();
    cms.patch(
        "cm",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["skiff.test/b"]}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("cm").await.unwrap().is_some(), "one left");
    cms.patch("cm", &PatchParams::default(), &no_finalizers)
        .await
        .unwrap();
    assert!(cms.get_opt("cm").await.unwrap().is_none());

    // A namespace goes when /finalize empties its spec finalizers.
    let namespaces: Api<Namespace> = Api::all(client);
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}),
    )
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let mut terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(
        terminating.status.as_ref().unwrap().phase.as_deref(),
        Some("Terminating")
    );
    terminating.spec.as_mut().unwrap().finalizers = Some(vec![]);
    namespaces
        .replace_subresource("finalize", "doomed", &PostParams::default(), &terminating)
        .await
        .unwrap();
    assert!(namespaces.get_opt("doomed").await.unwrap().is_none());
    server.shutdown().await;
}

async fn an_eviction_deletes_the_pod_gracefully_with_its_options() {
    let (server, client, _dir) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["evicted", "evicted-now"] {
        pods.create(&PostParams::default(), &bound_pod(name, &[]))
            .await
            .unwrap();
        write_status(&pods, name, "Running").await;
    }
    // What `kubectl drain` does: POST pods/<name>/eviction.
    let status = pods
        .evict("evicted", &kube::api::EvictParams::default())
        .await
        .unwrap();
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    let deleting = pods.get("evicted").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(
        deleting.metadata.deletion_grace_period_seconds,
        Some(30),
        "the pod's own grace period"
    );
    // The eviction's delete options apply: grace 0 removes a pod at once. (Raw JSON: kube-rs
    // 3 writes the options as `delete_options`, which Kubernetes ignores too.)
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "evicted-now"}, "deleteOptions": {"gracePeriodSeconds": 0}});
    let req = http::Request::post("/api/v1/namespaces/default/pods/evicted-now/eviction")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let answer: serde_json::Value = client.request(req).await.unwrap();
    assert_eq!(answer["status"], "Success", "{answer}");
    assert!(pods.get_opt("evicted-now").await.unwrap().is_none());
    // The name in the body must be the pod's.
    let body =
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}});
    let req = http::Request::post("/api/v1/namespaces/default/pods/evicted/eviction")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let err = client.request::<serde_json::Value>(req).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400),
        "{err:?}"
    );
    // A pod that does not exist: 404.
    let err = pods
        .evict("nobody", &kube::api::EvictParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "{err:?}"
    );
    drop(server);
}

on_both_stores!(async: a_gracefully_deleted_pod_survives_status_writes_until_its_final_delete, finalizers_hold_pods_and_objects_until_removed_and_no_grace_period_runs, an_eviction_deletes_the_pod_gracefully_with_its_options);
