//! `proxy run`: source events -> validated model -> desired state -> data path, in
//! batches, with metrics, /healthz, and a clean stop on SIGTERM (the pinned maps and links
//! stay, so traffic keeps flowing while the proxy is down or restarting).

use crate::dataplane::{Dataplane, DataplaneError};
use crate::desired::{Change, DesiredState};
use crate::iptables::Iptables;
use crate::latency;
use crate::loader::{self, attach::Acceleration, fence::Fence, maps::BpfMaps, MapSizes};
use crate::metrics::{self, FrontendCounters, Metrics, Shared};
use crate::model::{ObjectKey, ServiceName, ServiceSpec, SliceName, SliceSpec};
use crate::nodenet::DeviceSelection;
use crate::northsouth;
use crate::sockets::Sweeper;
use crate::source::api::ApiSource;
use crate::source::manifests::ManifestDir;
use crate::source::{Kind, Resource, Source, SourceConfig, SourceError, SourceEvent};
use crate::sync::{Limits, MapSync};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, Notify};

/// Which data path programs the services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ebpf,
    Iptables,
}

/// How packet-level frontends choose a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LbAlgorithm {
    Random,
    /// Maglev consistent hashing with this table size.
    Maglev(u32),
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub mode: Mode,
    pub source: SourceConfig,
    pub cgroup: PathBuf,
    pub bpffs: PathBuf,
    pub metrics: SocketAddr,
    /// Where /healthz and /programmed are served for the API server's pods/proxy.
    pub status: Option<SocketAddr>,
    pub sizes: MapSizes,
    /// The node this proxy runs on: which endpoints are local.
    pub node_name: Option<String>,
    /// Which interfaces get the north-south programs.
    pub devices: DeviceSelection,
    pub acceleration: Acceleration,
    pub lb_algorithm: LbAlgorithm,
    /// Kernel-side debug logging of translation decisions and drops.
    pub bpf_log: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Load(#[from] loader::LoadError),
    #[error("reading the pinned maps: {0}")]
    Maps(#[from] loader::maps::MapsError),
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("kernel log: {0}")]
    KernelLog(std::io::Error),
    #[error("signals: {0}")]
    Signals(std::io::Error),
    #[error("manifests directory {0} does not exist")]
    NoManifests(String),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Net(#[from] crate::nodenet::NetError),
}

/// Max events applied in one batch before the data path is flushed.
const BATCH: usize = 16_384;

pub async fn run(opts: RunOptions) -> Result<(), DaemonError> {
    if let SourceConfig::Manifests(dir) = &opts.source {
        if !dir.is_dir() {
            return Err(DaemonError::NoManifests(dir.display().to_string()));
        }
    }
    match opts.mode {
        Mode::Ebpf => {
            let maglev = match opts.lb_algorithm {
                LbAlgorithm::Maglev(m) => Some(m),
                LbAlgorithm::Random => None,
            };
            let program_options = loader::ProgramOptions {
                maglev_m: maglev.unwrap_or(crate::maglev::DEFAULT_SIZE),
                bpf_log: opts.bpf_log,
            };
            let loader::Loaded {
                maps,
                attach,
                programs,
                fence,
                udp_destroyer,
                kernel_log,
            } = loader::load(&opts.bpffs, &opts.cgroup, opts.sizes, program_options)?;
            if let Some(log) = kernel_log {
                loader::bpflog::spawn(log).map_err(DaemonError::KernelLog)?;
                tracing::info!("kernel log on (--bpf-log)");
            }
            let services = maps.services()?;
            let backends = maps.backends()?;
            let ranges = maps.source_ranges()?;
            tracing::info!(
                ?attach,
                cgroup = %opts.cgroup.display(),
                bpffs = %opts.bpffs.display(),
                adopted_frontends = services.len(),
                "eBPF programs attached"
            );
            let mut engine = MapSync::new(
                maps,
                Limits {
                    max_services: opts.sizes.services,
                    max_backends: opts.sizes.backends,
                    maglev,
                },
            );
            engine.adopt(services, backends, ranges);
            let engine = Arc::new(Mutex::new(engine));
            let reader = engine.clone();
            let kernel: metrics::KernelCounters = Box::new(move || {
                let engine = reader.lock().unwrap_or_else(|p| p.into_inner());
                engine
                    .frontends()
                    .filter_map(|(svc, key, id)| {
                        let c = engine.writer().counters(id).ok()?;
                        Some(FrontendCounters {
                            service: svc.to_string(),
                            frontend: key.to_string(),
                            counters: c,
                        })
                    })
                    .collect()
            });
            let sweeper = udp_destroyer.and_then(|d| {
                Sweeper::start(d, opts.cgroup.clone())
                    .map_err(|e| tracing::error!(error = %e, "starting the UDP socket sweeper"))
                    .ok()
            });
            let shared = Arc::new(Shared::new(Some(kernel)));
            let (retry_tx, retry_rx) = mpsc::channel(1);
            let after = spawn_reclaimer(engine.clone(), fence, shared.clone(), retry_tx);
            let hooks = EbpfHooks {
                engine: engine.clone(),
                reclaim: after,
                sweeper,
            };
            let packets = northsouth::Packets {
                engine: engine.clone(),
                programs,
                devices: opts.devices.clone(),
                acceleration: opts.acceleration,
            };
            let ns = northsouth::start(Some(packets), shared.clone(), opts.sizes.ct)?;
            serve(opts, engine, shared, Some(Box::new(hooks)), retry_rx, ns).await
        }
        Mode::Iptables => {
            let (_retry_tx, retry_rx) = mpsc::channel(1);
            let shared = Arc::new(Shared::new(None));
            let ns = northsouth::start(None, shared.clone(), 0)?;
            serve(
                opts,
                Arc::new(Mutex::new(Iptables::new())),
                shared,
                None,
                retry_rx,
                ns,
            )
            .await
        }
    }
}

/// What the eBPF data path does after each batch: hand removed UDP backends to the
/// sweeper, and wake the reclaimer.
struct EbpfHooks {
    engine: Arc<Mutex<MapSync<BpfMaps>>>,
    reclaim: Arc<Notify>,
    sweeper: Option<Sweeper>,
}

trait AfterBatch: Send {
    fn after_batch(&self);
}

impl AfterBatch for EbpfHooks {
    fn after_batch(&self) {
        let removed = {
            let mut engine = self.engine.lock().unwrap_or_else(|p| p.into_inner());
            engine.take_removed_udp()
        };
        if let Some(s) = &self.sweeper {
            s.removed(removed);
        }
        self.reclaim.notify_one();
    }
}

/// Reclaims retired slots and ids after grace periods, off the event loop: a grace period
/// (an RCU synchronisation in the kernel) takes milliseconds, and nothing waits for it but
/// the reuse of what it frees. When ids were freed, services that found the map full are
/// tried again.
fn spawn_reclaimer(
    engine: Arc<Mutex<MapSync<BpfMaps>>>,
    fence: Fence,
    shared: Arc<Shared>,
    retry: mpsc::Sender<()>,
) -> Arc<Notify> {
    let notify = Arc::new(Notify::new());
    let wake = notify.clone();
    let fence = Arc::new(fence);
    tokio::spawn(async move {
        loop {
            wake.notified().await;
            loop {
                let grace = engine
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .begin_grace();
                let Some(g) = grace else { break };
                let f = fence.clone();
                match tokio::task::spawn_blocking(move || f.wait()).await {
                    Ok(Ok(took)) => shared.metrics.grace_period.observe(took.as_secs_f64()),
                    other => {
                        // Without a grace period nothing may be reclaimed: keep it retired.
                        tracing::error!(result = ?other.map(|r| r.map(|_| ())), "grace period failed; retrying later");
                        shared.metrics.error("grace_period");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                }
                let done = engine
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .end_grace(g);
                match done {
                    Ok(r) => {
                        shared.metrics.reclaimed.inc_by(r.slots as u64);
                        if r.ids > 0 {
                            let _ = retry.try_send(());
                        }
                    }
                    Err(e) => {
                        shared.metrics.error(e.kind());
                        tracing::error!(error = %e, "reclaiming retired slots");
                    }
                }
            }
        }
    });
    notify
}

async fn serve<D: Dataplane + Send + 'static>(
    opts: RunOptions,
    dataplane: Arc<Mutex<D>>,
    shared: Arc<Shared>,
    hooks: Option<Box<dyn AfterBatch>>,
    mut retry: mpsc::Receiver<()>,
    (north_south, north_south_task): (
        mpsc::UnboundedSender<northsouth::ServiceUpdate>,
        tokio::task::JoinHandle<()>,
    ),
) -> Result<(), DaemonError> {
    if opts.mode == Mode::Ebpf {
        shared
            .metrics
            .set_fill("services", 0, Some(opts.sizes.services as u64));
        shared
            .metrics
            .set_fill("backends", 0, Some(opts.sizes.backends as u64));
    }
    let bound = metrics::serve(opts.metrics, shared.clone())
        .await
        .map_err(|source| DaemonError::Metrics {
            addr: opts.metrics,
            source,
        })?;
    tracing::info!(addr = %bound, "metrics and /healthz listening");
    if let Some(addr) = opts.status {
        let bound = metrics::serve_status(addr, shared.clone(), opts.node_name.clone())
            .await
            .map_err(|source| DaemonError::Metrics { addr, source })?;
        tracing::info!(addr = %bound, "/healthz and /programmed listening");
    }

    let (tx, mut rx) = mpsc::channel(4096);
    let source_task = match &opts.source {
        SourceConfig::Manifests(dir) => spawn_source(ManifestDir::new(dir), tx),
        SourceConfig::Api(config) => spawn_source(ApiSource::connect(config).await?, tx),
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let mut desired = DesiredState::for_node(opts.node_name.clone());
    // Services changed since they were last programmed (all of them until the first sync).
    let mut affected: HashSet<ServiceName> = HashSet::new();
    let mut initial_done = false;
    let started = Instant::now();
    let mut triggers = latency::Pending::new(SystemTime::now());
    // Services a full map kept from being programmed; tried again when room is freed.
    let mut unprogrammed: HashSet<ServiceName> = HashSet::new();
    loop {
        let first = tokio::select! {
            _ = sigterm.recv() => { tracing::info!("SIGTERM: stopping; pinned state stays in force"); break }
            _ = sigint.recv() => { tracing::info!("SIGINT: stopping; pinned state stays in force"); break }
            Some(()) = retry.recv() => {
                affected.extend(unprogrammed.drain());
                None
            }
            ev = rx.recv() => match ev {
                Some(ev) => Some(ev),
                None => { tracing::error!("the source ended; stopping"); break }
            },
        };
        let t0 = Instant::now();
        let mut batch: Vec<SourceEvent> = first.into_iter().collect();
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(ev) => batch.push(ev),
                Err(_) => break,
            }
        }
        let n = batch.len();
        // The data path's own lock: the scrape reads counters through it.
        let mut dp = dataplane.lock().unwrap_or_else(|p| p.into_inner());
        let mut synced = false;
        for ev in batch {
            shared.metrics.events.inc();
            if matches!(ev, SourceEvent::Synced) {
                synced = true;
                continue;
            }
            let trigger = match &ev {
                SourceEvent::Apply(Resource::EndpointSlice(s)) => latency::trigger_time(s),
                _ => None,
            };
            let changed = handle(ev, &mut desired, &shared.metrics, initial_done);
            if let Some(t) = trigger.filter(|_| !changed.is_empty()) {
                triggers.record(t);
            }
            affected.extend(changed);
        }
        // Until the source has listed everything the data path is left alone: a service
        // seen before its slices must not be programmed empty (refusing connections that
        // a previous run routes fine).
        // Services written in this batch, with what they were written with.
        let mut written = Vec::new();
        if initial_done || synced {
            for svc in std::mem::take(&mut affected) {
                let _ = north_south.send(northsouth::ServiceUpdate {
                    health_check: desired.health_check(&svc),
                    announced: desired.announced(&svc),
                    service: svc.clone(),
                });
                let frontends = desired.frontends(&svc);
                let errors = dp.update(&svc, &frontends);
                let complete = errors.is_empty();
                for e in errors {
                    shared.metrics.error(e.kind());
                    if matches!(e, DataplaneError::Full { .. }) {
                        unprogrammed.insert(svc.clone());
                    }
                    tracing::error!(service = %svc, error = %e, "service not fully programmed");
                }
                if complete {
                    written.push((svc, frontends));
                }
            }
        }
        if synced && !initial_done {
            initial_done = true;
            // Checked once the listing is complete: files come in any order.
            for (slice, service) in desired.orphan_slices() {
                shared.metrics.input_error("missing_service");
                tracing::warn!(%slice, %service, "endpoint slice for a missing service; kept until the service appears");
            }
            if let Err(e) = dp.initial_sync_done() {
                shared.metrics.error(e.kind());
                tracing::error!(error = %e, "cleaning up after the initial sync");
            }
        }
        match dp.flush() {
            Ok(()) => {
                let now = SystemTime::now();
                let mut programmed = shared.programmed.lock().unwrap_or_else(|p| p.into_inner());
                for (svc, frontends) in &written {
                    programmed.record(svc, frontends, now);
                }
            }
            Err(e) => {
                shared.metrics.error(e.kind());
                tracing::error!(error = %e, "writing the data path");
            }
        }
        if initial_done {
            for seconds in triggers.drain(SystemTime::now()) {
                shared.metrics.network_programming.observe(seconds);
            }
        }
        let fill = dp.fill();
        drop(dp);
        if let Some(h) = &hooks {
            h.after_batch();
        }
        let took = t0.elapsed();
        shared.metrics.sync_duration.observe(took.as_secs_f64());
        shared.metrics.services.set(desired.service_count() as i64);
        shared.metrics.set_fill("services", fill.frontends, None);
        shared.metrics.set_fill("backends", fill.backends, None);
        tracing::debug!(
            events = n,
            took_us = took.as_micros() as u64,
            "batch applied"
        );
        if synced {
            shared.ready.store(true, Ordering::Relaxed);
            tracing::info!(
                services = desired.service_count(),
                frontends = fill.frontends,
                backends = fill.backends,
                took_ms = started.elapsed().as_millis() as u64,
                "initial sync done"
            );
        }
    }
    source_task.abort();
    // The node-level task withdraws the addresses it announced before the process ends.
    drop(north_south);
    let _ = north_south_task.await;
    Ok(())
}

fn spawn_source<S: Source>(
    source: S,
    tx: mpsc::Sender<SourceEvent>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = source.run(tx).await {
            tracing::error!(error = %e, "source stopped");
        }
    })
}

/// One source event through validation into the desired state; returns the services it
/// affects. Bad input is logged and counted and changes nothing.
fn handle(
    ev: SourceEvent,
    desired: &mut DesiredState,
    m: &Metrics,
    listed: bool,
) -> Vec<ServiceName> {
    let change = match ev {
        SourceEvent::Synced => return Vec::new(),
        SourceEvent::Rejected { origin, error } => {
            m.input_error(error.reason());
            tracing::warn!(%origin, reason = error.reason(), %error, "input rejected");
            return Vec::new();
        }
        SourceEvent::Delete(r) => match r.kind {
            Kind::Service => Change::Service(ServiceName(r.key), None),
            Kind::EndpointSlice => Change::Slice(SliceName(r.key), None),
        },
        SourceEvent::Apply(Resource::Service(svc)) => match ServiceSpec::from_k8s(&svc) {
            Ok(Some((name, spec))) => Change::Service(name, Some(spec)),
            // A service that is not proxied (headless, ExternalName): make sure it is not.
            Ok(None) => Change::Service(ServiceName(key_of(&svc.metadata)), None),
            Err(error) => {
                m.input_error("invalid");
                tracing::warn!(service = %key_of(&svc.metadata), %error, "service rejected; its programmed state is kept");
                return Vec::new();
            }
        },
        SourceEvent::Apply(Resource::EndpointSlice(slice)) => match SliceSpec::from_k8s(&slice) {
            Ok(Some((name, spec))) => {
                if listed && !desired.has_service(&spec.service) {
                    m.input_error("missing_service");
                    tracing::warn!(slice = %name, service = %spec.service, "endpoint slice for a missing service; kept until the service appears");
                }
                Change::Slice(name, Some(spec))
            }
            Ok(None) => Change::Slice(SliceName(key_of(&slice.metadata)), None),
            Err(error) => {
                m.input_error("invalid");
                tracing::warn!(slice = %key_of(&slice.metadata), %error, "endpoint slice rejected; its programmed state is kept");
                return Vec::new();
            }
        },
    };
    match desired.apply(change) {
        Ok(affected) => affected,
        Err(rejection) => {
            m.input_error("duplicate");
            tracing::warn!(error = %rejection, "change rejected");
            Vec::new()
        }
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}
