//! The root CA certificate publisher (Kubernetes' root-ca-cert-publisher): every namespace
//! has a ConfigMap `kube-root-ca.crt` whose `ca.crt` is the CA bundle that verifies the API
//! server, so a pod can trust `https://kubernetes.default.svc` (the projected
//! `kube-api-access-*` volume mounts it as `ca.crt`). The controller creates it in each new
//! namespace and puts it back when it is deleted or edited.
//!
//! The bundle is the controller-manager's `--root-ca-file`, else the certificate authority
//! of its kubeconfig; without either the controller does not run (there is nothing to
//! publish), as in Kubernetes.
//!
//! Scale: only ConfigMaps named `kube-root-ca.crt` are watched (a field selector): one per
//! namespace in the cache, one lookup per change.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::serviceaccounts::{is_terminating, namespace_gone};
use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "root-ca-cert-publisher";
/// The ConfigMap every namespace gets.
pub const CONFIG_MAP: &str = "kube-root-ca.crt";
/// Its key holding the PEM bundle.
pub const CA_KEY: &str = "ca.crt";
const DESCRIPTION_KEY: &str = "kubernetes.io/description";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver \
when using internal endpoints such as the internal service IP or kubernetes.default.svc. No \
other usage is guaranteed across distributions of Kubernetes clusters.";

/// The CA bundle to publish (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootCa(pub Arc<str>);

/// The bundle to publish: `root_ca_file` if given, else the certificate authority of the
/// kubeconfig's current cluster (None: there is none, the cluster is plain HTTP).
pub fn load(root_ca_file: Option<&Path>, kubeconfig: &Path) -> Result<Option<RootCa>, String> {
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()));
    if let Some(file) = root_ca_file {
        return Ok(Some(RootCa(read(file)?.into())));
    }
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| format!("reading {}: {e}", kubeconfig.display()))?;
    let context = kc
        .current_context
        .as_deref()
        .and_then(|c| kc.contexts.iter().find(|n| n.name == c))
        .and_then(|n| n.context.as_ref());
    let cluster = kc
        .clusters
        .iter()
        .find(|n| context.is_none_or(|c| c.cluster == n.name))
        .and_then(|n| n.cluster.as_ref());
    let Some(cluster) = cluster else {
        return Ok(None);
    };
    if let Some(data) = &cluster.certificate_authority_data {
        // ByteString's serde form is base64, as kubeconfig's data fields are.
        let pem: k8s_openapi::ByteString = serde_json::from_value(serde_json::Value::String(
            data.trim().to_string(),
        ))
        .map_err(|e| format!("{}: certificate-authority-data: {e}", kubeconfig.display()))?;
        let pem = String::from_utf8(pem.0)
            .map_err(|e| format!("{}: certificate-authority-data: {e}", kubeconfig.display()))?;
        return Ok(Some(RootCa(pem.into())));
    }
    match &cluster.certificate_authority {
        Some(file) => Ok(Some(RootCa(read(Path::new(file))?.into()))),
        None => Ok(None),
    }
}

pub struct PublisherController {
    client: Client,
    namespaces: Informer<Namespace>,
    /// Only the `kube-root-ca.crt` ConfigMaps.
    config_maps: Informer<ConfigMap>,
    ca: RootCa,
}

/// Starts the publisher, or None when there is no CA to publish.
pub fn build(ctx: &Context, token: CancellationToken) -> Option<BoxFuture<'static, ()>> {
    let Some(ca) = ctx.settings.root_ca.clone() else {
        tracing::warn!(
            "no root CA (--root-ca-file, or a certificate authority in the kubeconfig): \
             root-ca-cert-publisher not started"
        );
        return None;
    };
    let namespaces = ctx.informers.get::<Namespace>();
    let config_maps = super::named_informer::<ConfigMap>(&ctx.client, CONFIG_MAP);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    namespaces.on_change(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } if !is_terminating(n) => {
            q.add(ObjectKey::of(n.as_ref()));
        }
        _ => {}
    });
    let q = queue.clone();
    config_maps.on_change(move |c| {
        q.add(ObjectKey::cluster(
            c.object().namespace().unwrap_or_default(),
        ));
    });
    let c = PublisherController {
        client: ctx.client.clone(),
        namespaces,
        config_maps: config_maps.clone(),
        ca,
    };
    let controller = Controller::new(NAME, Arc::new(c), queue, 1, ctx.metrics.clone());
    Some(super::run_with_informer(config_maps, controller, token))
}

/// What `cm` must become to publish `ca` (None: it already does). Other keys and
/// annotations are kept, as Kubernetes keeps them.
pub fn desired(cm: &ConfigMap, ca: &RootCa) -> Option<ConfigMap> {
    let data_ok = cm
        .data
        .as_ref()
        .is_some_and(|d| d.len() == 1 && d.get(CA_KEY).map(String::as_str) == Some(&*ca.0))
        && cm.binary_data.as_ref().is_none_or(BTreeMap::is_empty);
    let annotated = cm.annotations().contains_key(DESCRIPTION_KEY);
    if data_ok && annotated {
        return None;
    }
    let mut cm = cm.clone();
    cm.data = Some(BTreeMap::from([(CA_KEY.to_string(), ca.0.to_string())]));
    cm.binary_data = None;
    cm.annotations_mut()
        .entry(DESCRIPTION_KEY.to_string())
        .or_insert_with(|| DESCRIPTION.to_string());
    Some(cm)
}

impl Reconciler for PublisherController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if is_terminating(&ns) {
            return Ok(Action::AwaitChange);
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.name);
        let result = match self.config_maps.get_namespaced(&key.name, CONFIG_MAP) {
            None => {
                let mut cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(CONFIG_MAP.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                cm = desired(&cm, &self.ca).unwrap_or(cm);
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
            Some(cm) => match desired(&cm, &self.ca) {
                None => return Ok(Action::AwaitChange),
                // With its resourceVersion: a concurrent change is a 409 and a retry.
                Some(cm) => api
                    .replace(CONFIG_MAP, &PostParams::default(), &cm)
                    .await
                    .map(|_| ()),
            },
        };
        match result {
            Ok(()) => {
                tracing::info!(namespace = %key.name, "published {CONFIG_MAP}");
                Ok(Action::AwaitChange)
            }
            // A create racing the cache: the watch brings the existing one back.
            Err(e) if api_code(&e) == Some(409) => Err(e.into()),
            Err(e) if namespace_gone(&e) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ca() -> RootCa {
        RootCa("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into())
    }

    #[test]
    fn the_bundle_comes_from_the_file_else_the_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let pem = ca().0.as_bytes().to_vec();
        let kubeconfig = dir.path().join("kubeconfig");
        let data = serde_json::to_value(k8s_openapi::ByteString(pem)).unwrap();
        let data = data.as_str().unwrap();
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: s, user: u}}\nclusters:\n- name: other\n  cluster: {{server: 'https://x'}}\n- name: s\n  cluster: {{server: 'https://y', certificate-authority-data: {data}}}\nusers:\n- name: u\n  user: {{}}\n"
            ),
        )
        .unwrap();
        assert_eq!(load(None, &kubeconfig).unwrap(), Some(ca()));
        let file = dir.path().join("ca.crt");
        std::fs::write(&file, "other").unwrap();
        assert_eq!(
            load(Some(&file), &kubeconfig).unwrap().unwrap().0.as_ref(),
            "other"
        );
        let plain = dir.path().join("plain");
        std::fs::write(
            &plain,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster: {server: 'http://y'}\n",
        )
        .unwrap();
        assert_eq!(load(None, &plain).unwrap(), None);
        assert!(load(Some(&dir.path().join("missing")), &plain).is_err());
    }

    #[test]
    fn a_published_config_map_is_left_alone_and_an_edited_one_restored() {
        let fresh = desired(&ConfigMap::default(), &ca()).unwrap();
        assert_eq!(fresh.data.as_ref().unwrap()[CA_KEY], &*ca().0);
        assert!(fresh.annotations().contains_key(DESCRIPTION_KEY));
        assert_eq!(desired(&fresh, &ca()), None);

        let edited: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": CONFIG_MAP, "annotations": {"mine": "x", DESCRIPTION_KEY: "d"}},
            "data": {"ca.crt": "other", "extra": "y"}
        }))
        .unwrap();
        let restored = desired(&edited, &ca()).unwrap();
        assert_eq!(
            restored.data.clone().unwrap(),
            BTreeMap::from([(CA_KEY.to_string(), ca().0.to_string())])
        );
        assert_eq!(restored.annotations()["mine"], "x");
        assert_eq!(restored.annotations()[DESCRIPTION_KEY], "d");
    }
}
