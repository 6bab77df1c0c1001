//! ResourceQuota end to end: the admission plugin charging creates and refusing what exceeds
//! a quota (with Kubernetes' messages, nothing stored), the quota controller filling in and
//! giving back `status.used`, scopes, and concurrent creates that never go over the limit.
//! A real in-process API server and controller manager; kubectl and kube-rs as clients.

mod controllers_support;

use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(30);

fn pod(name: &str, cpu: Option<&str>) -> Pod {
    let resources = match cpu {
        Some(c) => json!({"requests": {"cpu": c}, "limits": {"cpu": c}}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "resources": resources}]}
    }))
    .unwrap()
}

/// Waits until the quota's status.used reads `want` (e.g. `pods=1,requests.cpu=500m`).
async fn used_becomes(quotas: &Api<ResourceQuota>, name: &str, want: &str) {
    wait_until_async(&format!("{name} used {want}"), WAIT, || async {
        let q = quotas.get(name).await.map_err(|e| e.to_string())?;
        let used: Vec<String> = q
            .status
            .and_then(|s| s.used)
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={}", v.0))
            .collect();
        let used = used.join(",");
        if used == want {
            Ok(())
        } else {
            Err(used)
        }
    })
    .await;
}

fn forbidden(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 && s.reason == "Forbidden" => s.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_charges_refuses_and_gives_back() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    k.ok(&["create", "namespace", "q"]);
    // kubectl create quota sends protobuf.
    k.ok(&[
        "create",
        "quota",
        "compute",
        "-n",
        "q",
        "--hard=pods=2,requests.cpu=1,count/configmaps=1",
    ]);
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), "q");
    used_becomes(
        &quotas,
        "compute",
        "count/configmaps=0,pods=0,requests.cpu=0",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "q");
    pods.create(&PostParams::default(), &pod("a", Some("500m")))
        .await
        .unwrap();
    // Charged at admission, before any controller saw the pod.
    let q = quotas.get("compute").await.unwrap();
    let used = q.status.unwrap().used.unwrap();
    assert_eq!(used["pods"].0, "1");
    assert_eq!(used["requests.cpu"].0, "500m");

    // A container that does not say what it requests of a limited resource.
    let msg = forbidden(
        pods.create(&PostParams::default(), &pod("vague", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        msg,
        "pods \"vague\" is forbidden: failed quota: compute: must specify requests.cpu for: web"
    );
    // Over the limit: refused with what was asked, used and allowed; nothing stored.
    let msg = forbidden(
        pods.create(&PostParams::default(), &pod("big", Some("600m")))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        msg,
        "pods \"big\" is forbidden: exceeded quota: compute, requested: requests.cpu=600m, used: requests.cpu=500m, limited: requests.cpu=1"
    );
    assert!(pods.get_opt("big").await.unwrap().is_none());
    // A dry run is checked but charges nothing.
    pods.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &pod("dry", Some("100m")),
    )
    .await
    .unwrap();
    assert!(pods.get_opt("dry").await.unwrap().is_none());
    let q = quotas.get("compute").await.unwrap();
    assert_eq!(q.status.unwrap().used.unwrap()["pods"].0, "1");

    // Object counts through kubectl: the second ConfigMap is one too many.
    k.ok(&["create", "configmap", "one", "-n", "q"]);
    let err = k.fails(&["create", "configmap", "two", "-n", "q"]);
    assert!(
        err.contains("configmaps \"two\" is forbidden: exceeded quota: compute, requested: count/configmaps=1, used: count/configmaps=1, limited: count/configmaps=1"),
        "{err}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "q");
    assert!(cms.get_opt("two").await.unwrap().is_none());
    let table = k.ok(&["get", "quota", "-n", "q"]);
    assert!(
        table.contains("count/configmaps: 1/1, pods: 1/2, requests.cpu: 500m/1"),
        "{table}"
    );

    // Deleting gives the usage back (the controller recomputes the namespace).
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    cms.delete("one", &DeleteParams::default()).await.unwrap();
    used_becomes(
        &quotas,
        "compute",
        "count/configmaps=0,pods=0,requests.cpu=0",
    )
    .await;
    // Raising the limit reaches status.hard.
    k.ok(&[
        "patch",
        "quota",
        "compute",
        "-n",
        "q",
        "-p",
        r#"{"spec":{"hard":{"pods":"5","requests.cpu":"1","count/configmaps":"1"}}}"#,
    ]);
    wait_until_async("status.hard pods=5", WAIT, || async {
        let q = quotas.get("compute").await.map_err(|e| e.to_string())?;
        let hard = q.status.and_then(|s| s.hard).unwrap_or_default();
        match hard.get("pods").map(|q| q.0.as_str()) {
            Some("5") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_never_exceed_the_quota() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "race"}})).unwrap(),
        )
        .await
        .unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), "race");
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "five"}, "spec": {"hard": {"pods": "5"}}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    used_becomes(&quotas, "five", "pods=0").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "race");
    let creates = (0..24).map(|i| {
        let pods = pods.clone();
        tokio::spawn(async move {
            pods.create(&PostParams::default(), &pod(&format!("p{i}"), None))
                .await
        })
    });
    let results = futures::future::join_all(creates).await;
    let mut admitted = 0;
    for r in results {
        match r.unwrap() {
            Ok(_) => admitted += 1,
            Err(e) => assert!(forbidden(e).contains(
                "exceeded quota: five, requested: pods=1, used: pods=5, limited: pods=5"
            ),),
        }
    }
    assert_eq!(admitted, 5);
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), 5);
    used_becomes(&quotas, "five", "pods=5").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scoped_quotas_count_only_their_pods() {
    let c = Cluster::start(fast_settings(), &[]).await;
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    k.ok(&["create", "namespace", "s"]);
    k.ok(&[
        "create",
        "quota",
        "best-effort",
        "-n",
        "s",
        "--hard=pods=1",
        "--scopes=BestEffort",
    ]);
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), "s");
    used_becomes(&quotas, "best-effort", "pods=0").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "s");
    pods.create(&PostParams::default(), &pod("free", None))
        .await
        .unwrap();
    let msg = forbidden(
        pods.create(&PostParams::default(), &pod("free2", None))
            .await
            .unwrap_err(),
    );
    assert!(msg.contains("exceeded quota: best-effort"), "{msg}");
    // A pod with requests is not BestEffort: outside the quota's scope.
    pods.create(&PostParams::default(), &pod("paid", Some("100m")))
        .await
        .unwrap();
    used_becomes(&quotas, "best-effort", "pods=1").await;
    c.shutdown().await;
}

/// Jobs, StatefulSets and their claims go through the same chain: the pods their controllers
/// create get the namespace's LimitRange defaults, the claims a StatefulSet makes from its
/// templates are charged as storage, and object counts of the batch and apps kinds are kept.
#[tokio::test(flavor = "multi_thread")]
async fn workload_controllers_pods_and_claims_pass_admission() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{LimitRange, PersistentVolumeClaim};

    let c = Cluster::start(fast_settings(), &[]).await;
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    k.ok(&["create", "namespace", "wl"]);
    let ranges: Api<LimitRange> = Api::namespaced(c.client.clone(), "wl");
    ranges
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "defaults"},
                "spec": {"limits": [{"type": "Container",
                    "default": {"cpu": "200m"}, "defaultRequest": {"cpu": "100m"}}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    k.ok(&[
        "create",
        "quota",
        "wl",
        "-n",
        "wl",
        "--hard=count/jobs.batch=1,count/statefulsets.apps=1,persistentvolumeclaims=1,requests.storage=1Gi",
    ]);
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client.clone(), "wl");
    used_becomes(
        &quotas,
        "wl",
        "count/jobs.batch=0,count/statefulsets.apps=0,persistentvolumeclaims=0,requests.storage=0",
    )
    .await;

    // A Job: its pod, created by the job controller, has the LimitRange's defaults.
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), "wl");
    let job = |name: &str| -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "work", "image": "busybox:1.36"}]}}}
        }))
        .unwrap()
    };
    jobs.create(&PostParams::default(), &job("once"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "wl");
    let defaulted = |p: &Pod| {
        let r = p.spec.as_ref()?.containers[0].resources.clone()?;
        Some((
            r.requests?.get("cpu")?.0.clone(),
            r.limits?.get("cpu")?.0.clone(),
        ))
    };
    wait_until_async("the job's pod, defaulted", WAIT, || async {
        let list = pods
            .list(&kube::api::ListParams::default().labels("job-name=once"))
            .await
            .map_err(|e| e.to_string())?;
        match list.items.first().map(defaulted) {
            Some(Some((req, lim))) if req == "100m" && lim == "200m" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // count/jobs.batch: a second Job is refused and not stored.
    let msg = forbidden(
        jobs.create(&PostParams::default(), &job("twice"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        msg,
        "jobs.batch \"twice\" is forbidden: exceeded quota: wl, requested: count/jobs.batch=1, used: count/jobs.batch=1, limited: count/jobs.batch=1"
    );
    assert!(jobs.get_opt("twice").await.unwrap().is_none());

    // A StatefulSet: its claim is charged as storage, its pod defaulted like the Job's.
    let sets: Api<StatefulSet> = Api::namespaced(c.client.clone(), "wl");
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "db"},
            "spec": {
                "serviceName": "db",
                "replicas": 1,
                "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "db", "image": "busybox:1.36"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}}]
            }
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    wait_until_async("the set's pod, defaulted", WAIT, || async {
        let p = pods.get_opt("db-0").await.map_err(|e| e.to_string())?;
        match p.as_ref().map(defaulted) {
            Some(Some((req, lim))) if req == "100m" && lim == "200m" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "wl");
    assert!(claims.get_opt("data-db-0").await.unwrap().is_some());
    used_becomes(
        &quotas,
        "wl",
        "count/jobs.batch=1,count/statefulsets.apps=1,persistentvolumeclaims=1,requests.storage=1Gi",
    )
    .await;
    // The quota is full: another claim is refused with what it asked for.
    let err = k
        .run_with_stdin(
            &["create", "-f", "-"],
            "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: extra, namespace: wl}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
",
        )
        .stderr;
    assert!(
        err.contains("persistentvolumeclaims \"extra\" is forbidden: exceeded quota: wl, requested: persistentvolumeclaims=1,requests.storage=1Gi, used: persistentvolumeclaims=1,requests.storage=1Gi, limited: persistentvolumeclaims=1,requests.storage=1Gi"),
        "{err}"
    );
    assert!(claims.get_opt("extra").await.unwrap().is_none());
    // Deleting the claim gives its storage back (the set goes first, its pod orphaned, so
    // that nothing makes the claim again).
    sets.delete("db", &DeleteParams::orphan()).await.unwrap();
    wait_until_async("the set gone", WAIT, || async {
        match sets.get_opt("db").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    claims
        .delete("data-db-0", &DeleteParams::default())
        .await
        .unwrap();
    // The claim carries kubernetes.io/pvc-protection: it goes once the set's orphaned pod,
    // which mounts it, is gone too.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = c.api("wl");
    pods.delete("db-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_until_async("storage given back", WAIT, || async {
        let q = quotas.get("wl").await.map_err(|e| e.to_string())?;
        let used = q.status.and_then(|s| s.used).unwrap_or_default();
        match used.get("requests.storage").map(|q| q.0.as_str()) {
            Some("0") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    c.shutdown().await;
}
