//! The etcd v3 backend, for several API servers and a store that survives the loss of a
//! member: the same [`Store`] semantics as the embedded store, mapped one to one onto etcd's
//! (etcd-client over tonic, TLS through rustls). A resourceVersion is the key's mod
//! revision; a conditional write is one transaction comparing the key's create or mod
//! revision, its else branch reading the key to say why it failed; a range is read in pages
//! at one revision; a watch starts from a revision with the previous values (a delete
//! carries the last state) and progress notifications, which tell the watch cache that the
//! revision moved through writes it does not watch (where etcd orders them after the events
//! they cover: from 3.4.31 and 3.5.13, etcd issue 15220; with an older etcd, such as Debian
//! 12's 3.4.23, a barrier is a write to a marker key instead, whose event proves the same);
//! a compacted start revision is
//! [`StoreError::Compacted`] (410 Expired to clients). Keys are the API server's
//! (`/registry/<resource>/<namespace>/<name>`, as Kubernetes lays them out) behind an optional
//! prefix; values are the embedded store's (the objects' JSON).

mod compactor;
mod config;
mod watch;

pub use config::{EtcdConfig, EtcdTls, StoreLocation};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    EventStream, KeyValue, Precondition, RangeResult, Revision, Store, StoreError, WriteOp,
    WriteResult,
};

/// Keys read per request of a range (a page of a consistent read at one revision).
const RANGE_PAGE: i64 = 1000;
/// The key a barrier writes when progress notifications cannot be trusted: inside the range
/// the watch cache watches, outside every resource's prefix.
const BARRIER_KEY: &str = "/registry/.barrier";

/// The etcd store. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    /// The newest revision any response showed.
    current: AtomicU64,
    /// The newest compaction this process did or was told of.
    oldest: AtomicU64,
    /// Wakes every open watch to ask etcd for a progress notification.
    progress: Arc<Notify>,
    /// Whether etcd orders progress notifications after the events they cover.
    ordered_progress: bool,
    closed: CancellationToken,
}

impl EtcdStore {
    /// Connects to the cluster (lazily: the first request dials) and starts the compactor.
    pub async fn connect(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // A member that stops answering (partitioned, not refusing) fails the request
            // instead of holding it: the caller retries, the client balances elsewhere.
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true)
            // A member cut off from the quorum refuses requests and ends its watches instead
            // of serving what it has.
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        let client = Client::connect(config.urls(), Some(options))
            .await
            .map_err(|e| StoreError::Backend(format!("etcd client: {e}")))?;
        let version = match tokio::time::timeout(
            Duration::from_secs(5),
            client.maintenance_client().status(),
        )
        .await
        {
            Ok(Ok(s)) => Some(s.version().to_string()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "etcd's version is unknown (status failed)");
                None
            }
            Err(_) => None,
        };
        let ordered_progress = version.as_deref().is_some_and(orders_progress);
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                prefix: config.prefix.clone(),
                current: AtomicU64::new(0),
                oldest: AtomicU64::new(1),
                progress: Arc::new(Notify::new()),
                ordered_progress,
                closed: CancellationToken::new(),
            }),
        };
        if !config.compaction_interval.is_zero() {
            tokio::spawn(compactor::run(store.clone(), config.compaction_interval));
        }
        tracing::info!(endpoints = ?config.endpoints, tls = config.tls.is_some(), prefix = %config.prefix, ?version, ordered_progress, "etcd store");
        Ok(store)
    }

    /// Ends every watch and refuses further requests.
    pub fn close(&self) {
        self.inner.closed.cancel();
    }

    /// The client, for the snapshot command.
    pub(crate) fn client(&self) -> Client {
        self.inner.client.clone()
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// The store's key of an etcd key (None: not under the prefix, or not UTF-8).
    fn short(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        key.strip_prefix(self.inner.prefix.as_str())
            .map(str::to_string)
    }

    fn observe(&self, header: Option<&etcd_client::ResponseHeader>) -> Revision {
        let rev = header.map_or(0, |h| h.revision().max(0) as u64);
        self.inner.current.fetch_max(rev, Ordering::AcqRel);
        Revision(rev)
    }

    fn compacted(&self, oldest: Revision) {
        self.inner.oldest.fetch_max(oldest.0, Ordering::AcqRel);
    }

    fn open(&self) -> Result<(), StoreError> {
        if self.inner.closed.is_cancelled() {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
        Ok(KeyValue {
            key: self
                .short(kv.key())
                .ok_or_else(|| StoreError::Backend("a key outside the store's prefix".into()))?,
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: Revision(kv.create_revision().max(0) as u64),
            mod_revision: Revision(kv.mod_revision().max(0) as u64),
        })
    }

    async fn read_range(&self, prefix: &str) -> Result<RangeResult, StoreError> {
        self.open()?;
        let full = self.full(prefix);
        let end = range_end(full.as_bytes());
        let kv = self.inner.client.kv_client();
        let mut kvs = Vec::new();
        let mut from = full.into_bytes();
        let mut at = 0i64;
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(RANGE_PAGE);
            if at > 0 {
                options = options.with_revision(at);
            }
            let resp = self
                .unsent_retried(|| {
                    let mut kv = kv.clone();
                    let (from, options) = (from.clone(), options.clone());
                    async move { kv.get(from, Some(options)).await }
                })
                .await
                .map_err(|e| self.error(e))?;
            let rev = self.observe(resp.header());
            if at == 0 {
                at = rev.0 as i64;
            }
            for k in resp.kvs() {
                kvs.push(self.key_value(k)?);
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(RangeResult {
            kvs,
            revision: Revision(at.max(0) as u64),
        })
    }

    async fn txn_write(&self, op: WriteOp) -> Result<WriteResult, StoreError> {
        self.open()?;
        let key = op.key().to_string();
        let full = self.full(&key);
        let (precondition, then) = match &op {
            WriteOp::Put {
                value,
                precondition,
                ..
            } => (
                *precondition,
                TxnOp::put(
                    full.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_prev_key()),
                ),
            ),
            WriteOp::Delete { precondition, .. } => (
                *precondition,
                TxnOp::delete(full.clone(), Some(DeleteOptions::new().with_prev_key())),
            ),
        };
        let exists = || Compare::create_revision(full.clone(), CompareOp::Greater, 0);
        let when = match (precondition, &op) {
            (Precondition::Any, WriteOp::Put { .. }) => vec![],
            // A delete needs something to delete, whatever the precondition.
            (Precondition::Any | Precondition::MustExist, _) => vec![exists()],
            (Precondition::MustNotExist, _) => {
                vec![Compare::create_revision(full.clone(), CompareOp::Equal, 0)]
            }
            (Precondition::ModRevision(r), _) => {
                vec![Compare::mod_revision(
                    full.clone(),
                    CompareOp::Equal,
                    r.0 as i64,
                )]
            }
        };
        let txn = Txn::new()
            .when(when)
            .and_then([then])
            .or_else([TxnOp::get(full.clone(), None)]);
        let resp = self
            .unsent_retried(|| {
                let mut kv = self.inner.client.kv_client();
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await
            .map_err(|e| self.error(e))?;
        let revision = self.observe(resp.header());
        let first = resp.op_responses().into_iter().next();
        if !resp.succeeded() {
            let current = match first {
                Some(TxnOpResponse::Get(g)) => {
                    g.kvs().first().map(|k| self.key_value(k)).transpose()?
                }
                _ => None,
            };
            return Err(match (precondition, current) {
                (Precondition::MustNotExist, Some(_)) => StoreError::AlreadyExists(key),
                (_, None) => StoreError::NotFound(key),
                (Precondition::ModRevision(expected), Some(kv)) => StoreError::Conflict {
                    key,
                    expected,
                    actual: kv.mod_revision,
                },
                (p, Some(_)) => StoreError::Backend(format!("precondition {p:?} failed on {key}")),
            });
        }
        match (op, first) {
            (WriteOp::Put { value, .. }, Some(TxnOpResponse::Put(p))) => {
                let prev = p.prev_key().map(|k| self.key_value(k)).transpose()?;
                Ok(WriteResult {
                    revision,
                    kv: KeyValue {
                        key,
                        value,
                        create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
                        mod_revision: revision,
                    },
                    prev,
                })
            }
            (WriteOp::Delete { .. }, Some(TxnOpResponse::Delete(d))) => {
                let prev = d
                    .prev_kvs()
                    .first()
                    .map(|k| self.key_value(k))
                    .transpose()?
                    .ok_or_else(|| StoreError::NotFound(key.clone()))?;
                Ok(WriteResult {
                    revision,
                    kv: KeyValue {
                        mod_revision: revision,
                        ..prev.clone()
                    },
                    prev: Some(prev),
                })
            }
            _ => Err(StoreError::Backend(
                "etcd answered a write with an unexpected response".into(),
            )),
        }
    }

    /// Sends a request again while it fails before it left: the client balances requests over
    /// the members, and a member that is down (killed, not back yet) refuses the connection
    /// each time the balancer picks it. Such a request reached no member, so sending it again
    /// is safe even for a write; without this every request sent to the dead member fails
    /// Unavailable (a 503 that clients retry after a second) until it is back.
    async fn unsent_retried<T, F, Fut>(&self, mut send: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 1;
        loop {
            match send().await {
                Err(e)
                    if unsent(&e) && tries < UNSENT_TRIES && !self.inner.closed.is_cancelled() =>
                {
                    tries += 1;
                    tracing::debug!(error = %e, tries, "etcd request not sent; sending it again");
                }
                r => return r,
            }
        }
    }

    /// A client error as the store's: the compacted-revision error, an unreachable or
    /// leaderless cluster (retry later), anything else.
    fn error(&self, e: etcd_client::Error) -> StoreError {
        if self.inner.closed.is_cancelled() {
            return StoreError::Closed;
        }
        error(e)
    }
}

/// How long a read of the current revision rides out etcd being Unavailable (a leader
/// election takes about one election timeout, 1 s by etcd's default).
const TRANSIENT_READ_RETRY: Duration = Duration::from_secs(5);

/// How many times a request that failed before it left is sent (see
/// [`EtcdStore::unsent_retried`]). With one member of three down the balancer may pick it
/// for up to 2 requests in 3 (it picks the less loaded of two, and a member that refuses at
/// once looks idle): all 32 tries land on it about once in 400,000 requests. Each costs one
/// refused connection.
const UNSENT_TRIES: u32 = 32;

/// Whether a request failed while connecting to a member, before anything was sent: tonic
/// reports a connection that could not be made as Unavailable with the connector's message
/// ("tcp connect error" for a refused or unreachable one).
fn unsent(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::Unavailable && s.message().starts_with("tcp connect error"))
}

/// Whether an etcd of this version sends requested progress notifications after the events
/// they cover (etcd issue 15220, fixed in 3.4.31 and 3.5.13).
fn orders_progress(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

pub(crate) fn error(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match &e {
        E::GRpcStatus(s) if s.message().contains("required revision has been compacted") => {
            StoreError::Compacted {
                requested: Revision(0),
                oldest: Revision(0),
            }
        }
        E::GRpcStatus(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
            ) =>
        {
            StoreError::Unavailable(format!("etcd: {}", s.message()))
        }
        E::TransportError(_) | E::IoError(_) => StoreError::Unavailable(format!("etcd: {e}")),
        _ => StoreError::Backend(format!("etcd: {e}")),
    }
}

/// The end of the range of keys starting with `prefix` (etcd's prefix convention).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the key space.
    vec![0]
}

fn tls_options(tls: &EtcdTls) -> Result<TlsOptions, StoreError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| StoreError::Backend(format!("reading {}: {e}", p.display())))
    };
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        options = options.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(options)
}

impl Store for EtcdStore {
    fn current_revision(&self) -> Revision {
        Revision(self.inner.current.load(Ordering::Acquire))
    }

    fn latest_revision(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        async move {
            // A read, so safe to repeat: a leader change or an election in progress (etcd
            // answers Unavailable) is ridden out for a while instead of failing the
            // request that needs the revision.
            let deadline = tokio::time::Instant::now() + TRANSIENT_READ_RETRY;
            let mut pause = Duration::from_millis(25);
            loop {
                self.open()?;
                // A linearizable read of one key: its header carries the cluster's revision.
                let r = self
                    .unsent_retried(|| {
                        let mut kv = self.inner.client.kv_client();
                        let key = self.full("/");
                        async move { kv.get(key, Some(GetOptions::new().with_count_only())).await }
                    })
                    .await;
                match r.map_err(|e| self.error(e)) {
                    Ok(resp) => return Ok(self.observe(resp.header())),
                    Err(StoreError::Unavailable(why))
                        if tokio::time::Instant::now() + pause < deadline =>
                    {
                        tracing::debug!(%why, "etcd read unavailable; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(400));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        .boxed()
    }

    fn barrier(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        async move {
            if self.inner.ordered_progress {
                let latest = self.latest_revision().await?;
                self.inner.progress.notify_waiters();
                return Ok(latest);
            }
            let marked = self
                .txn_write(WriteOp::Put {
                    key: BARRIER_KEY.into(),
                    value: Bytes::new(),
                    precondition: Precondition::Any,
                })
                .await?;
            Ok(marked.revision)
        }
        .boxed()
    }

    fn oldest_revision(&self) -> Revision {
        Revision(self.inner.oldest.load(Ordering::Acquire))
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        let key = self.full(key);
        async move {
            self.open()?;
            let resp = self
                .unsent_retried(|| {
                    let mut kv = self.inner.client.kv_client();
                    let key = key.clone();
                    async move { kv.get(key, None).await }
                })
                .await
                .map_err(|e| self.error(e))?;
            self.observe(resp.header());
            resp.kvs().first().map(|k| self.key_value(k)).transpose()
        }
        .boxed()
    }

    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<RangeResult, StoreError>> {
        let prefix = prefix.to_string();
        async move { self.read_range(&prefix).await }.boxed()
    }

    fn write(&self, op: WriteOp) -> BoxFuture<'_, Result<WriteResult, StoreError>> {
        self.txn_write(op).boxed()
    }

    fn watch(&self, from: Revision) -> Result<EventStream, StoreError> {
        self.open()?;
        Ok(watch::stream(self.clone(), from.max(Revision(1))))
    }

    fn compact(&self, before: Revision) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            self.open()?;
            match self
                .inner
                .client
                .kv_client()
                .compact(before.0 as i64, None)
                .await
            {
                Ok(resp) => {
                    self.observe(resp.header());
                    self.compacted(before);
                    Ok(())
                }
                // Compacting to where it already is is done.
                Err(e) => match self.error(e) {
                    StoreError::Compacted { .. } => {
                        self.compacted(before);
                        Ok(())
                    }
                    e => Err(e),
                },
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_trusted_from_the_fixed_releases_on() {
        for v in ["3.4.31", "3.5.13", "3.5.21", "3.6.0", "4.0.0"] {
            assert!(orders_progress(v), "{v}");
        }
        for v in ["3.4.23", "3.5.12", "3.3.27", "", "garbage"] {
            assert!(!orders_progress(v), "{v}");
        }
    }

    /// A member that refuses the connection: the request was not sent (sent again); a
    /// member that answers with an error: it was (not sent again).
    #[tokio::test]
    async fn only_a_request_that_never_left_counts_as_unsent() {
        let port = skiff_tests::etcd::free_port();
        let down = Client::connect([format!("http://127.0.0.1:{port}")], None)
            .await
            .unwrap();
        let e = down.kv_client().get("/k", None).await.expect_err("refused");
        assert!(unsent(&e), "{e:?}");
        let up = Client::connect(skiff_tests::etcd::shared().endpoints(), None)
            .await
            .unwrap();
        let e = up
            .kv_client()
            .get("/k", Some(GetOptions::new().with_revision(i64::MAX)))
            .await
            .expect_err("a revision from the future");
        assert!(!unsent(&e), "{e:?}");
    }

    #[test]
    fn prefix_ranges_end_after_the_last_key_with_the_prefix() {
        assert_eq!(range_end(b"/registry/"), b"/registry0");
        assert_eq!(range_end(b"a\xff"), b"b");
        assert_eq!(range_end(b"\xff\xff"), [0]);
    }
}
