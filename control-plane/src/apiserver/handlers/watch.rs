//! watch: a chunked stream of `{"type":...,"object":...}` lines, one per event, served from
//! the watch cache. Starts from the current state (synthetic ADDED events; with
//! sendInitialEvents, followed by the initial-events-end BOOKMARK) or after a resourceVersion
//! still in the cache's history (410 Expired, as an ERROR event, when it is not). Bookmarks,
//! timeoutSeconds, label and field selectors, and Table events for `kubectl get -w`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Call, Ctx};
use crate::apiserver::negotiate::{self, Output};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry::Resource;
use crate::apiserver::request::{ListOptions, ReadAt};
use crate::apiserver::{conversion, rules, table};
use crate::machinery::ApiError;
use crate::store::cache::{CacheError, CacheWatch, WatchEnd, WatchEvent, WatchStart};
use crate::store::Revision;

/// Lines a watcher's connection may have queued before the watch waits for it.
const LINES_BUFFERED: usize = 64;

pub async fn watch(ctx: &Arc<Ctx>, call: &Call<'_>, opts: ListOptions) -> Result<Resp, ApiError> {
    let r = call.resource;
    let sel = rules::selection(
        r,
        call.namespace(),
        opts.label_selector.as_deref(),
        opts.field_selector.as_deref(),
    )?;
    let start = match opts.read_at()? {
        ReadAt::Latest => {
            ctx.fresh().await?;
            WatchStart::Current
        }
        ReadAt::Any => {
            ctx.cache_ready()?;
            WatchStart::Current
        }
        ReadAt::NotOlderThan(n) if opts.send_initial_events => {
            ctx.at_least(Revision(n)).await?;
            WatchStart::Current
        }
        ReadAt::NotOlderThan(n) => {
            // The cache must have applied everything up to n, or changes the client has
            // already seen would arrive again as live events.
            ctx.at_least(Revision(n)).await?;
            WatchStart::After(Revision(n))
        }
    };
    let out = negotiate::output(
        call.header(header::ACCEPT),
        call.query.get("includeObject").map(String::as_str),
    );
    let index = sel.index.as_ref().map(|(f, v)| (*f, v.as_str()));
    let cache = ctx.resource_cache(r)?;
    let (tx, rx) = mpsc::channel::<Bytes>(LINES_BUFFERED);
    match cache.watch(
        &r.namespace_prefix(call.namespace()),
        start,
        sel.filter.clone(),
        index,
    ) {
        Ok(w) => {
            let stream = Stream {
                ctx: ctx.clone(),
                resource: r,
                output: out,
                bookmarks: opts.allow_bookmarks,
                initial_events_end: opts.send_initial_events,
                tx,
            };
            ctx.metrics.watch_started(r.plural);
            let timeout = opts.timeout;
            tokio::spawn(async move {
                let plural = stream.resource.plural;
                let metrics = stream.ctx.metrics.clone();
                match timeout {
                    Some(t) => {
                        let _ = tokio::time::timeout(t, stream.run(w)).await;
                    }
                    None => stream.run(w).await,
                }
                metrics.watch_ended(plural);
            });
        }
        Err(CacheError::Expired { requested, oldest }) => {
            let status = output::error(&ApiError::expired(format!(
                "too old resource version: {requested} ({oldest})"
            )));
            let Ok(body) = status.into_body().collect().await;
            let _ = tx.try_send(line("ERROR", &body.to_bytes()));
        }
        Err(e) => return Err(ApiError::internal(e)),
    }
    let body =
        StreamBody::new(ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b))));
    let mut resp = Response::new(body.boxed_unsync());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(output::JSON),
    );
    Ok(resp)
}

/// What a sendInitialEvents watch sends before its initial-events-end bookmark, and that
/// bookmark's revision: the synthetic ADDED events of the state the watch started from and
/// the revision of that state, both taken when the watch started (under the resource's lock).
/// Nothing the cache applies later changes either: live events are all newer than the
/// revision, so none is covered by a bookmark sent before it. (Reading the cache's revision
/// at the time the bookmark is sent would cover a change applied after the events were
/// taken, and that change would then come after the bookmark.) `meanwhile` runs between
/// taking the events and reading the revision, where a test writes.
async fn initial_events(
    w: &mut CacheWatch,
    meanwhile: impl std::future::Future<Output = ()>,
) -> (Vec<WatchEvent>, Revision) {
    let events = std::iter::from_fn(|| w.next_initial()).collect();
    meanwhile.await;
    (events, w.initial_revision())
}

/// `{"type":"<kind>","object":<object>}\n`
fn line(kind: &str, object: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(object.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(object);
    b.extend_from_slice(b"}\n");
    Bytes::from(b)
}

struct Stream {
    ctx: Arc<Ctx>,
    resource: &'static Resource,
    output: Output,
    bookmarks: bool,
    initial_events_end: bool,
    tx: mpsc::Sender<Bytes>,
}

impl Stream {
    async fn run(self, mut w: CacheWatch) {
        if self.initial_events_end {
            let (events, rev) = initial_events(&mut w, std::future::ready(())).await;
            for e in &events {
                if !self.send_event(e).await {
                    return;
                }
            }
            let mut b = self.bookmark(rev);
            b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            if !self.send("BOOKMARK", &b).await {
                return;
            }
        }
        let mut tick = tokio::time::interval(self.ctx.bookmark_interval);
        tick.tick().await;
        // The newest revision sent: a bookmark never goes back behind it.
        let mut sent = w.initial_revision();
        loop {
            tokio::select! {
                e = w.next() => match e {
                    Ok(e) => {
                        sent = sent.max(e.object().revision);
                        if !self.send_event(&e).await { return }
                    }
                    Err(end) => return self.end(end).await,
                },
                _ = tick.tick(), if self.bookmarks => {
                    // Everything up to the cache's revision must be sent before a bookmark
                    // says so, or a watch resumed from it could miss events. (A change is
                    // broadcast just before its revision is published, so the drain may
                    // also send one newer than `rev`.)
                    let rev = self.ctx.cache.revision();
                    while let Some(e) = w.try_next() {
                        match e {
                            Ok(e) => {
                                sent = sent.max(e.object().revision);
                                if !self.send_event(&e).await { return }
                            }
                            Err(end) => return self.end(end).await,
                        }
                    }
                    let b = self.bookmark(rev.max(sent));
                    if !self.send("BOOKMARK", &b).await { return }
                }
                _ = self.ctx.shutdown.cancelled() => return,
                _ = self.tx.closed() => return,
            }
        }
    }

    fn bookmark(&self, rev: Revision) -> Value {
        json!({
            "kind": self.resource.kind,
            "apiVersion": self.resource.api_version(),
            "metadata": {"resourceVersion": rev.to_string()},
        })
    }

    async fn end(&self, end: WatchEnd) {
        let e = match end {
            WatchEnd::TooSlow => {
                ApiError::expired("the watcher fell behind; relist and watch again")
            }
            WatchEnd::Closed if self.ctx.shutdown.is_cancelled() => return,
            // The cache reloaded from the store: the changes since this watcher's revision are
            // not known one by one.
            WatchEnd::Closed => ApiError::expired(
                "the watch cache was reloaded from the store; relist and watch again",
            ),
        };
        let status = output::error(&e);
        let Ok(c) = status.into_body().collect().await;
        let _ = self.tx.send(line("ERROR", &c.to_bytes())).await;
    }

    async fn send(&self, kind: &str, v: &Value) -> bool {
        let b = serde_json::to_vec(v).unwrap_or_default();
        self.tx.send(line(kind, &b)).await.is_ok()
    }

    async fn send_event(&self, e: &WatchEvent) -> bool {
        let kind = match e {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
        };
        let o = e.object();
        let r = self.resource;
        let bytes = match self.output {
            Output::Object => match conversion::served(r, o) {
                Ok(json) => line(kind, &json),
                Err(_) => return true,
            },
            Output::Table(inc) => match conversion::served_value(r, o) {
                Ok(v) => {
                    let t = table::single(r, &v, inc);
                    line(kind, &serde_json::to_vec(&t).unwrap_or_default())
                }
                Err(_) => return true,
            },
        };
        self.ctx.metrics.watch_event(self.resource.plural);
        self.tx.send(bytes).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::cache::{Cache, CacheOptions, CacheSpec};
    use crate::store::redb::{RedbOptions, RedbStore};
    use crate::store::{Precondition, Store, WriteOp};

    const PREFIX: &str = "/registry/configmaps/";

    async fn put(store: &dyn Store, name: &str, v: &str) -> Revision {
        let cm = json!({"metadata": {"name": name, "namespace": "ns"}, "data": {"v": v}});
        store
            .write(WriteOp::Put {
                key: format!("{PREFIX}ns/{name}"),
                value: serde_json::to_vec(&cm).unwrap().into(),
                precondition: Precondition::Any,
            })
            .await
            .unwrap()
            .revision
    }

    /// A change the cache applies after the initial events were taken (while they are being
    /// sent) is sent after the initial-events-end bookmark, so the bookmark must not cover
    /// it: the write is made, and applied by the cache, between the two steps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_applied_after_the_initial_events_were_taken_comes_after_their_bookmark() {
        let d = tempfile::tempdir().unwrap();
        let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
        let spec = CacheSpec {
            prefix: PREFIX.into(),
            fields: vec![],
            indexed: vec![],
            field_fn: Arc::new(|_, _| None),
        };
        let cache = Cache::start(Arc::new(store.clone()), vec![spec], CacheOptions::default())
            .await
            .unwrap();
        put(&store, "a", "0").await;
        let rev = put(&store, "b", "0").await;
        cache.wait_for(rev, Duration::from_secs(10)).await.unwrap();
        let mut w = cache
            .resource(PREFIX)
            .unwrap()
            .watch(PREFIX, WatchStart::Current, Arc::new(|_| true), None)
            .unwrap();

        let mut written = Revision(0);
        let write = async {
            written = put(&store, "a", "1").await;
            cache
                .wait_for(written, Duration::from_secs(10))
                .await
                .unwrap();
        };
        let (events, bookmark) = initial_events(&mut w, write).await;
        assert!(written > rev, "the write was made: {written}");
        let initial: Vec<(&str, Revision)> = events
            .iter()
            .map(|e| (e.object().name.as_str(), e.object().revision))
            .collect();
        assert_eq!(initial.len(), 2, "{initial:?}");
        assert!(
            events
                .iter()
                .all(|e| matches!(e, WatchEvent::Added(_)) && e.object().revision <= bookmark),
            "{initial:?} after the bookmark at {bookmark}"
        );
        // The change comes next, after the bookmark: newer than it.
        let next = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("the change written meanwhile")
            .unwrap();
        assert!(matches!(next, WatchEvent::Modified(_)), "{next:?}");
        assert_eq!(next.object().revision, written);
        assert!(
            next.object().revision > bookmark,
            "the change at {written} is sent after a bookmark at {bookmark} that covers it"
        );
        store.close();
    }
}
