//! The storage layer: a key-value store with etcd's semantics (one global revision that every
//! write advances, compare-and-swap on a key's mod revision, range reads, a watch that resumes
//! from any revision still in the bounded history, compaction). The API server sees only the
//! [`Store`] trait, so an etcd v3 backend plugs in beside the embedded one ([`redb`]) without
//! touching the API layer. [`cache`] is the watch cache the API server serves reads and
//! watches from: one store watch feeds it, however many clients watch.

pub mod cache;
mod codec;
pub mod redb;

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
    #[error("store is closed")]
    Closed,
}

/// A stream of changes in revision order.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Event, StoreError>> + Send>>;

/// etcd's semantics, as the API server needs them.
pub trait Store: Send + Sync + 'static {
    /// The latest committed revision.
    fn current_revision(&self) -> Revision;

    /// The oldest revision a watch can still start from.
    fn oldest_revision(&self) -> Revision;

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>>;

    /// Every key starting with `prefix`, in key order, at one revision.
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<RangeResult, StoreError>>;

    /// Applies one write; returns once it is durable.
    fn write(&self, op: WriteOp) -> BoxFuture<'_, Result<WriteResult, StoreError>>;

    /// Every change with revision >= `from`, then live changes, in order.
    /// `StoreError::Compacted` if `from` is older than the history kept.
    fn watch(&self, from: Revision) -> Result<EventStream, StoreError>;

    /// Drops history older than `before` (watches can no longer start there).
    fn compact(&self, before: Revision) -> BoxFuture<'_, Result<(), StoreError>>;
}
