//! The agent's cache of Services, indexed by namespace, fed by one watch: containers' service
//! variables (`KUBERNETES_SERVICE_HOST`, enableServiceLinks) are read from it, never by a
//! request per pod. Until the first list has arrived it answers an error, so no container
//! starts with its service variables missing (the kubelet waits the same way).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;
use tracing::warn;

type ByNamespace = HashMap<String, BTreeMap<String, Service>>;

#[derive(Default)]
struct Inner {
    services: ByNamespace,
    synced: bool,
}

/// Services by namespace and name; shared by the watch (the only writer) and the workers.
#[derive(Clone, Default)]
pub struct ServiceCache {
    inner: Arc<RwLock<Inner>>,
}

fn key(s: &Service) -> (String, String) {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

impl ServiceCache {
    fn read<T>(&self, f: impl FnOnce(&ByNamespace) -> T) -> Result<T, String> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if !inner.synced {
            return Err(
                "services have not yet been read at least once, cannot construct envvars".into(),
            );
        }
        Ok(f(&inner.services))
    }

    pub fn get(&self, namespace: &str, name: &str) -> Result<Option<Service>, String> {
        self.read(|m| m.get(namespace).and_then(|s| s.get(name)).cloned())
    }

    pub fn in_namespace(&self, namespace: &str) -> Result<Vec<Service>, String> {
        self.read(|m| {
            m.get(namespace)
                .map(|s| s.values().cloned().collect())
                .unwrap_or_default()
        })
    }

    fn apply(&self, s: Service) {
        let (ns, name) = key(&s);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.services.entry(ns).or_default().insert(name, s);
    }

    fn delete(&self, s: &Service) {
        let (ns, name) = key(s);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(names) = inner.services.get_mut(&ns) {
            names.remove(&name);
            if names.is_empty() {
                inner.services.remove(&ns);
            }
        }
    }

    /// A (re)list finished: `listed` replaces what was known.
    fn replace(&self, listed: ByNamespace) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.services = listed;
        inner.synced = true;
    }

    /// Keeps the cache current until `stop`.
    pub async fn watch(self, client: Client, stop: CancellationToken) {
        let api: Api<Service> = Api::all(client);
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        // A relist is gathered aside and swapped in whole, so readers never see half of it.
        let mut listing: Option<ByNamespace> = None;
        loop {
            let event = tokio::select! {
                e = stream.next() => e,
                _ = stop.cancelled() => return,
            };
            let Some(event) = event else { return };
            match event {
                Ok(watcher::Event::Init) => listing = Some(ByNamespace::new()),
                Ok(watcher::Event::InitApply(s)) => {
                    let (ns, name) = key(&s);
                    listing
                        .get_or_insert_with(ByNamespace::new)
                        .entry(ns)
                        .or_default()
                        .insert(name, s);
                }
                Ok(watcher::Event::InitDone) => self.replace(listing.take().unwrap_or_default()),
                Ok(watcher::Event::Apply(s)) => self.apply(s),
                Ok(watcher::Event::Delete(s)) => self.delete(&s),
                Err(e) => warn!(error = %e, "service watch"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s
    }

    #[test]
    fn unsynced_refuses_then_answers_by_namespace() {
        let c = ServiceCache::default();
        assert!(c.get("default", "kubernetes").is_err());
        c.replace(ByNamespace::from([(
            "default".to_string(),
            BTreeMap::from([("kubernetes".to_string(), svc("default", "kubernetes"))]),
        )]));
        c.apply(svc("a", "web"));
        c.apply(svc("b", "db"));
        assert!(c.get("default", "kubernetes").unwrap().is_some());
        assert_eq!(c.in_namespace("a").unwrap().len(), 1);
        c.delete(&svc("a", "web"));
        assert!(c.in_namespace("a").unwrap().is_empty());
        assert_eq!(c.in_namespace("b").unwrap().len(), 1);
    }
}
