//! Backups as the README describes them, with the real binary: `control-plane snapshot save`
//! from a running server (and from a stopped one's data directory), `snapshot restore` into a
//! fresh data directory, and a server started there has exactly what was saved. For etcd:
//! etcd's snapshot, restored with etcd's procedure into a fresh member that a server then
//! serves from.

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skiff_tests::apiserver::ApiServerProcess;
use skiff_tests::etcd::EtcdCluster;

const BINARY: &str = env!("CARGO_BIN_EXE_control-plane");

/// Runs `control-plane snapshot ARGS`; its stdout, or a panic with its stderr.
fn snapshot(args: &[&str]) -> Result<String, String> {
    let out = Command::new(BINARY)
        .arg("snapshot")
        .args(args)
        .output()
        .expect("running control-plane snapshot");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn configmaps(server: &ApiServerProcess) -> Api<ConfigMap> {
    let client = control_plane::runtime::client::from_kubeconfig(&server.kubeconfig())
        .await
        .unwrap();
    Api::namespaced(client, "default")
}

async fn create(cms: &Api<ConfigMap>, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
}

async fn names(cms: &Api<ConfigMap>) -> Vec<String> {
    cms.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_saved_while_serving_restores_into_a_fresh_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = ApiServerProcess::start(BINARY.as_ref(), &data, &[]);
    let cms = configmaps(&server).await;
    create(&cms, "saved").await;
    let file = dir.path().join("backup.redb");
    let out = snapshot(&["save", path(&file), "--data-dir", path(&data)]).unwrap();
    assert!(out.contains("revision"), "{out}");
    create(&cms, "after").await;
    server.terminate();

    // With no server running, the command reads the store itself.
    let offline = dir.path().join("offline.redb");
    snapshot(&["save", path(&offline), "--data-dir", path(&data)]).unwrap();

    // Restore never overwrites a store.
    let refused = snapshot(&["restore", path(&file), "--data-dir", path(&data)]).unwrap_err();
    assert!(refused.contains("already exists"), "{refused}");
    let restored = dir.path().join("restored");
    snapshot(&["restore", path(&file), "--data-dir", path(&restored)]).unwrap();
    let server = ApiServerProcess::start(BINARY.as_ref(), &restored, &[]);
    let cms = configmaps(&server).await;
    assert_eq!(names(&cms).await, ["saved"]);
    create(&cms, "new").await;
    assert_eq!(names(&cms).await, ["new", "saved"]);
    drop(server);

    let from_offline = dir.path().join("from-offline");
    snapshot(&["restore", path(&offline), "--data-dir", path(&from_offline)]).unwrap();
    let server = ApiServerProcess::start(BINARY.as_ref(), &from_offline, &[]);
    assert_eq!(names(&configmaps(&server).await).await, ["after", "saved"]);

    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"not a store").unwrap();
    let refused = snapshot(&[
        "restore",
        path(&garbage),
        "--data-dir",
        path(&dir.path().join("x")),
    ])
    .unwrap_err();
    assert!(refused.contains("not a store snapshot"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_snapshot_restores_with_etcds_procedure() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start_in(&dir.path().join("etcd"), 1);
    let store_args = ["--store".to_string(), etcd.url()];
    let args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    let mut server = ApiServerProcess::start(BINARY.as_ref(), &dir.path().join("data"), &args);
    let cms = configmaps(&server).await;
    create(&cms, "saved").await;
    let file = dir.path().join("etcd.db");
    let out = snapshot(&["save", path(&file), "--store", &etcd.url()]).unwrap();
    assert!(out.contains("bytes"), "{out}");
    create(&cms, "after").await;
    server.terminate();
    drop(etcd);

    // etcd's procedure: a fresh data directory per member, restored from the file, then the
    // members started on them.
    let mut restored = EtcdCluster::plan_in(&dir.path().join("restored"), 1);
    let member = &restored.members()[0];
    snapshot(&[
        "restore",
        path(&file),
        "--etcd-data-dir",
        path(member.data_dir()),
        "--name",
        &member.name,
        "--initial-cluster",
        restored.initial_cluster(),
        "--initial-advertise-peer-urls",
        &member.peer_url(),
    ])
    .unwrap();
    restored.start_all();
    let store_args = ["--store".to_string(), restored.url()];
    let args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    let server = ApiServerProcess::start(BINARY.as_ref(), &dir.path().join("data2"), &args);
    let cms = configmaps(&server).await;
    assert_eq!(names(&cms).await, ["saved"]);
    create(&cms, "new").await;
    assert_eq!(names(&cms).await, ["new", "saved"]);

    // A damaged file is refused before anything is written.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    let damaged = dir.path().join("damaged.db");
    std::fs::write(&damaged, bytes).unwrap();
    let target = dir.path().join("never");
    assert!(snapshot(&[
        "restore",
        path(&damaged),
        "--etcd-data-dir",
        path(&target),
        "--name",
        "m0",
        "--initial-cluster",
        "m0=http://127.0.0.1:1",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:1",
    ])
    .is_err());
}
