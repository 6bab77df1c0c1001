//! The watch cache: one watch on the store feeds an in-memory copy of every resource, each
//! with a ring of its recent changes. Lists and gets are served from it at a revision at least
//! as new as the client asks for; watches start from the ring (or from the current state) and
//! then follow a broadcast. Watchers of an indexed field value (a node agent watching
//! `spec.nodeName=<its node>`, a namespaced watch) subscribe to that value's own channel, so an
//! event reaches only the watchers it concerns: O(changed), not O(watchers).
//!
//! The cache never drifts from the store silently. When its watch fails it watches again
//! from the next revision; when that is no longer possible (the store compacted past it) or
//! keeps failing, it reads everything again and resumes from there, ending every watcher
//! (they get 410 and relist, as from Kubernetes' cacher). While it cannot follow, [`Cache::health`]
//! says why and since when (the API server's /readyz, and /livez after a grace period). A
//! value it cannot decode takes its key out of the cache (watchers see it deleted) and is
//! reported on reads of that key rather than served stale.

mod resource;
mod watch;

pub use resource::{CachedObject, Change, ChangeKind, Page, Prev, ResourceCache, Undecodable};
pub use watch::{CacheWatch, WatchEnd, WatchEvent};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::watch as latest;

use super::{Event, EventKind, EventStream, Revision, Store, StoreError, WatchItem};

/// Computes a field-selector value (`spec.nodeName`, `metadata.name`, ...) of an object.
pub type FieldFn = Arc<dyn Fn(&Value, &str) -> Option<String> + Send + Sync>;

/// Which objects a list or watch wants.
pub type Filter = Arc<dyn Fn(&CachedObject) -> bool + Send + Sync>;

/// The prefix of the one cache that holds every custom resource's objects (keys
/// `/registry/<group>/<plural>/[<namespace>/]<name>` whose group has a dot, as every
/// CustomResourceDefinition's group must). Lists and watches of one custom resource name its
/// own prefix within it.
pub const CUSTOM_PREFIX: &str = "/registry/";

/// Whether a key belongs to the cache of `prefix`.
fn holds(prefix: &str, key: &str) -> bool {
    if prefix != CUSTOM_PREFIX {
        return key.starts_with(prefix);
    }
    let Some(rest) = key.strip_prefix(CUSTOM_PREFIX) else {
        return false;
    };
    let mut parts = rest.splitn(3, '/');
    let (group, plural, name) = (parts.next(), parts.next(), parts.next());
    group.is_some_and(|g| g.contains('.') && !g.starts_with('.'))
        && plural.is_some_and(|p| !p.is_empty())
        && name.is_some_and(|n| !n.is_empty())
}

/// What the cache keeps for one resource (one key prefix).
#[derive(Clone)]
pub struct CacheSpec {
    /// `/registry/<resource>/`
    pub prefix: String,
    /// Fields whose values are computed once per change, for selectors and indexes.
    pub fields: Vec<&'static str>,
    /// Fields (among `fields`) with a channel per value, for O(changed) fan-out.
    pub indexed: Vec<&'static str>,
    pub field_fn: FieldFn,
}

/// Sizes of the cache.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// Recent changes kept per resource; a watch from an older revision gets 410 Expired, and
    /// so does a list continued from an older revision.
    pub history_per_resource: usize,
    /// Events a watcher may fall behind before it is closed (and relists).
    pub watcher_buffer: usize,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            history_per_resource: 10_000,
            watcher_buffer: 4096,
        }
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current state, then changes.
    Current,
    /// Changes after this revision.
    After(Revision),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("too old resource version: {requested} ({oldest})")]
    Expired {
        requested: Revision,
        oldest: Revision,
    },
    #[error("timed out waiting for the cache to reach revision {0}")]
    Timeout(Revision),
    #[error("the watch cache is not following the store: {0}")]
    Unavailable(String),
    #[error("no cache for {0}")]
    UnknownResource(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why the cache is not serving, and since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub reason: String,
    pub since: Instant,
}

/// How long a read waits for the store's events before it asks for a barrier.
const BARRIER_AFTER: Duration = Duration::from_millis(50);
/// How long the store's watch may keep failing, with no event in between, before the cache
/// reads everything again instead of resuming (which ends every watcher with 410). Long
/// enough for an etcd leader election and the client's failover to another member (a few
/// seconds on a loaded machine), which a resume from the next revision rides out.
const RELIST_AFTER: Duration = Duration::from_secs(10);
/// Back-off between attempts to resume or reload.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// All resources' caches and the revision they have all applied.
pub struct Cache {
    store: Arc<dyn Store>,
    resources: Vec<Arc<ResourceCache>>,
    /// The applied revision, readable under a resource's lock.
    applied_now: Arc<AtomicU64>,
    /// The applied revision, for waiting on.
    applied: latest::Sender<Revision>,
    health: Mutex<Option<Unhealthy>>,
    /// The newest barrier taken and when (see [`Cache::wait_for`]).
    last_barrier: tokio::sync::Mutex<Option<(Revision, Instant)>>,
}

impl Cache {
    /// Loads every resource from the store and follows the store's watch from there.
    pub async fn start(
        store: Arc<dyn Store>,
        specs: Vec<CacheSpec>,
        options: CacheOptions,
    ) -> Result<Arc<Cache>, CacheError> {
        let range = store.range("/").await?;
        // Recent history goes into the rings too, so a watch resumes across a restart.
        let replay_from = Revision(
            range
                .revision
                .0
                .saturating_sub(options.history_per_resource as u64)
                + 1,
        )
        .max(store.oldest_revision());
        let window_start = Revision(replay_from.0.saturating_sub(1)).min(range.revision);
        let applied_now = Arc::new(AtomicU64::new(range.revision.0));
        let resources: Vec<Arc<ResourceCache>> = specs
            .into_iter()
            .map(|spec| {
                Arc::new(ResourceCache::new(
                    spec,
                    &options,
                    window_start,
                    applied_now.clone(),
                ))
            })
            .collect();
        let (applied, _) = latest::channel(range.revision);
        let cache = Arc::new(Cache {
            store: store.clone(),
            resources,
            applied_now,
            applied,
            health: Mutex::new(None),
            last_barrier: tokio::sync::Mutex::new(None),
        });
        cache.load(range.kvs, range.revision);
        if replay_from <= range.revision {
            let replayed = match store.watch(replay_from) {
                Ok(events) => cache.replay(events, range.revision).await,
                Err(e) => Err(e),
            };
            if let Err(e) = replayed {
                // Not fatal: watches resume only from the loaded revision on.
                tracing::warn!(error = %e, "the store's recent history could not be replayed");
                for r in &cache.resources {
                    r.forget_history(range.revision);
                }
            }
        }
        let events = store.watch(range.revision.next())?;
        tokio::spawn(cache.clone().follow(events));
        Ok(cache)
    }

    /// Replaces every resource's objects with `kvs`, read at `revision`.
    fn load(&self, kvs: Vec<super::KeyValue>, revision: Revision) {
        let mut per_resource: HashMap<usize, Vec<_>> = HashMap::new();
        for kv in kvs {
            if let Some(i) = self.index_of_key(&kv.key) {
                let decoded = resource::decode(&self.resources[i].spec, &kv);
                per_resource.entry(i).or_default().push((kv, decoded));
            }
        }
        for (i, r) in self.resources.iter().enumerate() {
            let loaded = r.reload(per_resource.remove(&i).unwrap_or_default(), revision);
            tracing::debug!(prefix = %r.spec.prefix, objects = loaded.objects, %revision, "loaded");
            if loaded.undecodable > 0 {
                tracing::error!(
                    prefix = %r.spec.prefix,
                    undecodable = loaded.undecodable,
                    "objects in the store cannot be decoded; reads of them fail until they are rewritten or deleted"
                );
            }
        }
        self.publish(revision);
    }

    /// Publishes that every change up to `revision` has been applied.
    fn publish(&self, revision: Revision) {
        self.applied_now.fetch_max(revision.0, Ordering::AcqRel);
        self.applied.send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
    }

    /// `None` while the cache follows the store; otherwise why not and since when.
    pub fn health(&self) -> Option<Unhealthy> {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_unhealthy(&self, reason: String) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match h.as_mut() {
            Some(u) => u.reason = reason,
            None => {
                tracing::error!(%reason, "the watch cache stopped following the store");
                *h = Some(Unhealthy {
                    reason,
                    since: Instant::now(),
                });
            }
        }
    }

    fn set_healthy(&self) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = h.take() {
            tracing::info!(
                after_s = u.since.elapsed().as_secs_f64(),
                "the watch cache follows the store again"
            );
        }
    }

    /// Puts the stored history up to `until` into the rings (not into the objects, which are
    /// at `until` already). The state before the window is unknown, so an object's first
    /// change in it has an unknown predecessor.
    async fn replay(&self, mut events: EventStream, until: Revision) -> Result<(), StoreError> {
        let mut last: HashMap<String, Arc<CachedObject>> = HashMap::new();
        // The watch delivers only its keys' events: it is complete up to `until` once it has
        // passed a barrier taken now.
        let end = self.store.barrier().await?.max(until);
        let mut wait = BARRIER_AFTER;
        loop {
            let item = match tokio::time::timeout(wait, events.next()).await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(_) => {
                    // A progress request may have gone out before the watch was open.
                    self.store.barrier().await?;
                    wait = (wait * 2).min(RETRY_MAX);
                    continue;
                }
            };
            let e = match item? {
                WatchItem::Event(e) if e.revision() >= end && e.revision() > until => break,
                WatchItem::Event(e) => e,
                WatchItem::Progress(r) if r >= end => break,
                WatchItem::Progress(_) => continue,
            };
            let rev = e.revision();
            if let Some(i) = self.index_of_key(&e.kv.key) {
                let r = &self.resources[i];
                if let Ok(o) = resource::decode(&r.spec, &e.kv) {
                    let o = Arc::new(o);
                    let prev = last.insert(o.key.clone(), o.clone());
                    let kind = match (e.kind, e.created) {
                        (EventKind::Delete, _) => ChangeKind::Deleted,
                        (EventKind::Put, true) => ChangeKind::Added,
                        (EventKind::Put, false) => ChangeKind::Modified,
                    };
                    let prev = match (kind, prev) {
                        (ChangeKind::Added, _) => Prev::Absent,
                        (_, Some(p)) => Prev::Known(p),
                        (_, None) => Prev::Unknown,
                    };
                    if kind == ChangeKind::Deleted {
                        last.remove(&o.key);
                    }
                    r.remember(Arc::new(Change {
                        kind,
                        object: o,
                        prev,
                        revision: rev,
                    }));
                }
            }
            if rev >= end {
                break;
            }
        }
        Ok(())
    }

    /// Applies the store's changes as they come. A failed watch is resumed from the next
    /// revision; when that is impossible (compacted) or keeps failing, everything is read
    /// again. It returns only when the store is closed.
    async fn follow(self: Arc<Self>, mut events: EventStream) {
        let mut failures = 0u32;
        let mut failing_since: Option<Instant> = None;
        loop {
            let failure = match events.next().await {
                Some(Ok(WatchItem::Event(e))) => {
                    self.apply(e);
                    failures = 0;
                    failing_since = None;
                    continue;
                }
                Some(Ok(WatchItem::Progress(r))) => {
                    self.publish(r);
                    continue;
                }
                Some(Err(e)) => e,
                None => StoreError::Backend("the store's watch ended".into()),
            };
            if failure == StoreError::Closed {
                return self.set_unhealthy("the store is closed".into());
            }
            failures += 1;
            let since = *failing_since.get_or_insert_with(Instant::now);
            let relist =
                matches!(failure, StoreError::Compacted { .. }) || since.elapsed() >= RELIST_AFTER;
            tracing::warn!(error = %failure, failures, relist, "the store's watch failed");
            match self.recover(relist, failures, &failure).await {
                Some(s) => events = s,
                None => return,
            }
            if relist {
                failures = 0;
                failing_since = None;
            }
        }
    }

    /// Watches again from the next revision, or reloads everything, until it works (backing
    /// off between attempts); None once the store is closed.
    async fn recover(
        &self,
        mut relist: bool,
        failures: u32,
        failure: &StoreError,
    ) -> Option<EventStream> {
        let mut backoff = RETRY_FIRST;
        // Resume at once the first time (a dropped connection); then back off, longer with
        // each failure in a row.
        if failures > 1 {
            let doublings = (failures - 2).min(6);
            backoff = (RETRY_FIRST * 2u32.pow(doublings)).min(RETRY_MAX);
            tokio::time::sleep(backoff).await;
        }
        loop {
            let attempt = if relist {
                self.set_unhealthy(format!(
                    "reloading from the store after its watch failed: {failure}"
                ));
                self.relist().await
            } else {
                self.store.watch(self.revision().next())
            };
            match attempt {
                Ok(s) => {
                    self.set_healthy();
                    return Some(s);
                }
                Err(StoreError::Closed) => {
                    self.set_unhealthy("the store is closed".into());
                    return None;
                }
                Err(e) => {
                    relist |= matches!(e, StoreError::Compacted { .. });
                    self.set_unhealthy(format!(
                        "following the store after its watch failed ({failure}): {e}"
                    ));
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Reads everything again, replaces the objects, ends every watcher and returns a watch
    /// from the revision read.
    async fn relist(&self) -> Result<EventStream, StoreError> {
        let range = self.store.range("/").await?;
        let events = self.store.watch(range.revision.next())?;
        let revision = range.revision;
        self.load(range.kvs, revision);
        tracing::info!(%revision, "the watch cache reloaded everything from the store");
        Ok(events)
    }

    fn apply(&self, e: Event) {
        let rev = e.revision();
        if let Some(i) = self.index_of_key(&e.kv.key) {
            let r = &self.resources[i];
            match resource::decode(&r.spec, &e.kv) {
                Ok(o) => r.apply(e.kind, Arc::new(o), rev),
                Err(err) => {
                    tracing::error!(key = %e.kv.key, revision = %rev, error = %err, "undecodable object in the store");
                    r.apply_undecodable(&e.kv.key, e.kind, err.to_string(), rev);
                }
            }
        }
        self.publish(rev);
    }

    /// The resource a key belongs to: a built-in resource's own prefix first, then the cache
    /// of custom resources.
    fn index_of_key(&self, key: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.spec.prefix != CUSTOM_PREFIX && holds(&r.spec.prefix, key))
            .or_else(|| {
                self.resources
                    .iter()
                    .position(|r| holds(&r.spec.prefix, key))
            })
    }

    /// The cache of the resource stored under `prefix`.
    pub fn resource(&self, prefix: &str) -> Result<&Arc<ResourceCache>, CacheError> {
        self.resources
            .iter()
            .find(|r| r.spec.prefix == prefix)
            .ok_or_else(|| CacheError::UnknownResource(prefix.to_string()))
    }

    /// Every resource's cache.
    pub fn resources(&self) -> &[Arc<ResourceCache>] {
        &self.resources
    }

    /// The revision every resource's cache has applied.
    pub fn revision(&self) -> Revision {
        *self.applied.borrow()
    }

    /// Waits until the cache has applied `rev` (a write acknowledged by the store is visible
    /// to reads made after this returns). Fails at once while the cache does not follow the
    /// store. When the events do not bring the cache there soon (the newest revisions may be
    /// other keys', which the watch does not deliver), a store barrier does.
    pub async fn wait_for(&self, rev: Revision, timeout: Duration) -> Result<(), CacheError> {
        if self.revision() >= rev {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.applied.subscribe();
        let mut target = rev;
        let mut wait = BARRIER_AFTER;
        loop {
            if let Some(h) = self.health() {
                return Err(CacheError::Unavailable(h.reason));
            }
            let step = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(wait);
            // (The borrow wait_for returns is not Send: drop it before any await.)
            let reached = tokio::time::timeout(step, rx.wait_for(|r| *r >= target))
                .await
                .map(|r| r.is_ok());
            match reached {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(CacheError::Timeout(rev)),
                Err(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(CacheError::Timeout(rev))
                }
                Err(_) => {
                    target = target.max(self.barrier(rev, wait).await?);
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// A store barrier at or after `rev`, shared by every reader waiting meanwhile (one
    /// barrier may cost a write); a new one if the last is older than `stale` and still not
    /// reached (a progress request can get lost while a watch reconnects).
    async fn barrier(&self, rev: Revision, stale: Duration) -> Result<Revision, CacheError> {
        let mut last = self.last_barrier.lock().await;
        let renew = match *last {
            Some((r, at)) => r < rev || at.elapsed() >= stale,
            None => true,
        };
        if renew {
            *last = Some((self.store.barrier().await?, Instant::now()));
        }
        Ok(last.map_or(rev, |(r, _)| r))
    }
}

#[cfg(test)]
mod tests;
