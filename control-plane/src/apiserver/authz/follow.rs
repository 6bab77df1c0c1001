//! An authorizer index's view of one resource in the watch cache: a subscription that starts
//! with every object and then carries each change, drained without waiting whenever the
//! index is about to answer. So an index is exactly as fresh as the cache when it decides,
//! and its upkeep is O(changed objects), never a relist per request. A subscriber that fell
//! too far behind starts over (a `Reset` then every object again).

use std::sync::Arc;

use crate::apiserver::registry::Resource;
use crate::store::cache::{
    Cache, CacheWatch, CachedObject, Filter, ResourceCache, WatchEvent, WatchStart,
};

/// A change an index applies.
#[derive(Debug)]
pub enum Update {
    /// Forget every object of this resource (what follows is all of them again).
    Reset,
    /// An object as it now is.
    Upsert(Arc<CachedObject>),
    /// An object that is gone (its last state).
    Delete(Arc<CachedObject>),
}

/// One resource's changes, for one index.
pub struct Follower {
    cache: Arc<ResourceCache>,
    prefix: String,
    watch: Option<CacheWatch>,
}

impl Follower {
    /// Follows `r` from its current state on (the first drain yields every object).
    pub fn new(cache: &Cache, r: &Resource) -> Option<Follower> {
        let prefix = r.prefix();
        let cache = cache.resource(&prefix).ok()?.clone();
        let mut f = Follower {
            cache,
            prefix,
            watch: None,
        };
        f.subscribe();
        Some(f)
    }

    fn subscribe(&mut self) {
        let all: Filter = Arc::new(|_| true);
        self.watch = self
            .cache
            .watch(&self.prefix, WatchStart::Current, all, None)
            .ok();
    }

    /// Every change since the last drain; never waits.
    pub fn drain(&mut self) -> Vec<Update> {
        let mut out = vec![];
        loop {
            let Some(w) = self.watch.as_mut() else {
                return out;
            };
            match w.try_next() {
                None => return out,
                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    out.push(Update::Upsert(o))
                }
                Some(Ok(WatchEvent::Deleted(o))) => out.push(Update::Delete(o)),
                // Fell behind, or the cache reloaded from the store (its changes since are not
                // known one by one): start over from the cache's current state.
                Some(Err(end)) => {
                    tracing::warn!(prefix = %self.prefix, ?end, "authorizer index starts over from the cache");
                    out.clear();
                    out.push(Update::Reset);
                    self.subscribe();
                }
            }
        }
    }
}
