//! The embedded, durable default backend, on redb (a pure-Rust copy-on-write B-tree with ACID
//! transactions and MVCC readers). One writer thread owns all writes and commits them in
//! groups: every write waiting when a commit starts joins it, so concurrent writers share one
//! fsync. A write is answered only after its commit returned, i.e. after it is on disk.
//!
//! Tables: `kv` (key -> create revision + value), `history` (revision -> change, bounded:
//! the oldest entries are compacted away past `history_limit`), `meta` (revision, oldest).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::future::BoxFuture;
use futures::FutureExt;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::codec;
use super::{
    Event, EventKind, EventStream, KeyValue, Precondition, RangeResult, Revision, Store,
    StoreError, WatchItem, WriteOp, WriteResult,
};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_OLDEST: &str = "oldest";
/// The key layout of `kv`: absent in stores written before keys followed Kubernetes'
/// `/registry/<resource>/...` (they were `/<group or core>/<resource>/...`).
const META_LAYOUT: &str = "layout";
const LAYOUT_REGISTRY: u64 = 2;

/// Writes joining one commit at most.
const MAX_BATCH: usize = 512;
/// History records a watch reads per step while catching up.
const CATCH_UP_CHUNK: usize = 1024;

/// Tuning of the embedded store.
#[derive(Clone, Debug)]
pub struct RedbOptions {
    /// Changes kept for watches to resume from; older ones are compacted away.
    pub history_limit: u64,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            history_limit: 100_000,
        }
    }
}

/// The embedded store. Cheap to clone; the writer thread stops when the last clone is dropped.
#[derive(Clone)]
pub struct RedbStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// None once closed; readers hold a clone only for the duration of one read.
    db: RwLock<Option<Arc<Database>>>,
    requests: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    current: AtomicU64,
    oldest: AtomicU64,
    /// None once closed, which ends every watch.
    events: RwLock<Option<broadcast::Sender<Arc<Vec<Event>>>>>,
}

enum Request {
    Write(WriteOp, oneshot::Sender<Result<WriteResult, StoreError>>),
    Compact(Revision, oneshot::Sender<Result<(), StoreError>>),
}

impl RedbStore {
    /// Opens (or creates) the store in `dir/store.redb`.
    pub fn open(dir: &Path, options: RedbOptions) -> Result<RedbStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(backend)?;
        let db = Database::create(dir.join("store.redb")).map_err(backend)?;
        let (current, oldest) = {
            let txn = db.begin_write().map_err(backend)?;
            let found = {
                let mut kv = txn.open_table(KV).map_err(backend)?;
                let mut history = txn.open_table(HISTORY).map_err(backend)?;
                let mut meta = txn.open_table(META).map_err(backend)?;
                let get = |meta: &redb::Table<&str, u64>, k| -> Result<Option<u64>, StoreError> {
                    Ok(meta.get(k).map_err(backend)?.map(|v| v.value()))
                };
                let revision = get(&meta, META_REVISION)?.unwrap_or(0);
                let mut oldest = get(&meta, META_OLDEST)?.unwrap_or(1);
                if get(&meta, META_LAYOUT)? != Some(LAYOUT_REGISTRY) {
                    let moved = migrate_layout(&mut kv)?;
                    if moved > 0 {
                        // The history names the old keys: no watch resumes across this.
                        history.retain(|_, _| false).map_err(backend)?;
                        oldest = revision + 1;
                        meta.insert(META_OLDEST, oldest).map_err(backend)?;
                        tracing::info!(keys = moved, "store keys moved to the /registry/ layout");
                    }
                    meta.insert(META_LAYOUT, LAYOUT_REGISTRY).map_err(backend)?;
                }
                (revision, oldest)
            };
            txn.commit().map_err(backend)?;
            found
        };
        let (events, _) = broadcast::channel(1024);
        let (tx, rx) = mpsc::unbounded_channel();
        let db = Arc::new(db);
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(db.clone())),
            requests: Mutex::new(Some(tx)),
            writer: Mutex::new(None),
            current: AtomicU64::new(current),
            oldest: AtomicU64::new(oldest),
            events: RwLock::new(Some(events)),
        });
        let writer = Writer {
            shared: shared.clone(),
            db,
            history_limit: options.history_limit.max(1),
        };
        let handle = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(backend)?;
        *shared.writer.lock().map_err(backend)? = Some(handle);
        tracing::info!(dir = %dir.display(), revision = current, oldest, "store opened");
        Ok(RedbStore { shared })
    }

    /// Commits the writes already queued, ends every watch and closes the database file
    /// (another `open` of the directory succeeds afterwards). Blocks briefly.
    pub fn close(&self) {
        if let Ok(mut g) = self.shared.requests.lock() {
            g.take();
        }
        let writer = self.shared.writer.lock().ok().and_then(|mut g| g.take());
        if let Some(w) = writer {
            let _ = w.join();
        }
        if let Ok(mut g) = self.shared.events.write() {
            g.take();
        }
        let db = self.shared.db.write().ok().and_then(|mut g| g.take());
        if let Some(db) = db {
            // In-flight reads hold the database for one read each; let them finish.
            let weak = Arc::downgrade(&db);
            drop(db);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while weak.strong_count() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// Writes a consistent copy of the store (every key and the revision, read in one
    /// transaction while writes go on) into a new database at `file`; returns its revision.
    /// The copy has no history: watches on a store restored from it start at its revision.
    pub fn snapshot_to(&self, file: &Path) -> Result<Revision, StoreError> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(backend)?;
        let kv = txn.open_table(KV).map_err(backend)?;
        let meta = txn.open_table(META).map_err(backend)?;
        let revision = meta
            .get(META_REVISION)
            .map_err(backend)?
            .map_or(0, |v| v.value());
        let out = Database::create(file).map_err(backend)?;
        let w = out.begin_write().map_err(backend)?;
        {
            let mut copy = w.open_table(KV).map_err(backend)?;
            for entry in kv.iter().map_err(backend)? {
                let (k, v) = entry.map_err(backend)?;
                copy.insert(k.value(), v.value()).map_err(backend)?;
            }
            w.open_table(HISTORY).map_err(backend)?;
            let mut m = w.open_table(META).map_err(backend)?;
            m.insert(META_REVISION, revision).map_err(backend)?;
            m.insert(META_OLDEST, revision + 1).map_err(backend)?;
            m.insert(META_LAYOUT, LAYOUT_REGISTRY).map_err(backend)?;
        }
        w.commit().map_err(backend)?;
        Ok(Revision(revision))
    }

    fn db(&self) -> Result<Arc<Database>, StoreError> {
        self.shared
            .db
            .read()
            .map_err(|_| StoreError::Closed)?
            .clone()
            .ok_or(StoreError::Closed)
    }

    fn send(&self, r: Request) -> Result<(), StoreError> {
        let g = self
            .shared
            .requests
            .lock()
            .map_err(|_| StoreError::Closed)?;
        g.as_ref()
            .ok_or(StoreError::Closed)?
            .send(r)
            .map_err(|_| StoreError::Closed)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db()?;
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(backend)?
    }
}

impl Store for RedbStore {
    fn current_revision(&self) -> Revision {
        Revision(self.shared.current.load(Ordering::Acquire))
    }

    fn latest_revision(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        // One process owns the file: what it committed is all there is.
        futures::future::ready(Ok(self.current_revision())).boxed()
    }

    fn barrier(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        // Watches here see every revision: the latest is one they will deliver.
        self.latest_revision()
    }

    fn oldest_revision(&self) -> Revision {
        Revision(self.shared.oldest.load(Ordering::Acquire))
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        let key = key.to_string();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let kv = txn.open_table(KV).map_err(backend)?;
            let found = kv.get(key.as_str()).map_err(backend)?;
            found.map(|v| codec::decode_kv(&key, v.value())).transpose()
        })
        .boxed()
    }

    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<RangeResult, StoreError>> {
        let prefix = prefix.to_string();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let kv = txn.open_table(KV).map_err(backend)?;
            let meta = txn.open_table(META).map_err(backend)?;
            let revision = meta
                .get(META_REVISION)
                .map_err(backend)?
                .map(|v| v.value())
                .unwrap_or(0);
            let mut kvs = Vec::new();
            for entry in kv.range(prefix.as_str()..).map_err(backend)? {
                let (k, v) = entry.map_err(backend)?;
                let key = k.value();
                if !key.starts_with(prefix.as_str()) {
                    break;
                }
                kvs.push(codec::decode_kv(key, v.value())?);
            }
            Ok(RangeResult {
                kvs,
                revision: Revision(revision),
            })
        })
        .boxed()
    }

    fn write(&self, op: WriteOp) -> BoxFuture<'_, Result<WriteResult, StoreError>> {
        async move {
            let (tx, rx) = oneshot::channel();
            self.send(Request::Write(op, tx))?;
            rx.await.map_err(|_| StoreError::Closed)?
        }
        .boxed()
    }

    fn watch(&self, from: Revision) -> Result<EventStream, StoreError> {
        // Subscribe before reading history, so nothing committed in between is missed.
        let live = self
            .shared
            .events
            .read()
            .map_err(|_| StoreError::Closed)?
            .as_ref()
            .ok_or(StoreError::Closed)?
            .subscribe();
        let oldest = self.oldest_revision();
        if from < oldest {
            return Err(StoreError::Compacted {
                requested: from,
                oldest,
            });
        }
        let state = WatchState {
            store: self.clone(),
            next: from.max(Revision(1)),
            buffer: Default::default(),
            live,
            held: None,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut s| async move {
                let item = s.next_event().await?;
                Some((item.map(WatchItem::Event), s))
            },
        )))
    }

    fn compact(&self, before: Revision) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            let (tx, rx) = oneshot::channel();
            self.send(Request::Compact(before, tx))?;
            rx.await.map_err(|_| StoreError::Closed)?
        }
        .boxed()
    }
}

/// A watch: events come from the live broadcast when it still holds them, from the history
/// table otherwise (a gap before a batch, a lag, the catch-up at the start), so only
/// compaction past the watcher's position can lose events (then `Compacted`).
struct WatchState {
    store: RedbStore,
    next: Revision,
    buffer: std::collections::VecDeque<Event>,
    live: broadcast::Receiver<Arc<Vec<Event>>>,
    held: Option<Arc<Vec<Event>>>,
}

impl WatchState {
    async fn next_event(&mut self) -> Option<Result<Event, StoreError>> {
        loop {
            if let Some(e) = self.buffer.pop_front() {
                self.next = e.revision().next();
                return Some(Ok(e));
            }
            let batch = match self.held.take() {
                Some(b) => Some(b),
                None => match self.live.try_recv() {
                    Ok(b) => Some(b),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                    Err(broadcast::error::TryRecvError::Closed) => return None,
                    Err(broadcast::error::TryRecvError::Empty) => None,
                },
            };
            if let Some(batch) = batch {
                let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
                    continue;
                };
                if last.revision() < self.next {
                    continue;
                }
                if first.revision() > self.next {
                    // Events between `next` and this batch were broadcast before we listened:
                    // read them from history first, then come back to this batch.
                    let upto = first.revision();
                    match self.read_history(Some(upto)).await {
                        Ok(true) => {}
                        Ok(false) => {
                            return Some(Err(StoreError::Backend(format!(
                                "history misses revisions {} to {upto}",
                                self.next
                            ))))
                        }
                        Err(e) => return Some(Err(e)),
                    }
                    self.held = Some(batch);
                    continue;
                }
                let next = self.next;
                self.buffer
                    .extend(batch.iter().filter(|e| e.revision() >= next).cloned());
                continue;
            }
            if self.next <= self.store.current_revision() {
                match self.read_history(None).await {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Some(Err(e)),
                }
            }
            match self.live.recv().await {
                Ok(b) => self.held = Some(b),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Appends history from `next` (before `upto` if given) to the buffer; false if there was
    /// nothing to read yet.
    async fn read_history(&mut self, upto: Option<Revision>) -> Result<bool, StoreError> {
        let from = self.next;
        let events = self
            .store
            .blocking(move |db| read_history(db, from, CATCH_UP_CHUNK))
            .await?;
        let Some(first) = events.first() else {
            return Ok(false);
        };
        if first.revision() != from {
            return Err(StoreError::Compacted {
                requested: from,
                oldest: first.revision(),
            });
        }
        self.buffer.extend(
            events
                .into_iter()
                .filter(|e| upto.is_none_or(|u| e.revision() < u)),
        );
        Ok(true)
    }
}

/// Moves every `/<group>/<resource>/<rest>` key to `/registry/<resource>/<rest>` (values and
/// revisions unchanged); returns how many moved.
fn migrate_layout(kv: &mut redb::Table<&'static str, &'static [u8]>) -> Result<usize, StoreError> {
    let mut old = Vec::new();
    for entry in kv.iter().map_err(backend)? {
        let (k, v) = entry.map_err(backend)?;
        let key = k.value();
        if key.starts_with("/registry/") {
            continue;
        }
        let mut parts = key.splitn(4, '/');
        let new = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(""), Some(_group), Some(resource), Some(rest)) => {
                format!("/registry/{resource}/{rest}")
            }
            _ => continue,
        };
        old.push((key.to_string(), new, v.value().to_vec()));
    }
    for (key, new, value) in &old {
        kv.remove(key.as_str()).map_err(backend)?;
        kv.insert(new.as_str(), value.as_slice()).map_err(backend)?;
    }
    Ok(old.len())
}

fn read_history(db: &Database, from: Revision, max: usize) -> Result<Vec<Event>, StoreError> {
    let txn = db.begin_read().map_err(backend)?;
    let history = txn.open_table(HISTORY).map_err(backend)?;
    let mut out = Vec::new();
    for entry in history.range(from.0..).map_err(backend)? {
        let (rev, raw) = entry.map_err(backend)?;
        out.push(codec::decode_event(Revision(rev.value()), raw.value())?);
        if out.len() >= max {
            break;
        }
    }
    Ok(out)
}

struct Writer {
    shared: Arc<Shared>,
    db: Arc<Database>,
    history_limit: u64,
}

type Replies = Vec<(
    Result<WriteResult, StoreError>,
    oneshot::Sender<Result<WriteResult, StoreError>>,
)>;

impl Writer {
    fn run(self, mut rx: mpsc::UnboundedReceiver<Request>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        tracing::debug!("store writer stopped");
    }

    /// Applies a batch in one transaction and answers every request after the commit.
    fn commit(&self, batch: Vec<Request>) {
        let base = Revision(self.shared.current.load(Ordering::Acquire));
        let mut oldest = Revision(self.shared.oldest.load(Ordering::Acquire));
        let mut writes: Replies = Vec::new();
        let mut compactions = Vec::new();
        let mut events = Vec::new();
        let outcome = (|| -> Result<Revision, StoreError> {
            let txn = self.db.begin_write().map_err(backend)?;
            let mut rev = base;
            {
                let mut kv = txn.open_table(KV).map_err(backend)?;
                let mut history = txn.open_table(HISTORY).map_err(backend)?;
                let mut meta = txn.open_table(META).map_err(backend)?;
                for req in batch {
                    match req {
                        Request::Write(op, reply) => {
                            let result = apply(&mut kv, &op, rev.next());
                            if let Ok(r) = &result {
                                rev = r.revision;
                                let event = Event {
                                    kind: match op {
                                        WriteOp::Put { .. } => EventKind::Put,
                                        WriteOp::Delete { .. } => EventKind::Delete,
                                    },
                                    kv: r.kv.clone(),
                                    created: r.prev.is_none(),
                                };
                                history
                                    .insert(rev.0, codec::encode_event(&event).as_slice())
                                    .map_err(backend)?;
                                events.push(event);
                            }
                            writes.push((result, reply));
                        }
                        Request::Compact(before, reply) => {
                            compactions.push(reply);
                            oldest = oldest.max(before.min(rev.next()));
                        }
                    }
                }
                // Keep the history bounded (compact in steps of a tenth to batch deletions).
                if rev.0.saturating_sub(oldest.0) > self.history_limit + self.history_limit / 10 {
                    oldest = Revision(rev.0 + 1 - self.history_limit);
                }
                let old = Revision(self.shared.oldest.load(Ordering::Acquire));
                if oldest > old {
                    history
                        .retain_in(old.0..oldest.0, |_, _| false)
                        .map_err(backend)?;
                    meta.insert(META_OLDEST, oldest.0).map_err(backend)?;
                }
                if rev != base {
                    meta.insert(META_REVISION, rev.0).map_err(backend)?;
                }
            }
            txn.commit().map_err(backend)?;
            Ok(rev)
        })();
        match outcome {
            Ok(rev) => {
                self.shared.current.store(rev.0, Ordering::Release);
                self.shared.oldest.store(oldest.0, Ordering::Release);
                if !events.is_empty() {
                    if let Ok(g) = self.shared.events.read() {
                        if let Some(tx) = g.as_ref() {
                            // No receiver is not an error: nobody watches yet.
                            let _ = tx.send(Arc::new(events));
                        }
                    }
                }
                for (result, reply) in writes {
                    let _ = reply.send(result);
                }
                for reply in compactions {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed");
                for (_, reply) in writes {
                    let _ = reply.send(Err(e.clone()));
                }
                for reply in compactions {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// One write inside the batch's transaction, at revision `rev` if it applies.
fn apply(
    kv: &mut redb::Table<&'static str, &'static [u8]>,
    op: &WriteOp,
    rev: Revision,
) -> Result<WriteResult, StoreError> {
    let key = op.key();
    let prev = match kv.get(key).map_err(backend)? {
        Some(v) => Some(codec::decode_kv(key, v.value())?),
        None => None,
    };
    let precondition = match op {
        WriteOp::Put { precondition, .. } | WriteOp::Delete { precondition, .. } => *precondition,
    };
    check(key, prev.as_ref(), precondition)?;
    match op {
        WriteOp::Put { value, .. } => {
            let stored = KeyValue {
                key: key.to_string(),
                value: value.clone(),
                create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                mod_revision: rev,
            };
            kv.insert(key, codec::encode_kv(&stored).as_slice())
                .map_err(backend)?;
            Ok(WriteResult {
                revision: rev,
                kv: stored,
                prev,
            })
        }
        WriteOp::Delete { .. } => {
            let Some(p) = prev else {
                return Err(StoreError::NotFound(key.to_string()));
            };
            kv.remove(key).map_err(backend)?;
            Ok(WriteResult {
                revision: rev,
                kv: KeyValue {
                    mod_revision: rev,
                    ..p.clone()
                },
                prev: Some(p),
            })
        }
    }
}

fn check(key: &str, prev: Option<&KeyValue>, p: Precondition) -> Result<(), StoreError> {
    match (p, prev) {
        (Precondition::Any, _) => Ok(()),
        (Precondition::MustNotExist, Some(_)) => Err(StoreError::AlreadyExists(key.to_string())),
        (Precondition::MustNotExist, None) => Ok(()),
        (Precondition::MustExist | Precondition::ModRevision(_), None) => {
            Err(StoreError::NotFound(key.to_string()))
        }
        (Precondition::MustExist, Some(_)) => Ok(()),
        (Precondition::ModRevision(expected), Some(kv)) if kv.mod_revision != expected => {
            Err(StoreError::Conflict {
                key: key.to_string(),
                expected,
                actual: kv.mod_revision,
            })
        }
        (Precondition::ModRevision(_), Some(_)) => Ok(()),
    }
}

/// The revision and key count of a snapshot file (or any store file), read without changing
/// it; an error if it is not one.
pub fn inspect(file: &Path) -> Result<(Revision, usize), StoreError> {
    let db = Database::open(file).map_err(backend)?;
    let txn = db.begin_read().map_err(backend)?;
    let meta = txn.open_table(META).map_err(backend)?;
    let revision = meta
        .get(META_REVISION)
        .map_err(backend)?
        .map_or(0, |v| v.value());
    let kv = txn.open_table(KV).map_err(backend)?;
    let keys = kv.len().map_err(backend)? as usize;
    Ok((Revision(revision), keys))
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn put(key: &str, v: &str, p: Precondition) -> WriteOp {
        WriteOp::Put {
            key: key.into(),
            value: v.as_bytes().to_vec().into(),
            precondition: p,
        }
    }

    #[tokio::test]
    async fn compare_and_swap_follows_etcd() {
        let d = tempfile::tempdir().unwrap();
        let s = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        let a = s
            .write(put("/a", "1", Precondition::MustNotExist))
            .await
            .unwrap();
        assert_eq!(a.revision, Revision(1));
        assert_eq!(
            s.write(put("/a", "x", Precondition::MustNotExist)).await,
            Err(StoreError::AlreadyExists("/a".into()))
        );
        let b = s
            .write(put("/a", "2", Precondition::ModRevision(Revision(1))))
            .await
            .unwrap();
        assert_eq!(
            (b.kv.create_revision, b.kv.mod_revision),
            (Revision(1), Revision(2))
        );
        assert!(matches!(
            s.write(put("/a", "3", Precondition::ModRevision(Revision(1))))
                .await,
            Err(StoreError::Conflict {
                actual: Revision(2),
                ..
            })
        ));
        s.write(put("/b", "b", Precondition::Any)).await.unwrap();
        s.write(put("/ab", "x", Precondition::Any)).await.unwrap();
        let r = s.range("/a").await.unwrap();
        assert_eq!(
            r.kvs.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
            ["/a", "/ab"]
        );
        assert_eq!(r.revision, Revision(4));
        let del = s
            .write(WriteOp::Delete {
                key: "/a".into(),
                precondition: Precondition::Any,
            })
            .await
            .unwrap();
        assert_eq!(del.kv.value.as_ref(), b"2");
        assert_eq!(s.get("/a").await.unwrap(), None);
        assert_eq!(s.current_revision(), Revision(5));
        s.close();
    }

    #[tokio::test]
    async fn watch_replays_history_then_follows_and_compaction_expires() {
        let d = tempfile::tempdir().unwrap();
        let s = RedbStore::open(d.path(), RedbOptions { history_limit: 10 }).unwrap();
        for i in 0..5 {
            s.write(put(&format!("/k{i}"), "v", Precondition::Any))
                .await
                .unwrap();
        }
        let mut w = s.watch(Revision(3)).unwrap();
        for want in 3..=5 {
            assert_eq!(w.next().await.unwrap().unwrap().revision(), Revision(want));
        }
        s.write(put("/k9", "v", Precondition::Any)).await.unwrap();
        let Some(Ok(WatchItem::Event(e))) = w.next().await else {
            panic!("an event")
        };
        assert_eq!(
            (e.revision(), e.kv.key.as_str(), e.created),
            (Revision(6), "/k9", true)
        );
        // Many more writes than the history keeps: early revisions are compacted.
        let writes: Vec<_> = (0..40)
            .map(|i| s.write(put(&format!("/x{i}"), "v", Precondition::Any)))
            .collect();
        futures::future::join_all(writes).await;
        assert!(s.oldest_revision() > Revision(3));
        assert!(matches!(
            s.watch(Revision(3)),
            Err(StoreError::Compacted { .. })
        ));
        // The open watch still sees every event (it reads history or the broadcast).
        for want in 7..=46 {
            assert_eq!(w.next().await.unwrap().unwrap().revision(), Revision(want));
        }
        s.close();
        // Reopening keeps revision and history bounds.
        let s = RedbStore::open(d.path(), RedbOptions { history_limit: 10 }).unwrap();
        assert_eq!(s.current_revision(), Revision(46));
        assert!(s.oldest_revision() > Revision(3));
        s.close();
    }

    #[tokio::test]
    async fn keys_of_the_old_layout_move_under_registry_once() {
        let d = tempfile::tempdir().unwrap();
        let s = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        for k in [
            "/core/pods/ns/a",
            "/apps/deployments/ns/d",
            "/registry/pods/ns/b",
        ] {
            s.write(put(k, k, Precondition::Any)).await.unwrap();
        }
        s.close();
        // As a store written before the layout marker existed.
        {
            let db = Database::create(d.path().join("store.redb")).unwrap();
            let w = db.begin_write().unwrap();
            w.open_table(META).unwrap().remove(META_LAYOUT).unwrap();
            w.commit().unwrap();
        }
        let s = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        let r = s.range("/").await.unwrap();
        let got: Vec<(&str, &[u8])> = r
            .kvs
            .iter()
            .map(|k| (k.key.as_str(), k.value.as_ref()))
            .collect();
        assert_eq!(
            got,
            [
                ("/registry/deployments/ns/d", &b"/apps/deployments/ns/d"[..]),
                ("/registry/pods/ns/a", b"/core/pods/ns/a"),
                ("/registry/pods/ns/b", b"/registry/pods/ns/b"),
            ]
        );
        assert_eq!(s.current_revision(), Revision(3));
        // The history named the old keys: no watch resumes from before the move.
        assert!(matches!(
            s.watch(Revision(1)),
            Err(StoreError::Compacted { .. })
        ));
        s.close();
        let s = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        assert_eq!(s.range("/").await.unwrap().kvs.len(), 3);
        s.close();
    }
}
