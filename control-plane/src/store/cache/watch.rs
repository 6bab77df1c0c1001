//! One watcher's view of a resource's changes: the events queued when it started (the
//! current objects, or the ring's changes after its revision), then the live broadcast, each
//! change passed through the watcher's filter.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::broadcast;

use super::resource::{CachedObject, Change, ChangeKind};
use super::Filter;
use crate::store::Revision;

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
pub(super) fn transition(c: &Change, prefix: &str, filter: &Filter) -> Option<WatchEvent> {
    if !c.object.key.starts_with(prefix) {
        return None;
    }
    let now = filter(&c.object);
    let before = c.prev_for_filter().is_some_and(|p| filter(p));
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
    initial: Revision,
}

/// Why a watch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchEnd {
    /// The watcher fell too far behind; it must relist.
    TooSlow,
    /// The cache stopped this watch: the server is shutting down, or the cache re-read the
    /// store and the changes since the watcher's revision are not known one by one.
    Closed,
}

impl CacheWatch {
    pub(super) fn new(
        pending: VecDeque<WatchEvent>,
        live: broadcast::Receiver<Arc<Change>>,
        filter: Filter,
        prefix: &str,
        initial: Revision,
    ) -> CacheWatch {
        CacheWatch {
            pending,
            live,
            filter,
            prefix: prefix.to_string(),
            initial,
        }
    }

    /// The revision the events queued at the start bring the watcher to: the revision of the
    /// state the synthetic ADDED events show (or the revision the watch resumed from, and the
    /// ring's changes after it). Every live event is newer.
    pub fn initial_revision(&self) -> Revision {
        self.initial
    }

    /// The next event queued at the start, if any is left (never a live one).
    pub fn next_initial(&mut self) -> Option<WatchEvent> {
        self.pending.pop_front()
    }

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
