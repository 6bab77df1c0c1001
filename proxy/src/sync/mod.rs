//! The sync engine: desired frontends in, the minimal ordered map writes out.
//!
//! Per service change it touches only that service's frontends, and per frontend only the
//! slots that differ. Ordering keeps every intermediate state valid for a connect() running
//! at the same time: slots are written before the count that exposes them, a frontend's
//! entry is written after its slots, and slots are deleted only after the count (or the
//! entry) that exposed them is gone. A kept backend never moves unless the set shrinks
//! below its slot.

pub mod writer;

use crate::dataplane::{Capacity, Dataplane, DataplaneError, Fill};
use crate::desired::{DesiredFrontend, Endpoint, FrontendKey, Frontends};
use crate::model::{Affinity, ServiceName};
use proxy_common::{Backend, BackendKey, ServiceKey, ServiceValue, SVC_FLAG_AFFINITY_CLIENT_IP};
use std::collections::{BTreeSet, HashMap, HashSet};
use writer::{backend, endpoint, frontend_key, service_key, MapOp, MapWriter};

/// Map capacities, from the daemon's flags.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_services: u32,
    pub max_backends: u32,
}

/// What is in the maps for one frontend.
#[derive(Clone, Debug)]
struct Programmed {
    value: ServiceValue,
    slots: Vec<Endpoint>,
}

/// Frontend ids: dense, reused after removal.
#[derive(Debug)]
struct IdPool {
    next: u32,
    free: Vec<u32>,
    max: u32,
}

impl IdPool {
    fn alloc(&mut self) -> Option<u32> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        (self.next < self.max).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    fn release(&mut self, id: u32) {
        self.free.push(id);
    }

    /// Rebuilds the pool around ids found in the maps (restart).
    fn adopt(&mut self, used: &HashSet<u32>) {
        self.next = used.iter().map(|i| i + 1).max().unwrap_or(0);
        self.free = (0..self.next).rev().filter(|i| !used.contains(i)).collect();
    }
}

pub struct MapSync<W: MapWriter> {
    writer: W,
    limits: Limits,
    programmed: HashMap<FrontendKey, Programmed>,
    owned: HashMap<ServiceName, BTreeSet<FrontendKey>>,
    ids: IdPool,
    backends_in_use: u64,
    /// Entries found at start that no frontend explains; deleted once the source synced.
    stray_services: Vec<ServiceKey>,
    stray_backends: Vec<BackendKey>,
}

fn value_for(id: u32, count: usize, d: &DesiredFrontend) -> ServiceValue {
    let (flags, affinity_timeout_s) = match d.affinity {
        Affinity::None => (0, 0),
        Affinity::ClientIp { timeout_s } => (SVC_FLAG_AFFINITY_CLIENT_IP, timeout_s),
    };
    ServiceValue {
        id,
        count: count as u32,
        flags,
        affinity_timeout_s,
    }
}

impl<W: MapWriter> MapSync<W> {
    pub fn new(writer: W, limits: Limits) -> Self {
        MapSync {
            writer,
            limits,
            programmed: HashMap::new(),
            owned: HashMap::new(),
            ids: IdPool {
                next: 0,
                free: Vec::new(),
                max: limits.max_services,
            },
            backends_in_use: 0,
            stray_services: Vec::new(),
            stray_backends: Vec::new(),
        }
    }

    /// Takes over what a previous run left in the maps, so that a restart rewrites only
    /// what changed meanwhile and traffic never stops.
    pub fn adopt(
        &mut self,
        services: Vec<(ServiceKey, ServiceValue)>,
        backends: Vec<(BackendKey, Backend)>,
    ) {
        let mut slots: HashMap<BackendKey, Backend> = backends.into_iter().collect();
        let mut used = HashSet::new();
        for (skey, value) in services {
            let Some(fkey) = frontend_key(&skey).filter(|_| value.id < self.limits.max_services)
            else {
                self.stray_services.push(skey);
                continue;
            };
            let mut eps = Vec::with_capacity(value.count as usize);
            for slot in 0..value.count {
                match slots
                    .remove(&BackendKey {
                        service: value.id,
                        slot,
                    })
                    .and_then(|b| endpoint(&b))
                {
                    Some(e) => eps.push(e),
                    None => break,
                }
            }
            if eps.len() != value.count as usize || !used.insert(value.id) {
                // Inconsistent entry (should not happen): let it be rewritten from scratch.
                self.stray_services.push(skey);
                continue;
            }
            self.backends_in_use += eps.len() as u64;
            self.programmed
                .insert(fkey, Programmed { value, slots: eps });
        }
        self.stray_backends.extend(slots.into_keys());
        self.ids.adopt(&used);
    }

    /// Every programmed frontend with its service and id (for metrics and dump).
    pub fn frontends(&self) -> impl Iterator<Item = (&ServiceName, &FrontendKey, u32)> {
        self.owned.iter().flat_map(move |(svc, keys)| {
            keys.iter()
                .filter_map(move |k| self.programmed.get(k).map(|p| (svc, k, p.value.id)))
        })
    }

    pub fn writer(&self) -> &W {
        &self.writer
    }

    fn write(&mut self, op: MapOp) -> Result<(), DataplaneError> {
        self.writer
            .write(&op)
            .map_err(|e| DataplaneError::Write(format!("{op:?}: {e}")))
    }

    fn remove(&mut self, key: &FrontendKey) -> Result<(), DataplaneError> {
        let Some(p) = self.programmed.get(key).cloned() else {
            return Ok(());
        };
        // The entry goes first: no new connect can reach the slots after it.
        self.write(MapOp::DelService(service_key(key)))?;
        for slot in 0..p.slots.len() as u32 {
            self.write(MapOp::DelBackend(BackendKey {
                service: p.value.id,
                slot,
            }))?;
        }
        self.programmed.remove(key);
        self.ids.release(p.value.id);
        self.backends_in_use -= p.slots.len() as u64;
        Ok(())
    }

    fn upsert(&mut self, key: &FrontendKey, d: &DesiredFrontend) -> Result<(), DataplaneError> {
        let new_len = d.backends.len();
        let old_len = self.programmed.get(key).map_or(0, |p| p.slots.len());
        let grow = new_len.saturating_sub(old_len) as u64;
        if self.backends_in_use + grow > self.limits.max_backends as u64 {
            return Err(DataplaneError::Full {
                capacity: Capacity::Backends,
                limit: self.limits.max_backends,
                frontend: *key,
            });
        }
        let Some(current) = self.programmed.get(key).cloned() else {
            let id = self.ids.alloc().ok_or(DataplaneError::Full {
                capacity: Capacity::Services,
                limit: self.limits.max_services,
                frontend: *key,
            })?;
            let result = self.create(key, id, d);
            if result.is_err() {
                self.ids.release(id);
            }
            return result;
        };
        let id = current.value.id;
        let target = next_slots(&current.slots, &d.backends);
        for (slot, ep) in target.iter().enumerate() {
            if current.slots.get(slot) != Some(ep) {
                self.write(MapOp::SetBackend(
                    BackendKey {
                        service: id,
                        slot: slot as u32,
                    },
                    backend(ep),
                ))?;
            }
        }
        let value = value_for(id, new_len, d);
        if value != current.value {
            self.write(MapOp::SetService(service_key(key), value))?;
        }
        for slot in new_len..old_len {
            self.write(MapOp::DelBackend(BackendKey {
                service: id,
                slot: slot as u32,
            }))?;
        }
        self.backends_in_use = self.backends_in_use + new_len as u64 - old_len as u64;
        self.programmed.insert(
            *key,
            Programmed {
                value,
                slots: target,
            },
        );
        Ok(())
    }

    fn create(
        &mut self,
        key: &FrontendKey,
        id: u32,
        d: &DesiredFrontend,
    ) -> Result<(), DataplaneError> {
        self.write(MapOp::ResetCounters(id))?;
        let slots: Vec<Endpoint> = d.backends.iter().copied().collect();
        for (slot, ep) in slots.iter().enumerate() {
            self.write(MapOp::SetBackend(
                BackendKey {
                    service: id,
                    slot: slot as u32,
                },
                backend(ep),
            ))?;
        }
        let value = value_for(id, slots.len(), d);
        self.write(MapOp::SetService(service_key(key), value))?;
        self.backends_in_use += slots.len() as u64;
        self.programmed.insert(*key, Programmed { value, slots });
        Ok(())
    }
}

/// The new slot layout: kept backends stay in place when their slot survives; holes (a
/// removed backend, or new room) take kept backends from the truncated tail first, then the
/// added ones.
fn next_slots(current: &[Endpoint], desired: &BTreeSet<Endpoint>) -> Vec<Endpoint> {
    let new_len = desired.len();
    let present: HashSet<&Endpoint> = current.iter().collect();
    let mut target: Vec<Option<Endpoint>> = vec![None; new_len];
    let mut movers = Vec::new();
    for (i, ep) in current.iter().enumerate() {
        if desired.contains(ep) {
            if i < new_len {
                target[i] = Some(*ep);
            } else {
                movers.push(*ep);
            }
        }
    }
    let mut fill = movers
        .into_iter()
        .chain(desired.iter().filter(|e| !present.contains(e)).copied());
    target
        .into_iter()
        .map(|t| t.or_else(|| fill.next()))
        .collect::<Option<Vec<_>>>()
        .expect("every hole has a filler: |desired| = kept + added")
}

impl<W: MapWriter> Dataplane for MapSync<W> {
    fn update(&mut self, service: &ServiceName, frontends: &Frontends) -> Vec<DataplaneError> {
        let mut errors = Vec::new();
        let old = self.owned.remove(service).unwrap_or_default();
        for key in old.iter().filter(|k| !frontends.contains_key(k)) {
            if let Err(e) = self.remove(key) {
                errors.push(e);
            }
        }
        let mut now = BTreeSet::new();
        for (key, d) in frontends {
            if let Err(e) = self.upsert(key, d) {
                errors.push(e);
            }
            if self.programmed.contains_key(key) {
                now.insert(*key);
            }
        }
        if !now.is_empty() {
            self.owned.insert(service.clone(), now);
        }
        errors
    }

    fn flush(&mut self) -> Result<(), DataplaneError> {
        Ok(())
    }

    fn initial_sync_done(&mut self) -> Result<(), DataplaneError> {
        let claimed: HashSet<FrontendKey> = self.owned.values().flatten().copied().collect();
        let unclaimed: Vec<FrontendKey> = self
            .programmed
            .keys()
            .filter(|k| !claimed.contains(k))
            .copied()
            .collect();
        for key in unclaimed {
            self.remove(&key)?;
        }
        for skey in std::mem::take(&mut self.stray_services) {
            // Only if nothing took the key over meanwhile.
            if frontend_key(&skey).is_none_or(|k| !self.programmed.contains_key(&k)) {
                self.write(MapOp::DelService(skey))?;
            }
        }
        let live: HashMap<u32, u32> = self
            .programmed
            .values()
            .map(|p| (p.value.id, p.slots.len() as u32))
            .collect();
        for bkey in std::mem::take(&mut self.stray_backends) {
            if live.get(&bkey.service).is_none_or(|len| bkey.slot >= *len) {
                self.write(MapOp::DelBackend(bkey))?;
            }
        }
        Ok(())
    }

    fn fill(&self) -> Fill {
        Fill {
            frontends: self.programmed.len() as u64,
            backends: self.backends_in_use,
        }
    }
}

#[cfg(test)]
mod tests;
