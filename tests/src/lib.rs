//! Harness for skiff's integration tests: test workloads (e2e, density), test certificate
//! authorities, the subnet lease that lets cluster tests run in parallel, and an API server
//! with a kubectl bound to it. The cluster and the process, namespace and kubectl fixtures
//! are skiff-launcher's (product code: `cargo xtask up` runs the same), re-exported here under
//! their old paths.

pub mod density;
pub mod e2e;
pub mod etcd;
pub mod kubectl;
pub mod order;
pub mod subnet;
pub mod tls;

pub use skiff_launcher::{apiserver, cgroup, cluster, kubeconfig, netns, registry, wait};
pub use skiff_launcher::{wait_until, wait_until_async};
