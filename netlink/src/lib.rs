//! skiff's changes to the host network, as rtnetlink requests (netlink-sys sockets,
//! netlink-packet-route messages) instead of running the `ip` command. The node agent: routes
//! to other nodes' pod CIDRs (marked with [`SKIFF_ROUTE_PROTOCOL`] so a restarted agent finds
//! its own), deleting the node's bridge, the node's default address. The cluster launcher:
//! the host bridge, each node's veth pair into its network namespace, addresses, links up,
//! host routes to the nodes' pod networks.
//!
//! The requests are synchronous: each is one datagram and its acknowledgement, answered by
//! the kernel at once, and the callers (the node watch under a lock, cleanup in `Drop`, the
//! launcher's set-up) are not async, so rtnetlink's async handle would add a runtime for
//! nothing. A socket works in the network namespace it was opened in: the caller's
//! ([`Netlink::open`]) or a given one ([`Netlink::open_in`]).

use ipnet::Ipv4Net;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkFlags, LinkInfo};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd};

/// A failed netlink request: what was asked (in `ip`'s words, for the logs) and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct NetlinkError {
    what: String,
    #[source]
    source: io::Error,
}

impl NetlinkError {
    /// The kernel's errno, when the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// A rtnetlink socket for requests.
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

/// The routing protocol number skiff's node agent marks its routes with (`ip route show
/// proto 83`; 83 is unassigned in iproute2's rt_protos). The kernel keeps it with the route,
/// so an agent that restarts finds the routes an earlier run installed and removes those no
/// Node asks for any more, without touching routes anyone else made.
pub const SKIFF_ROUTE_PROTOCOL: u8 = 83;

/// Large enough for any datagram the kernel sends to a dump (it caps them at 32 KiB).
const RECV_BUFFER: usize = 64 * 1024;

impl Netlink {
    /// Opens a rtnetlink socket in the current network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Opens a rtnetlink socket in the network namespace `ns` (an open /run/netns/<name> or
    /// /proc/<pid>/ns/net): a thread enters it to create the socket, which keeps working
    /// there from any thread.
    pub fn open_in(ns: &impl AsFd) -> io::Result<Netlink> {
        let ns = ns.as_fd().try_clone_to_owned()?;
        std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            Netlink::open()
        })
        .join()
        .map_err(|_| io::Error::other("the thread opening a netlink socket panicked"))?
    }

    /// `ip route replace <dst> via <via> proto 83`: adds the route or replaces the one to
    /// `dst`, marked as the node agent's.
    pub fn replace_route(&mut self, dst: Ipv4Net, via: Ipv4Addr) -> Result<(), NetlinkError> {
        self.replace_route_proto(dst, via, SKIFF_ROUTE_PROTOCOL)
    }

    /// `ip route replace <dst> via <via> proto <protocol>` (3, `boot`, is what `ip` sets).
    pub fn replace_route_proto(
        &mut self,
        dst: Ipv4Net,
        via: Ipv4Addr,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let mut m = route_to(dst);
        m.header.protocol = RouteProtocol::from(protocol);
        m.header.scope = RouteScope::Universe;
        m.header.kind = RouteType::Unicast;
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(via)));
        self.request(
            RouteNetlinkMessage::NewRoute(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )
        .map(drop)
        .map_err(|source| NetlinkError {
            what: format!("ip route replace {dst} via {via}"),
            source,
        })
    }

    /// `ip route del <dst>`: deletes the route to `dst` in the main table, whatever its
    /// gateway.
    pub fn delete_route(&mut self, dst: Ipv4Net) -> Result<(), NetlinkError> {
        let mut m = route_to(dst);
        // The kernel matches a deletion on the fields given: "nowhere" and unspecified
        // protocol and type match any route to the destination, as `ip route del` does.
        m.header.protocol = RouteProtocol::Unspec;
        m.header.scope = RouteScope::NoWhere;
        m.header.kind = RouteType::Unspec;
        self.request(RouteNetlinkMessage::DelRoute(m), NLM_F_ACK)
            .map(drop)
            .map_err(|source| NetlinkError {
                what: format!("ip route del {dst}"),
                source,
            })
    }

    /// `ip route show table main proto 83`: the destinations of the IPv4 routes this node
    /// agent (an earlier run included) installed.
    pub fn skiff_routes(&mut self) -> Result<Vec<Ipv4Net>, NetlinkError> {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        let answers = self
            .request(RouteNetlinkMessage::GetRoute(m), NLM_F_DUMP)
            .map_err(|source| NetlinkError {
                what: format!("ip route show proto {SKIFF_ROUTE_PROTOCOL}"),
                source,
            })?;
        Ok(answers
            .into_iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewRoute(r)
                    if r.header.table == RouteHeader::RT_TABLE_MAIN
                        && r.header.protocol == RouteProtocol::Other(SKIFF_ROUTE_PROTOCOL) =>
                {
                    r.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Destination(RouteAddress::Inet(d)) => {
                            Ipv4Net::new(*d, r.header.destination_prefix_length).ok()
                        }
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect())
    }

    /// `ip link show <name>`'s index, or None when there is no such link.
    pub fn link_index(&mut self, name: &str) -> Result<Option<u32>, NetlinkError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(m), NLM_F_ACK) {
            Ok(answers) => Ok(answers.into_iter().find_map(|a| match a {
                RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(source) => Err(NetlinkError {
                what: format!("ip link show {name}"),
                source,
            }),
        }
    }

    /// `ip link add <name> type bridge`.
    pub fn add_bridge(&mut self, name: &str) -> Result<(), NetlinkError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )]));
        self.new_link(m, format!("ip link add {name} type bridge"))
    }

    /// `ip link add <name> type veth peer name <peer> netns <ns>`: a veth pair whose `peer`
    /// end is created in the network namespace `ns`.
    pub fn add_veth(&mut self, name: &str, peer: &str, ns: &impl AsFd) -> Result<(), NetlinkError> {
        let mut other = LinkMessage::default();
        other.attributes.push(LinkAttribute::IfName(peer.into()));
        other
            .attributes
            .push(LinkAttribute::NetNsFd(ns.as_fd().as_raw_fd()));
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(other))),
        ]));
        self.new_link(
            m,
            format!("ip link add {name} type veth peer name {peer} netns <fd>"),
        )
    }

    /// `ip link set <name> up`.
    pub fn set_up(&mut self, name: &str) -> Result<(), NetlinkError> {
        let mut m = LinkMessage::default();
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        m.attributes.push(LinkAttribute::IfName(name.into()));
        self.set_link(m, format!("ip link set {name} up"))
    }

    /// `ip link set <name> master <bridge>`.
    pub fn set_master(&mut self, name: &str, bridge: &str) -> Result<(), NetlinkError> {
        let what = format!("ip link set {name} master {bridge}");
        let index = self.link_index(bridge)?.ok_or_else(|| NetlinkError {
            what: what.clone(),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m.attributes.push(LinkAttribute::Controller(index));
        self.set_link(m, what)
    }

    /// `ip addr add <address> dev <name>` (the address with its prefix, e.g. 10.0.0.1/24).
    pub fn add_address(&mut self, name: &str, address: Ipv4Net) -> Result<(), NetlinkError> {
        let what = format!("ip addr add {address} dev {name}");
        let index = self.link_index(name)?.ok_or_else(|| NetlinkError {
            what: what.clone(),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        let mut a = AddressMessage::default();
        a.header.family = AddressFamily::Inet;
        a.header.prefix_len = address.prefix_len();
        a.header.index = index;
        a.attributes
            .push(AddressAttribute::Local(address.addr().into()));
        a.attributes
            .push(AddressAttribute::Address(address.addr().into()));
        self.request(
            RouteNetlinkMessage::NewAddress(a),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
        .map_err(|source| NetlinkError { what, source })
    }

    /// Creates a link (fails if one of that name exists).
    fn new_link(&mut self, m: LinkMessage, what: String) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
        .map_err(|source| NetlinkError { what, source })
    }

    /// Changes an existing link, found by the name in `m`.
    fn set_link(&mut self, m: LinkMessage, what: String) -> Result<(), NetlinkError> {
        self.request(RouteNetlinkMessage::SetLink(m), NLM_F_ACK)
            .map(drop)
            .map_err(|source| NetlinkError { what, source })
    }

    /// `ip link delete dev <name>`; returns whether the link existed.
    pub fn delete_link(&mut self, name: &str) -> Result<bool, NetlinkError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::DelLink(m), NLM_F_ACK) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(false),
            Err(source) => Err(NetlinkError {
                what: format!("ip link delete dev {name}"),
                source,
            }),
        }
    }

    /// The first IPv4 address of global scope, by interface index (`ip -4 addr show scope
    /// global`'s first line).
    pub fn first_global_ipv4(&mut self) -> Result<Option<Ipv4Addr>, NetlinkError> {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        let answers = self
            .request(RouteNetlinkMessage::GetAddress(m), NLM_F_DUMP)
            .map_err(|source| NetlinkError {
                what: "ip -4 addr show".into(),
                source,
            })?;
        let mut global: Vec<(u32, Ipv4Addr)> = answers
            .iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewAddress(a) => global_ipv4(a),
                _ => None,
            })
            .collect();
        // Stable: an interface's addresses keep the kernel's order (primary first).
        global.sort_by_key(|(index, _)| *index);
        Ok(global.first().map(|(_, ip)| *ip))
    }

    /// Sends one request and collects the answers up to its acknowledgement (or the end of
    /// a dump); a refusal is the kernel's errno.
    fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send(&out, 0)?;

        let mut answers = Vec::new();
        let mut buf = vec![0u8; RECV_BUFFER];
        loop {
            let n = self.socket.recv(&mut &mut buf[..], 0)?;
            if n > buf.len() {
                return Err(io::Error::other("netlink answer larger than the buffer"));
            }
            let mut offset = 0;
            while offset < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..n])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "netlink message of length 0",
                    ));
                }
                // Messages in one datagram are aligned to 4 bytes.
                offset += (len + 3) & !3;
                if msg.header.sequence_number != seq {
                    // An answer to an earlier request that gave up (none do today).
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => answers.push(m),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(_) => Err(e.to_io()),
                            None => Ok(answers),
                        }
                    }
                    NetlinkPayload::Done(d) if d.code != 0 => {
                        return Err(io::Error::from_raw_os_error(d.code.abs()))
                    }
                    NetlinkPayload::Done(_) => return Ok(answers),
                    _ => {}
                }
            }
        }
    }
}

/// A route message to `dst` in the main table, with nothing else set.
fn route_to(dst: Ipv4Net) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = AddressFamily::Inet;
    m.header.destination_prefix_length = dst.prefix_len();
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::Inet(
            dst.network(),
        )));
    m
}

/// The interface index and IPv4 address of a global-scope address.
fn global_ipv4(m: &AddressMessage) -> Option<(u32, Ipv4Addr)> {
    if m.header.family != AddressFamily::Inet || m.header.scope != AddressScope::Universe {
        return None;
    }
    // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on point-to-point
    // links), as `ip` prints it.
    let find = |local: bool| {
        m.attributes.iter().find_map(|a| match (a, local) {
            (AddressAttribute::Local(IpAddr::V4(v4)), true)
            | (AddressAttribute::Address(IpAddr::V4(v4)), false) => Some(*v4),
            _ => None,
        })
    };
    Some((m.header.index, find(true).or_else(|| find(false))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own in a new, empty network namespace (the test needs
    /// root, as the node crate's tests do), so the host's routes are never touched.
    fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(NEWNET)");
            f()
        })
        .join()
        .unwrap()
    }

    /// A bridge `name` (no ports), up, with `addr/24`, made through the public requests.
    fn bridge(nl: &mut Netlink, name: &str, addr: Ipv4Addr) -> u32 {
        nl.add_bridge(name).unwrap();
        nl.set_up(name).unwrap();
        nl.add_address(name, Ipv4Net::new(addr, 24).unwrap())
            .unwrap();
        nl.link_index(name).unwrap().unwrap()
    }

    /// The gateways of the main table's routes to `dst`.
    fn gateways(nl: &mut Netlink, dst: Ipv4Net) -> Vec<Ipv4Addr> {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        nl.request(RouteNetlinkMessage::GetRoute(m), NLM_F_DUMP)
            .unwrap()
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r)
                    if r.header.table == RouteHeader::RT_TABLE_MAIN
                        && r.header.destination_prefix_length == dst.prefix_len()
                        && r.attributes.contains(&RouteAttribute::Destination(
                            RouteAddress::Inet(dst.network()),
                        )) =>
                {
                    r.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
                        _ => None,
                    })
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn routes_links_and_addresses_in_a_namespace() {
        in_new_netns(|| {
            let mut nl = Netlink::open().unwrap();
            assert_eq!(nl.first_global_ipv4().unwrap(), None);
            let dst: Ipv4Net = "10.244.5.0/24".parse().unwrap();
            // No interface reaches the gateway yet: the kernel's refusal comes back.
            let e = nl
                .replace_route(dst, Ipv4Addr::new(10, 9, 0, 2))
                .unwrap_err();
            assert_eq!(e.errno(), Some(libc::ENETUNREACH), "{e}");
            assert!(e
                .to_string()
                .contains("ip route replace 10.244.5.0/24 via 10.9.0.2"));

            bridge(&mut nl, "skt0", Ipv4Addr::new(10, 9, 0, 1));
            assert_eq!(
                nl.first_global_ipv4().unwrap(),
                Some(Ipv4Addr::new(10, 9, 0, 1))
            );
            nl.replace_route(dst, Ipv4Addr::new(10, 9, 0, 2)).unwrap();
            assert_eq!(gateways(&mut nl, dst), [Ipv4Addr::new(10, 9, 0, 2)]);
            // Marked as skiff's; the bridge's own (kernel) route is not.
            assert_eq!(nl.skiff_routes().unwrap(), [dst]);
            // Replacing is idempotent and moves the gateway.
            nl.replace_route(dst, Ipv4Addr::new(10, 9, 0, 2)).unwrap();
            nl.replace_route(dst, Ipv4Addr::new(10, 9, 0, 3)).unwrap();
            assert_eq!(gateways(&mut nl, dst), [Ipv4Addr::new(10, 9, 0, 3)]);

            nl.delete_route(dst).unwrap();
            assert!(gateways(&mut nl, dst).is_empty());
            assert!(nl.skiff_routes().unwrap().is_empty());
            let e = nl.delete_route(dst).unwrap_err();
            assert_eq!(e.errno(), Some(libc::ESRCH), "{e}");

            assert!(nl.delete_link("skt0").unwrap());
            assert!(!nl.delete_link("skt0").unwrap());
            assert_eq!(nl.first_global_ipv4().unwrap(), None);
        });
    }

    #[test]
    fn a_veth_pair_into_another_namespace_joins_a_bridge() {
        in_new_netns(|| {
            let mut host = Netlink::open().unwrap();
            assert_eq!(host.link_index("skb0").unwrap(), None);
            bridge(&mut host, "skb0", Ipv4Addr::new(10, 9, 1, 1));
            let e = host.add_bridge("skb0").unwrap_err();
            assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");

            // The node's namespace: a second one, made by a thread of this namespace.
            let node_ns = std::thread::spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                std::fs::File::open("/proc/thread-self/ns/net").unwrap()
            })
            .join()
            .unwrap();
            host.add_veth("skv0", "eth0", &node_ns).unwrap();
            host.set_master("skv0", "skb0").unwrap();
            host.set_up("skv0").unwrap();
            assert!(host.link_index("skv0").unwrap().is_some());
            assert_eq!(
                host.link_index("eth0").unwrap(),
                None,
                "the peer is elsewhere"
            );

            let mut node = Netlink::open_in(&node_ns).unwrap();
            assert!(node.link_index("eth0").unwrap().is_some());
            node.add_address("eth0", "10.9.1.2/24".parse().unwrap())
                .unwrap();
            node.set_up("eth0").unwrap();
            assert_eq!(
                node.first_global_ipv4().unwrap(),
                Some(Ipv4Addr::new(10, 9, 1, 2))
            );
            // A route through the node, as the launcher's host routes, not marked as skiff's.
            let dst: Ipv4Net = "10.251.3.0/26".parse().unwrap();
            host.replace_route_proto(dst, Ipv4Addr::new(10, 9, 1, 2), 3)
                .unwrap();
            assert_eq!(gateways(&mut host, dst), [Ipv4Addr::new(10, 9, 1, 2)]);
            assert!(host.skiff_routes().unwrap().is_empty());

            let e = host.set_master("skv0", "nosuch").unwrap_err();
            assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
            // Deleting one end removes both.
            assert!(host.delete_link("skv0").unwrap());
            assert_eq!(node.link_index("eth0").unwrap(), None);
        });
    }
}
