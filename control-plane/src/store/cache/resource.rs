//! One resource's part of the watch cache: its objects, a ring of its recent changes, the
//! keys whose stored value could not be decoded, and the broadcast channels its watchers
//! follow (one for everything, one per value of each indexed field). Lists are served from
//! the objects at the revision they are at, or at an older revision still covered by the
//! ring (a continue token's): the objects with the changes since then undone.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::watch::{transition, CacheWatch, WatchEvent};
use super::{CacheError, CacheOptions, CacheSpec, Filter, WatchStart};
use crate::store::{EventKind, KeyValue, Revision};

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

    /// The same object at another revision (its resourceVersion rewritten).
    fn at(&self, revision: Revision) -> Result<CachedObject, serde_json::Error> {
        let mut v = self.value()?;
        set_resource_version(&mut v, revision);
        Ok(CachedObject {
            key: self.key.clone(),
            json: Bytes::from(serde_json::to_vec(&v)?),
            revision,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            labels: self.labels.clone(),
            fields: self.fields.clone(),
        })
    }
}

fn set_resource_version(v: &mut Value, revision: Revision) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
    }
}

/// Decodes a stored value into what the cache keeps of it.
pub(super) fn decode(spec: &CacheSpec, kv: &KeyValue) -> Result<CachedObject, serde_json::Error> {
    let mut v: Value = serde_json::from_slice(&kv.value)?;
    if !v.is_object() {
        return Err(serde::de::Error::custom(
            "the stored value is not an object",
        ));
    }
    set_resource_version(&mut v, kv.mod_revision);
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// What was there before a change.
#[derive(Clone, Debug)]
pub enum Prev {
    /// The key did not exist (an ADDED change).
    Absent,
    /// The object as it was.
    Known(Arc<CachedObject>),
    /// Not known: a change replayed from the store's history at start whose predecessor is
    /// older than the replayed window. Watch filters treat the object as its own
    /// predecessor; a list at an earlier revision cannot be served through it.
    Unknown,
}

/// A change to one object. For a delete, `object` is the last state with the delete's revision.
#[derive(Debug)]
pub struct Change {
    pub kind: ChangeKind,
    pub object: Arc<CachedObject>,
    pub prev: Prev,
    pub revision: Revision,
}

impl Change {
    /// The object before the change, as a watch filter should see it.
    pub fn prev_for_filter(&self) -> Option<&Arc<CachedObject>> {
        match &self.prev {
            Prev::Absent => None,
            Prev::Known(p) => Some(p),
            Prev::Unknown => Some(&self.object),
        }
    }
}

/// One page of a list.
pub struct Page {
    pub items: Vec<Arc<CachedObject>>,
    /// The revision the page shows the objects at.
    pub revision: Revision,
    /// Key of the last item when more matching items follow.
    pub continue_after: Option<String>,
}

/// Why a key has no object in the cache although the store holds one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecodable {
    pub revision: Revision,
    pub error: String,
}

/// One resource's objects, recent changes and watchers.
pub struct ResourceCache {
    pub spec: CacheSpec,
    state: Mutex<State>,
    watcher_buffer: usize,
    /// The revision every resource's cache has applied (shared with the whole cache).
    applied: Arc<AtomicU64>,
}

pub(super) struct State {
    objects: BTreeMap<String, Arc<CachedObject>>,
    undecodable: BTreeMap<String, Undecodable>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Every change of this resource after `oldest` is in `history`.
    oldest: Revision,
    /// The revision of the last change applied to this resource.
    last: Revision,
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
        self.last = self.last.max(change.revision);
        self.history.push_back(change);
    }
}

/// What a reload from the store changed (for logs).
#[derive(Debug, Default)]
pub struct Reload {
    pub objects: usize,
    pub undecodable: usize,
}

impl ResourceCache {
    pub(super) fn new(
        spec: CacheSpec,
        options: &CacheOptions,
        start: Revision,
        applied: Arc<AtomicU64>,
    ) -> ResourceCache {
        ResourceCache {
            state: Mutex::new(State {
                objects: BTreeMap::new(),
                undecodable: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: options.history_per_resource.max(1),
                oldest: start,
                last: Revision(0),
                all: broadcast::channel(options.watcher_buffer).0,
                by_value: HashMap::new(),
            }),
            watcher_buffer: options.watcher_buffer,
            applied,
            spec,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than stopping the server would, so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The revision the objects are at, read under their lock: the cache applies one change
    /// at a time and publishes its revision after applying it, so the objects are at the
    /// published revision or at this resource's own newer change.
    fn revision_of(&self, st: &State) -> Revision {
        Revision(self.applied.load(Ordering::Acquire)).max(st.last)
    }

    fn index_of(&self, field: &str) -> Option<usize> {
        self.spec.fields.iter().position(|f| *f == field)
    }

    /// Replaces every object with a fresh read of the store at `revision`: the ring starts
    /// over there and every watcher is ended (its channel closes), since the changes between
    /// what it saw and the new state are not known one by one.
    pub(super) fn reload(
        &self,
        kvs: Vec<(KeyValue, Result<CachedObject, serde_json::Error>)>,
        revision: Revision,
    ) -> Reload {
        let mut st = self.lock();
        st.objects.clear();
        st.undecodable.clear();
        for (kv, decoded) in kvs {
            match decoded {
                Ok(o) => {
                    st.objects.insert(kv.key, Arc::new(o));
                }
                Err(e) => {
                    tracing::error!(key = %kv.key, error = %e, "undecodable object in the store");
                    st.undecodable.insert(
                        kv.key,
                        Undecodable {
                            revision: kv.mod_revision,
                            error: e.to_string(),
                        },
                    );
                }
            }
        }
        st.history.clear();
        st.oldest = revision;
        st.last = revision;
        st.all = broadcast::channel(self.watcher_buffer).0;
        st.by_value.clear();
        Reload {
            objects: st.objects.len(),
            undecodable: st.undecodable.len(),
        }
    }

    /// Applies one change from the store's watch.
    pub(super) fn apply(&self, kind: EventKind, object: Arc<CachedObject>, revision: Revision) {
        let mut st = self.lock();
        st.undecodable.remove(&object.key);
        let (kind, prev) = match kind {
            EventKind::Put => match st.objects.insert(object.key.clone(), object.clone()) {
                Some(p) => (ChangeKind::Modified, Prev::Known(p)),
                None => (ChangeKind::Added, Prev::Absent),
            },
            EventKind::Delete => match st.objects.remove(&object.key) {
                Some(p) => (ChangeKind::Deleted, Prev::Known(p)),
                // Nothing any watcher could have seen (an undecodable value, now deleted).
                None => {
                    st.last = st.last.max(revision);
                    return;
                }
            },
        };
        self.publish(
            &mut st,
            Change {
                kind,
                object,
                prev,
                revision,
            },
        );
    }

    /// A change whose new value cannot be decoded: the key leaves the cache (watchers that
    /// saw the object get its DELETED at this revision) and is remembered as undecodable, so
    /// a get of it says why instead of serving a stale version.
    pub(super) fn apply_undecodable(
        &self,
        key: &str,
        kind: EventKind,
        error: String,
        revision: Revision,
    ) {
        let mut st = self.lock();
        match kind {
            EventKind::Put => {
                st.undecodable
                    .insert(key.to_string(), Undecodable { revision, error });
            }
            EventKind::Delete => {
                st.undecodable.remove(key);
            }
        }
        let Some(prev) = st.objects.remove(key) else {
            st.last = st.last.max(revision);
            return;
        };
        match prev.at(revision) {
            Ok(last) => self.publish(
                &mut st,
                Change {
                    kind: ChangeKind::Deleted,
                    object: Arc::new(last),
                    prev: Prev::Known(prev),
                    revision,
                },
            ),
            Err(_) => st.last = st.last.max(revision),
        }
    }

    fn publish(&self, st: &mut State, change: Change) {
        let change = Arc::new(change);
        st.push_history(change.clone());
        // Errors only mean "no receivers".
        let _ = st.all.send(change.clone());
        for name in &self.spec.indexed {
            let Some(i) = self.index_of(name) else {
                continue;
            };
            let new = change.object.fields[i].clone();
            let old = change.prev_for_filter().and_then(|p| p.fields[i].clone());
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
    pub(super) fn remember(&self, change: Arc<Change>) {
        self.lock().push_history(change);
    }

    /// Forgets the replayed ring (its history could not be read): watches resume only from
    /// `revision` on.
    pub(super) fn forget_history(&self, revision: Revision) {
        let mut st = self.lock();
        st.history.clear();
        st.oldest = revision;
    }

    /// The object at `key`; an error if the store holds a value there that cannot be decoded.
    pub fn get(&self, key: &str) -> Result<Option<Arc<CachedObject>>, Undecodable> {
        let st = self.lock();
        if let Some(u) = st.undecodable.get(key) {
            return Err(u.clone());
        }
        Ok(st.objects.get(key).cloned())
    }

    /// Keys under this resource whose stored value cannot be decoded.
    pub fn undecodable(&self) -> Vec<(String, Undecodable)> {
        let st = self.lock();
        st.undecodable
            .iter()
            .map(|(k, u)| (k.clone(), u.clone()))
            .collect()
    }

    /// Matching objects whose key starts with `prefix`, after the key `after`, at most
    /// `limit`, at the revision the cache is at.
    pub fn list(
        &self,
        prefix: &str,
        filter: &Filter,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Page {
        let st = self.lock();
        let revision = self.revision_of(&st);
        let lower = lower_bound(prefix, after);
        let objects = st
            .objects
            .range((lower, Bound::Unbounded))
            .map(|(k, o)| (k.as_str(), o));
        page(objects, prefix, filter, limit, revision)
    }

    /// As [`ResourceCache::list`], but the objects as they were at `at` (the revision of a
    /// paged list's first page): the current objects with every later change of the ring
    /// undone. `Expired` when the ring no longer reaches back to `at`.
    pub fn list_at(
        &self,
        prefix: &str,
        filter: &Filter,
        after: Option<&str>,
        limit: Option<usize>,
        at: Revision,
    ) -> Result<Page, CacheError> {
        let st = self.lock();
        let now = self.revision_of(&st);
        if at >= now {
            let lower = lower_bound(prefix, after);
            let objects = st
                .objects
                .range((lower, Bound::Unbounded))
                .map(|(k, o)| (k.as_str(), o));
            return Ok(page(objects, prefix, filter, limit, now));
        }
        let expired = || CacheError::Expired {
            requested: at,
            oldest: st.oldest,
        };
        if at < st.oldest {
            return Err(expired());
        }
        // Each key's state at `at` is what its first later change found.
        let first_later = st.history.partition_point(|c| c.revision <= at);
        let mut undone: BTreeMap<&str, Option<Arc<CachedObject>>> = BTreeMap::new();
        for c in st.history.range(first_later..) {
            let key = c.object.key.as_str();
            if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
                continue;
            }
            if undone.contains_key(key) {
                continue;
            }
            let before = match &c.prev {
                Prev::Absent => None,
                Prev::Known(p) => Some(p.clone()),
                Prev::Unknown => return Err(expired()),
            };
            undone.insert(key, before);
        }
        let lower = lower_bound(prefix, after);
        let current = st
            .objects
            .range((lower, Bound::Unbounded))
            .map(|(k, o)| (k.as_str(), Some(o)));
        let merged = Merge {
            current: current.peekable(),
            undone: undone.iter().map(|(k, o)| (*k, o.as_ref())).peekable(),
        };
        Ok(page(
            merged.filter_map(|(k, o)| Some((k, o?))),
            prefix,
            filter,
            limit,
            at,
        ))
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
        let initial = match start {
            WatchStart::Current => {
                for (_, o) in st.objects.range(prefix.to_string()..) {
                    if !o.key.starts_with(prefix) {
                        break;
                    }
                    if filter(o) {
                        pending.push_back(WatchEvent::Added(o.clone()));
                    }
                }
                self.revision_of(&st)
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
                rev.max(self.revision_of(&st))
            }
        };
        Ok(CacheWatch::new(pending, live, filter, prefix, initial))
    }
}

fn lower_bound(prefix: &str, after: Option<&str>) -> Bound<String> {
    match after {
        Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
        _ => Bound::Included(prefix.to_string()),
    }
}

/// The first `limit` objects of a key-ordered sequence that are under `prefix` and pass
/// `filter`.
fn page<'a>(
    objects: impl Iterator<Item = (&'a str, &'a Arc<CachedObject>)>,
    prefix: &str,
    filter: &Filter,
    limit: Option<usize>,
    revision: Revision,
) -> Page {
    let mut items: Vec<Arc<CachedObject>> = Vec::new();
    let mut continue_after = None;
    for (k, o) in objects {
        if !k.starts_with(prefix) {
            break;
        }
        if !filter(o) {
            continue;
        }
        if limit.is_some_and(|l| items.len() >= l) {
            continue_after = items.last().map(|o| o.key.clone());
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

/// The current objects with some keys' states replaced by older ones (None: absent then), in
/// key order.
struct Merge<'a, C, U>
where
    C: Iterator<Item = (&'a str, Option<&'a Arc<CachedObject>>)>,
    U: Iterator<Item = (&'a str, Option<&'a Arc<CachedObject>>)>,
{
    current: Peekable<C>,
    undone: Peekable<U>,
}

impl<'a, C, U> Iterator for Merge<'a, C, U>
where
    C: Iterator<Item = (&'a str, Option<&'a Arc<CachedObject>>)>,
    U: Iterator<Item = (&'a str, Option<&'a Arc<CachedObject>>)>,
{
    type Item = (&'a str, Option<&'a Arc<CachedObject>>);

    fn next(&mut self) -> Option<Self::Item> {
        match (self.current.peek(), self.undone.peek()) {
            (Some((c, _)), Some((u, _))) if c == u => {
                self.current.next();
                self.undone.next()
            }
            (Some((c, _)), Some((u, _))) if u < c => self.undone.next(),
            (Some(_), _) => self.current.next(),
            (None, _) => self.undone.next(),
        }
    }
}
