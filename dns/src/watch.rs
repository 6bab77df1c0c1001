//! The API watch: Services and EndpointSlices through the control plane's shared informers
//! (kube-runtime's watcher: list, watch, resume, relist on 410 diffed against the cache, so
//! a relist only reports what changed). Every change recomputes the one Service it touches
//! from the two caches (the Service and its slices, found by the slices' service-name
//! index): O(that Service's endpoints) per event, never a rebuild of the zone.

use crate::records::{service_records, Records, ServiceKey, ServiceRecords, SERVICE_NAME_LABEL};
use control_plane::runtime::{Change, Informer};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The slices' index: `<namespace>/<service>` from the service-name label.
const BY_SERVICE: &str = "service";

/// Keeps [`Records`] current from the API.
#[derive(Clone)]
pub struct Watch {
    services: Informer<Service>,
    slices: Informer<EndpointSlice>,
    records: Arc<Records>,
    /// Serialises recomputations: the last one of a Service reads both caches after both
    /// were updated, so concurrent events of the two kinds cannot leave a stale result.
    writer: Arc<Mutex<()>>,
}

fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(slice.namespace().unwrap_or_default(), name))
}

fn index_value(key: &ServiceKey) -> String {
    format!("{}/{}", key.namespace, key.name)
}

impl Watch {
    pub fn new(client: Client, records: Arc<Records>) -> Watch {
        let services = Informer::new(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        );
        let slices = Informer::new(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default().labels(SERVICE_NAME_LABEL),
        );
        slices.add_index(BY_SERVICE, |s: &EndpointSlice| {
            slice_service(s)
                .map(|k| index_value(&k))
                .into_iter()
                .collect()
        });
        let w = Watch {
            services,
            slices,
            records,
            writer: Arc::new(Mutex::new(())),
        };
        let me = w.clone();
        w.services.on_change(move |c: &Change<Service>| {
            let s = c.object();
            me.recompute(&ServiceKey::new(
                s.namespace().unwrap_or_default(),
                s.name_any(),
            ));
        });
        let me = w.clone();
        w.slices.on_change(move |c: &Change<EndpointSlice>| {
            let mut keys: Vec<ServiceKey> = slice_service(c.object()).into_iter().collect();
            // A slice relabelled to another Service leaves the old one too.
            if let Change::Updated { old, .. } = c {
                keys.extend(slice_service(old).filter(|k| !keys.contains(k)));
            }
            for k in keys {
                me.recompute(&k);
            }
        });
        w
    }

    /// Rebuilds the records of `key` from the caches.
    fn recompute(&self, key: &ServiceKey) {
        let _serial = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let records = match self.services.get_namespaced(&key.namespace, &key.name) {
            None => ServiceRecords::default(),
            Some(service) => {
                let slices = self.slices.by_index(BY_SERVICE, &index_value(key));
                let refs: Vec<&EndpointSlice> = slices.iter().map(|s| s.as_ref()).collect();
                match service_records(self.records.zone(), key, &service, &refs) {
                    Ok(r) => r,
                    Err(error) => {
                        tracing::warn!(service = %index_value(key), %error, "no records for this service");
                        ServiceRecords::default()
                    }
                }
            }
        };
        self.records.replace(key, records);
    }

    /// Lists and watches until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        tokio::join!(
            self.services.clone().run(token.clone()),
            self.slices.clone().run(token)
        );
    }

    /// Whether both kinds' first listing is in the records.
    pub fn synced(&self) -> bool {
        self.services.has_synced() && self.slices.has_synced()
    }

    /// Waits for the first listing of both kinds.
    pub async fn wait_synced(&self) {
        self.services.wait_synced().await;
        self.slices.wait_synced().await;
    }
}
