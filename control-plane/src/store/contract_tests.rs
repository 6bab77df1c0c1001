//! The [`Store`] contract, checked on both backends: the embedded store and a real etcd (the
//! test binary's shared member, a key prefix per test).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::etcd::{EtcdConfig, EtcdStore};
use super::redb::{RedbOptions, RedbStore};
use super::*;

fn put(key: &str, v: &str, p: Precondition) -> WriteOp {
    WriteOp::Put {
        key: key.into(),
        value: v.as_bytes().to_vec().into(),
        precondition: p,
    }
}

fn delete(key: &str, p: Precondition) -> WriteOp {
    WriteOp::Delete {
        key: key.into(),
        precondition: p,
    }
}

/// A store of each kind, closed on drop.
struct Open {
    store: OpenStore,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.store.close();
    }
}

async fn embedded() -> Open {
    let d = tempfile::tempdir().unwrap();
    let s = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    Open {
        store: OpenStore::Embedded(s),
        _dir: Some(d),
    }
}

pub(crate) fn etcd_config() -> EtcdConfig {
    let mut c = EtcdConfig::new(skiff_tests::etcd::shared().endpoints());
    c.prefix = skiff_tests::etcd::unique_prefix();
    c.compaction_interval = Duration::ZERO;
    c
}

async fn etcd() -> Open {
    Open {
        store: OpenStore::Etcd(EtcdStore::connect(&etcd_config()).await.unwrap()),
        _dir: None,
    }
}

async fn next_event(w: &mut EventStream) -> Event {
    loop {
        let item = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("an event within 10 s")
            .expect("the watch goes on")
            .expect("no error");
        if let WatchItem::Event(e) = item {
            return e;
        }
    }
}

async fn compare_and_swap(s: Arc<dyn Store>) {
    let a = s
        .write(put("/registry/a", "1", Precondition::MustNotExist))
        .await
        .unwrap();
    assert_eq!(a.prev, None);
    assert_eq!(a.kv.create_revision, a.revision);
    assert_eq!(
        s.write(put("/registry/a", "x", Precondition::MustNotExist))
            .await,
        Err(StoreError::AlreadyExists("/registry/a".into()))
    );
    let b = s
        .write(put(
            "/registry/a",
            "2",
            Precondition::ModRevision(a.revision),
        ))
        .await
        .unwrap();
    assert_eq!(
        (b.kv.create_revision, b.kv.mod_revision),
        (a.revision, b.revision)
    );
    assert_eq!(b.prev.unwrap().value.as_ref(), b"1");
    assert_eq!(
        s.write(put(
            "/registry/a",
            "3",
            Precondition::ModRevision(a.revision)
        ))
        .await,
        Err(StoreError::Conflict {
            key: "/registry/a".into(),
            expected: a.revision,
            actual: b.revision
        })
    );
    assert_eq!(
        s.write(put("/registry/none", "3", Precondition::MustExist))
            .await,
        Err(StoreError::NotFound("/registry/none".into()))
    );
    assert_eq!(
        s.write(delete("/registry/none", Precondition::Any)).await,
        Err(StoreError::NotFound("/registry/none".into()))
    );
    s.write(put("/registry/b", "b", Precondition::Any))
        .await
        .unwrap();
    let last = s
        .write(put("/registry/ab", "x", Precondition::Any))
        .await
        .unwrap();
    let r = s.range("/registry/a").await.unwrap();
    assert_eq!(
        r.kvs.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
        ["/registry/a", "/registry/ab"]
    );
    // At least the last write's: on the shared etcd, other tests' writes under their own
    // prefixes move the revision too.
    assert!(
        r.revision >= last.revision,
        "{:?} < {:?}",
        r.revision,
        last.revision
    );
    let got = s.get("/registry/a").await.unwrap().unwrap();
    assert_eq!(
        (got.value.as_ref(), got.mod_revision),
        (&b"2"[..], b.revision)
    );
    let del = s
        .write(delete("/registry/a", Precondition::ModRevision(b.revision)))
        .await
        .unwrap();
    assert_eq!(del.kv.value.as_ref(), b"2");
    assert_eq!(del.kv.mod_revision, del.revision);
    assert_eq!(s.get("/registry/a").await.unwrap(), None);
    assert!(s.latest_revision().await.unwrap() >= del.revision);
    assert!(s.current_revision() >= del.revision);
}

async fn watch_from_a_revision(s: Arc<dyn Store>) {
    let first = s
        .write(put("/registry/w/a", "1", Precondition::Any))
        .await
        .unwrap();
    s.write(put("/registry/w/a", "2", Precondition::Any))
        .await
        .unwrap();
    let mut w = s.watch(first.revision).unwrap();
    let e = next_event(&mut w).await;
    assert_eq!(
        (e.kind, e.created, e.kv.value.as_ref()),
        (EventKind::Put, true, &b"1"[..])
    );
    let e = next_event(&mut w).await;
    assert_eq!((e.created, e.kv.value.as_ref()), (false, &b"2"[..]));
    let d = s
        .write(delete("/registry/w/a", Precondition::Any))
        .await
        .unwrap();
    let e = next_event(&mut w).await;
    // A delete carries the last value.
    assert_eq!(
        (
            e.kind,
            e.revision(),
            e.kv.value.as_ref(),
            e.kv.create_revision
        ),
        (EventKind::Delete, d.revision, &b"2"[..], first.revision)
    );
}

async fn a_compacted_revision_cannot_be_watched(s: Arc<dyn Store>) {
    let mut last = Revision(0);
    for i in 0..5 {
        last = s
            .write(put(&format!("/registry/c/{i}"), "v", Precondition::Any))
            .await
            .unwrap()
            .revision;
    }
    s.compact(last).await.unwrap();
    assert!(s.oldest_revision() >= last);
    let compacted = match s.watch(Revision(last.0 - 2)) {
        Err(e) => e,
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(e))) => e,
            other => panic!("expected an error, got {other:?}"),
        },
    };
    assert!(
        matches!(compacted, StoreError::Compacted { .. }),
        "{compacted:?}"
    );
    // From the compaction revision on, it can.
    let mut w = s.watch(last).unwrap();
    assert_eq!(next_event(&mut w).await.revision(), last);
}

macro_rules! on_both {
    ($($name:ident),*) => {
        mod embedded {
            $(
                #[tokio::test]
                async fn $name() {
                    let o = super::embedded().await;
                    super::$name(o.store.shared()).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test]
                async fn $name() {
                    let o = super::etcd().await;
                    super::$name(o.store.shared()).await;
                }
            )*
        }
    };
}

on_both!(compare_and_swap, watch_from_a_revision);

#[tokio::test]
async fn embedded_a_compacted_revision_cannot_be_watched() {
    let o = embedded().await;
    a_compacted_revision_cannot_be_watched(o.store.shared()).await;
}

/// On an etcd of its own: compaction is of the whole etcd, every prefix.
#[tokio::test]
async fn etcd_a_compacted_revision_cannot_be_watched() {
    let own = skiff_tests::etcd::EtcdCluster::start(1);
    let store = EtcdStore::connect(&EtcdConfig {
        compaction_interval: Duration::ZERO,
        ..EtcdConfig::new(own.endpoints())
    })
    .await
    .unwrap();
    a_compacted_revision_cannot_be_watched(Arc::new(store.clone())).await;
    store.close();
}

/// Writes outside a store's prefix move etcd's revision without events for its watches: a
/// barrier tells a waiting reader that the watch has seen everything anyway.
#[tokio::test]
async fn etcd_a_barrier_brings_the_cache_past_revisions_it_does_not_watch() {
    let ours = EtcdStore::connect(&etcd_config()).await.unwrap();
    let other = EtcdStore::connect(&etcd_config()).await.unwrap();
    let cache = cache::Cache::start(
        Arc::new(ours.clone()),
        vec![],
        cache::CacheOptions::default(),
    )
    .await
    .unwrap();
    let elsewhere = other
        .write(put("/registry/x", "v", Precondition::Any))
        .await
        .unwrap()
        .revision;
    let latest = ours.latest_revision().await.unwrap();
    assert!(latest >= elsewhere);
    cache
        .wait_for(latest, Duration::from_secs(10))
        .await
        .unwrap();
    ours.close();
    other.close();
}
