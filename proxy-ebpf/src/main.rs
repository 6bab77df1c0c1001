//! skiff's socket-level service load balancer: cgroup v2 sock_addr programs that rewrite
//! a service address to a backend address when a socket connects or sends, and back again
//! when it receives or asks for its peer. No packet is rewritten: the translation happens
//! once per connect() (or per unconnected UDP send), one hash lookup in the services map.
//!
//! Maps (layouts in proxy-common): services (frontend -> id, ready count, flags), backends
//! ((id, slot) -> address), reverse translation (LRU, per socket), ClientIP affinity (LRU,
//! per client network namespace), per-CPU counters per frontend id.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
        bpf_set_retval,
    },
    macros::{cgroup_sock_addr, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::SockAddrContext,
    EbpfContext,
};
use proxy_common::{
    Addr, AffinityKey, AffinityValue, Backend, BackendKey, RevNatKey, RevNatValue, ServiceCounters,
    ServiceKey, ServiceValue, PROTO_TCP, PROTO_UDP, SCOPE_CLUSTER, SVC_FLAG_AFFINITY_CLIENT_IP,
};

// Sizes here are placeholders: the loader sets every max_entries from its flags.
#[map]
static SKIFF_SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(1, 0);
#[map]
static SKIFF_BACKENDS: HashMap<BackendKey, Backend> = HashMap::pinned(1, 0);
#[map]
static SKIFF_REVNAT: LruHashMap<RevNatKey, RevNatValue> = LruHashMap::pinned(1, 0);
#[map]
static SKIFF_AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(1, 0);
#[map]
static SKIFF_COUNTERS: PerCpuArray<ServiceCounters> = PerCpuArray::pinned(1, 0);

/// Program return codes for cgroup sock_addr hooks.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// What the forward translation decided.
enum Verdict {
    /// Not a service address: leave the socket alone.
    NotService,
    /// A service with no usable backend: fail the call with ECONNREFUSED.
    Refuse,
    /// Go to this backend instead.
    To(Backend),
}

#[inline(always)]
fn sa(ctx: &SockAddrContext) -> &mut bpf_sock_addr {
    // SAFETY: the kernel hands every sock_addr program a valid context.
    unsafe { &mut *ctx.sock_addr }
}

/// The forward translation: service lookup, backend choice, affinity, counters.
#[inline(always)]
fn pick(ctx: &SockAddrContext, addr: Addr, port: u16, proto: u8) -> Verdict {
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Verdict::NotService;
    }
    let key = ServiceKey {
        addr,
        port,
        proto,
        scope: SCOPE_CLUSTER,
    };
    // SAFETY: copied out at once; the map is only written by user space.
    let svc: ServiceValue = match unsafe { SKIFF_SERVICES.get(&key) } {
        Some(v) => *v,
        None => return Verdict::NotService,
    };
    let counters = SKIFF_COUNTERS.get_ptr_mut(svc.id);
    if svc.count == 0 {
        if let Some(c) = counters {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU.
            unsafe { (*c).refused += 1 };
        }
        return Verdict::Refuse;
    }
    let chosen = if svc.flags & SVC_FLAG_AFFINITY_CLIENT_IP != 0 {
        pick_with_affinity(ctx, &svc)
    } else {
        pick_random(&svc).map(|(_, b)| b)
    };
    match chosen {
        Some(b) => {
            if let Some(c) = counters {
                // SAFETY: as above.
                unsafe { (*c).translations += 1 };
            }
            Verdict::To(b)
        }
        None => Verdict::Refuse,
    }
}

#[inline(always)]
fn pick_random(svc: &ServiceValue) -> Option<(u32, Backend)> {
    // count != 0 was checked by the caller.
    // SAFETY: helper without arguments.
    let slot = unsafe { bpf_get_prandom_u32() } % svc.count;
    backend(svc.id, slot).map(|b| (slot, b))
}

#[inline(always)]
fn backend(service: u32, slot: u32) -> Option<Backend> {
    // SAFETY: copied out at once.
    unsafe { SKIFF_BACKENDS.get(&BackendKey { service, slot }) }.copied()
}

/// sessionAffinity ClientIP: a client is its network namespace (a pod, or the host).
#[inline(always)]
fn pick_with_affinity(ctx: &SockAddrContext, svc: &ServiceValue) -> Option<Backend> {
    // SAFETY: helper valid for sock_addr programs; the context pointer is the kernel's.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let key = AffinityKey {
        netns_cookie,
        service: svc.id,
        _pad: 0,
    };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let timeout_ns = svc.affinity_timeout_s as u64 * 1_000_000_000;
    // SAFETY: copied out at once.
    if let Some(prev) = unsafe { SKIFF_AFFINITY.get(&key) }.copied() {
        // Reuse only while fresh and while the slot still holds that backend (the backend
        // set may have changed since).
        if now.wrapping_sub(prev.last_used_ns) <= timeout_ns && prev.slot < svc.count {
            if let Some(b) = backend(svc.id, prev.slot) {
                if b == prev.backend {
                    let _ = SKIFF_AFFINITY.insert(
                        &key,
                        &AffinityValue {
                            last_used_ns: now,
                            ..prev
                        },
                        0,
                    );
                    return Some(b);
                }
            }
        }
    }
    let (slot, b) = pick_random(svc)?;
    let _ = SKIFF_AFFINITY.insert(
        &key,
        &AffinityValue {
            last_used_ns: now,
            backend: b,
            slot,
        },
        0,
    );
    Some(b)
}

/// Remembers, per socket, which service address a backend stands for.
#[inline(always)]
fn remember(ctx: &SockAddrContext, b: &Backend, service: Addr, port: u16) {
    // SAFETY: helper valid for sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = RevNatKey {
        cookie,
        addr: b.addr,
        port: b.port,
        _pad: [0; 6],
    };
    let value = RevNatValue {
        addr: service,
        port,
        _pad: 0,
    };
    let _ = SKIFF_REVNAT.insert(&key, &value, 0);
}

/// The service address for a (socket, backend) pair, if this socket was translated.
#[inline(always)]
fn recall(ctx: &SockAddrContext, addr: Addr, port: u16) -> Option<RevNatValue> {
    // SAFETY: helper valid for sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = RevNatKey {
        cookie,
        addr,
        port,
        _pad: [0; 6],
    };
    // SAFETY: copied out at once.
    unsafe { SKIFF_REVNAT.get(&key) }.copied()
}

#[inline(always)]
fn refuse() -> i32 {
    // SAFETY: helper valid for cgroup programs; makes the syscall fail with this errno
    // instead of the EPERM a plain reject gives.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    REJECT
}

#[inline(always)]
fn forward4(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    let vip = Addr::from_v4_raw(s.user_ip4);
    let port = s.user_port as u16;
    match pick(ctx, vip, port, s.protocol as u8) {
        Verdict::NotService => ALLOW,
        Verdict::Refuse => refuse(),
        Verdict::To(b) => match b.addr.v4_raw() {
            Some(ip) => {
                s.user_ip4 = ip;
                s.user_port = b.port as u32;
                remember(ctx, &b, vip, port);
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
fn forward6(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    let vip = addr6(s);
    let port = s.user_port as u16;
    match pick(ctx, vip, port, s.protocol as u8) {
        Verdict::NotService => ALLOW,
        Verdict::Refuse => refuse(),
        Verdict::To(b) => {
            // IPv4 backends stay IPv4-mapped, which an IPv6 socket understands.
            set_addr6(s, &b.addr);
            s.user_port = b.port as u32;
            remember(ctx, &b, vip, port);
            ALLOW
        }
    }
}

#[inline(always)]
fn reverse4(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    if let Some(v) = recall(ctx, Addr::from_v4_raw(s.user_ip4), s.user_port as u16) {
        if let Some(ip) = v.addr.v4_raw() {
            s.user_ip4 = ip;
            s.user_port = v.port as u32;
        }
    }
    ALLOW
}

#[inline(always)]
fn reverse6(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    if let Some(v) = recall(ctx, addr6(s), s.user_port as u16) {
        set_addr6(s, &v.addr);
        s.user_port = v.port as u32;
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn skiff_connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn skiff_connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn skiff_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn skiff_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn skiff_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn skiff_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
#[link_section = "license"]
pub static LICENSE: [u8; 4] = *b"GPL\0";
