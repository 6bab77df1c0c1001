//! skiff's service proxy: Kubernetes Services and EndpointSlices in, an eBPF socket load
//! balancer (or kube-proxy-style iptables rules, the baseline) out.
//!
//! Rooms: `model` (Kubernetes objects -> the proxy's typed view), `source` (where objects
//! come from), `desired` (services joined with their slices into frontends), `dataplane`
//! (the interface both data paths implement), `sync` (frontends -> ordered BPF map writes),
//! `maglev` (consistent hashing tables), `loader` (programs, maps, pins, links),
//! `iptables` (the baseline), `northsouth` (node addresses and interfaces, announced
//! LoadBalancer addresses, health check node ports, connection-tracking collection;
//! `nodenet` reads the node's network from netlink, `healthcheck` serves the ports),
//! `sockets` (connected UDP sockets to removed backends), `daemon` (`proxy run`), `latency`
//! (network programming latency), `programmed` (when each service was written into the data
//! path), `metrics`, `dump`, `probe`.

pub mod daemon;
pub mod dataplane;
pub mod desired;
pub mod dump;
pub mod healthcheck;
pub mod iptables;
pub mod latency;
pub mod loader;
pub mod maglev;
pub mod metrics;
pub mod model;
pub mod nodenet;
pub mod northsouth;
pub mod probe;
pub mod programmed;
pub mod sockets;
pub mod source;
pub mod sync;
