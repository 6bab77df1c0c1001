//! Each namespace's identity for pods, kept by two controllers: the serviceaccounts
//! controller (a `default` ServiceAccount in every namespace, put back when deleted) and the
//! root CA publisher (a `kube-root-ca.crt` ConfigMap with the cluster's CA bundle, put back
//! when deleted or edited). A real in-process API server and controller manager; kubectl
//! and kube-rs as clients. The bundle is the one `control-plane server` publishes: the
//! certificate authority of the controller manager's kubeconfig, the cluster CA.

mod controllers_support;

use std::time::Duration;

use control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG;
use control_plane::controllers::rootcacertpublisher;
use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(30);

/// Waits until `cms` holds a `kube-root-ca.crt` with exactly `ca`.
async fn published(cms: &Api<ConfigMap>, ca: &str) {
    wait_until_async("kube-root-ca.crt published", WAIT, || async {
        let cm = cms
            .get_opt("kube-root-ca.crt")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("absent")?;
        let data = cm.data.unwrap_or_default();
        match data.get("ca.crt") {
            Some(got) if got == ca && data.len() == 1 => Ok(()),
            _ => Err(format!("data {data:?}")),
        }
    })
    .await;
}

async fn has_default_account(sas: &Api<ServiceAccount>) {
    wait_until_async("the default service account", WAIT, || async {
        match sas.get_opt("default").await.map_err(|e| e.to_string())? {
            Some(_) => Ok(()),
            None => Err("absent".to_string()),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_namespace_gets_a_default_account_and_the_root_ca() {
    let mut c = Cluster::api_only().await;
    // As `control-plane server` does: the bundle from the controller manager's kubeconfig,
    // which must be the cluster CA the server made in its data directory.
    let root_ca = rootcacertpublisher::load(
        None,
        &c.server()
            .component_kubeconfig(CONTROLLER_MANAGER_KUBECONFIG),
    )
    .unwrap()
    .expect("the controller manager's kubeconfig names a certificate authority");
    let ca = std::fs::read_to_string(
        control_plane::apiserver::certs::pki_dir(c.server().data_dir()).join("ca.crt"),
    )
    .unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    assert_eq!(&*root_ca.0, ca.as_str());
    c.start_scheduler();
    c.start_controllers(control_plane::controllers::Settings {
        root_ca: Some(root_ca),
        ..fast_settings()
    })
    .await;
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());

    // Namespaces that exist at start, and new ones.
    for ns in ["default", "kube-system"] {
        has_default_account(&c.api(ns)).await;
        published(&c.api(ns), &ca).await;
    }
    k.ok(&["create", "namespace", "team"]);
    let sas: Api<ServiceAccount> = c.api("team");
    let cms: Api<ConfigMap> = c.api("team");
    has_default_account(&sas).await;
    published(&cms, &ca).await;
    let listed = k.ok(&["get", "serviceaccounts", "-n", "team", "-o", "name"]);
    assert_eq!(listed.trim(), "serviceaccount/default");

    // Deleted: put back (a new object, a new uid).
    let uid = sas.get("default").await.unwrap().metadata.uid;
    k.ok(&["delete", "serviceaccount", "default", "-n", "team"]);
    wait_until_async("a new default service account", WAIT, || async {
        match sas.get_opt("default").await.map_err(|e| e.to_string())? {
            Some(sa) if sa.metadata.uid != uid => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    cms.delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    published(&cms, &ca).await;

    // Edited: restored, what else it carries kept.
    cms.patch(
        "kube-root-ca.crt",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"mine": "yes"}},
            "data": {"ca.crt": "forged", "extra": "x"}})),
    )
    .await
    .unwrap();
    published(&cms, &ca).await;
    let cm = cms.get("kube-root-ca.crt").await.unwrap();
    assert_eq!(cm.metadata.labels.unwrap()["mine"], "yes");
    assert!(cm
        .metadata
        .annotations
        .unwrap()
        .contains_key("kubernetes.io/description"));

    // A namespace being deleted gets nothing back.
    k.ok(&[
        "delete",
        "namespace",
        "team",
        "--wait=true",
        "--timeout=60s",
    ]);
    let gone = k.run(&["get", "namespace", "team"]);
    assert!(!gone.success, "namespace still there: {}", gone.stdout);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_root_ca_only_the_accounts_are_kept() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    k.ok(&["create", "namespace", "plain"]);
    has_default_account(&c.api("plain")).await;
    let cms: Api<ConfigMap> = c.api("plain");
    assert!(cms.get_opt("kube-root-ca.crt").await.unwrap().is_none());
    c.shutdown().await;
}
