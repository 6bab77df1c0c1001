//! skiff's service proxy: Kubernetes Services and EndpointSlices in, an eBPF socket load
//! balancer (or kube-proxy-style iptables rules, the baseline) out.
//!
//! Rooms: `model` (Kubernetes objects -> the proxy's typed view), `source` (where objects
//! come from), `desired` (services joined with their slices into frontends), `dataplane`
//! (the interface both data paths implement), `sync` (frontends -> ordered BPF map writes),
//! `loader` (programs, maps, pins, links), `iptables` (the baseline), `daemon` (`proxy
//! run`), `latency` (network programming latency), `metrics`, `dump`, `probe`.

pub mod daemon;
pub mod dataplane;
pub mod desired;
pub mod dump;
pub mod iptables;
pub mod latency;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod probe;
pub mod sockets;
pub mod source;
pub mod sync;
