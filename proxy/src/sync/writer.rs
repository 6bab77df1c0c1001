//! The map operations the sync engine emits, the trait that performs them (BPF maps in the
//! daemon, a recording model in tests), and the conversions between the model's addresses
//! and the kernel's map layouts.

use crate::desired::{Endpoint, FrontendKey};
use crate::model::{Port, Protocol};
use proxy_common::{Addr, Backend, BackendKey, ServiceKey, ServiceValue, SCOPE_CLUSTER};
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
    ServiceKey {
        addr: addr(k.ip),
        port: k.port.get().to_be(),
        proto: k.protocol.number(),
        scope: SCOPE_CLUSTER,
    }
}

/// The frontend a map key stands for; `None` for keys this engine did not write.
pub fn frontend_key(k: &ServiceKey) -> Option<FrontendKey> {
    if k.scope != SCOPE_CLUSTER {
        return None;
    }
    Some(FrontendKey {
        ip: ip(&k.addr),
        port: Port::new(u16::from_be(k.port))?,
        protocol: Protocol::from_number(k.proto)?,
    })
}

pub fn backend(e: &Endpoint) -> Backend {
    Backend {
        addr: addr(e.ip),
        port: e.port.get().to_be(),
        flags: 0,
        _pad: 0,
    }
}

pub fn endpoint(b: &Backend) -> Option<Endpoint> {
    Some(Endpoint {
        ip: ip(&b.addr),
        port: Port::new(u16::from_be(b.port))?,
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
        let k = FrontendKey {
            ip: "10.96.0.1".parse().unwrap(),
            port: Port::new(443).unwrap(),
            protocol: Protocol::Udp,
        };
        assert_eq!(frontend_key(&service_key(&k)), Some(k));
    }
}
