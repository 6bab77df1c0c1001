//! The pinned BPF maps as the sync engine's writer, and read access for restarts, `proxy
//! dump` and the per-service metrics.

use crate::sync::writer::{MapOp, MapWriter};
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use ipnet::IpNet;
use proxy_common::{
    Backend, BackendKey, CtKey, CtValue, Device, MaglevChunk, MaglevKey, ServiceCounters,
    ServiceKey, ServiceValue, SourceRangeKey, MAP_BACKENDS, MAP_COUNTERS, MAP_CT, MAP_DEVICES,
    MAP_DROPS, MAP_MAGLEV, MAP_NODE_ADDRS, MAP_SERVICES, MAP_SOURCE_RANGES,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

/// The maps the user space writes or reads (the rest belong to the kernel programs).
pub struct BpfMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, BackendKey, Backend>,
    counters: PerCpuArray<MapData, ServiceCounters>,
    /// North-south maps (absent when opened for `proxy dump`).
    north_south: Option<NorthSouth>,
    nr_cpus: usize,
}

struct NorthSouth {
    node_addrs: HashMap<MapData, u32, u32>,
    devices: HashMap<MapData, u32, Device>,
    ct: HashMap<MapData, CtKey, CtValue>,
    ranges: LpmTrie<MapData, SourceRangeKey, u8>,
    maglev: HashMap<MapData, MaglevKey, MaglevChunk>,
    drops: PerCpuArray<MapData, u64>,
}

/// The trie key of a source range of frontend `id`.
fn range_key(id: u32, net: &IpNet) -> Option<LpmKey<SourceRangeKey>> {
    let IpNet::V4(v4) = net else { return None };
    Some(LpmKey::new(
        32 + v4.prefix_len() as u32,
        SourceRangeKey {
            id: id.to_be(),
            addr: u32::from_ne_bytes(v4.network().octets()),
        },
    ))
}

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("map {0} is missing from the object")]
    Missing(&'static str),
    #[error("counting CPUs: {0}")]
    Cpus(std::io::Error),
}

fn ctx(name: &'static str) -> impl FnOnce(MapError) -> MapsError {
    move |source| MapsError::Map { name, source }
}

fn is_not_found(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound | MapError::ElementNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT))
}

impl BpfMaps {
    /// Takes the maps out of a loaded object.
    pub fn from_loaded(ebpf: &mut aya::Ebpf) -> Result<Self, MapsError> {
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(MapsError::Missing(name));
        let services = take(MAP_SERVICES)?;
        let backends = take(MAP_BACKENDS)?;
        let counters = take(MAP_COUNTERS)?;
        let ns = NorthSouth {
            node_addrs: HashMap::try_from(take(MAP_NODE_ADDRS)?).map_err(ctx(MAP_NODE_ADDRS))?,
            devices: HashMap::try_from(take(MAP_DEVICES)?).map_err(ctx(MAP_DEVICES))?,
            ct: HashMap::try_from(take(MAP_CT)?).map_err(ctx(MAP_CT))?,
            ranges: LpmTrie::try_from(take(MAP_SOURCE_RANGES)?).map_err(ctx(MAP_SOURCE_RANGES))?,
            maglev: HashMap::try_from(take(MAP_MAGLEV)?).map_err(ctx(MAP_MAGLEV))?,
            drops: PerCpuArray::try_from(take(MAP_DROPS)?).map_err(ctx(MAP_DROPS))?,
        };
        let mut maps = Self::from_maps(services, backends, counters)?;
        maps.north_south = Some(ns);
        Ok(maps)
    }

    /// Opens the maps a running (or stopped) proxy pinned under `maps_dir`.
    pub fn open_pinned(maps_dir: &Path) -> Result<Self, MapsError> {
        let open = |name: &'static str| -> Result<Map, MapsError> {
            let data = MapData::from_pin(maps_dir.join(name)).map_err(ctx(name))?;
            Map::from_map_data(data).map_err(ctx(name))
        };
        Self::from_maps(
            open(MAP_SERVICES)?,
            open(MAP_BACKENDS)?,
            open(MAP_COUNTERS)?,
        )
    }

    fn from_maps(services: Map, backends: Map, counters: Map) -> Result<Self, MapsError> {
        Ok(BpfMaps {
            services: HashMap::try_from(services).map_err(ctx(MAP_SERVICES))?,
            backends: HashMap::try_from(backends).map_err(ctx(MAP_BACKENDS))?,
            counters: PerCpuArray::try_from(counters).map_err(ctx(MAP_COUNTERS))?,
            north_south: None,
            nr_cpus: aya::util::nr_cpus().map_err(|(_, e)| MapsError::Cpus(e))?,
        })
    }

    fn ns(&mut self) -> Result<&mut NorthSouth, MapsError> {
        self.north_south
            .as_mut()
            .ok_or(MapsError::Missing(MAP_NODE_ADDRS))
    }

    /// The source ranges programmed per frontend id (for a restart's adoption).
    pub fn source_ranges(&self) -> Result<Vec<(u32, IpNet)>, MapsError> {
        let Some(ns) = &self.north_south else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for k in ns.ranges.keys() {
            let k = k.map_err(ctx(MAP_SOURCE_RANGES))?;
            let d = k.data();
            let addr = Ipv4Addr::from(d.addr.to_ne_bytes());
            if let Ok(net) = IpNet::new(IpAddr::V4(addr), (k.prefix_len() - 32) as u8) {
                out.push((u32::from_be(d.id), net));
            }
        }
        Ok(out)
    }

    /// Makes the node-address map hold exactly `addrs` (IPv4 as in packets).
    pub fn set_node_addrs(
        &mut self,
        addrs: &std::collections::BTreeSet<Ipv4Addr>,
    ) -> Result<(), MapsError> {
        let ns = self.ns()?;
        let want: std::collections::HashSet<u32> = addrs
            .iter()
            .map(|a| u32::from_ne_bytes(a.octets()))
            .collect();
        let have: Vec<u32> = ns
            .node_addrs
            .keys()
            .collect::<Result<_, _>>()
            .map_err(ctx(MAP_NODE_ADDRS))?;
        for a in &have {
            if !want.contains(a) {
                let _ = ns.node_addrs.remove(a);
            }
        }
        for a in want {
            if !have.contains(&a) {
                ns.node_addrs.insert(a, 1, 0).map_err(ctx(MAP_NODE_ADDRS))?;
            }
        }
        Ok(())
    }

    /// Makes the device map hold exactly `devices` (ifindex -> SNAT address).
    pub fn set_devices(&mut self, devices: &[(u32, Ipv4Addr)]) -> Result<(), MapsError> {
        let ns = self.ns()?;
        let have: Vec<u32> = ns
            .devices
            .keys()
            .collect::<Result<_, _>>()
            .map_err(ctx(MAP_DEVICES))?;
        for i in &have {
            if !devices.iter().any(|(j, _)| j == i) {
                let _ = ns.devices.remove(i);
            }
        }
        for (i, a) in devices {
            let d = Device {
                addr: u32::from_ne_bytes(a.octets()),
            };
            ns.devices.insert(i, d, 0).map_err(ctx(MAP_DEVICES))?;
        }
        Ok(())
    }

    /// Every connection-tracking entry (for the collector).
    pub fn ct_entries(&self) -> Result<Vec<(CtKey, CtValue)>, MapsError> {
        let Some(ns) = &self.north_south else {
            return Ok(Vec::new());
        };
        ns.ct.iter().collect::<Result<_, _>>().map_err(ctx(MAP_CT))
    }

    pub fn ct_remove(&mut self, k: &CtKey) -> Result<(), MapsError> {
        match self.ns()?.ct.remove(k) {
            Err(e) if !is_not_found(&e) => Err(ctx(MAP_CT)(e)),
            _ => Ok(()),
        }
    }

    /// Drops outside any frontend, by reason index, summed over CPUs.
    pub fn drops(&self, reason: u32) -> Result<u64, MapsError> {
        let Some(ns) = &self.north_south else {
            return Ok(0);
        };
        let per_cpu = ns.drops.get(&reason, 0).map_err(ctx(MAP_DROPS))?;
        Ok(per_cpu.iter().sum())
    }

    pub fn services(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, MapsError> {
        self.services
            .iter()
            .collect::<Result<_, _>>()
            .map_err(ctx(MAP_SERVICES))
    }

    pub fn backends(&self) -> Result<Vec<(BackendKey, Backend)>, MapsError> {
        self.backends
            .iter()
            .collect::<Result<_, _>>()
            .map_err(ctx(MAP_BACKENDS))
    }

    /// One backend slot (None if empty).
    pub fn backend(&self, key: &BackendKey) -> Result<Option<Backend>, MapsError> {
        match self.backends.get(key, 0) {
            Ok(b) => Ok(Some(b)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ctx(MAP_BACKENDS)(e)),
        }
    }

    /// One frontend's entry (None if absent).
    pub fn service(&self, key: &ServiceKey) -> Result<Option<ServiceValue>, MapsError> {
        match self.services.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(ctx(MAP_SERVICES)(e)),
        }
    }

    /// A frontend id's counters summed over CPUs.
    pub fn counters(&self, id: u32) -> Result<ServiceCounters, MapsError> {
        let per_cpu = self.counters.get(&id, 0).map_err(ctx(MAP_COUNTERS))?;
        Ok(per_cpu
            .iter()
            .fold(ServiceCounters::default(), |a, c| ServiceCounters {
                translations: a.translations + c.translations,
                refused: a.refused + c.refused,
                missed: a.missed + c.missed,
                denied: a.denied + c.denied,
            }))
    }
}

impl MapWriter for BpfMaps {
    type Error = MapsError;

    fn write(&mut self, op: &MapOp) -> Result<(), MapsError> {
        match op {
            MapOp::SetService(k, v) => self.services.insert(k, v, 0).map_err(ctx(MAP_SERVICES)),
            MapOp::DelService(k) => match self.services.remove(k) {
                Err(e) if !is_not_found(&e) => Err(ctx(MAP_SERVICES)(e)),
                _ => Ok(()),
            },
            MapOp::SetBackend(k, b) => self.backends.insert(k, b, 0).map_err(ctx(MAP_BACKENDS)),
            MapOp::DelBackend(k) => match self.backends.remove(k) {
                Err(e) if !is_not_found(&e) => Err(ctx(MAP_BACKENDS)(e)),
                _ => Ok(()),
            },
            MapOp::ResetCounters(id) => {
                let zero = PerCpuValues::try_from(vec![ServiceCounters::default(); self.nr_cpus])
                    .map_err(MapsError::Cpus)?;
                self.counters.set(*id, zero, 0).map_err(ctx(MAP_COUNTERS))
            }
            MapOp::SetSourceRange(id, net) => match range_key(*id, net) {
                Some(k) => self
                    .ns()?
                    .ranges
                    .insert(&k, 1, 0)
                    .map_err(ctx(MAP_SOURCE_RANGES)),
                // IPv6 ranges: the packet-level programs see IPv4 only.
                None => Ok(()),
            },
            MapOp::DelSourceRange(id, net) => match range_key(*id, net) {
                Some(k) => match self.ns()?.ranges.remove(&k) {
                    Err(e) if !is_not_found(&e) => Err(ctx(MAP_SOURCE_RANGES)(e)),
                    _ => Ok(()),
                },
                None => Ok(()),
            },
            MapOp::SetMaglev(k, chunk) => self
                .ns()?
                .maglev
                .insert(k, chunk.as_ref(), 0)
                .map_err(ctx(MAP_MAGLEV)),
            MapOp::DelMaglev(k) => match self.ns()?.maglev.remove(k) {
                Err(e) if !is_not_found(&e) => Err(ctx(MAP_MAGLEV)(e)),
                _ => Ok(()),
            },
        }
    }
}
