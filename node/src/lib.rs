//! node: skiff's node agent (a kubelet) as a library; the binary in main.rs is a thin shell.
//!
//! Rooms: `agent` (registration, Lease, the pod watch, routes: the API side), `apibalancer`
//! (the node's client-side balancer over several API servers), `server` (the
//! kubelet API over HTTPS, /healthz, /metrics), `api_auth` (who may call it: client
//! certificates or TokenReview, then SubjectAccessReview), `metrics`, `names` and `layout` (every name and path derived from the node name and data
//! dir), `containerd` (the supervised runtime and its generated config), `cri` (the CRI gRPC
//! client), `cni` (pod network configuration), `csi` (the CSI client: plugin watcher, CSI volumes and
//! their stats), `netlink` (routes, links and addresses through
//! rtnetlink), `cgroups` (cleanup of cgroup parents), `stats` (CPU and memory of the node, its
//! pods and containers from cgroups, for /stats/summary and /metrics/resource), `pod`
//! (the pod worker: a typed state machine from a Pod object to running containers and back
//! to a PodStatus).

pub mod agent;
pub mod api_auth;
pub mod apibalancer;
pub mod bootstrap;
pub mod cgroups;
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod csi;
pub mod layout;
pub mod metrics;
pub mod names;
/// Routes, links and addresses through rtnetlink (the skiff-netlink crate, shared with the
/// cluster launcher).
pub use skiff_netlink as netlink;
pub mod pod;
pub mod server;
pub mod stats;
