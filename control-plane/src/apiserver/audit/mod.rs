//! The audit log (`--audit-log-path`): one audit.k8s.io/v1 Event a line for every request
//! (but the health probes), at Metadata level, as kube-apiserver writes it: who (the
//! authenticated user, the impersonated one), what (verb, request URI, the object), the
//! outcome (code, reason) and the authorization decision; for long-running requests (watch,
//! exec, attach, port-forward, proxy, log) a ResponseStarted event when the response starts
//! and a ResponseComplete one when its stream ends.
//!
//! Nothing on the request path waits for the disk: events go through a bounded queue to a
//! writer thread, which batches them, writes and rotates the file; when the queue is full
//! an event is dropped and counted (`skiff_apiserver_audit_events_dropped_total`), as
//! kube-apiserver's non-blocking mode does. [`Sink::flush`] writes and syncs what was queued
//! (the server calls it at shutdown).
//!
//! What a request learns on its way (the user, the impersonated user, the authorization
//! decision, admission's annotations) is recorded in a [`Trail`] that lives in the request's
//! task (a task-local, as the warnings), so nothing in between has to pass it along.
//!
//! Rooms: `event` (the record's shape), `log_file` (the file and its rotation).

pub mod event;
pub mod log_file;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use self::event::{Event, Stage, User};
use self::log_file::{Destination, LogFile, Rotation};
use super::auth::UserInfo;
use super::metrics::Metrics;
use super::output::{Body, Resp};
use http_body_util::BodyExt;

/// Events waiting for the writer; beyond this they are dropped (and counted).
pub const QUEUE: usize = 10_000;
/// How long shutdown waits for the writer to drain and sync.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The audit log's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub destination: Destination,
    pub rotation: Rotation,
}

enum Msg {
    Event(Box<Event>),
    /// Write and sync everything before this, then answer.
    Flush(mpsc::Sender<()>),
}

/// Where requests hand their events (cheap to clone). [`Sink::disabled`] when there is no
/// audit log: then nothing is recorded at all.
#[derive(Clone)]
pub struct Sink {
    tx: Option<SyncSender<Msg>>,
    metrics: Metrics,
}

/// Why the audit log cannot start.
#[derive(Debug, thiserror::Error)]
#[error("audit log {destination:?}: {source}")]
pub struct OpenError {
    destination: Destination,
    source: std::io::Error,
}

impl Sink {
    pub fn disabled(metrics: Metrics) -> Sink {
        Sink { tx: None, metrics }
    }

    /// Opens the log and starts its writer thread.
    pub fn start(config: &Config, metrics: Metrics) -> Result<Sink, OpenError> {
        let log =
            LogFile::open(&config.destination, config.rotation).map_err(|source| OpenError {
                destination: config.destination.clone(),
                source,
            })?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(log, rx, writer_metrics))
            .map_err(|source| OpenError {
                destination: config.destination.clone(),
                source,
            })?;
        Ok(Sink {
            tx: Some(tx),
            metrics,
        })
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues an event; never waits (a full queue drops it, counted).
    pub fn send(&self, event: Event) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Msg::Event(Box::new(event))) {
            Ok(()) => self.metrics.audit_event(),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.audit_dropped()
            }
        }
    }

    /// Writes and syncs every event queued so far (blocking; call off the async runtime).
    pub fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = mpsc::channel();
        if tx.send(Msg::Flush(done)).is_ok() && wait.recv_timeout(FLUSH_TIMEOUT).is_err() {
            tracing::warn!("the audit log did not flush within {FLUSH_TIMEOUT:?}");
        }
    }
}

/// The writer thread: writes events as they come, flushing the buffer whenever the queue is
/// empty (so a burst is one write), until every sender is gone.
fn write_loop(mut log: LogFile, rx: Receiver<Msg>, metrics: Metrics) {
    let mut line = Vec::with_capacity(1024);
    let mut write = |log: &mut LogFile, e: &Event| {
        line.clear();
        // An Event of strings and maps always serializes.
        if serde_json::to_writer(&mut line, e).is_ok() {
            line.push(b'\n');
            if let Err(err) = log.write_line(&line) {
                metrics.audit_error();
                tracing::warn!(error = %err, "writing the audit log");
            }
        }
    };
    let flush = |log: &mut LogFile, durable: bool| {
        if let Err(err) = log.flush(durable) {
            metrics.audit_error();
            tracing::warn!(error = %err, "flushing the audit log");
        }
    };
    while let Ok(mut msg) = rx.recv() {
        loop {
            match msg {
                Msg::Event(e) => write(&mut log, &e),
                Msg::Flush(done) => {
                    flush(&mut log, true);
                    let _ = done.send(());
                }
            }
            match rx.try_recv() {
                Ok(next) => msg = next,
                Err(_) => break,
            }
        }
        flush(&mut log, false);
    }
    flush(&mut log, true);
}

/// What a request learned on its way, for its audit event.
#[derive(Clone, Default)]
pub struct Trail(Arc<Mutex<Learned>>);

#[derive(Default)]
struct Learned {
    user: Option<User>,
    impersonated: Option<User>,
    annotations: BTreeMap<String, String>,
}

tokio::task_local! {
    static CURRENT: Trail;
}

impl Trail {
    /// Runs `fut` with this trail as the request's.
    pub async fn scope<F: std::future::Future>(&self, fut: F) -> F::Output {
        CURRENT.scope(self.clone(), fut).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn with(f: impl FnOnce(&mut Learned)) {
    let _ = CURRENT.try_with(|t| f(&mut t.lock()));
}

/// The request's caller, as authenticated.
pub fn authenticated(user: &UserInfo) {
    with(|l| l.user = Some(user.into()));
}

/// The user the request acts as (`Impersonate-User`).
pub fn impersonating(user: &UserInfo) {
    with(|l| l.impersonated = Some(user.into()));
}

/// An audit annotation of the current request (nothing outside a request or without an
/// audit log).
pub fn annotate(key: &str, value: impl Into<String>) {
    with(|l| {
        l.annotations.insert(key.to_string(), value.into());
    });
}

/// The authorization decision, as Kubernetes annotates it.
pub fn decision(allowed: bool, reason: &str) {
    annotate(
        "authorization.k8s.io/decision",
        if allowed { "allow" } else { "forbid" },
    );
    annotate("authorization.k8s.io/reason", reason);
}

/// A request's event before its outcome is known.
pub struct Pending {
    pub event: Event,
    pub trail: Trail,
    pub long_running: bool,
}

impl Pending {
    /// Fills in what the trail learned and the response, sends the event, and for a
    /// long-running request arranges for the ResponseComplete one when the body ends.
    pub fn finish(self, sink: &Sink, status: event::ResponseStatus, resp: Resp) -> Resp {
        let Pending {
            mut event,
            trail,
            long_running,
        } = self;
        {
            let mut l = trail.lock();
            if let Some(u) = l.user.take() {
                event.user = u;
            }
            event.impersonated_user = l.impersonated.take();
            event.annotations = std::mem::take(&mut l.annotations);
        }
        event.response_status = status;
        event.stage_timestamp = event::micro_time();
        if !long_running {
            event.stage = Stage::ResponseComplete;
            sink.send(event);
            return resp;
        }
        event.stage = Stage::ResponseStarted;
        let complete = event.clone();
        sink.send(event);
        let (parts, body) = resp.into_parts();
        let body = Completing {
            inner: body,
            pending: Some((sink.clone(), complete)),
        };
        Resp::from_parts(parts, body.boxed_unsync())
    }
}

/// A long-running response's body: when it ends (or the client goes), the ResponseComplete
/// event is sent.
struct Completing {
    inner: Body,
    pending: Option<(Sink, Event)>,
}

impl HttpBody for Completing {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Completing {
    fn drop(&mut self) {
        if let Some((sink, mut event)) = self.pending.take() {
            event.stage = Stage::ResponseComplete;
            event.stage_timestamp = event::micro_time();
            sink.send(event);
        }
    }
}

/// Kubernetes' long-running requests: watches, proxies, and the streaming subresources.
pub fn long_running(verb: &str, subresource: &str) -> bool {
    matches!(verb, "watch" | "proxy")
        || matches!(
            subresource,
            "attach" | "exec" | "proxy" | "log" | "portforward"
        )
}

/// The request's audit ID: the client's `Audit-ID` when it sent a sane one (kube-apiserver
/// keeps it, so a client can follow its request), else a new UUID.
pub fn audit_id(headers: &http::HeaderMap) -> String {
    headers
        .get(AUDIT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 128
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(str::to_string)
        .unwrap_or_else(super::meta::new_uid)
}

/// The response header that names the request's audit ID.
pub const AUDIT_ID_HEADER: &str = "audit-id";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_trail_collects_what_the_request_learned() {
        let trail = Trail::default();
        trail
            .scope(async {
                authenticated(&UserInfo::new("alice", &["devs"]));
                decision(false, "no rule");
            })
            .await;
        annotate("outside", "dropped");
        let l = trail.lock();
        assert_eq!(l.user.as_ref().unwrap().username, "alice");
        assert_eq!(
            l.annotations.get("authorization.k8s.io/decision").unwrap(),
            "forbid"
        );
        assert!(!l.annotations.contains_key("outside"));
    }

    #[test]
    fn a_client_audit_id_is_kept_only_when_sane() {
        let mut h = http::HeaderMap::new();
        h.insert(AUDIT_ID_HEADER, "abc-123".parse().unwrap());
        assert_eq!(audit_id(&h), "abc-123");
        h.insert(AUDIT_ID_HEADER, "a b".parse().unwrap());
        assert_ne!(audit_id(&h), "a b");
        assert!(long_running("watch", ""));
        assert!(long_running("create", "exec"));
        assert!(!long_running("get", "status"));
    }
}
