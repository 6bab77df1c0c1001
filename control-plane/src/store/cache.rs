//! The watch cache: one watch on the store feeds an in-memory copy of every resource, each
//! with a ring of its recent changes. Lists and gets are served from it at a revision at least
//! as new as the client asks for; watches start from the ring (or from the current state) and
//! then follow a broadcast. Watchers of an indexed field value (a node agent watching
//! `spec.nodeName=<its node>`, a namespaced watch) subscribe to that value's own channel, so an
//! event reaches only the watchers it concerns: O(changed), not O(watchers).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use super::{Event, EventKind, KeyValue, Revision, Store, StoreError};

/// Computes a field-selector value (`spec.nodeName`, `metadata.name`, ...) of an object.
pub type FieldFn = Arc<dyn Fn(&Value, &str) -> Option<String> + Send + Sync>;

/// What the cache keeps for one resource (one key prefix).
#[derive(Clone)]
pub struct CacheSpec {
    /// `/<group>/<resource>/`
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
    /// Recent changes kept per resource; a watch from an older revision gets 410 Expired.
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

/// One object as the cache holds it: its JSON with `metadata.resourceVersion` filled in, and
/// what selectors need, extracted once.
#[derive(Debug)]
pub struct CachedObject {
    pub key: String,
    pub json: Bytes,
    pub revision: Revision,
    pub namespace: Option<String>,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Values of the spec's `fields`, in order (None: not set).
    pub fields: Vec<Option<String>>,
}

impl CachedObject {
    /// Parses the object (for outputs that need more than the JSON bytes).
    pub fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.json)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// A change to one object. For a delete, `object` is the last state with the delete's revision.
#[derive(Debug)]
pub struct Change {
    pub kind: ChangeKind,
    pub object: Arc<CachedObject>,
    pub prev: Option<Arc<CachedObject>>,
    pub revision: Revision,
}

/// Which objects a list or watch wants.
pub type Filter = Arc<dyn Fn(&CachedObject) -> bool + Send + Sync>;

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
    #[error("no cache for {0}")]
    UnknownResource(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// All resources' caches and the revision they have all applied.
pub struct Cache {
    resources: Vec<Arc<ResourceCache>>,
    applied: watch::Sender<Revision>,
    /// False once the cache can no longer follow the store (the server is then not ready).
    following: std::sync::atomic::AtomicBool,
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
        let resources: Vec<Arc<ResourceCache>> = specs
            .into_iter()
            .map(|spec| Arc::new(ResourceCache::new(spec, &options, window_start)))
            .collect();
        let (applied, _) = watch::channel(range.revision);
        let cache = Arc::new(Cache {
            resources,
            applied,
            following: std::sync::atomic::AtomicBool::new(true),
        });
        for kv in range.kvs {
            if let Some(r) = cache.resource_of_key(&kv.key) {
                match decode(&r.spec, &kv) {
                    Ok(o) => {
                        r.lock().objects.insert(kv.key.clone(), Arc::new(o));
                    }
                    Err(e) => tracing::error!(key = %kv.key, error = %e, "undecodable object"),
                }
            }
        }
        if replay_from <= range.revision {
            cache
                .replay(store.watch(replay_from)?, range.revision)
                .await?;
        }
        let events = store.watch(range.revision.next())?;
        tokio::spawn(cache.clone().follow(store, events));
        Ok(cache)
    }

    /// Whether the cache still follows the store (false: reads would be stale).
    pub fn is_following(&self) -> bool {
        self.following.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Puts the stored history up to `until` into the rings (not into the objects, which are
    /// at `until` already). The state before the window is unknown, so an object's first
    /// change in it counts as its own predecessor (a MODIFIED stays MODIFIED).
    async fn replay(
        &self,
        mut events: super::EventStream,
        until: Revision,
    ) -> Result<(), CacheError> {
        let mut last: HashMap<String, Arc<CachedObject>> = HashMap::new();
        while let Some(e) = events.next().await {
            let e = e?;
            let rev = e.revision();
            if let Some(r) = self.resource_of_key(&e.kv.key) {
                if let Ok(o) = decode(&r.spec, &e.kv) {
                    let o = Arc::new(o);
                    let prev = last.insert(o.key.clone(), o.clone());
                    let kind = match (e.kind, e.created) {
                        (EventKind::Delete, _) => ChangeKind::Deleted,
                        (EventKind::Put, true) => ChangeKind::Added,
                        (EventKind::Put, false) => ChangeKind::Modified,
                    };
                    let prev = match kind {
                        ChangeKind::Added => None,
                        _ => Some(prev.unwrap_or_else(|| o.clone())),
                    };
                    r.remember(Arc::new(Change {
                        kind,
                        object: o,
                        prev,
                        revision: rev,
                    }));
                }
            }
            if rev >= until {
                break;
            }
        }
        Ok(())
    }

    /// Applies the store's changes as they come; after a transient read error it watches
    /// again from the next revision. It stops (and the server reports not ready) when the
    /// store is closed or has compacted past the cache's position.
    async fn follow(self: Arc<Self>, store: Arc<dyn Store>, mut events: super::EventStream) {
        loop {
            match events.next().await {
                Some(Ok(e)) => self.apply(e),
                Some(Err(StoreError::Backend(e))) => {
                    tracing::warn!(error = %e, "store watch failed; watching again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    match store.watch(self.revision().next()) {
                        Ok(s) => events = s,
                        Err(e) => return self.stop(&e.to_string()),
                    }
                }
                Some(Err(e)) => return self.stop(&e.to_string()),
                None => return self.stop("the store closed"),
            }
        }
    }

    fn stop(&self, why: &str) {
        self.following
            .store(false, std::sync::atomic::Ordering::Release);
        tracing::error!(why, "the watch cache no longer follows the store");
    }

    fn apply(&self, e: Event) {
        let rev = e.revision();
        if let Some(r) = self.resource_of_key(&e.kv.key) {
            match decode(&r.spec, &e.kv) {
                Ok(o) => r.apply(e.kind, Arc::new(o), rev),
                Err(err) => tracing::error!(key = %e.kv.key, error = %err, "undecodable object"),
            }
        }
        self.applied.send_replace(rev);
    }

    fn resource_of_key(&self, key: &str) -> Option<&Arc<ResourceCache>> {
        self.resources
            .iter()
            .find(|r| key.starts_with(&r.spec.prefix))
    }

    /// The cache of the resource stored under `prefix`.
    pub fn resource(&self, prefix: &str) -> Result<&Arc<ResourceCache>, CacheError> {
        self.resources
            .iter()
            .find(|r| r.spec.prefix == prefix)
            .ok_or_else(|| CacheError::UnknownResource(prefix.to_string()))
    }

    /// The revision every resource's cache has applied.
    pub fn revision(&self) -> Revision {
        *self.applied.borrow()
    }

    /// Waits until the cache has applied `rev` (a write acknowledged by the store is visible
    /// to reads made after this returns).
    pub async fn wait_for(&self, rev: Revision, timeout: Duration) -> Result<(), CacheError> {
        let mut rx = self.applied.subscribe();
        let reached =
            tokio::time::timeout(timeout, async { rx.wait_for(|r| *r >= rev).await.is_ok() }).await;
        match reached {
            Ok(true) => Ok(()),
            _ => Err(CacheError::Timeout(rev)),
        }
    }
}

fn decode(spec: &CacheSpec, kv: &KeyValue) -> Result<CachedObject, serde_json::Error> {
    let mut v: Value = serde_json::from_slice(&kv.value)?;
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(
            "resourceVersion".into(),
            Value::String(kv.mod_revision.to_string()),
        );
    }
    let meta = v.get("metadata");
    let s = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    let labels = meta
        .and_then(|m| m.get("labels"))
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    Ok(CachedObject {
        key: kv.key.clone(),
        revision: kv.mod_revision,
        namespace: s("namespace").map(str::to_string),
        name: s("name").unwrap_or_default().to_string(),
        labels,
        fields: spec.fields.iter().map(|f| (spec.field_fn)(&v, f)).collect(),
        json: Bytes::from(serde_json::to_vec(&v)?),
    })
}

/// One page of a list.
pub struct Page {
    pub items: Vec<Arc<CachedObject>>,
    pub revision: Revision,
    /// Key of the last item when more matching items follow.
    pub continue_after: Option<String>,
}

/// One resource's objects, recent changes and watchers.
pub struct ResourceCache {
    pub spec: CacheSpec,
    state: Mutex<State>,
    watcher_buffer: usize,
}

struct State {
    objects: BTreeMap<String, Arc<CachedObject>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Every change of this resource after `oldest` is in `history`.
    oldest: Revision,
    all: broadcast::Sender<Arc<Change>>,
    by_value: HashMap<(usize, String), broadcast::Sender<Arc<Change>>>,
}

impl State {
    fn push_history(&mut self, change: Arc<Change>) {
        if self.history.len() >= self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.oldest = old.revision;
            }
        }
        self.history.push_back(change);
    }
}

impl ResourceCache {
    fn new(spec: CacheSpec, options: &CacheOptions, start: Revision) -> ResourceCache {
        ResourceCache {
            state: Mutex::new(State {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: options.history_per_resource.max(1),
                oldest: start,
                all: broadcast::channel(options.watcher_buffer).0,
                by_value: HashMap::new(),
            }),
            watcher_buffer: options.watcher_buffer,
            spec,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than stopping the server would, so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn index_of(&self, field: &str) -> Option<usize> {
        self.spec.fields.iter().position(|f| *f == field)
    }

    fn apply(&self, kind: EventKind, object: Arc<CachedObject>, revision: Revision) {
        let mut st = self.lock();
        let (kind, prev) = match kind {
            EventKind::Put => match st.objects.insert(object.key.clone(), object.clone()) {
                Some(p) => (ChangeKind::Modified, Some(p)),
                None => (ChangeKind::Added, None),
            },
            EventKind::Delete => (ChangeKind::Deleted, st.objects.remove(&object.key)),
        };
        let change = Arc::new(Change {
            kind,
            object,
            prev,
            revision,
        });
        st.push_history(change.clone());
        // Errors only mean "no receivers".
        let _ = st.all.send(change.clone());
        for name in &self.spec.indexed {
            let Some(i) = self.index_of(name) else {
                continue;
            };
            let new = change.object.fields[i].clone();
            let old = change.prev.as_ref().and_then(|p| p.fields[i].clone());
            for v in [new.clone(), old.filter(|o| Some(o) != new.as_ref())]
                .into_iter()
                .flatten()
            {
                let k = (i, v);
                if let Some(tx) = st.by_value.get(&k) {
                    if tx.send(change.clone()).is_err() {
                        st.by_value.remove(&k);
                    }
                }
            }
        }
    }

    /// Adds a past change to the ring only (replay at start).
    fn remember(&self, change: Arc<Change>) {
        self.lock().push_history(change);
    }

    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.lock().objects.get(key).cloned()
    }

    /// Matching objects whose key starts with `prefix`, after the key `after`, at most `limit`.
    pub fn list(
        &self,
        prefix: &str,
        filter: &Filter,
        after: Option<&str>,
        limit: Option<usize>,
        revision: Revision,
    ) -> Page {
        let st = self.lock();
        let lower = match after {
            Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let mut items = Vec::new();
        let mut continue_after = None;
        for (k, o) in st.objects.range((lower, Bound::Unbounded)) {
            if !k.starts_with(prefix) {
                break;
            }
            if !filter(o) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                continue_after = items.last().map(|o: &Arc<CachedObject>| o.key.clone());
                break;
            }
            items.push(o.clone());
        }
        Page {
            items,
            revision,
            continue_after,
        }
    }

    /// Starts a watch of the objects under `prefix` that pass `filter`. `index` names an
    /// indexed field and the one value the filter requires of it, if any.
    pub fn watch(
        &self,
        prefix: &str,
        start: WatchStart,
        filter: Filter,
        index: Option<(&str, &str)>,
    ) -> Result<CacheWatch, CacheError> {
        let mut st = self.lock();
        let live = match index.and_then(|(f, v)| Some((self.index_of(f)?, v))) {
            Some((i, v)) if self.spec.indexed.contains(&self.spec.fields[i]) => {
                let buffer = self.watcher_buffer;
                st.by_value
                    .entry((i, v.to_string()))
                    .or_insert_with(|| broadcast::channel(buffer).0)
                    .subscribe()
            }
            _ => st.all.subscribe(),
        };
        let mut pending = VecDeque::new();
        match start {
            WatchStart::Current => {
                for (_, o) in st.objects.range(prefix.to_string()..) {
                    if !o.key.starts_with(prefix) {
                        break;
                    }
                    if filter(o) {
                        pending.push_back(WatchEvent::Added(o.clone()));
                    }
                }
            }
            WatchStart::After(rev) => {
                if rev < st.oldest {
                    return Err(CacheError::Expired {
                        requested: rev,
                        oldest: st.oldest,
                    });
                }
                for c in st.history.iter().filter(|c| c.revision > rev) {
                    if let Some(e) = transition(c, prefix, &filter) {
                        pending.push_back(e);
                    }
                }
            }
        }
        Ok(CacheWatch {
            pending,
            live,
            filter,
            prefix: prefix.to_string(),
        })
    }
}

/// A change as one watcher sees it, after its filter.
#[derive(Clone, Debug)]
pub enum WatchEvent {
    Added(Arc<CachedObject>),
    Modified(Arc<CachedObject>),
    Deleted(Arc<CachedObject>),
}

impl WatchEvent {
    pub fn object(&self) -> &Arc<CachedObject> {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        }
    }
}

/// What a change means to a watcher with `filter`: an object entering the filter's set is
/// ADDED, one leaving it DELETED (as Kubernetes' watch cache does).
fn transition(c: &Change, prefix: &str, filter: &Filter) -> Option<WatchEvent> {
    if !c.object.key.starts_with(prefix) {
        return None;
    }
    let now = filter(&c.object);
    let before = c.prev.as_ref().is_some_and(|p| filter(p));
    match c.kind {
        ChangeKind::Added if now => Some(WatchEvent::Added(c.object.clone())),
        ChangeKind::Deleted if before || now => Some(WatchEvent::Deleted(c.object.clone())),
        ChangeKind::Modified => match (before, now) {
            (true, true) => Some(WatchEvent::Modified(c.object.clone())),
            (false, true) => Some(WatchEvent::Added(c.object.clone())),
            // Leaving the set: the last state, at this change's revision.
            (true, false) => Some(WatchEvent::Deleted(c.object.clone())),
            (false, false) => None,
        },
        _ => None,
    }
}

/// One watcher's stream of events.
pub struct CacheWatch {
    pending: VecDeque<WatchEvent>,
    live: broadcast::Receiver<Arc<Change>>,
    filter: Filter,
    prefix: String,
}

/// Why a watch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The watcher fell too far behind; it must relist.
    TooSlow,
    /// The server is shutting down.
    Closed,
}

impl CacheWatch {
    /// The next event if one is already queued (never waits).
    pub fn try_next(&mut self) -> Option<Result<WatchEvent, WatchEnd>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(Ok(e));
            }
            match self.live.try_recv() {
                Ok(c) => {
                    if let Some(e) = transition(&c, &self.prefix, &self.filter) {
                        return Some(Ok(e));
                    }
                }
                Err(broadcast::error::TryRecvError::Empty) => return None,
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    return Some(Err(WatchEnd::TooSlow))
                }
                Err(broadcast::error::TryRecvError::Closed) => return Some(Err(WatchEnd::Closed)),
            }
        }
    }

    pub async fn next(&mut self) -> Result<WatchEvent, WatchEnd> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            match self.live.recv().await {
                Ok(c) => {
                    if let Some(e) = transition(&c, &self.prefix, &self.filter) {
                        return Ok(e);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => return Err(WatchEnd::TooSlow),
                Err(broadcast::error::RecvError::Closed) => return Err(WatchEnd::Closed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redb::{RedbOptions, RedbStore};
    use crate::store::{Precondition, WriteOp};

    fn label_of(v: &Value, f: &str) -> Option<String> {
        match f {
            "spec.nodeName" => v.pointer("/spec/nodeName")?.as_str().map(str::to_string),
            _ => None,
        }
    }

    async fn put(s: &RedbStore, key: &str, v: Value) -> Revision {
        s.write(WriteOp::Put {
            key: key.into(),
            value: serde_json::to_vec(&v).unwrap().into(),
            precondition: Precondition::Any,
        })
        .await
        .unwrap()
        .revision
    }

    fn pod(name: &str, node: &str) -> Value {
        serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node}})
    }

    #[tokio::test]
    async fn indexed_watch_sees_objects_enter_and_leave_and_the_cache_stops_with_the_store() {
        let d = tempfile::tempdir().unwrap();
        let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let spec = CacheSpec {
            prefix: "/core/pods/".into(),
            fields: vec!["spec.nodeName"],
            indexed: vec!["spec.nodeName"],
            field_fn: Arc::new(label_of),
        };
        let cache = Cache::start(shared.clone(), vec![spec], CacheOptions::default())
            .await
            .unwrap();
        let pods = cache.resource("/core/pods/").unwrap();
        let on_n1: Filter = Arc::new(|o: &CachedObject| o.fields[0].as_deref() == Some("n1"));
        let mut w = pods
            .watch(
                "/core/pods/",
                WatchStart::Current,
                on_n1.clone(),
                Some(("spec.nodeName", "n1")),
            )
            .unwrap();
        put(&store, "/core/pods/ns/a", pod("a", "")).await;
        let r = put(&store, "/core/pods/ns/a", pod("a", "n1")).await;
        put(&store, "/core/pods/ns/b", pod("b", "n2")).await;
        let r2 = put(&store, "/core/pods/ns/a", pod("a", "n2")).await;
        match w.next().await.unwrap() {
            WatchEvent::Added(o) => assert_eq!((o.name.as_str(), o.revision), ("a", r)),
            other => panic!("{other:?}"),
        }
        match w.next().await.unwrap() {
            WatchEvent::Deleted(o) => assert_eq!((o.name.as_str(), o.revision), ("a", r2)),
            other => panic!("{other:?}"),
        }
        cache.wait_for(r2, Duration::from_secs(5)).await.unwrap();
        let page = pods.list("/core/pods/ns/", &on_n1, None, None, cache.revision());
        assert!(page.items.is_empty());
        let all: Filter = Arc::new(|_| true);
        let page = pods.list("/core/pods/", &all, None, Some(1), cache.revision());
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.continue_after.as_deref(), Some("/core/pods/ns/a"));
        assert!(cache.is_following());
        store.close();
        skiff_tests::wait_until_async(
            "the cache notices the store closed",
            Duration::from_secs(5),
            || async {
                if cache.is_following() {
                    Err("still following")
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }
}
