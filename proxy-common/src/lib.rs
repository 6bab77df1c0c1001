//! Map keys and values shared by the kernel programs (proxy-ebpf) and the loader (proxy).
//!
//! Every type is `#[repr(C)]` with explicit padding fields, so a value built in user space
//! is byte-identical to what the kernel reads and no byte is left uninitialised (the
//! verifier rejects reads of uninitialised stack, and hash keys compare every byte).
//! Ports are kept in network byte order, as `bpf_sock_addr` holds them.
#![no_std]

/// IP protocol numbers used in [`ServiceKey::proto`].
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// Map names, as pinned under the proxy's bpffs directory.
pub const MAP_SERVICES: &str = "SKIFF_SERVICES";
pub const MAP_BACKENDS: &str = "SKIFF_BACKENDS";
pub const MAP_SOCK_REVNAT: &str = "SKIFF_SOCK_REVNAT";
pub const MAP_DROPS: &str = "SKIFF_DROPS";
pub const MAP_NODE_ADDRS: &str = "SKIFF_NODE_ADDRS";
pub const MAP_DEVICES: &str = "SKIFF_DEVICES";
pub const MAP_CT: &str = "SKIFF_CT";
pub const MAP_SOURCE_RANGES: &str = "SKIFF_SOURCE_RANGES";
pub const MAP_MAGLEV: &str = "SKIFF_MAGLEV";
/// Globals the loader sets.
pub const GLOBAL_MAGLEV_M: &str = "SKIFF_MAGLEV_M";
/// aya-log-ebpf's level filter: 0 (the default the loader sets) turns every log statement
/// into dead code the verifier removes at load; `proxy run --bpf-log` sets debug.
pub const GLOBAL_LOG_LEVEL: &str = "AYA_LOG_LEVEL";
pub const MAP_AFFINITY: &str = "SKIFF_AFFINITY";
pub const MAP_COUNTERS: &str = "SKIFF_COUNTERS";

/// An IP address as four 32-bit words in network byte order (the layout of
/// `bpf_sock_addr.user_ip6`). IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`), so one map
/// serves both families and an IPv6 socket connecting to a mapped IPv4 service matches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub words: [u32; 4],
}

impl Addr {
    /// The mapped form of an IPv4 address given as it sits in `bpf_sock_addr.user_ip4`
    /// (network byte order in a native u32).
    #[inline(always)]
    pub const fn from_v4_raw(ip: u32) -> Self {
        Addr {
            words: [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), ip],
        }
    }

    /// The IPv4 address (as `user_ip4` holds it) if this is an IPv4-mapped address.
    #[inline(always)]
    pub const fn v4_raw(&self) -> Option<u32> {
        if self.words[0] == 0
            && self.words[1] == 0
            && self.words[2] == u32::from_ne_bytes([0, 0, 0xff, 0xff])
        {
            Some(self.words[3])
        } else {
            None
        }
    }
}

/// Which traffic a service entry translates.
/// Socket level (cgroup hooks): a cluster IP, external IP or LoadBalancer address.
pub const SCOPE_CLUSTER: u8 = 0;
/// Socket level: a NodePort, reached at any of this node's addresses (key address zero).
pub const SCOPE_NODEPORT: u8 = 1;
/// Packet level (tc/XDP at a node interface): an external IP or LoadBalancer address, or
/// a NodePort (key address zero), with the external endpoints (externalTrafficPolicy).
pub const SCOPE_EXTERNAL: u8 = 2;

/// Key of the services map: a frontend (service address, port, protocol).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub scope: u8,
}

/// `ServiceValue::flags`: sessionAffinity ClientIP (per client network namespace at the
/// socket level, per client address north-south).
pub const SVC_FLAG_AFFINITY_CLIENT_IP: u32 = 1 << 0;
/// Pick by Maglev consistent hashing of the flow (north-south).
pub const SVC_FLAG_MAGLEV: u32 = 1 << 1;
/// Check loadBalancerSourceRanges (`SKIFF_SOURCE_RANGES`) first.
pub const SVC_FLAG_SOURCE_RANGES: u32 = 1 << 2;
/// externalTrafficPolicy Cluster: a backend on another node is reached with the source
/// translated to this node.
pub const SVC_FLAG_SNAT_REMOTE: u32 = 1 << 3;

/// `Backend::flags`: the backend runs on this node.
pub const BACKEND_FLAG_LOCAL: u8 = 1 << 0;

/// Value of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceValue {
    /// Frontend id: index into the counters and first half of every backend key.
    pub id: u32,
    /// Number of ready backends, in slots `0..count` of the backends map. Zero: the
    /// service exists but has no ready endpoint, and connects are refused.
    pub count: u32,
    pub flags: u32,
    /// sessionAffinity ClientIP timeout in seconds (used with the affinity flag).
    pub affinity_timeout_s: u32,
}

/// Key of the backends map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKey {
    pub service: u32,
    pub slot: u32,
}

/// Value of the backends map: where a translated connection goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    pub addr: Addr,
    /// Network byte order.
    pub port: u16,
    /// `BACKEND_FLAG_*`.
    pub flags: u8,
    pub _pad: u8,
}

/// How many (backend -> service) pairs one socket remembers. A connected socket needs one;
/// an unconnected UDP socket one per service it sends to (it sticks to its backend per
/// service, as a conntrack entry pins an iptables-NATed flow).
pub const REVNAT_PER_SOCKET: usize = 4;

/// One reverse translation of a socket: replies from `backend` show `service`. Written at
/// connect()/sendmsg(), read by recvmsg() and getpeername(), and by the UDP socket
/// iterator that destroys sockets connected to a removed backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatEntry {
    pub backend: Addr,
    pub service: Addr,
    /// Network byte order; 0 marks an unused entry.
    pub backend_port: u16,
    /// Network byte order.
    pub service_port: u16,
    /// The frontend and slot the backend was taken from: an unconnected UDP socket sends to
    /// the same backend again while that slot still holds it.
    pub id: u32,
    pub slot: u32,
    pub _pad: u32,
}

/// Socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`): the kernel frees it with the socket,
/// so a translation lives exactly as long as the socket it belongs to, however many other
/// sockets come and go.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevNat {
    pub entries: [RevNatEntry; REVNAT_PER_SOCKET],
    /// The entry the next new pair replaces (round robin).
    pub next: u32,
    pub _pad: u32,
}

/// Byte offsets inside [`SockRevNat`] that the hand-assembled UDP socket iterator reads
/// (proxy/src/udp_destroy.rs); checked against the layout by a test.
pub const REVNAT_ENTRY_SIZE: usize = 48;
pub const REVNAT_BACKEND_V4_OFFSET: usize = 12;
pub const REVNAT_BACKEND_PORT_OFFSET: usize = 32;

/// Key of the UDP destroy set: a backend (IPv4, as in `user_ip4`; port in network byte
/// order) whose connected UDP sockets the socket iterator destroys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UdpDestroyKey {
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
}

/// Key of the sessionAffinity LRU: a client and a frontend. At the socket level the client
/// is its network namespace's cookie (a pod, or the node); north-south, its IPv4 address.
/// Frontend ids differ between the two, so the two kinds never meet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub client: u64,
    pub service: u32,
    pub _pad: u32,
}

/// Value of the sessionAffinity LRU: the backend chosen and when it was last used.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    pub last_used_ns: u64,
    pub backend: Backend,
    /// The slot the backend had; checked against the backends map before reuse.
    pub slot: u32,
}

/// Per-CPU counters per frontend id: every translation and every refusal, by reason.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceCounters {
    /// Connects and sends translated to a backend.
    pub translations: u64,
    /// Connects and sends refused because the service had no usable backend.
    pub refused: u64,
    /// Backend slots found empty (the sync engine's ordering makes this impossible; a
    /// non-zero count is a bug).
    pub missed: u64,
    /// Packets and connects denied by loadBalancerSourceRanges.
    pub denied: u64,
}

/// Connection-tracking key: a flow as a packet shows it, and which direction the entry is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub saddr: u32,
    pub daddr: u32,
    /// Network byte order.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: u16,
}

/// `CtKey::dir`: client -> frontend, as it arrives.
pub const CT_DIR_FWD: u8 = 0;
/// `CtKey::dir`: backend -> client (or -> this node's SNAT address), as the reply travels.
pub const CT_DIR_REV: u8 = 1;

/// Connection-tracking value.
/// Forward: `to` is the backend; with SNAT, `nat` is this node's address and port.
/// Reverse: `to` is the frontend (restored as the reply's source); with SNAT, `nat` is the
/// client (restored as the reply's destination).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtValue {
    pub to_addr: u32,
    pub nat_addr: u32,
    pub to_port: u16,
    pub nat_port: u16,
    /// The frontend id the flow was balanced by.
    pub frontend: u32,
    /// Seconds of the kernel's monotonic clock at the last packet (refreshed once a second).
    pub last_seen_s: u32,
    pub flags: u16,
    pub _pad: u16,
}

pub const CT_FLAG_SNAT: u16 = 1 << 0;
/// A FIN was seen: the entry expires after the closing timeout.
pub const CT_FLAG_CLOSING: u16 = 1 << 1;

/// SNAT source ports, above Linux's default ip_local_port_range (32768-60999) so a
/// translated flow never takes a port the node's own sockets use.
pub const SNAT_PORT_MIN: u16 = 61000;
pub const SNAT_PORT_MAX: u16 = 65535;

/// `bpf_map_update_elem` flag: only if the key is absent.
pub const BPF_NOEXIST: u64 = 1;

/// An interface with the north-south programs: the address SNAT uses there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Device {
    pub addr: u32,
}

/// Key of the loadBalancerSourceRanges trie (after the trie's prefix length): the frontend
/// id (big-endian, so the prefix covers it first) and the client address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRangeKey {
    pub id: u32,
    pub addr: u32,
}

/// Maglev tables are stored in chunks of this many slots.
pub const MAGLEV_CHUNK: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaglevKey {
    pub id: u32,
    pub chunk: u32,
}

/// One chunk of a frontend's Maglev table: backend slots.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevChunk {
    pub slots: [u16; MAGLEV_CHUNK],
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all types are repr(C), Copy, and have no implicit padding (explicit `_pad`
    // fields fill every hole), so any byte pattern is a valid value.
    unsafe impl aya::Pod for ServiceKey {}
    unsafe impl aya::Pod for ServiceValue {}
    unsafe impl aya::Pod for BackendKey {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for RevNatEntry {}
    unsafe impl aya::Pod for SockRevNat {}
    unsafe impl aya::Pod for UdpDestroyKey {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for ServiceCounters {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtValue {}
    unsafe impl aya::Pod for Device {}
    unsafe impl aya::Pod for SourceRangeKey {}
    unsafe impl aya::Pod for MaglevKey {}
    unsafe impl aya::Pod for MaglevChunk {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The sizes are the sums of the fields: no implicit padding anywhere.
    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<Addr>(), 16);
        assert_eq!(size_of::<ServiceKey>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<ServiceValue>(), 16);
        assert_eq!(size_of::<BackendKey>(), 8);
        assert_eq!(size_of::<Backend>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<RevNatEntry>(), REVNAT_ENTRY_SIZE);
        assert_eq!(
            size_of::<SockRevNat>(),
            REVNAT_PER_SOCKET * REVNAT_ENTRY_SIZE + 8
        );
        assert_eq!(size_of::<UdpDestroyKey>(), 8);
        assert_eq!(size_of::<AffinityKey>(), 8 + 4 + 4);
        assert_eq!(size_of::<AffinityValue>(), 8 + 20 + 4);
        assert_eq!(size_of::<ServiceCounters>(), 32);
        assert_eq!(size_of::<CtKey>(), 4 + 4 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(size_of::<CtValue>(), 4 + 4 + 2 + 2 + 4 + 4 + 2 + 2);
        assert_eq!(size_of::<SourceRangeKey>(), 8);
        assert_eq!(size_of::<MaglevChunk>(), 2 * MAGLEV_CHUNK);
    }

    /// The offsets the hand-assembled socket iterator uses.
    #[test]
    fn revnat_offsets_match_the_iterator() {
        let e = RevNatEntry::default();
        let base = &e as *const RevNatEntry as usize;
        assert_eq!(
            &e.backend.words[3] as *const u32 as usize - base,
            REVNAT_BACKEND_V4_OFFSET
        );
        assert_eq!(
            &e.backend_port as *const u16 as usize - base,
            REVNAT_BACKEND_PORT_OFFSET
        );
    }

    #[test]
    fn v4_mapping_round_trips() {
        let raw = u32::from_ne_bytes([10, 96, 0, 1]);
        let a = Addr::from_v4_raw(raw);
        assert_eq!(a.v4_raw(), Some(raw));
        assert_eq!(Addr::default().v4_raw(), None);
    }
}
