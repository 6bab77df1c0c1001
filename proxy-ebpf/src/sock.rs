//! Socket-level load balancing: cgroup v2 sock_addr hooks that rewrite a service address
//! to a backend address when a socket connects or sends, and back again when it receives
//! or asks for its peer. No packet is rewritten: the translation happens once per
//! connect() (or per unconnected UDP send), one hash lookup in the services map. The
//! services are cluster IPs, external IPs and LoadBalancer addresses (by address), and
//! NodePorts at any of this node's addresses: a pod or node-level client reaches a service
//! through any of them without a packet being translated.

use crate::maps::{SKIFF_NODE_ADDRS, SKIFF_SERVICES, SKIFF_SOCK_REVNAT};
use crate::select::{self, count, Chosen};
use aya_log_ebpf::debug;
use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_set_retval},
    programs::SockAddrContext,
    EbpfContext,
};
use proxy_common::{
    Addr, RevNatEntry, ServiceKey, ServiceValue, SockRevNat, PROTO_TCP, PROTO_UDP,
    REVNAT_PER_SOCKET, SCOPE_CLUSTER, SCOPE_NODEPORT,
};

/// Program return codes for cgroup sock_addr hooks.
pub const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// What the forward translation decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Not a service address: leave the socket alone.
    NotService,
    /// A service with no usable backend: fail the call with ECONNREFUSED.
    Refuse,
    /// Go to the chosen backend instead.
    Translate,
}

/// The decision with its backend ([`Chosen::NONE`] unless translating). A plain struct
/// rather than an enum carrying the backend: LLVM merges enum payloads across branches and
/// the verifier then rejects a read of the never-written half ("!read_ok").
#[derive(Clone, Copy)]
struct Verdict {
    action: Action,
    chosen: Chosen,
}

impl Verdict {
    const NOT_SERVICE: Verdict = Verdict {
        action: Action::NotService,
        chosen: Chosen::NONE,
    };
    const REFUSE: Verdict = Verdict {
        action: Action::Refuse,
        chosen: Chosen::NONE,
    };
}

/// Which hook translates: an unconnected UDP send sticks to the backend it used before.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Connect,
    Send,
}

#[inline(always)]
fn sa(ctx: &SockAddrContext) -> &mut bpf_sock_addr {
    // SAFETY: the kernel hands every sock_addr program a valid context.
    unsafe { &mut *ctx.sock_addr }
}

/// The frontend for a socket's destination: by address, else a NodePort when the address
/// is one of this node's.
#[inline(always)]
fn frontend(addr: Addr, port: u16, proto: u8) -> Option<ServiceValue> {
    let mut key = ServiceKey {
        addr,
        port,
        proto,
        scope: SCOPE_CLUSTER,
    };
    // SAFETY: copied out at once; the map is only written by user space.
    if let Some(v) = unsafe { SKIFF_SERVICES.get(&key) } {
        return Some(*v);
    }
    let v4 = addr.v4_raw()?;
    // SAFETY: as above.
    unsafe { SKIFF_NODE_ADDRS.get(&v4) }?;
    key.addr = Addr::default();
    key.scope = SCOPE_NODEPORT;
    // SAFETY: as above.
    unsafe { SKIFF_SERVICES.get(&key) }.copied()
}

/// The forward translation: service lookup, backend choice, affinity, counters.
#[inline(always)]
fn pick(ctx: &SockAddrContext, hook: Hook, addr: Addr, port: u16, proto: u8) -> Verdict {
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Verdict::NOT_SERVICE;
    }
    let Some(svc) = frontend(addr, port, proto) else {
        return Verdict::NOT_SERVICE;
    };
    if svc.count == 0 {
        count(svc.id, |c| c.refused += 1);
        return Verdict::REFUSE;
    }
    let sticky = match hook {
        Hook::Send => still_valid(previous(ctx, addr, port), &svc),
        Hook::Connect => None,
    };
    let chosen = match sticky {
        Some(c) => Some(c),
        // SAFETY: helper valid for sock_addr programs; the context pointer is the kernel's.
        None => select::socket(&svc, || unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }),
    };
    match chosen {
        Some(c) => {
            count(svc.id, |c| c.translations += 1);
            Verdict {
                action: Action::Translate,
                chosen: c,
            }
        }
        None => {
            // The sync engine keeps every slot below a count a reader may hold until no
            // reader can hold it any more: a miss here is a bug, and counted as one.
            count(svc.id, |c| c.missed += 1);
            Verdict::REFUSE
        }
    }
}

/// A previous choice, if its slot still holds the same backend.
#[inline(always)]
fn still_valid(prev: Option<RevNatEntry>, svc: &ServiceValue) -> Option<Chosen> {
    let prev = prev?;
    if prev.id != svc.id || prev.slot >= svc.count {
        return None;
    }
    let b = select::backend(svc.id, prev.slot)?;
    (b.addr == prev.backend && b.port == prev.backend_port).then_some(Chosen {
        backend: b,
        id: svc.id,
        slot: prev.slot,
    })
}

/// The socket's reverse translations, if it has any.
#[inline(always)]
fn storage(ctx: &SockAddrContext) -> Option<&mut SockRevNat> {
    // SAFETY: the context's socket is valid for the whole program; without the create flag
    // the helper only looks up.
    let p = unsafe { SKIFF_SOCK_REVNAT.get_ptr_mut(ctx) };
    // SAFETY: non-null pointers from the helper point to this socket's storage.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// The entry this socket keeps for a service address.
#[inline(always)]
fn previous(ctx: &SockAddrContext, service: Addr, port: u16) -> Option<RevNatEntry> {
    let st = storage(ctx)?;
    for e in st.entries.iter() {
        if e.backend_port != 0 && e.service == service && e.service_port == port {
            return Some(*e);
        }
    }
    None
}

/// Remembers, in the socket's own storage, which service address a backend stands for.
#[inline(always)]
fn remember(ctx: &SockAddrContext, c: &Chosen, service: Addr, port: u16) {
    // SAFETY: as in `storage`; with the create flag a zeroed value is attached on first use.
    let p = unsafe { SKIFF_SOCK_REVNAT.get_or_insert_ptr_mut(ctx, None) };
    if p.is_null() {
        return;
    }
    // SAFETY: non-null pointers from the helper point to this socket's storage.
    let st = unsafe { &mut *p };
    // The entry for this service (a reconnect, or a send that moved), else the oldest.
    let mut at = st.next as usize % REVNAT_PER_SOCKET;
    let mut found = false;
    for (i, e) in st.entries.iter().enumerate() {
        if e.backend_port != 0 && e.service == service && e.service_port == port {
            at = i;
            found = true;
            break;
        }
    }
    if !found {
        st.next = st.next.wrapping_add(1);
    }
    if let Some(e) = st.entries.get_mut(at) {
        *e = RevNatEntry {
            backend: c.backend.addr,
            service,
            backend_port: c.backend.port,
            service_port: port,
            id: c.id,
            slot: c.slot,
            _pad: 0,
        };
    }
}

/// The service address for a (socket, backend) pair, if this socket was translated.
#[inline(always)]
fn recall(ctx: &SockAddrContext, addr: Addr, port: u16) -> Option<(Addr, u16)> {
    let st = storage(ctx)?;
    for e in st.entries.iter() {
        if e.backend_port != 0 && e.backend_port == port && e.backend == addr {
            return Some((e.service, e.service_port));
        }
    }
    None
}

#[inline(always)]
fn refuse() -> i32 {
    // SAFETY: helper valid for cgroup programs; makes the syscall fail with this errno
    // instead of the EPERM a plain reject gives.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    REJECT
}

#[inline(always)]
pub fn forward4(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let s = sa(ctx);
    let raw = s.user_ip4;
    let vip = Addr::from_v4_raw(raw);
    let port = s.user_port as u16;
    let v = pick(ctx, hook, vip, port, s.protocol as u8);
    match v.action {
        Action::NotService => ALLOW,
        Action::Refuse => {
            debug!(ctx, "refused {:i}:{} (no backend)", u32::from_be(raw), u16::from_be(port));
            refuse()
        }
        Action::Translate => match v.chosen.backend.addr.v4_raw() {
            Some(ip) => {
                s.user_ip4 = ip;
                s.user_port = v.chosen.backend.port as u32;
                remember(ctx, &v.chosen, vip, port);
                debug!(
                    ctx,
                    "{:i}:{} -> {:i}:{}",
                    u32::from_be(raw),
                    u16::from_be(port),
                    u32::from_be(ip),
                    u16::from_be(v.chosen.backend.port)
                );
                ALLOW
            }
            // An IPv4 socket cannot reach an IPv6 backend.
            None => refuse(),
        },
    }
}

#[inline(always)]
fn addr6(s: &bpf_sock_addr) -> Addr {
    Addr {
        words: [s.user_ip6[0], s.user_ip6[1], s.user_ip6[2], s.user_ip6[3]],
    }
}

#[inline(always)]
fn set_addr6(s: &mut bpf_sock_addr, a: &Addr) {
    s.user_ip6[0] = a.words[0];
    s.user_ip6[1] = a.words[1];
    s.user_ip6[2] = a.words[2];
    s.user_ip6[3] = a.words[3];
}

#[inline(always)]
pub fn forward6(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let s = sa(ctx);
    let vip = addr6(s);
    let port = s.user_port as u16;
    let v = pick(ctx, hook, vip, port, s.protocol as u8);
    match v.action {
        Action::NotService => ALLOW,
        Action::Refuse => refuse(),
        Action::Translate => {
            // IPv4 backends stay IPv4-mapped, which an IPv6 socket understands.
            set_addr6(s, &v.chosen.backend.addr);
            s.user_port = v.chosen.backend.port as u32;
            remember(ctx, &v.chosen, vip, port);
            ALLOW
        }
    }
}

#[inline(always)]
pub fn reverse4(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    if let Some((addr, port)) = recall(ctx, Addr::from_v4_raw(s.user_ip4), s.user_port as u16) {
        if let Some(ip) = addr.v4_raw() {
            s.user_ip4 = ip;
            s.user_port = port as u32;
        }
    }
    ALLOW
}

#[inline(always)]
pub fn reverse6(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    if let Some((addr, port)) = recall(ctx, addr6(s), s.user_port as u16) {
        set_addr6(s, &addr);
        s.user_port = port as u32;
    }
    ALLOW
}

