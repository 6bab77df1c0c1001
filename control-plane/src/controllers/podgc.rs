//! The pod garbage collector (Kubernetes' podgc): force-deletes pods bound to a node that no
//! longer exists (checked against the API, not just the cache) and terminating pods that
//! were never scheduled (no node agent will ever finish them); and every 20 s, when more
//! than `--terminated-pod-gc-threshold` pods have finished, deletes the oldest finished ones.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::{pods, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, Informer, ObjectKey, ReconcileError, Reconciler, WorkQueue,
};

pub const NAME: &str = "podgc";
const TERMINATED_CHECK: Duration = Duration::from_secs(20);

pub struct PodGcController {
    client: Client,
    pods: Informer<Pod>,
    nodes: Informer<Node>,
}

pub fn build(ctx: &Context, token: CancellationToken) -> BoxFuture<'static, ()> {
    let pods = ctx.informers.get::<Pod>();
    let nodes = ctx.informers.get::<Node>();
    super::index_pods(&pods);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let (q, ns) = (queue.clone(), nodes.clone());
    pods.on_change(move |c| match c {
        Change::Added(p) | Change::Updated { new: p, .. } => {
            let orphaned = match pods::node_name(p) {
                Some(n) => ns.get(&ObjectKey::cluster(n)).is_none(),
                None => pods::is_terminating(p),
            };
            if orphaned {
                q.add(ObjectKey::of(p.as_ref()));
            }
        }
        Change::Deleted(_) => {}
    });
    let (q, ps) = (queue.clone(), pods.clone());
    nodes.on_change(move |c| {
        if let Change::Deleted(n) = c {
            for p in ps.by_index(pods::BY_NODE, &n.name_any()) {
                q.add(ObjectKey::of(p.as_ref()));
            }
        }
    });
    let gc = Arc::new(PodGcController {
        client: ctx.client.clone(),
        pods,
        nodes,
    });
    let controller = Controller::new(NAME, gc.clone(), queue, 2, ctx.metrics.clone());
    let threshold = ctx.settings.terminated_pod_gc_threshold;
    Box::pin(async move {
        let sweep = async {
            if threshold == 0 {
                return;
            }
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(TERMINATED_CHECK) => {}
                }
                gc.delete_terminated(threshold).await;
            }
        };
        futures::future::join(controller.run(token.clone()), sweep).await;
    })
}

impl Reconciler for PodGcController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(Action::AwaitChange);
        };
        match pods::node_name(&pod) {
            None if pods::is_terminating(&pod) => {
                tracing::info!(pod = %key, "force-deleting an unscheduled terminating pod");
                self.force_delete(key).await?;
            }
            Some(node) if self.nodes.get(&ObjectKey::cluster(node)).is_none() => {
                // The cache may lag a node's creation: ask the API before deleting.
                let api: Api<Node> = Api::all(self.client.clone());
                if api.get_opt(node).await?.is_none() {
                    tracing::info!(pod = %key, node, "force-deleting a pod bound to a node that does not exist");
                    self.force_delete(key).await?;
                }
            }
            _ => {}
        }
        Ok(Action::AwaitChange)
    }
}

impl PodGcController {
    async fn force_delete(&self, key: &ObjectKey) -> Result<(), ReconcileError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), key.namespace_or_empty());
        match api
            .delete(&key.name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the oldest finished pods beyond `threshold` (an O(pods) pass every 20 s, as in
    /// Kubernetes).
    async fn delete_terminated(&self, threshold: usize) {
        let mut finished: Vec<Arc<Pod>> = self
            .pods
            .list()
            .into_iter()
            .filter(|p| {
                matches!(pods::phase(p), "Succeeded" | "Failed") && !pods::is_terminating(p)
            })
            .collect();
        if finished.len() <= threshold {
            return;
        }
        finished.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let excess = finished.len() - threshold;
        for p in finished.into_iter().take(excess) {
            if let Err(e) = self.force_delete(&ObjectKey::of(p.as_ref())).await {
                tracing::warn!(pod = %p.name_any(), error = %e, "deleting a finished pod failed");
            }
        }
    }
}
