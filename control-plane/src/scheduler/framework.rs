//! The vocabulary of the scheduling framework: the plugins (in kube-scheduler's default order
//! and with its default score weights), a filter's rejection of a node, the diagnosis of a
//! failed cycle, and the FailedScheduling message Kubernetes users know
//! ("0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu.").

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

/// The plugins of the default profile. Filters run in this order and a node's first
/// rejection ends its evaluation, as in kube-scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plugin {
    NodeUnschedulable,
    NodeName,
    TaintToleration,
    NodeAffinity,
    NodePorts,
    NodeResourcesFit,
    VolumeBinding,
    PodTopologySpread,
    InterPodAffinity,
    NodeResourcesBalancedAllocation,
    ImageLocality,
}

impl Plugin {
    pub fn name(self) -> &'static str {
        match self {
            Plugin::NodeUnschedulable => "NodeUnschedulable",
            Plugin::NodeName => "NodeName",
            Plugin::TaintToleration => "TaintToleration",
            Plugin::NodeAffinity => "NodeAffinity",
            Plugin::NodePorts => "NodePorts",
            Plugin::NodeResourcesFit => "NodeResourcesFit",
            Plugin::VolumeBinding => "VolumeBinding",
            Plugin::PodTopologySpread => "PodTopologySpread",
            Plugin::InterPodAffinity => "InterPodAffinity",
            Plugin::NodeResourcesBalancedAllocation => "NodeResourcesBalancedAllocation",
            Plugin::ImageLocality => "ImageLocality",
        }
    }

    /// The default profile's score weight.
    pub fn weight(self) -> i64 {
        match self {
            Plugin::TaintToleration => 3,
            Plugin::NodeAffinity | Plugin::PodTopologySpread | Plugin::InterPodAffinity => 2,
            _ => 1,
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of plugins (which ones rejected a pod: the queue asks only them whether a cluster
/// event could help).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginSet(u16);

impl PluginSet {
    pub fn insert(&mut self, p: Plugin) {
        self.0 |= p.bit();
    }

    pub fn contains(self, p: Plugin) -> bool {
        self.0 & p.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn of(plugins: &[Plugin]) -> PluginSet {
        let mut s = PluginSet::default();
        for p in plugins {
            s.insert(*p);
        }
        s
    }
}

/// How hard a rejection is (decides whether preemption could help).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Removing pods from the node might make room.
    Unschedulable,
    /// Nothing done to the node's pods helps (labels, taints, a missing topology key).
    UnschedulableAndUnresolvable,
}

/// A filter's verdict against one node, with Kubernetes' reason strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub plugin: Plugin,
    pub code: Code,
    pub reasons: Vec<Cow<'static, str>>,
}

impl Rejection {
    pub fn new(plugin: Plugin, code: Code, reason: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection {
            plugin,
            code,
            reasons: vec![reason.into()],
        }
    }
}

/// Why no node fits: the reasons of every rejected node, counted.
#[derive(Clone, Debug, Default)]
pub struct Diagnosis {
    /// Reason -> number of nodes rejected for it.
    pub reasons: HashMap<Cow<'static, str>, usize>,
    /// Plugins that rejected at least one node.
    pub plugins: PluginSet,
    /// Set when a plugin rejected the pod before looking at any node.
    pub pre_filter: Option<String>,
    /// What preemption (the PostFilter) said when it could not help, "preemption: ...".
    pub post_filter: Option<String>,
}

impl Diagnosis {
    pub fn record(&mut self, r: Rejection) {
        self.plugins.insert(r.plugin);
        for reason in r.reasons {
            *self.reasons.entry(reason).or_default() += 1;
        }
    }

    /// Counts `nodes` nodes as rejected for `reason` at once (nodes a pre-filter ruled out).
    pub fn record_many(&mut self, plugin: Plugin, reason: Cow<'static, str>, nodes: usize) {
        if nodes > 0 {
            self.plugins.insert(plugin);
            *self.reasons.entry(reason).or_default() += nodes;
        }
    }

    /// Counts one node as rejected for each of `reasons` (preemption's verdicts).
    pub fn record_reasons(&mut self, reasons: impl IntoIterator<Item = Cow<'static, str>>) {
        for reason in reasons {
            *self.reasons.entry(reason).or_default() += 1;
        }
    }
}

/// No node can take the pod.
#[derive(Clone, Debug)]
pub struct FitError {
    pub nodes: usize,
    pub diagnosis: Diagnosis,
}

impl fmt::Display for FitError {
    /// kube-scheduler's FitError: "0/N nodes are available: <count reason, ...>." with the
    /// reasons sorted as strings.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available:", self.nodes)?;
        if let Some(msg) = &self.diagnosis.pre_filter {
            write!(f, " {msg}.")?;
        } else {
            self.fmt_reasons(f)?;
        }
        // Preemption's message ends in its own period: "... 2 Insufficient cpu. preemption:
        // 0/2 nodes are available: 2 No preemption victims found for incoming pod."
        if let Some(msg) = &self.diagnosis.post_filter {
            write!(f, " {msg}")?;
        }
        Ok(())
    }
}

impl FitError {
    fn fmt_reasons(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .diagnosis
            .reasons
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        parts.sort();
        if !parts.is_empty() {
            write!(f, " {}.", parts.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_error_reads_like_kubernetes() {
        let mut d = Diagnosis::default();
        d.record(Rejection::new(
            Plugin::TaintToleration,
            Code::UnschedulableAndUnresolvable,
            "node(s) had untolerated taint {k: v}",
        ));
        for _ in 0..2 {
            d.record(Rejection::new(
                Plugin::NodeResourcesFit,
                Code::Unschedulable,
                "Insufficient cpu",
            ));
        }
        let e = FitError {
            nodes: 3,
            diagnosis: d,
        };
        assert_eq!(
            e.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu."
        );
        assert!(e.diagnosis.plugins.contains(Plugin::NodeResourcesFit));
        assert!(!e.diagnosis.plugins.contains(Plugin::NodePorts));
        let none = FitError {
            nodes: 0,
            diagnosis: Diagnosis::default(),
        };
        assert_eq!(none.to_string(), "0/0 nodes are available:");
    }

    #[test]
    fn one_node_can_have_several_reasons() {
        let mut d = Diagnosis::default();
        d.record(Rejection {
            plugin: Plugin::NodeResourcesFit,
            code: Code::Unschedulable,
            reasons: vec!["Insufficient cpu".into(), "Insufficient memory".into()],
        });
        let e = FitError {
            nodes: 1,
            diagnosis: d,
        };
        assert_eq!(
            e.to_string(),
            "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."
        );
    }
}
