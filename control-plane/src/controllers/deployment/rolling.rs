//! The RollingUpdate strategy (Kubernetes' rolloutRolling): grow the new ReplicaSet while the
//! total stays within replicas + maxSurge, shrink the old ones while the available count stays
//! at least replicas - maxUnavailable (unhealthy old replicas go first, as they cost no
//! availability), and once complete delete history beyond revisionHistoryLimit.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::ResourceExt;

use super::util::*;
use super::Sync;
use crate::runtime::{Action, ReconcileError};

impl Sync<'_> {
    pub(super) async fn rollout_rolling(
        &mut self,
        sets: &[Arc<ReplicaSet>],
    ) -> Result<Action, ReconcileError> {
        let (new, mut old) = self.new_and_old(sets, true).await?;
        let Some(mut new) = new else {
            return Err(ReconcileError::Retry(
                "the new replica set was not created".into(),
            ));
        };
        let mut all = old.clone();
        all.push(new.clone());

        // Scale up the new ReplicaSet within the surge.
        let want = replicas(&self.d);
        let target = if rs_replicas(&new) > want {
            want
        } else {
            new_rs_new_replicas(&self.d, self.pod_count(&all), &new)
        };
        let (scaled_up, written) = self.scale_if_needed(&new, target).await?;
        new = written;
        if scaled_up {
            let mut all = old.clone();
            all.push(new.clone());
            return self.sync_rollout_status(&all, Some(&new)).await;
        }

        // Scale down old ReplicaSets within the availability budget.
        let (scaled_down, updated_old) = self.reconcile_old(&old, &new).await?;
        old = updated_old;
        let mut all = old.clone();
        all.push(new.clone());
        if scaled_down {
            return self.sync_rollout_status(&all, Some(&new)).await;
        }
        let status = calculate_status(&all, Some(&new), &self.d, self.now);
        if is_complete(&self.d, &status) {
            self.cleanup(&old).await?;
        }
        self.sync_rollout_status(&all, Some(&new)).await
    }

    /// reconcileOldReplicaSets: returns whether anything was scaled down, and the old sets as
    /// they now are.
    async fn reconcile_old(
        &mut self,
        old: &[Arc<ReplicaSet>],
        new: &Arc<ReplicaSet>,
    ) -> Result<(bool, Vec<Arc<ReplicaSet>>), ReconcileError> {
        let mut old = old.to_vec();
        if replica_count(&old) == 0 {
            return Ok((false, old));
        }
        let mut all = old.clone();
        all.push(new.clone());
        let all_pods = replica_count(&all);
        let min_available = replicas(&self.d) - max_unavailable(&self.d);
        let new_unavailable = rs_replicas(new) - rs_available(new);
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok((false, old));
        }

        // Unhealthy old replicas first: removing them costs no availability.
        old.sort_by(by_creation);
        let mut cleaned = 0;
        for slot in old.iter_mut() {
            if cleaned >= max_scaled_down {
                break;
            }
            let (r, a) = (rs_replicas(slot), rs_available(slot));
            if r == 0 || r == a {
                continue;
            }
            let down = (max_scaled_down - cleaned).min(r - a);
            let (_, w) = self.scale_if_needed(slot, r - down).await?;
            *slot = w;
            cleaned += down;
        }

        // Then healthy ones, as far as availability allows.
        let mut all = old.clone();
        all.push(new.clone());
        let available = available_replica_count(&all);
        let mut scaled = 0;
        if available > min_available {
            let budget = available - min_available;
            for slot in old.iter_mut() {
                if scaled >= budget {
                    break;
                }
                let r = rs_replicas(slot);
                if r == 0 {
                    continue;
                }
                let down = r.min(budget - scaled);
                let (_, w) = self.scale_if_needed(slot, r - down).await?;
                tracing::debug!(deployment = %self.key, replicaset = %w.name_any(), down, "scaled down an old replica set");
                *slot = w;
                scaled += down;
            }
        }
        Ok((cleaned + scaled > 0, old))
    }
}
