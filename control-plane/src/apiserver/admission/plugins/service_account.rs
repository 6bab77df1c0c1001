//! ServiceAccount: a new pod runs as a service account, and can reach the API as it.
//! Mutating, on pod create (as Kubernetes' plugin): `spec.serviceAccountName` defaults to
//! `default`; unless `automountServiceAccountToken` is false (on the pod, else on the
//! account), the pod gets the projected volume `kube-api-access-<5 random>` (a bound
//! serviceAccountToken `token` of 3607 s, the `kube-root-ca.crt` ConfigMap's `ca.crt`, the
//! namespace from the downward API) mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every init and app container that
//! has nothing mounted there. Validating: the named account exists (a `Forbidden` naming
//! it otherwise). Mirror pods (static pods of a node) are left alone: NodeRestriction
//! refuses any that refer to an account, secret, configmap or token.
//!
//! One difference from Kubernetes, on purpose: a pod naming the `default` account is
//! admitted while that account does not exist yet (a namespace created a moment before,
//! ahead of the serviceaccounts controller); Kubernetes refuses it, which makes every
//! "create a namespace, then a pod" script racy. The node agent's TokenRequest waits for
//! the account like any other missing source.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::super::{Env, Operation, Plugin, Request};
use crate::machinery::ApiError;

/// The account a pod that names none runs as.
pub const DEFAULT_ACCOUNT: &str = "default";
/// The name prefix of the projected token volume.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// Where the token, ca.crt and namespace are mounted in each container.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token lifetime the volume asks for (Kubernetes' warn-only bound token expiry).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The ConfigMap holding the cluster's CA bundle in each namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
use super::node_restriction::MIRROR_ANNOTATION;

pub struct ServiceAccount {
    env: Env,
}

impl ServiceAccount {
    pub fn new(env: Env) -> ServiceAccount {
        ServiceAccount { env }
    }

    fn applies(req: &Request<'_>) -> bool {
        req.is_pod() && req.operation == Operation::Create
    }
}

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some()
}

fn account_name(pod: &Value) -> &str {
    pod.pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_ACCOUNT)
}

/// Kubernetes' shouldAutomount: the pod's setting wins, then the account's, then true.
fn should_automount(pod: &Value, account: Option<&Value>) -> bool {
    let pod_says = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool);
    let account_says = account
        .and_then(|a| a.get("automountServiceAccountToken"))
        .and_then(Value::as_bool);
    pod_says.or(account_says).unwrap_or(true)
}

/// `kube-api-access-` and 5 random characters.
fn volume_name() -> String {
    format!(
        "{VOLUME_PREFIX}{}",
        crate::apiserver::meta::random_suffix(5)
    )
}

/// The projected source of the token volume, as Kubernetes' TokenVolumeSource.
pub fn token_volume_source() -> Value {
    json!({
        "defaultMode": 0o644,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
            {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]
    })
}

/// Adds the token volume and its mount to every init and app container lacking a mount at
/// [`MOUNT_PATH`] (an existing `kube-api-access-*` volume is reused).
fn mount_token(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .find(|n| n.starts_with(VOLUME_PREFIX))
                .map(str::to_string)
        });
    let name = existing.clone().unwrap_or_else(volume_name);
    let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            let Some(mounts) = mounts.as_array_mut() else {
                continue;
            };
            let taken = mounts
                .iter()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH));
            if !taken {
                mounts.push(mount.clone());
                needed = true;
            }
        }
    }
    if needed && existing.is_none() {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(volumes) = volumes.as_array_mut() {
            volumes.push(json!({"name": name, "projected": token_volume_source()}));
        }
    }
}

#[async_trait]
impl Plugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    async fn admit(&self, req: &Request<'_>, obj: Option<&mut Value>) -> Result<(), ApiError> {
        let (true, Some(pod), Some(ns)) = (Self::applies(req), obj, req.namespace) else {
            return Ok(());
        };
        if is_mirror(pod) {
            return Ok(());
        }
        let name = account_name(pod).to_string();
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("serviceAccountName".into(), json!(name));
        }
        let account = self
            .env
            .get_value("", "serviceaccounts", Some(ns), &name)
            .await?;
        // A missing account is refused in validation (or admitted, for `default`).
        if should_automount(pod, account.as_ref()) {
            mount_token(pod);
        }
        Ok(())
    }

    async fn validate(&self, req: &Request<'_>, obj: Option<&Value>) -> Result<(), ApiError> {
        let (true, Some(pod), Some(ns)) = (Self::applies(req), obj, req.namespace) else {
            return Ok(());
        };
        if is_mirror(pod) {
            // A node's static pod: NodeRestriction refuses references to accounts.
            return Ok(());
        }
        let name = account_name(pod);
        if name == DEFAULT_ACCOUNT {
            return Ok(());
        }
        match self
            .env
            .get("", "serviceaccounts", Some(ns), name)
            .await?
        {
            Some(_) => Ok(()),
            None => Err(req.forbidden(
                Some(pod),
                format!(
                    "error looking up service account {ns}/{name}: serviceaccount \"{name}\" not found"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "n"}, "spec": spec})
    }

    #[test]
    fn every_container_mounts_one_token_volume() {
        let mut p = pod(json!({
            "initContainers": [{"name": "i", "image": "x"}],
            "containers": [
                {"name": "a", "image": "x"},
                {"name": "b", "image": "x", "volumeMounts": [{"name": "mine", "mountPath": MOUNT_PATH}]}
            ],
            "volumes": [{"name": "mine", "emptyDir": {}}]
        }));
        mount_token(&mut p);
        let volumes = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(volumes.len(), 2);
        let name = volumes[1]["name"].as_str().unwrap();
        assert!(name.starts_with(VOLUME_PREFIX) && name.len() == VOLUME_PREFIX.len() + 5);
        assert_eq!(
            volumes[1]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3607
        );
        assert_eq!(
            p["spec"]["initContainers"][0]["volumeMounts"][0]["name"],
            name
        );
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["readOnly"],
            true
        );
        // Its own mount at the path is kept, nothing added.
        assert_eq!(
            p["spec"]["containers"][1]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        // Idempotent: a reinvocation adds nothing.
        let before = p.clone();
        mount_token(&mut p);
        assert_eq!(p, before);
    }

    #[test]
    fn automount_is_the_pods_choice_then_the_accounts() {
        let sa_no = json!({"automountServiceAccountToken": false});
        assert!(should_automount(&pod(json!({})), None));
        assert!(!should_automount(&pod(json!({})), Some(&sa_no)));
        let pod_yes = pod(json!({"automountServiceAccountToken": true}));
        assert!(should_automount(&pod_yes, Some(&sa_no)));
        let pod_no = pod(json!({"automountServiceAccountToken": false}));
        assert!(!should_automount(&pod_no, None));
    }
}
