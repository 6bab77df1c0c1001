//! Expectations, as kube-controller-manager keeps them: after a controller creates or deletes
//! children it expects to see those creations and deletions come back through the watch, and
//! it does not act on that owner again until they have (or until they expire, in case an
//! event was lost). This is what keeps a slow watch from causing extra pods: a second
//! reconcile that ran on a cache not yet showing the first one's pods would create them again.
//!
//! Deletions are tracked by child key (client-go's UIDTrackingControllerExpectations), so a
//! child deleted by someone else is not mistaken for one of ours.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unmet expectation blocks its owner (client-go's ExpectationsTimeout).
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Debug)]
struct Expectation<C> {
    adds: i64,
    deletes: HashSet<C>,
    set_at: Instant,
}

/// Expected creations and deletions per owner key `O` (children identified by `C`).
#[derive(Debug)]
pub struct Expectations<O, C> {
    by_owner: Mutex<HashMap<O, Expectation<C>>>,
    timeout: Duration,
}

impl<O: Hash + Eq + Clone, C: Hash + Eq + Clone> Default for Expectations<O, C> {
    fn default() -> Self {
        Expectations::new(EXPECTATIONS_TIMEOUT)
    }
}

impl<O: Hash + Eq + Clone, C: Hash + Eq + Clone> Expectations<O, C> {
    pub fn new(timeout: Duration) -> Expectations<O, C> {
        Expectations {
            by_owner: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<O, Expectation<C>>> {
        self.by_owner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `owner` may be acted on: nothing pending, or what was pending has expired.
    pub fn satisfied(&self, owner: &O) -> bool {
        match self.map().get(owner) {
            None => true,
            Some(e) => (e.adds <= 0 && e.deletes.is_empty()) || e.set_at.elapsed() > self.timeout,
        }
    }

    /// Before creating `creations` children of `owner` and deleting `deletions` (replaces
    /// any earlier expectation).
    pub fn expect(&self, owner: &O, creations: usize, deletions: impl IntoIterator<Item = C>) {
        self.map().insert(
            owner.clone(),
            Expectation {
                adds: i64::try_from(creations).unwrap_or(i64::MAX),
                deletes: deletions.into_iter().collect(),
                set_at: Instant::now(),
            },
        );
    }

    /// Before creating `n` children of `owner` (replaces any earlier expectation).
    pub fn expect_creations(&self, owner: &O, n: usize) {
        self.expect(owner, n, std::iter::empty());
    }

    /// Before deleting `children` of `owner` (replaces any earlier expectation).
    pub fn expect_deletions(&self, owner: &O, children: impl IntoIterator<Item = C>) {
        self.expect(owner, 0, children);
    }

    /// A child of `owner` appeared in the cache (or its creation failed and will not).
    pub fn creation_observed(&self, owner: &O) {
        if let Some(e) = self.map().get_mut(owner) {
            e.adds -= 1;
        }
    }

    /// `child` of `owner` disappeared (or its deletion failed and will not).
    pub fn deletion_observed(&self, owner: &O, child: &C) {
        if let Some(e) = self.map().get_mut(owner) {
            e.deletes.remove(child);
        }
    }

    /// Forgets `owner` (it was deleted).
    pub fn forget(&self, owner: &O) {
        self.map().remove(owner);
    }

    /// Creations still expected for `owner` (for logs and tests).
    pub fn pending_creations(&self, owner: &O) -> i64 {
        self.map().get(owner).map_or(0, |e| e.adds.max(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_until_every_creation_is_observed() {
        let e: Expectations<&str, &str> = Expectations::default();
        assert!(e.satisfied(&"rs"));
        e.expect_creations(&"rs", 2);
        assert!(!e.satisfied(&"rs"));
        e.creation_observed(&"rs");
        assert!(!e.satisfied(&"rs"));
        e.creation_observed(&"rs");
        assert!(e.satisfied(&"rs"));
    }

    #[test]
    fn deletions_are_tracked_by_child() {
        let e: Expectations<&str, &str> = Expectations::default();
        e.expect_deletions(&"rs", ["p1", "p2"]);
        // A pod deleted by someone else does not count.
        e.deletion_observed(&"rs", &"other");
        e.deletion_observed(&"rs", &"p1");
        e.deletion_observed(&"rs", &"p1");
        assert!(!e.satisfied(&"rs"));
        e.deletion_observed(&"rs", &"p2");
        assert!(e.satisfied(&"rs"));
    }

    #[test]
    fn unmet_expectations_expire() {
        let e: Expectations<&str, &str> = Expectations::new(Duration::from_nanos(1));
        e.expect_creations(&"rs", 5);
        let set = Instant::now();
        while set.elapsed() < Duration::from_micros(10) {
            std::hint::spin_loop();
        }
        assert!(e.satisfied(&"rs"));
        assert_eq!(e.pending_creations(&"rs"), 5);
        let fresh: Expectations<&str, &str> = Expectations::default();
        fresh.expect_creations(&"rs", 1);
        assert!(!fresh.satisfied(&"rs"));
        fresh.forget(&"rs");
        assert!(fresh.satisfied(&"rs"));
    }
}
