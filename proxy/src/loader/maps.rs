//! The pinned BPF maps as the sync engine's writer, and read access for restarts, `proxy
//! dump` and the per-service metrics.

use crate::sync::writer::{MapOp, MapWriter};
use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use proxy_common::{
    Backend, BackendKey, ServiceCounters, ServiceKey, ServiceValue, MAP_BACKENDS, MAP_COUNTERS,
    MAP_SERVICES,
};
use std::path::Path;

pub struct BpfMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, BackendKey, Backend>,
    counters: PerCpuArray<MapData, ServiceCounters>,
    nr_cpus: usize,
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
        Self::from_maps(services, backends, counters)
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
            nr_cpus: aya::util::nr_cpus().map_err(|(_, e)| MapsError::Cpus(e))?,
        })
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
        }
    }
}
