//! Runs skiff on one machine. `cluster` is a whole cluster (what `cargo xtask up` starts and
//! the cluster-level tests and benches use); the other modules are the pieces it is made of:
//! waiting on conditions with deadlines, network namespaces, cgroups, an API server process,
//! kubeconfigs and the real kubectl. Depends on no other skiff crate but skiff-netlink, so
//! every crate's tests can use it.

pub mod apiserver;
pub mod cgroup;
pub mod cluster;
pub mod etcd;
pub mod kubeconfig;
pub mod kubectl;
pub mod netns;
pub mod registry;
pub mod wait;

pub use wait::{wait_until, wait_until_async};
