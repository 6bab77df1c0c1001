//! skiff's socket-level service load balancer: cgroup v2 sock_addr programs that rewrite
//! a service address to a backend address when a socket connects or sends, and back again
//! when it receives or asks for its peer. No packet is rewritten: the translation happens
//! once per connect() (or per unconnected UDP send), one hash lookup in the services map.
//!
//! Maps (layouts in proxy-common): services (frontend -> id, ready count, flags), backends
//! ((id, slot) -> address), reverse translation (socket-local storage: it lives and dies
//! with its socket), ClientIP affinity (LRU, per client network namespace), per-CPU
//! counters per frontend id.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::bpf_sock_addr,
    btf_maps::SkStorage,
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_set_retval},
    macros::{btf_map, cgroup_sock_addr, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::SockAddrContext,
    EbpfContext,
};
use proxy_common::{
    Addr, AffinityKey, AffinityValue, Backend, BackendKey, RevNatEntry, ServiceCounters,
    ServiceKey, ServiceValue, SockRevNat, PROTO_TCP, PROTO_UDP, REVNAT_PER_SOCKET, SCOPE_CLUSTER,
    SVC_FLAG_AFFINITY_CLIENT_IP,
};

// Sizes here are placeholders: the loader sets every max_entries from its flags.
#[map]
static SKIFF_SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(1, 0);
#[map]
static SKIFF_BACKENDS: HashMap<BackendKey, Backend> = HashMap::pinned(1, 0);
/// Reverse translations, per socket (the loader pins it, so a restarted proxy keeps them).
#[btf_map]
static SKIFF_SOCK_REVNAT: SkStorage<SockRevNat> = SkStorage::new();
#[map]
static SKIFF_AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(1, 0);
#[map]
static SKIFF_COUNTERS: PerCpuArray<ServiceCounters> = PerCpuArray::pinned(1, 0);

/// Program return codes for cgroup sock_addr hooks.
const ALLOW: i32 = 1;
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

/// The decision with its backend. A plain struct whose backend is zeroed when there is
/// none, rather than an enum carrying it: LLVM merges enum payloads across branches and
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

/// A backend and where it was found.
#[derive(Clone, Copy)]
struct Chosen {
    backend: Backend,
    id: u32,
    slot: u32,
}

impl Chosen {
    const NONE: Chosen = Chosen {
        backend: Backend {
            addr: Addr { words: [0; 4] },
            port: 0,
            flags: 0,
            _pad: 0,
        },
        id: 0,
        slot: 0,
    };
}

/// Which hook translates: an unconnected UDP send sticks to the backend it used before.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Connect,
    Send,
}

#[inline(always)]
fn sa(ctx: &SockAddrContext) -> &mut bpf_sock_addr {
    // SAFETY: the kernel hands every sock_addr program a valid context.
    unsafe { &mut *ctx.sock_addr }
}

#[inline(always)]
fn count(id: u32, f: impl FnOnce(&mut ServiceCounters)) {
    if let Some(c) = SKIFF_COUNTERS.get_ptr_mut(id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        f(unsafe { &mut *c })
    }
}

/// The forward translation: service lookup, backend choice, affinity, counters.
#[inline(always)]
fn pick(ctx: &SockAddrContext, hook: Hook, addr: Addr, port: u16, proto: u8) -> Verdict {
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Verdict::NOT_SERVICE;
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
        None => return Verdict::NOT_SERVICE,
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
        None if svc.flags & SVC_FLAG_AFFINITY_CLIENT_IP != 0 => pick_with_affinity(ctx, &svc),
        None => pick_random(&svc),
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

#[inline(always)]
fn pick_random(svc: &ServiceValue) -> Option<Chosen> {
    // count != 0 was checked by the caller.
    // SAFETY: helper without arguments.
    let slot = unsafe { bpf_get_prandom_u32() } % svc.count;
    backend(svc.id, slot).map(|backend| Chosen {
        backend,
        id: svc.id,
        slot,
    })
}

#[inline(always)]
fn backend(service: u32, slot: u32) -> Option<Backend> {
    // SAFETY: copied out at once.
    unsafe { SKIFF_BACKENDS.get(&BackendKey { service, slot }) }.copied()
}

/// A previous choice, if its slot still holds the same backend.
#[inline(always)]
fn still_valid(prev: Option<RevNatEntry>, svc: &ServiceValue) -> Option<Chosen> {
    let prev = prev?;
    if prev.id != svc.id || prev.slot >= svc.count {
        return None;
    }
    let b = backend(svc.id, prev.slot)?;
    (b.addr == prev.backend && b.port == prev.backend_port).then_some(Chosen {
        backend: b,
        id: svc.id,
        slot: prev.slot,
    })
}

/// sessionAffinity ClientIP: a client is its network namespace (a pod, or the host).
#[inline(always)]
fn pick_with_affinity(ctx: &SockAddrContext, svc: &ServiceValue) -> Option<Chosen> {
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
                    return Some(Chosen {
                        backend: b,
                        id: svc.id,
                        slot: prev.slot,
                    });
                }
            }
        }
    }
    let c = pick_random(svc)?;
    let _ = SKIFF_AFFINITY.insert(
        &key,
        &AffinityValue {
            last_used_ns: now,
            backend: c.backend,
            slot: c.slot,
        },
        0,
    );
    Some(c)
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
fn forward4(ctx: &SockAddrContext, hook: Hook) -> i32 {
    let s = sa(ctx);
    let vip = Addr::from_v4_raw(s.user_ip4);
    let port = s.user_port as u16;
    let v = pick(ctx, hook, vip, port, s.protocol as u8);
    match v.action {
        Action::NotService => ALLOW,
        Action::Refuse => refuse(),
        Action::Translate => match v.chosen.backend.addr.v4_raw() {
            Some(ip) => {
                s.user_ip4 = ip;
                s.user_port = v.chosen.backend.port as u32;
                remember(ctx, &v.chosen, vip, port);
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
fn forward6(ctx: &SockAddrContext, hook: Hook) -> i32 {
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
fn reverse4(ctx: &SockAddrContext) -> i32 {
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
fn reverse6(ctx: &SockAddrContext) -> i32 {
    let s = sa(ctx);
    if let Some((addr, port)) = recall(ctx, addr6(s), s.user_port as u16) {
        set_addr6(s, &addr);
        s.user_port = port as u32;
    }
    ALLOW
}

#[cgroup_sock_addr(connect4)]
pub fn skiff_connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(connect6)]
pub fn skiff_connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, Hook::Connect)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, Hook::Send)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn skiff_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, Hook::Send)
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
