//! How fast nodes that stop being Ready may be tainted NoExecute (which evicts their pods),
//! per zone, as kube-controller-manager decides it. A zone (`topology.kubernetes.io/zone`,
//! else one unnamed zone) is in one of three states: Normal (nodes tainted at
//! `--node-eviction-rate` per second), PartialDisruption (more than 2 nodes and at least
//! `--unhealthy-zone-threshold` of them not Ready: `--secondary-node-eviction-rate` in a zone
//! larger than `--large-cluster-size-threshold`, else none) and FullDisruption (no node Ready:
//! the normal rate, since the zone itself failed). When every zone is fully disrupted the
//! control plane itself is the likelier culprit (a partition between it and the nodes), so
//! nothing is tainted NoExecute and existing such taints are lifted: no mass eviction of a
//! cluster whose nodes merely cannot reach the API server.
//!
//! Counts are kept per zone and updated per node change, so a decision is O(1) in the number
//! of nodes (O(zones) for the cluster-wide check).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";

/// The eviction-rate flags (kube-controller-manager's names and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Nodes per second tainted NoExecute in a healthy (or fully disrupted) zone.
    pub node_eviction_rate: f64,
    /// Nodes per second in a partially disrupted large zone.
    pub secondary_node_eviction_rate: f64,
    /// The share of not-Ready nodes from which a zone is partially disrupted.
    pub unhealthy_zone_threshold: f64,
    /// Zones up to this size stop tainting altogether when partially disrupted.
    pub large_cluster_size_threshold: usize,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            node_eviction_rate: 0.1,
            secondary_node_eviction_rate: 0.01,
            unhealthy_zone_threshold: 0.55,
            large_cluster_size_threshold: 50,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// Kubernetes' ComputeZoneState.
pub fn zone_state(total: usize, not_ready: usize, threshold: f64) -> ZoneState {
    let ready = total - not_ready.min(total);
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2 && not_ready as f64 / total as f64 >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The zone key of a node: region and zone labels, as Kubernetes' GetZoneKey.
pub fn zone_of(node: &Node) -> String {
    let labels = node.labels();
    match (labels.get(REGION_LABEL), labels.get(ZONE_LABEL)) {
        (None, None) => String::new(),
        (region, zone) => format!(
            "{}:\x00:{}",
            region.map_or("", String::as_str),
            zone.map_or("", String::as_str)
        ),
    }
}

#[derive(Default)]
struct Zone {
    total: usize,
    not_ready: usize,
    limiter: Option<Limiter>,
}

/// Nodes by zone, their readiness, and each zone's tainting rate limiter.
#[derive(Default)]
pub struct Zones {
    nodes: HashMap<String, (String, bool)>,
    zones: HashMap<String, Zone>,
}

/// What may happen to a node that should carry a NoExecute taint it does not have yet.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Taint it now (a token was taken).
    Taint,
    /// Not yet: ask again after this long.
    Wait(Duration),
    /// Not while the zone (or the whole cluster) is in this state.
    Hold(&'static str),
}

impl Zones {
    /// Records a node's zone and readiness (O(1)).
    pub fn set(&mut self, node: &str, zone: &str, ready: bool) {
        if let Some((old_zone, old_ready)) = self.nodes.get(node) {
            if old_zone == zone && *old_ready == ready {
                return;
            }
            let (old_zone, old_ready) = (old_zone.clone(), *old_ready);
            self.forget(&old_zone, old_ready);
        }
        let z = self.zones.entry(zone.to_string()).or_default();
        z.total += 1;
        if !ready {
            z.not_ready += 1;
        }
        self.nodes
            .insert(node.to_string(), (zone.to_string(), ready));
    }

    pub fn remove(&mut self, node: &str) {
        if let Some((zone, ready)) = self.nodes.remove(node) {
            self.forget(&zone, ready);
        }
    }

    fn forget(&mut self, zone: &str, ready: bool) {
        if let Some(z) = self.zones.get_mut(zone) {
            z.total -= 1;
            if !ready {
                z.not_ready -= 1;
            }
            if z.total == 0 {
                self.zones.remove(zone);
            }
        }
    }

    pub fn state(&self, zone: &str, rates: &Rates) -> ZoneState {
        self.zones.get(zone).map_or(ZoneState::Normal, |z| {
            zone_state(z.total, z.not_ready, rates.unhealthy_zone_threshold)
        })
    }

    /// Every zone fully disrupted: no node Ready anywhere.
    pub fn all_fully_disrupted(&self, rates: &Rates) -> bool {
        !self.zones.is_empty()
            && self.zones.values().all(|z| {
                zone_state(z.total, z.not_ready, rates.unhealthy_zone_threshold)
                    == ZoneState::FullDisruption
            })
    }

    /// Whether a node of `zone` may be tainted NoExecute now.
    pub fn admit(&mut self, zone: &str, rates: &Rates, now: Instant) -> Verdict {
        if self.all_fully_disrupted(rates) {
            return Verdict::Hold("every node of every zone is not ready");
        }
        let state = self.state(zone, rates);
        let Some(z) = self.zones.get_mut(zone) else {
            return Verdict::Taint;
        };
        let rate = match state {
            ZoneState::Normal | ZoneState::FullDisruption => rates.node_eviction_rate,
            ZoneState::PartialDisruption if z.total > rates.large_cluster_size_threshold => {
                rates.secondary_node_eviction_rate
            }
            ZoneState::PartialDisruption => 0.0,
        };
        if rate <= 0.0 {
            return Verdict::Hold("the zone is partially disrupted");
        }
        let limiter = z.limiter.get_or_insert_with(|| Limiter::new(rate, now));
        limiter.rate = rate;
        match limiter.take(now) {
            Ok(()) => Verdict::Taint,
            Err(wait) => Verdict::Wait(wait),
        }
    }
}

/// A token bucket with a burst of one (Kubernetes' eviction limiter burst).
struct Limiter {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Limiter {
    fn new(rate: f64, now: Instant) -> Limiter {
        Limiter {
            rate,
            tokens: 1.0,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(1.0);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_states_as_kubernetes_computes_them() {
        assert_eq!(zone_state(10, 0, 0.55), ZoneState::Normal);
        // Two nodes down is never a disruption, whatever the share.
        assert_eq!(zone_state(3, 2, 0.55), ZoneState::Normal);
        assert_eq!(zone_state(5, 3, 0.55), ZoneState::PartialDisruption);
        assert_eq!(zone_state(10, 5, 0.55), ZoneState::Normal);
        assert_eq!(zone_state(3, 3, 0.55), ZoneState::FullDisruption);
        assert_eq!(zone_state(1, 1, 0.55), ZoneState::FullDisruption);
    }

    #[test]
    fn counts_follow_nodes_moving_between_states_and_zones() {
        let rates = Rates::default();
        let mut z = Zones::default();
        for i in 0..5 {
            z.set(&format!("n{i}"), "a", true);
        }
        z.set("m0", "b", true);
        for i in 0..3 {
            z.set(&format!("n{i}"), "a", false);
        }
        assert_eq!(z.state("a", &rates), ZoneState::PartialDisruption);
        z.set("n0", "a", false); // no change
        z.set("n0", "b", false); // moved zone
        assert_eq!(z.state("a", &rates), ZoneState::Normal, "2 of 4 down");
        z.remove("n1");
        z.remove("nobody");
        assert_eq!(z.state("a", &rates), ZoneState::Normal);
        assert!(!z.all_fully_disrupted(&rates));
        z.set("m0", "b", false);
        for n in ["n2", "n3", "n4"] {
            z.set(n, "a", false);
        }
        assert!(z.all_fully_disrupted(&rates));
    }

    #[test]
    fn tainting_is_rate_limited_per_zone_and_held_in_disruptions() {
        let rates = Rates {
            node_eviction_rate: 0.5,
            ..Rates::default()
        };
        let t0 = Instant::now();
        let mut z = Zones::default();
        for i in 0..10 {
            z.set(&format!("a{i}"), "a", i != 0);
            z.set(&format!("b{i}"), "b", i != 0);
        }
        // One node down in each zone: each zone has its own bucket of one.
        assert_eq!(z.admit("a", &rates, t0), Verdict::Taint);
        assert_eq!(z.admit("b", &rates, t0), Verdict::Taint);
        assert_eq!(
            z.admit("a", &rates, t0),
            Verdict::Wait(Duration::from_secs(2))
        );
        assert_eq!(
            z.admit("a", &rates, t0 + Duration::from_secs(2)),
            Verdict::Taint
        );
        // Zone a partially disrupted and small: no more taints there; b goes on.
        for i in 1..7 {
            z.set(&format!("a{i}"), "a", false);
        }
        assert!(matches!(
            z.admit("a", &rates, t0 + Duration::from_secs(60)),
            Verdict::Hold(_)
        ));
        assert_eq!(
            z.admit("b", &rates, t0 + Duration::from_secs(60)),
            Verdict::Taint
        );
        // Every node everywhere down: hold everything.
        for i in 0..10 {
            z.set(&format!("a{i}"), "a", false);
            z.set(&format!("b{i}"), "b", false);
        }
        assert!(matches!(
            z.admit("b", &rates, t0 + Duration::from_secs(120)),
            Verdict::Hold(_)
        ));
        // A zone wholly down while another is healthy: its nodes are tainted at the normal rate.
        for i in 0..10 {
            z.set(&format!("b{i}"), "b", true);
        }
        assert_eq!(z.state("a", &rates), ZoneState::FullDisruption);
        assert_eq!(
            z.admit("a", &rates, t0 + Duration::from_secs(180)),
            Verdict::Taint
        );
    }

    #[test]
    fn a_partially_disrupted_large_zone_uses_the_secondary_rate() {
        let rates = Rates {
            large_cluster_size_threshold: 5,
            ..Rates::default()
        };
        let t0 = Instant::now();
        let mut z = Zones::default();
        for i in 0..10 {
            z.set(&format!("n{i}"), "", i >= 6);
        }
        assert_eq!(z.state("", &rates), ZoneState::PartialDisruption);
        assert_eq!(z.admit("", &rates, t0), Verdict::Taint);
        assert_eq!(
            z.admit("", &rates, t0),
            Verdict::Wait(Duration::from_secs(100))
        );
    }
}
