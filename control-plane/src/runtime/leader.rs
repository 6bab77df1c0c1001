//! Leader election through a coordination.k8s.io/v1 Lease, with client-go's algorithm and
//! defaults (lease 15 s, renew deadline 10 s, retry 2 s):
//!
//! - A candidate takes the Lease when it is free or when its holder has not renewed it for a
//!   whole lease duration, measured on the candidate's own monotonic clock from the moment it
//!   last saw the record change (so clock skew between machines does not matter).
//! - The leader renews every retry period; if it cannot renew within the renew deadline it
//!   stops acting at once. Because the renew deadline is shorter than the lease duration, the
//!   old leader has stopped before any standby can take over: two processes never both act.
//! - On shutdown the leader releases the Lease so a standby takes over without waiting.
//!
//! Writes use the Lease's resourceVersion (optimistic concurrency), so two candidates racing
//! for a free Lease cannot both win.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio_util::sync::CancellationToken;

use super::controller::api_code;
use super::metrics::Metrics;

/// Where the lease lives, who we are, and the timings.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per process: `<hostname>_<random>`.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// kube-controller-manager's defaults for the lease `kube-system/<name>`.
    pub fn new(name: impl Into<String>) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: name.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Rejects timings under which two leaders could overlap (as client-go does).
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err("the lease duration must be greater than the renew deadline".into());
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return Err("the renew deadline must be greater than 1.2 x the retry period".into());
        }
        if self.retry_period.is_zero() {
            return Err("the retry period must be positive".into());
        }
        Ok(())
    }
}

/// `<hostname>_<random hex>`, unique per process as client-go's `id + "_" + uuid`.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}_{:016x}", rand::random::<u64>())
}

/// The parts of a Lease that make up a leader record.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: String,
    duration: Duration,
    acquired: Option<Timestamp>,
    renewed: Option<Timestamp>,
    transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.unwrap_or_default(),
            duration: Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            ),
            acquired: spec.acquire_time.map(|t| t.0),
            renewed: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    fn spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()).filter(|h| !h.is_empty()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: self.acquired.map(MicroTime),
            renew_time: self.renewed.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..Default::default()
        }
    }
}

struct Observed {
    record: Option<Record>,
    at: Instant,
}

/// One candidate for a lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    metrics: Metrics,
    observed: Mutex<Observed>,
    last_renew: Mutex<Option<Instant>>,
    leading: AtomicBool,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaderElectionConfig, metrics: Metrics) -> LeaderElector {
        metrics.set_leader(&config.name, false);
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            metrics,
            observed: Mutex::new(Observed {
                record: None,
                at: Instant::now(),
            }),
            last_renew: Mutex::new(None),
            leading: AtomicBool::new(false),
        }
    }

    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Whether this process holds the lease right now.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// False when we lead but have not renewed for longer than the lease (a stuck leader):
    /// what client-go's leader-election health check reports.
    pub fn healthy(&self) -> bool {
        if !self.is_leader() {
            return true;
        }
        let last = *self.last_renew.lock().unwrap_or_else(|p| p.into_inner());
        last.is_none_or(|t| t.elapsed() <= self.config.lease_duration + Duration::from_secs(20))
    }

    /// Campaigns for the lease until `token` is cancelled; each time it is won, runs
    /// `lead(term)` until the term ends (lease lost, or `token` cancelled), then campaigns
    /// again. `lead` must stop acting when `term` is cancelled. On cancellation the lease is
    /// released.
    pub async fn run<F, Fut>(&self, token: CancellationToken, mut lead: F)
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            if !self.acquire(&token).await {
                return;
            }
            self.set_leading(true);
            tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
            let term = token.child_token();
            {
                let leading = lead(term.clone());
                let mut leading = std::pin::pin!(leading);
                let renewing = self.renew_until_lost(&term);
                let mut renewing = std::pin::pin!(renewing);
                tokio::select! {
                    _ = &mut leading => term.cancel(),
                    _ = &mut renewing => {
                        term.cancel();
                        leading.await;
                    }
                }
            }
            self.set_leading(false);
            if token.is_cancelled() {
                self.release().await;
                return;
            }
            tracing::warn!(lease = %self.config.name, identity = %self.config.identity, "leadership lost; campaigning again");
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
        self.metrics.set_leader(&self.config.name, leading);
    }

    /// Retries until the lease is ours (true) or `token` is cancelled (false).
    async fn acquire(&self, token: &CancellationToken) -> bool {
        let mut logged = false;
        loop {
            if token.is_cancelled() {
                return false;
            }
            if self.try_acquire_or_renew().await {
                return true;
            }
            if !logged {
                let holder = self
                    .observed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record
                    .as_ref()
                    .map(|r| r.holder.clone())
                    .unwrap_or_default();
                tracing::info!(lease = %self.config.name, %holder, "waiting to acquire the lease");
                logged = true;
            }
            // client-go's JitterUntil(retryPeriod, 1.2): spread candidates apart.
            let jitter = self
                .config
                .retry_period
                .mul_f64(rand::random::<f64>() * 1.2);
            tokio::select! {
                _ = token.cancelled() => return false,
                _ = tokio::time::sleep(self.config.retry_period + jitter) => {}
            }
        }
    }

    /// Renews every retry period; returns when a renewal has not succeeded within the renew
    /// deadline (or when `term` is cancelled).
    async fn renew_until_lost(&self, term: &CancellationToken) {
        loop {
            tokio::select! {
                _ = term.cancelled() => return,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let renewed = tokio::time::timeout(self.config.renew_deadline, async {
                loop {
                    if self.try_acquire_or_renew().await {
                        return;
                    }
                    tokio::time::sleep(self.config.retry_period).await;
                }
            });
            tokio::select! {
                _ = term.cancelled() => return,
                r = renewed => if r.is_err() {
                    tracing::error!(lease = %self.config.name, deadline = ?self.config.renew_deadline, "failed to renew the lease within the deadline");
                    return;
                },
            }
        }
    }

    /// One attempt: take a free or expired lease, or renew ours. True if we hold it now.
    async fn try_acquire_or_renew(&self) -> bool {
        let now = Timestamp::now();
        let mut desired = Record {
            holder: self.config.identity.clone(),
            duration: self.config.lease_duration,
            acquired: Some(now),
            renewed: Some(now),
            transitions: 0,
        };
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "reading the lease failed");
                return false;
            }
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(desired.spec()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observe(Some(desired), Instant::now());
                    true
                }
                Err(e) => {
                    if api_code(&e) != Some(409) {
                        tracing::warn!(lease = %self.config.name, error = %e, "creating the lease failed");
                    }
                    false
                }
            };
        };
        let old = Record::of(&lease);
        let observed_at = {
            let mut o = self.observed.lock().unwrap_or_else(|p| p.into_inner());
            if o.record.as_ref() != Some(&old) {
                o.record = Some(old.clone());
                o.at = Instant::now();
            }
            o.at
        };
        let ours = old.holder == self.config.identity;
        if !old.holder.is_empty() && !ours && observed_at.elapsed() < old.duration {
            return false;
        }
        if ours {
            desired.acquired = old.acquired;
            desired.transitions = old.transitions;
        } else {
            desired.transitions = old.transitions.saturating_add(1);
        }
        lease.spec = Some(desired.spec());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                let at = Instant::now();
                self.observe(Some(desired), at);
                *self.last_renew.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
                true
            }
            Err(e) => {
                if api_code(&e) != Some(409) {
                    tracing::warn!(lease = %self.config.name, error = %e, "updating the lease failed");
                }
                false
            }
        }
    }

    fn observe(&self, record: Option<Record>, at: Instant) {
        let mut o = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        o.record = record;
        o.at = at;
    }

    /// Gives the lease up (holder cleared, 1 s duration) so a standby takes it at once. A
    /// write that crossed ours (a renewal still in flight when the term ended) is a
    /// conflict: read again and retry, a few times.
    async fn release(&self) {
        for _ in 0..3 {
            if !self.try_release().await {
                return;
            }
        }
    }

    /// One attempt; true when it met a conflict and is worth retrying.
    async fn try_release(&self) -> bool {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return false;
        };
        let old = Record::of(&lease);
        if old.holder != self.config.identity {
            return false;
        }
        let now = Timestamp::now();
        let released = Record {
            holder: String::new(),
            duration: Duration::from_secs(1),
            acquired: Some(now),
            renewed: Some(now),
            transitions: old.transitions,
        };
        lease.spec = Some(released.spec());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.config.name, "lease released");
                false
            }
            Err(kube::Error::Api(e)) if e.code == 409 => true,
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "releasing the lease failed");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kube_controller_managers_and_valid() {
        let c = LeaderElectionConfig::new("kube-controller-manager");
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.renew_deadline = Duration::from_secs(15);
        assert!(bad.validate().is_err());
        assert_ne!(default_identity(), default_identity());
    }

    #[test]
    fn records_round_trip_through_a_lease() {
        let r = Record {
            holder: "a".into(),
            duration: Duration::from_secs(15),
            acquired: Some(Timestamp::from_second(1_700_000_000).unwrap()),
            renewed: Some(Timestamp::from_second(1_700_000_010).unwrap()),
            transitions: 3,
        };
        let lease = Lease {
            metadata: Default::default(),
            spec: Some(r.spec()),
        };
        assert_eq!(Record::of(&lease), r);
    }
}
