//! The API source: Services and discovery.k8s.io/v1 EndpointSlices listed and then watched
//! through an API server with kube-runtime's watcher (which resumes from the last
//! resourceVersion, relists after a 410 Expired, and backs off while the server is away).
//! The same [`SourceEvent`]s as the manifests directory come out, so nothing downstream
//! knows where the objects came from.
//!
//! A relist is diffed against what was sent before: objects whose resourceVersion did not
//! change are not sent again and objects that disappeared meanwhile become deletions, so a
//! relist costs the daemon only what changed. [`SourceEvent::Synced`] goes out once, when
//! the first complete listing of both kinds has been sent.
//!
//! Like kube-proxy, objects labelled `service.kubernetes.io/service-proxy-name` (another
//! proxy's) or `service.kubernetes.io/headless` are left out by the server-side selector.

use super::{Kind, Resource, ResourceRef, Source, SourceError, SourceEvent};
use crate::model::ObjectKey;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::pin::Pin;
use tokio::sync::mpsc;

/// kube-proxy's selector for both kinds: not another proxy's, not headless.
pub const LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Where the API server is and who this proxy runs for.
#[derive(Clone, Debug, Default)]
pub struct ApiConfig {
    /// A kubeconfig file; `None`: in-cluster configuration when KUBERNETES_SERVICE_HOST is
    /// set (the service account's token and CA), else $KUBECONFIG or ~/.kube/config.
    pub kubeconfig: Option<PathBuf>,
    /// The node this proxy programs (carried in its logs).
    pub node_name: Option<String>,
}

/// Watches Services and EndpointSlices in every namespace.
pub struct ApiSource {
    client: Client,
    node_name: Option<String>,
}

impl ApiSource {
    /// Builds the client from the configuration; nothing is requested yet.
    pub async fn connect(config: &ApiConfig) -> Result<ApiSource, SourceError> {
        let err = |reason: String| SourceError::Api {
            config: config
                .kubeconfig
                .as_ref()
                .map_or_else(|| "inferred".to_string(), |p| p.display().to_string()),
            reason,
        };
        let client_config = match &config.kubeconfig {
            Some(path) => {
                let kc =
                    kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(|e| err(e.to_string()))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| err(e.to_string()))?,
        };
        let client = Client::try_from(client_config).map_err(|e| err(e.to_string()))?;
        Ok(ApiSource {
            client,
            node_name: config.node_name.clone(),
        })
    }
}

type Events =
    Pin<Box<dyn Stream<Item = (Kind, Result<watcher::Event<Resource>, watcher::Error>)> + Send>>;

/// One kind's watch, its objects wrapped as [`Resource`]s.
fn watch<K>(client: &Client, kind: Kind, wrap: fn(K) -> Resource) -> Events
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let config = watcher::Config::default().labels(LABEL_SELECTOR);
    watcher(Api::<K>::all(client.clone()), config)
        .default_backoff()
        .map(move |r| (kind, r.map(|ev| lift(ev, wrap))))
        .boxed()
}

fn lift<K>(ev: watcher::Event<K>, wrap: fn(K) -> Resource) -> watcher::Event<Resource> {
    match ev {
        watcher::Event::Apply(k) => watcher::Event::Apply(wrap(k)),
        watcher::Event::Delete(k) => watcher::Event::Delete(wrap(k)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(k) => watcher::Event::InitApply(wrap(k)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

impl Source for ApiSource {
    async fn run(self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let node = self.node_name.as_deref().unwrap_or("-");
        tracing::info!(%node, selector = LABEL_SELECTOR, "watching Services and EndpointSlices");
        let mut merged = futures::stream::select(
            watch(&self.client, Kind::Service, |s: Service| {
                Resource::Service(Box::new(s))
            }),
            watch(&self.client, Kind::EndpointSlice, |s: EndpointSlice| {
                Resource::EndpointSlice(Box::new(s))
            }),
        );
        let mut services = Tracker::new(Kind::Service);
        let mut slices = Tracker::new(Kind::EndpointSlice);
        let mut synced = false;
        while let Some((kind, result)) = merged.next().await {
            let tracker = match kind {
                Kind::Service => &mut services,
                Kind::EndpointSlice => &mut slices,
            };
            let out = match result {
                Ok(ev) => tracker.on(ev),
                Err(error) => {
                    // The watcher backs off and relists or resumes by itself.
                    tracing::warn!(%node, ?kind, %error, "watch failed; retrying");
                    continue;
                }
            };
            for ev in out {
                if events.send(ev).await.is_err() {
                    return Ok(());
                }
            }
            if !synced && services.listed && slices.listed {
                synced = true;
                tracing::info!(
                    %node,
                    services = services.known.len(),
                    slices = slices.known.len(),
                    "initial listing complete"
                );
                if events.send(SourceEvent::Synced).await.is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

fn key_of(meta: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

fn meta_of(r: &Resource) -> &ObjectMeta {
    match r {
        Resource::Service(s) => &s.metadata,
        Resource::EndpointSlice(s) => &s.metadata,
    }
}

/// What one kind's watch has sent downstream: each object's resourceVersion, and during a
/// (re)list the objects seen so far.
struct Tracker {
    kind: Kind,
    known: HashMap<ObjectKey, Option<String>>,
    relisting: Option<HashSet<ObjectKey>>,
    /// A first complete listing has been sent.
    listed: bool,
}

impl Tracker {
    fn new(kind: Kind) -> Tracker {
        Tracker {
            kind,
            known: HashMap::new(),
            relisting: None,
            listed: false,
        }
    }

    /// The events that bring the consumer from what was sent before to `ev`.
    fn on(&mut self, ev: watcher::Event<Resource>) -> Vec<SourceEvent> {
        match ev {
            watcher::Event::Init => {
                self.relisting = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(r) => {
                let key = key_of(meta_of(&r));
                if let Some(seen) = &mut self.relisting {
                    seen.insert(key);
                }
                self.apply(r)
            }
            watcher::Event::InitDone => {
                self.listed = true;
                let Some(seen) = self.relisting.take() else {
                    return Vec::new();
                };
                let gone: Vec<ObjectKey> = self
                    .known
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                gone.into_iter().map(|key| self.delete(key)).collect()
            }
            watcher::Event::Apply(r) => self.apply(r),
            watcher::Event::Delete(r) => {
                let key = key_of(meta_of(&r));
                match self.known.contains_key(&key) {
                    true => vec![self.delete(key)],
                    false => Vec::new(),
                }
            }
        }
    }

    /// Sends the object unless this very version was sent already (a relist or a resumed
    /// watch repeats objects).
    fn apply(&mut self, r: Resource) -> Vec<SourceEvent> {
        let meta = meta_of(&r);
        let key = key_of(meta);
        let version = meta.resource_version.clone();
        if version.is_some() && self.known.get(&key) == Some(&version) {
            return Vec::new();
        }
        self.known.insert(key, version);
        vec![SourceEvent::Apply(r)]
    }

    fn delete(&mut self, key: ObjectKey) -> SourceEvent {
        self.known.remove(&key);
        SourceEvent::Delete(ResourceRef {
            kind: self.kind,
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, rv: &str) -> Resource {
        Resource::Service(Box::new(Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    /// A compact view of the events: `+name` applied, `-name` deleted.
    fn view(evs: &[SourceEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e {
                SourceEvent::Apply(r) => format!("+{}", meta_of(r).name.clone().unwrap()),
                SourceEvent::Delete(r) => format!("-{}", r.key.name),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn feed(t: &mut Tracker, evs: Vec<watcher::Event<Resource>>) -> Vec<String> {
        let out: Vec<SourceEvent> = evs.into_iter().flat_map(|e| t.on(e)).collect();
        view(&out)
    }

    #[test]
    fn first_listing_sends_everything_and_marks_listed() {
        let mut t = Tracker::new(Kind::Service);
        let out = feed(
            &mut t,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(svc("a", "1")),
                watcher::Event::InitApply(svc("b", "2")),
            ],
        );
        assert_eq!(out, ["+a", "+b"]);
        assert!(!t.listed, "not before InitDone");
        assert!(feed(&mut t, vec![watcher::Event::InitDone]).is_empty());
        assert!(t.listed);
    }

    #[test]
    fn a_relist_sends_only_changes_and_deletes_what_vanished() {
        let mut t = Tracker::new(Kind::Service);
        feed(
            &mut t,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(svc("a", "1")),
                watcher::Event::InitApply(svc("b", "2")),
                watcher::Event::InitApply(svc("c", "3")),
                watcher::Event::InitDone,
            ],
        );
        // After a 410: a unchanged, b changed, c gone, d new.
        let out = feed(
            &mut t,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(svc("a", "1")),
                watcher::Event::InitApply(svc("b", "7")),
                watcher::Event::InitApply(svc("d", "8")),
                watcher::Event::InitDone,
            ],
        );
        assert_eq!(out, ["+b", "+d", "-c"]);
        assert_eq!(t.known.len(), 3);
    }

    #[test]
    fn watch_events_apply_once_and_deletes_of_unknown_objects_are_dropped() {
        let mut t = Tracker::new(Kind::EndpointSlice);
        feed(&mut t, vec![watcher::Event::Init, watcher::Event::InitDone]);
        let out = feed(
            &mut t,
            vec![
                watcher::Event::Apply(svc("a", "5")),
                // A resumed watch repeating the same version.
                watcher::Event::Apply(svc("a", "5")),
                watcher::Event::Apply(svc("a", "6")),
                watcher::Event::Delete(svc("a", "7")),
                watcher::Event::Delete(svc("z", "9")),
            ],
        );
        assert_eq!(out, ["+a", "+a", "-a"]);
        let deleted = t.on(watcher::Event::Apply(svc("q", "1")));
        assert!(matches!(&deleted[..], [SourceEvent::Apply(_)]));
        match &t.on(watcher::Event::Delete(svc("q", "2")))[..] {
            [SourceEvent::Delete(r)] => {
                assert_eq!(r.kind, Kind::EndpointSlice);
                assert_eq!(r.key, ObjectKey::new("ns", "q"));
            }
            other => panic!("{other:?}"),
        }
    }
}
