use std::sync::atomic::AtomicBool;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::Notify;

use super::*;
use crate::store::redb::{RedbOptions, RedbStore};
use crate::store::{KeyValue, Precondition, RangeResult, WriteOp, WriteResult};

fn node_of(v: &Value, f: &str) -> Option<String> {
    match f {
        "spec.nodeName" => v.pointer("/spec/nodeName")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn pods_spec() -> CacheSpec {
    CacheSpec {
        prefix: "/registry/pods/".into(),
        fields: vec!["spec.nodeName"],
        indexed: vec!["spec.nodeName"],
        field_fn: Arc::new(node_of),
    }
}

async fn put_raw(s: &dyn Store, key: &str, value: &[u8]) -> Revision {
    s.write(WriteOp::Put {
        key: key.into(),
        value: value.to_vec().into(),
        precondition: Precondition::Any,
    })
    .await
    .unwrap()
    .revision
}

async fn put(s: &dyn Store, key: &str, v: Value) -> Revision {
    put_raw(s, key, &serde_json::to_vec(&v).unwrap()).await
}

async fn delete(s: &dyn Store, key: &str) -> Revision {
    s.write(WriteOp::Delete {
        key: key.into(),
        precondition: Precondition::Any,
    })
    .await
    .unwrap()
    .revision
}

fn pod(name: &str, node: &str) -> Value {
    serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node}})
}

fn everything() -> Filter {
    Arc::new(|_| true)
}

fn names(page: &Page) -> Vec<(String, Revision)> {
    page.items
        .iter()
        .map(|o| (o.name.clone(), o.revision))
        .collect()
}

async fn started(store: Arc<dyn Store>, options: CacheOptions) -> Arc<Cache> {
    Cache::start(store, vec![pods_spec()], options)
        .await
        .unwrap()
}

async fn caught_up(cache: &Cache, rev: Revision) {
    cache.wait_for(rev, Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn indexed_watch_sees_objects_enter_and_leave_and_the_cache_stops_with_the_store() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let cache = started(shared.clone(), CacheOptions::default()).await;
    let pods = cache.resource("/registry/pods/").unwrap();
    let on_n1: Filter = Arc::new(|o: &CachedObject| o.fields[0].as_deref() == Some("n1"));
    let mut w = pods
        .watch(
            "/registry/pods/",
            WatchStart::Current,
            on_n1.clone(),
            Some(("spec.nodeName", "n1")),
        )
        .unwrap();
    put(&store, "/registry/pods/ns/a", pod("a", "")).await;
    let r = put(&store, "/registry/pods/ns/a", pod("a", "n1")).await;
    put(&store, "/registry/pods/ns/b", pod("b", "n2")).await;
    let r2 = put(&store, "/registry/pods/ns/a", pod("a", "n2")).await;
    match w.next().await.unwrap() {
        WatchEvent::Added(o) => assert_eq!((o.name.as_str(), o.revision), ("a", r)),
        other => panic!("{other:?}"),
    }
    match w.next().await.unwrap() {
        WatchEvent::Deleted(o) => assert_eq!((o.name.as_str(), o.revision), ("a", r2)),
        other => panic!("{other:?}"),
    }
    caught_up(&cache, r2).await;
    let page = pods.list("/registry/pods/ns/", &on_n1, None, None);
    assert!(page.items.is_empty());
    assert_eq!(page.revision, r2);
    let page = pods.list("/registry/pods/", &everything(), None, Some(1));
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.continue_after.as_deref(), Some("/registry/pods/ns/a"));
    assert_eq!(cache.health(), None);
    store.close();
    skiff_tests::wait_until_async(
        "the cache notices the store closed",
        Duration::from_secs(5),
        || async {
            match cache.health() {
                Some(h) if h.reason.contains("closed") => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
    assert!(matches!(
        cache.wait_for(r2.next(), Duration::from_secs(1)).await,
        Err(CacheError::Unavailable(_))
    ));
}

/// A real store behind a link the test can cut: a cut ends every open watch with an error,
/// and watches started while it is cut wait until it heals (then start at the revision they
/// asked for, which the store may have compacted meanwhile). Reads can be made to fail.
#[derive(Clone)]
struct Link {
    inner: RedbStore,
    cut: Arc<AtomicBool>,
    changed: Arc<Notify>,
    fail_reads: Arc<AtomicBool>,
}

impl Link {
    fn new(inner: RedbStore) -> Link {
        Link {
            inner,
            cut: Arc::default(),
            changed: Arc::default(),
            fail_reads: Arc::default(),
        }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    async fn until(&self, cut: bool) {
        loop {
            let changed = self.changed.notified();
            if self.cut.load(Ordering::SeqCst) == cut {
                return;
            }
            changed.await;
        }
    }
}

impl Store for Link {
    fn current_revision(&self) -> Revision {
        self.inner.current_revision()
    }
    fn latest_revision(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        self.inner.latest_revision()
    }
    fn barrier(&self) -> BoxFuture<'_, Result<Revision, StoreError>> {
        self.inner.barrier()
    }
    fn oldest_revision(&self) -> Revision {
        self.inner.oldest_revision()
    }
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>, StoreError>> {
        self.inner.get(key)
    }
    fn range(&self, prefix: &str) -> BoxFuture<'_, Result<RangeResult, StoreError>> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return futures::future::ready(Err(StoreError::Backend(
                "injected read failure".into(),
            )))
            .boxed();
        }
        self.inner.range(prefix)
    }
    fn write(&self, op: WriteOp) -> BoxFuture<'_, Result<WriteResult, StoreError>> {
        self.inner.write(op)
    }
    fn watch(&self, from: Revision) -> Result<EventStream, StoreError> {
        let link = self.clone();
        let opened = async move {
            link.until(false).await;
            let inner = match link.inner.watch(from) {
                Ok(s) => s,
                Err(e) => return futures::stream::iter([Err(e)]).boxed(),
            };
            // Events until the next cut, then one error.
            let cut = {
                let link = link.clone();
                async move { link.until(true).await }
            };
            inner
                .take_until(cut)
                .chain(futures::stream::once(async {
                    Err(StoreError::Backend("connection reset".into()))
                }))
                .boxed()
        };
        Ok(futures::stream::once(opened).flatten().boxed())
    }
    fn compact(&self, before: Revision) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.compact(before)
    }
}

fn keys(cache: &Cache) -> Vec<String> {
    let pods = cache.resource("/registry/pods/").unwrap();
    pods.list("/registry/pods/", &everything(), None, None)
        .items
        .iter()
        .map(|o| o.key.clone())
        .collect()
}

#[tokio::test]
async fn after_its_watch_is_compacted_away_the_cache_reloads_and_follows_again() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let link = Link::new(store.clone());
    let cache = started(Arc::new(link.clone()), CacheOptions::default()).await;
    let r1 = put(&store, "/registry/pods/ns/a", pod("a", "n1")).await;
    caught_up(&cache, r1).await;
    let pods = cache.resource("/registry/pods/").unwrap();
    let mut watcher = pods
        .watch("/registry/pods/", WatchStart::After(r1), everything(), None)
        .unwrap();

    // The cache loses its watch; meanwhile the store changes and compacts that history away.
    link.cut();
    delete(&store, "/registry/pods/ns/a").await;
    put(&store, "/registry/pods/ns/b", pod("b", "n1")).await;
    let r2 = put(&store, "/registry/pods/ns/c", pod("c", "n2")).await;
    store.compact(r2).await.unwrap();
    link.heal();

    caught_up(&cache, r2).await;
    assert_eq!(
        keys(&cache),
        ["/registry/pods/ns/b", "/registry/pods/ns/c"],
        "the cache holds what the store holds"
    );
    assert_eq!(cache.health(), None);
    // Watchers of the old state are ended (their events since r1 are not known one by
    // one) and cannot resume from before the reload.
    assert_eq!(watcher.next().await.unwrap_err(), WatchEnd::Closed);
    assert!(matches!(
        pods.watch("/registry/pods/", WatchStart::After(r1), everything(), None),
        Err(CacheError::Expired { .. })
    ));
    // It follows the store again.
    let mut w = pods
        .watch("/registry/pods/", WatchStart::After(r2), everything(), None)
        .unwrap();
    let r3 = put(&store, "/registry/pods/ns/d", pod("d", "n1")).await;
    match w.next().await.unwrap() {
        WatchEvent::Added(o) => assert_eq!((o.name.as_str(), o.revision), ("d", r3)),
        other => panic!("{other:?}"),
    }
    store.close();
}

#[tokio::test]
async fn while_the_cache_cannot_reload_it_says_why_and_reads_fail_fast() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let link = Link::new(store.clone());
    let cache = started(Arc::new(link.clone()), CacheOptions::default()).await;
    link.cut();
    link.fail_reads.store(true, Ordering::SeqCst);
    let r1 = put(&store, "/registry/pods/ns/a", pod("a", "n1")).await;
    store.compact(r1.next()).await.unwrap();
    link.heal();
    let reason = skiff_tests::wait_until_async(
        "the cache reports why it cannot serve",
        Duration::from_secs(10),
        || async {
            match cache.health() {
                Some(h) if h.reason.contains("injected read failure") => Ok(h.reason),
                other => Err(other),
            }
        },
    )
    .await;
    assert!(reason.contains("compacted"), "{reason}");
    assert!(matches!(
        cache.wait_for(r1, Duration::from_secs(10)).await,
        Err(CacheError::Unavailable(_))
    ));
    link.fail_reads.store(false, Ordering::SeqCst);
    skiff_tests::wait_until_async(
        "the cache reloads once the store answers",
        Duration::from_secs(20),
        || async {
            match cache.health() {
                None => Ok(()),
                Some(h) => Err(h),
            }
        },
    )
    .await;
    caught_up(&cache, r1).await;
    assert_eq!(keys(&cache), ["/registry/pods/ns/a"]);
    store.close();
}

#[tokio::test]
async fn an_undecodable_value_is_not_served_stale() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let cache = started(Arc::new(store.clone()), CacheOptions::default()).await;
    let pods = cache.resource("/registry/pods/").unwrap();
    let r1 = put(&store, "/registry/pods/ns/a", pod("a", "n1")).await;
    caught_up(&cache, r1).await;
    let mut w = pods
        .watch("/registry/pods/", WatchStart::After(r1), everything(), None)
        .unwrap();
    let r2 = put_raw(&store, "/registry/pods/ns/a", b"{not json").await;
    caught_up(&cache, r2).await;
    let err = pods.get("/registry/pods/ns/a").unwrap_err();
    assert_eq!(err.revision, r2);
    assert!(pods
        .list("/registry/pods/", &everything(), None, None)
        .items
        .is_empty());
    assert_eq!(pods.undecodable().len(), 1);
    match w.next().await.unwrap() {
        WatchEvent::Deleted(o) => {
            assert_eq!((o.name.as_str(), o.revision), ("a", r2));
            assert_eq!(
                o.value().unwrap()["metadata"]["resourceVersion"],
                r2.to_string()
            );
        }
        other => panic!("{other:?}"),
    }
    // Written again with a good value, it is back.
    let r3 = put(&store, "/registry/pods/ns/a", pod("a", "n2")).await;
    match w.next().await.unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.revision, r3),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pods.get("/registry/pods/ns/a").unwrap().unwrap().revision,
        r3
    );
    assert!(pods.undecodable().is_empty());
    // One found at start is reported likewise.
    put_raw(&store, "/registry/pods/ns/z", b"[]").await;
    store.close();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let cache = started(Arc::new(store.clone()), CacheOptions::default()).await;
    let pods = cache.resource("/registry/pods/").unwrap();
    assert!(pods.get("/registry/pods/ns/z").is_err());
    assert_eq!(keys(&cache), ["/registry/pods/ns/a"]);
    store.close();
}

#[tokio::test]
async fn a_list_continues_at_its_first_pages_revision_until_the_ring_no_longer_reaches_it() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let cache = started(
        Arc::new(store.clone()),
        CacheOptions {
            history_per_resource: 8,
            ..Default::default()
        },
    )
    .await;
    let pods = cache.resource("/registry/pods/").unwrap();
    let mut at_r0 = Vec::new();
    for n in ["a", "c", "e", "g"] {
        let rev = put(&store, &format!("/registry/pods/ns/{n}"), pod(n, "n1")).await;
        at_r0.push((n.to_string(), rev));
    }
    let r0 = at_r0.last().unwrap().1;
    caught_up(&cache, r0).await;
    let first = pods.list("/registry/pods/", &everything(), None, Some(1));
    assert_eq!(first.revision, r0);
    let after = first.continue_after.clone().unwrap();

    // Meanwhile: one deleted, one added in the range still to come, one changed.
    delete(&store, "/registry/pods/ns/c").await;
    put(&store, "/registry/pods/ns/d", pod("d", "n1")).await;
    let r1 = put(&store, "/registry/pods/ns/e", pod("e", "n2")).await;
    caught_up(&cache, r1).await;

    let second = pods
        .list_at("/registry/pods/", &everything(), Some(&after), Some(2), r0)
        .unwrap();
    assert_eq!(second.revision, r0);
    assert_eq!(names(&second), at_r0[1..3]);
    let third = pods
        .list_at(
            "/registry/pods/",
            &everything(),
            second.continue_after.as_deref(),
            Some(2),
            r0,
        )
        .unwrap();
    assert_eq!(names(&third), at_r0[3..]);
    assert_eq!(third.continue_after, None);
    // A filter applies to the old states.
    let on_n1: Filter = Arc::new(|o: &CachedObject| o.fields[0].as_deref() == Some("n1"));
    let old = pods
        .list_at("/registry/pods/", &on_n1, Some(&after), None, r0)
        .unwrap();
    assert_eq!(names(&old), at_r0[1..]);

    // Once the ring has moved past r0, the snapshot is gone.
    for i in 0..8 {
        put(&store, &format!("/registry/pods/ns/x{i}"), pod("x", "n1")).await;
    }
    caught_up(&cache, store.current_revision()).await;
    assert!(matches!(
        pods.list_at("/registry/pods/", &everything(), Some(&after), Some(2), r0),
        Err(CacheError::Expired { .. })
    ));
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_the_current_state_knows_the_revision_of_that_state() {
    let d = tempfile::tempdir().unwrap();
    let store = RedbStore::open(d.path(), RedbOptions::default()).unwrap();
    let cache = started(Arc::new(store.clone()), CacheOptions::default()).await;
    let pods = cache.resource("/registry/pods/").unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..300 {
                put(
                    &store,
                    &format!("/registry/pods/ns/p{}", i % 20),
                    pod("p", "n1"),
                )
                .await;
            }
        })
    };
    while !writer.is_finished() {
        let mut w = pods
            .watch("/registry/pods/", WatchStart::Current, everything(), None)
            .unwrap();
        let initial = w.initial_revision();
        while let Some(e) = w.next_initial() {
            assert!(e.object().revision <= initial);
        }
        if let Some(Ok(e)) = w.try_next() {
            assert!(
                e.object().revision > initial,
                "a live event at {} is covered by the initial state at {initial}",
                e.object().revision
            );
        }
        tokio::task::yield_now().await;
    }
    store.close();
}
