//! Leader election through a coordination.k8s.io/v1 Lease, with client-go's defaults (lease
//! 15 s, renew deadline 10 s, retry 2 s) and its algorithm, except where noted:
//!
//! - A candidate takes the Lease when it is free or when its holder has not renewed it for a
//!   whole lease duration, measured on the candidate's own monotonic clock from the moment it
//!   saw the record change (so clock skew between machines does not matter: renewTime is
//!   never compared with a local clock).
//! - The leader renews every retry period; if it cannot renew within the renew deadline it
//!   stops acting at once. Because the renew deadline is shorter than the lease duration, the
//!   old leader has stopped before any standby can take over: two processes never both act.
//! - On shutdown the leader releases the Lease so a standby takes over without waiting.
//!
//! Writes use the Lease's resourceVersion (optimistic concurrency), so two candidates racing
//! for a free Lease cannot both win, and a deposed leader's renewal fails with 409 Conflict.
//!
//! Where it differs from client-go, and why:
//!
//! - client-go's standbys only poll (every retry period plus up to 1.2x jitter), so they see
//!   a renewal up to 4.4 s late and notice the expiry up to 4.4 s late again: a takeover
//!   after a SIGKILL took up to ~24 s. Here a standby also watches the one Lease (field
//!   selector `metadata.name`), so it sees each renewal when it happens, and sleeps until the
//!   moment the observed record expires (or the next poll, whichever is first): it takes over
//!   at the last renewal + the lease duration + one round trip. The poll stays, for when the
//!   watch is down ([`standby_wake`]).
//! - A free Lease (released on shutdown, seen through the watch) is tried for at once.
//! - A renewal round has the renew deadline from its start, as in client-go, but a round
//!   that begins more than the fence window after the last successful renewal began (a
//!   leader resumed after a SIGSTOP) ends the term before it sends a request.
//! - A renewal that reads another holder ends the term at once (client-go retries until the
//!   renew deadline): the leader was deposed and must not act a moment longer.
//! - While leading, the controllers write through [`LeaderElector::fenced`], a client that
//!   refuses writes once the term has ended or the last renewal began more than the fence
//!   window ([`LeaderElectionConfig::fence_window`]) ago. A leader resumed after a SIGSTOP has its old informers and queues; before
//!   its renewal has even been answered, the fence already refuses what they would write
//!   (pods a ReplicaSet already has from the new leader), since its clock says the lease may
//!   be another's. Writes that carry a resourceVersion would fail their precondition anyway;
//!   creations carry none, hence the fence.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
// tower's Service trait: what kube's `Client::new` takes.
use tower::Service;

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

    /// How long after the start of its last successful renewal a leader's work may still
    /// write: the renew deadline, plus a retry period for the next round to begin, but never
    /// more than halfway from the renew deadline to the lease duration (a standby takes the
    /// lease a whole lease duration after it saw that renewal, so the leader's writes stop
    /// well before). 12 s with the defaults (15 s / 10 s / 2 s).
    pub fn fence_window(&self) -> Duration {
        let slack = self.lease_duration.saturating_sub(self.renew_deadline) / 2;
        self.renew_deadline + self.retry_period.min(slack)
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

/// When a standby next tries for the lease. `last_attempt`: when its last attempt began;
/// `poll_at`: its next periodic poll; `observed_at`: when it saw `record` (None: not seen)
/// change. A free lease is due at once, a held one when it expires on the standby's clock;
/// but a state the last attempt already met (it began after the due time, and failed)
/// waits for the poll, so a failing API server is not asked in a loop.
fn standby_wake(
    last_attempt: Instant,
    poll_at: Instant,
    observed_at: Instant,
    record: Option<&Record>,
) -> Instant {
    let due = match record {
        None => return poll_at,
        Some(r) if r.holder.is_empty() => observed_at,
        Some(r) => observed_at + r.duration,
    };
    if due <= last_attempt {
        poll_at
    } else {
        due.min(poll_at)
    }
}

/// What one attempt on the lease found.
#[derive(Debug, PartialEq)]
enum Attempt {
    /// It is ours now.
    Held,
    /// Another holder's, and not expired.
    HeldBy(String),
    /// Reading or writing it failed (a conflict included): try again.
    Failed,
}

/// One candidate for a lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    metrics: Metrics,
    observed: Mutex<Observed>,
    /// The watch saw the record change.
    changed: Notify,
    /// When the last successful acquisition or renewal began (before its write).
    renewed: Arc<Mutex<Option<Instant>>>,
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
            changed: Notify::new(),
            renewed: Arc::new(Mutex::new(None)),
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
        let last = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        last.is_none_or(|t| t.elapsed() <= self.config.lease_duration + Duration::from_secs(20))
    }

    /// `client` for the work of one `term`: its writes (POST, PUT, PATCH, DELETE) fail at
    /// once, without reaching the server, when `term` has ended or the last renewal began
    /// more than [`LeaderElectionConfig::fence_window`] ago (the lease may soon be another's);
    /// reads and watches pass.
    pub fn fenced(&self, client: Client, term: &CancellationToken) -> Client {
        let namespace = client.default_namespace().to_string();
        Client::new(
            Fenced {
                client,
                term: term.clone(),
                renewed: self.renewed.clone(),
                deadline: self.config.fence_window(),
            },
            namespace,
        )
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
                let mut leading = pin!(lead(term.clone()));
                let mut renewing = pin!(self.renew_until_lost(&term));
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

    /// Retries until the lease is ours (true) or `token` is cancelled (false). Meanwhile the
    /// Lease is watched, so each renewal of the holder is seen when it happens.
    async fn acquire(&self, token: &CancellationToken) -> bool {
        let campaign = async {
            let mut logged = false;
            loop {
                if token.is_cancelled() {
                    return false;
                }
                let last_attempt = Instant::now();
                match self.try_acquire_or_renew().await {
                    Attempt::Held => return true,
                    Attempt::HeldBy(holder) if !logged => {
                        tracing::info!(lease = %self.config.name, %holder, "waiting to acquire the lease");
                        logged = true;
                    }
                    Attempt::HeldBy(_) | Attempt::Failed => {}
                }
                // client-go's JitterUntil(retryPeriod, 1.2): spread candidates apart.
                let jitter = self
                    .config
                    .retry_period
                    .mul_f64(rand::random::<f64>() * 1.2);
                let poll_at = Instant::now() + self.config.retry_period + jitter;
                loop {
                    let wake = {
                        let o = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                        standby_wake(last_attempt, poll_at, o.at, o.record.as_ref())
                    };
                    tokio::select! {
                        _ = token.cancelled() => return false,
                        _ = tokio::time::sleep_until(wake.into()) => break,
                        // A renewal or a release: when to wake is another time now.
                        _ = self.changed.notified() => {}
                    }
                }
            }
        };
        tokio::select! {
            won = campaign => won,
            _ = self.watch() => false,
        }
    }

    /// Watches the one Lease and records each change of its record when it arrives; never
    /// returns (kube-runtime's watcher lists again and watches again after errors, backing
    /// off).
    async fn watch(&self) {
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.config.name));
        let mut events = pin!(watcher(self.api.clone(), config).default_backoff());
        while let Some(event) = events.next().await {
            let record = match event {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => Some(Record::of(&l)),
                Ok(watcher::Event::Delete(_)) => None,
                Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                Err(e) => {
                    tracing::debug!(lease = %self.config.name, error = %e, "watching the lease");
                    continue;
                }
            };
            let changed = {
                let mut o = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                if o.record != record {
                    o.record = record;
                    o.at = Instant::now();
                    true
                } else {
                    false
                }
            };
            if changed {
                self.changed.notify_one();
            }
        }
        std::future::pending::<()>().await
    }

    /// Renews every retry period; returns when a round of attempts has not renewed within
    /// the renew deadline of its start (client-go's renewal), at once when a renewal finds
    /// another holder (we were deposed) or when a round begins after the fence window of the
    /// last renewal has passed (the process was stopped: the lease may be another's, so
    /// not even a request is sent), or when `term` is cancelled.
    async fn renew_until_lost(&self, term: &CancellationToken) {
        loop {
            tokio::select! {
                _ = term.cancelled() => return,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            // The fence's own rule: past its window the lease may be another's already.
            let last = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(why) = fence_closed(false, last, Instant::now(), self.config.fence_window())
            {
                tracing::error!(lease = %self.config.name, %why, "giving the term up");
                return;
            }
            let renewed = tokio::time::timeout(self.config.renew_deadline, async {
                loop {
                    let began = Instant::now();
                    let attempt = self.try_acquire_or_renew().await;
                    let took = began.elapsed();
                    if took > self.config.retry_period {
                        tracing::warn!(lease = %self.config.name, ?took, "a renewal attempt was slow");
                    }
                    match attempt {
                        Attempt::Held => return None,
                        Attempt::HeldBy(holder) => return Some(holder),
                        Attempt::Failed => tokio::time::sleep(self.config.retry_period).await,
                    }
                }
            });
            tokio::select! {
                _ = term.cancelled() => return,
                r = renewed => match r {
                    Ok(None) => {}
                    Ok(Some(holder)) => {
                        tracing::error!(lease = %self.config.name, %holder, "the lease has another holder: deposed");
                        return;
                    }
                    Err(_) => {
                        tracing::error!(lease = %self.config.name, deadline = ?self.config.renew_deadline, "failed to renew the lease within the deadline");
                        return;
                    }
                },
            }
        }
    }

    /// One attempt: take a free or expired lease, or renew ours.
    async fn try_acquire_or_renew(&self) -> Attempt {
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
                return Attempt::Failed;
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
            let began = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observe(Some(desired), Instant::now());
                    *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(began);
                    Attempt::Held
                }
                Err(e) => {
                    if api_code(&e) != Some(409) {
                        tracing::warn!(lease = %self.config.name, error = %e, "creating the lease failed");
                    }
                    Attempt::Failed
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
            return Attempt::HeldBy(old.holder);
        }
        if ours {
            desired.acquired = old.acquired;
            desired.transitions = old.transitions;
        } else {
            desired.transitions = old.transitions.saturating_add(1);
        }
        lease.spec = Some(desired.spec());
        // The write carries the resourceVersion read: if anyone wrote in between, 409.
        let began = Instant::now();
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observe(Some(desired), Instant::now());
                *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(began);
                Attempt::Held
            }
            Err(e) => {
                if api_code(&e) != Some(409) {
                    tracing::warn!(lease = %self.config.name, error = %e, "updating the lease failed");
                }
                Attempt::Failed
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

/// The service under a [`LeaderElector::fenced`] client.
#[derive(Clone)]
struct Fenced {
    client: Client,
    term: CancellationToken,
    renewed: Arc<Mutex<Option<Instant>>>,
    deadline: Duration,
}

impl Fenced {
    /// Why a write may not go out now, if it may not.
    fn closed(&self) -> Option<String> {
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        fence_closed(
            self.term.is_cancelled(),
            renewed,
            Instant::now(),
            self.deadline,
        )
    }
}

/// Why the work of a term may not write at `now`: the term has ended, or the last renewal
/// (which began at `renewed`) is more than the fence window (`deadline`) old, so the lease
/// may soon be another's (a standby takes it a whole lease duration after it saw that
/// renewal).
fn fence_closed(
    ended: bool,
    renewed: Option<Instant>,
    now: Instant,
    deadline: Duration,
) -> Option<String> {
    if ended {
        return Some("the leadership term has ended".into());
    }
    match renewed.map(|t| now.saturating_duration_since(t)) {
        Some(age) if age <= deadline => None,
        Some(age) => Some(format!(
            "the lease was last renewed {age:?} ago (fence window {deadline:?}): it may be another's"
        )),
        None => Some("the lease was never renewed".into()),
    }
}

impl Service<http::Request<kube::client::Body>> for Fenced {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let reads = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if !reads {
            if let Some(why) = self.closed() {
                tracing::warn!(method = %request.method(), uri = %request.uri(), %why, "write refused: not the leader");
                return Box::pin(std::future::ready(Err(kube::Error::Service(
                    format!("not the leader: {why}").into(),
                ))));
            }
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await })
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
        // Writes may go on a retry period past the renew deadline, never past halfway to the
        // lease duration: 12 s of 15 s by default, 2.5 s of the tests' 3 s (2 s, 500 ms).
        assert_eq!(c.fence_window(), Duration::from_secs(12));
        let quick = LeaderElectionConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
            ..c.clone()
        };
        assert_eq!(quick.fence_window(), Duration::from_millis(2500));
        let tight = LeaderElectionConfig {
            lease_duration: Duration::from_secs(11),
            ..c.clone()
        };
        assert_eq!(tight.fence_window(), Duration::from_millis(10_500));
        assert!(tight.fence_window() < tight.lease_duration);
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

    fn held(holder: &str, seconds: u64) -> Record {
        Record {
            holder: holder.into(),
            duration: Duration::from_secs(seconds),
            acquired: None,
            renewed: None,
            transitions: 0,
        }
    }

    #[test]
    fn a_standby_wakes_when_the_observed_lease_expires_or_at_the_next_poll() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let lease = held("a", 15);
        // A renewal seen at t0: it expires at t0+15, the poll at t0+3 comes first.
        assert_eq!(standby_wake(t0, t0 + s(3), t0, Some(&lease)), t0 + s(3));
        // Seen at t0-13: it expires at t0+2, before the poll: wake right at the expiry.
        assert_eq!(
            standby_wake(t0, t0 + s(3), t0 - s(13), Some(&lease)),
            t0 + s(2)
        );
        // Already expired when the last attempt began (which then failed, a conflict or an
        // error): not again at once, at the poll.
        assert_eq!(
            standby_wake(t0, t0 + s(3), t0 - s(16), Some(&lease)),
            t0 + s(3)
        );
        // Expired after the attempt began (a slow attempt): at once.
        assert_eq!(
            standby_wake(t0 - s(1), t0 + s(3), t0 - s(15), Some(&lease)),
            t0
        );
        // Released (the watch saw it after the last attempt): at once.
        let free = held("", 1);
        assert_eq!(
            standby_wake(t0, t0 + s(3), t0 + s(1), Some(&free)),
            t0 + s(1)
        );
        // Free when the last attempt began, which failed: at the poll.
        assert_eq!(standby_wake(t0, t0 + s(3), t0, Some(&free)), t0 + s(3));
        // Nothing seen (the API server did not answer): at the poll.
        assert_eq!(standby_wake(t0, t0 + s(3), t0, None), t0 + s(3));
    }

    #[test]
    fn the_fence_closes_when_the_term_ends_or_the_renewal_is_older_than_the_deadline() {
        let t0 = Instant::now();
        let deadline = Duration::from_secs(10);
        let after = |s| t0 + Duration::from_secs(s);
        assert_eq!(fence_closed(false, Some(t0), after(2), deadline), None);
        assert_eq!(fence_closed(false, Some(t0), after(10), deadline), None);
        // Stopped (SIGSTOP) past the deadline: closed before any renewal is answered.
        let stale = fence_closed(false, Some(t0), after(11), deadline).unwrap();
        assert!(stale.contains("11s"), "{stale}");
        assert!(fence_closed(false, None, t0, deadline).is_some());
        assert!(fence_closed(true, Some(t0), t0, deadline).is_some());
    }
}
