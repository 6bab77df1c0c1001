//! The agent's Events, written as the kubelet's recorder writes them (client-go's
//! EventCorrelator): an event identical to one already written (same involved object and
//! field path, type, reason, message, source) bumps that Event's `count` and `lastTimestamp`
//! instead of adding an object; more than ten events in ten minutes that differ only in their
//! message become one "(combined from similar events)" Event; and each object gets a token
//! bucket (25 events, then one per five minutes), so a crash-looping pod cannot flood the API.
//! `kubectl describe` then shows `3s (x5 over 20s)`. The correlation is pure
//! ([`Correlator`]); [`run`] applies its outcomes through the API, one at a time, in order.

use crate::metrics::Metrics;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// The correlator's limits (client-go's defaults in [`Limits::default`]).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Entries each cache keeps (least recently used ones go first).
    pub cache_entries: usize,
    /// Distinct messages of similar events before they are combined into one Event...
    pub similar_messages: usize,
    /// ...within this window since the last of them.
    pub similar_window: Duration,
    /// Events an object may get at once...
    pub burst: u32,
    /// ...then one per this interval.
    pub refill: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cache_entries: 4096,
            similar_messages: 10,
            similar_window: Duration::from_secs(600),
            burst: 25,
            refill: Duration::from_secs(300),
        }
    }
}

/// What to do with one event.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Write a new Event object.
    Create(Event),
    /// Update the Event already written under `event`'s name: its count, lastTimestamp and
    /// message (`event` is complete, to be created again if that one is gone).
    Update(Event),
    /// Dropped: the object's rate limit is spent (the occurrence is still counted).
    Skip,
}

/// A map that forgets its least recently used entry beyond a capacity.
struct Lru<K, V> {
    capacity: usize,
    map: HashMap<K, (V, u64)>,
    /// Keys by last use; stale positions are skipped lazily.
    order: VecDeque<(K, u64)>,
    tick: u64,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            map: HashMap::new(),
            order: VecDeque::new(),
            tick: 0,
        }
    }

    /// The entry for `key`, created by `new` if absent; marks it used.
    fn entry(&mut self, key: &K, new: impl FnOnce() -> V) -> &mut V {
        self.tick += 1;
        let tick = self.tick;
        if !self.map.contains_key(key) {
            while self.map.len() >= self.capacity {
                let Some((old, at)) = self.order.pop_front() else {
                    break;
                };
                if self.map.get(&old).is_some_and(|(_, t)| *t == at) {
                    self.map.remove(&old);
                }
            }
        }
        self.order.push_back((key.clone(), tick));
        if self.order.len() > 2 * self.capacity + 16 {
            // Drop stale positions so the queue stays proportional to the map.
            let map = &self.map;
            self.order.retain(|(k, t)| {
                if k == key {
                    *t == tick
                } else {
                    map.get(k).is_some_and(|(_, at)| at == t)
                }
            });
        }
        let slot = self.map.entry(key.clone()).or_insert_with(|| (new(), tick));
        slot.1 = tick;
        &mut slot.0
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Messages seen recently for events alike but for their message.
struct Similar {
    messages: HashSet<String>,
    last: Instant,
}

/// The Event last written for an event key.
struct Written {
    name: String,
    count: i32,
    first_timestamp: Option<Time>,
}

/// A token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Correlates a node's events before they are written (see the module docs).
pub struct Correlator {
    limits: Limits,
    similar: Lru<String, Similar>,
    written: Lru<String, Written>,
    buckets: Lru<String, Bucket>,
}

fn text(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

/// The object and source an event is about: the spam filter's key.
fn object_key(e: &Event) -> String {
    let o = &e.involved_object;
    let source = e.source.clone().unwrap_or_default();
    [
        text(&source.component),
        text(&source.host),
        text(&o.kind),
        text(&o.namespace),
        text(&o.name),
        text(&o.uid),
        text(&o.api_version),
    ]
    .join("\u{0}")
}

/// Events alike but for their message (client-go's EventAggregatorByReasonFunc).
fn similar_key(e: &Event) -> String {
    [
        object_key(e).as_str(),
        text(&e.type_),
        text(&e.reason),
        text(&e.reporting_component),
        text(&e.reporting_instance),
    ]
    .join("\u{0}")
}

/// Identical events (client-go's getEventKey).
fn identity_key(e: &Event) -> String {
    [
        object_key(e).as_str(),
        text(&e.involved_object.field_path),
        text(&e.type_),
        text(&e.reason),
        text(&e.message),
    ]
    .join("\u{0}")
}

impl Correlator {
    pub fn new(limits: Limits) -> Correlator {
        let n = limits.cache_entries;
        Correlator {
            limits,
            similar: Lru::new(n),
            written: Lru::new(n),
            buckets: Lru::new(n),
        }
    }

    /// Decides what becomes of `event` (complete, with a fresh name and its timestamps),
    /// observed at `now`.
    pub fn correlate(&mut self, mut event: Event, now: Instant) -> Outcome {
        let key = if self.too_many_similar(&event, now) {
            event.message = Some(format!(
                "(combined from similar events): {}",
                text(&event.message)
            ));
            similar_key(&event)
        } else {
            identity_key(&event)
        };
        let fresh = Written {
            name: text(&event.metadata.name).to_string(),
            count: 0,
            first_timestamp: event.first_timestamp.clone(),
        };
        let written = self.written.entry(&key, || fresh);
        // Counted even when the rate limit drops it: the next write carries the true count.
        written.count += 1;
        let update = written.count > 1;
        event.metadata.name = Some(written.name.clone());
        event.count = Some(written.count);
        event.first_timestamp = written.first_timestamp.clone();
        if !self.take_token(&object_key(&event), now) {
            return Outcome::Skip;
        }
        if update {
            Outcome::Update(event)
        } else {
            Outcome::Create(event)
        }
    }

    /// Records the event's message among its similar events'; true once there are too many.
    fn too_many_similar(&mut self, event: &Event, now: Instant) -> bool {
        let (limit, window) = (self.limits.similar_messages, self.limits.similar_window);
        let similar = self.similar.entry(&similar_key(event), || Similar {
            messages: HashSet::new(),
            last: now,
        });
        if now.saturating_duration_since(similar.last) > window {
            similar.messages.clear();
        }
        similar.last = now;
        similar.messages.insert(text(&event.message).to_string());
        if similar.messages.len() < limit {
            return false;
        }
        // Keep the set below its limit: only whether a new message reaches it matters.
        if let Some(any) = similar.messages.iter().next().cloned() {
            similar.messages.remove(&any);
        }
        true
    }

    /// Takes one of the object's tokens, if it has one left.
    fn take_token(&mut self, object: &String, now: Instant) -> bool {
        let (burst, refill) = (f64::from(self.limits.burst), self.limits.refill);
        let bucket = self.buckets.entry(object, || Bucket {
            tokens: burst,
            at: now,
        });
        let earned = now.saturating_duration_since(bucket.at).as_secs_f64() / refill.as_secs_f64();
        bucket.tokens = (bucket.tokens + earned).min(burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }
}

/// Writes the events `rx` delivers, correlated, until the channel closes.
pub async fn run(client: Client, mut rx: mpsc::UnboundedReceiver<Event>, metrics: &Metrics) {
    let mut correlator = Correlator::new(Limits::default());
    while let Some(event) = rx.recv().await {
        match correlator.correlate(event, Instant::now()) {
            Outcome::Create(e) => create(&client, e, metrics).await,
            Outcome::Update(e) => update(&client, e, metrics).await,
            Outcome::Skip => {
                metrics.events_dropped.inc();
                debug!("event dropped: the object's event rate limit is spent");
            }
        }
    }
}

fn api(client: &Client, e: &Event) -> Api<Event> {
    Api::namespaced(client.clone(), text(&e.metadata.namespace))
}

async fn create(client: &Client, e: Event, metrics: &Metrics) {
    match api(client, &e).create(&PostParams::default(), &e).await {
        Ok(_) => {
            metrics.events_sent.inc();
        }
        Err(err) => {
            metrics.api_errors.inc();
            warn!(reason = text(&e.reason), error = %err, "writing an event failed");
        }
    }
}

/// Patches count, lastTimestamp and message of the Event written before; creates it again
/// if it is gone (deleted or expired), as client-go does.
async fn update(client: &Client, e: Event, metrics: &Metrics) {
    let patch = serde_json::json!({
        "count": e.count,
        "lastTimestamp": e.last_timestamp,
        "message": e.message,
    });
    let name = text(&e.metadata.name).to_string();
    match api(client, &e)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            metrics.events_aggregated.inc();
        }
        Err(kube::Error::Api(s)) if s.code == 404 => create(client, e, metrics).await,
        Err(err) => {
            metrics.api_errors.inc();
            warn!(reason = text(&e.reason), error = %err, "updating an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    /// An event about `pod`, named and stamped as if emitted at second `t`.
    fn event(pod: &str, field: &str, reason: &str, message: &str, t: i64) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{pod}.{t}")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{pod}")),
                field_path: Some(field.into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some("node-1".into()),
            }),
            first_timestamp: Some(at(t)),
            last_timestamp: Some(at(t)),
            ..Default::default()
        }
    }

    fn written(o: Outcome) -> (bool, Event) {
        match o {
            Outcome::Create(e) => (false, e),
            Outcome::Update(e) => (true, e),
            Outcome::Skip => panic!("skipped"),
        }
    }

    #[test]
    fn identical_events_update_one_event() {
        let mut c = Correlator::new(Limits::default());
        let t0 = Instant::now();
        let (update, first) = written(c.correlate(
            event("p", "spec.containers{c}", "BackOff", "Back-off", 0),
            t0,
        ));
        assert!(!update);
        assert_eq!(first.count, Some(1));
        for n in 2..=5 {
            let (update, e) = written(c.correlate(
                event("p", "spec.containers{c}", "BackOff", "Back-off", n),
                t0 + Duration::from_secs(n as u64),
            ));
            assert!(update);
            assert_eq!(e.metadata.name, first.metadata.name, "the same object");
            assert_eq!(e.count, Some(n as i32));
            assert_eq!(e.first_timestamp, Some(at(0)));
            assert_eq!(e.last_timestamp, Some(at(n)));
        }
        // Another container, or another message, is another Event.
        let (update, _) = written(c.correlate(
            event("p", "spec.containers{d}", "BackOff", "Back-off", 9),
            t0,
        ));
        assert!(!update);
        let (update, _) =
            written(c.correlate(event("p", "spec.containers{c}", "BackOff", "other", 9), t0));
        assert!(!update);
    }

    #[test]
    fn many_similar_messages_are_combined() {
        let mut c = Correlator::new(Limits::default());
        let t0 = Instant::now();
        for i in 0..9 {
            let (update, e) = written(c.correlate(
                event("p", "", "Unhealthy", &format!("probe failed: {i}"), i),
                t0,
            ));
            assert!(!update);
            assert_eq!(e.message.unwrap(), format!("probe failed: {i}"));
        }
        let (update, combined) =
            written(c.correlate(event("p", "", "Unhealthy", "probe failed: 9", 9), t0));
        assert!(!update);
        assert_eq!(
            combined.message.as_deref(),
            Some("(combined from similar events): probe failed: 9")
        );
        let (update, again) =
            written(c.correlate(event("p", "", "Unhealthy", "probe failed: 10", 10), t0));
        assert!(update, "later similar events update the combined one");
        assert_eq!(again.metadata.name, combined.metadata.name);
        assert_eq!(again.count, Some(2));
        // Ten minutes of quiet start over.
        let later = t0 + Duration::from_secs(601);
        let (_, fresh) =
            written(c.correlate(event("p", "", "Unhealthy", "probe failed: 11", 11), later));
        assert_eq!(fresh.message.as_deref(), Some("probe failed: 11"));
    }

    #[test]
    fn each_object_is_rate_limited_and_skipped_events_still_count() {
        let mut c = Correlator::new(Limits::default());
        let t0 = Instant::now();
        for i in 0..25 {
            assert_ne!(
                c.correlate(event("p", "", "BackOff", "b", i), t0),
                Outcome::Skip
            );
        }
        assert_eq!(
            c.correlate(event("p", "", "BackOff", "b", 25), t0),
            Outcome::Skip
        );
        assert_ne!(
            c.correlate(event("q", "", "BackOff", "b", 25), t0),
            Outcome::Skip,
            "another object has its own bucket"
        );
        // One token back after five minutes.
        let later = t0 + Duration::from_secs(300);
        let (update, e) = written(c.correlate(event("p", "", "BackOff", "b", 26), later));
        assert!(update);
        assert_eq!(e.count, Some(27), "the skipped occurrence is counted");
        assert_eq!(
            c.correlate(event("p", "", "BackOff", "b", 27), later),
            Outcome::Skip
        );
    }

    #[test]
    fn caches_forget_the_least_recently_used() {
        let mut lru: Lru<&str, i32> = Lru::new(2);
        *lru.entry(&"a", || 1) += 10;
        lru.entry(&"b", || 2);
        assert_eq!(*lru.entry(&"a", || 0), 11, "a is used again");
        lru.entry(&"c", || 3);
        assert_eq!(lru.len(), 2);
        assert_eq!(*lru.entry(&"a", || 0), 11, "b went, not a");
        assert_eq!(*lru.entry(&"b", || 0), 0, "b starts over");
        for i in 0..100 {
            lru.entry(&"a", || i);
        }
        assert!(lru.order.len() <= 2 * 2 + 16 + 1);
    }
}
