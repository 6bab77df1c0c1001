//! Durability: kill -9 the server process in the middle of a burst of concurrent writes;
//! after a restart every acknowledged write is there, the revision continues past every
//! acknowledged one, and a kube-rs watcher that was running before the kill carries on.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;
use skiff_tests::apiserver::ApiServerProcess;
use skiff_tests::wait_until_async;

async fn client(kubeconfig: &std::path::Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.read_timeout = Some(Duration::from_secs(10));
    Client::try_from(config).unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"n": name},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ApiServerProcess::start(
        env!("CARGO_BIN_EXE_control-plane").as_ref(),
        &dir.path().join("data"),
        &[],
    );
    let c = client(&server.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");

    // A watcher and reflector that must survive the crash.
    let (reader, writer) = reflector::store::<ConfigMap>();
    let watch = reflector(writer, watcher(cms.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects()
        .for_each(|_| async {});
    let watch_task = tokio::spawn(watch);

    // 8 writers, each creating configmaps until its first failure (the kill).
    let acked = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let mut writers = Vec::new();
    for w in 0..8 {
        let cms = cms.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                match cms.create(&PostParams::default(), &cm(&name)).await {
                    Ok(o) => {
                        let rv = o.metadata.resource_version.unwrap().parse().unwrap();
                        acked.lock().unwrap().push((name, rv));
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    wait_until_async("writes are flowing", Duration::from_secs(30), || async {
        let n = acked.lock().unwrap().len();
        if n >= 300 {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;
    server.kill9();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let max_rv = acked.iter().map(|(_, rv)| *rv).max().unwrap();

    server.restart();
    let all = cms.list(&ListParams::default()).await.unwrap();
    let stored: BTreeSet<String> = all
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    let missing: Vec<&String> = acked
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !stored.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost: {missing:?}",
        missing.len()
    );

    let next = cms
        .create(&PostParams::default(), &cm("after-restart"))
        .await
        .unwrap();
    let rv: u64 = next.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > max_rv, "revision {rv} continues past {max_rv}");

    // The watcher from before the kill sees the world after it.
    wait_until_async(
        "the old watcher sees the post-restart write",
        Duration::from_secs(60),
        || async {
            let names: BTreeSet<String> = reader
                .state()
                .iter()
                .map(|c| c.metadata.name.clone().unwrap())
                .collect();
            if names.contains("after-restart") && acked.iter().all(|(n, _)| names.contains(n)) {
                Ok(())
            } else {
                Err(names.len())
            }
        },
    )
    .await;
    watch_task.abort();
    assert!(server.terminate(), "SIGTERM ends the server cleanly");
}
