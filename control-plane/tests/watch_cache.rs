//! The watch cache as clients see it, on both stores: a paged list is one snapshot (later
//! pages show the objects as they were at the first page's revision) or 410 once that
//! snapshot is gone; a streaming list's initial-events-end bookmark comes after every event it
//! covers and before every newer one. On etcd also: a value that cannot be decoded is
//! reported, never served stale; when etcd goes away /readyz says why (and /livez after the
//! grace period), and the server serves again once etcd is back.

mod api_support;

use std::time::Duration;

use control_plane::apiserver::{Config, RunningServer, Server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;
use serde_json::json;
use skiff_tests::kubeconfig::KubeconfigAccess;
use skiff_tests::wait_until_async;

async fn start_with(f: impl FnOnce(&mut Config)) -> (RunningServer, Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    api_support::configure(&mut config);
    f(&mut config);
    let server = Server::start(config).await.unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    (server, client, dir)
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"v": value},
    }))
    .unwrap()
}

fn value(c: &ConfigMap) -> (String, String) {
    (
        c.metadata.name.clone().unwrap(),
        c.data.as_ref().unwrap()["v"].clone(),
    )
}

fn rv_of(c: &ConfigMap) -> u64 {
    c.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

async fn a_paged_list_is_one_snapshot_or_gone() {
    let (server, client, _dir) = start_with(|c| c.watch_history = 20).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for n in ["a", "c", "e", "g"] {
        cms.create(&PostParams::default(), &cm(n, "old"))
            .await
            .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(
        first.items.iter().map(value).collect::<Vec<_>>(),
        [("a".into(), "old".into())]
    );
    let token = first.metadata.continue_.clone().unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();

    // Between the pages: one object goes, one comes, one changes.
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("d", "new"))
        .await
        .unwrap();
    cms.replace("e", &PostParams::default(), &{
        let mut e = cms.get("e").await.unwrap();
        e.data = Some([("v".to_string(), "new".to_string())].into());
        e
    })
    .await
    .unwrap();

    let rest = cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.metadata.resource_version.as_deref(), Some(rv.as_str()));
    assert_eq!(
        rest.items.iter().map(value).collect::<Vec<_>>(),
        [
            ("c".into(), "old".into()),
            ("e".into(), "old".into()),
            ("g".into(), "old".into())
        ],
        "the second page shows the objects as the first page did"
    );
    assert!(rest.items.iter().all(|c| rv_of(c) <= rv.parse().unwrap()));

    // Enough changes that the cache no longer knows the objects at the first page's
    // revision: the token has expired, as after an etcd compaction.
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("x{i}"), "v"))
            .await
            .unwrap();
    }
    match cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    server.shutdown().await;
}

async fn the_initial_events_end_bookmark_follows_every_event_it_covers() {
    let (server, client, _dir) = start_with(|_| {}).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("s{i}"), "0"))
            .await
            .unwrap();
    }
    // Writes race with every watch's start.
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            for round in 0..40 {
                for i in 0..5 {
                    let _ = cms
                        .patch(
                            &format!("s{i}"),
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(json!({"data": {"v": round.to_string()}})),
                        )
                        .await;
                }
            }
        })
    };
    let mut watches = 0;
    while !writer.is_finished() || watches < 3 {
        watches += 1;
        let mut s = cms
            .watch(&WatchParams::streaming_lists().timeout(10), "")
            .await
            .unwrap()
            .boxed();
        let mut initial = Vec::new();
        let bookmark = loop {
            match s.try_next().await.unwrap().expect("the stream goes on") {
                WatchEvent::Added(c) => initial.push(rv_of(&c)),
                WatchEvent::Bookmark(b) => {
                    assert_eq!(
                        b.metadata
                            .annotations
                            .get("k8s.io/initial-events-end")
                            .map(String::as_str),
                        Some("true")
                    );
                    break b.metadata.resource_version.parse::<u64>().unwrap();
                }
                other => panic!("before the bookmark: {other:?}"),
            }
        };
        assert_eq!(initial.len(), 5);
        assert!(
            initial.iter().all(|r| *r <= bookmark),
            "{initial:?} > {bookmark}"
        );
        // The next event (if the writer is still going) is newer than the bookmark.
        if let Ok(Some(Ok(WatchEvent::Modified(c)))) =
            tokio::time::timeout(Duration::from_millis(200), s.next()).await
        {
            assert!(
                rv_of(&c) > bookmark,
                "MODIFIED at {} after the bookmark at {bookmark}",
                rv_of(&c)
            );
        }
    }
    writer.await.unwrap();
    server.shutdown().await;
}

on_both_stores!(async: a_paged_list_is_one_snapshot_or_gone, the_initial_events_end_bookmark_follows_every_event_it_covers);

/// A GET of the server's own URL as the admin (HTTPS, the kubeconfig's CA and client
/// certificate), as text: not through kube's client, which retries 503s (and these tests want
/// to see them).
async fn get_text(server: &RunningServer, path: &str) -> (u16, String) {
    let access = KubeconfigAccess::read(server.kubeconfig_path()).unwrap();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || access.get(&path, Duration::from_secs(10)).unwrap())
        .await
        .unwrap()
}

/// etcd only: a key holding something that is not an object (written with etcdctl, as another
/// writer could) is reported on reads of it and on /readyz, and left out of lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_an_undecodable_value_is_reported_not_served_stale() {
    api_support::run_async(api_support::StoreKind::Etcd, async {
        let mut prefix = String::new();
        let (server, client, _dir) = start_with(|c| {
            if let control_plane::store::Backend::Etcd(e) = &c.store {
                prefix = e.prefix.clone();
            }
        })
        .await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        cms.create(&PostParams::default(), &cm("bad", "v"))
            .await
            .unwrap();
        let key = format!("{prefix}/registry/configmaps/default/bad");
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &skiff_tests::etcd::shared().endpoints()[0]])
            .args(["put", &key, "{not json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let err = wait_until_async("the GET reports the value", Duration::from_secs(10), || {
            let cms = cms.clone();
            async move {
                match cms.get("bad").await {
                    Err(kube::Error::Api(s)) if s.code == 500 => Ok(s.message),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
        assert!(err.contains("cannot be decoded"), "{err}");
        assert!(cms
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty());
        let (code, text) = get_text(&server, "/readyz").await;
        assert_eq!(code, 200);
        assert!(
            text.contains("undecodable") && text.contains(&key[key.find("/registry").unwrap()..]),
            "{text}"
        );
        server.shutdown().await;
    })
    .await
}

/// etcd only, on an etcd of its own: while it is gone /readyz fails with the reason, /livez
/// too after the grace period; once it is back the cache reloads and the server serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_while_the_store_is_gone_readyz_says_why_and_the_server_recovers() {
    let mut etcd = skiff_tests::etcd::EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    let mut store = control_plane::store::etcd::EtcdConfig::new(etcd.endpoints());
    store.compaction_interval = Duration::ZERO;
    config.store = control_plane::store::Backend::Etcd(store);
    config.cache_liveness_grace = Duration::from_secs(2);
    let server = Server::start(config).await.unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("before", "v"))
        .await
        .unwrap();
    assert_eq!(get_text(&server, "/readyz").await, (200, "ok".into()));

    etcd.kill(0);
    let text = wait_until_async("/readyz fails", Duration::from_secs(30), || {
        let server = &server;
        async move {
            match get_text(server, "/readyz").await {
                (503, t) => Ok(t),
                other => Err(other),
            }
        }
    })
    .await;
    assert!(text.contains("[-]watch-cache failed"), "{text}");
    // Reads fail at once (503), not after a timeout, and say why.
    let (code, status) = get_text(&server, "/api/v1/namespaces/default/configmaps/before").await;
    assert_eq!(code, 503, "{status}");
    assert!(status.contains("not following the store"), "{status}");
    wait_until_async(
        "/livez fails after its grace period",
        Duration::from_secs(30),
        || {
            let server = &server;
            async move {
                match get_text(server, "/livez").await {
                    (503, t) if t.contains("watch-cache") => Ok(()),
                    other => Err(other),
                }
            }
        },
    )
    .await;

    etcd.restart(0);
    wait_until_async("/readyz passes again", Duration::from_secs(60), || {
        let server = &server;
        async move {
            match get_text(server, "/readyz").await {
                (200, _) => Ok(()),
                other => Err(other),
            }
        }
    })
    .await;
    assert_eq!(get_text(&server, "/livez").await.0, 200);
    cms.create(&PostParams::default(), &cm("after", "v"))
        .await
        .unwrap();
    let names: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["after", "before"]);
    server.shutdown().await;
}
