//! Shared informers: one list+watch per kind (kube-runtime's [`watcher`], which lists, watches,
//! resumes and relists on 410), feeding a local cache with secondary indexes, and telling every
//! subscribed controller what changed (with the old object on updates, as client-go's
//! `OnUpdate(old, new)` does). Controllers read the cache, never the API, to decide; they write
//! through the API and see their own writes come back through the watch.
//!
//! Scale: each event costs O(indexes of that object); lookups by index (pods by owner uid,
//! by node, by namespace) are O(matches), never a scan of the whole cache.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::key::{KeyRef, ObjectKey};

/// The index every informer keeps: objects by namespace ("" for cluster-scoped objects).
pub const BY_NAMESPACE: &str = "namespace";

/// Computes the values an object is indexed under (none, one or several).
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// Called for every change, in order, from the informer's task; must be quick (it normally
/// only enqueues keys).
pub type Handler<K> = Arc<dyn Fn(&Change<K>) + Send + Sync>;

/// What happened to one object.
#[derive(Debug)]
pub enum Change<K> {
    Added(Arc<K>),
    Updated {
        old: Arc<K>,
        new: Arc<K>,
    },
    /// The last state the informer knew.
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    /// The object as it is now (or was last, for a deletion).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }
}

/// Bounds every cached kind meets.
pub trait Cached: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {}
impl<K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static> Cached for K {}

/// A shared, indexed cache of one kind, kept current by a watch. Cheap to clone.
pub struct Informer<K: Cached> {
    shared: Arc<Shared<K>>,
}

impl<K: Cached> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K: Cached> {
    api: Api<K>,
    config: watcher::Config,
    state: RwLock<State<K>>,
    handlers: RwLock<Vec<Handler<K>>>,
    synced: watch::Sender<bool>,
}

struct Index<K> {
    func: IndexFn<K>,
    values: HashMap<String, HashSet<ObjectKey>>,
}

struct State<K> {
    objects: hashbrown::HashMap<ObjectKey, Arc<K>>,
    indexes: HashMap<&'static str, Index<K>>,
    /// Objects of a relist in progress (between `Init` and `InitDone`), ordered by key so
    /// that handlers see the initial adds in a deterministic order.
    relist: Option<BTreeMap<ObjectKey, Arc<K>>>,
}

impl<K: Cached> State<K> {
    fn index_add(&mut self, key: &ObjectKey, obj: &K) {
        for idx in self.indexes.values_mut() {
            for v in (idx.func)(obj) {
                idx.values.entry(v).or_default().insert(key.clone());
            }
        }
    }

    fn index_remove(&mut self, key: &ObjectKey, obj: &K) {
        for idx in self.indexes.values_mut() {
            for v in (idx.func)(obj) {
                if let Some(set) = idx.values.get_mut(&v) {
                    set.remove(key);
                    if set.is_empty() {
                        idx.values.remove(&v);
                    }
                }
            }
        }
    }

    /// Stores `obj`; returns the change it makes (None when the same version is already held).
    fn upsert(&mut self, obj: Arc<K>) -> Option<Change<K>> {
        let key = ObjectKey::of(obj.as_ref());
        if let Some(old) = self.objects.get(&key).cloned() {
            if old.resource_version().is_some() && old.resource_version() == obj.resource_version()
            {
                return None;
            }
            self.index_remove(&key, &old);
            self.index_add(&key, &obj);
            self.objects.insert(key, obj.clone());
            Some(Change::Updated { old, new: obj })
        } else {
            self.index_add(&key, &obj);
            self.objects.insert(key, obj.clone());
            Some(Change::Added(obj))
        }
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        self.index_remove(key, &old);
        Some(old)
    }
}

fn namespace_index<K: Cached>() -> IndexFn<K> {
    Arc::new(|o: &K| vec![o.namespace().unwrap_or_default()])
}

impl<K: Cached> Informer<K> {
    /// An informer over `api` (usually `Api::all`) with `config` (selectors); not running until
    /// [`Informer::run`] (or [`Informers::start`]).
    pub fn new(api: Api<K>, config: watcher::Config) -> Informer<K> {
        let mut indexes = HashMap::new();
        indexes.insert(
            BY_NAMESPACE,
            Index {
                func: namespace_index(),
                values: HashMap::new(),
            },
        );
        Informer {
            shared: Arc::new(Shared {
                api,
                config,
                state: RwLock::new(State {
                    objects: hashbrown::HashMap::new(),
                    indexes,
                    relist: None,
                }),
                handlers: RwLock::new(Vec::new()),
                synced: watch::channel(false).0,
            }),
        }
    }

    /// Adds a secondary index (idempotent by name; objects already cached are indexed now).
    pub fn add_index(
        &self,
        name: &'static str,
        func: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) {
        let mut st = write(&self.shared.state);
        if st.indexes.contains_key(name) {
            return;
        }
        let func: IndexFn<K> = Arc::new(func);
        let mut values: HashMap<String, HashSet<ObjectKey>> = HashMap::new();
        for (k, o) in &st.objects {
            for v in func(o) {
                values.entry(v).or_default().insert(k.clone());
            }
        }
        st.indexes.insert(name, Index { func, values });
    }

    /// Subscribes `handler` to every later change (and to the initial list, if not yet run).
    pub fn on_change(&self, handler: impl Fn(&Change<K>) + Send + Sync + 'static) {
        write(&self.shared.handlers).push(Arc::new(handler));
    }

    /// The cached object with this key.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        read(&self.shared.state).objects.get(key).cloned()
    }

    /// The cached namespaced object `namespace/name`.
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        read(&self.shared.state)
            .objects
            .get(&KeyRef {
                namespace: Some(namespace),
                name,
            })
            .cloned()
    }

    /// Every cached object (O(n): for start-up and rare full passes only).
    pub fn list(&self) -> Vec<Arc<K>> {
        read(&self.shared.state).objects.values().cloned().collect()
    }

    /// The cached objects indexed under `value` by the index `name` (empty if no such index).
    pub fn by_index(&self, name: &str, value: &str) -> Vec<Arc<K>> {
        let st = read(&self.shared.state);
        let Some(keys) = st.indexes.get(name).and_then(|i| i.values.get(value)) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| st.objects.get(k).cloned())
            .collect()
    }

    /// How many objects are indexed under `value` by the index `name`.
    pub fn count_by_index(&self, name: &str, value: &str) -> usize {
        read(&self.shared.state)
            .indexes
            .get(name)
            .and_then(|i| i.values.get(value))
            .map_or(0, HashSet::len)
    }

    /// The distinct values of index `name` (e.g. every namespace with objects).
    pub fn index_values(&self, name: &str) -> Vec<String> {
        read(&self.shared.state)
            .indexes
            .get(name)
            .map(|i| i.values.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The cached objects in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.by_index(BY_NAMESPACE, namespace)
    }

    pub fn len(&self) -> usize {
        read(&self.shared.state).objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list has been applied.
    pub fn has_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// Waits until the first list has been applied.
    pub async fn wait_synced(&self) {
        let mut rx = self.shared.synced.subscribe();
        // The sender lives as long as `self`, so this only ends when synced.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Lists and watches until `token` is cancelled, applying every event to the cache and
    /// telling the handlers. Watch errors are retried with client-go's back-off.
    pub async fn run(self, token: CancellationToken) {
        let stream = watcher(self.shared.api.clone(), self.shared.config.clone()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = token.cancelled() => return,
                next = stream.next() => next,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(resource = self.shared.api.resource_url(), error = %e, "watch failed; retrying");
                }
                Some(Ok(event)) => self.apply(event),
            }
        }
    }

    /// Applies one watcher event (public for tests of handlers without a server).
    pub fn apply(&self, event: watcher::Event<K>) {
        let mut done = false;
        let changes = {
            let mut st = write(&self.shared.state);
            match event {
                watcher::Event::Init => {
                    st.relist = Some(BTreeMap::new());
                    Vec::new()
                }
                watcher::Event::InitApply(obj) => {
                    let obj = Arc::new(strip(obj));
                    let key = ObjectKey::of(obj.as_ref());
                    st.relist.get_or_insert_with(BTreeMap::new).insert(key, obj);
                    Vec::new()
                }
                watcher::Event::InitDone => {
                    done = true;
                    let listed = st.relist.take().unwrap_or_default();
                    let gone: Vec<ObjectKey> = st
                        .objects
                        .keys()
                        .filter(|k| !listed.contains_key(*k))
                        .cloned()
                        .collect();
                    let mut changes = Vec::new();
                    for k in gone {
                        if let Some(old) = st.remove(&k) {
                            changes.push(Change::Deleted(old));
                        }
                    }
                    for (_, obj) in listed {
                        changes.extend(st.upsert(obj));
                    }
                    changes
                }
                watcher::Event::Apply(obj) => st.upsert(Arc::new(strip(obj))).into_iter().collect(),
                watcher::Event::Delete(obj) => {
                    let key = ObjectKey::of(&obj);
                    st.remove(&key);
                    vec![Change::Deleted(Arc::new(strip(obj)))]
                }
            }
        };
        if !changes.is_empty() {
            let handlers = read(&self.shared.handlers).clone();
            for c in &changes {
                for h in &handlers {
                    h(c);
                }
            }
        }
        if done {
            self.shared.synced.send_replace(true);
        }
    }
}

/// Drops what no controller reads (managed fields) to keep the cache small at scale.
fn strip<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// A type-erased informer, so one factory can start and await informers of every kind.
trait Runnable: Send + Sync {
    fn spawn(&self, token: CancellationToken) -> JoinHandle<()>;
    fn synced(&self) -> futures::future::BoxFuture<'static, ()>;
    fn as_any(&self) -> &dyn Any;
}

impl<K: Cached> Runnable for Informer<K> {
    fn spawn(&self, token: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(self.clone().run(token))
    }

    fn synced(&self) -> futures::future::BoxFuture<'static, ()> {
        let me = self.clone();
        Box::pin(async move { me.wait_synced().await })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One informer per kind, shared by every controller of a process (as client-go's
/// SharedInformerFactory): register with [`Informers::get`], then [`Informers::start`].
pub struct Informers {
    client: Client,
    informers: Mutex<Vec<(TypeId, Box<dyn Runnable>)>>,
    started: Mutex<Vec<JoinHandle<()>>>,
}

impl Informers {
    pub fn new(client: Client) -> Informers {
        Informers {
            client,
            informers: Mutex::new(Vec::new()),
            started: Mutex::new(Vec::new()),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The shared informer of kind `K` over all namespaces (created on first use).
    pub fn get<K>(&self) -> Informer<K>
    where
        K: Cached + Resource<DynamicType = ()>,
    {
        let mut all = self.informers.lock().unwrap_or_else(|p| p.into_inner());
        let id = TypeId::of::<K>();
        if let Some((_, r)) = all.iter().find(|(t, _)| *t == id) {
            if let Some(i) = r.as_any().downcast_ref::<Informer<K>>() {
                return i.clone();
            }
        }
        let informer = Informer::new(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default(),
        );
        all.push((id, Box::new(informer.clone())));
        informer
    }

    /// Starts every registered informer; they stop when `token` is cancelled. Informers
    /// registered later need another call.
    pub fn start(&self, token: &CancellationToken) {
        let all = self.informers.lock().unwrap_or_else(|p| p.into_inner());
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        for (_, r) in all.iter().skip(started.len()) {
            started.push(r.spawn(token.child_token()));
        }
    }

    /// Waits until every registered informer has applied its first list.
    pub async fn wait_synced(&self) {
        let waits: Vec<_> = self
            .informers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, r)| r.synced())
            .collect();
        futures::future::join_all(waits).await;
    }

    /// Waits for the informer tasks to end (after the token given to start is cancelled).
    pub async fn join(&self) {
        let handles: Vec<_> =
            std::mem::take(&mut *self.started.lock().unwrap_or_else(|p| p.into_inner()));
        futures::future::join_all(handles).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(ns: &str, name: &str, rv: &str, node: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.resource_version = Some(rv.into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        });
        p
    }

    fn node_of(p: &Pod) -> Vec<String> {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .into_iter()
            .collect()
    }

    /// An informer that is never run: events are applied by hand (the watcher's part is
    /// kube-runtime's, exercised against the real server in the integration tests).
    async fn informer() -> (Informer<Pod>, Arc<Mutex<Vec<String>>>) {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let i: Informer<Pod> = Informer::new(Api::all(client), watcher::Config::default());
        i.add_index("node", node_of);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        i.on_change(move |c| {
            let what = match c {
                Change::Added(p) => format!("add {}", p.name_any()),
                Change::Updated { old, new } => format!(
                    "update {} {}->{}",
                    new.name_any(),
                    old.resource_version().unwrap_or_default(),
                    new.resource_version().unwrap_or_default()
                ),
                Change::Deleted(p) => format!("delete {}", p.name_any()),
            };
            s.lock().unwrap().push(what);
        });
        (i, seen)
    }

    #[tokio::test]
    async fn indexes_follow_updates_and_relists_emit_only_differences() {
        let (i, seen) = informer().await;
        i.apply(watcher::Event::Init);
        i.apply(watcher::Event::InitApply(pod("a", "p1", "1", "n1")));
        i.apply(watcher::Event::InitApply(pod("a", "p2", "2", "n1")));
        assert!(!i.has_synced());
        i.apply(watcher::Event::InitDone);
        assert!(i.has_synced());
        assert_eq!(i.by_index("node", "n1").len(), 2);
        assert_eq!(i.in_namespace("a").len(), 2);

        // Moves p1 to n2; a repeated version changes nothing.
        i.apply(watcher::Event::Apply(pod("a", "p1", "3", "n2")));
        i.apply(watcher::Event::Apply(pod("a", "p1", "3", "n2")));
        assert_eq!(i.count_by_index("node", "n1"), 1);
        assert_eq!(i.count_by_index("node", "n2"), 1);

        // A relist after a 410: p2 is gone, p1 unchanged, p3 new.
        i.apply(watcher::Event::Init);
        i.apply(watcher::Event::InitApply(pod("a", "p1", "3", "n2")));
        i.apply(watcher::Event::InitApply(pod("b", "p3", "5", "n1")));
        // Until the relist is complete the cache still answers with the old state.
        assert!(i.get_namespaced("a", "p2").is_some());
        i.apply(watcher::Event::InitDone);
        assert!(i.get_namespaced("a", "p2").is_none());
        assert_eq!(i.by_index("node", "n1")[0].name_any(), "p3");
        let mut index_values = i.index_values(BY_NAMESPACE);
        index_values.sort();
        assert_eq!(index_values, vec!["a", "b"]);

        i.apply(watcher::Event::Delete(pod("b", "p3", "6", "n1")));
        assert_eq!(i.count_by_index("node", "n1"), 0);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                "add p1",
                "add p2",
                "update p1 1->3",
                "delete p2",
                "add p3",
                "delete p3"
            ]
        );
    }
}
