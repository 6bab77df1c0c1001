//! Choosing a backend for a frontend, shared by the socket hooks and the north-south
//! programs: random, sticky per client (sessionAffinity ClientIP) or Maglev; every choice
//! and every refusal counted per frontend.

use crate::maps::{
    SKIFF_AFFINITY, SKIFF_BACKENDS, SKIFF_COUNTERS, SKIFF_DROPS, SKIFF_MAGLEV,
    SKIFF_MAGLEV_M, SKIFF_SOURCE_RANGES,
};
use crate::nodeport::Flow;
use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use aya_ebpf::maps::lpm_trie::Key;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, BackendKey, MaglevKey, ServiceCounters, ServiceValue,
    SourceRangeKey, MAGLEV_CHUNK, SVC_FLAG_AFFINITY_CLIENT_IP, SVC_FLAG_MAGLEV,
    SVC_FLAG_SOURCE_RANGES,
};

/// A backend and where it was found.
#[derive(Clone, Copy)]
pub struct Chosen {
    pub backend: Backend,
    pub id: u32,
    pub slot: u32,
}

impl Chosen {
    /// No backend: all zero, so that no path reads a value never written.
    pub const NONE: Chosen = Chosen {
        backend: Backend {
            addr: proxy_common::Addr { words: [0; 4] },
            port: 0,
            flags: 0,
            _pad: 0,
        },
        id: 0,
        slot: 0,
    };
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Chosen,
    /// No usable backend.
    Refused,
    /// The client's address is outside loadBalancerSourceRanges.
    Denied,
}

/// The outcome with its backend ([`Chosen::NONE`] unless chosen): a plain struct, not an
/// enum with a payload, for the verifier (see `nodeport::Rewrite`).
#[derive(Clone, Copy)]
pub struct Pick {
    pub outcome: Outcome,
    pub chosen: Chosen,
}

impl Pick {
    const REFUSED: Pick = Pick {
        outcome: Outcome::Refused,
        chosen: Chosen::NONE,
    };
}

/// Who a client is for sessionAffinity: a socket's network namespace (a pod, or the node)
/// or, for traffic from outside, its source address.
#[derive(Clone, Copy)]
pub enum Client {
    Netns(u64),
    Ip(u32),
}

/// Drops that belong to no frontend, counted per reason.
#[derive(Clone, Copy)]
pub enum Drop {
    /// The connection-tracking map refused an entry.
    CtFull = 0,
    /// No free SNAT port towards a backend after a few tries.
    SnatPorts = 1,
    /// A packet came in on an interface the proxy has no address for.
    NoDevice = 2,
    /// No route (or neighbour) to the backend or the client.
    NoRoute = 3,
}

#[inline(always)]
pub fn drop_reason(d: Drop) {
    if let Some(c) = SKIFF_DROPS.get_ptr_mut(d as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub fn count(id: u32, f: impl FnOnce(&mut ServiceCounters)) {
    if let Some(c) = SKIFF_COUNTERS.get_ptr_mut(id) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        f(unsafe { &mut *c })
    }
}

#[inline(always)]
pub fn backend(service: u32, slot: u32) -> Option<Backend> {
    // SAFETY: copied out at once.
    unsafe { SKIFF_BACKENDS.get(&BackendKey { service, slot }) }.copied()
}

#[inline(always)]
fn random(svc: &ServiceValue) -> Option<Chosen> {
    // Checked here too (callers check first): a division the compiler cannot prove safe
    // leaves a panic path the verifier rejects.
    if svc.count == 0 {
        return None;
    }
    // SAFETY: helper without arguments.
    let slot = unsafe { bpf_get_prandom_u32() } % svc.count;
    at(svc, slot)
}

#[inline(always)]
fn at(svc: &ServiceValue, slot: u32) -> Option<Chosen> {
    if slot >= svc.count {
        return None;
    }
    backend(svc.id, slot).map(|backend| Chosen {
        backend,
        id: svc.id,
        slot,
    })
}

/// The Maglev table entry of the flow's hash. Every node holds the same table for the
/// same backends, so the flow maps to the same backend wherever it lands.
#[inline(always)]
fn maglev(svc: &ServiceValue, hash: u32) -> Option<Chosen> {
    let m = SKIFF_MAGLEV_M.load();
    if m == 0 {
        return None;
    }
    let idx = hash % m;
    let key = MaglevKey {
        id: svc.id,
        chunk: idx / MAGLEV_CHUNK as u32,
    };
    // SAFETY: copied out at once.
    let chunk = unsafe { SKIFF_MAGLEV.get(&key) }?;
    let slot = *chunk.slots.get((idx % MAGLEV_CHUNK as u32) as usize)? as u32;
    // No check against the count this reader copied: the table may be newer than it and
    // name a slot just added. Every slot a table names exists (slots are written before
    // the table and deleted only after a grace period), holding an old or a new backend.
    backend(svc.id, slot).map(|backend| Chosen {
        backend,
        id: svc.id,
        slot,
    })
}

/// A stable hash of the flow's 5-tuple (the same on every node: no per-boot seed).
#[inline(always)]
pub fn flow_hash(f: &Flow) -> u32 {
    let mut h: u32 = 0x9e37_79b9;
    for w in [
        f.saddr,
        f.daddr,
        (f.sport as u32) << 16 | f.dport as u32,
        f.proto as u32,
    ] {
        h ^= w.wrapping_mul(0xcc9e_2d51).rotate_left(15).wrapping_mul(0x1b87_3593);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// sessionAffinity ClientIP: the backend this client got last, while fresh and while its
/// slot still holds it; else `fresh()`, remembered.
#[inline(always)]
pub fn affinity(
    client: Client,
    svc: &ServiceValue,
    fresh: impl FnOnce() -> Option<Chosen>,
) -> Option<Chosen> {
    let key = AffinityKey {
        client: match client {
            Client::Netns(c) => c,
            Client::Ip(ip) => ip as u64,
        },
        service: svc.id,
        _pad: 0,
    };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let timeout_ns = svc.affinity_timeout_s as u64 * 1_000_000_000;
    // SAFETY: copied out at once.
    if let Some(prev) = unsafe { SKIFF_AFFINITY.get(&key) }.copied() {
        if now.wrapping_sub(prev.last_used_ns) <= timeout_ns {
            if let Some(c) = at(svc, prev.slot).filter(|c| c.backend == prev.backend) {
                let _ = SKIFF_AFFINITY.insert(
                    &key,
                    &AffinityValue {
                        last_used_ns: now,
                        ..prev
                    },
                    0,
                );
                return Some(c);
            }
        }
    }
    let c = fresh()?;
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

/// The choice for a socket (connect/sendmsg): affinity per network namespace, else random.
#[inline(always)]
pub fn socket(svc: &ServiceValue, netns: impl FnOnce() -> u64) -> Option<Chosen> {
    if svc.flags & SVC_FLAG_AFFINITY_CLIENT_IP != 0 {
        affinity(Client::Netns(netns()), svc, || random(svc))
    } else {
        random(svc)
    }
}

#[inline(always)]
fn pick_external(svc: &ServiceValue, f: &Flow) -> Option<Chosen> {
    if svc.flags & SVC_FLAG_MAGLEV != 0 {
        maglev(svc, flow_hash(f))
    } else {
        random(svc)
    }
}

#[inline(always)]
fn source_allowed(id: u32, saddr: u32) -> bool {
    let key = Key::new(
        64,
        SourceRangeKey { id: id.to_be(), addr: saddr },
    );
    SKIFF_SOURCE_RANGES.get(&key).is_some()
}

/// The choice for a packet from outside: source ranges first, then affinity per client
/// address, Maglev or random; counted.
#[inline(always)]
pub fn external(svc: &ServiceValue, f: &Flow) -> Pick {
    if svc.flags & SVC_FLAG_SOURCE_RANGES != 0 && !source_allowed(svc.id, f.saddr) {
        count(svc.id, |c| c.denied += 1);
        return Pick {
            outcome: Outcome::Denied,
            chosen: Chosen::NONE,
        };
    }
    if svc.count == 0 {
        count(svc.id, |c| c.refused += 1);
        return Pick::REFUSED;
    }
    let chosen = if svc.flags & SVC_FLAG_AFFINITY_CLIENT_IP != 0 {
        affinity(Client::Ip(f.saddr), svc, || pick_external(svc, f))
    } else {
        pick_external(svc, f)
    };
    match chosen {
        Some(c) => {
            count(svc.id, |c| c.translations += 1);
            Pick {
                outcome: Outcome::Chosen,
                chosen: c,
            }
        }
        None => {
            count(svc.id, |c| c.missed += 1);
            Pick::REFUSED
        }
    }
}
