//! apps/v1 StatefulSets end to end against a real in-process API server, the controllers and
//! the scheduler, with nodes played through the API: pods started in order (each after the
//! ones before it are Ready), their stable identity and one claim per volumeClaimTemplate and
//! ordinal; then the real kubectl: `rollout status`, `set image`, `rollout history` (the
//! ControllerRevisions), `rollout undo` back to the first template, `scale` down from the
//! highest ordinal with the claims retained, and `get statefulsets` columns.

mod controllers_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(180);

const MANIFEST: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: nginx:1
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
"#;

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn image(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// Waits until the set's live pods are exactly `names`, all Ready, all running `image`.
async fn wait_pods(pods: &Api<Pod>, names: &[&str], want_image: &str) -> Vec<Pod> {
    let want: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
    wait_until_async(
        &format!("pods {want:?} ready with {want_image}"),
        WAIT,
        || async {
            let all = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .unwrap()
                .items;
            let got: BTreeSet<String> = all.iter().map(|p| p.name_any()).collect();
            let ok = got == want
                && all.iter().all(|p| {
                    is_ready(p) && p.metadata.deletion_timestamp.is_none() && image(p) == want_image
                });
            if ok {
                Ok(all)
            } else {
                Err(all
                    .iter()
                    .map(|p| (p.name_any(), is_ready(p), image(p)))
                    .collect::<Vec<_>>())
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_starts_in_order_keeps_claims_and_rolls_back_with_kubectl() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(WAIT);
    let pods: Api<Pod> = c.api("default");
    let sets: Api<StatefulSet> = c.api("default");
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    let revisions: Api<ControllerRevision> = c.api("default");
    // The set's claims (no class) bind to these static volumes (one each), so that the
    // scheduler's VolumeBinding lets their pods run.
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(c.client.clone());
    for i in 0..3 {
        let pv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-volume-{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": format!("/tmp/web-volume-{i}")}}
        }))
        .unwrap();
        volumes
            .create(&kube::api::PostParams::default(), &pv)
            .await
            .unwrap();
    }

    // For every pod, the Ready pods of the set when it first appeared.
    let watch_pods = pods.clone();
    let seen = tokio::spawn(async move {
        let mut ready: BTreeMap<String, bool> = BTreeMap::new();
        let mut first_seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let stream = watcher(watch_pods, watcher::Config::default().labels("app=web"))
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(Ok(p))) = tokio::time::timeout(
            Duration::from_secs(60),
            futures::StreamExt::next(&mut stream),
        )
        .await
        {
            let name = p.name_any();
            first_seen.entry(name.clone()).or_insert_with(|| {
                ready
                    .iter()
                    .filter(|(_, r)| **r)
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            ready.insert(name, is_ready(&p));
            if first_seen.len() == 3 && ready.values().all(|r| *r) {
                break;
            }
        }
        first_seen
    });

    let file = dir.path().join("web.yaml");
    std::fs::write(&file, MANIFEST).unwrap();
    k.ok(&["apply", "-f", file.to_str().unwrap()]);
    // kubectl reads a RollingUpdate with a partition (defaulted to 0) as a partitioned one.
    let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(
        out.contains("partitioned roll out complete: 3 new pods have been updated"),
        "{out}"
    );
    let all = wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:1").await;

    // OrderedReady: web-1 appeared once web-0 was Ready, web-2 once both were.
    let first_seen = seen.await.unwrap();
    assert_eq!(first_seen["web-0"], BTreeSet::new(), "{first_seen:?}");
    assert_eq!(
        first_seen["web-1"],
        BTreeSet::from(["web-0".to_string()]),
        "{first_seen:?}"
    );
    assert_eq!(
        first_seen["web-2"],
        BTreeSet::from(["web-0".to_string(), "web-1".to_string()]),
        "{first_seen:?}"
    );

    // Stable identity and one retained claim per ordinal, mounted by the pod.
    for p in &all {
        let name = p.name_any();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(name.as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("web"));
        assert_eq!(p.labels()["statefulset.kubernetes.io/pod-name"], name);
        let claim_name = format!("www-{name}");
        let mounted = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .any(|v| v.claim_name == claim_name);
        assert!(mounted, "{name} mounts {claim_name}");
        let claim = claims.get(&claim_name).await.unwrap();
        assert!(
            claim.metadata.owner_references.is_none(),
            "retained: {claim:?}"
        );
        assert_eq!(claim.labels()["app"], "web");
    }

    // A new template rolls the pods from the highest ordinal; history has two revisions.
    k.ok(&["set", "image", "statefulset/web", "c=nginx:2"]);
    let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(out.contains("roll out complete"), "{out}");
    wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:2").await;
    let history = k.ok(&["rollout", "history", "statefulset/web"]);
    let numbers: Vec<&str> = history
        .lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(numbers, ["1", "2"], "{history}");
    let detail = k.ok(&["rollout", "history", "statefulset/web", "--revision=1"]);
    assert!(detail.contains("nginx:1"), "{detail}");

    // Undo: back to the first template, which becomes revision 3 (no new object).
    let out = k.ok(&["rollout", "undo", "statefulset/web"]);
    assert!(out.contains("rolled back"), "{out}");
    k.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:1").await;
    let revs = revisions
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    let numbers: BTreeSet<i64> = revs.iter().map(|r| r.revision).collect();
    assert_eq!(numbers, BTreeSet::from([2, 3]), "{revs:?}");
    let set = sets.get("web").await.unwrap();
    let status = set.status.unwrap();
    assert_eq!(status.current_revision, status.update_revision);
    assert_eq!(status.updated_replicas, Some(3));

    // Scale down: the highest ordinals go, their claims stay (whenScaled: Retain).
    k.ok(&["scale", "statefulset/web", "--replicas=1"]);
    wait_pods(&pods, &["web-0"], "nginx:1").await;
    let names: BTreeSet<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["www-web-0", "www-web-1", "www-web-2"].map(String::from))
    );
    let table = k.ok(&["get", "statefulsets"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["web", "1/1"]);
    let bad = k.run(&["scale", "statefulset/web", "--replicas=-1"]);
    assert!(!bad.success);
    c.shutdown().await;
}
