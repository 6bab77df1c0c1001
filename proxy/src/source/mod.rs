//! Where the desired state comes from. A source lists, then watches, and sends the
//! Kubernetes objects it sees (k8s-openapi types, unvalidated) as events; the daemon
//! validates them into the model. Two sources feed the same events: a manifests directory
//! (`manifests`) and an API server watched through kube-rs (`api`).

pub mod api;
pub mod manifests;

use crate::model::ObjectKey;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use tokio::sync::mpsc;

/// Which source `proxy run` reads.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A manifests directory, watched with inotify.
    Manifests(PathBuf),
    /// An API server, listed and watched.
    Api(api::ApiConfig),
}

/// The kinds the proxy consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Service,
    EndpointSlice,
}

/// An object of a kind the proxy consumes.
#[derive(Clone, Debug)]
pub enum Resource {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
}

/// Which object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceRef {
    pub kind: Kind,
    pub key: ObjectKey,
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} {}", self.kind, self.key)
    }
}

/// Input a source could not turn into an object.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum InputError {
    #[error("malformed manifest: {0}")]
    Malformed(String),
    #[error("unsupported kind {kind} ({api_version}): the proxy reads v1 Service and discovery.k8s.io/v1 EndpointSlice")]
    UnknownKind { api_version: String, kind: String },
    #[error("{object} is defined twice (also in {other})")]
    Duplicate { object: String, other: String },
}

impl InputError {
    /// A short label for the input-errors metric.
    pub fn reason(&self) -> &'static str {
        match self {
            InputError::Malformed(_) => "malformed",
            InputError::UnknownKind { .. } => "unknown_kind",
            InputError::Duplicate { .. } => "duplicate",
        }
    }
}

#[derive(Debug)]
pub enum SourceEvent {
    Apply(Resource),
    Delete(ResourceRef),
    /// Everything that existed at start has been sent.
    Synced,
    /// Bad input, with where it came from; nothing was applied for it.
    Rejected {
        origin: String,
        error: InputError,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("watching {path}: {source}")]
    Watch { path: String, source: notify::Error },
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("API client ({config}): {reason}")]
    Api { config: String, reason: String },
}

/// A producer of desired-state events. `run` lists, sends [`SourceEvent::Synced`], then
/// sends changes until the receiver is dropped.
pub trait Source: Send + 'static {
    fn run(
        self,
        events: mpsc::Sender<SourceEvent>,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
}
