//! One etcd watch as the store's [`EventStream`]: opened on first poll from a revision over
//! the whole prefix, with previous values (so a delete carries the object's last state) and,
//! where etcd orders them, progress notifications: a response without events then says that
//! every change up to its header's revision has been delivered. A compacted start revision ends the stream with
//! [`StoreError::Compacted`]; a cancelled watch, a broken stream or a closed store with an
//! error, so the watch cache resumes or reloads.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use etcd_client::{WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::EtcdStore;
use crate::store::{Event, EventKind, EventStream, KeyValue, Revision, StoreError, WatchItem};

/// etcd's event types on the wire (mvccpb.Event.EventType).
const PUT: i32 = 0;
const DELETE: i32 = 1;

enum Phase {
    Start,
    Open {
        // Boxed: the stream is large and the other phases are empty.
        responses: Box<WatchResponseStream>,
        /// Stops the task that forwards progress requests when the watch is dropped.
        _requester: DropGuard,
    },
    Done,
}

struct State {
    store: EtcdStore,
    phase: Phase,
    /// The next revision this watch has not delivered yet.
    next: Revision,
    ready: VecDeque<WatchItem>,
}

pub(super) fn stream(store: EtcdStore, from: Revision) -> EventStream {
    let state = State {
        store,
        phase: Phase::Start,
        next: from,
        ready: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut s| async move {
        let item = s.next_item().await?;
        Some((item, s))
    })
    .boxed()
}

impl State {
    async fn next_item(&mut self) -> Option<Result<WatchItem, StoreError>> {
        loop {
            if let Some(i) = self.ready.pop_front() {
                return Some(Ok(i));
            }
            let closed = self.store.inner.closed.clone();
            match &mut self.phase {
                Phase::Done => return None,
                Phase::Start => {
                    let mut options = WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(self.next.0 as i64)
                        .with_prev_key();
                    if self.store.inner.ordered_progress {
                        options = options.with_progress_notify();
                    }
                    let client = self.store.inner.client.watch_client();
                    let key = self.store.full("/");
                    // (Sent again if it could not reach the member the client picked.)
                    let open = self.store.unsent_retried(|| {
                        let mut client = client.clone();
                        let (key, options) = (key.clone(), options.clone());
                        async move { client.watch(key, Some(options)).await }
                    });
                    let opened = tokio::select! {
                        o = open => o,
                        _ = closed.cancelled() => return self.fail(StoreError::Closed),
                    };
                    match opened {
                        Ok(w) => {
                            let (requests, responses) = w.split();
                            let stop = CancellationToken::new();
                            tokio::spawn(forward_progress_requests(
                                requests,
                                self.store.inner.progress.clone(),
                                stop.clone(),
                            ));
                            self.phase = Phase::Open {
                                responses: Box::new(responses),
                                _requester: stop.drop_guard(),
                            };
                        }
                        Err(e) => return self.fail(self.store.error(e)),
                    }
                }
                Phase::Open { responses, .. } => {
                    let message = tokio::select! {
                        m = responses.message() => m,
                        _ = closed.cancelled() => return self.fail(StoreError::Closed),
                    };
                    match message {
                        Ok(Some(resp)) => {
                            if let Err(e) = self.take(resp) {
                                return self.fail(e);
                            }
                        }
                        Ok(None) => {
                            return self.fail(StoreError::Unavailable(
                                "etcd ended the watch stream".into(),
                            ))
                        }
                        Err(e) => return self.fail(self.store.error(e)),
                    }
                }
            }
        }
    }

    fn fail(&mut self, e: StoreError) -> Option<Result<WatchItem, StoreError>> {
        self.phase = Phase::Done;
        Some(Err(e))
    }

    /// Queues what one response says.
    fn take(&mut self, resp: WatchResponse) -> Result<(), StoreError> {
        if resp.compact_revision() > 0 {
            let oldest = Revision(resp.compact_revision() as u64);
            self.store.compacted(oldest);
            return Err(StoreError::Compacted {
                requested: self.next,
                oldest,
            });
        }
        if resp.canceled() {
            return Err(StoreError::Unavailable(format!(
                "etcd cancelled the watch: {}",
                resp.cancel_reason()
            )));
        }
        let header = self.store.observe(resp.header());
        if resp.created() {
            return Ok(());
        }
        if resp.events().is_empty() {
            // Progress (asked for, or etcd's periodic notification of an idle watch), which
            // an etcd with issue 15220 may send before the events it covers: not trusted.
            if !self.store.inner.ordered_progress {
                return Ok(());
            }
            if header >= self.next {
                self.next = header.next();
            }
            self.ready.push_back(WatchItem::Progress(header));
            return Ok(());
        }
        for ev in resp.events() {
            let event = self.event(ev)?;
            self.next = event.revision().next();
            self.ready.push_back(WatchItem::Event(event));
        }
        Ok(())
    }

    fn event(&self, ev: &etcd_client::Event) -> Result<Event, StoreError> {
        let bad = |what: &str| StoreError::Backend(format!("etcd watch event: {what}"));
        let kv = ev.kv().ok_or_else(|| bad("no key-value"))?;
        let key = self
            .store
            .short(kv.key())
            .ok_or_else(|| bad("a key outside the prefix"))?;
        let mod_revision = Revision(kv.mod_revision().max(0) as u64);
        // The raw type: the client's accessor panics on a type it does not know.
        match ev.0.r#type {
            PUT => Ok(Event {
                kind: EventKind::Put,
                created: kv.create_revision() == kv.mod_revision(),
                kv: KeyValue {
                    key,
                    value: Bytes::copy_from_slice(kv.value()),
                    create_revision: Revision(kv.create_revision().max(0) as u64),
                    mod_revision,
                },
            }),
            DELETE => {
                // The last state (absent if etcd compacted it away: the cache then knows
                // only that the key is gone).
                let prev = ev.prev_kv();
                Ok(Event {
                    kind: EventKind::Delete,
                    created: false,
                    kv: KeyValue {
                        key,
                        value: prev.map_or_else(Bytes::new, |p| Bytes::copy_from_slice(p.value())),
                        create_revision: Revision(
                            prev.map_or(0, |p| p.create_revision().max(0) as u64),
                        ),
                        mod_revision,
                    },
                })
            }
            other => Err(bad(&format!("unknown event type {other}"))),
        }
    }
}

/// Sends a progress request on this watch's stream whenever the store is asked for one.
async fn forward_progress_requests(
    mut requests: WatchRequestSender,
    progress: Arc<Notify>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = progress.notified() => {
                if requests.request_progress().await.is_err() {
                    return;
                }
            }
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use etcd_client::proto::{PbEvent, PbKeyValue, PbResponseHeader, PbWatchResponse};

    use super::super::Inner;
    use super::*;
    use crate::store::Store;

    /// A store on the test etcd that trusts progress notifications or not, as it would for
    /// an etcd of a version that orders them or not (the test etcd's is older: this is how
    /// the trusted path gets exercised). The responses below are fed by hand: nothing here
    /// asks etcd for them.
    async fn store(ordered_progress: bool) -> EtcdStore {
        let real = EtcdStore::connect(&crate::store::contract_tests::etcd_config())
            .await
            .unwrap();
        EtcdStore {
            inner: Arc::new(Inner {
                client: real.inner.client.clone(),
                prefix: real.inner.prefix.clone(),
                current: AtomicU64::new(0),
                oldest: AtomicU64::new(1),
                progress: Arc::new(Notify::new()),
                ordered_progress,
                closed: CancellationToken::new(),
            }),
        }
    }

    fn response(store: &EtcdStore, revision: i64, puts: &[(&str, i64)]) -> WatchResponse {
        let events = puts
            .iter()
            .map(|(key, rev)| PbEvent {
                r#type: PUT,
                kv: Some(PbKeyValue {
                    key: store.full(key).into_bytes(),
                    value: b"{}".to_vec(),
                    create_revision: *rev,
                    mod_revision: *rev,
                    version: 1,
                    lease: 0,
                }),
                prev_kv: None,
            })
            .collect();
        WatchResponse(PbWatchResponse {
            header: Some(PbResponseHeader {
                revision,
                ..Default::default()
            }),
            events,
            ..Default::default()
        })
    }

    fn watch_from(store: &EtcdStore, from: u64) -> State {
        State {
            store: store.clone(),
            phase: Phase::Start,
            next: Revision(from),
            ready: VecDeque::new(),
        }
    }

    /// The revisions of what the watch delivers, in order (P: a progress notification).
    fn delivered(w: &mut State) -> Vec<String> {
        w.ready
            .drain(..)
            .map(|i| match i {
                WatchItem::Event(e) => format!("{}@{}", e.kv.key, e.revision()),
                WatchItem::Progress(r) => format!("P{r}"),
            })
            .collect()
    }

    /// What an etcd that orders progress notifications sends: the created response, events,
    /// a progress notification for writes the watch does not see (another prefix), more
    /// events. The progress is delivered in its place among the events, and the watch
    /// resumes after it (a watch reopened from `next` must not ask for what it covered again).
    #[tokio::test]
    async fn a_trusted_progress_notification_is_delivered_in_order_and_moves_the_watch_on() {
        let s = store(true).await;
        let mut w = watch_from(&s, 5);
        let mut created = response(&s, 4, &[]);
        created.0.created = true;
        w.take(created).unwrap();
        assert_eq!(delivered(&mut w), Vec::<String>::new());
        w.take(response(&s, 6, &[("/registry/a", 5), ("/registry/b", 6)]))
            .unwrap();
        assert_eq!(w.next, Revision(7));
        w.take(response(&s, 9, &[])).unwrap();
        assert_eq!(w.next, Revision(10));
        assert_eq!(s.current_revision(), Revision(9));
        w.take(response(&s, 10, &[("/registry/a", 10)])).unwrap();
        assert_eq!(
            delivered(&mut w),
            ["/registry/a@5", "/registry/b@6", "P9", "/registry/a@10"]
        );
        assert_eq!(w.next, Revision(11));
        // A progress notification behind what was delivered says nothing new: delivered as
        // it is (the cache keeps its newest revision), the watch stays where it is.
        w.take(response(&s, 8, &[])).unwrap();
        assert_eq!(delivered(&mut w), ["P8"]);
        assert_eq!(w.next, Revision(11));
    }

    /// Debian's etcd 3.4.23 may send a requested progress notification before events it
    /// covers (etcd issue 15220): it is dropped, and the watch stays after its last event.
    #[tokio::test]
    async fn an_untrusted_progress_notification_is_dropped() {
        let s = store(false).await;
        let mut w = watch_from(&s, 5);
        w.take(response(&s, 5, &[("/registry/a", 5)])).unwrap();
        w.take(response(&s, 9, &[])).unwrap();
        assert_eq!(w.next, Revision(6));
        w.take(response(&s, 9, &[("/registry/b", 9)])).unwrap();
        assert_eq!(delivered(&mut w), ["/registry/a@5", "/registry/b@9"]);
        assert_eq!(w.next, Revision(10));
    }
}
