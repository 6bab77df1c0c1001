//! Faults of the etcd store, with real processes: a 3-member etcd cluster whose leader is
//! killed (SIGKILL) during a burst of writes through the API server. Every acknowledged write
//! is there afterwards, the API answers again within 2 s of the new leader's election (every
//! write sent after it, not only the first; the figures are printed), and a watch that
//! was open before the kill sees every object exactly once, in revision order (no gap, no
//! duplicate), without being ended (the watch cache resumes its etcd watch from the next
//! revision). And one member (the leader) cut off from its peers for 30 s (its peer
//! traffic dropped by iptables, matched by its port and its cgroup) and healed: writes go
//! on, none acknowledged is lost, and the member catches up to the others' revision.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control_plane::apiserver::{Config, Server};
use control_plane::store::etcd::EtcdConfig;
use control_plane::store::Backend;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use skiff_tests::etcd::EtcdCluster;
use skiff_tests::wait_until_async;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"burst": "yes"}},
        "data": {"n": name},
    }))
    .unwrap()
}

fn rv_of(c: &ConfigMap) -> u64 {
    c.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// Creates `name`, retrying while the store is unavailable; a retry that finds the object
/// means an earlier attempt was committed without its answer arriving (acknowledged now).
async fn create_acked(cms: &Api<ConfigMap>, name: &str) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    while Instant::now() < deadline {
        match cms.create(&PostParams::default(), &cm(name)).await {
            Ok(o) => return Ok(rv_of(&o)),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                if let Ok(o) = cms.get(name).await {
                    return Ok(rv_of(&o));
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{name} not written within 120 s: {last}"))
}

/// An API server on `etcd` (no compaction), its ConfigMaps in `default` as the admin, and
/// its data directory (kept as long as the server runs).
async fn server_on(
    etcd: &EtcdCluster,
) -> (
    control_plane::apiserver::RunningServer,
    Api<ConfigMap>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    let mut store = EtcdConfig::new(etcd.endpoints());
    store.compaction_interval = Duration::ZERO;
    config.store = Backend::Etcd(store);
    let server = Server::start(config).await.unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    (server, Api::namespaced(client, "default"), dir)
}

/// A member's view of the cluster: its leader's id and the raft term.
struct MemberStatus {
    member: u64,
    leader: u64,
    term: u64,
}

async fn member_status(endpoint: &str) -> MemberStatus {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let s = c.status().await.unwrap();
    MemberStatus {
        member: s.header().map_or(0, |h| h.member_id()),
        leader: s.leader(),
        term: s.raft_term(),
    }
}

/// Asks each of `endpoints` every 20 ms who leads, until one names a leader other than
/// `old` (and not none) in a term after `term`: when the request that first got that answer
/// was sent (the election was over at most one round trip later), the new leader and its
/// term.
async fn new_leader_seen(endpoints: Vec<String>, old: u64, term: u64) -> (Instant, u64, u64) {
    let polls = endpoints
        .into_iter()
        .map(|e| Box::pin(leader_change_seen_by(e, old, term)));
    futures::future::select_all(polls).await.0
}

async fn leader_change_seen_by(endpoint: String, old: u64, term: u64) -> (Instant, u64, u64) {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(200))
        .with_timeout(Duration::from_millis(200));
    let mut c = etcd_client::Client::connect([endpoint], Some(options))
        .await
        .unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let sent = Instant::now();
        if let Ok(s) = c.status().await {
            if s.leader() != 0 && s.leader() != old && s.raft_term() > term {
                return (sent, s.leader(), s.raft_term());
            }
        }
    }
}

/// Every acknowledged write is stored at the revision it was acknowledged at; what is
/// stored (name -> revision).
async fn assert_stored(
    cms: &Api<ConfigMap>,
    acked: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    let listed: BTreeMap<String, u64> = cms
        .list(&ListParams::default().labels("burst=yes"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (o.metadata.name.clone().unwrap(), rv_of(o)))
        .collect();
    for (name, rv) in acked {
        assert_eq!(listed.get(name), Some(rv), "acknowledged {name} at {rv}");
    }
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_leader_killed_during_a_burst_of_writes_loses_nothing() {
    let mut etcd = EtcdCluster::start(3);
    let (server, cms, _dir) = server_on(&etcd).await;
    let start = rv_of(
        &cms.create(&PostParams::default(), &cm("seed"))
            .await
            .unwrap(),
    );

    // A watch open before the kill, from the seed's revision: it must never end with an
    // error, and it records every ADDED in order.
    let seen = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let watcher = {
        let cms = cms.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            let params = WatchParams::default().labels("burst=yes").timeout(290);
            let mut from = start.to_string();
            loop {
                let mut events =
                    Box::pin(cms.watch(&params, &from).await.expect("opening the watch"));
                while let Some(e) = events.try_next().await.expect("the watch stream") {
                    match e {
                        WatchEvent::Added(o) => {
                            from = rv_of(&o).to_string();
                            seen.lock()
                                .unwrap()
                                .push((o.metadata.name.clone().unwrap(), rv_of(&o)));
                        }
                        WatchEvent::Bookmark(b) => from = b.metadata.resource_version,
                        WatchEvent::Error(e) => panic!("the watch was ended: {e:?}"),
                        other => panic!("unexpected event {other:?}"),
                    }
                }
                // The server's timeout: carry on from the last revision, as clients do.
            }
        })
    };

    // 4 writers, each creating its own configmaps, retrying what the kill interrupts. Each
    // acknowledgement's time is kept (the fail-over time is measured to the first one after
    // the election).
    const PER_WRITER: usize = 60;
    let acked = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    // (when the write was sent, when it was acknowledged)
    let ack_times = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let cms = cms.clone();
        let acked = acked.clone();
        let ack_times = ack_times.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..PER_WRITER {
                let name = format!("w{w}-{i:03}");
                let sent = Instant::now();
                let rv = create_acked(&cms, &name).await?;
                ack_times.lock().unwrap().push((sent, Instant::now()));
                acked.lock().unwrap().insert(name, rv);
            }
            Ok::<(), String>(())
        }));
    }
    wait_until_async("writes are flowing", Duration::from_secs(60), || async {
        let n = acked.lock().unwrap().len();
        if n >= 40 {
            Ok(())
        } else {
            Err(n)
        }
    })
    .await;

    // The leader, as it says itself (a loaded machine's fast elections may have just moved
    // it: ask again until the member found leading says so).
    let (leader, old) = loop {
        let i = etcd.leader().expect("an etcd leader");
        let s = member_status(&etcd.members()[i].endpoint()).await;
        if s.leader == s.member {
            break (i, s);
        }
    };
    // The two members left are asked for their leader every 20 ms from before the kill: the
    // first answer naming another leader is when the election is known to be over.
    let survivors: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| etcd.members()[i].endpoint())
        .collect();
    let election = tokio::spawn(new_leader_seen(survivors, old.leader, old.term));
    let killed = Instant::now();
    etcd.kill(leader);
    let (elected, new_leader, term) = tokio::time::timeout(Duration::from_secs(30), election)
        .await
        .expect("a new leader within 30 s")
        .unwrap();
    assert!(term > old.term, "term {term} after {}", old.term);
    let new_index = etcd.leader().expect("a new leader among the two left");
    assert_ne!(new_index, leader);
    // The API answers again within 2 s of the re-election: from the moment a member first
    // names the new leader to the first write acknowledged through the API server after it.
    let probe = create_acked(&cms, "after-election").await;
    let probed = Instant::now();
    probe.unwrap();
    let first = ack_times
        .lock()
        .unwrap()
        .iter()
        .map(|(_, acked)| *acked)
        .filter(|t| *t >= elected)
        .min()
        .unwrap_or(probed)
        .min(probed);
    let answered = first - elected;
    println!(
        "etcd leader {:x} killed; {new_leader:x} elected (term {term}) {:?} after the kill; \
         first write through the API server {answered:?} after the election (the probe's: \
         {:?})",
        old.leader,
        elected - killed,
        probed - elected,
    );
    assert!(
        answered <= Duration::from_secs(2),
        "the API answered {answered:?} after the re-election"
    );
    for w in writers {
        w.await.unwrap().unwrap();
    }
    // Writes sent once the new leader is known: how long they took.
    let after: Vec<Duration> = ack_times
        .lock()
        .unwrap()
        .iter()
        .filter(|(sent, _)| *sent >= elected)
        .map(|(sent, acked)| *acked - *sent)
        .collect();
    let slowest = after.iter().max().copied().unwrap_or_default();
    let slow = after
        .iter()
        .filter(|d| **d >= Duration::from_millis(900))
        .count();
    println!(
        "{} writes sent after the election: slowest {slowest:?}, {slow} took 900 ms or more",
        after.len()
    );
    // And every write sent after it is answered within those 2 s, not only the first (a
    // request the client sent to the dead member is sent again, not answered 503).
    assert!(
        slowest <= Duration::from_secs(2),
        "{slow} of {} writes sent after the re-election took 900 ms or more, one {slowest:?}",
        after.len()
    );

    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), 4 * PER_WRITER);

    // Every acknowledged write is there, at the revision it was acknowledged at.
    let listed = assert_stored(&cms, &acked).await;

    // The watch saw exactly what is stored: each object once, in revision order.
    wait_until_async(
        "the watch has seen every object",
        Duration::from_secs(60),
        || async {
            let n = seen.lock().unwrap().len();
            // The seed is not after `start`; everything else is.
            if n + 1 >= listed.len() {
                Ok(())
            } else {
                Err((n, listed.len()))
            }
        },
    )
    .await;
    let seen = seen.lock().unwrap().clone();
    let names: BTreeSet<&String> = seen.iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), seen.len(), "a duplicate in {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].1 < w[1].1),
        "events out of revision order: {seen:?}"
    );
    let expected: BTreeSet<&String> = listed.keys().filter(|n| *n != "seed").collect();
    assert_eq!(names, expected, "the watch missed or invented objects");
    for (name, rv) in &seen {
        assert_eq!(listed.get(name), Some(rv), "{name}");
    }
    watcher.abort();

    // The killed member comes back and catches up; the API keeps serving.
    etcd.restart(leader);
    create_acked(&cms, "after-restart").await.unwrap();
    server.shutdown().await;
}

/// Drops one etcd member's peer traffic on loopback (iptables, OUTPUT on lo): everything to
/// or from its peer port, and what its own cgroup sends to the other members' peer ports.
/// Its clients' port stays open. The rules go on Drop.
struct PeerCut {
    rules: Vec<Vec<String>>,
}

impl PeerCut {
    fn new(peer_port: u16, cgroup: &std::path::Path, others: &[u16]) -> PeerCut {
        let rel = cgroup
            .strip_prefix(skiff_tests::cgroup::v2_root())
            .expect("a cgroup under the v2 root")
            .to_string_lossy()
            .into_owned();
        let base = |extra: &[&str]| -> Vec<String> {
            ["OUTPUT", "-o", "lo", "-p", "tcp"]
                .iter()
                .chain(extra)
                .chain(["-j", "DROP"].iter())
                .map(|s| s.to_string())
                .collect()
        };
        let mut rules = vec![
            base(&["--dport", &peer_port.to_string()]),
            base(&["--sport", &peer_port.to_string()]),
        ];
        for p in others {
            rules.push(base(&[
                "-m",
                "cgroup",
                "--path",
                &rel,
                "--dport",
                &p.to_string(),
            ]));
        }
        for r in &rules {
            let ok = std::process::Command::new("iptables")
                .args(["-w", "-I"])
                .args(r)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "iptables -I {r:?}");
        }
        PeerCut { rules }
    }
}

impl Drop for PeerCut {
    fn drop(&mut self) {
        for r in &self.rules {
            let _ = std::process::Command::new("iptables")
                .args(["-w", "-D"])
                .args(r)
                .status();
        }
    }
}

/// One member of three (the leader: the worst case) cut off from its peers for 30 s while
/// writers keep writing through the API server, then healed: writes go on during the cut
/// (the other two are a quorum), every acknowledged write is stored at the revision it was
/// acknowledged at, and the cut member catches up to the same revision (the cluster
/// converges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_member_cut_off_for_30_s_loses_no_write_and_converges() {
    let groups: Vec<skiff_tests::cgroup::Cgroup> = (0..3)
        .map(|i| skiff_tests::cgroup::Cgroup::new(&format!("etcd-m{i}")))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = EtcdCluster::plan_in(dir.path(), 3);
    for (i, g) in groups.iter().enumerate() {
        etcd.set_cgroup(i, g.path());
    }
    etcd.start_all();
    let (server, cms, _data) = server_on(&etcd).await;

    // Two writers write until told to stop, retrying what the cut interrupts.
    let acked = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (cms, acked, stop) = (cms.clone(), acked.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("c{w}-{i:04}");
                    let rv = create_acked(&cms, &name).await?;
                    acked.lock().unwrap().insert(name, rv);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    wait_until_async("writes are flowing", Duration::from_secs(60), || async {
        match acked.lock().unwrap().len() {
            n if n >= 20 => Ok(()),
            n => Err(n),
        }
    })
    .await;

    let cut = etcd.leader().expect("an etcd leader");
    let members = etcd.members();
    let others: Vec<u16> = (0..3)
        .filter(|&j| j != cut)
        .map(|j| members[j].peer_port)
        .collect();
    let before = acked.lock().unwrap().len();
    let rules = PeerCut::new(members[cut].peer_port, groups[cut].path(), &others);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = acked.lock().unwrap().len() - before;
    drop(rules);
    println!("writes acknowledged during the 30 s cut: {during}");
    assert!(
        during > 0,
        "the two members left are a quorum: writes must go on"
    );
    // A few more after the heal, then stop.
    let healed = acked.lock().unwrap().len();
    wait_until_async("writes after the heal", Duration::from_secs(60), || async {
        match acked.lock().unwrap().len() {
            n if n >= healed + 20 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap().unwrap();
    }

    // No acknowledged write is lost.
    let acked = acked.lock().unwrap().clone();
    assert_stored(&cms, &acked).await;
    // The cut member converges: every member at the same revision, past the last write.
    let last = acked.values().copied().max().unwrap();
    let ports: Vec<u16> = members.iter().map(|m| m.client_port).collect();
    wait_until_async(
        "every member at the same revision",
        Duration::from_secs(60),
        || {
            let ports = ports.clone();
            async move {
                let revs: Vec<u64> = ports
                    .iter()
                    .map(|p| skiff_tests::etcd::revision(*p).unwrap_or(0))
                    .collect();
                match revs.iter().all(|r| *r == revs[0] && *r >= last) {
                    true => Ok(()),
                    false => Err(revs),
                }
            }
        },
    )
    .await;
    server.shutdown().await;
}
