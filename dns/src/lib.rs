//! skiff-dns: the cluster's DNS server. Services, headless Services' ready endpoints, named
//! ports (SRV), reverse names of cluster addresses and pod names under the cluster domain,
//! from a watch of Services and EndpointSlices; every other name forwarded to upstream
//! resolvers. Built on hickory-server (listeners, wire format) and hickory-resolver
//! (forwarding); the zone itself is ours, kept per Service (see [`records`]).

pub mod baseline;
pub mod handler;
pub mod metrics;
pub mod records;
pub mod server;
pub mod watch;

pub use server::{start, Config, RunningDns, ServerError, Upstream};
