//! The real binary: two `controller-manager` processes against one API server never both
//! act (the standby takes over only after the leader's lease expires, within a lease
//! duration of a SIGKILL or SIGSTOP, or at once when the leader releases it on SIGTERM; a
//! leader resumed after SIGSTOP gives up at once and writes nothing); and the all-in-one
//! `server` with the real kubectl: `kubectl rollout status`, `set image`, `rollout undo` and
//! `--to-revision` end to end, and with `--disable scheduler` pods stay Pending. In process:
//! a leadership term's client writes only while the term runs.

mod controllers_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use controllers_support::{deployment, http_get, metric, Cluster, NodeCredentials, Nodes, Process};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);
/// The controller-managers' lease duration in the leader-election tests (`LEADER_FLAGS`).
const LEASE: Duration = Duration::from_secs(3);

/// The all-in-one `server` binary on a data dir under `dir`, with `extra` flags; once its
/// ops endpoint serves: the process, a client, and the kubeconfig it wrote.
async fn start_server(dir: &Path, extra: &[&str]) -> (Process, kube::Client, PathBuf) {
    let kubeconfig = dir.join("kubeconfig");
    let data = dir.join("data");
    let mut args = vec![
        "server",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--write-kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--controller-manager-bind-address",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let server = Process::spawn(&args, &dir.join("server.log"));
    server.wait_log_field("ops endpoint serving", "addr").await;
    let client = wait_until_async("a client", WAIT, || async {
        control_plane::runtime::client::from_kubeconfig(&kubeconfig)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    (server, client, kubeconfig)
}

/// Played nodes' identities from the CA of the server [`start_server`] started under `dir`.
fn node_credentials(dir: &Path) -> NodeCredentials {
    NodeCredentials {
        data_dir: dir.join("data"),
        admin_kubeconfig: dir.join("kubeconfig"),
    }
}

/// `kubectl rollout status`; on failure the ReplicaSets, pods and the server's last log lines
/// say why.
fn rollout_status(k: &Kubectl, server: &Process) -> String {
    let r = k.run(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    if !r.success {
        let state = k.run(&["get", "rs,pods", "-o", "wide", "--show-labels"]);
        let log = server.log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!(
            "rollout status failed: {}{}\n{}\n{}",
            r.stdout,
            r.stderr,
            state.stdout,
            tail.join("\n")
        );
    }
    r.stdout
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get_opt("kube-controller-manager")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Who reported each SuccessfulCreate for the ReplicaSets.
async fn creators(c: &Cluster) -> Vec<String> {
    let events: Api<Event> = c.api("default");
    events
        .list(
            &ListParams::default().fields("involvedObject.kind=ReplicaSet,reason=SuccessfulCreate"),
        )
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reporting_instance)
        .collect()
}

/// Two controller-manager processes (deployment and replicaset controllers, lease
/// [`LEASE`]), each as the controller manager, once one of them leads.
struct Pair {
    leader: Process,
    standby: Process,
    ops_leader: String,
    ops_standby: String,
    /// The leader's identity.
    first: String,
}

impl Pair {
    async fn start(c: &Cluster) -> Pair {
        let kubeconfig = c
            .server()
            .component_kubeconfig(control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG)
            .to_str()
            .unwrap()
            .to_string();
        let lease = format!("{}s", LEASE.as_secs());
        let args = [
            "controller-manager",
            "--kubeconfig",
            &kubeconfig,
            "--bind-address",
            "127.0.0.1:0",
            "--controllers",
            "deployment,replicaset",
            "--leader-elect-lease-duration",
            &lease,
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-retry-period",
            "500ms",
        ];
        let a = Process::spawn(&args, &c.dir.path().join("cm-a.log"));
        let b = Process::spawn(&args, &c.dir.path().join("cm-b.log"));
        let ops_a = a.wait_log_field("ops endpoint serving", "addr").await;
        let ops_b = b.wait_log_field("ops endpoint serving", "addr").await;
        let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
        let first = wait_until_async("a leader", WAIT, || async {
            holder(&leases).await.ok_or(())
        })
        .await;
        // The Lease names the holder as soon as it is written; its log line follows: which
        // process it is, only once one of them has written it.
        let named = format!("identity={first}");
        let a_leads = wait_until_async("the leader's log says so", WAIT, || async {
            if a.log().contains(&named) {
                Ok(true)
            } else if b.log().contains(&named) {
                Ok(false)
            } else {
                Err(())
            }
        })
        .await;
        let pair = if a_leads {
            Pair {
                leader: a,
                standby: b,
                ops_leader: ops_a,
                ops_standby: ops_b,
                first,
            }
        } else {
            Pair {
                leader: b,
                standby: a,
                ops_leader: ops_b,
                ops_standby: ops_a,
                first,
            }
        };
        assert!(pair.leader.log().contains("became leader"));
        pair
    }
}

/// Waits for a holder other than `first` of the lease and returns it, asserting it came
/// within the lease duration (+1 s) of `since` (when the leader was killed or stopped).
async fn wait_takeover(leases: &Api<Lease>, first: &str, since: Instant, how: &str) -> String {
    let second = wait_until_async("the standby to take over", WAIT, || async {
        holder(leases).await.filter(|h| h != first).ok_or(())
    })
    .await;
    let took = since.elapsed();
    eprintln!("{how}: the standby took the lease over in {took:?} (lease {LEASE:?})");
    assert!(
        took <= LEASE + Duration::from_secs(1),
        "the standby took {took:?} to take over a lease of {LEASE:?}"
    );
    second
}

/// Waits until `standby`'s log names it the holder `identity` (the Lease names a new holder
/// before its log line is written).
async fn wait_leads(standby: &Process, identity: &str) {
    wait_until_async("the standby's log names it the holder", WAIT, || async {
        standby
            .log()
            .contains(&format!("identity={identity}"))
            .then_some(())
            .ok_or(())
    })
    .await;
}

async fn wait_pods(pods: &Api<Pod>, n: usize) {
    wait_until_async(&format!("{n} pods"), WAIT, || async {
        let got = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len();
        (got == n).then_some(()).ok_or(got)
    })
    .await;
}

fn signal(p: &Process, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(p.pid().expect("running")).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

#[tokio::test]
async fn two_controller_managers_never_both_act() {
    let c = Cluster::api_only().await;
    let Pair {
        leader: mut a,
        standby: mut b,
        ops_leader,
        ops_standby,
        first,
    } = Pair::start(&c).await;
    let (leader, standby) = (&mut a, &mut b);
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");

    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &deployment("web", 3))
        .await
        .unwrap();
    let pods: Api<Pod> = c.api("default");
    wait_pods(&pods, 3).await;
    // Events are written in the background: wait for all three.
    let by = wait_until_async("3 SuccessfulCreate events", WAIT, || async {
        let by = creators(&c).await;
        (by.len() == 3).then_some(by.clone()).ok_or(by)
    })
    .await;
    assert!(
        by.iter().all(|i| *i == first),
        "only the leader acted: {by:?}"
    );
    let m_leader = http_get(&ops_leader, "/metrics").await.unwrap();
    let m_standby = http_get(&ops_standby, "/metrics").await.unwrap();
    assert_eq!(
        metric(
            &m_leader,
            "skiff_controller_leader{lease=\"kube-controller-manager\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m_standby,
            "skiff_controller_leader{lease=\"kube-controller-manager\"}"
        ),
        Some(0.0)
    );
    assert!(
        !m_standby.contains("skiff_controller_reconciles_total{controller=\"replicaset\""),
        "the standby reconciled nothing"
    );
    assert_eq!(http_get(&ops_standby, "/healthz").await.unwrap(), "ok");

    // The leader dies without releasing: the standby takes over once the lease expires. It
    // watches the Lease, so it saw the last renewal when it happened and tries right when
    // that renewal expires: within the lease duration of the kill, plus a round trip.
    leader.kill9();
    let killed = Instant::now();
    let second = wait_takeover(&leases, &first, killed, "SIGKILL").await;
    wait_leads(standby, &second).await;
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    wait_pods(&pods, 5).await;
    let by = wait_until_async("5 SuccessfulCreate events", WAIT, || async {
        let by = creators(&c).await;
        (by.len() == 5).then_some(by.clone()).ok_or(by)
    })
    .await;
    assert_eq!(
        by.iter().filter(|i| **i == second).count(),
        2,
        "the new leader made the 2 new pods: {by:?}"
    );
    let sets: Api<ReplicaSet> = c.api("default");
    assert_eq!(
        sets.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    // SIGTERM: a clean exit that releases the lease at once.
    assert!(standby.terminate().await, "a clean exit on SIGTERM");
    let l = leases.get("kube-controller-manager").await.unwrap();
    assert_eq!(
        l.spec.and_then(|s| s.holder_identity),
        None,
        "the lease was released"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn a_stopped_leader_is_deposed_and_writes_nothing_when_it_resumes() {
    let c = Cluster::api_only().await;
    let Pair {
        leader,
        standby,
        ops_leader,
        first,
        ..
    } = Pair::start(&c).await;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "kube-system");
    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    let pods: Api<Pod> = c.api("default");
    wait_pods(&pods, 2).await;
    // Its Events are written in the background: all of them before it stops.
    wait_until_async("2 SuccessfulCreate events", WAIT, || async {
        let by = creators(&c).await;
        (by.len() == 2).then_some(()).ok_or(by)
    })
    .await;
    // The Lease as the leader last wrote it.
    let before = leases.get("kube-controller-manager").await.unwrap();
    assert_eq!(
        before.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        Some(first.clone())
    );

    // Stopped, the leader cannot renew: the standby takes over at its lease's expiry.
    signal(&leader, libc::SIGSTOP);
    let stopped = Instant::now();
    let second = wait_takeover(&leases, &first, stopped, "SIGSTOP").await;
    wait_leads(&standby, &second).await;
    // What the deposed leader's renewal writes: the resourceVersion it read is stale.
    let mut renewal = before.clone();
    renewal.spec.as_mut().unwrap().renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    match leases
        .replace("kube-controller-manager", &PostParams::default(), &renewal)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("a stale renewal must conflict: {other:?}"),
    }

    // Scaled while the old leader sleeps: its informers and queues are stale when it wakes.
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    wait_pods(&pods, 5).await;
    let sets: Api<ReplicaSet> = c.api("default");
    wait_until_async("the ReplicaSet to report 5", WAIT, || async {
        let rs = sets.list(&ListParams::default()).await.unwrap().items;
        let n: Vec<_> = rs
            .iter()
            .map(|r| r.status.as_ref().map(|s| s.replicas))
            .collect();
        (n == [Some(5)]).then_some(()).ok_or(n)
    })
    .await;
    let listed = pods.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = listed.items.iter().map(|p| p.name_any()).collect();
    names.sort();
    // Every pod event from here on: none may come from the old leader.
    let rv = listed.metadata.resource_version.unwrap();
    let mut events = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    signal(&leader, libc::SIGCONT);
    // Its renew deadline passed while it was stopped (or its first renewal reads the new
    // holder): it ends its term at once and campaigns again (the line is logged once its
    // controllers have stopped).
    wait_until_async("the old leader to give up", WAIT, || async {
        let log = leader.log();
        log.contains("leadership lost")
            .then_some(())
            .ok_or_else(|| log.lines().rev().take(5).collect::<Vec<_>>().join("\n"))
    })
    .await;
    let m = http_get(&ops_leader, "/metrics").await.unwrap();
    assert_eq!(
        metric(
            &m,
            "skiff_controller_leader{lease=\"kube-controller-manager\"}"
        ),
        Some(0.0)
    );
    assert_eq!(holder(&leases).await, Some(second.clone()));
    // A marker pod (no controller selects it): once the watch delivers it, it has delivered
    // every pod event before it.
    let marker: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "marker", "labels": {"app": "marker"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &marker).await.unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(e) = events.next().await {
            match e.unwrap() {
                WatchEvent::Added(p) if p.name_any() == "marker" => return,
                WatchEvent::Added(p) => seen.push(format!("added {}", p.name_any())),
                WatchEvent::Deleted(p) => seen.push(format!("deleted {}", p.name_any())),
                WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("{e:?}"),
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the marker pod in the watch");
    let refused = leader.log().matches("write refused").count();
    eprintln!("the resumed leader had {refused} writes refused by its fence");
    assert!(
        seen.is_empty(),
        "the deposed leader created or deleted pods: {seen:?}"
    );
    let mut now: Vec<String> = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    now.sort();
    assert_eq!(now, names, "exactly the new leader's 5 pods");
    // The events of the creations name only the two leaders, the last 3 the new one.
    let by = wait_until_async("5 SuccessfulCreate events", WAIT, || async {
        let by = creators(&c).await;
        (by.len() == 5).then_some(by.clone()).ok_or(by)
    })
    .await;
    assert_eq!(by.iter().filter(|i| **i == second).count(), 3, "{by:?}");
    c.shutdown().await;
}

/// The fence of a term's client, in process against the real API server: its writes reach
/// the server while the term runs, and fail without reaching it once the term has ended
/// (what keeps a deposed leader's stale controllers from creating pods).
#[tokio::test]
async fn a_terms_client_writes_only_while_the_term_runs() {
    use control_plane::runtime::{LeaderElectionConfig, LeaderElector, Metrics};
    use k8s_openapi::api::core::v1::ConfigMap;

    let c = Cluster::api_only().await;
    let mut config = LeaderElectionConfig::new("fence-test");
    config.lease_duration = LEASE;
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(500);
    let elector = LeaderElector::new(c.client.clone(), config, Metrics::new());
    let token = tokio_util::sync::CancellationToken::new();
    let map = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    let (admin, outer) = (c.client.clone(), token.clone());
    let after_term = std::sync::Mutex::new(None);
    let (elector, after) = (&elector, &after_term);
    elector
        .run(token.clone(), |term| {
            let client = elector.fenced(admin.clone(), &term);
            let outer = outer.clone();
            let (during, ended) = (map("during"), map("after"));
            async move {
                let maps: Api<ConfigMap> = Api::namespaced(client, "default");
                maps.create(&PostParams::default(), &during).await.unwrap();
                // The process shuts down: the term ends.
                outer.cancel();
                term.cancelled().await;
                let refused = maps.create(&PostParams::default(), &ended).await;
                let read = maps.get_opt("during").await;
                *after.lock().unwrap() = Some((refused, read));
            }
        })
        .await;
    let (refused, read) = after_term.into_inner().unwrap().expect("the term ran");
    match refused {
        Err(kube::Error::Service(e)) => assert!(e.to_string().contains("not the leader"), "{e}"),
        other => panic!("a write after the term must be refused: {other:?}"),
    }
    assert!(read.unwrap().is_some(), "reads pass the fence");
    let maps: Api<ConfigMap> = c.api("default");
    assert!(maps.get_opt("during").await.unwrap().is_some());
    assert!(
        maps.get_opt("after").await.unwrap().is_none(),
        "the refused write never reached the server"
    );
    c.shutdown().await;
}

// kubectl runs synchronously: other workers keep the played nodes going meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_in_one_server_rolls_out_and_back_with_kubectl() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, client, kubeconfig) =
        start_server(dir.path(), &["--scheduler-bind-address", "127.0.0.1:0"]).await;
    let nodes = Nodes::start(
        client.clone(),
        &node_credentials(dir.path()),
        &["node-1", "node-2"],
    )
    .await;
    let k = Kubectl::new(&kubeconfig, dir.path());
    k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=3",
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_until_async("3 running pods", WAIT, || async {
        let ps = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let running = ps
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        let picture: Vec<String> = ps
            .iter()
            .map(|p| {
                format!(
                    "{}@{:?}",
                    p.name_any(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone())
                )
            })
            .collect();
        (running == 3).then_some(()).ok_or((
            picture,
            server
                .log()
                .lines()
                .rev()
                .take(8)
                .map(str::to_string)
                .collect::<Vec<_>>(),
        ))
    })
    .await;
    let out = rollout_status(&k, &server);
    assert!(out.contains("successfully rolled out"), "{out}");
    k.ok(&["set", "image", "deployment/web", "nginx=nginx:1.28"]);
    rollout_status(&k, &server);
    let history = k.ok(&["rollout", "history", "deployment/web"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    let image = |k: &Kubectl| {
        k.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
    };
    let out = k.ok(&["rollout", "undo", "deployment/web"]);
    assert!(out.contains("rolled back"), "{out}");
    rollout_status(&k, &server);
    assert_eq!(image(&k), "nginx:1.27");
    wait_until_async("pods back on 1.27", WAIT, || async {
        let ps = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let ok = ps.len() == 3
            && ps.iter().all(|p| {
                p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("nginx:1.27")
            });
        ok.then_some(()).ok_or(ps.len())
    })
    .await;
    let revision = k.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
    ]);
    assert_eq!(revision, "3", "a rollback is a new revision");

    k.ok(&["rollout", "undo", "deployment/web", "--to-revision=2"]);
    rollout_status(&k, &server);
    assert_eq!(image(&k), "nginx:1.28");
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let rs = sets
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    assert_eq!(rs.len(), 2, "a rollback reuses the old ReplicaSet");
    let newest = rs
        .iter()
        .find(|r| r.annotations()["deployment.kubernetes.io/revision"] == "4")
        .expect("revision 4");
    assert_eq!(
        newest.annotations()["deployment.kubernetes.io/revision-history"],
        "2"
    );

    nodes.stop_all();
    assert!(server.terminate().await, "a clean exit on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_scheduler_disabled_pods_stay_pending() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, client, kubeconfig) =
        start_server(dir.path(), &["--disable", "scheduler"]).await;
    let nodes = Nodes::start(client.clone(), &node_credentials(dir.path()), &["node-1"]).await;
    let k = Kubectl::new(&kubeconfig, dir.path());
    k.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=2",
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_until_async("2 pods created", WAIT, || async {
        let n = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len();
        (n == 2).then_some(()).ok_or(n)
    })
    .await;
    // The controllers are done with them (the ReplicaSet reports them); nobody binds them.
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    wait_until_async("the ReplicaSet to report 2", WAIT, || async {
        let rs = sets
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let n = rs
            .first()
            .and_then(|r| r.status.as_ref())
            .map(|s| s.replicas);
        (n == Some(2)).then_some(()).ok_or(n)
    })
    .await;
    let out = k.ok(&["get", "pods", "-l", "app=web"]);
    assert_eq!(out.matches("Pending").count(), 2, "{out}");
    for p in pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
    {
        assert!(p.spec.unwrap().node_name.is_none());
    }
    // No scheduler runs at all: it would hold the kube-scheduler Lease; the controllers
    // hold theirs.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    assert!(leases
        .get_opt("kube-controller-manager")
        .await
        .unwrap()
        .is_some());
    assert!(leases.get_opt("kube-scheduler").await.unwrap().is_none());
    assert!(server.log().contains("scheduler disabled"));
    nodes.stop_all();
    assert!(server.terminate().await);
}
