//! Every map the programs share, with its layout from proxy-common. Sizes here are
//! placeholders: the loader sets every max_entries from its flags.

use aya_ebpf::{
    btf_maps::SkStorage,
    macros::{btf_map, map},
    maps::{HashMap, LpmTrie, LruHashMap, PerCpuArray},
    Global,
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, BackendKey, CtKey, CtValue, Device, MaglevChunk,
    MaglevKey, ServiceCounters, ServiceKey, ServiceValue, SourceRangeKey,
};

/// Frontends: (address, port, protocol, scope) -> id, backend count, flags.
#[map]
pub static SKIFF_SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(1, 0);
/// Backends by (frontend id, slot).
#[map]
pub static SKIFF_BACKENDS: HashMap<BackendKey, Backend> = HashMap::pinned(1, 0);
/// Reverse translations, per socket (pinned by path: live sockets keep them across a
/// restart of the proxy).
#[btf_map]
pub static SKIFF_SOCK_REVNAT: SkStorage<proxy_common::SockRevNat> = SkStorage::new();
/// sessionAffinity ClientIP: (client, frontend) -> backend, last use.
#[map]
pub static SKIFF_AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(1, 0);
/// Per-CPU counters per frontend id.
#[map]
pub static SKIFF_COUNTERS: PerCpuArray<ServiceCounters> = PerCpuArray::pinned(1, 0);
/// Drops outside any frontend, per reason (`select::Drop`).
#[map]
pub static SKIFF_DROPS: PerCpuArray<u64> = PerCpuArray::pinned(8, 0);
/// This node's addresses (IPv4 as in the packet): a NodePort answers on each.
#[map]
pub static SKIFF_NODE_ADDRS: HashMap<u32, u32> = HashMap::pinned(1, 0);
/// Interfaces with north-south programs, by ifindex: the address SNAT uses there.
#[map]
pub static SKIFF_DEVICES: HashMap<u32, Device> = HashMap::pinned(1, 0);
/// North-south connection tracking: forward and reverse entries per flow.
#[map]
pub static SKIFF_CT: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(1, 0);
/// loadBalancerSourceRanges: (frontend id, source prefix).
#[map]
pub static SKIFF_SOURCE_RANGES: LpmTrie<SourceRangeKey, u8> =
    LpmTrie::pinned(1, aya_ebpf::bindings::BPF_F_NO_PREALLOC);
/// Maglev lookup tables, in chunks of `MAGLEV_CHUNK` slots, allocated as used.
#[map]
pub static SKIFF_MAGLEV: HashMap<MaglevKey, MaglevChunk> =
    HashMap::pinned(1, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// The Maglev table size M, set by the loader (`--maglev-table-size`).
#[no_mangle]
pub static SKIFF_MAGLEV_M: Global<u32> = Global::new(0);
