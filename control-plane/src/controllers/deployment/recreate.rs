//! The Recreate strategy (Kubernetes' rolloutRecreate): scale every old ReplicaSet to zero,
//! wait until none of their pods runs any more, then create or scale up the new ReplicaSet.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::ResourceExt;

use super::util::*;
use super::Sync;
use crate::controllers::pods;
use crate::runtime::owner::BY_CONTROLLER_UID;
use crate::runtime::{Action, ReconcileError};

impl Sync<'_> {
    pub(super) async fn rollout_recreate(
        &mut self,
        sets: &[Arc<ReplicaSet>],
    ) -> Result<Action, ReconcileError> {
        let (new, old) = self.new_and_old(sets, false).await?;
        let mut old = old;
        let mut scaled_down = false;
        for slot in old.iter_mut() {
            if rs_replicas(slot) > 0 {
                let (changed, w) = self.scale_if_needed(slot, 0).await?;
                scaled_down |= changed;
                *slot = w;
            }
        }
        let mut all = old.clone();
        all.extend(new.clone());
        if scaled_down || self.old_pods_running(&old) {
            return self.sync_rollout_status(&all, new.as_ref()).await;
        }
        let new = match new {
            Some(n) => n,
            None => {
                let (n, _) = self.new_and_old(sets, true).await?;
                n.ok_or_else(|| {
                    ReconcileError::Retry("the new replica set was not created".into())
                })?
            }
        };
        let (_, new) = self.scale_if_needed(&new, replicas(&self.d)).await?;
        let mut all = old.clone();
        all.push(new.clone());
        let status = calculate_status(&all, Some(&new), &self.d, self.now);
        if is_complete(&self.d, &status) {
            self.cleanup(&old).await?;
        }
        self.sync_rollout_status(&all, Some(&new)).await
    }

    /// Whether a pod of an old ReplicaSet may still be running (anything not finished).
    fn old_pods_running(&self, old: &[Arc<ReplicaSet>]) -> bool {
        old.iter().any(|rs| {
            if rs.status.as_ref().is_some_and(|s| s.replicas > 0) {
                return true;
            }
            self.c
                .pods
                .by_index(BY_CONTROLLER_UID, &rs.uid().unwrap_or_default())
                .iter()
                .any(|p| !matches!(pods::phase(p), "Failed" | "Succeeded"))
        })
    }
}
