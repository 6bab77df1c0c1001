//! From the metrics' proposal to the replica count the HPA sets, as kube-controller-manager
//! normalizes it: stabilization over the recent recommendations of this HPA (the highest of
//! the scale-down window, the lowest of the scale-up window), then the scaling limits (the
//! behavior's Pods/Percent policies over the scale events of their periods, selectPolicy
//! Max/Min/Disabled; without a behavior, at most double or 4 per sync), then [min, max]. The
//! conditions AbleToScale and ScalingLimited carry Kubernetes' reasons. [`History`] is the
//! state one HPA keeps between syncs (it is not stored, as in Kubernetes).

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
use k8s_openapi::jiff::Timestamp;

use crate::controllers::pods::elapsed;
use crate::machinery::kinds::hpa::{
    scale_down_rules, scale_up_rules, POLICY_PERCENT, POLICY_PODS, SELECT_DISABLED, SELECT_MIN,
};

/// --horizontal-pod-autoscaler-downscale-stabilization: the scale-down window of an HPA
/// without a behavior.
pub const DOWNSCALE_STABILIZATION: Duration = Duration::from_secs(300);

/// Without a behavior, one sync scales up to at most this factor of the current count...
const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
/// ...or this many replicas, the larger.
const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;

/// A condition to set: reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    pub reason: &'static str,
    pub message: &'static str,
}

const fn why(reason: &'static str, message: &'static str) -> Why {
    Why { reason, message }
}

const READY_FOR_NEW_SCALE: Why = why("ReadyForNewScale", "recommended size matches current size");
const SCALE_DOWN_STABILIZED: Why = why(
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const SCALE_UP_STABILIZED: Why = why(
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const WITHIN_RANGE: Why = why(
    "DesiredWithinRange",
    "the desired count is within the acceptable range",
);
const SCALE_UP_LIMIT: Why = why(
    "ScaleUpLimit",
    "the desired replica count is increasing faster than the maximum scale rate",
);
const TOO_MANY: Why = why(
    "TooManyReplicas",
    "the desired replica count is more than the maximum replica count",
);
const TOO_FEW: Why = why(
    "TooFewReplicas",
    "the desired replica count is less than the minimum replica count",
);
const SCALE_DOWN_LIMIT: Why = why(
    "ScaleDownLimit",
    "the desired replica count is decreasing faster than the maximum scale rate",
);

/// The outcome of normalization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Normalized {
    pub replicas: i32,
    /// AbleToScale (True) with this reason.
    pub able: Why,
    /// ScalingLimited: whether it limited the count, and why.
    pub limited: (bool, Why),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recommendation {
    replicas: i32,
    at: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScaleEvent {
    change: i32,
    at: Timestamp,
}

/// What one HPA remembers between syncs.
#[derive(Clone, Debug, Default)]
pub struct History {
    recommendations: Vec<Recommendation>,
    scale_up: Vec<ScaleEvent>,
    scale_down: Vec<ScaleEvent>,
}

impl History {
    /// The first recommendation is the current count (recordInitialRecommendation).
    pub fn init(&mut self, current: i32, now: Timestamp) {
        if self.recommendations.is_empty() {
            self.recommendations.push(Recommendation {
                replicas: current,
                at: now,
            });
        }
    }

    /// Remembers a rescale for the behavior's policies (storeScaleEvent); events older than
    /// the longest policy period are reused.
    pub fn record_scale(
        &mut self,
        behavior: Option<&HorizontalPodAutoscalerBehavior>,
        from: i32,
        to: i32,
        now: Timestamp,
    ) {
        let Some(b) = behavior else { return };
        let (events, rules) = if to > from {
            (&mut self.scale_up, scale_up_rules(b.scale_up.clone()))
        } else {
            (&mut self.scale_down, scale_down_rules(b.scale_down.clone()))
        };
        let longest = rules
            .policies
            .iter()
            .flatten()
            .map(|p| p.period_seconds)
            .max()
            .unwrap_or(0);
        let longest = Duration::from_secs(u64::try_from(longest).unwrap_or(0));
        let event = ScaleEvent {
            change: (to - from).abs(),
            at: now,
        };
        match events.iter_mut().find(|e| elapsed(e.at, now) > longest) {
            Some(old) => *old = event,
            None => events.push(event),
        }
    }

    /// Kubernetes' normalizeDesiredReplicas (no behavior): the highest recommendation of the
    /// downscale window, then at most double (or 4) and [min, max].
    pub fn normalize(
        &mut self,
        current: i32,
        proposed: i32,
        min: i32,
        max: i32,
        now: Timestamp,
    ) -> Normalized {
        let mut stabilized = proposed;
        for r in &self.recommendations {
            if elapsed(r.at, now) <= DOWNSCALE_STABILIZATION {
                stabilized = stabilized.max(r.replicas);
            }
        }
        let new = Recommendation {
            replicas: proposed,
            at: now,
        };
        match self
            .recommendations
            .iter_mut()
            .find(|r| elapsed(r.at, now) > DOWNSCALE_STABILIZATION)
        {
            Some(old) => *old = new,
            None => self.recommendations.push(new),
        }
        let able = if stabilized != proposed {
            SCALE_DOWN_STABILIZED
        } else {
            READY_FOR_NEW_SCALE
        };
        let scale_up_limit =
            (SCALE_UP_LIMIT_FACTOR * f64::from(current)).max(SCALE_UP_LIMIT_MINIMUM) as i32;
        let (ceiling, over) = if max > scale_up_limit {
            (scale_up_limit, SCALE_UP_LIMIT)
        } else {
            (max, TOO_MANY)
        };
        let (replicas, limit) = if stabilized < min {
            (min, TOO_FEW)
        } else if stabilized > ceiling {
            (ceiling, over)
        } else {
            (stabilized, WITHIN_RANGE)
        };
        Normalized {
            replicas,
            able,
            limited: (replicas != stabilized, limit),
        }
    }

    /// Kubernetes' normalizeDesiredReplicasWithBehaviors.
    pub fn normalize_with_behavior(
        &mut self,
        behavior: &HorizontalPodAutoscalerBehavior,
        current: i32,
        proposed: i32,
        min: i32,
        max: i32,
        now: Timestamp,
    ) -> Normalized {
        let up = scale_up_rules(behavior.scale_up.clone());
        let mut down = behavior.scale_down.clone().unwrap_or_default();
        down.stabilization_window_seconds
            .get_or_insert(DOWNSCALE_STABILIZATION.as_secs() as i32);
        let down = scale_down_rules(Some(down));
        let up_window = window(&up);
        let down_window = window(&down);
        let (mut up_rec, mut down_rec) = (proposed, proposed);
        let mut old = None;
        for (i, r) in self.recommendations.iter().enumerate() {
            let age = elapsed(r.at, now);
            if age < up_window {
                up_rec = up_rec.min(r.replicas);
            }
            if age < down_window {
                down_rec = down_rec.max(r.replicas);
            }
            if age > up_window && age > down_window {
                old = Some(i);
            }
        }
        let stabilized = current.max(up_rec).min(down_rec);
        let new = Recommendation {
            replicas: proposed,
            at: now,
        };
        match old {
            Some(i) => self.recommendations[i] = new,
            None => self.recommendations.push(new),
        }
        let able = if stabilized == proposed {
            READY_FOR_NEW_SCALE
        } else if proposed >= current {
            SCALE_UP_STABILIZED
        } else {
            SCALE_DOWN_STABILIZED
        };
        let (replicas, limit) = if stabilized > current {
            let rate = self.scale_up_limit(current, &up, now).max(current);
            let (ceiling, over) = if max > rate {
                (rate, SCALE_UP_LIMIT)
            } else {
                (max, TOO_MANY)
            };
            if stabilized > ceiling {
                (ceiling, over)
            } else {
                (stabilized, WITHIN_RANGE)
            }
        } else if stabilized < current {
            let rate = self.scale_down_limit(current, &down, now).min(current);
            let (floor, under) = if min < rate {
                (rate, SCALE_DOWN_LIMIT)
            } else {
                (min, TOO_FEW)
            };
            if stabilized < floor {
                (floor, under)
            } else {
                (stabilized, WITHIN_RANGE)
            }
        } else {
            (stabilized, WITHIN_RANGE)
        };
        Normalized {
            replicas,
            able,
            limited: (replicas != stabilized, limit),
        }
    }

    /// The replicas at the start of a policy's period: the current count minus what was
    /// added in it plus what was removed.
    fn period_start(&self, current: i32, period_seconds: i32, now: Timestamp) -> i32 {
        let period = Duration::from_secs(u64::try_from(period_seconds).unwrap_or(0));
        let sum = |events: &[ScaleEvent]| -> i32 {
            events
                .iter()
                .filter(|e| elapsed(e.at, now) <= period)
                .map(|e| e.change)
                .sum()
        };
        current - sum(&self.scale_up) + sum(&self.scale_down)
    }

    /// calculateScaleUpLimitWithScalingRules.
    fn scale_up_limit(&self, current: i32, rules: &HPAScalingRules, now: Timestamp) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or_default();
        if select == SELECT_DISABLED {
            return current;
        }
        let min_change = select == SELECT_MIN;
        let mut result = if min_change { i32::MAX } else { i32::MIN };
        for p in rules.policies.iter().flatten() {
            let start = self.period_start(current, p.period_seconds, now);
            let proposed = match p.type_.as_str() {
                POLICY_PODS => start.saturating_add(p.value),
                POLICY_PERCENT => {
                    (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32
                }
                _ => continue,
            };
            result = if min_change {
                result.min(proposed)
            } else {
                result.max(proposed)
            };
        }
        result
    }

    /// calculateScaleDownLimitWithBehaviors.
    fn scale_down_limit(&self, current: i32, rules: &HPAScalingRules, now: Timestamp) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or_default();
        if select == SELECT_DISABLED {
            return current;
        }
        let min_change = select == SELECT_MIN;
        let mut result = if min_change { i32::MIN } else { i32::MAX };
        for p in rules.policies.iter().flatten() {
            let start = self.period_start(current, p.period_seconds, now);
            let proposed = match p.type_.as_str() {
                POLICY_PODS => start.saturating_sub(p.value),
                POLICY_PERCENT => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
                _ => continue,
            };
            result = if min_change {
                result.max(proposed)
            } else {
                result.min(proposed)
            };
        }
        result
    }
}

fn window(rules: &HPAScalingRules) -> Duration {
    Duration::from_secs(u64::try_from(rules.stabilization_window_seconds.unwrap_or(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn rules(window: i32, select: &str, policies: &[(&str, i32, i32)]) -> HPAScalingRules {
        HPAScalingRules {
            stabilization_window_seconds: Some(window),
            select_policy: Some(select.into()),
            policies: Some(
                policies
                    .iter()
                    .map(|(t, v, p)| HPAScalingPolicy {
                        type_: t.to_string(),
                        value: *v,
                        period_seconds: *p,
                    })
                    .collect(),
            ),
            tolerance: None,
        }
    }

    #[test]
    fn without_behavior_scale_down_waits_out_the_window_and_up_is_capped() {
        let mut h = History::default();
        h.init(5, t(0));
        // A lower proposal inside 5 minutes of the initial 5 is held at 5.
        let n = h.normalize(5, 2, 1, 10, t(60));
        assert_eq!(n.replicas, 5);
        assert_eq!(n.able.reason, "ScaleDownStabilized");
        assert!(!n.limited.0);
        // After the window, the highest recommendation left is 2.
        let n = h.normalize(5, 2, 1, 10, t(400));
        assert_eq!(n.replicas, 2);
        assert_eq!(n.able.reason, "ReadyForNewScale");
        // Up: at most double (or 4): from 2, 9 becomes 4.
        let mut h = History::default();
        let n = h.normalize(2, 9, 1, 10, t(0));
        assert_eq!(n.replicas, 4);
        assert_eq!(n.limited, (true, SCALE_UP_LIMIT));
        // Clamped to max and min.
        let n = h.normalize(8, 20, 1, 10, t(1));
        assert_eq!((n.replicas, n.limited.1.reason), (10, "TooManyReplicas"));
        let mut h = History::default();
        let n = h.normalize(3, 0, 2, 10, t(0));
        assert_eq!((n.replicas, n.limited.1.reason), (2, "TooFewReplicas"));
    }

    #[test]
    fn default_behavior_policies_cap_a_scale_up() {
        let b = HorizontalPodAutoscalerBehavior::default();
        let mut h = History::default();
        h.init(2, t(0));
        // Pods 4 or Percent 100 per 15 s, the larger: from 2, max(6, 4) = 6.
        let n = h.normalize_with_behavior(&b, 2, 20, 1, 50, t(1));
        assert_eq!(n.replicas, 6);
        assert_eq!(n.limited, (true, SCALE_UP_LIMIT));
        h.record_scale(Some(&b), 2, 6, t(1));
        // 5 s later, the period started at 2 (4 were added): still max(6, 4) = 6.
        let n = h.normalize_with_behavior(&b, 6, 20, 1, 50, t(6));
        assert_eq!(n.replicas, 6);
        // After the period: from 6, max(10, 12) = 12.
        let n = h.normalize_with_behavior(&b, 6, 20, 1, 50, t(20));
        assert_eq!(n.replicas, 12);
    }

    #[test]
    fn select_policy_min_and_disabled() {
        let up = rules(0, "Min", &[("Pods", 1, 60), ("Percent", 50, 60)]);
        let b = HorizontalPodAutoscalerBehavior {
            scale_up: Some(up),
            scale_down: Some(rules(0, "Disabled", &[("Pods", 1, 60)])),
        };
        let mut h = History::default();
        // Min of (4+1, 4*1.5=6) = 5.
        let n = h.normalize_with_behavior(&b, 4, 10, 1, 10, t(0));
        assert_eq!(n.replicas, 5);
        // Scale-down disabled: stays at 4.
        let n = h.normalize_with_behavior(&b, 4, 1, 1, 10, t(100));
        assert_eq!(n.replicas, 4);
        assert_eq!(n.limited, (true, SCALE_DOWN_LIMIT));
    }

    #[test]
    fn scale_down_percent_policy_and_window() {
        let b = HorizontalPodAutoscalerBehavior {
            scale_up: None,
            scale_down: Some(rules(60, "Max", &[("Percent", 50, 30)])),
        };
        let mut h = History::default();
        h.init(10, t(0));
        // Inside the 60 s window the initial 10 holds.
        let n = h.normalize_with_behavior(&b, 10, 1, 1, 20, t(30));
        assert_eq!(n.replicas, 10);
        assert_eq!(n.able.reason, "ScaleDownStabilized");
        // After it: at most 50% down per 30 s: 10 -> 5.
        let n = h.normalize_with_behavior(&b, 10, 1, 1, 20, t(100));
        assert_eq!(n.replicas, 5);
        assert_eq!(n.limited, (true, SCALE_DOWN_LIMIT));
        h.record_scale(Some(&b), 10, 5, t(100));
        // Within the period the start was 10: 10 * 0.5 = 5 again: no further step.
        let n = h.normalize_with_behavior(&b, 5, 1, 1, 20, t(110));
        assert_eq!(n.replicas, 5);
        // After the period: 5 -> 2 (int(2.5)).
        let n = h.normalize_with_behavior(&b, 5, 1, 1, 20, t(200));
        assert_eq!(n.replicas, 2);
    }

    #[test]
    fn scale_up_window_takes_the_lowest_recent_recommendation() {
        let b = HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(60, "Max", &[("Pods", 100, 15)])),
            scale_down: None,
        };
        let mut h = History::default();
        h.init(2, t(0));
        let n = h.normalize_with_behavior(&b, 2, 8, 1, 20, t(10));
        assert_eq!(n.replicas, 2);
        assert_eq!(n.able.reason, "ScaleUpStabilized");
        // Once the initial 2 left the window, the lowest recent one (8) applies.
        let n = h.normalize_with_behavior(&b, 2, 9, 1, 20, t(65));
        assert_eq!(n.replicas, 8);
    }
}
