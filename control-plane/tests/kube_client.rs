//! The API server driven by the kube-rs client in-process: CRUD, optimistic concurrency,
//! list pagination and selectors, watch resume and 410, and kube-rs's watcher and reflector.

mod api_support;

use std::time::Duration;

use control_plane::apiserver::{Config, RunningServer, Server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use skiff_tests::wait_until_async;

struct Fixture {
    server: RunningServer,
    client: Client,
    _dir: tempfile::TempDir,
}

async fn start_with(f: impl FnOnce(&mut Config)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    api_support::configure(&mut config);
    f(&mut config);
    let server = Server::start(config).await.unwrap();
    let client = client_for(&server).await;
    Fixture {
        server,
        client,
        _dir: dir,
    }
}

async fn client_for(server: &RunningServer) -> Client {
    let kc = Kubeconfig::read_from(server.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "v"},
    }))
    .unwrap()
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

async fn crud_with_optimistic_concurrency() {
    let f = start_with(|_| {}).await;
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());

    let got = cms.get("a").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");

    let mut upd = created.clone();
    upd.data = Some([("k".to_string(), "w".to_string())].into());
    let upd = cms
        .replace("a", &PostParams::default(), &upd)
        .await
        .unwrap();
    assert!(
        upd.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv1.parse().unwrap()
    );

    // A write based on the old version is refused.
    let mut stale = created.clone();
    stale.data = Some([("k".to_string(), "x".to_string())].into());
    let err = cms
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("expected 409, got {other:?}"),
    }

    // Creating it again is AlreadyExists.
    match cms
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected 409, got {other:?}"),
    }

    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["x"], "y");

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    match cms.get("a").await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (404, "NotFound")),
        other => panic!("expected 404, got {other:?}"),
    }
    f.server.shutdown().await;
}

async fn lists_page_and_select() {
    let f = start_with(|_| {}).await;
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    for i in 0..7 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        cms.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), json!({"tier": tier})),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    loop {
        let page = cms.list(&lp).await.unwrap();
        assert!(page.items.len() <= 3);
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(names, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());
    let even = cms
        .list(&ListParams::default().labels("tier=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 4);
    let one = cms
        .list(&ListParams::default().fields("metadata.name=c3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    let all: Api<ConfigMap> = Api::all(f.client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        7
    );
    f.server.shutdown().await;
}

async fn watch_resumes_from_a_revision_and_expires_beyond_history() {
    let f = start_with(|c| c.watch_history = 5).await;
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &cm("w0", json!({})))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.unwrap();
    for i in 1..4 {
        cms.create(&PostParams::default(), &cm(&format!("w{i}"), json!({})))
            .await
            .unwrap();
    }
    // From rv: exactly the three later creates, in order.
    let mut s = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match s.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => seen.push(c.metadata.name.unwrap()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["w1", "w2", "w3"]);
    drop(s);
    // Push rv out of the 5-event history: resuming there is 410 Expired.
    for i in 4..10 {
        cms.create(&PostParams::default(), &cm(&format!("w{i}"), json!({})))
            .await
            .unwrap();
    }
    let mut s = cms
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    f.server.shutdown().await;
}

async fn kube_runtime_watcher_and_reflector_follow_changes() {
    let f = start_with(|c| c.bookmark_interval = Duration::from_millis(200)).await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    pods.create(&PostParams::default(), &pod("before"))
        .await
        .unwrap();

    let (reader, writer) = reflector::store::<Pod>();
    let stream = reflector(writer, watcher(pods.clone(), watcher::Config::default()))
        .applied_objects()
        .boxed();
    let task = tokio::spawn(async move {
        stream
            .for_each(|e| async move {
                e.expect("watcher error");
            })
            .await;
    });
    let names = |r: &reflector::Store<Pod>| {
        let mut n: Vec<String> = r
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        n.sort();
        n
    };
    reader.wait_until_ready().await.unwrap();
    assert_eq!(names(&reader), ["before"]);
    pods.create(&PostParams::default(), &pod("after"))
        .await
        .unwrap();
    wait_until_async(
        "the reflector sees the new pod",
        Duration::from_secs(10),
        || async {
            let n = names(&reader);
            if n == ["after", "before"] {
                Ok(())
            } else {
                Err(n)
            }
        },
    )
    .await;
    pods.delete("before", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async(
        "the reflector drops the deleted pod",
        Duration::from_secs(10),
        || async {
            let n = names(&reader);
            if n == ["after"] {
                Ok(())
            } else {
                Err(n)
            }
        },
    )
    .await;
    task.abort();

    // A streaming list (sendInitialEvents, ended by the initial-events-end bookmark).
    let (streamed, writer) = reflector::store::<Pod>();
    let stream = reflector(
        writer,
        watcher(pods.clone(), watcher::Config::default().streaming_lists()),
    )
    .applied_objects()
    .boxed();
    let task = tokio::spawn(async move {
        stream
            .for_each(|e| async move {
                e.expect("watcher error");
            })
            .await;
    });
    streamed.wait_until_ready().await.unwrap();
    assert_eq!(names(&streamed), ["after"]);
    task.abort();
    f.server.shutdown().await;
}

async fn health_version_and_metrics_endpoints() {
    let f = start_with(|_| {}).await;
    let get = |p: &'static str| {
        let c = f.client.clone();
        async move {
            let req = http::Request::get(p).body(Vec::new()).unwrap();
            c.request_text(req).await.unwrap()
        }
    };
    assert_eq!(get("/healthz").await, "ok");
    assert_eq!(get("/readyz").await, "ok");
    let v: serde_json::Value = serde_json::from_str(&get("/version").await).unwrap();
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("33"))
    );
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    cms.create(&PostParams::default(), &cm("m", json!({})))
        .await
        .unwrap();
    let m = get("/metrics").await;
    assert!(
        m.contains("skiff_apiserver_writes_total{resource=\"configmaps\",verb=\"create\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("skiff_apiserver_request_duration_seconds"),
        "{m}"
    );
    f.server.shutdown().await;
}

async fn data_survives_a_restart_and_revisions_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    api_support::configure(&mut config);
    let server = Server::start(config.clone()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let a = cms
        .create(&PostParams::default(), &cm("keep", json!({})))
        .await
        .unwrap();
    let svcs: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client_for(&server).await, "default");
    let first = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "first"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}}))
    .unwrap();
    let first = svcs.create(&PostParams::default(), &first).await.unwrap();
    let ip = first.spec.unwrap().cluster_ip.unwrap();
    server.shutdown().await;

    let server = Server::start(config).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let got = cms.get("keep").await.unwrap();
    assert_eq!(got.metadata.uid, a.metadata.uid);
    // The ClusterIP allocations were rebuilt from the store: the address is still taken,
    // and deleting its service frees it.
    let svcs: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client_for(&server).await, "default");
    let second = || -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "second"},
            "spec": {"clusterIP": ip, "ports": [{"port": 80}]}}))
        .unwrap()
    };
    match svcs
        .create(&PostParams::default(), &second())
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (422, "Invalid")),
        other => panic!("expected 422, got {other:?}"),
    }
    svcs.delete("first", &DeleteParams::default())
        .await
        .unwrap();
    svcs.create(&PostParams::default(), &second())
        .await
        .unwrap();
    let b = cms
        .create(&PostParams::default(), &cm("next", json!({})))
        .await
        .unwrap();
    let rv = |c: &ConfigMap| {
        c.metadata
            .resource_version
            .clone()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&b) > rv(&a), "revision continues after restart");
    server.shutdown().await;
}

async fn binding_reaches_the_node_scoped_watch_once() {
    let f = start_with(|_| {}).await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let all_pods: Api<Pod> = Api::all(f.client.clone());
    let rv = all_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // The node agent's watch: only pods bound to its node (served from the nodeName index).
    let mut node_watch = all_pods
        .watch(
            &WatchParams::default()
                .fields("spec.nodeName=node-1")
                .timeout(10),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let p = pods
        .create(&PostParams::default(), &pod("bind-me"))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let spec = p.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"), "defaulted");
    assert_eq!(spec.termination_grace_period_seconds, Some(30));

    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "bind-me"}, "target": {"kind": "Node", "name": "node-1"}});
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        "bind-me",
        &PostParams::default(),
        &binding,
    )
    .await
    .unwrap();
    match pods
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "bind-me",
            &PostParams::default(),
            &binding,
        )
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(s.code, 409),
        other => panic!("expected 409, got {other:?}"),
    }
    let bound = pods.get("bind-me").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-1"));
    let scheduled = bound.status.unwrap().conditions.unwrap();
    assert!(scheduled
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True"));

    // Entering the node's selection is ADDED for that watcher.
    match node_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("bind-me")),
        other => panic!("expected ADDED, got {other:?}"),
    }

    // Graceful deletion: the pod stays with a deletionTimestamp until a grace-0 delete.
    pods.delete("bind-me", &DeleteParams::default())
        .await
        .unwrap();
    let deleting = pods.get("bind-me").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    match node_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(p) => assert!(p.metadata.deletion_timestamp.is_some()),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    pods.delete("bind-me", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    match node_watch.try_next().await.unwrap().unwrap() {
        WatchEvent::Deleted(p) => assert_eq!(p.metadata.name.as_deref(), Some("bind-me")),
        other => panic!("expected DELETED, got {other:?}"),
    }
    assert!(pods.get_opt("bind-me").await.unwrap().is_none());
    f.server.shutdown().await;
}

async fn finalizers_dry_run_and_delete_collection() {
    let f = start_with(|_| {}).await;
    let cms: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    // dryRun=All stores nothing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    cms.create(&dry, &cm("dry", json!({}))).await.unwrap();
    assert!(cms.get_opt("dry").await.unwrap().is_none());

    // A finalizer holds the object after delete until it is removed.
    let mut held = cm("held", json!({}));
    held.metadata.finalizers = Some(vec!["skiff.test/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    cms.delete("held", &DeleteParams::foreground())
        .await
        .unwrap();
    let h = cms.get("held").await.unwrap();
    assert!(h.metadata.deletion_timestamp.is_some());
    let fins = h.metadata.finalizers.unwrap();
    assert!(fins.contains(&"foregroundDeletion".to_string()), "{fins:?}");
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        cms.get_opt("held").await.unwrap().is_none(),
        "gone once the finalizers are"
    );

    for i in 0..4 {
        let tier = if i < 3 { "a" } else { "b" };
        cms.create(
            &PostParams::default(),
            &cm(&format!("dc{i}"), json!({"tier": tier})),
        )
        .await
        .unwrap();
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("tier=a"),
    )
    .await
    .unwrap();
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["dc3"]);
    f.server.shutdown().await;
}

/// `pods/<name>/log` is relayed from the node's kubelet API: here an HTTPS server on loopback
/// with a serving certificate from the cluster CA that answers `/containerLogs/...` as the
/// node agent does, and sees the API server present its kubelet-client certificate.
async fn pod_logs_are_streamed_from_the_nodes_kubelet_api() {
    use control_plane::pki::{tls, Ca};
    let f = start_with(|_| {}).await;
    let pki = control_plane::apiserver::certs::pki_dir(f.server.data_dir());
    let ca = Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).unwrap();
    let serving = control_plane::apiserver::certs::kubelet_serving(
        &ca,
        "node-1",
        vec!["127.0.0.1".parse().unwrap()],
        Duration::from_secs(600),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(
        tls::server_config(&serving.cert_pem, &serving.key_pem).unwrap(),
    );
    let clients = control_plane::pki::ClientVerifier::new(ca.cert_der()).unwrap();
    let kubelet = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = kubelet.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (s, _) = kubelet.accept().await.unwrap();
        let mut s = acceptor.accept(s).await.unwrap();
        let caller = clients
            .verify(s.get_ref().1.peer_certificates().unwrap())
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).to_string();
        let body = "line one\nline two\n";
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(resp.as_bytes()).await.unwrap();
        let _ = s.shutdown().await;
        (request, caller.subject.common_name)
    });
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(f.client.clone());
    let node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), "default");
    let mut p = pod("logged");
    p.spec.as_mut().unwrap().node_name = Some("node-1".into());
    pods.create(&PostParams::default(), &p).await.unwrap();
    let lp = kube::api::LogParams {
        tail_lines: Some(2),
        ..Default::default()
    };
    let text = pods.logs("logged", &lp).await.unwrap();
    assert_eq!(text, "line one\nline two\n");
    let (request, caller) = served.await.unwrap();
    assert!(
        request.starts_with("GET /containerLogs/default/logged/c?tailLines=2 "),
        "{request}"
    );
    assert_eq!(caller, control_plane::apiserver::certs::KUBELET_CLIENT_USER);
    f.server.shutdown().await;
}

on_both_stores!(async: crud_with_optimistic_concurrency, lists_page_and_select, watch_resumes_from_a_revision_and_expires_beyond_history, kube_runtime_watcher_and_reflector_follow_changes, health_version_and_metrics_endpoints, data_survives_a_restart_and_revisions_continue, binding_reaches_the_node_scoped_watch_once, finalizers_dry_run_and_delete_collection, pod_logs_are_streamed_from_the_nodes_kubelet_api);
