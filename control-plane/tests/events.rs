//! core/v1 and events.k8s.io/v1 Events are one stored object with two views, as in
//! Kubernetes: what either API writes, the other reads (get, list with field selectors,
//! watch, update, delete), and `kubectl get events` shows both.

mod api_support;

use control_plane::apiserver::{Config, RunningServer, Server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::events::v1 as events;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent};
use kube::Client;
use serde_json::json;
use skiff_tests::kubectl::Kubectl;

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

/// A core/v1 Event as the kubelet writes it.
fn kubelet_event() -> Event {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "web-1.pulled", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web-1",
            "namespace": "default", "uid": "u-1", "fieldPath": "spec.containers{web}"},
        "reason": "Pulled", "message": "Successfully pulled image \"nginx\"", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
        "reportingComponent": "kubelet", "reportingInstance": "node-1",
        "firstTimestamp": "2025-01-01T11:59:00Z", "lastTimestamp": "2025-01-01T11:59:30Z",
        "count": 2,
    }))
    .unwrap()
}

/// An events.k8s.io/v1 Event as a new-style recorder writes it.
fn scheduler_event() -> events::Event {
    serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web-2.scheduled", "namespace": "default"},
        "eventTime": "2025-01-01T11:58:00.000000Z",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": "web-2", "namespace": "default", "uid": "u-2"},
        "reason": "Scheduled", "action": "Binding", "type": "Normal",
        "note": "Successfully assigned default/web-2 to node-2",
        "reportingController": "default-scheduler", "reportingInstance": "scheduler-1",
    }))
    .unwrap()
}

fn names<T: kube::Resource>(items: &[T]) -> Vec<String> {
    items
        .iter()
        .map(|e| e.meta().name.clone().unwrap())
        .collect()
}

async fn either_api_reads_what_the_other_wrote() {
    let (server, client, dir) = start().await;
    let core: Api<Event> = Api::namespaced(client.clone(), "default");
    let view: Api<events::Event> = Api::namespaced(client.clone(), "default");
    let rv = view
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut view_watch = view
        .watch(&kube::api::WatchParams::default().timeout(20), &rv)
        .await
        .unwrap()
        .boxed();
    let mut core_watch = core
        .watch(&kube::api::WatchParams::default().timeout(20), &rv)
        .await
        .unwrap()
        .boxed();

    // core/v1 -> events.k8s.io/v1
    core.create(&PostParams::default(), &kubelet_event())
        .await
        .unwrap();
    let seen = view.get("web-1.pulled").await.unwrap();
    let regarding = seen.regarding.clone().unwrap();
    assert_eq!(
        (regarding.name.as_deref(), regarding.field_path.as_deref()),
        (Some("web-1"), Some("spec.containers{web}"))
    );
    assert_eq!(
        seen.note.as_deref(),
        Some("Successfully pulled image \"nginx\"")
    );
    assert_eq!(seen.reporting_controller.as_deref(), Some("kubelet"));
    assert_eq!(seen.deprecated_count, Some(2));
    assert_eq!(
        seen.deprecated_source.unwrap().host.as_deref(),
        Some("node-1")
    );
    assert!(seen.deprecated_last_timestamp.is_some());
    match view_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(e) => assert_eq!(e.regarding.unwrap().name.as_deref(), Some("web-1")),
        other => panic!("expected ADDED in the events.k8s.io shape, got {other:?}"),
    }

    // events.k8s.io/v1 -> core/v1
    view.create(&PostParams::default(), &scheduler_event())
        .await
        .unwrap();
    let seen = core.get("web-2.scheduled").await.unwrap();
    assert_eq!(seen.involved_object.name.as_deref(), Some("web-2"));
    assert_eq!(
        seen.message.as_deref(),
        Some("Successfully assigned default/web-2 to node-2")
    );
    assert_eq!(
        seen.reporting_component.as_deref(),
        Some("default-scheduler")
    );
    assert_eq!(seen.action.as_deref(), Some("Binding"));
    match core_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(e) => assert_eq!(e.metadata.name.as_deref(), Some("web-1.pulled")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match core_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(e) => assert_eq!(e.involved_object.name.as_deref(), Some("web-2")),
        other => panic!("expected ADDED in the core shape, got {other:?}"),
    }

    // Field selectors in each API's own names, over the same objects.
    let by_core = core
        .list(&ListParams::default().fields("involvedObject.name=web-2"))
        .await
        .unwrap();
    assert_eq!(names(&by_core.items), ["web-2.scheduled"]);
    let by_view = view
        .list(&ListParams::default().fields("regarding.name=web-1,type=Normal"))
        .await
        .unwrap();
    assert_eq!(names(&by_view.items), ["web-1.pulled"]);
    let by_controller = view
        .list(&ListParams::default().fields("reportingController=default-scheduler"))
        .await
        .unwrap();
    assert_eq!(names(&by_controller.items), ["web-2.scheduled"]);
    match view
        .list(&ListParams::default().fields("note=x"))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(s.code, 400),
        other => panic!("expected 400, got {other:?}"),
    }

    // An update through one view is the other's MODIFIED; the revision is shared.
    let patched = view
        .patch(
            "web-2.scheduled",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"series": {"count": 3, "lastObservedTime": "2025-01-01T11:59:00.000000Z"}}),
            ),
        )
        .await
        .unwrap();
    match core_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(e) => {
            assert_eq!(e.series.unwrap().count, Some(3));
            assert_eq!(
                e.metadata.resource_version,
                patched.metadata.resource_version
            );
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    let mut stale = core.get("web-2.scheduled").await.unwrap();
    core.patch(
        "web-2.scheduled",
        &PatchParams::default(),
        &Patch::Merge(json!({"count": 1})),
    )
    .await
    .unwrap();
    stale.message = Some("changed".into());
    match core
        .replace("web-2.scheduled", &PostParams::default(), &stale)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(s.code, 409),
        other => panic!("expected 409, got {other:?}"),
    }

    // The events.k8s.io/v1 rules apply to its writes.
    let mut incomplete = scheduler_event();
    incomplete.metadata.name = Some("incomplete".into());
    incomplete.reporting_controller = None;
    match view
        .create(&PostParams::default(), &incomplete)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (422, "Invalid")),
        other => panic!("expected 422, got {other:?}"),
    }

    // kubectl get events: one table for what both APIs wrote.
    let k = Kubectl::new(server.kubeconfig_path(), dir.path());
    for resource in ["events", "events.v1.events.k8s.io"] {
        let table = tokio::task::block_in_place(|| k.ok(&["get", resource]));
        assert!(table.starts_with("LAST SEEN"), "{table}");
        for text in [
            "Pulled",
            "pod/web-1",
            "Successfully pulled image",
            "Scheduled",
            "pod/web-2",
            "Successfully assigned default/web-2 to node-2",
        ] {
            assert!(
                table.contains(text),
                "{text} in kubectl get {resource}:\n{table}"
            );
        }
    }

    // A delete through one view removes the object from both.
    view.delete("web-1.pulled", &DeleteParams::default())
        .await
        .unwrap();
    assert!(core.get_opt("web-1.pulled").await.unwrap().is_none());
    server.shutdown().await;
}

on_both_stores!(async: either_api_reads_what_the_other_wrote);
