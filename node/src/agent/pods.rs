//! The agent's pods: one worker per pod bound to this node (from the watch on
//! `spec.nodeName=<node>`), fed each new version of its Pod; after every (re)list, sandboxes
//! that no pod wants are removed from the runtime.

use crate::cri::Cri;
use crate::metrics::Metrics;
use crate::pod::spec::POD_UID;
use crate::pod::{NodeContext, PodHandle, PodWorker};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tracing::info;

use super::report::StartTimes;

/// The newest Pod objects on this node by (namespace, name), for the kubelet API.
pub type PodIndex = Arc<RwLock<HashMap<(String, String), Pod>>>;

pub struct Pods {
    ctx: Arc<NodeContext>,
    workers: HashMap<String, PodHandle>,
    index: PodIndex,
    metrics: Arc<Metrics>,
    starts: Arc<StartTimes>,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

impl Pods {
    pub fn new(
        ctx: Arc<NodeContext>,
        index: PodIndex,
        metrics: Arc<Metrics>,
        starts: Arc<StartTimes>,
    ) -> Pods {
        Pods {
            ctx,
            workers: HashMap::new(),
            index,
            metrics,
            starts,
        }
    }

    /// A pod was listed, added or changed.
    pub fn apply(&mut self, pod: Pod) {
        let id = uid(&pod);
        self.index
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(&pod), pod.clone());
        match self.workers.get(&id) {
            Some(h) => {
                h.pod.send_replace(pod);
            }
            None => {
                if pod.metadata.deletion_timestamp.is_none() {
                    self.starts.seen(&id);
                }
                self.workers
                    .insert(id, PodWorker::spawn(self.ctx.clone(), pod));
            }
        }
        self.reap();
    }

    /// A pod object is gone. If its worker still runs (deleted without a grace period),
    /// tell it to terminate now.
    pub fn delete(&mut self, pod: &Pod) {
        let id = uid(pod);
        self.index
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(pod));
        if let Some(h) = self.workers.get(&id) {
            let mut gone = pod.clone();
            if gone.metadata.deletion_timestamp.is_none() {
                gone.metadata.deletion_timestamp = Some(crate::pod::now());
                gone.metadata.deletion_grace_period_seconds = Some(0);
            }
            h.pod.send_replace(gone);
        }
        self.reap();
    }

    /// A (re)list finished: `seen` holds every pod uid it returned. Workers of pods that
    /// vanished meanwhile terminate; sandboxes no pod wants are removed.
    pub async fn listed(&mut self, seen: &HashSet<String>) {
        let stale: Vec<Pod> = self
            .workers
            .iter()
            .filter(|(id, _)| !seen.contains(*id))
            .map(|(_, h)| h.pod.borrow().clone())
            .collect();
        for pod in stale {
            self.delete(&pod);
        }
        // Before the runtime's garbage: volumes of pods deleted while the agent was down are
        // unmounted through their drivers.
        if let Some(csi) = &self.ctx.csi {
            let live: HashSet<String> = seen
                .union(&self.workers.keys().cloned().collect())
                .cloned()
                .collect();
            csi.orphans(&live);
        }
        self.collect_garbage(&self.ctx.cri.clone()).await;
    }

    async fn collect_garbage(&mut self, cri: &Cri) {
        let Ok(sandboxes) = cri.list_pod_sandboxes(HashMap::new()).await else {
            return;
        };
        for s in sandboxes {
            let owner = s.labels.get(POD_UID).cloned().unwrap_or_default();
            if self.workers.contains_key(&owner) {
                continue;
            }
            info!(sandbox = %s.id, pod_uid = %owner, "removing a sandbox no pod wants");
            let _ = cri.stop_pod_sandbox(&s.id).await;
            let _ = cri.remove_pod_sandbox(&s.id).await;
            if !owner.is_empty() {
                crate::cgroups::remove_tree(&self.ctx.node.pod_cgroup(&owner));
                crate::pod::volumes::remove_pod_dir(&self.ctx.layout.pod_dir(&owner));
            }
            self.metrics.runtime_gc_removed.inc();
        }
    }

    /// Forgets workers that finished (their pods are terminated and removed).
    fn reap(&mut self) {
        self.workers.retain(|_, h| !h.task.is_finished());
        self.metrics.pods.set(self.workers.len() as i64);
    }

    /// Detaches every worker, leaving the pods running for the next agent.
    pub fn detach_all(&mut self) {
        for (_, h) in self.workers.drain() {
            h.task.abort();
        }
    }
}
