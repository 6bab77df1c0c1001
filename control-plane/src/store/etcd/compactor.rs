//! Periodic compaction, as kube-apiserver does it: every interval, compact etcd's history to
//! the revision seen one interval earlier, so a watch or a paged list can resume within at
//! least one interval. Several API servers share the work through one key: each tick is a
//! transaction that bumps its version only if nobody else did since this server last looked,
//! and only the winner compacts.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::EtcdStore;
use crate::store::{Revision, Store, StoreError};

pub(super) async fn run(store: EtcdStore, interval: Duration) {
    let mut version = 0i64;
    let mut revision = Revision(0);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let closed = store.inner.closed.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = closed.cancelled() => return,
        }
        match once(&store, version, revision).await {
            Ok((v, r)) => (version, revision) = (v, r),
            Err(StoreError::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "etcd compaction failed"),
        }
    }
}

/// One tick: claims the tick if the key's version is still `version`, and then compacts to
/// `revision` (the one claimed last time). Returns the version and revision to claim next.
async fn once(
    store: &EtcdStore,
    version: i64,
    revision: Revision,
) -> Result<(i64, Revision), StoreError> {
    let key = store.full("/compact_rev_key");
    let txn = Txn::new()
        .when([Compare::version(key.clone(), CompareOp::Equal, version)])
        .and_then([TxnOp::put(key.clone(), revision.to_string(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = store
        .inner
        .client
        .kv_client()
        .txn(txn)
        .await
        .map_err(|e| store.error(e))?;
    let now = store.observe(resp.header());
    if !resp.succeeded() {
        // Another server compacted this interval: follow its count.
        let seen = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map_or(0, |k| k.version()),
            _ => 0,
        };
        return Ok((seen, now));
    }
    if revision.0 > 0 {
        store.compact(revision).await?;
        tracing::info!(%revision, "etcd history compacted");
    }
    Ok((version + 1, now))
}
