//! What the pod worker reports about a pod besides its status: Kubernetes Events with the
//! kubelet's reasons, so `kubectl describe` and `kubectl get events` read as users expect.

use std::fmt;

/// The reasons the kubelet uses (pkg/kubelet/events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Pulling,
    Pulled,
    Created,
    Started,
    Killing,
    Unhealthy,
    BackOff,
    Failed,
    FailedMount,
    ErrImageNeverPull,
    FailedCreatePodSandBox,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Pulling => "Pulling",
            Reason::Pulled => "Pulled",
            Reason::Created => "Created",
            Reason::Started => "Started",
            Reason::Killing => "Killing",
            Reason::Unhealthy => "Unhealthy",
            Reason::BackOff => "BackOff",
            Reason::Failed => "Failed",
            Reason::FailedMount => "FailedMount",
            Reason::ErrImageNeverPull => "ErrImageNeverPull",
            Reason::FailedCreatePodSandBox => "FailedCreatePodSandBox",
        }
    }

    /// Normal or Warning, as the kubelet files each reason.
    pub fn severity(self) -> Severity {
        match self {
            Reason::Pulling
            | Reason::Pulled
            | Reason::Created
            | Reason::Started
            | Reason::Killing => Severity::Normal,
            _ => Severity::Warning,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An Event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Normal => "Normal",
            Severity::Warning => "Warning",
        }
    }
}

/// One event about a pod, optionally about one of its containers (the `fieldPath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    pub reason: Reason,
    pub message: String,
    /// `spec.containers{name}` or `spec.initContainers{name}`.
    pub field_path: Option<String>,
}
