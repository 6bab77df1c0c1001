//! The cluster's network on the host: one Linux bridge holding the /24 of node addresses
//! (its `.1` is the host's side), and per node a network namespace joined to the bridge by
//! a veth pair (`eth0` inside, the node's address on it). Node namespaces get no default
//! route: a node reaches the bridge's /24 (the other nodes, and the control plane and
//! registry through the host's relay) and nothing else, so no packet of the cluster leaves
//! the machine, whatever a pod or a node-level client tries.
//!
//! Every host-global name derives from the cluster and node names, so a cluster made by
//! `cargo xtask up` and clusters of end-to-end tests live side by side.
//!
//! Links, addresses and routes are rtnetlink requests (skiff-netlink, as the node agent
//! makes them), not `ip` commands.

use super::Error;
use crate::netns::NetNs;
use ipnet::Ipv4Net;
use skiff_netlink::{Netlink, NetlinkError};
use std::net::Ipv4Addr;

/// FNV-1a: stable names from names (interface names allow 15 bytes).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The host bridge of cluster `cluster`.
pub fn bridge_name(cluster: &str) -> String {
    format!("skc{:010x}", fnv1a(cluster.as_bytes()) & 0xff_ffff_ffff)
}

/// The host end of `node`'s veth pair.
pub fn veth_name(cluster: &str, node: &str) -> String {
    let key = format!("{cluster}/{node}");
    format!("skv{:010x}", fnv1a(key.as_bytes()) & 0xff_ffff_ffff)
}

/// `node`'s network namespace.
pub fn netns_name(node: &str) -> String {
    format!("skiff-{node}")
}

/// A /24 of node addresses: `.1` is the host (bridge), nodes count from `.2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet(pub [u8; 3]);

impl Subnet {
    pub fn host(&self) -> Ipv4Addr {
        self.addr(1)
    }

    /// The host's address with the subnet's prefix (`A.B.C.1/24`).
    pub fn host_address(&self) -> Ipv4Net {
        Ipv4Net::new(self.host(), 24).expect("24 is a valid prefix")
    }

    /// The address of the `i`-th node (0-based).
    pub fn node(&self, i: usize) -> Ipv4Addr {
        self.addr(2 + i as u8)
    }

    /// The address of the `i`-th of several control-plane servers (0-based; `.251` up, a
    /// second address of the host's bridge).
    pub fn control_plane(&self, i: usize) -> Ipv4Addr {
        self.addr(251 + i as u8)
    }

    fn addr(&self, last: u8) -> Ipv4Addr {
        let [a, b, c] = self.0;
        Ipv4Addr::new(a, b, c, last)
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a}.{b}.{c}.0/24")
    }
}

impl std::str::FromStr for Subnet {
    type Err = String;

    /// `A.B.C.0/24` (or `A.B.C`).
    fn from_str(s: &str) -> Result<Subnet, String> {
        let base = s.strip_suffix(".0/24").unwrap_or(s);
        let parts: Vec<u8> = base
            .split('.')
            .map(|p| p.parse().map_err(|_| format!("{s}: not a /24")))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [a, b, c] => Ok(Subnet([a, b, c])),
            _ => Err(format!("{s}: expected A.B.C.0/24")),
        }
    }
}

impl From<NetlinkError> for Error {
    fn from(e: NetlinkError) -> Error {
        Error::new(e.to_string())
    }
}

/// A netlink socket in the caller's (the host's) network namespace.
fn host() -> Result<Netlink, Error> {
    Netlink::open().map_err(|e| Error::new(format!("opening a netlink socket: {e}")))
}

fn link_exists(name: &str) -> bool {
    host().is_ok_and(|mut nl| nl.link_index(name).is_ok_and(|i| i.is_some()))
}

/// Creates the bridge with the host's address of `subnet`.
pub fn create_bridge(name: &str, subnet: Subnet) -> Result<(), Error> {
    if link_exists(name) {
        return Err(Error::new(format!(
            "bridge {name} exists already (run `down` first)"
        )));
    }
    let mut nl = host()?;
    nl.add_bridge(name)?;
    nl.add_address(name, subnet.host_address())?;
    nl.set_up(name)?;
    Ok(())
}

/// Adds `ip` (with the subnet's /24) to the bridge, beside the host's address.
pub fn add_bridge_address(bridge: &str, ip: Ipv4Addr) -> Result<(), Error> {
    let net = Ipv4Net::new(ip, 24).map_err(|e| Error::new(e.to_string()))?;
    host()?.add_address(bridge, net)?;
    Ok(())
}

/// Routes `cidr` on the host through `via` (on the bridge, the link to `via`), replacing a
/// route already there; protocol `boot`, as `ip route replace` marks it.
pub fn route_via(cidr: &str, via: Ipv4Addr) -> Result<(), Error> {
    let dst: Ipv4Net = cidr
        .parse()
        .map_err(|e| Error::new(format!("{cidr}: not a CIDR: {e}")))?;
    host()?.replace_route_proto(dst, via, 3)?;
    Ok(())
}

/// Creates `node`'s namespace, its veth into `bridge` and its address.
pub fn create_node(
    netns: &str,
    veth: &str,
    bridge: &str,
    address: Ipv4Addr,
) -> Result<NetNs, Error> {
    let ns = NetNs::create_kept(netns).map_err(|e| Error::new(e.to_string()))?;
    let mut nl = host()?;
    nl.add_veth(veth, "eth0", ns.fd())?;
    nl.set_master(veth, bridge)?;
    nl.set_up(veth)?;
    let mut inside = Netlink::open_in(ns.fd())
        .map_err(|e| Error::new(format!("a netlink socket in {netns}: {e}")))?;
    let address = Ipv4Net::new(address, 24).expect("24 is a valid prefix");
    inside.add_address("eth0", address)?;
    inside.set_up("eth0")?;
    Ok(ns)
}

/// Removes a link if it exists (deleting one end of a veth removes both).
pub fn delete_link(name: &str) -> bool {
    host().is_ok_and(|mut nl| nl.delete_link(name).unwrap_or(false))
}

/// Removes a namespace if it exists (its end of the veth goes with it).
pub fn delete_netns(name: &str) -> bool {
    let exists = std::path::Path::new("/run/netns").join(name).exists();
    if exists {
        NetNs::delete(name);
    }
    exists
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_interfaces_and_differ_per_cluster_and_node() {
        let b = bridge_name("skiff");
        assert_eq!(b.len(), 13);
        assert_ne!(b, bridge_name("e2e-1"));
        assert_ne!(veth_name("skiff", "node-1"), veth_name("skiff", "node-2"));
        assert_ne!(veth_name("a", "node-1"), veth_name("b", "node-1"));
        assert!(veth_name("skiff", "a-very-long-node-name.example.com").len() <= 15);
    }

    #[test]
    fn subnets_parse_and_number_nodes_from_two() {
        let s: Subnet = "10.249.0.0/24".parse().unwrap();
        assert_eq!(s.host().to_string(), "10.249.0.1");
        assert_eq!(s.node(0).to_string(), "10.249.0.2");
        assert_eq!(s.to_string(), "10.249.0.0/24");
        assert!("10.249.0.0/16".parse::<Subnet>().is_err());
    }
}
