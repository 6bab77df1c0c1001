//! The node agent's changes to the host network, as rtnetlink requests (netlink-sys sockets,
//! netlink-packet-route messages) instead of running the `ip` command: routes to other nodes'
//! pod CIDRs, deleting the node's bridge, and the node's default address.
//!
//! The requests are synchronous: each is one datagram and its acknowledgement, answered by
//! the kernel at once, and the callers (the node watch under a lock, cleanup in `Drop`) are
//! not async. A socket is opened in the caller's network namespace, which is the agent's.

use ipnet::Ipv4Net;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::{IpAddr, Ipv4Addr};

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

    /// `ip route replace <dst> via <via>`: adds the route or replaces the one to `dst`.
    pub fn replace_route(&mut self, dst: Ipv4Net, via: Ipv4Addr) -> Result<(), NetlinkError> {
        let mut m = route_to(dst);
        m.header.protocol = RouteProtocol::Other(SKIFF_ROUTE_PROTOCOL);
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
    use netlink_packet_route::link::{InfoKind, LinkFlags, LinkInfo};

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

    /// A bridge `name` (no ports), up, with `addr/24` (fixtures through the same socket; the
    /// dummy driver may be absent).
    fn bridge(nl: &mut Netlink, name: &str, addr: Ipv4Addr) -> u32 {
        let mut link = LinkMessage::default();
        link.header.flags = LinkFlags::Up;
        link.header.change_mask = LinkFlags::Up;
        link.attributes.push(LinkAttribute::IfName(name.into()));
        link.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )]));
        nl.request(RouteNetlinkMessage::NewLink(link), NLM_F_ACK | NLM_F_CREATE)
            .unwrap();
        let index = nl
            .request(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                NLM_F_DUMP,
            )
            .unwrap()
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l)
                    if l.attributes.contains(&LinkAttribute::IfName(name.into())) =>
                {
                    Some(l.header.index)
                }
                _ => None,
            })
            .unwrap();
        let mut a = AddressMessage::default();
        a.header.family = AddressFamily::Inet;
        a.header.prefix_len = 24;
        a.header.index = index;
        a.attributes.push(AddressAttribute::Local(addr.into()));
        a.attributes.push(AddressAttribute::Address(addr.into()));
        nl.request(RouteNetlinkMessage::NewAddress(a), NLM_F_ACK | NLM_F_CREATE)
            .unwrap();
        index
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
}
