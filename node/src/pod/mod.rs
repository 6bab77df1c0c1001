//! The pod worker: one task per pod that turns a Pod object into a sandbox and containers
//! through CRI, keeps them as the spec says (probes, restarts with back-off), reports a
//! PodStatus and Events, and tears everything down on deletion. Its life is a typed state
//! machine (see `worker`); the rooms beside it hold the pure pieces it is made of.
//!
//! The worker knows nothing of the API server: Pod objects come in through a watch channel,
//! ConfigMaps and Secrets through [`Objects`], status and events go out through [`Reporter`].
//! The agent wires these to the API; tests drive the worker with Pod objects directly.

mod atomic_dir;
pub mod backoff;
mod container;
pub mod dns;
pub mod env;
pub mod events;
mod image;
mod probe;
pub mod resources;
pub mod spec;
pub mod status;
pub mod token;
pub mod volumes;
mod worker;

use crate::cri::Cri;
use crate::layout::Layout;
use crate::names::NodeName;
use backoff::BackOffPolicy;
use events::PodEvent;
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, PodStatus, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use worker::PodWorker;

/// Identifies a pod in logs, events and status writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodRef {
    pub fn of(pod: &Pod) -> PodRef {
        PodRef {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where what pods reference comes from (the API and the agent's caches, or a test's maps):
/// ConfigMaps, Secrets, service account tokens, and the Services whose variables pods get.
pub trait Objects: Send + Sync {
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConfigMap>, String>>;
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, String>>;
    /// A token of service account `namespace/account` (a TokenRequest).
    fn service_account_token<'a>(
        &'a self,
        namespace: &'a str,
        account: &'a str,
        request: TokenRequest,
    ) -> BoxFuture<'a, Result<token::IssuedToken, String>>;
    /// One Service, from a cache (Err until the cache has been filled once).
    fn service(&self, namespace: &str, name: &str) -> Result<Option<Service>, String>;
    /// Every Service of a namespace, from a cache (Err until it has been filled once).
    fn services(&self, namespace: &str) -> Result<Vec<Service>, String>;
    /// A PersistentVolumeClaim (the node reads those of its pods).
    fn persistent_volume_claim<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PersistentVolumeClaim>, String>> {
        Box::pin(async { Err("persistent volume claims are not available here".to_string()) })
    }
    /// A PersistentVolume (bound to a claim of one of the node's pods).
    fn persistent_volume<'a>(
        &'a self,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PersistentVolume>, String>> {
        Box::pin(async { Err("persistent volumes are not available here".to_string()) })
    }
}

/// Where the worker's observations go (the API writer, or a test's collector).
pub trait Reporter: Send + Sync {
    /// The pod's current status; called when it changes.
    fn status(&self, pod: &PodRef, status: &PodStatus);
    fn event(&self, pod: &PodRef, event: PodEvent);
    /// Everything of a deleted pod is gone from the node: its object may be removed.
    fn terminated(&self, pod: &PodRef);
}

/// The worker's clocks.
#[derive(Debug, Clone)]
pub struct Timing {
    pub restart_backoff: BackOffPolicy,
    pub image_backoff: BackOffPolicy,
    /// How often running containers are checked against the runtime.
    pub sync_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            restart_backoff: BackOffPolicy::default(),
            image_backoff: BackOffPolicy::default(),
            sync_interval: Duration::from_secs(1),
        }
    }
}

/// What every pod worker of one node shares.
pub struct NodeContext {
    pub node: NodeName,
    pub layout: Layout,
    pub cri: Cri,
    /// The node's address (status.hostIP, hostNetwork pods' IP).
    pub host_ip: Option<String>,
    pub objects: Arc<dyn Objects>,
    pub reporter: Arc<dyn Reporter>,
    pub timing: Timing,
    /// The pods' resolv.conf inputs (cluster DNS, domain, the host's).
    pub dns: dns::DnsSettings,
    /// The node's CSI volumes (None: claim volumes are refused).
    pub csi: Option<Arc<crate::csi::CsiVolumes>>,
}

/// The current time as an API timestamp.
pub fn now() -> Time {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Time(Timestamp::from_nanosecond(nanos as i128).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The handle the agent keeps per pod: send the newest Pod object (deletionTimestamp set:
/// terminate it); dropping the sender detaches the worker and leaves the pod running.
pub struct PodHandle {
    pub pod: watch::Sender<Pod>,
    pub task: tokio::task::JoinHandle<()>,
}
