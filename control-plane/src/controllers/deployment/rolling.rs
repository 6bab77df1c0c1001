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
        tracing::debug!(deployment = %self.key, sets = ?all.iter().map(|r| (r.name_any(), r.resource_version(), rs_replicas(r), rs_available(r))).collect::<Vec<_>>(), pods = self.pod_count(&all), "rolling update");

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
        old.sort_by(by_creation);
        let sizes: Vec<Size> = old.iter().map(|rs| Size::of(rs)).collect();
        let targets = old_targets(
            &sizes,
            Size::of(new),
            replicas(&self.d) - max_unavailable(&self.d),
        );
        let mut scaled = false;
        for (slot, target) in old.iter_mut().zip(targets) {
            if target != rs_replicas(slot) {
                let (_, w) = self.scale_if_needed(slot, target).await?;
                tracing::debug!(deployment = %self.key, replicaset = %w.name_any(), to = target, "scaled down an old replica set");
                *slot = w;
                scaled = true;
            }
        }
        Ok((scaled, old))
    }
}

/// A ReplicaSet's size (spec.replicas) and its available replicas (status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Size {
    pub replicas: i32,
    pub available: i32,
}

impl Size {
    /// A set's status may lag its spec: just scaled down, it still counts the available
    /// pods its controller is about to delete. At most `replicas` of them stay, so only
    /// those count towards availability.
    fn of(rs: &ReplicaSet) -> Size {
        let replicas = rs_replicas(rs);
        Size {
            replicas,
            available: rs_available(rs).min(replicas),
        }
    }
}

/// The sizes the old ReplicaSets (oldest first) shrink to, never above their current size:
/// first by their unhealthy replicas (removing those costs no availability), then by healthy
/// ones while the available count stays at least `min_available`. The status may lag the
/// spec (more available than wanted while a scale-down is under way); such a set has
/// nothing unhealthy to remove.
pub(super) fn old_targets(old: &[Size], new: Size, min_available: i32) -> Vec<i32> {
    let mut targets: Vec<i32> = old.iter().map(|s| s.replicas).collect();
    let all_pods: i32 = targets.iter().sum::<i32>() + new.replicas;
    if targets.iter().sum::<i32>() == 0 {
        return targets;
    }
    let new_unavailable = (new.replicas - new.available).max(0);
    let max_scaled_down = all_pods - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return targets;
    }
    let mut cleaned = 0;
    for (s, t) in old.iter().zip(targets.iter_mut()) {
        if cleaned >= max_scaled_down {
            break;
        }
        let unhealthy = s.replicas - s.available;
        if s.replicas == 0 || unhealthy <= 0 {
            continue;
        }
        let down = (max_scaled_down - cleaned).min(unhealthy);
        *t -= down;
        cleaned += down;
    }
    let available: i32 = old.iter().map(|s| s.available).sum::<i32>() + new.available;
    if available > min_available {
        let budget = available - min_available;
        let mut scaled = 0;
        for t in targets.iter_mut() {
            if scaled >= budget {
                break;
            }
            let down = (*t).min(budget - scaled);
            *t -= down;
            scaled += down;
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(replicas: i32, available: i32) -> Size {
        Size {
            replicas,
            available,
        }
    }

    #[test]
    fn unhealthy_old_replicas_go_first_then_healthy_ones_within_the_budget() {
        // 4 wanted, maxUnavailable 1: 3 must stay available.
        // Old 4 (2 available), new 1 (1 available): 2 unhealthy old removed for free.
        assert_eq!(old_targets(&[size(4, 2)], size(1, 1), 3), vec![2]);
        // Old 4 all available, new 1 available: 5 available, 2 may go.
        assert_eq!(old_targets(&[size(4, 4)], size(1, 1), 3), vec![2]);
        // New not yet available: only the one maxUnavailable allows may go.
        assert_eq!(old_targets(&[size(4, 4)], size(1, 0), 3), vec![3]);
        // Nothing available beyond the minimum: nothing may go.
        assert_eq!(old_targets(&[size(3, 3)], size(2, 0), 3), vec![3]);
        // Oldest first across several old sets.
        assert_eq!(
            old_targets(&[size(2, 2), size(2, 2)], size(1, 1), 3),
            vec![0, 2]
        );
    }

    #[test]
    fn a_status_that_lags_a_scale_down_never_scales_an_old_set_up() {
        // Scaled 3 -> 2 a moment ago; the status still counts 3 available.
        let t = old_targets(&[size(2, 3)], size(3, 2), 3);
        assert!(t[0] <= 2, "{t:?}");
        // Counted as they will be (at most their size available), such a set leaves the
        // availability budget intact: 4 -> 3 just written, 4 still counted available, new
        // 1 available; 3 must stay available, so only one more may go.
        let rs = |replicas: i32, available: i32| -> ReplicaSet {
            serde_json::from_value(serde_json::json!({
                "spec": {"replicas": replicas, "selector": {}},
                "status": {"replicas": available, "availableReplicas": available},
            }))
            .unwrap()
        };
        assert_eq!(Size::of(&rs(3, 4)), size(3, 3));
        assert_eq!(
            old_targets(&[Size::of(&rs(3, 4))], Size::of(&rs(1, 1)), 3),
            vec![2]
        );
        // Every combination: no target above the current size, none below zero.
        for r in 0..6 {
            for a in 0..8 {
                for nr in 0..6 {
                    for na in 0..8 {
                        for min in 0..5 {
                            let t = old_targets(&[size(r, a), size(1, 1)], size(nr, na), min);
                            assert!(
                                t[0] <= r && t[0] >= 0 && t[1] <= 1 && t[1] >= 0,
                                "{r} {a} {nr} {na} {min}: {t:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
