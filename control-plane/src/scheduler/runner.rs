//! Running a scheduler against an API server: the informers and their handlers, the wait for
//! the first lists, the ops endpoint (health, metrics), housekeeping (expired assumptions,
//! gauges), leader election, and the scheduling loop on a thread of its own while leading.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::algorithm::Algorithm;
use super::binder::Binder;
use super::config::Config;
use super::cycle::Scheduler;
use super::plugins::volume_binding;
use super::queue::SchedulingQueue;
use crate::runtime::leader::default_identity;
use crate::runtime::ops::{self, Ops};
use crate::runtime::{EventSink, Informer, LeaderElector};

/// The component name on Events, as kube-scheduler's default profile writes it.
pub const COMPONENT: &str = "default-scheduler";

/// Why the scheduler could not run.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("serving health and metrics on {addr}: {source}")]
    OpsListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("leader election: {0}")]
    LeaderElection(String),
}

/// Pods that have not finished: pending ones for the queue, bound ones for the cache.
const POD_FIELDS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Runs the scheduler until `shutdown` is cancelled: watches pods, nodes, namespaces,
/// PodDisruptionBudgets (for preemption), and claims, volumes and classes (VolumeBinding)
/// through `client`, and binds every pending pod whose schedulerName is
/// `config.scheduler_name`. With leader election configured it schedules only while it holds
/// the lease (the caches stay warm meanwhile). Returns once everything it started has
/// stopped.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), SchedulerError> {
    if let Some(le) = &config.leader_election {
        le.validate().map_err(SchedulerError::LeaderElection)?;
    }
    let token = shutdown.child_token();
    let identity = default_identity();
    let events = EventSink::start(client.clone(), identity.clone(), token.clone());
    let sched = Arc::new(Scheduler::new(
        config.scheduler_name.clone(),
        SchedulingQueue::new(config.queue),
        config.metrics.clone(),
        Binder::new(client.clone()),
        events.recorder(COMPONENT),
        config.parallel_binds,
    ));

    let pods: Informer<Pod> = Informer::new(
        Api::all(client.clone()),
        watcher::Config::default().fields(POD_FIELDS),
    );
    let nodes: Informer<Node> = Informer::new(Api::all(client.clone()), watcher::Config::default());
    let namespaces: Informer<Namespace> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let budgets: Informer<PodDisruptionBudget> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let claims: Informer<PersistentVolumeClaim> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let volumes: Informer<PersistentVolume> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    let classes: Informer<StorageClass> =
        Informer::new(Api::all(client.clone()), watcher::Config::default());
    crate::controllers::persistentvolume::index_volumes(&volumes);
    sched.cache().set_volume_listers(volume_binding::Listers {
        claims: claims.clone(),
        volumes: volumes.clone(),
        classes: classes.clone(),
    });
    {
        let s = sched.clone();
        claims.on_change(move |c| s.on_claim(c));
        let s = sched.clone();
        volumes.on_change(move |c| s.on_volume(c));
        let s = sched.clone();
        classes.on_change(move |c| s.on_class(c));
        let s = sched.clone();
        pods.on_change(move |c| s.on_pod(c));
        let s = sched.clone();
        nodes.on_change(move |c| s.on_node(c));
        let s = sched.clone();
        namespaces.on_change(move |c| s.on_namespace(c));
        let s = sched.clone();
        budgets.on_change(move |c| s.on_budget(c));
    }
    let mut tasks = vec![
        tokio::spawn(namespaces.clone().run(token.clone())),
        tokio::spawn(nodes.clone().run(token.clone())),
        tokio::spawn(pods.clone().run(token.clone())),
        tokio::spawn(budgets.clone().run(token.clone())),
        tokio::spawn(claims.clone().run(token.clone())),
        tokio::spawn(volumes.clone().run(token.clone())),
        tokio::spawn(classes.clone().run(token.clone())),
        tokio::spawn(housekeeping(
            sched.clone(),
            config.assumed_ttl,
            token.clone(),
        )),
    ];

    let runtime_metrics = crate::runtime::Metrics::new();
    let elector = config.leader_election.clone().map(|le| {
        Arc::new(LeaderElector::new(
            client.clone(),
            le,
            runtime_metrics.clone(),
        ))
    });
    if let Some(addr) = config.ops_listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SchedulerError::OpsListen { addr, source })?;
        let synced = {
            let (p, n, ns, b) = (
                pods.clone(),
                nodes.clone(),
                namespaces.clone(),
                budgets.clone(),
            );
            let (c, v, sc) = (claims.clone(), volumes.clone(), classes.clone());
            move || {
                if p.has_synced()
                    && n.has_synced()
                    && ns.has_synced()
                    && b.has_synced()
                    && c.has_synced()
                    && v.has_synced()
                    && sc.has_synced()
                {
                    Ok(())
                } else {
                    Err("informers not synced".to_string())
                }
            }
        };
        let mut o = Ops::new().check("informer-sync", synced);
        if let Some(e) = elector.clone() {
            o = o.check("leader-election", move || {
                if e.healthy() {
                    Ok(())
                } else {
                    Err("the lease has not been renewed".into())
                }
            });
        }
        let m = config.metrics.clone();
        let o = o
            .metrics(move || m.render())
            .metrics(move || runtime_metrics.render());
        tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving health and metrics");
        tasks.push(tokio::spawn(ops::serve(listener, o, token.clone())));
    }

    let synced = async {
        pods.wait_synced().await;
        nodes.wait_synced().await;
        namespaces.wait_synced().await;
        budgets.wait_synced().await;
        claims.wait_synced().await;
        volumes.wait_synced().await;
        classes.wait_synced().await;
    };
    let started = Instant::now();
    let ready = tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = synced => true,
    };
    if ready {
        tracing::info!(took = ?started.elapsed(), nodes = nodes.len(), pods = pods.len(), "caches synced");
        let lead = |term: CancellationToken| {
            lead(sched.clone(), config.percentage_of_nodes_to_score, term)
        };
        match &elector {
            // Each term binds and preempts through a client fenced by its lease, so a
            // deposed scheduler (resumed after a stop) writes nothing once the term is over.
            Some(e) => {
                e.run(shutdown.clone(), |term| {
                    sched.binder.use_client(e.fenced(client.clone(), &term));
                    lead(term)
                })
                .await
            }
            None => lead(shutdown.clone()).await,
        }
    }
    token.cancel();
    sched.queue.close();
    futures::future::join_all(tasks).await;
    Ok(())
}

/// Runs the scheduling loop on its own thread until `term` ends.
async fn lead(sched: Arc<Scheduler>, percentage: Option<u8>, term: CancellationToken) {
    let rt = tokio::runtime::Handle::current();
    let waker = {
        let (s, t) = (sched.clone(), term.clone());
        tokio::spawn(async move {
            t.cancelled().await;
            s.queue.wake();
        })
    };
    let (s, t) = (sched.clone(), term.clone());
    let thread = std::thread::Builder::new()
        .name("scheduling-loop".into())
        .spawn(move || s.scheduling_loop(&mut Algorithm::new(percentage), &rt, &t));
    match thread {
        Ok(handle) => {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        Err(e) => tracing::error!(error = %e, "starting the scheduling loop failed"),
    }
    waker.abort();
}

/// Once a second: drop assumptions the watch never confirmed, and refresh the gauges.
async fn housekeeping(sched: Arc<Scheduler>, ttl: Duration, token: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (nodes, pods, assumed) = {
            let mut cache = sched.cache();
            let expired = cache.expire_assumed(Instant::now(), ttl);
            if expired > 0 {
                tracing::warn!(
                    expired,
                    "assumed pods never confirmed by the watch; dropped"
                );
            }
            (cache.node_count(), cache.pod_count(), cache.assumed_count())
        };
        sched.metrics.set_cache(nodes, pods, assumed);
        sched.metrics.set_queue(sched.queue.sizes());
    }
}
