//! The node's network as north-south needs it, read from netlink (rtnetlink) and followed
//! as it changes: the node's IPv4 addresses (a NodePort answers on every one of them), and
//! the interfaces that carry traffic from outside (where the tc and XDP programs attach,
//! each with the address SNAT uses there).
//!
//! Devices chosen automatically are what kube-proxy and Cilium call node interfaces: up,
//! not loopback, not a bridge and not enslaved to one (a pod's veth, a CNI bridge), with a
//! global IPv4 address. `--devices none` attaches nothing (socket-level NodePorts still
//! work for the node's own processes and pods).

use futures::StreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::AddressFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

/// Which interfaces get the north-south programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelection {
    /// Node interfaces, found as described in the module docs.
    Auto,
    /// None: no packet-level translation.
    None,
    /// These, by name.
    Named(BTreeSet<String>),
}

impl FromStr for DeviceSelection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceSelection::Auto),
            "none" => Ok(DeviceSelection::None),
            list => {
                let names: BTreeSet<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect();
                if names.is_empty() || names.iter().any(|n| n.len() > 15) {
                    return Err(format!("{s:?}: expected auto, none or interface names"));
                }
                Ok(DeviceSelection::Named(names))
            }
        }
    }
}

/// One interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub up: bool,
    pub loopback: bool,
    pub bridge: bool,
    pub enslaved: bool,
}

/// An interface the programs attach to, with the address SNAT uses there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Device {
    pub index: u32,
    pub name: String,
    pub addr: Ipv4Addr,
}

/// The node's interfaces and IPv4 addresses at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub links: BTreeMap<u32, Link>,
    /// (interface, address, global scope), in the kernel's order (primary first).
    pub addrs: Vec<(u32, Ipv4Addr, bool)>,
}

impl Snapshot {
    /// The node's addresses a NodePort answers on: every global IPv4 address but those in
    /// `exclude` (LoadBalancer addresses this proxy announces itself).
    pub fn node_addresses(&self, exclude: &BTreeSet<Ipv4Addr>) -> BTreeSet<Ipv4Addr> {
        self.addrs
            .iter()
            .filter(|(_, a, global)| *global && !exclude.contains(a))
            .map(|(_, a, _)| *a)
            .collect()
    }

    /// The interfaces `sel` names, each with its first global IPv4 address.
    pub fn devices(&self, sel: &DeviceSelection) -> Vec<Device> {
        let mut out = Vec::new();
        for l in self.links.values() {
            let chosen = match sel {
                DeviceSelection::None => false,
                DeviceSelection::Named(names) => names.contains(&l.name),
                DeviceSelection::Auto => l.up && !l.loopback && !l.bridge && !l.enslaved,
            };
            if !chosen {
                continue;
            }
            let addr = self
                .addrs
                .iter()
                .find(|(i, _, global)| *i == l.index && *global)
                .map(|(_, a, _)| *a);
            if let Some(addr) = addr {
                out.push(Device {
                    index: l.index,
                    name: l.name.clone(),
                    addr,
                });
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("netlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("netlink request: {0}")]
    Request(#[from] rtnetlink::Error),
}

fn link_of(m: &LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        up: m.header.flags.contains(LinkFlags::Up),
        loopback: m.header.flags.contains(LinkFlags::Loopback),
        bridge: false,
        enslaved: false,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Controller(_) => l.enslaved = true,
            LinkAttribute::LinkInfo(infos) => {
                l.bridge = infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Bridge)));
            }
            _ => {}
        }
    }
    l
}

fn addr_of(m: &AddressMessage) -> Option<(u32, Ipv4Addr, bool)> {
    if m.header.family != AddressFamily::Inet {
        return None;
    }
    // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on point-to-point
    // links); fall back to IFA_ADDRESS.
    let local = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(IpAddr::V4(v4)) => Some(*v4),
        _ => None,
    });
    let addr = local.or_else(|| {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V4(v4)) => Some(*v4),
            _ => None,
        })
    })?;
    Some((
        m.header.index,
        addr,
        m.header.scope == AddressScope::Universe,
    ))
}

/// Reads the current links and addresses.
pub async fn snapshot(handle: &rtnetlink::Handle) -> Result<Snapshot, NetError> {
    let mut s = Snapshot::default();
    let mut links = handle.link().get().execute();
    while let Some(m) = links.next().await {
        let l = link_of(&m?);
        s.links.insert(l.index, l);
    }
    let mut addrs = handle.address().get().execute();
    while let Some(m) = addrs.next().await {
        if let Some(a) = addr_of(&m?) {
            s.addrs.push(a);
        }
    }
    Ok(s)
}

/// A netlink connection for requests, and a stream that yields once per burst of link or
/// IPv4 address changes (the caller re-reads the snapshot).
pub fn connect() -> Result<(rtnetlink::Handle, tokio::sync::mpsc::Receiver<()>), NetError> {
    let (conn, handle, _) = rtnetlink::new_connection()?;
    tokio::spawn(conn);
    let (mconn, _mhandle, mut messages) = rtnetlink::new_multicast_connection(&[
        rtnetlink::MulticastGroup::Link,
        rtnetlink::MulticastGroup::Ipv4Ifaddr,
    ])?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    // Kernel notifications arrive on this connection's socket; the connection task must
    // run for them to be read.
    tokio::spawn(mconn);
    tokio::spawn(async move {
        while messages.next().await.is_some() {
            // A full channel already holds a wake-up: changes coalesce.
            let _ = tx.try_send(());
        }
    });
    Ok((handle, rx))
}

/// Adds `ip/32` to the loopback interface (a LoadBalancer address this node announces:
/// the kernel then answers ARP for it on every interface).
pub async fn add_local(handle: &rtnetlink::Handle, lo: u32, ip: Ipv4Addr) -> Result<(), NetError> {
    match handle.address().add(lo, IpAddr::V4(ip), 32).execute().await {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
        other => Ok(other?),
    }
}

/// Removes `ip/32` from the loopback interface again.
pub async fn remove_local(
    handle: &rtnetlink::Handle,
    lo: u32,
    ip: Ipv4Addr,
) -> Result<(), NetError> {
    let mut addrs = handle
        .address()
        .get()
        .set_link_index_filter(lo)
        .set_address_filter(IpAddr::V4(ip))
        .execute();
    while let Some(m) = addrs.next().await {
        let m = m?;
        if addr_of(&m).is_some_and(|(_, a, _)| a == ip) {
            handle.address().del(m).execute().await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            up: true,
            loopback: false,
            bridge: false,
            enslaved: false,
        }
    }

    #[test]
    fn auto_picks_node_interfaces_only() {
        let mut s = Snapshot::default();
        s.links.insert(
            1,
            Link {
                loopback: true,
                ..link(1, "lo")
            },
        );
        s.links.insert(2, link(2, "eth0"));
        s.links.insert(
            3,
            Link {
                bridge: true,
                ..link(3, "cni0")
            },
        );
        s.links.insert(
            4,
            Link {
                enslaved: true,
                ..link(4, "veth1")
            },
        );
        s.links.insert(5, link(5, "eth1"));
        s.addrs = vec![
            (1, "127.0.0.1".parse().unwrap(), false),
            (2, "10.249.0.2".parse().unwrap(), true),
            (3, "10.244.1.1".parse().unwrap(), true),
        ];
        let d = s.devices(&DeviceSelection::Auto);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].name, "eth0");
        assert_eq!(d[0].addr.to_string(), "10.249.0.2");
        // NodePorts answer on every global address, the bridge's included.
        let lb: BTreeSet<Ipv4Addr> = BTreeSet::new();
        assert_eq!(s.node_addresses(&lb).len(), 2);
        assert!(s.devices(&DeviceSelection::None).is_empty());
        let named: DeviceSelection = "cni0".parse().unwrap();
        assert_eq!(s.devices(&named)[0].index, 3);
    }
}
