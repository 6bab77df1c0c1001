//! The work queue between informers and a controller's workers, with client-go's semantics:
//! a key is queued at most once however often it is added (deduplication), a key being
//! processed is never handed to a second worker (it is re-queued when the first finishes if it
//! was added meanwhile), delayed adds keep only the earliest deadline per key, and failures are
//! retried after a per-key exponential back-off (5 ms doubling up to a cap) that a success
//! resets.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

/// What a queue needs of its keys.
pub trait QueueKey: Clone + Eq + Hash + Ord + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Ord + Send + Sync + 'static> QueueKey for T {}

/// Per-key exponential back-off for retries.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// client-go's default controller rate limiter (per item): 5 ms doubling to 1000 s.
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (0-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u64.checked_shl(failures.min(40)).unwrap_or(u64::MAX);
        let nanos = (self.base.as_nanos() as u64).saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max)
    }
}

/// A deduplicating, rate-limited work queue. Cheap to clone.
pub struct WorkQueue<T: QueueKey> {
    inner: Arc<Inner<T>>,
}

impl<T: QueueKey> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<T> {
    state: Mutex<State<T>>,
    notify: Notify,
    delayed: mpsc::UnboundedSender<(Instant, T)>,
    backoff: Backoff,
}

struct State<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    failures: HashMap<T, u32>,
    shutting_down: bool,
}

impl<T: QueueKey> WorkQueue<T> {
    /// A queue with client-go's default back-off. Needs a tokio runtime (a timer task serves
    /// the delayed adds; it ends with the queue).
    pub fn new() -> WorkQueue<T> {
        WorkQueue::with_backoff(Backoff::default())
    }

    pub fn with_backoff(backoff: Backoff) -> WorkQueue<T> {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                failures: HashMap::new(),
                shutting_down: false,
            }),
            notify: Notify::new(),
            delayed: tx,
            backoff,
        });
        tokio::spawn(delay_loop(Arc::downgrade(&inner), rx));
        WorkQueue { inner }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` unless it is queued already.
    pub fn add(&self, key: T) {
        add(&self.inner, key);
    }

    /// Queues `key` after `delay` (an earlier pending deadline for the same key wins).
    pub fn add_after(&self, key: T, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let _ = self.inner.delayed.send((Instant::now() + delay, key));
    }

    /// Queues `key` after its back-off, which grows with each call until [`Self::forget`].
    pub fn add_rate_limited(&self, key: T) {
        let delay = {
            let mut st = self.state();
            let n = st.failures.entry(key.clone()).or_insert(0);
            let d = self.inner.backoff.delay(*n);
            *n = n.saturating_add(1);
            d
        };
        self.add_after(key, delay);
    }

    /// Resets `key`'s back-off (after a success).
    pub fn forget(&self, key: &T) {
        self.state().failures.remove(key);
    }

    /// How many times `key` has been retried since its last success.
    pub fn retries(&self, key: &T) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key and marks it as processing; None once shut down.
    pub async fn get(&self) -> Option<T> {
        loop {
            let notified = self.inner.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.state();
                if let Some(key) = st.queue.pop_front() {
                    st.dirty.remove(&key);
                    st.processing.insert(key.clone());
                    if !st.queue.is_empty() {
                        // Another worker may be waiting: pass the wake-up on.
                        self.inner.notify.notify_one();
                    }
                    return Some(key);
                }
                if st.shutting_down {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed; it is queued again if it was added while being processed.
    pub fn done(&self, key: &T) {
        let mut st = self.state();
        st.processing.remove(key);
        if st.dirty.contains(key) && !st.shutting_down {
            st.queue.push_back(key.clone());
            self.inner.notify.notify_one();
        }
    }

    /// Keys waiting to be processed (the queue depth).
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops handing out keys: every waiting and later [`Self::get`] returns None.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.inner.notify.notify_waiters();
    }
}

impl<T: QueueKey> Default for WorkQueue<T> {
    fn default() -> Self {
        WorkQueue::new()
    }
}

fn add<T: QueueKey>(inner: &Inner<T>, key: T) {
    let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
    if st.shutting_down || st.dirty.contains(&key) {
        return;
    }
    st.dirty.insert(key.clone());
    if st.processing.contains(&key) {
        return;
    }
    st.queue.push_back(key);
    inner.notify.notify_one();
}

/// Serves delayed adds: a heap of deadlines, the earliest kept per key.
async fn delay_loop<T: QueueKey>(
    queue: Weak<Inner<T>>,
    mut rx: mpsc::UnboundedReceiver<(Instant, T)>,
) {
    let mut heap: BinaryHeap<Reverse<(Instant, T)>> = BinaryHeap::new();
    let mut earliest: HashMap<T, Instant> = HashMap::new();
    loop {
        let next = heap.peek().map(|Reverse((at, _))| *at);
        let received = match next {
            Some(at) => tokio::select! {
                r = rx.recv() => r.map(Some).ok_or(()),
                _ = tokio::time::sleep_until(at) => Ok(None),
            },
            None => rx.recv().await.map(Some).ok_or(()),
        };
        match received {
            // Every sender (the queue) is gone.
            Err(()) => return,
            Ok(Some((at, key))) => {
                if earliest.get(&key).is_some_and(|e| *e <= at) {
                    continue;
                }
                earliest.insert(key.clone(), at);
                heap.push(Reverse((at, key)));
            }
            Ok(None) => {
                let now = Instant::now();
                let Some(inner) = queue.upgrade() else { return };
                while let Some(Reverse((at, _))) = heap.peek() {
                    if *at > now {
                        break;
                    }
                    let Some(Reverse((at, key))) = heap.pop() else {
                        break;
                    };
                    // A later entry superseded by an earlier one for the same key is stale.
                    if earliest.get(&key) == Some(&at) {
                        earliest.remove(&key);
                        add(&inner, key);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deduplicates_and_never_hands_a_key_to_two_workers() {
        let q: WorkQueue<String> = WorkQueue::new();
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        let a = q.get().await.unwrap();
        assert_eq!(a, "a");
        // Added while processing: not handed out until done.
        q.add("a".into());
        assert_eq!(q.get().await.unwrap(), "b");
        assert!(q.is_empty());
        q.done(&a);
        assert_eq!(q.get().await.unwrap(), "a");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_adds_keep_the_earliest_deadline() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add_after(1, Duration::from_secs(10));
        q.add_after(1, Duration::from_secs(2));
        q.add_after(2, Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(q.get().await, Some(1));
        assert_eq!(start.elapsed().as_secs(), 2);
        q.done(&1);
        assert_eq!(q.get().await, Some(2));
        assert_eq!(start.elapsed().as_secs(), 5);
        q.done(&2);
        // The superseded 10 s entry for key 1 does not fire again.
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn shut_down_releases_waiting_workers() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let w = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(w.await.unwrap(), None);
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let b = Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.delay(0), Duration::from_millis(5));
        assert_eq!(b.delay(3), Duration::from_millis(40));
        assert_eq!(b.delay(20), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_until_forgotten() {
        let q: WorkQueue<u32> = WorkQueue::new();
        q.add_rate_limited(7);
        q.add_rate_limited(7);
        assert_eq!(q.retries(&7), 2);
        q.forget(&7);
        assert_eq!(q.retries(&7), 0);
        assert_eq!(q.get().await, Some(7));
    }
}
