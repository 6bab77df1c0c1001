//! The map operations the sync engine emits, the trait that performs them (BPF maps in the
//! daemon, a recording model in tests), and the conversions between the model's addresses
//! and the kernel's map layouts.

use crate::desired::{Endpoint, FrontendKey, Scope};
use crate::model::{Port, Protocol};
use ipnet::IpNet;
use proxy_common::{
    Addr, Backend, BackendKey, MaglevChunk, MaglevKey, ServiceKey, ServiceValue,
    BACKEND_FLAG_LOCAL, SCOPE_CLUSTER, SCOPE_EXTERNAL, SCOPE_NODEPORT,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One write to the data path's maps. The engine orders them so that every intermediate
/// state is valid for a concurrent connect().
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    SetService(ServiceKey, ServiceValue),
    DelService(ServiceKey),
    SetBackend(BackendKey, Backend),
    DelBackend(BackendKey),
    /// Zero a frontend id's counters before the id is reused.
    ResetCounters(u32),
    /// A loadBalancerSourceRanges prefix a frontend id admits.
    SetSourceRange(u32, IpNet),
    DelSourceRange(u32, IpNet),
    /// One chunk of a frontend's Maglev table.
    SetMaglev(MaglevKey, Box<MaglevChunk>),
    DelMaglev(MaglevKey),
}

/// Performs map operations, in order.
pub trait MapWriter {
    type Error: std::error::Error + Send + Sync + 'static;
    fn write(&mut self, op: &MapOp) -> Result<(), Self::Error>;
}

pub fn addr(ip: IpAddr) -> Addr {
    match ip {
        IpAddr::V4(v4) => Addr::from_v4_raw(u32::from_ne_bytes(v4.octets())),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            Addr {
                words: [w(0), w(4), w(8), w(12)],
            }
        }
    }
}

pub fn ip(a: &Addr) -> IpAddr {
    match a.v4_raw() {
        Some(raw) => IpAddr::V4(Ipv4Addr::from(raw.to_ne_bytes())),
        None => {
            let mut o = [0u8; 16];
            for (i, w) in a.words.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(o))
        }
    }
}

pub fn service_key(k: &FrontendKey) -> ServiceKey {
    // A node port's key has address zero: it stands for every node address.
    let a = if k.ip.is_unspecified() {
        Addr::default()
    } else {
        addr(k.ip)
    };
    ServiceKey {
        addr: a,
        port: k.port.get().to_be(),
        proto: k.protocol.number(),
        scope: match k.scope {
            Scope::Cluster => SCOPE_CLUSTER,
            Scope::NodePort => SCOPE_NODEPORT,
            Scope::External => SCOPE_EXTERNAL,
        },
    }
}

/// The frontend a map key stands for; `None` for keys this engine did not write.
pub fn frontend_key(k: &ServiceKey) -> Option<FrontendKey> {
    let scope = match k.scope {
        SCOPE_CLUSTER => Scope::Cluster,
        SCOPE_NODEPORT => Scope::NodePort,
        SCOPE_EXTERNAL => Scope::External,
        _ => return None,
    };
    let ip = if k.addr == Addr::default() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        ip(&k.addr)
    };
    Some(FrontendKey {
        ip,
        port: Port::new(u16::from_be(k.port))?,
        protocol: Protocol::from_number(k.proto)?,
        scope,
    })
}

pub fn backend(e: &Endpoint) -> Backend {
    Backend {
        addr: addr(e.ip),
        port: e.port.get().to_be(),
        flags: if e.local { BACKEND_FLAG_LOCAL } else { 0 },
        _pad: 0,
    }
}

pub fn endpoint(b: &Backend) -> Option<Endpoint> {
    Some(Endpoint {
        ip: ip(&b.addr),
        port: Port::new(u16::from_be(b.port))?,
        local: b.flags & BACKEND_FLAG_LOCAL != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_both_families() {
        for s in ["10.96.0.1", "127.0.0.1", "fd00::1", "2001:db8::42"] {
            let i: IpAddr = s.parse().unwrap();
            assert_eq!(ip(&addr(i)), i);
        }
        for (ip, scope) in [
            ("10.96.0.1", Scope::Cluster),
            ("0.0.0.0", Scope::NodePort),
            ("0.0.0.0", Scope::External),
            ("10.249.0.200", Scope::External),
        ] {
            let k = FrontendKey {
                ip: ip.parse().unwrap(),
                port: Port::new(443).unwrap(),
                protocol: Protocol::Udp,
                scope,
            };
            assert_eq!(frontend_key(&service_key(&k)), Some(k));
        }
    }
}
