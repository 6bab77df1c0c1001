//! The sync engine: desired frontends in, the minimal ordered map writes out.
//!
//! Per service change it touches only that service's frontends, and per frontend only the
//! slots that differ. Ordering keeps every intermediate state valid for a connect() running
//! at the same time: slots are written before the count that exposes them, a frontend's
//! entry is written after its slots. A kept backend never moves unless the set shrinks
//! below its slot.
//!
//! What a reader may still hold is never taken away under it. A kernel program copies a
//! frontend's count and id, then looks a slot up: slots beyond a lowered count, the slots
//! of a removed frontend and the frontend's id are therefore *retired*, not freed. They are
//! deleted (and the id handed out again) only after a grace period: [`MapSync::begin_grace`]
//! closes an epoch, the caller waits until every program running at that moment has
//! finished (an RCU grace period, `loader::fence`), and [`MapSync::end_grace`] reclaims
//! what that epoch retired. So no connect() is refused for a slot that vanished, and none
//! lands on another service that was given a freed id.
//!
//! Packet-level frontends may carry loadBalancerSourceRanges (written before the flag that
//! makes the kernel check them) and, with `--lb-algorithm maglev`, a Maglev table of slot
//! numbers: written after the count when the backend list grows and before it when it
//! shrinks, so every entry a reader can see names a slot below the count it holds.

pub mod writer;

use crate::dataplane::{Capacity, Dataplane, DataplaneError, Fill};
use crate::desired::{DesiredFrontend, Endpoint, FrontendKey, Frontends, Scope};
use crate::maglev;
use crate::model::{Affinity, ServiceName};
use ipnet::IpNet;
use proxy_common::{
    Backend, BackendKey, MaglevChunk, MaglevKey, ServiceKey, ServiceValue, MAGLEV_CHUNK,
    SVC_FLAG_AFFINITY_CLIENT_IP, SVC_FLAG_MAGLEV, SVC_FLAG_SNAT_REMOTE, SVC_FLAG_SOURCE_RANGES,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use writer::{backend, endpoint, frontend_key, service_key, MapOp, MapWriter};

/// Map capacities, from the daemon's flags.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_services: u32,
    pub max_backends: u32,
    /// Maglev for packet-level frontends, with this table size (None: random choice).
    pub maglev: Option<u32>,
}

/// What is in the maps for one frontend.
#[derive(Clone, Debug)]
struct Programmed {
    value: ServiceValue,
    slots: Vec<Endpoint>,
    ranges: BTreeSet<IpNet>,
    /// The Maglev table (slot numbers), empty without Maglev or without backends.
    maglev: Vec<u16>,
}

/// Frontend ids: dense, reused after removal once no reader can hold them.
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

/// A closed epoch: what was retired up to it may be reclaimed once every kernel program
/// running when it was closed has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a grace period must be ended for its retired entries to be reclaimed"]
pub struct Grace(u64);

/// What [`MapSync::end_grace`] reclaimed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    pub slots: usize,
    pub ids: usize,
}

pub struct MapSync<W: MapWriter> {
    writer: W,
    limits: Limits,
    programmed: HashMap<FrontendKey, Programmed>,
    owned: HashMap<ServiceName, BTreeSet<FrontendKey>>,
    ids: IdPool,
    /// Slots exposed by a count, per live id.
    live_len: HashMap<u32, u32>,
    backends_in_use: u64,
    /// Slots no count exposes any more, with the epoch that retired them.
    retired_slots: HashMap<BackendKey, u64>,
    /// Maglev chunks of removed (or emptied) frontends, with the epoch that retired them.
    retired_maglev: HashMap<MaglevKey, u64>,
    /// Ids of removed frontends, with the epoch that retired them.
    quarantined: Vec<(u32, u64)>,
    epoch: u64,
    /// UDP backends that left a frontend since the last call to `take_removed_udp`:
    /// connected UDP sockets to them are destroyed.
    removed_udp: HashSet<Endpoint>,
    /// Entries found at start that no frontend explains; deleted once the source synced.
    stray_services: Vec<ServiceKey>,
    stray_backends: Vec<BackendKey>,
}

fn value_for(id: u32, count: usize, d: &DesiredFrontend, maglev: bool) -> ServiceValue {
    let (mut flags, affinity_timeout_s) = match d.affinity {
        Affinity::None => (0, 0),
        Affinity::ClientIp { timeout_s } => (SVC_FLAG_AFFINITY_CLIENT_IP, timeout_s),
    };
    if d.snat_remote {
        flags |= SVC_FLAG_SNAT_REMOTE;
    }
    if !d.source_ranges.is_empty() {
        flags |= SVC_FLAG_SOURCE_RANGES;
    }
    if maglev {
        flags |= SVC_FLAG_MAGLEV;
    }
    ServiceValue {
        id,
        count: count as u32,
        flags,
        affinity_timeout_s,
    }
}

/// The Maglev chunks of `table` that differ from `old` (all of them when `old` is empty).
fn changed_chunks(id: u32, old: &[u16], table: &[u16]) -> Vec<(MaglevKey, Box<MaglevChunk>)> {
    let mut out = Vec::new();
    for (i, part) in table.chunks(MAGLEV_CHUNK).enumerate() {
        let before = old.chunks(MAGLEV_CHUNK).nth(i);
        if before == Some(part) {
            continue;
        }
        let mut c = Box::new(MaglevChunk {
            slots: [0; MAGLEV_CHUNK],
        });
        c.slots[..part.len()].copy_from_slice(part);
        out.push((
            MaglevKey {
                id,
                chunk: i as u32,
            },
            c,
        ));
    }
    out
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
            live_len: HashMap::new(),
            backends_in_use: 0,
            retired_slots: HashMap::new(),
            retired_maglev: HashMap::new(),
            quarantined: Vec::new(),
            epoch: 0,
            removed_udp: HashSet::new(),
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
        ranges: Vec<(u32, IpNet)>,
    ) {
        let mut ranges_of: HashMap<u32, BTreeSet<IpNet>> = HashMap::new();
        for (id, net) in ranges {
            ranges_of.entry(id).or_default().insert(net);
        }
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
            self.live_len.insert(value.id, value.count);
            // The table is a function of the slots: what a run with the same table size
            // wrote is what it would write again.
            let maglev = match self.limits.maglev {
                Some(m) if value.flags & SVC_FLAG_MAGLEV != 0 => maglev::table(&eps, m),
                _ => Vec::new(),
            };
            self.programmed.insert(
                fkey,
                Programmed {
                    value,
                    slots: eps,
                    ranges: ranges_of.remove(&value.id).unwrap_or_default(),
                    maglev,
                },
            );
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

    /// The writer, for maps the engine does not own (node addresses, devices, tracking).
    pub fn writer_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    fn write(&mut self, op: MapOp) -> Result<(), DataplaneError> {
        self.writer
            .write(&op)
            .map_err(|e| DataplaneError::Write(format!("{op:?}: {e}")))
    }

    /// Closes the current epoch if anything waits for reclamation. The caller then waits
    /// for a grace period (every kernel program running now has finished) and hands the
    /// result to [`MapSync::end_grace`].
    pub fn begin_grace(&mut self) -> Option<Grace> {
        if !self.reclaim_pending() {
            return None;
        }
        let g = Grace(self.epoch);
        self.epoch += 1;
        Some(g)
    }

    /// Deletes the slots and frees the ids retired up to `g`: no reader can hold them.
    pub fn end_grace(&mut self, g: Grace) -> Result<Reclaimed, DataplaneError> {
        // Tables first: they may name the slots deleted next.
        let mut chunks: Vec<MaglevKey> = self
            .retired_maglev
            .iter()
            .filter(|(_, e)| **e <= g.0)
            .map(|(k, _)| *k)
            .collect();
        chunks.sort();
        for k in chunks {
            self.write(MapOp::DelMaglev(k))?;
            self.retired_maglev.remove(&k);
        }
        let mut due: Vec<BackendKey> = self
            .retired_slots
            .iter()
            .filter(|(_, e)| **e <= g.0)
            .map(|(k, _)| *k)
            .collect();
        due.sort();
        let mut done = Reclaimed::default();
        for k in due {
            // A slot exposed again since it was retired left the retired set then.
            debug_assert!(self.live_len.get(&k.service).is_none_or(|n| k.slot >= *n));
            self.write(MapOp::DelBackend(k))?;
            self.retired_slots.remove(&k);
            done.slots += 1;
        }
        let (free, keep): (Vec<_>, Vec<_>) = self.quarantined.iter().partition(|(_, e)| *e <= g.0);
        self.quarantined = keep;
        for (id, _) in free {
            self.ids.release(id);
            done.ids += 1;
        }
        Ok(done)
    }

    /// Whether retired entries wait for a grace period.
    pub fn reclaim_pending(&self) -> bool {
        !self.retired_slots.is_empty()
            || !self.quarantined.is_empty()
            || !self.retired_maglev.is_empty()
    }

    /// UDP backends that left a frontend since the last call (their connected sockets are
    /// to be destroyed).
    pub fn take_removed_udp(&mut self) -> HashSet<Endpoint> {
        std::mem::take(&mut self.removed_udp)
    }

    fn retire_slot(&mut self, k: BackendKey) {
        self.retired_slots.insert(k, self.epoch);
    }

    fn retire_maglev(&mut self, id: u32, table: &[u16]) {
        for chunk in 0..table.len().div_ceil(MAGLEV_CHUNK) {
            let k = MaglevKey {
                id,
                chunk: chunk as u32,
            };
            self.retired_maglev.insert(k, self.epoch);
        }
    }

    /// Whether a frontend picks by Maglev.
    fn uses_maglev(&self, key: &FrontendKey) -> Option<u32> {
        self.limits.maglev.filter(|_| key.scope == Scope::External)
    }

    fn write_maglev(&mut self, id: u32, old: &[u16], table: &[u16]) -> Result<(), DataplaneError> {
        if table.is_empty() {
            self.retire_maglev(id, old);
            return Ok(());
        }
        for (k, c) in changed_chunks(id, old, table) {
            self.write(MapOp::SetMaglev(k, c))?;
            self.retired_maglev.remove(&k);
        }
        Ok(())
    }

    fn write_ranges(
        &mut self,
        id: u32,
        old: &BTreeSet<IpNet>,
        new: &BTreeSet<IpNet>,
        additions: bool,
    ) -> Result<(), DataplaneError> {
        if additions {
            for net in new.difference(old) {
                self.write(MapOp::SetSourceRange(id, *net))?;
            }
        } else {
            for net in old.difference(new) {
                self.write(MapOp::DelSourceRange(id, *net))?;
            }
        }
        Ok(())
    }

    fn note_removed(&mut self, key: &FrontendKey, gone: impl Iterator<Item = Endpoint>) {
        if key.protocol == crate::model::Protocol::Udp {
            self.removed_udp.extend(gone);
        }
    }

    fn remove(&mut self, key: &FrontendKey) -> Result<(), DataplaneError> {
        let Some(p) = self.programmed.get(key).cloned() else {
            return Ok(());
        };
        // The entry goes first: no new connect can reach the slots after it. The slots, the
        // Maglev table and the id stay until no reader can hold them; source ranges go at
        // once (a late reader is then denied, never wrongly admitted).
        self.write(MapOp::DelService(service_key(key)))?;
        self.write_ranges(p.value.id, &p.ranges, &BTreeSet::new(), false)?;
        for slot in 0..p.slots.len() as u32 {
            self.retire_slot(BackendKey {
                service: p.value.id,
                slot,
            });
        }
        self.retire_maglev(p.value.id, &p.maglev);
        self.programmed.remove(key);
        self.live_len.remove(&p.value.id);
        self.quarantined.push((p.value.id, self.epoch));
        self.backends_in_use -= p.slots.len() as u64;
        self.note_removed(key, p.slots.into_iter());
        Ok(())
    }

    fn set_backend(&mut self, k: BackendKey, ep: &Endpoint) -> Result<(), DataplaneError> {
        self.write(MapOp::SetBackend(k, backend(ep)))?;
        self.retired_slots.remove(&k);
        Ok(())
    }

    fn upsert(&mut self, key: &FrontendKey, d: &DesiredFrontend) -> Result<(), DataplaneError> {
        let new_len = d.backends.len();
        let old_len = self.programmed.get(key).map_or(0, |p| p.slots.len());
        let grow = new_len.saturating_sub(old_len) as u64;
        // Retired slots still occupy the map until they are reclaimed.
        let occupied = self.backends_in_use + self.retired_slots.len() as u64;
        if occupied + grow > self.limits.max_backends as u64 {
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
                let k = BackendKey {
                    service: id,
                    slot: slot as u32,
                };
                self.set_backend(k, ep)?;
            }
        }
        let m = self.uses_maglev(key);
        let value = value_for(id, new_len, d, m.is_some());
        let ranges: BTreeSet<IpNet> = d.source_ranges.iter().copied().collect();
        self.write_ranges(id, &current.ranges, &ranges, true)?;
        let table = match m {
            Some(m) => maglev::table(&target, m),
            None => Vec::new(),
        };
        // Maglev entries name slots: the table goes in before a lowered count (and before
        // a first count, which no reader looks past), after a raised one.
        let table_first = new_len < old_len || current.maglev.is_empty();
        if table_first {
            self.write_maglev(id, &current.maglev, &table)?;
        }
        if value != current.value {
            self.write(MapOp::SetService(service_key(key), value))?;
        }
        if !table_first {
            self.write_maglev(id, &current.maglev, &table)?;
        }
        self.write_ranges(id, &current.ranges, &ranges, false)?;
        self.live_len.insert(id, new_len as u32);
        // Readers of the old count may still look these up: retired, not deleted.
        for slot in new_len..old_len {
            self.retire_slot(BackendKey {
                service: id,
                slot: slot as u32,
            });
        }
        self.backends_in_use = self.backends_in_use + new_len as u64 - old_len as u64;
        let gone: Vec<Endpoint> = current
            .slots
            .iter()
            .filter(|e| !d.backends.contains(e))
            .copied()
            .collect();
        self.note_removed(key, gone.into_iter());
        self.programmed.insert(
            *key,
            Programmed {
                value,
                slots: target,
                ranges,
                maglev: table,
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
            let k = BackendKey {
                service: id,
                slot: slot as u32,
            };
            self.set_backend(k, ep)?;
        }
        let m = self.uses_maglev(key);
        let value = value_for(id, slots.len(), d, m.is_some());
        let ranges: BTreeSet<IpNet> = d.source_ranges.iter().copied().collect();
        self.write_ranges(id, &BTreeSet::new(), &ranges, true)?;
        let table = match m {
            Some(m) => maglev::table(&slots, m),
            None => Vec::new(),
        };
        self.write_maglev(id, &[], &table)?;
        self.write(MapOp::SetService(service_key(key), value))?;
        self.live_len.insert(id, value.count);
        self.backends_in_use += slots.len() as u64;
        self.programmed.insert(
            *key,
            Programmed {
                value,
                slots,
                ranges,
                maglev: table,
            },
        );
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
        // A previous run's readers may still hold these: reclaimed like any retired slot.
        for bkey in std::mem::take(&mut self.stray_backends) {
            let live = self.live_len.get(&bkey.service);
            if live.is_none_or(|len| bkey.slot >= *len) && !self.retired_slots.contains_key(&bkey) {
                self.retire_slot(bkey);
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
