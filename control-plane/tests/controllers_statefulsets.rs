//! apps/v1 StatefulSets end to end against a real in-process API server, the controllers and
//! the scheduler, with nodes played through the API: pods started in order (each after the
//! ones before it are Ready), their stable identity and one claim per volumeClaimTemplate and
//! ordinal; then the real kubectl: `rollout status`, `set image`, `rollout history` (the
//! ControllerRevisions), `rollout undo` back to the first template, `scale` down from the
//! highest ordinal with the claims retained, and `get statefulsets` columns. Then, with a
//! watch of the pods' deletions: a deleted pod coming back as itself (name, hostname, claim),
//! a roll held by a partition and then finished from the highest ordinal, a scale down one
//! pod at a time, the headless Service's EndpointSlices naming each pod; and the claim
//! retention policy carried out by the garbage collector.

mod controllers_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
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
    wait_app_pods(pods, "web", names, want_image).await
}

/// Waits until the pods labelled `app=<app>` are exactly `names`, all Ready, all running
/// `image`.
async fn wait_app_pods(pods: &Api<Pod>, app: &str, names: &[&str], want_image: &str) -> Vec<Pod> {
    let want: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
    let labels = format!("app={app}");
    wait_until_async(
        &format!("pods {want:?} ready with {want_image}"),
        WAIT,
        || async {
            let all = pods
                .list(&ListParams::default().labels(&labels))
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

/// Static volumes without a class, one per claim the test's sets will make, so that the
/// claims bind and the scheduler's VolumeBinding lets their pods run.
async fn create_volumes(c: &Cluster, n: usize) {
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    for i in 0..n {
        let pv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("volume-{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": format!("/tmp/volume-{i}")}}
        }))
        .unwrap();
        volumes.create(&PostParams::default(), &pv).await.unwrap();
    }
}

/// What a watch of the set's pods saw happen to one of them.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// First seen with a deletionTimestamp (or gone without one).
    Terminating(String),
    /// Its deletion finished.
    Gone(String),
}

/// A [`Seen`] with the pods that were Ready (and not terminating) at that moment, by name,
/// with their image.
#[derive(Clone, Debug)]
struct Record {
    seen: Seen,
    ready: BTreeMap<String, String>,
}

/// Every deletion of a pod labelled `app=web`, in the order a watch of them saw it.
struct Deletions {
    log: Arc<Mutex<Vec<Record>>>,
    /// How many records earlier steps of the test have taken.
    taken: usize,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Deletions {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Deletions {
    async fn start(pods: Api<Pod>) -> Deletions {
        let log: Arc<Mutex<Vec<Record>>> = Arc::default();
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        let out = log.clone();
        let watch = tokio::spawn(async move {
            // uid -> (name, ready, image, terminating)
            let mut live: BTreeMap<String, (String, bool, String, bool)> = BTreeMap::new();
            let mut synced_tx = Some(synced_tx);
            // With a backoff: errors (the server going away at the end) wait before a retry.
            let stream =
                watcher(pods, watcher::Config::default().labels("app=web")).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = futures::StreamExt::next(&mut stream).await {
                let Ok(event) = event else { continue };
                let ready = |live: &BTreeMap<String, (String, bool, String, bool)>| {
                    live.values()
                        .filter(|(_, r, _, t)| *r && !*t)
                        .map(|(n, _, i, _)| (n.clone(), i.clone()))
                        .collect()
                };
                let push = |seen: Seen, live: &BTreeMap<_, _>| {
                    out.lock().unwrap().push(Record {
                        seen,
                        ready: ready(live),
                    })
                };
                match event {
                    watcher::Event::InitDone => {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    watcher::Event::Init => {}
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let uid = p.uid().unwrap();
                        let terminating = p.metadata.deletion_timestamp.is_some();
                        let was = live.get(&uid).is_some_and(|l| l.3);
                        live.insert(uid, (p.name_any(), is_ready(&p), image(&p), terminating));
                        if terminating && !was {
                            push(Seen::Terminating(p.name_any()), &live);
                        }
                    }
                    watcher::Event::Delete(p) => {
                        let uid = p.uid().unwrap();
                        if !live.get(&uid).is_some_and(|l| l.3) {
                            live.entry(uid.clone()).and_modify(|l| l.3 = true);
                            push(Seen::Terminating(p.name_any()), &live);
                        }
                        live.remove(&uid);
                        push(Seen::Gone(p.name_any()), &live);
                    }
                }
            }
        });
        tokio::time::timeout(WAIT, synced)
            .await
            .expect("the pod watch lists in time")
            .expect("the pod watch lists");
        Deletions {
            log,
            taken: 0,
            watch,
        }
    }

    /// Waits for the next `n` records and takes them.
    async fn next(&mut self, n: usize) -> Vec<Record> {
        let from = self.taken;
        let got = wait_until_async(&format!("{n} more pod deletion events"), WAIT, || async {
            let log = self.log.lock().unwrap();
            if log.len() >= from + n {
                Ok(log[from..from + n].to_vec())
            } else {
                Err(log[from..].to_vec())
            }
        })
        .await;
        self.taken += n;
        got
    }

    /// The next `n` events, checked against `want` (terminating then gone for each name).
    async fn expect(&mut self, names: &[&str]) -> Vec<Record> {
        let got = self.next(names.len() * 2).await;
        let want: Vec<Seen> = names
            .iter()
            .flat_map(|n| [Seen::Terminating(n.to_string()), Seen::Gone(n.to_string())])
            .collect();
        let seen: Vec<Seen> = got.iter().map(|r| r.seen.clone()).collect();
        assert_eq!(seen, want, "{got:?}");
        got
    }

    /// Nothing was seen beyond what was taken.
    fn none_left(&self) {
        let log = self.log.lock().unwrap();
        assert_eq!(log.len(), self.taken, "{:?}", &log[self.taken..]);
    }
}

/// Waits until the EndpointSlices of Service `web` list exactly the Ready pods `names`,
/// each with its address, a reference to the pod (by uid) and the pod's name as hostname.
async fn wait_endpoints(c: &Cluster, names: &[&str]) {
    let pods: Api<Pod> = c.api("default");
    let slices: Api<EndpointSlice> = c.api("default");
    wait_until_async(
        &format!("endpoints of web with hostnames {names:?}"),
        WAIT,
        || async {
            let mut want = BTreeSet::new();
            for n in names {
                let p = pods.get(n).await.map_err(|e| e.to_string())?;
                let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
                want.insert((Some(n.to_string()), n.to_string(), p.uid(), ip));
            }
            let got: BTreeSet<_> = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .flat_map(|s| s.endpoints)
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .map(|e| {
                    let r = e.target_ref.unwrap_or_default();
                    (
                        e.hostname,
                        r.name.unwrap_or_default(),
                        r.uid,
                        e.addresses.first().cloned(),
                    )
                })
                .collect();
            if got == want {
                Ok(())
            } else {
                Err(format!("want {want:?}, got {got:?}"))
            }
        },
    )
    .await;
}

const HEADLESS: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector: {app: web}
  ports:
  - name: http
    port: 80
"#;

/// The issue's scenario: a set of 3 with its headless Service starts, a deleted pod comes
/// back under the same name, hostname and claim, an update with a partition of 2 rolls only
/// web-2, partition 0 rolls the rest from the highest ordinal, each pod after its successor is
/// Ready again, and a scale down removes web-2 then web-1, each once the one before is gone.
/// Per-pod DNS: the Service's EndpointSlices name every endpoint with its pod's hostname.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_keeps_identity_across_deletion_rolls_with_a_partition_and_scales_down_in_reverse(
) {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(WAIT);
    let pods: Api<Pod> = c.api("default");
    let sets: Api<StatefulSet> = c.api("default");
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    create_volumes(&c, 3).await;
    let mut deletions = Deletions::start(pods.clone()).await;

    let file = dir.path().join("web.yaml");
    std::fs::write(&file, format!("{HEADLESS}\n---\n{MANIFEST}")).unwrap();
    k.ok(&["apply", "-f", file.to_str().unwrap()]);
    let before = wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:1").await;
    let uid_of = |all: &[Pod], name: &str| {
        all.iter()
            .find(|p| p.name_any() == name)
            .and_then(|p| p.uid())
            .unwrap()
    };
    wait_endpoints(&c, &["web-0", "web-1", "web-2"]).await;

    // A deleted pod comes back as itself: same name, hostname, subdomain and claim (the same
    // object, bound to the same volume); the endpoints follow the new pod.
    let claim = claims.get("www-web-1").await.unwrap();
    pods.delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    deletions.expect(&["web-1"]).await;
    let after = wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:1").await;
    assert_ne!(
        uid_of(&after, "web-1"),
        uid_of(&before, "web-1"),
        "a new pod"
    );
    assert_eq!(uid_of(&after, "web-0"), uid_of(&before, "web-0"));
    assert_eq!(uid_of(&after, "web-2"), uid_of(&before, "web-2"));
    let web1 = after.iter().find(|p| p.name_any() == "web-1").unwrap();
    let spec = web1.spec.as_ref().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("web-1"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    assert_eq!(web1.labels()["statefulset.kubernetes.io/pod-name"], "web-1");
    assert_eq!(web1.labels()["apps.kubernetes.io/pod-index"], "1");
    let mounted: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|v| v.claim_name.as_str())
        .collect();
    assert_eq!(mounted, ["www-web-1"]);
    let again = claims.get("www-web-1").await.unwrap();
    assert_eq!(again.uid(), claim.uid(), "the same claim");
    let volume = |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.volume_name.clone());
    assert!(volume(&claim).is_some(), "{claim:?}");
    assert_eq!(volume(&again), volume(&claim));
    assert_claims(&claims, &["www-web-0", "www-web-1", "www-web-2"]).await;
    wait_endpoints(&c, &["web-0", "web-1", "web-2"]).await;

    // Partition 2: only web-2 gets the new image; web-0 and web-1 are not touched.
    k.ok(&[
        "patch",
        "statefulset/web",
        "--type=merge",
        "-p",
        r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"partition":2}}}}"#,
    ]);
    k.ok(&["set", "image", "statefulset/web", "c=nginx:2"]);
    let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(
        out.contains("partitioned roll out complete: 1 new pods have been updated"),
        "{out}"
    );
    deletions.expect(&["web-2"]).await;
    let generation = sets.get("web").await.unwrap().metadata.generation;
    let status = wait_until_async(
        "the set's status after the partitioned roll",
        WAIT,
        || async {
            let set = sets.get("web").await.unwrap();
            let s = set.status.clone().unwrap_or_default();
            let ok = s.observed_generation == generation
                && s.ready_replicas == Some(3)
                && s.updated_replicas == Some(1);
            if ok {
                Ok(s)
            } else {
                Err(s)
            }
        },
    )
    .await;
    assert_eq!(status.current_replicas, Some(2), "{status:?}");
    assert_ne!(
        status.current_revision, status.update_revision,
        "{status:?}"
    );
    let partial = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    let images: BTreeMap<String, String> =
        partial.iter().map(|p| (p.name_any(), image(p))).collect();
    assert_eq!(
        images,
        BTreeMap::from([
            ("web-0".into(), "nginx:1".into()),
            ("web-1".into(), "nginx:1".into()),
            ("web-2".into(), "nginx:2".into()),
        ])
    );
    assert_eq!(uid_of(&partial, "web-0"), uid_of(&after, "web-0"));
    assert_eq!(uid_of(&partial, "web-1"), uid_of(&after, "web-1"));
    deletions.none_left();

    // Partition 0: the rest roll from the highest ordinal, web-0 only once the new web-1
    // (and web-2) are Ready.
    k.ok(&[
        "patch",
        "statefulset/web",
        "--type=merge",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    ]);
    let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    assert!(out.contains("roll out complete"), "{out}");
    let rolled = deletions.expect(&["web-1", "web-0"]).await;
    // Each pod goes while the others are Ready: web-1 next to the old web-0 and the new
    // web-2, web-0 once the new web-1 is Ready too.
    assert_eq!(
        rolled[0].ready,
        BTreeMap::from([
            ("web-0".into(), "nginx:1".into()),
            ("web-2".into(), "nginx:2".into()),
        ]),
        "{rolled:?}"
    );
    assert_eq!(
        rolled[2].ready,
        BTreeMap::from([
            ("web-1".into(), "nginx:2".into()),
            ("web-2".into(), "nginx:2".into()),
        ]),
        "{rolled:?}"
    );
    wait_pods(&pods, &["web-0", "web-1", "web-2"], "nginx:2").await;
    wait_endpoints(&c, &["web-0", "web-1", "web-2"]).await;
    deletions.none_left();

    // Scale down: web-2 goes first, and web-1 only once web-2 is gone.
    k.ok(&["scale", "statefulset/web", "--replicas=1"]);
    let down = deletions.expect(&["web-2", "web-1"]).await;
    assert_eq!(
        down[2].ready,
        BTreeMap::from([("web-0".into(), "nginx:2".into())]),
        "{down:?}"
    );
    wait_pods(&pods, &["web-0"], "nginx:2").await;
    wait_endpoints(&c, &["web-0"]).await;
    deletions.none_left();
    drop(deletions);
    c.shutdown().await;
}

/// The set's `www` claims, by name, with their uids.
async fn claim_uids(claims: &Api<PersistentVolumeClaim>) -> BTreeMap<String, String> {
    claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| (c.name_any(), c.uid().unwrap_or_default()))
        .collect()
}

/// persistentVolumeClaimRetentionPolicy with the garbage collector running: scaling down
/// removes the claim of a removed ordinal under whenScaled: Delete and keeps it under Retain;
/// deleting the set removes the rest under whenDeleted: Delete and keeps them under Retain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_set_claims_follow_the_retention_policy() {
    let settings = fast_settings();
    assert!(settings
        .enabled
        .contains(&control_plane::controllers::ControllerName::GarbageCollector));
    let c = Cluster::start(settings, &["node-1", "node-2"]).await;
    let pods: Api<Pod> = c.api("default");
    let sets: Api<StatefulSet> = c.api("default");
    let claims: Api<PersistentVolumeClaim> = c.api("default");
    create_volumes(&c, 4).await;
    for (name, policy) in [("del", "Delete"), ("keep", "Retain")] {
        let set = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"serviceName": name, "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www"},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}}],
                "persistentVolumeClaimRetentionPolicy":
                    {"whenScaled": policy, "whenDeleted": policy}}
        }))
        .unwrap();
        sets.create(&PostParams::default(), &set).await.unwrap();
    }
    wait_app_pods(&pods, "del", &["del-0", "del-1"], "nginx:1").await;
    wait_app_pods(&pods, "keep", &["keep-0", "keep-1"], "nginx:1").await;
    let first = claim_uids(&claims).await;
    assert_eq!(
        first.keys().map(String::as_str).collect::<Vec<_>>(),
        ["www-del-0", "www-del-1", "www-keep-0", "www-keep-1"]
    );
    let del = sets.get("del").await.unwrap();
    let owners = |c: &PersistentVolumeClaim| -> Vec<(String, String)> {
        c.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|r| (r.kind.clone(), r.uid.clone()))
            .collect()
    };
    // whenDeleted: Delete makes the set an owner of its claims from the start.
    let set_owner = vec![("StatefulSet".to_string(), del.uid().unwrap())];
    for name in ["www-del-0", "www-del-1"] {
        assert_eq!(
            owners(&claims.get(name).await.unwrap()),
            set_owner,
            "{name}"
        );
    }

    let scale = serde_json::json!({"spec": {"replicas": 1}});
    for name in ["del", "keep"] {
        sets.patch(name, &PatchParams::default(), &Patch::Merge(&scale))
            .await
            .unwrap();
    }
    wait_app_pods(&pods, "del", &["del-0"], "nginx:1").await;
    wait_app_pods(&pods, "keep", &["keep-0"], "nginx:1").await;
    // The garbage collector removes www-del-1 once del-1, its owner, is gone.
    wait_until_async("www-del-1 deleted", WAIT, || async {
        match claims.get_opt("www-del-1").await.unwrap() {
            None => Ok(()),
            Some(c) => Err(c.metadata),
        }
    })
    .await;
    let now = claim_uids(&claims).await;
    let expected: BTreeMap<String, String> = ["www-del-0", "www-keep-0", "www-keep-1"]
        .iter()
        .map(|n| (n.to_string(), first[*n].clone()))
        .collect();
    assert_eq!(now, expected, "the other claims are the same objects");
    // The kept ordinal's claim is still the set's alone; Retain claims have no owner.
    assert_eq!(owners(&claims.get("www-del-0").await.unwrap()), set_owner);
    for name in ["www-keep-0", "www-keep-1"] {
        assert!(
            owners(&claims.get(name).await.unwrap()).is_empty(),
            "{name}"
        );
    }

    // Deleting the sets: whenDeleted Delete takes www-del-0 with the set, Retain keeps
    // keep's claims once its pods are gone.
    for name in ["del", "keep"] {
        sets.delete(name, &DeleteParams::background())
            .await
            .unwrap();
    }
    wait_until_async("the sets' pods and www-del-0 gone", WAIT, || async {
        let left: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        let claim = claims.get_opt("www-del-0").await.unwrap();
        if left.is_empty() && claim.is_none() {
            Ok(())
        } else {
            Err((left, claim.map(|c| c.metadata)))
        }
    })
    .await;
    let kept = claim_uids(&claims).await;
    let expected: BTreeMap<String, String> = ["www-keep-0", "www-keep-1"]
        .iter()
        .map(|n| (n.to_string(), first[*n].clone()))
        .collect();
    assert_eq!(kept, expected);
    c.shutdown().await;
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
    create_volumes(&c, 3).await;

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
    assert_claims(&claims, &["www-web-0", "www-web-1", "www-web-2"]).await;
    let table = k.ok(&["get", "statefulsets"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..2], ["web", "1/1"]);
    let bad = k.run(&["scale", "statefulset/web", "--replicas=-1"]);
    assert!(!bad.success);
    c.shutdown().await;
}

/// The names of the claims in the namespace are exactly `want`.
async fn assert_claims(claims: &Api<PersistentVolumeClaim>, want: &[&str]) {
    let names: BTreeSet<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    assert_eq!(names, want);
}
