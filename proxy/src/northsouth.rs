//! The node-level side of north-south traffic, beside the service maps: the node's
//! addresses and interfaces followed through netlink (into `SKIFF_NODE_ADDRS` and
//! `SKIFF_DEVICES`, with the tc/XDP programs attached to each node interface), the
//! LoadBalancer addresses this node announces (held on its loopback, so the kernel answers
//! ARP for them), the health check node ports it serves, and the connection-tracking
//! collector (expired flows removed, fill level and drops as metrics).

use crate::desired::HealthCheck;
use crate::healthcheck::{Check, HealthChecks};
use crate::loader::attach::Acceleration;
use crate::loader::maps::BpfMaps;
use crate::loader::Programs;
use crate::metrics::Shared;
use crate::model::ServiceName;
use crate::nodenet::{self, DeviceSelection, Snapshot};
use crate::sync::MapSync;
use proxy_common::{CT_FLAG_CLOSING, PROTO_TCP};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What the event loop reports per changed service.
#[derive(Debug)]
pub struct ServiceUpdate {
    pub service: ServiceName,
    pub health_check: Option<HealthCheck>,
    pub announced: Vec<Ipv4Addr>,
}

/// The eBPF parts: where node addresses and devices go, and the programs to attach.
pub struct Packets {
    pub engine: Arc<Mutex<MapSync<BpfMaps>>>,
    pub programs: Programs,
    pub devices: DeviceSelection,
    pub acceleration: Acceleration,
}

/// Connection-tracking timeouts (seconds since the last packet), as Cilium's defaults.
const CT_TCP_S: u32 = 21_600;
const CT_CLOSING_S: u32 = 10;
const CT_OTHER_S: u32 = 60;
/// How often expired flows are collected.
const CT_GC_EVERY: Duration = Duration::from_secs(5);

/// Starts the task; updates go into the returned sender. Dropping it ends the task, which
/// first withdraws the announced addresses (await the handle).
pub fn start(
    packets: Option<Packets>,
    shared: Arc<Shared>,
    ct_capacity: u32,
) -> Result<
    (
        mpsc::UnboundedSender<ServiceUpdate>,
        tokio::task::JoinHandle<()>,
    ),
    nodenet::NetError,
> {
    let (handle, mut changes) = nodenet::connect()?;
    let (tx, mut rx) = mpsc::unbounded_channel::<ServiceUpdate>();
    let mut task = Task {
        handle,
        packets,
        shared: shared.clone(),
        health: HealthChecks::new(shared.clone()),
        checks: HashMap::new(),
        announced: BTreeMap::new(),
        held: BTreeSet::new(),
        attached: BTreeSet::new(),
        snapshot: Snapshot::default(),
    };
    let join = tokio::spawn(async move {
        task.refresh().await;
        // Failures were logged and counted; later changes of the interfaces retry.
        task.shared
            .network_read
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut gc = tokio::time::interval(CT_GC_EVERY);
        loop {
            tokio::select! {
                u = rx.recv() => {
                    let Some(u) = u else { break };
                    let mut batch = vec![u];
                    while let Ok(u) = rx.try_recv() {
                        batch.push(u);
                    }
                    task.apply(batch).await;
                }
                Some(()) = changes.recv() => task.refresh().await,
                _ = gc.tick() => task.collect(ct_capacity),
            }
        }
        task.release().await;
    });
    Ok((tx, join))
}

struct Task {
    handle: rtnetlink::Handle,
    packets: Option<Packets>,
    shared: Arc<Shared>,
    health: HealthChecks,
    checks: HashMap<u16, Check>,
    announced: BTreeMap<ServiceName, Vec<Ipv4Addr>>,
    /// LoadBalancer addresses on the loopback now.
    held: BTreeSet<Ipv4Addr>,
    attached: BTreeSet<u32>,
    snapshot: Snapshot,
}

impl Task {
    async fn apply(&mut self, batch: Vec<ServiceUpdate>) {
        for u in batch {
            self.checks.retain(|_, c| c.service != u.service);
            if let Some(h) = u.health_check {
                self.checks.insert(
                    h.port.get(),
                    Check {
                        service: u.service.clone(),
                        local_endpoints: h.local_endpoints,
                    },
                );
            }
            if u.announced.is_empty() {
                self.announced.remove(&u.service);
            } else {
                self.announced.insert(u.service, u.announced);
            }
        }
        for (port, e) in self.health.sync(&self.checks).await {
            self.shared.metrics.error("health_check_port");
            tracing::error!(port, error = %e, "cannot serve a health check node port");
        }
        self.announce().await;
    }

    /// Holds exactly the announced addresses on the loopback.
    async fn announce(&mut self) {
        let want: BTreeSet<Ipv4Addr> = self.announced.values().flatten().copied().collect();
        let Some(lo) = self
            .snapshot
            .links
            .values()
            .find(|l| l.loopback)
            .map(|l| l.index)
        else {
            return;
        };
        for ip in want.difference(&self.held).copied().collect::<Vec<_>>() {
            match nodenet::add_local(&self.handle, lo, ip).await {
                Ok(()) => {
                    tracing::info!(%ip, "announcing a LoadBalancer address");
                    self.held.insert(ip);
                }
                Err(e) => {
                    self.shared.metrics.error("announce");
                    tracing::error!(%ip, error = %e, "cannot announce a LoadBalancer address");
                }
            }
        }
        for ip in self.held.difference(&want).copied().collect::<Vec<_>>() {
            match nodenet::remove_local(&self.handle, lo, ip).await {
                Ok(()) => {
                    tracing::info!(%ip, "no longer announcing a LoadBalancer address");
                    self.held.remove(&ip);
                }
                Err(e) => {
                    tracing::error!(%ip, error = %e, "cannot withdraw a LoadBalancer address")
                }
            }
        }
    }

    /// Re-reads links and addresses: node addresses and devices into the maps, programs
    /// attached to new node interfaces and detached from gone ones.
    async fn refresh(&mut self) {
        match nodenet::snapshot(&self.handle).await {
            Ok(s) => self.snapshot = s,
            Err(e) => {
                tracing::error!(error = %e, "reading the node's interfaces");
                return;
            }
        }
        // The loopback may have appeared (first read): hold what is announced.
        self.announce().await;
        let Some(p) = &mut self.packets else { return };
        let addrs = self.snapshot.node_addresses(&self.held);
        let devices = self.snapshot.devices(&p.devices);
        {
            let mut engine = p.engine.lock().unwrap_or_else(|e| e.into_inner());
            let w = engine.writer_mut();
            if let Err(e) = w.set_node_addrs(&addrs) {
                tracing::error!(error = %e, "writing the node addresses");
            }
            let devs: Vec<(u32, Ipv4Addr)> = devices.iter().map(|d| (d.index, d.addr)).collect();
            if let Err(e) = w.set_devices(&devs) {
                tracing::error!(error = %e, "writing the node interfaces");
            }
        }
        let now: BTreeSet<u32> = devices.iter().map(|d| d.index).collect();
        for d in &devices {
            if self.attached.contains(&d.index) {
                continue;
            }
            match p.programs.attach(d.index, &d.name, p.acceleration) {
                Ok(()) => {
                    tracing::info!(device = %d.name, addr = %d.addr, acceleration = ?p.acceleration, "north-south programs attached");
                    self.attached.insert(d.index);
                }
                Err(e) => {
                    self.shared.metrics.error("attach");
                    tracing::error!(device = %d.name, error = %e, "cannot attach the north-south programs");
                }
            }
        }
        // Also interfaces a previous run attached to that are no longer node interfaces.
        for i in p.programs.attached() {
            if !now.contains(&i) {
                p.programs.detach(i);
                self.attached.remove(&i);
                tracing::info!(ifindex = i, "north-south programs detached");
            }
        }
        tracing::debug!(
            addresses = addrs.len(),
            devices = devices.len(),
            "node network read"
        );
    }

    /// Removes expired flows and reports the tracking map's fill and the drops.
    fn collect(&mut self, capacity: u32) {
        let Some(p) = &self.packets else { return };
        let now = monotonic_s();
        let mut engine = p.engine.lock().unwrap_or_else(|e| e.into_inner());
        let w = engine.writer_mut();
        let entries = match w.ct_entries() {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "reading the connection-tracking map");
                return;
            }
        };
        let mut live = 0u64;
        for (k, v) in entries {
            let timeout = if v.flags & CT_FLAG_CLOSING != 0 {
                CT_CLOSING_S
            } else if k.proto == PROTO_TCP {
                CT_TCP_S
            } else {
                CT_OTHER_S
            };
            if now.saturating_sub(v.last_seen_s) > timeout {
                let _ = w.ct_remove(&k);
            } else {
                live += 1;
            }
        }
        self.shared
            .metrics
            .set_fill("conntrack", live, Some(capacity as u64));
        for (i, reason) in ["ct_full", "snat_ports", "no_device", "no_route"]
            .iter()
            .enumerate()
        {
            if let Ok(n) = w.drops(i as u32) {
                self.shared.metrics.set_drops(reason, n);
            }
        }
    }

    /// On exit: the announced addresses go (another node takes them over).
    async fn release(&mut self) {
        self.announced.clear();
        self.announce().await;
    }
}

/// Seconds of CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`.
fn monotonic_s() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u32
}
