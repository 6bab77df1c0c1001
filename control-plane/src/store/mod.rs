//! The storage layer: a key-value store with etcd's semantics (one global revision that every
//! write advances, compare-and-swap on a key's mod revision, range reads, a watch that resumes
//! from any revision still in the bounded history, compaction). The API server sees only the
//! [`Store`] trait, behind which are the embedded store ([`redb`], the default: one process,
//! one file) and an etcd v3 cluster ([`etcd`], for several API servers and high
//! availability). [`cache`] is the watch cache the API server serves reads and
//! watches from: one store watch feeds it, however many clients watch.

pub mod cache;
mod codec;
#[cfg(test)]
mod contract_tests;
pub mod etcd;
pub mod redb;
pub mod snapshot;

use std::fmt;
use std::pin::Pin;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::Stream;

/// The store's global logical clock; a Kubernetes resourceVersion is its decimal form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl Revision {
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One stored key with its value and the revisions etcd reports for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// The revision of the write that created the key.
    pub create_revision: Revision,
    /// The revision of the last write to the key (its resourceVersion).
    pub mod_revision: Revision,
}

/// The compare half of a compare-and-swap write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Unconditional.
    Any,
    /// The key must not exist (create).
    MustNotExist,
    /// The key must exist (any revision).
    MustExist,
    /// The key must exist with exactly this mod revision (optimistic concurrency).
    ModRevision(Revision),
}

/// One write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    Put {
        key: String,
        value: Bytes,
        precondition: Precondition,
    },
    Delete {
        key: String,
        precondition: Precondition,
    },
}

impl WriteOp {
    pub fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. } | WriteOp::Delete { key, .. } => key,
        }
    }
}

/// What a successful write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteResult {
    pub revision: Revision,
    /// Put: the stored key-value; delete: the value that was deleted, with `mod_revision` the
    /// revision of the delete.
    pub kv: KeyValue,
    /// The value before the write (None for a create).
    pub prev: Option<KeyValue>,
}

/// A change, as a watch delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// Put: the new key-value. Delete: the last value, with `mod_revision` the delete's revision.
    pub kv: KeyValue,
    /// Whether the put created the key.
    pub created: bool,
}

impl Event {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A consistent read of a key range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    /// The store revision the read saw.
    pub revision: Revision,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("key {0} already exists")]
    AlreadyExists(String),
    #[error("key {0} not found")]
    NotFound(String),
    #[error("key {key} is at revision {actual}, not {expected}")]
    Conflict {
        key: String,
        expected: Revision,
        actual: Revision,
    },
    #[error("revision {requested} has been compacted (oldest available is {oldest})")]
    Compacted {
        requested: Revision,
        oldest: Revision,
    },
    #[error("store backend: {0}")]
    Backend(String),
    /// The store cannot be reached or has no quorum now; the request may be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store is closed")]
    Closed,
}

/// What a watch delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    /// One change.
    Event(Event),
    /// Every change up to this revision has been delivered (etcd's progress notification):
    /// the revision may have moved on through writes this watch does not see.
    Progress(Revision),
}

impl WatchItem {
    /// The revision the watch has reached with this item.
    pub fn revision(&self) -> Revision {
        match self {
            WatchItem::Event(e) => e.revision(),
            WatchItem::Progress(r) => *r,
        }
    }
}

/// A stream of changes in revision order.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<WatchItem, StoreError>> + Send>>;

/// etcd's semantics, as the API server needs them.
pub trait Store: Send + Sync + 'static {
    /// The latest revision this process knows to be committed (its own writes and what its
    /// watches saw; another client's newer writes may not be known yet: see
    /// [`Store::latest_revision`]).
    fn current_revision(&self) -> Revision;

    /// The store's latest revision, read from the store itself (a quorum read on etcd): a read
    /// served at this revision or later sees every write acknowledged before the call, by any
    /// client.
    fn latest_revision(&self) -> BoxFuture<'_, Result<Revision, StoreError>>;

    /// A revision at least as new as every write acknowledged before the call (by any
    /// client), which every open watch of the store will reach with an item it delivers (an
    /// event at or after it, or a [`WatchItem::Progress`] saying so): a reader that waits
    /// for its watch to get there sees every such write, even when the newest revisions are
    /// other keys' than the watch's. Costs a write on some backends: call it only when the
    /// watch is behind.
    fn barrier(&self) -> BoxFuture<'_, Result<Revision, StoreError>>;

    fn oldest_revision(&self) -> Revision;

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>>;

    /// Every key starting with `prefix`, in key order, at one revision.
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<RangeResult, StoreError>>;

    /// Applies one write; returns once it is durable.
    fn write(&self, op: WriteOp) -> BoxFuture<'_, Result<WriteResult, StoreError>>;

    /// Every change with revision >= `from`, then live changes, in order.
    /// `StoreError::Compacted` (at once or as the stream's first item) if `from` is older than
    /// the history kept.
    fn watch(&self, from: Revision) -> Result<EventStream, StoreError>;

    /// Drops history older than `before` (watches can no longer start there).
    fn compact(&self, before: Revision) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// Which store the API server keeps its state in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The embedded store in the server's data directory (one API server).
    #[default]
    Embedded,
    /// An etcd cluster (any number of API servers).
    Etcd(etcd::EtcdConfig),
}

/// An open store of either kind.
#[derive(Clone)]
pub enum OpenStore {
    Embedded(redb::RedbStore),
    Etcd(etcd::EtcdStore),
}

impl OpenStore {
    /// Opens the backend (the embedded one in `data_dir`, keeping `history` revisions).
    pub async fn open(
        backend: &Backend,
        data_dir: &std::path::Path,
        history: u64,
    ) -> Result<OpenStore, StoreError> {
        Ok(match backend {
            Backend::Embedded => OpenStore::Embedded(redb::RedbStore::open(
                data_dir,
                redb::RedbOptions {
                    history_limit: history,
                },
            )?),
            Backend::Etcd(config) => OpenStore::Etcd(etcd::EtcdStore::connect(config).await?),
        })
    }

    /// The store behind the trait.
    pub fn shared(&self) -> std::sync::Arc<dyn Store> {
        match self {
            OpenStore::Embedded(s) => std::sync::Arc::new(s.clone()),
            OpenStore::Etcd(s) => std::sync::Arc::new(s.clone()),
        }
    }

    /// Ends every watch and releases the store (blocks briefly for the embedded one).
    pub fn close(&self) {
        match self {
            OpenStore::Embedded(s) => s.close(),
            OpenStore::Etcd(s) => s.close(),
        }
    }
}
