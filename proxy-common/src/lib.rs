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
pub const MAP_REVNAT: &str = "SKIFF_REVNAT";
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

/// Which traffic a service entry translates. Only cluster (socket-level) entries exist now;
/// the tc program for NodePort and externalIPs adds its own scope to the same map.
pub const SCOPE_CLUSTER: u8 = 0;

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

/// `ServiceValue::flags` bits. Bits 1.. are reserved for what later issues add
/// (externalTrafficPolicy Local, NodePort, external IP, Maglev selection).
pub const SVC_FLAG_AFFINITY_CLIENT_IP: u32 = 1 << 0;

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
    /// Reserved for per-backend state (terminating, node-local); zero today.
    pub flags: u8,
    pub _pad: u8,
}

/// Key of the reverse-translation LRU: a socket and the backend it was sent to. Written
/// at connect()/sendmsg(), read by recvmsg() and getpeername() to show the service address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatKey {
    pub cookie: u64,
    pub addr: Addr,
    pub port: u16,
    pub _pad: [u8; 6],
}

/// Value of the reverse-translation LRU: the service address the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNatValue {
    pub addr: Addr,
    pub port: u16,
    pub _pad: u16,
}

/// Key of the sessionAffinity LRU: a client (its network namespace, i.e. its pod) and a
/// frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub netns_cookie: u64,
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

/// Per-CPU counters per frontend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceCounters {
    /// Connects and sends translated to a backend.
    pub translations: u64,
    /// Connects and sends refused because the service had no ready backend.
    pub refused: u64,
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
    unsafe impl aya::Pod for RevNatKey {}
    unsafe impl aya::Pod for RevNatValue {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for ServiceCounters {}
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
        assert_eq!(size_of::<RevNatKey>(), 8 + 16 + 2 + 6);
        assert_eq!(size_of::<RevNatValue>(), 16 + 2 + 2);
        assert_eq!(size_of::<AffinityKey>(), 8 + 4 + 4);
        assert_eq!(size_of::<AffinityValue>(), 8 + 20 + 4);
        assert_eq!(size_of::<ServiceCounters>(), 16);
    }

    #[test]
    fn v4_mapping_round_trips() {
        let raw = u32::from_ne_bytes([10, 96, 0, 1]);
        let a = Addr::from_v4_raw(raw);
        assert_eq!(a.v4_raw(), Some(raw));
        assert_eq!(Addr::default().v4_raw(), None);
    }
}
