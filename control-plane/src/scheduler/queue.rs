//! The scheduling queue (kube-scheduler's PriorityQueue): pending pods wait in one of
//!
//! - active: ready to be tried, highest priority first, then first in first out;
//! - backoff: failed recently, ready again after 1 s doubling per attempt up to 10 s;
//! - unschedulable: rejected by some plugins, parked until a cluster event that one of those
//!   plugins says could help (queueing hints), or for at most 5 minutes;
//! - gated: held back by scheduling gates until they are removed.
//!
//! A popped pod is in flight until its cycle ends (`done`, or a requeue). Events that arrive
//! meanwhile are kept and replayed against the pod if it fails, so a node added while the
//! pod was being evaluated is never missed.
//!
//! Every operation is O(log n) in the queue's size, except an event, which asks each parked
//! unschedulable pod (O(unschedulable)), as kube-scheduler does.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::framework::PluginSet;
use super::hints::{could_help, ClusterEvent};
use super::pod_info::{PodInfo, PodUid};

/// Timings of the queue.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Longest a pod stays parked as unschedulable without an event.
    pub max_in_unschedulable: Duration,
}

impl Default for QueueConfig {
    /// kube-scheduler's defaults.
    fn default() -> Self {
        QueueConfig {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_in_unschedulable: Duration::from_secs(300),
        }
    }
}

impl QueueConfig {
    /// The back-off after `attempts` failed attempts: initial x 2^(attempts-1), capped.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let mut d = self.initial_backoff;
        for _ in 1..attempts {
            d = d.saturating_mul(2);
            if d >= self.max_backoff {
                return self.max_backoff;
            }
        }
        d.min(self.max_backoff)
    }
}

/// Where a pending pod waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Active,
    Backoff,
    Unschedulable,
    Gated,
    InFlight,
}

/// Pods per place, for metrics (kube-scheduler's `scheduler_pending_pods{queue}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueSizes {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub gated: usize,
    pub in_flight: usize,
}

/// A pod handed to the scheduling loop.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    pub info: Arc<PodInfo>,
    /// Attempts including this one.
    pub attempts: u32,
    /// When the pod first entered the queue (for the end-to-end latency).
    pub first_queued: Instant,
    /// When the pod was last put in the active queue (for the queue wait).
    pub activated: Instant,
}

#[derive(Debug)]
struct Entry {
    info: Arc<PodInfo>,
    place: Place,
    attempts: u32,
    first_queued: Instant,
    activated: Instant,
    last_failure: Option<Instant>,
    rejected_by: PluginSet,
    parked_at: Instant,
    /// Bumped on every move; heap items of an older generation are stale.
    generation: u64,
    /// The event sequence number when the pod was popped (while in flight).
    popped_at: u64,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveItem {
    priority: i32,
    order: Reverse<u64>,
    uid: PodUid,
    generation: u64,
}

/// Higher priority first, then earlier arrival (`order` is unique per push); the uid and
/// generation complete the order so that it agrees with `Eq`, as a heap's `Ord` must.
impl Ord for ActiveItem {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.priority, &self.order, &self.uid, self.generation).cmp(&(
            other.priority,
            &other.order,
            &other.uid,
            other.generation,
        ))
    }
}

impl PartialOrd for ActiveItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<PodUid, Entry>,
    active: BinaryHeap<ActiveItem>,
    backoff: BinaryHeap<Reverse<(Instant, u64, PodUid)>>,
    unschedulable: HashSet<PodUid>,
    sizes: QueueSizes,
    counter: u64,
    /// Events seen while pods were in flight, with their sequence numbers.
    events: VecDeque<(u64, Arc<ClusterEvent>)>,
    event_seq: u64,
    /// popped_at -> pods in flight popped then.
    in_flight: BTreeMap<u64, usize>,
    last_flush: Option<Instant>,
    closed: bool,
}

impl State {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn size_of(&mut self, p: Place) -> &mut usize {
        match p {
            Place::Active => &mut self.sizes.active,
            Place::Backoff => &mut self.sizes.backoff,
            Place::Unschedulable => &mut self.sizes.unschedulable,
            Place::Gated => &mut self.sizes.gated,
            Place::InFlight => &mut self.sizes.in_flight,
        }
    }

    fn leave(&mut self, uid: &PodUid, from: Place, popped_at: u64) {
        *self.size_of(from) -= 1;
        match from {
            Place::Unschedulable => {
                self.unschedulable.remove(uid);
            }
            Place::InFlight => {
                if let Some(n) = self.in_flight.get_mut(&popped_at) {
                    *n -= 1;
                    if *n == 0 {
                        self.in_flight.remove(&popped_at);
                    }
                }
                self.prune_events();
            }
            _ => {}
        }
    }

    /// Moves the pod to `to` (it must be in the map), pushing heap items as needed.
    fn place(&mut self, uid: &PodUid, to: Place, now: Instant, config: &QueueConfig) {
        let generation = self.next();
        let event_seq = self.event_seq;
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        let from = e.place;
        let popped_at = e.popped_at;
        e.place = to;
        e.generation = generation;
        let priority = e.info.priority;
        let backoff_until = e
            .last_failure
            .map(|t| t + config.backoff(e.attempts))
            .unwrap_or(now);
        match to {
            Place::Active => e.activated = now,
            Place::Unschedulable => e.parked_at = now,
            Place::InFlight => e.popped_at = event_seq,
            _ => {}
        }
        self.leave(uid, from, popped_at);
        *self.size_of(to) += 1;
        match to {
            Place::Active => self.active.push(ActiveItem {
                priority,
                order: Reverse(generation),
                uid: uid.clone(),
                generation,
            }),
            Place::Backoff => self
                .backoff
                .push(Reverse((backoff_until, generation, uid.clone()))),
            Place::Unschedulable => {
                self.unschedulable.insert(uid.clone());
            }
            Place::InFlight => *self.in_flight.entry(event_seq).or_default() += 1,
            Place::Gated => {}
        }
    }

    /// Active if its back-off is over, else backoff.
    fn reactivate(&mut self, uid: &PodUid, now: Instant, config: &QueueConfig) {
        let Some(e) = self.entries.get(uid) else {
            return;
        };
        let until = e.last_failure.map(|t| t + config.backoff(e.attempts));
        let to = if until.is_some_and(|u| u > now) {
            Place::Backoff
        } else {
            Place::Active
        };
        self.place(uid, to, now, config);
    }

    fn prune_events(&mut self) {
        match self.in_flight.keys().next().copied() {
            None => self.events.clear(),
            Some(oldest) => {
                while self.events.front().is_some_and(|(seq, _)| *seq <= oldest) {
                    self.events.pop_front();
                }
            }
        }
    }

    fn flush_backoff(&mut self, now: Instant, config: &QueueConfig) {
        while let Some(Reverse((until, generation, uid))) = self.backoff.peek().cloned() {
            if until > now {
                break;
            }
            self.backoff.pop();
            let current = self
                .entries
                .get(&uid)
                .is_some_and(|e| e.place == Place::Backoff && e.generation == generation);
            if current {
                self.place(&uid, Place::Active, now, config);
            }
        }
    }

    fn flush_unschedulable(&mut self, now: Instant, config: &QueueConfig) {
        let stale: Vec<PodUid> = self
            .unschedulable
            .iter()
            .filter(|u| {
                self.entries
                    .get(*u)
                    .is_some_and(|e| now.duration_since(e.parked_at) >= config.max_in_unschedulable)
            })
            .cloned()
            .collect();
        for uid in stale {
            self.reactivate(&uid, now, config);
        }
    }

    fn next_backoff(&self) -> Option<Instant> {
        self.backoff.peek().map(|Reverse((t, _, _))| *t)
    }
}

/// The queue, shared by the informer handlers (producers) and the scheduling loop (the
/// consumer, which blocks in [`SchedulingQueue::pop`]).
#[derive(Debug, Default)]
pub struct SchedulingQueue {
    state: Mutex<State>,
    ready: Condvar,
    config: QueueConfig,
}

/// How often parked pods are checked against `max_in_unschedulable` (kube-scheduler: 30 s).
const FLUSH_EVERY: Duration = Duration::from_secs(30);
/// Longest a pop sleeps before re-checking (closing and back-off expiry also wake it).
const MAX_WAIT: Duration = Duration::from_secs(1);

impl SchedulingQueue {
    pub fn new(config: QueueConfig) -> SchedulingQueue {
        SchedulingQueue {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            config,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pending pod appeared (or was seen again at a relist).
    pub fn add(&self, info: Arc<PodInfo>) {
        let now = Instant::now();
        let mut st = self.lock();
        if st.entries.contains_key(&info.uid) {
            drop(st);
            return self.update(info);
        }
        let uid = info.uid.clone();
        let gated = info.gated();
        st.entries.insert(
            uid.clone(),
            Entry {
                info,
                place: Place::Gated,
                attempts: 0,
                first_queued: now,
                activated: now,
                last_failure: None,
                rejected_by: PluginSet::default(),
                parked_at: now,
                generation: 0,
                popped_at: 0,
            },
        );
        st.sizes.gated += 1;
        if !gated {
            st.place(&uid, Place::Active, now, &self.config);
            self.ready.notify_one();
        }
    }

    /// A pending pod changed.
    pub fn update(&self, info: Arc<PodInfo>) {
        let now = Instant::now();
        let mut st = self.lock();
        let uid = info.uid.clone();
        let Some(e) = st.entries.get_mut(&uid) else {
            drop(st);
            return self.add(info);
        };
        let old = std::mem::replace(&mut e.info, info.clone());
        match e.place {
            Place::Active if old.priority != info.priority => {
                st.place(&uid, Place::Active, now, &self.config)
            }
            Place::Unschedulable if info.spec_or_labels_changed(&old) => {
                st.reactivate(&uid, now, &self.config);
                self.ready.notify_one();
            }
            Place::Gated if !info.gated() => {
                st.place(&uid, Place::Active, now, &self.config);
                self.ready.notify_one();
            }
            _ => {}
        }
    }

    /// A pending pod was deleted, or bound (it is no longer pending).
    pub fn delete(&self, uid: &PodUid) {
        let mut st = self.lock();
        if let Some(e) = st.entries.remove(uid) {
            st.leave(uid, e.place, e.popped_at);
        }
    }

    /// The next pod to schedule; blocks until one is ready. None once the queue is closed or
    /// `stop` says so (checked at least every second).
    pub fn pop(&self, stop: &dyn Fn() -> bool) -> Option<QueuedPod> {
        let mut st = self.lock();
        loop {
            if st.closed || stop() {
                return None;
            }
            let now = Instant::now();
            st.flush_backoff(now, &self.config);
            if st
                .last_flush
                .is_none_or(|t| now.duration_since(t) >= FLUSH_EVERY)
            {
                st.flush_unschedulable(now, &self.config);
                st.last_flush = Some(now);
            }
            while let Some(item) = st.active.pop() {
                let current = st
                    .entries
                    .get(&item.uid)
                    .is_some_and(|e| e.place == Place::Active && e.generation == item.generation);
                if !current {
                    continue;
                }
                st.place(&item.uid, Place::InFlight, now, &self.config);
                let Some(e) = st.entries.get_mut(&item.uid) else {
                    continue;
                };
                e.attempts += 1;
                return Some(QueuedPod {
                    info: e.info.clone(),
                    attempts: e.attempts,
                    first_queued: e.first_queued,
                    activated: e.activated,
                });
            }
            let wait = st
                .next_backoff()
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(MAX_WAIT)
                .min(MAX_WAIT);
            st = self
                .ready
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The pod's cycle found no node: park it, unless an event seen while it was in flight
    /// could help (then it backs off and retries).
    pub fn requeue_unschedulable(&self, uid: &PodUid, rejected_by: PluginSet) {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(e) = st
            .entries
            .get_mut(uid)
            .filter(|e| e.place == Place::InFlight)
        else {
            return;
        };
        e.last_failure = Some(now);
        e.rejected_by = rejected_by;
        let popped_at = e.popped_at;
        let info = e.info.clone();
        let missed = st
            .events
            .iter()
            .filter(|(seq, _)| *seq > popped_at)
            .any(|(_, ev)| could_help(&info, rejected_by, ev));
        if missed {
            st.place(uid, Place::Backoff, now, &self.config);
        } else {
            st.place(uid, Place::Unschedulable, now, &self.config);
        }
        self.ready.notify_one();
    }

    /// The pod's cycle failed for another reason (an API error while binding): retry after
    /// its back-off.
    pub fn requeue_backoff(&self, uid: &PodUid) {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(e) = st
            .entries
            .get_mut(uid)
            .filter(|e| e.place == Place::InFlight)
        else {
            return;
        };
        e.last_failure = Some(now);
        e.rejected_by = PluginSet::default();
        st.place(uid, Place::Backoff, now, &self.config);
        self.ready.notify_one();
    }

    /// The pod's node is chosen but its volumes are not bound yet (VolumeBinding's
    /// PreBind handed them to a provisioner): park it without a failure or back-off until
    /// an event about its claims, or at once if one came while it was in flight.
    pub fn wait_for_volumes(&self, uid: &PodUid) {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(e) = st
            .entries
            .get_mut(uid)
            .filter(|e| e.place == Place::InFlight)
        else {
            return;
        };
        let rejected_by = PluginSet::of(&[super::framework::Plugin::VolumeBinding]);
        e.last_failure = None;
        e.attempts = 0;
        e.rejected_by = rejected_by;
        let popped_at = e.popped_at;
        let info = e.info.clone();
        let missed = st
            .events
            .iter()
            .filter(|(seq, _)| *seq > popped_at)
            .any(|(_, ev)| could_help(&info, rejected_by, ev));
        let to = if missed {
            Place::Active
        } else {
            Place::Unschedulable
        };
        st.place(uid, to, now, &self.config);
        self.ready.notify_one();
    }

    /// An event about some pods only (`uids`, e.g. the pods using one claim): those of
    /// them parked that it could help move on (O(uids), not O(parked)); pods in flight see
    /// it if they fail.
    pub fn on_event_for(&self, uids: &[PodUid], event: ClusterEvent) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        st.event_seq += 1;
        let seq = st.event_seq;
        let event = Arc::new(event);
        if !st.in_flight.is_empty() {
            st.events.push_back((seq, event.clone()));
        }
        let helped: Vec<PodUid> = uids
            .iter()
            .filter(|u| {
                st.entries.get(*u).is_some_and(|e| {
                    e.place == Place::Unschedulable && could_help(&e.info, e.rejected_by, &event)
                })
            })
            .cloned()
            .collect();
        for uid in &helped {
            st.reactivate(uid, now, &self.config);
        }
        if !helped.is_empty() {
            self.ready.notify_one();
        }
        helped.len()
    }

    /// A parked pod failed after all (its volume could not be provisioned): retry it after
    /// its back-off. Returns the pod, None if it is not parked.
    pub fn fail_parked(&self, uid: &PodUid) -> Option<Arc<PodInfo>> {
        let now = Instant::now();
        let mut st = self.lock();
        let e = st
            .entries
            .get_mut(uid)
            .filter(|e| matches!(e.place, Place::Unschedulable | Place::Active))?;
        e.last_failure = Some(now);
        e.attempts = e.attempts.max(1);
        e.rejected_by = PluginSet::default();
        let info = e.info.clone();
        st.place(uid, Place::Backoff, now, &self.config);
        self.ready.notify_one();
        Some(info)
    }

    /// The pod was bound: it leaves the queue.
    pub fn done(&self, uid: &PodUid) {
        let mut st = self.lock();
        if st
            .entries
            .get(uid)
            .is_some_and(|e| e.place == Place::InFlight)
        {
            if let Some(e) = st.entries.remove(uid) {
                st.leave(uid, e.place, e.popped_at);
            }
        }
    }

    /// A cluster event: parked pods that it could help move to backoff or active; pods in
    /// flight will see it if they fail.
    pub fn on_event(&self, event: ClusterEvent) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        st.event_seq += 1;
        let seq = st.event_seq;
        let event = Arc::new(event);
        if !st.in_flight.is_empty() {
            st.events.push_back((seq, event.clone()));
        }
        let helped: Vec<PodUid> = st
            .unschedulable
            .iter()
            .filter(|u| {
                st.entries
                    .get(*u)
                    .is_some_and(|e| could_help(&e.info, e.rejected_by, &event))
            })
            .cloned()
            .collect();
        for uid in &helped {
            st.reactivate(uid, now, &self.config);
        }
        if !helped.is_empty() {
            self.ready.notify_one();
        }
        helped.len()
    }

    /// Where a pod waits (None: not pending).
    pub fn place_of(&self, uid: &PodUid) -> Option<Place> {
        self.lock().entries.get(uid).map(|e| e.place)
    }

    pub fn sizes(&self) -> QueueSizes {
        self.lock().sizes
    }

    /// Wakes a blocked pop so it re-checks its stop condition.
    pub fn wake(&self) {
        self.ready.notify_all();
    }

    /// Ends every pop for good.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Plugin;
    use crate::scheduler::testing::{node, pod, pod_requesting};
    use proptest::prelude::*;
    use serde_json::json;

    /// The active heap's order is total (and agrees with Eq) on items that collide in
    /// priority and generation.
    #[test]
    fn active_order_is_total() {
        let mut items = Vec::new();
        for i in 0..24u64 {
            items.push(ActiveItem {
                priority: (i % 3) as i32,
                order: Reverse(i / 2),
                uid: PodUid(Arc::from(format!("uid-{}", i % 5).as_str())),
                generation: i % 2,
            });
        }
        skiff_tests::order::assert_total_order(&items, |a, b| a.cmp(b));
        for a in &items {
            for b in &items {
                assert_eq!(a == b, a.cmp(b) == Ordering::Equal);
            }
        }
    }

    fn fast() -> QueueConfig {
        QueueConfig {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(80),
            max_in_unschedulable: Duration::from_secs(300),
        }
    }

    fn never() -> bool {
        false
    }

    fn prio(name: &str, priority: i32) -> Arc<PodInfo> {
        pod(
            json!({"metadata": {"name": name}, "spec": {"priority": priority,
            "containers": [{"name": "c", "image": "i"}]}}),
        )
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = QueueConfig::default();
        let secs: Vec<u64> = (1..=6).map(|a| c.backoff(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn higher_priority_first_then_fifo() {
        let q = SchedulingQueue::new(fast());
        q.add(prio("low", 0));
        q.add(prio("high", 100));
        q.add(prio("low2", 0));
        let order: Vec<String> = (0..3)
            .map(|_| q.pop(&never).unwrap().info.name().to_string())
            .collect();
        assert_eq!(order, ["high", "low", "low2"]);
        assert_eq!(q.sizes().in_flight, 3);
    }

    #[test]
    fn unschedulable_pods_wait_for_an_event_that_helps() {
        let q = SchedulingQueue::new(fast());
        let p = pod_requesting("big", "8", "");
        q.add(p.clone());
        let got = q.pop(&never).unwrap();
        assert_eq!(got.attempts, 1);
        q.requeue_unschedulable(&p.uid, PluginSet::of(&[Plugin::NodeResourcesFit]));
        assert_eq!(q.place_of(&p.uid), Some(Place::Unschedulable));
        // A small node does not help; a big one does.
        let small = node("s", "2", "1Gi", json!({}), json!({}));
        assert_eq!(q.on_event(ClusterEvent::NodeAdded(small)), 0);
        assert_eq!(q.place_of(&p.uid), Some(Place::Unschedulable));
        let big = node("b", "16", "1Gi", json!({}), json!({}));
        assert_eq!(q.on_event(ClusterEvent::NodeAdded(big)), 1);
        assert_eq!(
            q.place_of(&p.uid),
            Some(Place::Backoff),
            "still backing off"
        );
        let again = q.pop(&never).unwrap();
        assert_eq!(again.attempts, 2);
        assert!(again.first_queued <= again.activated);
        q.done(&p.uid);
        assert_eq!(q.place_of(&p.uid), None);
        assert_eq!(q.sizes(), QueueSizes::default());
    }

    #[test]
    fn pods_waiting_for_volumes_wake_on_their_claims_without_back_off() {
        let q = SchedulingQueue::new(fast());
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
        );
        q.add(p.clone());
        q.pop(&never).unwrap();
        q.wait_for_volumes(&p.uid);
        assert_eq!(q.place_of(&p.uid), Some(Place::Unschedulable));
        // Another claim's event, or one for pods other than this: nothing moves.
        let other = ClusterEvent::ClaimChanged("ns/other".into());
        assert_eq!(q.on_event_for(std::slice::from_ref(&p.uid), other), 0);
        let own = || ClusterEvent::ClaimChanged("ns/data".into());
        assert_eq!(q.on_event_for(&[], own()), 0);
        assert_eq!(q.place_of(&p.uid), Some(Place::Unschedulable));
        // Its own claim changed: straight to active (waiting is no failure).
        assert_eq!(q.on_event_for(std::slice::from_ref(&p.uid), own()), 1);
        assert_eq!(q.place_of(&p.uid), Some(Place::Active));
        // Its claim changing while it is in flight is not missed.
        q.pop(&never).unwrap();
        q.on_event_for(std::slice::from_ref(&p.uid), own());
        q.wait_for_volumes(&p.uid);
        assert_eq!(q.place_of(&p.uid), Some(Place::Active));
        // Provisioning failed: it backs off.
        q.pop(&never).unwrap();
        q.wait_for_volumes(&p.uid);
        assert!(q.fail_parked(&p.uid).is_some());
        assert_eq!(q.place_of(&p.uid), Some(Place::Backoff));
        assert!(q.fail_parked(&p.uid).is_none(), "only a parked pod fails");
    }

    #[test]
    fn an_event_during_the_cycle_is_not_missed() {
        let q = SchedulingQueue::new(fast());
        let p = pod_requesting("big", "8", "");
        q.add(p.clone());
        q.pop(&never).unwrap();
        // The node arrives while the pod is being evaluated against the old node list.
        q.on_event(ClusterEvent::NodeAdded(node(
            "b",
            "16",
            "1Gi",
            json!({}),
            json!({}),
        )));
        q.requeue_unschedulable(&p.uid, PluginSet::of(&[Plugin::NodeResourcesFit]));
        assert_eq!(q.place_of(&p.uid), Some(Place::Backoff));
    }

    #[test]
    fn gated_pods_wait_for_their_gates_to_go() {
        let q = SchedulingQueue::new(fast());
        let gated = pod(json!({"metadata": {"name": "g"}, "spec": {
            "schedulingGates": [{"name": "example.com/wait"}], "containers": [{"name": "c", "image": "i"}]}}));
        q.add(gated.clone());
        assert_eq!(q.place_of(&gated.uid), Some(Place::Gated));
        assert_eq!(q.sizes().gated, 1);
        q.update(pod(json!({"metadata": {"name": "g"}})));
        assert_eq!(q.place_of(&gated.uid), Some(Place::Active));
        assert_eq!(q.pop(&never).unwrap().info.name(), "g");
    }

    #[test]
    fn updated_unschedulable_pods_are_retried_and_deleted_ones_dropped() {
        let q = SchedulingQueue::new(fast());
        let p = pod(json!({"metadata": {"name": "p", "labels": {"v": "1"}}}));
        q.add(p.clone());
        q.pop(&never);
        q.requeue_unschedulable(&p.uid, PluginSet::of(&[Plugin::NodeAffinity]));
        q.update(pod(
            json!({"metadata": {"name": "p", "labels": {"v": "2"}}}),
        ));
        assert_ne!(q.place_of(&p.uid), Some(Place::Unschedulable));
        q.delete(&p.uid);
        assert_eq!(q.place_of(&p.uid), None);
        q.requeue_backoff(&p.uid);
        assert_eq!(q.sizes(), QueueSizes::default());
    }

    #[test]
    fn pop_returns_none_when_closed_or_stopped() {
        let q = Arc::new(SchedulingQueue::new(fast()));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(&never).is_none());
        q.close();
        assert!(t.join().unwrap());
        let q = SchedulingQueue::new(fast());
        assert!(q.pop(&|| true).is_none());
    }

    #[test]
    fn backed_off_pods_come_back_by_themselves() {
        let q = SchedulingQueue::new(fast());
        let p = pod(json!({"metadata": {"name": "p"}}));
        q.add(p.clone());
        q.pop(&never);
        q.requeue_backoff(&p.uid);
        let start = Instant::now();
        let again = q.pop(&never).unwrap();
        assert_eq!(again.attempts, 2);
        assert!(
            start.elapsed() >= Duration::from_millis(15),
            "waited for the back-off"
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add(u8),
        Delete(u8),
        PopThen(u8),
        Event,
    }

    proptest! {
        /// The sizes always add up to the pods in the queue, and no pod is lost: after
        /// enough events and pops every remaining pod can be popped.
        #[test]
        fn sizes_match_entries(ops in prop::collection::vec(prop_oneof![
            (0u8..8).prop_map(Op::Add),
            (0u8..8).prop_map(Op::Delete),
            (0u8..3).prop_map(Op::PopThen),
            Just(Op::Event),
        ], 1..80)) {
            let q = SchedulingQueue::new(QueueConfig {
                initial_backoff: Duration::ZERO,
                max_backoff: Duration::ZERO,
                max_in_unschedulable: Duration::from_secs(300),
            });
            let mut present = HashSet::new();
            for o in ops {
                match o {
                    Op::Add(i) => { q.add(pod(json!({"metadata": {"name": format!("p{i}")}}))); present.insert(i); }
                    Op::Delete(i) => { q.delete(&PodUid(Arc::from(format!("uid-p{i}").as_str()))); present.remove(&i); }
                    Op::PopThen(how) => {
                        if q.sizes().active > 0 {
                            let p = q.pop(&never).unwrap();
                            match how {
                                0 => { q.done(&p.info.uid); present.retain(|i| format!("p{i}") != p.info.name()); }
                                1 => q.requeue_backoff(&p.info.uid),
                                _ => q.requeue_unschedulable(&p.info.uid, PluginSet::of(&[Plugin::NodeResourcesFit])),
                            }
                        }
                    }
                    Op::Event => { q.on_event(ClusterEvent::PodDeleted(pod(json!({"metadata": {"name": "x"}})))); }
                }
                let s = q.sizes();
                prop_assert_eq!(s.active + s.backoff + s.unschedulable + s.gated + s.in_flight, present.len());
            }
            q.on_event(ClusterEvent::PodDeleted(pod(json!({"metadata": {"name": "x"}}))));
            let mut popped = 0;
            while q.sizes().in_flight < present.len() {
                prop_assert!(q.pop(&never).is_some());
                popped += 1;
                prop_assert!(popped <= present.len());
            }
        }
    }
}
