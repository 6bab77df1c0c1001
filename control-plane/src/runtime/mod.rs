//! The controller runtime shared by the controllers and the scheduler, in kube-runtime's
//! shape (see STYLE.md): a watcher feeds a shared, indexed [`informer`] cache; informer
//! handlers map changes to object keys in a deduplicating, rate-limited [`queue`]; a
//! [`controller`] reconciles one key at a time and answers "requeue after" or "wait for
//! change". Around it: [`expectations`] (no extra pods from a slow watch), [`owner`]
//! references (adoption, release, children by controller), [`events`] (Kubernetes Events),
//! [`leader`] election through a Lease, [`metrics`] and the [`ops`] endpoint (health and
//! metrics), [`client`] (a kube client from a kubeconfig) and [`flags`] (Go durations and
//! the leader-election flags).

pub mod client;
pub mod controller;
pub mod events;
pub mod expectations;
pub mod flags;
pub mod informer;
pub mod key;
pub mod leader;
pub mod metrics;
pub mod ops;
pub mod owner;
pub mod queue;

pub use controller::{Action, Controller, ReconcileError, Reconciler};
pub use events::{EventSink, EventType, Recorder};
pub use expectations::Expectations;
pub use informer::{Change, Informer, Informers};
pub use key::{KeyRef, ObjectKey};
pub use leader::{LeaderElectionConfig, LeaderElector};
pub use metrics::Metrics;
pub use queue::WorkQueue;
