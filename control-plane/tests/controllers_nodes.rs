//! Nodes against a real in-process API server, controllers and scheduler in-process, nodes
//! played through the API: pod CIDRs handed out once and derived again after a restart; a
//! node whose Lease stops goes Unknown and tainted, its pods are evicted when their
//! toleration runs out and replaced on the other nodes, and it is untainted when it comes
//! back; DaemonSets place one pod per eligible node through the scheduler and roll out
//! within maxUnavailable; their ControllerRevisions serve the real kubectl's `rollout
//! history` and `rollout undo` and are truncated at revisionHistoryLimit.

mod controllers_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controllers_support::{fast_settings, Cluster, Nodes};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn pod_cidr(n: &Node) -> Option<String> {
    n.spec.as_ref().and_then(|s| s.pod_cidr.clone())
}

#[tokio::test]
async fn nodes_get_distinct_pod_cidrs_that_survive_a_restart() {
    let mut c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let first = wait_until_async("3 pod CIDRs", WAIT, || async {
        let cidrs: BTreeSet<String> = nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(pod_cidr)
            .collect();
        (cidrs.len() == 3).then_some(cidrs.clone()).ok_or(cidrs)
    })
    .await;
    for cidr in &first {
        assert!(
            cidr.starts_with("10.244.") && cidr.ends_with(".0/24"),
            "{cidr}"
        );
    }
    for n in nodes.list(&ListParams::default()).await.unwrap() {
        let spec = n.spec.unwrap();
        assert_eq!(spec.pod_cidrs, Some(vec![spec.pod_cidr.unwrap()]));
    }
    // A restarted controller-manager derives what is taken from the Nodes.
    c.stop_controllers().await;
    c.start_controllers(fast_settings()).await;
    let extra = Nodes::start(c.client.clone(), &c.node_credentials(), &["node-4"]).await;
    let n4 = wait_until_async("node-4's CIDR", WAIT, || async {
        nodes
            .get("node-4")
            .await
            .ok()
            .as_ref()
            .and_then(pod_cidr)
            .ok_or(())
    })
    .await;
    assert!(!first.contains(&n4), "{n4} was already handed out");
    extra.stop_all();
    c.shutdown().await;
}

fn tolerant_deployment(name: &str, replicas: i32, seconds: i64) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "c", "image": "nginx"}],
                    "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}],
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor", "labelSelector": {"matchLabels": {"app": name}}}],
                },
            },
        },
    }))
    .unwrap()
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

#[tokio::test]
async fn a_node_whose_lease_stops_goes_not_ready_and_its_pods_move() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &tolerant_deployment("web", 3, 2))
        .await
        .unwrap();
    let pods: Api<Pod> = c.api("default");
    let lp = ListParams::default().labels("app=web");
    wait_until_async("a pod on each node", WAIT, || async {
        let ps = pods.list(&lp).await.unwrap().items;
        let nodes: BTreeSet<String> = ps
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .filter_map(node_of)
            .collect();
        (nodes.len() == 3).then_some(()).ok_or(nodes)
    })
    .await;

    c.nodes().stop("node-3");
    let nodes: Api<Node> = Api::all(c.client.clone());
    wait_until_async("node-3 Unknown and tainted", WAIT, || async {
        let ready = ready_of(&nodes.get("node-3").await.unwrap());
        let taints = taints_of(&nodes, "node-3").await;
        let want: BTreeSet<(String, String)> = [
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoSchedule"),
        ]
        .iter()
        .map(|(k, e)| (k.to_string(), e.to_string()))
        .collect();
        (ready.as_deref() == Some("Unknown") && taints == want)
            .then_some(())
            .ok_or((ready, taints))
    })
    .await;
    let events: Api<Event> = c.api("default");
    wait_until_async("a NodeNotReady event", WAIT, || async {
        let evs = events
            .list(&ListParams::default().fields("involvedObject.name=node-3"))
            .await
            .unwrap()
            .items;
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("NodeNotReady"))
            .then_some(())
            .ok_or(evs.len())
    })
    .await;

    // After the 2 s toleration the pod on node-3 is evicted and replaced elsewhere.
    wait_until_async("3 live pods on node-1 and node-2", WAIT, || async {
        let ps = pods.list(&lp).await.unwrap().items;
        let live: Vec<&Pod> = ps
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let placed: Vec<Option<String>> = live.iter().map(|p| node_of(p)).collect();
        let ok = live.len() == 3
            && placed
                .iter()
                .all(|n| matches!(n.as_deref(), Some("node-1" | "node-2")));
        ok.then_some(()).ok_or(placed)
    })
    .await;
    let evicted = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| node_of(p).as_deref() == Some("node-3"))
        .expect("the old pod stays Terminating while its node is away");
    assert!(evicted.metadata.deletion_timestamp.is_some());
    let reasons: Vec<String> = evicted
        .status
        .clone()
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .filter_map(|c| (c.type_ == "DisruptionTarget").then(|| c.reason.unwrap_or_default()))
        .collect();
    assert_eq!(reasons, ["DeletionByTaintManager"]);

    // The node comes back: untainted, and its agent finishes the evicted pod.
    c.nodes().resume("node-3").await;
    wait_until_async(
        "node-3 Ready and untainted, the old pod gone",
        WAIT,
        || async {
            let n = nodes.get("node-3").await.unwrap();
            let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
            let old = pods.get_opt(&evicted.name_any()).await.unwrap();
            (taints.is_empty() && old.is_none())
                .then_some(())
                .ok_or(taints.len())
        },
    )
    .await;
    c.shutdown().await;
}

fn daemon_set(name: &str, image: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": image}]}},
        },
    }))
    .unwrap()
}

async fn ds_pods_by_node(c: &Cluster, app: &str) -> BTreeMap<String, Vec<Pod>> {
    let pods: Api<Pod> = c.api("default");
    let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for p in pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
    {
        if p.metadata.deletion_timestamp.is_none() {
            out.entry(node_of(&p).unwrap_or_default())
                .or_default()
                .push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_daemon_set_runs_one_pod_per_eligible_node_and_rolls_within_max_unavailable() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let taint =
        json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}});
    nodes
        .patch("node-3", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    let api: Api<DaemonSet> = c.api("default");
    api.create(&PostParams::default(), &daemon_set("agent", "agent:1"))
        .await
        .unwrap();
    let placed = wait_until_async("one running pod on node-1 and node-2", WAIT, || async {
        let by = ds_pods_by_node(&c, "agent").await;
        let ok = by.len() == 2
            && by.values().all(|v| {
                v.len() == 1
                    && v[0]
                        .status
                        .as_ref()
                        .and_then(|s| s.pod_ip.as_ref())
                        .is_some()
            });
        ok.then_some(by.clone())
            .ok_or(by.keys().cloned().collect::<Vec<_>>())
    })
    .await;
    assert_eq!(
        placed.keys().cloned().collect::<Vec<_>>(),
        ["node-1", "node-2"]
    );
    for (node, ps) in &placed {
        let p = &ps[0];
        let terms = &p
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        let field = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (
                field.key.as_str(),
                field.values.as_ref().unwrap()[0].as_str()
            ),
            ("metadata.name", node.as_str())
        );
        let tolerated: BTreeSet<String> = p
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .iter()
            .flatten()
            .filter_map(|t| t.key.clone())
            .collect();
        assert!(
            tolerated.contains("node.kubernetes.io/unreachable")
                && tolerated.contains("node.kubernetes.io/unschedulable")
        );
        assert!(p.labels().contains_key("controller-revision-hash"));
    }
    let ds = wait_until_async("status counts", WAIT, || async {
        let ds = api.get("agent").await.unwrap();
        let s = ds.status.clone().unwrap_or_default();
        (s.desired_number_scheduled == 2
            && s.number_ready == 2
            && s.updated_number_scheduled == Some(2))
        .then_some(ds)
        .ok_or(s)
    })
    .await;
    assert_eq!(ds.status.unwrap().number_available, Some(2));

    // A new node gets its pod.
    let extra = Nodes::start(c.client.clone(), &c.node_credentials(), &["node-4"]).await;
    wait_until_async("a pod on node-4", WAIT, || async {
        let by = ds_pods_by_node(&c, "agent").await;
        by.contains_key("node-4").then_some(()).ok_or(by.len())
    })
    .await;

    // Roll out a new image while a watcher checks availability per node.
    let unavailable_max = Arc::new(Mutex::new((0usize, String::new())));
    let seen = unavailable_max.clone();
    let pods: Api<Pod> = c.api("default");
    wait_until_async("3 ready daemon pods", WAIT, || async {
        let ds = api.get("agent").await.unwrap();
        let s = ds.status.unwrap_or_default();
        (s.number_ready == 3).then_some(()).ok_or(s.number_ready)
    })
    .await;
    let watch = tokio::spawn(async move {
        let mut state: BTreeMap<String, Pod> = BTreeMap::new();
        let mut listed = false;
        let s = watcher(pods, watcher::Config::default().labels("app=agent")).default_backoff();
        let mut s = std::pin::pin!(s);
        while let Some(Ok(ev)) = s.next().await {
            match ev {
                watcher::Event::Init => listed = false,
                watcher::Event::InitDone => listed = true,
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    state.insert(p.name_any(), p);
                }
                watcher::Event::Delete(p) => {
                    state.remove(&p.name_any());
                }
            }
            if !listed {
                continue;
            }
            let ready_nodes: BTreeSet<String> = state
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .filter_map(node_of)
                .collect();
            let mut m = seen.lock().unwrap();
            let unavailable = 3usize.saturating_sub(ready_nodes.len());
            if unavailable > m.0 {
                let picture: Vec<String> = state
                    .values()
                    .map(|p| {
                        format!(
                            "{}@{:?} ready={} deleting={}",
                            p.name_any(),
                            node_of(p),
                            p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|cs| cs
                                    .iter()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")),
                            p.metadata.deletion_timestamp.is_some()
                        )
                    })
                    .collect();
                *m = (unavailable, picture.join("; "));
            }
        }
    });
    api.patch("agent", &PatchParams::default(), &Patch::Strategic(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:2"}]}}}})))
        .await
        .unwrap();
    wait_until_async("every daemon pod updated and ready", WAIT, || async {
        let ds = api.get("agent").await.unwrap();
        let s = ds.status.clone().unwrap_or_default();
        let by = ds_pods_by_node(&c, "agent").await;
        let images_ok = by
            .values()
            .flatten()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("agent:2"));
        let done = s.observed_generation >= ds.metadata.generation
            && s.updated_number_scheduled == Some(3)
            && s.number_available == Some(3)
            && images_ok;
        done.then_some(()).ok_or(s)
    })
    .await;
    watch.abort();
    let (max, picture) = unavailable_max.lock().unwrap().clone();
    assert!(
        max <= 1,
        "at most maxUnavailable (1) node without a ready daemon pod; saw {max}: {picture}"
    );
    extra.stop_all();
    c.shutdown().await;
}

/// Waits until every daemon pod of `app` runs `image` and the status says the rollout is
/// done; returns the pods' `controller-revision-hash` labels.
async fn wait_rolled(c: &Cluster, app: &str, nodes: i32, image: &str) -> BTreeSet<String> {
    let api: Api<DaemonSet> = c.api("default");
    wait_until_async(&format!("{app} rolled to {image}"), WAIT, || async {
        let ds = api.get(app).await.unwrap();
        let s = ds.status.clone().unwrap_or_default();
        let pods: Vec<Pod> = ds_pods_by_node(c, app)
            .await
            .into_values()
            .flatten()
            .collect();
        let images_ok = pods.len() == usize::try_from(nodes).unwrap()
            && pods
                .iter()
                .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(image));
        let done = s.observed_generation >= ds.metadata.generation
            && s.desired_number_scheduled == nodes
            && s.updated_number_scheduled == Some(nodes)
            && s.number_available == Some(nodes)
            && images_ok;
        done.then(|| {
            pods.iter()
                .map(|p| p.labels()["controller-revision-hash"].clone())
                .collect()
        })
        .ok_or(s)
    })
    .await
}

/// The ControllerRevisions labelled `app=<app>`, by revision number.
async fn revisions_of(c: &Cluster, app: &str) -> BTreeMap<i64, ControllerRevision> {
    let api: Api<ControllerRevision> = c.api("default");
    api.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.revision, r))
        .collect()
}

fn revision_image(r: &ControllerRevision) -> String {
    let data = &r.data.as_ref().expect("revision data").0;
    assert_eq!(data["spec"]["template"]["$patch"], "replace", "{data}");
    data["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_set_revisions_serve_kubectl_rollout_history_and_undo() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(WAIT);
    let api: Api<DaemonSet> = c.api("default");
    let mut ds = daemon_set("hist", "agent:1");
    ds.spec.as_mut().unwrap().revision_history_limit = Some(2);
    let ds = api.create(&PostParams::default(), &ds).await.unwrap();

    // Revision 1: named <ds>-<hash>, the pods' hash, controlled by the DaemonSet, the
    // template as a replace patch.
    let first_hash = wait_rolled(&c, "hist", 2, "agent:1").await;
    assert_eq!(first_hash.len(), 1, "{first_hash:?}");
    let first_hash = first_hash.into_iter().next().unwrap();
    let revs = revisions_of(&c, "hist").await;
    assert_eq!(revs.keys().copied().collect::<Vec<_>>(), [1], "{revs:?}");
    let first = revs[&1].clone();
    assert_eq!(first.name_any(), format!("hist-{first_hash}"));
    assert_eq!(first.labels()["controller-revision-hash"], first_hash);
    let owner = &first.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller, Some(&owner.uid)),
        ("DaemonSet", Some(true), ds.uid().as_ref())
    );
    assert_eq!(revision_image(&first), "agent:1");

    // A new template: revision 2, `kubectl rollout status` and `history` see it.
    k.ok(&["set", "image", "daemonset/hist", "c=agent:2"]);
    let out = k.ok(&["rollout", "status", "daemonset/hist", "--timeout=120s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let second_hash = wait_rolled(&c, "hist", 2, "agent:2").await;
    assert!(!second_hash.contains(&first_hash), "{second_hash:?}");
    let history = k.ok(&["rollout", "history", "daemonset/hist"]);
    let numbers: Vec<&str> = history
        .lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(numbers, ["1", "2"], "{history}");
    let detail = k.ok(&["rollout", "history", "daemonset/hist", "--revision=1"]);
    assert!(detail.contains("agent:1"), "{detail}");

    // Undo: the DaemonSet gets revision 1's template back, which becomes revision 3 (the
    // same object renumbered), and the pods are made from it with its hash.
    let out = k.ok(&["rollout", "undo", "daemonset/hist"]);
    assert!(out.contains("rolled back"), "{out}");
    k.ok(&["rollout", "status", "daemonset/hist", "--timeout=120s"]);
    let hashes = wait_rolled(&c, "hist", 2, "agent:1").await;
    assert_eq!(hashes, BTreeSet::from([first_hash.clone()]));
    let revs = revisions_of(&c, "hist").await;
    assert_eq!(revs.keys().copied().collect::<Vec<_>>(), [2, 3], "{revs:?}");
    assert_eq!(revs[&3].name_any(), first.name_any());
    assert_eq!(revs[&3].uid(), first.uid());

    // revisionHistoryLimit 2: two more templates leave the current revision and the two
    // before it; the oldest (agent:2) is deleted.
    for image in ["agent:3", "agent:4"] {
        k.ok(&["set", "image", "daemonset/hist", &format!("c={image}")]);
        wait_rolled(&c, "hist", 2, image).await;
    }
    let kept = wait_until_async("history truncated to 2 + the current", WAIT, || async {
        let revs = revisions_of(&c, "hist").await;
        let numbers: Vec<i64> = revs.keys().copied().collect();
        (numbers == [3, 4, 5]).then_some(revs).ok_or(numbers)
    })
    .await;
    let images: Vec<String> = kept.values().map(revision_image).collect();
    assert_eq!(images, ["agent:1", "agent:3", "agent:4"]);
    let status = api.get("hist").await.unwrap().status.unwrap();
    assert_eq!(status.collision_count, None);
    c.shutdown().await;
}

/// The taints of a node as (key, effect) pairs.
async fn taints_of(nodes: &Api<Node>, name: &str) -> BTreeSet<(String, String)> {
    nodes
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

fn ready_of(n: &Node) -> Option<String> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
}

#[tokio::test]
async fn when_every_node_goes_silent_nothing_is_evicted_until_one_returns() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2", "node-3"]).await;
    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &tolerant_deployment("web", 3, 30))
        .await
        .unwrap();
    let pods: Api<Pod> = c.api("default");
    let lp = ListParams::default().labels("app=web");
    wait_until_async("3 pods placed", WAIT, || async {
        let n = pods
            .list(&lp)
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| node_of(p).is_some())
            .count();
        (n == 3).then_some(()).ok_or(n)
    })
    .await;

    // A partition between the control plane and every node: all go Unknown and keep the
    // NoSchedule taint, but no NoExecute one: the first to go silent may be tainted while the
    // others still look Ready (as in Kubernetes: nodes go stale one by one), and the taint is
    // lifted once every node is away, long before the pods' 30 s toleration runs out.
    for n in ["node-1", "node-2", "node-3"] {
        c.nodes().stop(n);
    }
    let nodes: Api<Node> = Api::all(c.client.clone());
    let unreachable = |effect: &str| {
        (
            "node.kubernetes.io/unreachable".to_string(),
            effect.to_string(),
        )
    };
    wait_until_async(
        "every node Unknown, NoSchedule, not NoExecute",
        WAIT,
        || async {
            let mut seen = Vec::new();
            for name in ["node-1", "node-2", "node-3"] {
                let n = nodes.get(name).await.unwrap();
                seen.push((ready_of(&n), taints_of(&nodes, name).await));
            }
            let ok = seen.iter().all(|(r, t)| {
                r.as_deref() == Some("Unknown")
                    && t.contains(&unreachable("NoSchedule"))
                    && !t.contains(&unreachable("NoExecute"))
            });
            ok.then_some(()).ok_or(seen)
        },
    )
    .await;
    // And it stays so: sampled over six monitor periods (0.5 s each).
    let window = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < window {
        for name in ["node-1", "node-2", "node-3"] {
            let t = taints_of(&nodes, name).await;
            assert!(!t.contains(&unreachable("NoExecute")), "{name}: {t:?}");
        }
        let ps = pods.list(&lp).await.unwrap().items;
        assert!(
            ps.iter().all(|p| p.metadata.deletion_timestamp.is_none()),
            "no pod evicted while every node is away"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // One node returns: the cluster is no longer wholly disrupted, so the two still away
    // are tainted NoExecute and their pods evicted.
    c.nodes().resume("node-1").await;
    wait_until_async("node-2 and node-3 tainted NoExecute", WAIT, || async {
        let mut seen = Vec::new();
        for name in ["node-2", "node-3"] {
            seen.push(taints_of(&nodes, name).await);
        }
        seen.iter()
            .all(|t| t.contains(&unreachable("NoExecute")))
            .then_some(())
            .ok_or(seen)
    })
    .await;
    assert!(
        !taints_of(&nodes, "node-1")
            .await
            .contains(&unreachable("NoExecute")),
        "the node that came back is not tainted"
    );
    c.shutdown().await;
}
