//! Deployments and ReplicaSets against a real in-process API server, with the controllers
//! in-process and nodes played through the API (see controllers_support): a Deployment of 3
//! becomes one ReplicaSet and 3 bound pods; scaling; a rolling update that stays within
//! maxSurge/maxUnavailable at every moment (checked by a watcher over pods and ReplicaSets);
//! Recreate; paused; revision history; progress deadline; replacement of deleted pods;
//! adoption and release; expectations (never an extra pod).

mod controllers_support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster, NEVER_READY};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn deployment(name: &str, replicas: i32, image: &str, extra_spec: Value) -> Deployment {
    let mut d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    });
    merge(&mut d["spec"], extra_spec);
    serde_json::from_value(d).unwrap()
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

async fn pods_of(c: &Cluster, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = c.api("default");
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
}

fn active(pods: &[Pod]) -> Vec<&Pod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn replica_sets_of(c: &Cluster, app: &str) -> Vec<ReplicaSet> {
    let rs: Api<ReplicaSet> = c.api("default");
    rs.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
}

/// Waits until the Deployment's rollout is complete (what `kubectl rollout status` checks).
async fn rolled_out(c: &Cluster, name: &str) -> Deployment {
    let api: Api<Deployment> = c.api("default");
    wait_until_async("the rollout to complete", WAIT, || async {
        let d = api.get(name).await.map_err(|e| e.to_string())?;
        let s = d.status.clone().unwrap_or_default();
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let done = s.observed_generation >= d.metadata.generation
            && s.updated_replicas == Some(want)
            && s.replicas == Some(want)
            && s.available_replicas == Some(want);
        done.then_some(d.clone()).ok_or(format!("{s:?}"))
    })
    .await
}

async fn events_for(c: &Cluster, kind: &str, name: &str) -> Vec<Event> {
    let events: Api<Event> = c.api("default");
    events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind={kind},involvedObject.name={name}"
        )))
        .await
        .unwrap()
        .items
}

async fn wait_event(c: &Cluster, kind: &str, name: &str, reason: &str, message_part: &str) {
    wait_until_async(
        &format!("event {reason} ({message_part}) on {kind} {name}"),
        WAIT,
        || async {
            let evs = events_for(c, kind, name).await;
            evs.iter()
                .any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.message.as_deref().unwrap_or("").contains(message_part)
                })
                .then_some(())
                .ok_or_else(|| {
                    evs.iter()
                        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
                        .collect::<Vec<_>>()
                })
        },
    )
    .await;
}

#[tokio::test]
async fn a_deployment_of_3_becomes_one_replica_set_and_3_bound_pods() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let api: Api<Deployment> = c.api("default");
    let d = api
        .create(
            &PostParams::default(),
            &deployment("web", 3, "nginx:1.27", json!({})),
        )
        .await
        .unwrap();
    let done = rolled_out(&c, "web").await;

    let sets = replica_sets_of(&c, "web").await;
    assert_eq!(sets.len(), 1, "one ReplicaSet per template");
    let rs = &sets[0];
    let hash = rs.labels()["pod-template-hash"].clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Deployment", d.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(rs.annotations()["deployment.kubernetes.io/revision"], "1");
    assert_eq!(
        rs.annotations()["deployment.kubernetes.io/desired-replicas"],
        "3"
    );
    assert_eq!(
        rs.annotations()["deployment.kubernetes.io/max-replicas"],
        "4"
    );
    assert_eq!(done.annotations()["deployment.kubernetes.io/revision"], "1");

    let pods = pods_of(&c, "web").await;
    assert_eq!(pods.len(), 3);
    let mut nodes = Vec::new();
    for p in &pods {
        assert!(
            p.name_any().starts_with(&format!("{}-", rs.name_any())),
            "{}",
            p.name_any()
        );
        assert_eq!(p.labels()["pod-template-hash"], hash);
        assert_eq!(p.owner_references()[0].uid, rs.uid().unwrap());
        nodes.push(p.spec.as_ref().unwrap().node_name.clone().expect("bound"));
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "spread over the 3 nodes");

    let status = done.status.unwrap();
    let conds: HashMap<String, (String, String)> = status
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, (c.status, c.reason.unwrap_or_default())))
        .collect();
    assert_eq!(
        conds["Available"],
        ("True".into(), "MinimumReplicasAvailable".into())
    );
    assert_eq!(
        conds["Progressing"],
        ("True".into(), "NewReplicaSetAvailable".into())
    );
    assert_eq!(status.ready_replicas, Some(3));

    wait_event(
        &c,
        "Deployment",
        "web",
        "ScalingReplicaSet",
        &format!("Scaled up replica set {} from 0 to 3", rs.name_any()),
    )
    .await;
    wait_event(
        &c,
        "ReplicaSet",
        &rs.name_any(),
        "SuccessfulCreate",
        "Created pod: web-",
    )
    .await;
    let rs_status = replica_sets_of(&c, "web").await[0].status.clone().unwrap();
    assert_eq!(
        (
            rs_status.replicas,
            rs_status.fully_labeled_replicas,
            rs_status.ready_replicas,
            rs_status.available_replicas
        ),
        (3, Some(3), Some(3), Some(3))
    );
    c.shutdown().await;
}

#[tokio::test]
async fn scaling_up_to_5_and_down_to_2() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let api: Api<Deployment> = c.api("default");
    api.create(
        &PostParams::default(),
        &deployment("web", 3, "nginx:1.27", json!({})),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    let rs_name = replica_sets_of(&c, "web").await[0].name_any();

    let scale = |n: i32| json!({"spec": {"replicas": n}});
    api.patch_scale("web", &PatchParams::default(), &Patch::Merge(&scale(5)))
        .await
        .unwrap();
    rolled_out(&c, "web").await;
    assert_eq!(active(&pods_of(&c, "web").await).len(), 5);
    wait_event(
        &c,
        "Deployment",
        "web",
        "ScalingReplicaSet",
        &format!("Scaled up replica set {rs_name} from 3 to 5"),
    )
    .await;

    api.patch_scale("web", &PatchParams::default(), &Patch::Merge(&scale(2)))
        .await
        .unwrap();
    rolled_out(&c, "web").await;
    wait_until_async("2 pods left", WAIT, || async {
        let n = pods_of(&c, "web").await.len();
        (n == 2).then_some(()).ok_or(n)
    })
    .await;
    wait_event(
        &c,
        "Deployment",
        "web",
        "ScalingReplicaSet",
        &format!("Scaled down replica set {rs_name} from 5 to 2"),
    )
    .await;
    wait_event(
        &c,
        "ReplicaSet",
        &rs_name,
        "SuccessfulDelete",
        "Deleted pod: ",
    )
    .await;
    assert_eq!(
        replica_sets_of(&c, "web").await.len(),
        1,
        "scaling makes no new ReplicaSet"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn a_deleted_pod_is_replaced() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let api: Api<Deployment> = c.api("default");
    api.create(
        &PostParams::default(),
        &deployment("web", 3, "nginx:1.27", json!({})),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    let before = pods_of(&c, "web").await;
    let victim = before[0].name_any();
    let pods: Api<Pod> = c.api("default");
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let after = wait_until_async("a replacement pod", WAIT, || async {
        let now = pods_of(&c, "web").await;
        let ready = now
            .iter()
            .filter(|p| {
                p.name_any() != victim
                    && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
            })
            .count();
        (ready == 3 && now.len() == 3).then_some(now).ok_or(ready)
    })
    .await;
    assert!(after.iter().all(|p| p.name_any() != victim));
    c.shutdown().await;
}

/// The largest number of non-terminating pods and the smallest number of ready ones seen at
/// any revision, plus the same for ReplicaSet sizes and reported availability.
#[derive(Debug, Default)]
struct Extremes {
    max_pods: usize,
    min_ready: usize,
    max_rs_replicas: i32,
    min_rs_available: i32,
    old_and_new_together: bool,
}

/// Watches pods and ReplicaSets of `app` and records extremes after every event.
fn watch_extremes(c: &Cluster, app: &str) -> (Arc<Mutex<Extremes>>, tokio::task::JoinHandle<()>) {
    let ext = Arc::new(Mutex::new(Extremes {
        min_ready: usize::MAX,
        min_rs_available: i32::MAX,
        ..Default::default()
    }));
    let pods: Api<Pod> = c.api("default");
    let sets: Api<ReplicaSet> = c.api("default");
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let e = ext.clone();
    let task = tokio::spawn(async move {
        let mut pod_state: BTreeMap<String, Pod> = BTreeMap::new();
        let mut rs_state: BTreeMap<String, ReplicaSet> = BTreeMap::new();
        let ps = watcher(pods, cfg.clone())
            .default_backoff()
            .map(|e| e.map(either_pod))
            .boxed();
        let rs = watcher(sets, cfg)
            .default_backoff()
            .map(|e| e.map(either_rs))
            .boxed();
        let mut merged = futures::stream::select(ps, rs);
        // Extremes only count between complete lists (a list arrives one object at a time).
        let (mut pods_listed, mut sets_listed) = (false, false);
        while let Some(ev) = merged.next().await {
            let Ok(ev) = ev else { continue };
            match ev {
                Either::Pod(watcher::Event::Init) => pods_listed = false,
                Either::Pod(watcher::Event::InitDone) => pods_listed = true,
                Either::Rs(watcher::Event::Init) => sets_listed = false,
                Either::Rs(watcher::Event::InitDone) => sets_listed = true,
                Either::Pod(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    pod_state.insert(p.name_any(), p);
                }
                Either::Pod(watcher::Event::Delete(p)) => {
                    pod_state.remove(&p.name_any());
                }
                Either::Rs(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => {
                    rs_state.insert(r.name_any(), r);
                }
                Either::Rs(watcher::Event::Delete(r)) => {
                    rs_state.remove(&r.name_any());
                }
            }
            if !(pods_listed && sets_listed) {
                continue;
            }
            let live: Vec<&Pod> = pod_state
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let ready = live
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count();
            let hashes: std::collections::HashSet<&String> = pod_state
                .values()
                .filter_map(|p| p.labels().get("pod-template-hash"))
                .collect();
            let mut x = e.lock().unwrap();
            x.max_pods = x.max_pods.max(live.len());
            x.min_ready = x.min_ready.min(ready);
            x.old_and_new_together |= hashes.len() > 1;
            x.max_rs_replicas = x.max_rs_replicas.max(
                rs_state
                    .values()
                    .map(|r| r.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
                    .sum(),
            );
            x.min_rs_available = x.min_rs_available.min(
                rs_state
                    .values()
                    .map(|r| {
                        r.status
                            .as_ref()
                            .and_then(|s| s.available_replicas)
                            .unwrap_or(0)
                    })
                    .sum(),
            );
        }
    });
    (ext, task)
}

enum Either {
    Pod(watcher::Event<Pod>),
    Rs(watcher::Event<ReplicaSet>),
}

fn either_pod(e: watcher::Event<Pod>) -> Either {
    Either::Pod(e)
}

fn either_rs(e: watcher::Event<ReplicaSet>) -> Either {
    Either::Rs(e)
}

async fn set_image(c: &Cluster, name: &str, image: &str) {
    let api: Api<Deployment> = c.api("default");
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}});
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_image_change_rolls_out_within_max_surge_and_max_unavailable() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let api: Api<Deployment> = c.api("default");
    let strategy = json!({"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}});
    api.create(
        &PostParams::default(),
        &deployment("web", 4, "nginx:1.27", strategy),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    let (ext, watch) = watch_extremes(&c, "web");
    wait_until_async("the watcher to see the 4 pods", WAIT, || async {
        let n = ext.lock().unwrap().max_pods;
        (n == 4).then_some(()).ok_or(n)
    })
    .await;

    set_image(&c, "web", "nginx:1.28").await;
    let d = rolled_out(&c, "web").await;
    wait_until_async("old pods gone", WAIT, || async {
        let pods = pods_of(&c, "web").await;
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("nginx:1.28"))
            .then_some(())
            .ok_or(pods.len())
    })
    .await;
    watch.abort();
    let x = std::mem::take(&mut *ext.lock().unwrap());
    assert!(
        x.max_pods <= 5,
        "never more than replicas + maxSurge pods: {x:?}"
    );
    assert!(
        x.min_ready >= 3,
        "never fewer than replicas - maxUnavailable ready pods: {x:?}"
    );
    assert!(x.max_rs_replicas <= 5, "{x:?}");
    assert!(x.min_rs_available >= 3, "{x:?}");

    assert_eq!(d.annotations()["deployment.kubernetes.io/revision"], "2");
    let mut sets = replica_sets_of(&c, "web").await;
    sets.sort_by_key(|r| r.annotations()["deployment.kubernetes.io/revision"].clone());
    assert_eq!(sets.len(), 2);
    assert_eq!(
        sets[0].spec.as_ref().unwrap().replicas,
        Some(0),
        "the old ReplicaSet is scaled to 0 and kept"
    );
    assert_eq!(sets[1].spec.as_ref().unwrap().replicas, Some(4));
    c.shutdown().await;
}

#[tokio::test]
async fn recreate_deletes_every_old_pod_before_creating_new_ones() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let api: Api<Deployment> = c.api("default");
    api.create(
        &PostParams::default(),
        &deployment(
            "batch",
            3,
            "worker:1",
            json!({"strategy": {"type": "Recreate"}}),
        ),
    )
    .await
    .unwrap();
    rolled_out(&c, "batch").await;
    let (ext, watch) = watch_extremes(&c, "batch");
    wait_until_async("the watcher to see the pods", WAIT, || async {
        let n = ext.lock().unwrap().max_pods;
        (n == 3).then_some(()).ok_or(n)
    })
    .await;
    set_image(&c, "batch", "worker:2").await;
    rolled_out(&c, "batch").await;
    wait_until_async("only new pods", WAIT, || async {
        let pods = pods_of(&c, "batch").await;
        (pods.len() == 3
            && pods.iter().all(|p| {
                p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("worker:2")
            }))
        .then_some(())
        .ok_or(pods.len())
    })
    .await;
    watch.abort();
    assert!(
        !ext.lock().unwrap().old_and_new_together,
        "old and new pods never coexist with Recreate"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn a_paused_deployment_rolls_out_only_when_resumed() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let api: Api<Deployment> = c.api("default");
    api.create(
        &PostParams::default(),
        &deployment("web", 2, "nginx:1.27", json!({})),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": true}})),
    )
    .await
    .unwrap();
    wait_until_async("the Paused condition", WAIT, || async {
        let d = api.get("web").await.unwrap();
        let reason = d
            .status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Progressing"))
            .and_then(|c| c.reason);
        (reason.as_deref() == Some("DeploymentPaused"))
            .then_some(())
            .ok_or(reason)
    })
    .await;
    set_image(&c, "web", "nginx:1.28").await;
    // Scaling still works while paused; the template change does not roll out.
    api.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    wait_until_async("3 pods while paused", WAIT, || async {
        let n = active(&pods_of(&c, "web").await).len();
        (n == 3).then_some(()).ok_or(n)
    })
    .await;
    assert_eq!(
        replica_sets_of(&c, "web").await.len(),
        1,
        "no new ReplicaSet while paused"
    );
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": false}})),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    assert_eq!(replica_sets_of(&c, "web").await.len(), 2);
    c.shutdown().await;
}

#[tokio::test]
async fn history_beyond_the_revision_limit_is_deleted() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let api: Api<Deployment> = c.api("default");
    api.create(
        &PostParams::default(),
        &deployment("web", 1, "app:1", json!({"revisionHistoryLimit": 1})),
    )
    .await
    .unwrap();
    rolled_out(&c, "web").await;
    for v in 2..=4 {
        set_image(&c, "web", &format!("app:{v}")).await;
        rolled_out(&c, "web").await;
    }
    let sets = wait_until_async("2 ReplicaSets left", WAIT, || async {
        let s = replica_sets_of(&c, "web").await;
        (s.len() == 2).then_some(s.clone()).ok_or(s.len())
    })
    .await;
    let mut revisions: Vec<String> = sets
        .iter()
        .map(|r| r.annotations()["deployment.kubernetes.io/revision"].clone())
        .collect();
    revisions.sort();
    assert_eq!(revisions, ["3", "4"]);
    c.shutdown().await;
}

#[tokio::test]
async fn a_stalled_rollout_exceeds_its_progress_deadline() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let api: Api<Deployment> = c.api("default");
    let spec = json!({"progressDeadlineSeconds": 2, "template": {"metadata": {"annotations": {NEVER_READY: "true"}}}});
    api.create(
        &PostParams::default(),
        &deployment("stuck", 2, "nginx:1.27", spec),
    )
    .await
    .unwrap();
    wait_until_async("ProgressDeadlineExceeded", WAIT, || async {
        let d = api.get("stuck").await.unwrap();
        let c = d
            .status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Progressing"));
        let got = c
            .as_ref()
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()));
        (got == Some(("False".into(), "ProgressDeadlineExceeded".into())))
            .then_some(())
            .ok_or(got)
    })
    .await;
    let d = api.get("stuck").await.unwrap();
    let avail = d
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Available")
        .unwrap();
    assert_eq!(avail.status, "False");
    c.shutdown().await;
}

fn replica_set(name: &str, replicas: i32, app: &str) -> ReplicaSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn replica_sets_adopt_orphans_and_release_pods_that_stop_matching() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let pods: Api<Pod> = c.api("default");
    let orphan: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orphan", "labels": {"app": "cache"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    let rsapi: Api<ReplicaSet> = c.api("default");
    let rs = rsapi
        .create(&PostParams::default(), &replica_set("cache", 2, "cache"))
        .await
        .unwrap();
    let owned = wait_until_async("the orphan adopted and one pod created", WAIT, || async {
        let ps = pods_of(&c, "cache").await;
        let adopted = ps.iter().any(|p| {
            p.name_any() == "orphan"
                && p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == rs.uid().as_ref())
        });
        (adopted && ps.len() == 2)
            .then_some(ps.clone())
            .ok_or(ps.len())
    })
    .await;
    assert!(owned
        .iter()
        .all(|p| p.owner_references()[0].controller == Some(true)));

    // Relabel the adopted pod: it is released, and replaced.
    pods.patch(
        "orphan",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .unwrap();
    wait_until_async("the pod released and replaced", WAIT, || async {
        let released = pods.get("orphan").await.unwrap();
        let cache = pods_of(&c, "cache").await;
        (released.owner_references().is_empty() && cache.len() == 2)
            .then_some(())
            .ok_or(cache.len())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn scale_down_deletes_unready_pods_first() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let rsapi: Api<ReplicaSet> = c.api("default");
    rsapi
        .create(&PostParams::default(), &replica_set("pool", 3, "pool"))
        .await
        .unwrap();
    let all = wait_until_async("3 running pods", WAIT, || async {
        let ps = pods_of(&c, "pool").await;
        let running = ps
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        (running == 3).then_some(ps.clone()).ok_or(running)
    })
    .await;
    let unready = all[1].name_any();
    c.nodes().set_ready("default", &unready, false).await;
    wait_until_async("the ReplicaSet to see 2 ready", WAIT, || async {
        let rs = rsapi.get("pool").await.unwrap();
        let ready = rs.status.and_then(|s| s.ready_replicas);
        (ready == Some(2)).then_some(()).ok_or(ready)
    })
    .await;
    rsapi
        .patch_scale(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    wait_until_async("the unready pod deleted", WAIT, || async {
        let ps = pods_of(&c, "pool").await;
        (ps.len() == 2 && ps.iter().all(|p| p.name_any() != unready))
            .then_some(())
            .ok_or(ps.len())
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_creations_never_makes_an_extra_pod() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let pods: Api<Pod> = c.api("default");
    let created = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let seen = created.clone();
    let watch = tokio::spawn(async move {
        let s = watcher(pods, watcher::Config::default().labels("app=burst"))
            .default_backoff()
            .applied_objects();
        let mut s = std::pin::pin!(s);
        while let Some(Ok(p)) = s.next().await {
            seen.lock().unwrap().insert(p.uid().unwrap());
        }
    });
    let rsapi: Api<ReplicaSet> = c.api("default");
    rsapi
        .create(&PostParams::default(), &replica_set("burst", 40, "burst"))
        .await
        .unwrap();
    wait_until_async("40 ready replicas", WAIT, || async {
        let rs = rsapi.get("burst").await.unwrap();
        let s = rs.status.unwrap_or_default();
        (s.replicas == 40 && s.ready_replicas == Some(40))
            .then_some(())
            .ok_or(s.ready_replicas)
    })
    .await;
    wait_until_async("the watcher to catch up", WAIT, || async {
        let n = created.lock().unwrap().len();
        (n >= 40).then_some(()).ok_or(n)
    })
    .await;
    watch.abort();
    assert_eq!(
        created.lock().unwrap().len(),
        40,
        "exactly 40 pods were ever created"
    );
    let deletes = events_for(&c, "ReplicaSet", "burst")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SuccessfulDelete"))
        .count();
    assert_eq!(deletes, 0, "no surplus pod had to be deleted");
    c.shutdown().await;
}
