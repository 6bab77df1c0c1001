//! Back-off as the kubelet does it: for container restarts (CrashLoopBackOff: the first
//! restart at once, then 10 s doubling to 5 min, forgotten after 10 min of running) and for
//! image pulls (ImagePullBackOff: 10 s doubling to 5 min).

use std::time::Duration;

/// The shape of one back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackOffPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// A container that ran this long is healthy again: its back-off starts over.
    pub reset_after: Duration,
}

impl Default for BackOffPolicy {
    fn default() -> Self {
        BackOffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

/// The failure count of one container (or one image).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackOff {
    failures: u32,
}

impl BackOff {
    /// Delay before restarting a container that exited after running for `ran`.
    pub fn next_restart(&mut self, policy: &BackOffPolicy, ran: Duration) -> Duration {
        if ran >= policy.reset_after {
            self.failures = 0;
        }
        let delay = match self.failures {
            0 => Duration::ZERO,
            n => scaled(policy, n - 1),
        };
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// Delay before retrying an image pull that just failed.
    pub fn next_pull(&mut self, policy: &BackOffPolicy) -> Duration {
        let delay = scaled(policy, self.failures);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// `initial * 2^doublings`, capped at `max`.
fn scaled(policy: &BackOffPolicy, doublings: u32) -> Duration {
    let factor = 1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX);
    policy.initial.saturating_mul(factor).min(policy.max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_follow_the_kubelet_sequence() {
        let p = BackOffPolicy::default();
        let mut b = BackOff::default();
        let short = Duration::from_secs(1);
        let delays: Vec<u64> = (0..8)
            .map(|_| b.next_restart(&p, short).as_secs())
            .collect();
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300]);
        // Ten minutes of running forgives everything.
        assert_eq!(b.next_restart(&p, Duration::from_secs(600)), Duration::ZERO);
        assert_eq!(b.next_restart(&p, short), Duration::from_secs(10));
    }

    #[test]
    fn pulls_back_off_from_the_first_failure() {
        let p = BackOffPolicy::default();
        let mut b = BackOff::default();
        assert_eq!(b.next_pull(&p), Duration::from_secs(10));
        assert_eq!(b.next_pull(&p), Duration::from_secs(20));
        for _ in 0..100 {
            assert!(b.next_pull(&p) <= p.max, "never overflows past the cap");
        }
    }
}
