//! Harness for skiff's integration tests: waiting on conditions with deadlines, and real
//! kernel and process fixtures (network namespaces, cgroups, servers), and a whole cluster on
//! one machine (`cluster`, also what `cargo xtask up` runs). Depends on no other skiff crate,
//! so every crate can use it as a dev-dependency.

pub mod apiserver;
pub mod cgroup;
pub mod cluster;
pub mod density;
pub mod e2e;
pub mod etcd;
pub mod kubeconfig;
pub mod kubectl;
pub mod netns;
pub mod order;
pub mod registry;
pub mod subnet;
pub mod tls;
pub mod wait;

pub use wait::{wait_until, wait_until_async};
