//! How a scheduler runs: which pods are its own, how much of a large cluster it searches,
//! queue timings, leader election, and where it serves health and metrics.

use std::net::SocketAddr;
use std::time::Duration;

use super::metrics::Metrics;
use super::queue::QueueConfig;
use crate::runtime::LeaderElectionConfig;

/// The scheduler's configuration; `Config::default()` is kube-scheduler's default profile.
#[derive(Clone)]
pub struct Config {
    /// Pods whose spec.schedulerName is this are scheduled.
    pub scheduler_name: String,
    /// Share of nodes searched for feasible ones (1-100); None adapts to the cluster's size
    /// as kube-scheduler does (all nodes up to 100, 10% at 5,000 nodes).
    pub percentage_of_nodes_to_score: Option<u8>,
    pub queue: QueueConfig,
    /// Lease-based leader election; None schedules as soon as the caches are in sync.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Where to serve /healthz, /readyz and /metrics; None serves nothing.
    pub ops_listen: Option<SocketAddr>,
    /// Bindings written concurrently (later ones wait; decisions do not).
    pub parallel_binds: usize,
    /// An assumed pod that the watch has not confirmed this long after its binding was written
    /// is dropped from the cache.
    pub assumed_ttl: Duration,
    /// The scheduler's metrics; pass a clone in to render them elsewhere too.
    pub metrics: Metrics,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scheduler_name: "default-scheduler".into(),
            percentage_of_nodes_to_score: None,
            queue: QueueConfig::default(),
            leader_election: None,
            ops_listen: None,
            parallel_binds: 32,
            assumed_ttl: Duration::from_secs(60),
            metrics: Metrics::new(),
        }
    }
}

impl Config {
    /// The defaults plus kube-scheduler's leader election (lease `kube-system/kube-scheduler`).
    pub fn with_leader_election() -> Config {
        Config {
            leader_election: Some(LeaderElectionConfig::new("kube-scheduler")),
            ..Config::default()
        }
    }
}
