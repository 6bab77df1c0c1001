//! The controller-manager process: the ops endpoint (health, metrics) and the controllers,
//! under leader election so that of several controller-managers only one acts. Each won
//! term starts the controllers afresh (new informers, empty queues); a lost term stops them
//! before the lease can pass to another process, and their writes go through a client that
//! refuses them once the lease may be another's ([`LeaderElector::fenced`]).

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Settings;
use crate::runtime::ops::{self, Ops};
use crate::runtime::{LeaderElectionConfig, LeaderElector, Metrics};

/// How the controller-manager runs.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub settings: Settings,
    /// None: no leader election (`--leader-elect=false`), act at once.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Where /healthz and /metrics are served (None: nowhere).
    pub ops_listen: Option<SocketAddr>,
}

/// Why the controller-manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("leader election: {0}")]
    LeaderElection(String),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A started controller-manager.
pub struct ControllerManager {
    metrics: Metrics,
    elector: Option<Arc<LeaderElector>>,
    ops_addr: Option<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl ControllerManager {
    /// Binds the ops endpoint and starts campaigning (or acting); runs until `token` is
    /// cancelled.
    pub async fn start(
        client: Client,
        mut config: ManagerConfig,
        token: CancellationToken,
    ) -> Result<ControllerManager, ManagerError> {
        let metrics = Metrics::new();
        let elector = match config.leader_election.take() {
            Some(le) => {
                le.validate().map_err(ManagerError::LeaderElection)?;
                // Events name the process that holds the lease.
                config.settings.identity = le.identity.clone();
                Some(Arc::new(LeaderElector::new(
                    client.clone(),
                    le,
                    metrics.clone(),
                )))
            }
            None => None,
        };
        let mut ops_addr = None;
        if let Some(addr) = config.ops_listen {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| ManagerError::Listen { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| ManagerError::Listen { addr, source })?;
            ops_addr = Some(bound);
            let m = metrics.clone();
            let mut endpoint = Ops::new().metrics(move || m.render());
            let m = metrics.clone();
            endpoint = endpoint.check("controllers", move || m.panic_health());
            if let Some(e) = elector.clone() {
                endpoint = endpoint.check("leaderElection", move || {
                    if e.healthy() {
                        Ok(())
                    } else {
                        Err("the lease has not been renewed in time".into())
                    }
                });
            }
            tracing::info!(addr = %bound, "ops endpoint serving (/healthz, /metrics)");
            tokio::spawn(ops::serve(listener, endpoint, token.clone()));
        }
        let settings = Arc::new(config.settings);
        let task = {
            let (metrics, elector) = (metrics.clone(), elector.clone());
            tokio::spawn(async move {
                match elector {
                    Some(e) => {
                        // Each term writes through a client fenced by the lease: a deposed
                        // leader's stale controllers cannot write before the term ends.
                        e.run(token, |term| {
                            let client = e.fenced(client.clone(), &term);
                            super::run(client, settings.clone(), metrics.clone(), term)
                        })
                        .await;
                    }
                    None => super::run(client, settings, metrics, token).await,
                }
            })
        };
        Ok(ControllerManager {
            metrics,
            elector,
            ops_addr,
            task,
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether this process acts now (always, without leader election).
    pub fn is_leader(&self) -> bool {
        self.elector.as_ref().is_none_or(|e| e.is_leader())
    }

    /// The address of the ops endpoint, if serving.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops_addr
    }

    /// Waits until the controllers have stopped (after the token is cancelled), the lease
    /// released.
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}
