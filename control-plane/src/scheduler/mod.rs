//! The scheduler: assigns every pending pod to a node, as kube-scheduler's default profile
//! does, by talking to the API server only (list, watch, bind).
//!
//! The flow: informers (pods not finished, nodes, namespaces) feed the [`cache`] (bound and
//! assumed pods per node) and the [`queue`] (pending pods). The scheduling loop pops the next
//! pod, runs the [`algorithm`] (the [`plugins`]' filters and scores) over the cache, assumes
//! the pod on the chosen node at once, and binds it through `pods/binding` in the background;
//! a pod no node fits may make room by [`preemption`] of pods of lower priority, and is
//! parked until a cluster event could help ([`hints`]).

pub mod algorithm;
pub mod binder;
pub mod cache;
pub mod config;
pub mod cycle;
pub mod framework;
mod handlers;
pub mod hints;
pub mod metrics;
pub mod node_info;
pub mod plugins;
pub mod pod_info;
pub mod preemption;
pub mod queue;
pub mod resources;
pub mod runner;

pub use config::Config;
pub use metrics::Metrics;
pub use runner::{run, SchedulerError, COMPONENT};

#[cfg(test)]
mod testing;
