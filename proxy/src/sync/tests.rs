//! Property tests of the sync engine against a recording model of the maps: after any
//! sequence of events the maps equal the desired state, and at every single write the
//! ordering invariant holds: every slot exposed now holds an old or a new backend, every
//! slot a reader may have been shown since the last grace period still exists, and no id
//! seen since then names another frontend; every Maglev entry names a slot that exists, and
//! a frontend flagged for source ranges has them.

use super::*;
use crate::desired::{Change, DesiredState};
use crate::model::{
    Family, ObjectKey, Port, PortName, Protocol, ServicePort, ServiceSpec, SliceEndpoint,
    SliceName, SlicePort, SliceSpec,
};
use crate::model::{ServiceKind, TrafficPolicy};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The Maglev table size of these tests (small: the checks walk every entry).
const M: u32 = 251;

/// The maps as a model, checking the invariant after every write.
#[derive(Default)]
struct Recording {
    services: BTreeMap<ServiceKey, ServiceValue>,
    backends: BTreeMap<BackendKey, Backend>,
    /// Per frontend, the backends a client may legitimately reach during the current
    /// update: old set ∪ new set.
    allowed: HashMap<ServiceKey, HashSet<Backend>>,
    writes: usize,
    /// Fail with "full" once this many entries would be in the backends map.
    backend_capacity: Option<usize>,
    /// Every (id, slot) some count exposed since the last grace period: a reader that
    /// copied that count may still look the slot up.
    exposed: HashSet<BackendKey>,
    /// The frontend each id exposed since the last grace period belongs to.
    id_owner: HashMap<u32, ServiceKey>,
    ranges: BTreeSet<(u32, IpNet)>,
    maglev: BTreeMap<MaglevKey, Box<MaglevChunk>>,
}

#[derive(Debug, thiserror::Error)]
#[error("map full")]
struct Full;

impl MapWriter for Recording {
    type Error = Full;
    fn write(&mut self, op: &MapOp) -> Result<(), Full> {
        self.writes += 1;
        match op {
            MapOp::SetService(k, v) => {
                self.services.insert(*k, *v);
            }
            MapOp::DelService(k) => {
                self.services.remove(k);
            }
            MapOp::SetBackend(k, b) => {
                if let Some(cap) = self.backend_capacity {
                    if !self.backends.contains_key(k) && self.backends.len() >= cap {
                        return Err(Full);
                    }
                }
                self.backends.insert(*k, *b);
            }
            MapOp::DelBackend(k) => {
                self.backends.remove(k);
            }
            MapOp::ResetCounters(_) => {}
            MapOp::SetSourceRange(id, net) => {
                self.ranges.insert((*id, *net));
            }
            MapOp::DelSourceRange(id, net) => {
                self.ranges.remove(&(*id, *net));
            }
            MapOp::SetMaglev(k, c) => {
                self.maglev.insert(*k, c.clone());
            }
            MapOp::DelMaglev(k) => {
                self.maglev.remove(k);
            }
        }
        self.check_invariant(op);
        Ok(())
    }
}

/// An operation for a failure message (Maglev chunks are long).
fn brief(op: &MapOp) -> String {
    match op {
        MapOp::SetMaglev(k, _) => format!("SetMaglev({k:?}, ..)"),
        other => format!("{other:?}"),
    }
}

impl Recording {
    /// A grace period has passed: readers from before it are gone.
    fn fence(&mut self) {
        self.exposed.clear();
        self.id_owner.clear();
        self.check_invariant(&MapOp::ResetCounters(0));
    }

    fn check_invariant(&mut self, op: &MapOp) {
        for (k, v) in &self.services {
            if let Some(owner) = self.id_owner.insert(v.id, *k) {
                assert_eq!(
                    owner,
                    *k,
                    "after {}: id {} given to {k:?} while a reader may hold it for {owner:?}",
                    brief(op),
                    v.id
                );
            }
            for slot in 0..v.count {
                self.exposed.insert(BackendKey {
                    service: v.id,
                    slot,
                });
            }
            if v.flags & SVC_FLAG_SOURCE_RANGES != 0 {
                assert!(
                    self.ranges
                        .range((v.id, IpNet::default())..)
                        .next()
                        .is_some_and(|(i, _)| *i == v.id),
                    "after {}: {k:?} checks source ranges it does not have",
                    brief(op)
                );
            }
        }
        // A reader may read a frontend's Maglev table at any time: every entry of every
        // table names a slot that exists (it is looked up without the count).
        for (k, c) in &self.maglev {
            for e in &c.slots[..(M as usize - k.chunk as usize * MAGLEV_CHUNK).min(MAGLEV_CHUNK)] {
                let slot = BackendKey {
                    service: k.id,
                    slot: *e as u32,
                };
                assert!(
                    self.backends.contains_key(&slot),
                    "after {}: Maglev chunk {k:?} names missing slot {}",
                    brief(op),
                    e
                );
            }
        }
        for (k, v) in &self.services {
            if v.flags & SVC_FLAG_MAGLEV != 0 && v.count > 0 {
                let c = MaglevKey { id: v.id, chunk: 0 };
                assert!(
                    self.maglev.contains_key(&c),
                    "after {}: {k:?} has no Maglev table",
                    brief(op)
                );
            }
        }
        for k in &self.exposed {
            assert!(
                self.backends.contains_key(k),
                "after {}: slot {k:?} deleted while a reader may hold its count",
                brief(op)
            );
        }
        for (k, v) in &self.services {
            for slot in 0..v.count {
                let b = self
                    .backends
                    .get(&BackendKey {
                        service: v.id,
                        slot,
                    })
                    .unwrap_or_else(|| {
                        panic!("after {}: {k:?} exposes empty slot {slot}", brief(op))
                    });
                if let Some(allowed) = self.allowed.get(k) {
                    assert!(
                        allowed.contains(b),
                        "after {}: {k:?} slot {slot} exposes stale backend {b:?}",
                        brief(op)
                    );
                }
            }
        }
    }
}

fn name(i: u8) -> ServiceName {
    ServiceName(ObjectKey::new("default", format!("svc-{i}")))
}

fn cluster_ip(i: u8) -> IpAddr {
    format!("10.96.0.{i}").parse().unwrap()
}

/// Service `i`: every second one a LoadBalancer (node port, an address, source ranges when
/// `ranges`), the others ClusterIP; with or without affinity.
fn spec(i: u8, affinity: bool) -> ServiceSpec {
    let mut s = ServiceSpec::cluster_ip(
        vec![cluster_ip(i)],
        vec![ServicePort {
            name: PortName("p".into()),
            port: Port::new(80).unwrap(),
            protocol: Protocol::Tcp,
            node_port: None,
        }],
    );
    s.affinity = if affinity {
        Affinity::ClientIp { timeout_s: 60 }
    } else {
        Affinity::None
    };
    if i % 2 == 1 {
        s.kind = ServiceKind::LoadBalancer;
        s.ports[0].node_port = Port::new(30_000 + i as u16);
        s.load_balancer_ips = vec![format!("10.249.0.{i}").parse().unwrap()];
        if affinity {
            s.source_ranges = vec![
                "10.0.0.0/8".parse().unwrap(),
                format!("192.168.{i}.0/24").parse().unwrap(),
            ];
            s.external_policy = TrafficPolicy::Local;
        }
    }
    s
}

fn slice(service: u8, endpoints: &[u8]) -> SliceSpec {
    SliceSpec {
        service: name(service),
        family: Family::V4,
        ports: vec![SlicePort {
            name: PortName("p".into()),
            port: Port::new(8080).unwrap(),
            protocol: Protocol::Tcp,
        }],
        endpoints: endpoints
            .iter()
            .map(|e| SliceEndpoint::ready(format!("10.244.0.{e}").parse().unwrap()))
            .collect(),
    }
}

#[derive(Clone, Debug)]
enum Ev {
    Service(u8, Option<bool>),
    Slice(u8, u8, Option<Vec<u8>>),
    /// A grace period: begin, wait for readers, end.
    Reclaim,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u8..6, proptest::option::of(any::<bool>())).prop_map(|(s, a)| Ev::Service(s, a)),
        (
            0u8..6,
            0u8..2,
            proptest::option::weighted(0.8, proptest::collection::vec(0u8..12, 0..10))
        )
            .prop_map(|(s, n, e)| Ev::Slice(s, n, e)),
        Just(Ev::Reclaim),
    ]
}

fn to_change(e: &Ev) -> Change {
    match e {
        Ev::Reclaim => unreachable!("not a change"),
        Ev::Service(i, a) => Change::Service(name(*i), a.map(|a| spec(*i, a))),
        Ev::Slice(s, n, eps) => Change::Slice(
            SliceName(ObjectKey::new("default", format!("svc-{s}-{n}"))),
            eps.as_ref().map(|eps| slice(*s, eps)),
        ),
    }
}

/// One grace period, as the daemon's reclaimer runs it.
fn reclaim(engine: &mut MapSync<Recording>) {
    if let Some(g) = engine.begin_grace() {
        engine.writer.fence();
        engine.end_grace(g).unwrap();
    }
}

/// Reclaims until nothing is retired any more.
fn settle(engine: &mut MapSync<Recording>) {
    reclaim(engine);
    reclaim(engine);
    assert!(!engine.reclaim_pending());
}

/// Applies one event through the engine, with the allowed sets set for the check.
fn step(desired: &mut DesiredState, engine: &mut MapSync<Recording>, e: &Ev) {
    if let Ev::Reclaim = e {
        reclaim(engine);
        return;
    }
    let affected = desired.apply(to_change(e)).unwrap();
    for svc in affected {
        let want = desired.frontends(&svc);
        let rec = &mut engine.writer;
        rec.allowed.clear();
        for (fk, f) in &want {
            let skey = service_key(fk);
            let mut allowed: HashSet<Backend> = f.backends.iter().map(backend).collect();
            if let Some(v) = rec.services.get(&skey) {
                for slot in 0..v.count {
                    allowed.extend(rec.backends.get(&BackendKey {
                        service: v.id,
                        slot,
                    }));
                }
            }
            rec.allowed.insert(skey, allowed);
        }
        let errors = engine.update(&svc, &want);
        assert!(errors.is_empty(), "{errors:?}");
    }
}

/// The maps hold exactly the desired frontends with exactly their backends.
fn assert_maps_equal_desired(desired: &DesiredState, rec: &Recording) {
    let mut want: BTreeMap<ServiceKey, BTreeSet<Backend>> = BTreeMap::new();
    for svc in desired.service_names() {
        for (k, f) in desired.frontends(svc) {
            want.insert(service_key(&k), f.backends.iter().map(backend).collect());
        }
    }
    let mut got: BTreeMap<ServiceKey, BTreeSet<Backend>> = BTreeMap::new();
    let mut referenced = 0;
    for (k, v) in &rec.services {
        let set: BTreeSet<Backend> = (0..v.count)
            .map(|slot| {
                rec.backends[&BackendKey {
                    service: v.id,
                    slot,
                }]
            })
            .collect();
        assert_eq!(set.len(), v.count as usize, "duplicate backend in {k:?}");
        referenced += v.count as usize;
        got.insert(*k, set);
    }
    assert_eq!(got, want);
    assert_eq!(
        referenced,
        rec.backends.len(),
        "slots beyond a count remain"
    );
    let ids: HashSet<u32> = rec.services.values().map(|v| v.id).collect();
    assert_eq!(ids.len(), rec.services.len(), "two frontends share an id");
    // Source ranges: exactly the desired ones, under each frontend's id.
    let mut want_ranges = BTreeSet::new();
    for svc in desired.service_names() {
        for (k, f) in desired.frontends(svc) {
            let id = rec.services[&service_key(&k)].id;
            want_ranges.extend(f.source_ranges.iter().map(|n| (id, *n)));
        }
    }
    assert_eq!(rec.ranges, want_ranges);
    // Maglev tables: for every packet-level frontend with backends, every entry names one
    // of its slots; nothing else holds chunks.
    let mut want_chunks = BTreeSet::new();
    for v in rec.services.values() {
        if v.flags & SVC_FLAG_MAGLEV != 0 && v.count > 0 {
            for c in 0..(M as usize).div_ceil(MAGLEV_CHUNK) {
                want_chunks.insert(MaglevKey {
                    id: v.id,
                    chunk: c as u32,
                });
            }
        }
    }
    let got_chunks: BTreeSet<MaglevKey> = rec.maglev.keys().copied().collect();
    assert_eq!(got_chunks, want_chunks);
}

fn limits() -> Limits {
    Limits {
        max_services: 64,
        max_backends: 1024,
        maglev: Some(M),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn maps_follow_any_sequence_of_events(events in proptest::collection::vec(ev(), 1..60)) {
        let mut desired = DesiredState::default();
        let mut engine = MapSync::new(Recording::default(), limits());
        for e in &events {
            step(&mut desired, &mut engine, e);
        }
        settle(&mut engine);
        assert_maps_equal_desired(&desired, &engine.writer);
    }

    /// A restart adopts the maps, re-applies the desired state and cleans up: the result
    /// is the desired state, and an unchanged service costs no write at all.
    #[test]
    fn restart_adopts_the_maps(
        before in proptest::collection::vec(ev(), 1..40),
        after in proptest::collection::vec(ev(), 0..10),
    ) {
        let mut desired = DesiredState::default();
        let mut engine = MapSync::new(Recording::default(), limits());
        for e in &before {
            step(&mut desired, &mut engine, e);
        }
        settle(&mut engine);
        let old = engine.writer;
        let mut rec = Recording {
            services: old.services.clone(),
            backends: old.backends.clone(),
            ranges: old.ranges.clone(),
            maglev: old.maglev.clone(),
            ..Recording::default()
        };
        rec.writes = 0;
        let mut restarted = MapSync::new(rec, limits());
        restarted.adopt(
            old.services.into_iter().collect(),
            old.backends.into_iter().collect(),
            old.ranges.iter().copied().collect(),
        );
        let names: Vec<ServiceName> = desired.service_names().cloned().collect();
        for svc in &names {
            let f = desired.frontends(svc);
            assert!(restarted.update(svc, &f).is_empty());
        }
        prop_assert_eq!(restarted.writer.writes, 0);
        restarted.initial_sync_done().unwrap();
        for e in &after {
            step(&mut desired, &mut restarted, e);
        }
        settle(&mut restarted);
        assert_maps_equal_desired(&desired, &restarted.writer);
    }
}

#[test]
fn one_endpoint_change_writes_one_slot_and_nothing_else() {
    let mut desired = DesiredState::default();
    let mut engine = MapSync::new(Recording::default(), limits());
    step(&mut desired, &mut engine, &Ev::Service(2, Some(false)));
    step(
        &mut desired,
        &mut engine,
        &Ev::Slice(2, 0, Some(vec![1, 2, 3])),
    );
    let before = engine.writer.writes;
    // Replace endpoint 2 by 4: one slot rewritten in place, count unchanged.
    step(
        &mut desired,
        &mut engine,
        &Ev::Slice(2, 0, Some(vec![1, 3, 4])),
    );
    assert_eq!(engine.writer.writes - before, 1);
    // Remove endpoint 1: the tail moves into its slot and the count shrinks; the tail goes
    // after a grace period.
    let before = engine.writer.writes;
    step(
        &mut desired,
        &mut engine,
        &Ev::Slice(2, 0, Some(vec![3, 4])),
    );
    assert_eq!(engine.writer.writes - before, 2);
    assert!(engine.reclaim_pending());
    reclaim(&mut engine);
    assert_eq!(engine.writer.writes - before, 3);
    assert!(!engine.reclaim_pending());
}

/// A reader that copied a count before the change finds its slot until a grace period has
/// passed, and a removed frontend's id is not handed to another before then.
#[test]
fn retired_slots_and_ids_wait_for_a_grace_period() {
    let mut desired = DesiredState::default();
    let mut engine = MapSync::new(Recording::default(), limits());
    step(&mut desired, &mut engine, &Ev::Service(2, Some(false)));
    step(
        &mut desired,
        &mut engine,
        &Ev::Slice(2, 0, Some(vec![1, 2, 3])),
    );
    let old = engine.writer.services.values().next().copied().unwrap();
    step(&mut desired, &mut engine, &Ev::Slice(2, 0, Some(vec![1])));
    for slot in 0..old.count {
        assert!(engine.writer.backends.contains_key(&BackendKey {
            service: old.id,
            slot
        }));
    }
    // Removed, and another service created at once: it gets a different id.
    step(&mut desired, &mut engine, &Ev::Service(2, None));
    step(&mut desired, &mut engine, &Ev::Service(4, Some(false)));
    let new = engine.writer.services.values().next().copied().unwrap();
    assert_ne!(new.id, old.id);
    settle(&mut engine);
    assert_maps_equal_desired(&desired, &engine.writer);
    assert_eq!(engine.writer.backends.len(), 0);
}

#[test]
fn a_full_map_refuses_new_frontends_and_keeps_the_others() {
    let mut desired = DesiredState::default();
    let mut engine = MapSync::new(
        Recording::default(),
        Limits {
            max_services: 2,
            max_backends: 1024,
            maglev: None,
        },
    );
    // Even services are ClusterIP: one frontend each.
    for i in [0, 2] {
        step(&mut desired, &mut engine, &Ev::Service(i, Some(false)));
    }
    desired
        .apply(to_change(&Ev::Service(4, Some(false))))
        .unwrap();
    let errors = engine.update(&name(4), &desired.frontends(&name(4)));
    assert!(matches!(
        errors.as_slice(),
        [DataplaneError::Full {
            capacity: Capacity::Services,
            ..
        }]
    ));
    assert_eq!(engine.fill().frontends, 2);
    assert_eq!(engine.writer.services.len(), 2);
    // Freeing one makes room once its id is out of quarantine.
    step(&mut desired, &mut engine, &Ev::Service(0, None));
    assert!(!engine
        .update(&name(4), &desired.frontends(&name(4)))
        .is_empty());
    reclaim(&mut engine);
    assert!(engine
        .update(&name(4), &desired.frontends(&name(4)))
        .is_empty());
    assert_eq!(engine.writer.services.len(), 2);
}

#[test]
fn a_failed_write_is_reported_not_panicked() {
    let mut desired = DesiredState::default();
    let rec = Recording {
        backend_capacity: Some(2),
        ..Recording::default()
    };
    let mut engine = MapSync::new(rec, limits());
    step(&mut desired, &mut engine, &Ev::Service(2, Some(false)));
    desired
        .apply(to_change(&Ev::Slice(2, 0, Some(vec![1, 2, 3]))))
        .unwrap();
    let errors = engine.update(&name(2), &desired.frontends(&name(2)));
    assert!(matches!(errors.as_slice(), [DataplaneError::Write(_)]));
    // The frontend still answers with what it had (no backends: refused), never a hole.
    engine.writer.check_invariant(&MapOp::ResetCounters(0));
}
