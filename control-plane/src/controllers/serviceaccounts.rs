//! The serviceaccounts controller (Kubernetes' serviceaccount-controller): every namespace
//! has a ServiceAccount named `default`, created when the namespace appears and again if it
//! is deleted (not in a namespace being terminated). Pods that name no service account run
//! as it (the ServiceAccount admission plugin fills it in).
//!
//! Scale: the controller watches only the `default` accounts (a field selector), so its
//! cache holds one object per namespace, not every account of the cluster; a change costs
//! one cache lookup.

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "serviceaccount";
/// The account every namespace gets.
pub const DEFAULT_ACCOUNT: &str = "default";

pub struct ServiceAccountsController {
    client: Client,
    namespaces: Informer<Namespace>,
    /// Only the `default` accounts.
    accounts: Informer<ServiceAccount>,
}

/// Whether a namespace is going away (nothing new may be created in it).
pub fn is_terminating(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
}

/// Whether a create failed only because the namespace is gone or going (nothing to retry).
pub fn namespace_gone(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code == 404 || (s.code == 403 && s.message.contains("is being terminated"))
        }
        _ => false,
    }
}

pub fn build(ctx: &Context, token: CancellationToken) -> BoxFuture<'static, ()> {
    let namespaces = ctx.informers.get::<Namespace>();
    let accounts = super::named_informer::<ServiceAccount>(&ctx.client, DEFAULT_ACCOUNT);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    namespaces.on_change(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } if !is_terminating(n) => {
            q.add(ObjectKey::of(n.as_ref()));
        }
        _ => {}
    });
    let q = queue.clone();
    accounts.on_change(move |c| {
        if let Change::Deleted(sa) = c {
            q.add(ObjectKey::cluster(sa.namespace().unwrap_or_default()));
        }
    });
    let c = ServiceAccountsController {
        client: ctx.client.clone(),
        namespaces,
        accounts: accounts.clone(),
    };
    let controller = Controller::new(NAME, Arc::new(c), queue, 1, ctx.metrics.clone());
    super::run_with_informer(accounts, controller, token)
}

impl Reconciler for ServiceAccountsController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if is_terminating(&ns)
            || self
                .accounts
                .get_namespaced(&key.name, DEFAULT_ACCOUNT)
                .is_some()
        {
            return Ok(Action::AwaitChange);
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &key.name);
        let sa = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(DEFAULT_ACCOUNT.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &sa).await {
            Ok(_) => {
                tracing::info!(namespace = %key.name, "created the default service account");
                Ok(Action::AwaitChange)
            }
            Err(e) if api_code(&e) == Some(409) || namespace_gone(&e) => Ok(Action::AwaitChange),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_namespace_being_deleted_is_terminating() {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
        assert!(!is_terminating(&ns));
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}}),
        )
        .unwrap();
        assert!(is_terminating(&ns));
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        )
        .unwrap();
        assert!(is_terminating(&ns));
    }
}
