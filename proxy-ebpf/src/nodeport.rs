//! North-south: traffic that arrives at a node interface for a NodePort (any node address),
//! an external IP or a LoadBalancer address, translated per packet by tc (TCX) programs, or
//! by an XDP program first where the driver runs one natively.
//!
//! A new flow picks a backend (Maglev, ClientIP affinity or random) once, and both
//! directions are then found in the connection-tracking map (`SKIFF_CT`): the forward entry
//! (client -> frontend) says where the flow goes, the reverse entry (as the reply travels)
//! says what to restore. A backend on this node is reached through the stack (DNAT only:
//! the client address is preserved, and the reply is translated back at the interface's
//! egress); a backend on another node (externalTrafficPolicy Cluster) is reached with the
//! source translated to this node's address and a port of its own, so the reply comes back
//! here, and both directions are redirected out of the interface the route names (the
//! stack would drop a packet whose source is its own address as a martian).

use crate::csum;
use crate::maps::{SKIFF_CT, SKIFF_DEVICES, SKIFF_NODE_ADDRS, SKIFF_SERVICES};
use crate::select;
use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use proxy_common::{
    Addr, CtKey, CtValue, ServiceKey, ServiceValue, BACKEND_FLAG_LOCAL, CT_DIR_FWD, CT_DIR_REV,
    CT_FLAG_CLOSING, CT_FLAG_SNAT, PROTO_TCP, PROTO_UDP, SCOPE_EXTERNAL, SNAT_PORT_MAX,
    SNAT_PORT_MIN, SVC_FLAG_SNAT_REMOTE,
};

pub const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IPV4_HLEN: usize = 20;
const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;

/// An IPv4 TCP or UDP packet's addresses, ports and where its fields are.
#[derive(Clone, Copy)]
pub struct Flow {
    pub saddr: u32,
    pub daddr: u32,
    /// Network byte order, as in the packet.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub tcp_flags: u8,
    pub tot_len: u16,
}

/// Offsets from the start of the frame.
pub const IP_OFF: usize = ETH_HLEN;
pub const IP_CSUM_OFF: usize = IP_OFF + 10;
pub const IP_SADDR_OFF: usize = IP_OFF + 12;
pub const IP_DADDR_OFF: usize = IP_OFF + 16;
pub const L4_OFF: usize = IP_OFF + IPV4_HLEN;
pub const L4_SPORT_OFF: usize = L4_OFF;
pub const L4_DPORT_OFF: usize = L4_OFF + 2;

/// Where the L4 checksum sits, per protocol.
#[inline(always)]
pub fn l4_csum_off(proto: u8) -> usize {
    if proto == PROTO_TCP {
        L4_OFF + 16
    } else {
        L4_OFF + 6
    }
}

#[inline(always)]
unsafe fn read<T: Copy>(data: usize, data_end: usize, off: usize) -> Option<T> {
    let p = data + off;
    if p + core::mem::size_of::<T>() > data_end {
        return None;
    }
    // SAFETY: bounds checked against data_end just above (the verifier checks it too).
    Some(unsafe { core::ptr::read_unaligned(p as *const T) })
}

/// Parses an Ethernet + IPv4 (no options, not a fragment) + TCP/UDP header. Anything else
/// is not for north-south translation and passes untouched.
#[inline(always)]
pub fn parse(data: usize, data_end: usize) -> Option<Flow> {
    // SAFETY: every read is bounds-checked by `read`.
    unsafe {
        let ethertype = u16::from_be(read::<u16>(data, data_end, 12)?);
        if ethertype != ETH_P_IP {
            return None;
        }
        let vihl = read::<u8>(data, data_end, IP_OFF)?;
        if vihl != 0x45 {
            return None;
        }
        let frag = u16::from_be(read::<u16>(data, data_end, IP_OFF + 6)?);
        if frag & 0x3fff != 0 {
            return None;
        }
        let proto = read::<u8>(data, data_end, IP_OFF + 9)?;
        if proto != PROTO_TCP && proto != PROTO_UDP {
            return None;
        }
        let tcp_flags = if proto == PROTO_TCP {
            read::<u8>(data, data_end, L4_OFF + 13)?
        } else {
            // The UDP header must be there too.
            read::<u64>(data, data_end, L4_OFF)?;
            0
        };
        Some(Flow {
            tot_len: u16::from_be(read::<u16>(data, data_end, IP_OFF + 2)?),
            saddr: read::<u32>(data, data_end, IP_SADDR_OFF)?,
            daddr: read::<u32>(data, data_end, IP_DADDR_OFF)?,
            sport: read::<u16>(data, data_end, L4_SPORT_OFF)?,
            dport: read::<u16>(data, data_end, L4_DPORT_OFF)?,
            proto,
            tcp_flags,
        })
    }
}

/// What to write into the packet: the fields whose bit is set in `mask`. Plain values
/// rather than `Option`s: LLVM merges enum payloads across branches, and the verifier then
/// rejects reads of the half never written on the other branch.
#[derive(Clone, Copy)]
pub struct Rewrite {
    pub mask: u8,
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
}

pub const RW_SADDR: u8 = 1;
pub const RW_DADDR: u8 = 2;
pub const RW_SPORT: u8 = 4;
pub const RW_DPORT: u8 = 8;

impl Rewrite {
    pub const NONE: Rewrite = Rewrite {
        mask: 0,
        saddr: 0,
        daddr: 0,
        sport: 0,
        dport: 0,
    };

    /// The destination becomes `addr:port`.
    #[inline(always)]
    fn to(addr: u32, port: u16) -> Rewrite {
        Rewrite {
            mask: RW_DADDR | RW_DPORT,
            daddr: addr,
            dport: port,
            ..Rewrite::NONE
        }
    }

    /// The source becomes `addr:port`.
    #[inline(always)]
    fn from(addr: u32, port: u16) -> Rewrite {
        Rewrite {
            mask: RW_SADDR | RW_SPORT,
            saddr: addr,
            sport: port,
            ..Rewrite::NONE
        }
    }

    /// Both: source `s`, destination `d`.
    #[inline(always)]
    fn both(s: (u32, u16), d: (u32, u16)) -> Rewrite {
        Rewrite {
            mask: RW_SADDR | RW_SPORT | RW_DADDR | RW_DPORT,
            saddr: s.0,
            sport: s.1,
            daddr: d.0,
            dport: d.1,
        }
    }
}

/// What the program does with the packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Not ours: untouched.
    Pass,
    /// Denied (source range) or refused (no backend).
    Drop,
    /// Rewrite and hand to the stack (a backend on this node; a reply leaving).
    Local,
    /// Rewrite and send out of the interface the route to the new destination names.
    Forward,
}

#[derive(Clone, Copy)]
pub struct Act {
    pub kind: Kind,
    pub rw: Rewrite,
    /// The packet is a reset: the flow ends, and its two entries (`fk`, `rk`) go once the
    /// packet is sent on (`commit`). Only the program that sends it deletes them: XDP handing
    /// a reset to tc must leave them, or tc would take the reset for the first packet of a
    /// new flow and send it to a new backend (or under a new SNAT port), leaving the real
    /// connection open on its backend and its SNAT port taken by a stale socket.
    pub ends: bool,
    pub fk: CtKey,
    pub rk: CtKey,
}

const NO_KEY: CtKey = CtKey {
    saddr: 0,
    daddr: 0,
    sport: 0,
    dport: 0,
    proto: 0,
    dir: 0,
    _pad: 0,
};

impl Act {
    pub const PASS: Act = Act {
        kind: Kind::Pass,
        rw: Rewrite::NONE,
        ends: false,
        fk: NO_KEY,
        rk: NO_KEY,
    };
    pub const DROP: Act = Act {
        kind: Kind::Drop,
        ..Act::PASS
    };
    #[inline(always)]
    fn local(rw: Rewrite) -> Act {
        Act {
            kind: Kind::Local,
            rw,
            ..Act::PASS
        }
    }
    #[inline(always)]
    fn forward(rw: Rewrite) -> Act {
        Act {
            kind: Kind::Forward,
            rw,
            ..Act::PASS
        }
    }

    /// The flow of `fk` and `rk` ends with this packet when `rst` (a TCP reset).
    #[inline(always)]
    fn ending_if(self, rst: bool, fk: CtKey, rk: CtKey) -> Act {
        Act {
            ends: rst,
            fk,
            rk,
            ..self
        }
    }

    /// Called by the program that sends the packet on: a reset's flow is forgotten at once
    /// (its SNAT port is free for the next one).
    #[inline(always)]
    pub fn commit(&self) {
        if self.ends {
            let _ = SKIFF_CT.remove(&self.fk);
            let _ = SKIFF_CT.remove(&self.rk);
        }
    }
}

#[inline(always)]
fn now_s() -> u32 {
    // SAFETY: helper without arguments.
    (unsafe { bpf_ktime_get_ns() } / 1_000_000_000) as u32
}

#[inline(always)]
fn key(saddr: u32, sport: u16, daddr: u32, dport: u16, proto: u8, dir: u8) -> CtKey {
    CtKey {
        saddr,
        daddr,
        sport,
        dport,
        proto,
        dir,
        _pad: 0,
    }
}

/// Marks a tracked flow as used (at most once a second: a write per packet would bounce
/// the entry's cache line between CPUs) and closing once a FIN was seen.
#[inline(always)]
fn touch(v: &mut CtValue, f: &Flow, now: u32) {
    if f.tcp_flags & TCP_FIN != 0 && v.flags & CT_FLAG_CLOSING == 0 {
        v.flags |= CT_FLAG_CLOSING;
        v.last_seen_s = now;
    } else if v.last_seen_s != now {
        v.last_seen_s = now;
    }
}

/// The forward and reverse keys of a flow given its forward entry.
#[inline(always)]
fn reverse_of_forward(fk: &CtKey, v: &CtValue) -> CtKey {
    if v.flags & CT_FLAG_SNAT != 0 {
        key(v.to_addr, v.to_port, v.nat_addr, v.nat_port, fk.proto, CT_DIR_REV)
    } else {
        key(v.to_addr, v.to_port, fk.saddr, fk.sport, fk.proto, CT_DIR_REV)
    }
}

/// The external frontend a packet is for: an external IP or LoadBalancer address on its
/// port, else a NodePort when the destination is one of this node's addresses.
#[inline(always)]
fn frontend(f: &Flow) -> Option<ServiceValue> {
    let mut k = ServiceKey {
        addr: Addr::from_v4_raw(f.daddr),
        port: f.dport,
        proto: f.proto,
        scope: SCOPE_EXTERNAL,
    };
    // SAFETY: copied out at once.
    if let Some(v) = unsafe { SKIFF_SERVICES.get(&k) } {
        return Some(*v);
    }
    // SAFETY: as above.
    unsafe { SKIFF_NODE_ADDRS.get(&f.daddr) }?;
    k.addr = Addr::default();
    // SAFETY: as above.
    unsafe { SKIFF_SERVICES.get(&k) }.copied()
}

/// A packet arriving at a node interface (tc ingress, or XDP before it).
#[inline(always)]
pub fn ingress(f: &Flow, ifindex: u32) -> Act {
    let now = now_s();
    let rst = f.tcp_flags & TCP_RST != 0;
    // A reply to a flow sent to another node under this node's address.
    let rk = key(f.saddr, f.sport, f.daddr, f.dport, f.proto, CT_DIR_REV);
    if let Some(v) = SKIFF_CT.get_ptr_mut(&rk) {
        // SAFETY: a live map value; concurrent updates of its plain fields are benign.
        let v = unsafe { &mut *v };
        if v.flags & CT_FLAG_SNAT != 0 {
            touch(v, f, now);
            let rw = Rewrite::both((v.to_addr, v.to_port), (v.nat_addr, v.nat_port));
            let fk = key(v.nat_addr, v.nat_port, v.to_addr, v.to_port, f.proto, CT_DIR_FWD);
            return Act::forward(rw).ending_if(rst, fk, rk);
        }
    }
    // A flow already going somewhere.
    let fk = key(f.saddr, f.sport, f.daddr, f.dport, f.proto, CT_DIR_FWD);
    if let Some(v) = SKIFF_CT.get_ptr_mut(&fk) {
        // SAFETY: as above.
        let v = unsafe { &mut *v };
        touch(v, f, now);
        let snat = v.flags & CT_FLAG_SNAT != 0;
        let rk = reverse_of_forward(&fk, v);
        let act = if snat {
            Act::forward(Rewrite::both((v.nat_addr, v.nat_port), (v.to_addr, v.to_port)))
        } else {
            Act::local(Rewrite::to(v.to_addr, v.to_port))
        };
        return act.ending_if(rst, fk, rk);
    }
    // A new flow.
    let Some(svc) = frontend(f) else {
        return Act::PASS;
    };
    let pick = select::external(&svc, f);
    if pick.outcome != select::Outcome::Chosen {
        return Act::DROP;
    }
    let chosen = pick.chosen;
    let Some(backend) = chosen.backend.addr.v4_raw() else {
        return Act::DROP;
    };
    let bport = chosen.backend.port;
    let snat = svc.flags & SVC_FLAG_SNAT_REMOTE != 0 && chosen.backend.flags & BACKEND_FLAG_LOCAL == 0;
    if !snat {
        let rev = CtValue {
            to_addr: f.daddr,
            to_port: f.dport,
            frontend: svc.id,
            last_seen_s: now,
            ..CtValue::default()
        };
        let fwd = CtValue {
            to_addr: backend,
            to_port: bport,
            frontend: svc.id,
            last_seen_s: now,
            ..CtValue::default()
        };
        let rk = key(backend, bport, f.saddr, f.sport, f.proto, CT_DIR_REV);
        if SKIFF_CT.insert(&rk, &rev, 0).is_err() || SKIFF_CT.insert(&fk, &fwd, 0).is_err() {
            select::drop_reason(select::Drop::CtFull);
            return Act::DROP;
        }
        return Act::local(Rewrite::to(backend, bport));
    }
    // SNAT to this node: the address of the interface the packet came in on, and a port no
    // other flow to the same backend holds (claimed with NOEXIST, a few tries).
    // SAFETY: copied out at once.
    let Some(dev) = (unsafe { SKIFF_DEVICES.get(&ifindex) }).copied() else {
        select::drop_reason(select::Drop::NoDevice);
        return Act::DROP;
    };
    let rev = CtValue {
        to_addr: f.daddr,
        to_port: f.dport,
        nat_addr: f.saddr,
        nat_port: f.sport,
        frontend: svc.id,
        last_seen_s: now,
        flags: CT_FLAG_SNAT,
        ..CtValue::default()
    };
    let span = (SNAT_PORT_MAX - SNAT_PORT_MIN + 1) as u32;
    let mut port = 0u16;
    for _ in 0..8 {
        // SAFETY: helper without arguments.
        let p = (SNAT_PORT_MIN as u32 + unsafe { bpf_get_prandom_u32() } % span) as u16;
        let rk = key(backend, bport, dev.addr, p.to_be(), f.proto, CT_DIR_REV);
        if SKIFF_CT.insert(&rk, &rev, proxy_common::BPF_NOEXIST).is_ok() {
            port = p.to_be();
            break;
        }
    }
    if port == 0 {
        select::drop_reason(select::Drop::SnatPorts);
        return Act::DROP;
    }
    let fwd = CtValue {
        to_addr: backend,
        to_port: bport,
        nat_addr: dev.addr,
        nat_port: port,
        frontend: svc.id,
        last_seen_s: now,
        flags: CT_FLAG_SNAT,
        ..CtValue::default()
    };
    if SKIFF_CT.insert(&fk, &fwd, 0).is_err() {
        let rk = key(backend, bport, dev.addr, port, f.proto, CT_DIR_REV);
        let _ = SKIFF_CT.remove(&rk);
        select::drop_reason(select::Drop::CtFull);
        return Act::DROP;
    }
    Act::forward(Rewrite::both((dev.addr, port), (backend, bport)))
}

/// A packet leaving a node interface (tc egress): the reply of a flow served on this node
/// gets its frontend back as source.
#[inline(always)]
pub fn egress(f: &Flow) -> Act {
    let rk = key(f.saddr, f.sport, f.daddr, f.dport, f.proto, CT_DIR_REV);
    let Some(v) = SKIFF_CT.get_ptr_mut(&rk) else {
        return Act::PASS;
    };
    // SAFETY: a live map value.
    let v = unsafe { &mut *v };
    if v.flags & CT_FLAG_SNAT != 0 {
        return Act::PASS;
    }
    touch(v, f, now_s());
    let rw = Rewrite::from(v.to_addr, v.to_port);
    let fk = key(f.daddr, f.dport, v.to_addr, v.to_port, f.proto, CT_DIR_FWD);
    Act::local(rw).ending_if(f.tcp_flags & TCP_RST != 0, fk, rk)
}

/// The incremental checksum updates for a rewrite: (field offset, old, new) per address
/// and port (new == old where unchanged); callers apply them with the helpers (tc) or by
/// hand (XDP).
#[inline(always)]
pub fn changes(f: &Flow, rw: &Rewrite) -> ([(usize, u32, u32); 2], [(usize, u16, u16); 2]) {
    let pick32 = |bit: u8, old: u32, new: u32| if rw.mask & bit != 0 { new } else { old };
    let pick16 = |bit: u8, old: u16, new: u16| if rw.mask & bit != 0 { new } else { old };
    (
        [
            (IP_SADDR_OFF, f.saddr, pick32(RW_SADDR, f.saddr, rw.saddr)),
            (IP_DADDR_OFF, f.daddr, pick32(RW_DADDR, f.daddr, rw.daddr)),
        ],
        [
            (L4_SPORT_OFF, f.sport, pick16(RW_SPORT, f.sport, rw.sport)),
            (L4_DPORT_OFF, f.dport, pick16(RW_DPORT, f.dport, rw.dport)),
        ],
    )
}

/// Applies `rw` to the packet by hand (XDP: no checksum helpers) with RFC 1624
/// incremental checksum updates. Returns false if the packet is shorter than its headers.
#[inline(always)]
pub fn rewrite_direct(data: usize, data_end: usize, f: &Flow, rw: &Rewrite) -> bool {
    // Each protocol's checksum with its own bounds check, so the verifier sees the access
    // proven on every path.
    let l4_csum = if f.proto == PROTO_TCP {
        if data + L4_OFF + 18 > data_end {
            return false;
        }
        (data + L4_OFF + 16) as *mut u16
    } else {
        if data + L4_OFF + 8 > data_end {
            return false;
        }
        (data + L4_OFF + 6) as *mut u16
    };
    let (addrs, ports) = changes(f, rw);
    // SAFETY: the IPv4 header and the L4 ports lie below the checked bound (parse checked
    // them too), the checksum pointer was checked just above.
    unsafe {
        let ip_csum = (data + IP_CSUM_OFF) as *mut u16;
        let udp_no_csum = f.proto == PROTO_UDP && core::ptr::read_unaligned(l4_csum) == 0;
        for (off, old, new) in addrs {
            if old == new {
                continue;
            }
            core::ptr::write_unaligned((data + off) as *mut u32, new);
            let c = core::ptr::read_unaligned(ip_csum);
            core::ptr::write_unaligned(ip_csum, csum::replace4(c, old, new));
            if !udp_no_csum {
                let c = core::ptr::read_unaligned(l4_csum);
                core::ptr::write_unaligned(l4_csum, csum::replace4(c, old, new));
            }
        }
        for (off, old, new) in ports {
            if old == new {
                continue;
            }
            core::ptr::write_unaligned((data + off) as *mut u16, new);
            if !udp_no_csum {
                let c = core::ptr::read_unaligned(l4_csum);
                core::ptr::write_unaligned(l4_csum, csum::replace2(c, old, new));
            }
        }
    }
    true
}

/// Sets the Ethernet source and destination (XDP_TX towards the route's next hop).
#[inline(always)]
pub fn set_macs(data: usize, data_end: usize, smac: &[u8; 6], dmac: &[u8; 6]) -> bool {
    if data + ETH_HLEN > data_end {
        return false;
    }
    // SAFETY: bounds checked just above.
    unsafe {
        core::ptr::write_unaligned(data as *mut [u8; 6], *dmac);
        core::ptr::write_unaligned((data + 6) as *mut [u8; 6], *smac);
    }
    true
}
