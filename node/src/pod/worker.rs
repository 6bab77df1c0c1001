//! The pod-level state machine. One task per pod walks it:
//!
//! ```text
//! Admitted ──(sandbox found: adopt)──────────────────────────────┐
//!    │                                                            ▼
//!    └─> MountingVolumes ─> CreatingSandbox ─> Initializing ─> Running ─> Completed
//!          (FailedMount       (FailedCreate      (init            (probes,     (restartPolicy
//!           back-off)          back-off)          containers       restarts)    says no more)
//!                                                 in order)
//! any state ── deletionTimestamp ──> Terminating ──> Terminated
//! ```
//!
//! Each state is a variant holding exactly the data valid in it (the sandbox exists from
//! Initializing on); each step makes one transition, which is logged.

use super::backoff::BackOff;
use super::container::{grace_period, ContainerWorker, PodEnv, RestartPolicy};
use super::env::PodFacts;
use super::events::{PodEvent, Reason};
use super::spec::{self, ContainerKind};
use super::status::{self, Inputs};
use super::volumes::{self, Volumes};
use super::{NodeContext, PodHandle, PodRef};
use crate::cri;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateWaiting, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tracing::{info, warn};

/// How long after a failed token renewal the next attempt is made (the token in place is
/// still valid: renewal starts at 80% of its life).
const TOKEN_RETRY: Duration = Duration::from_secs(10);

/// Starts pod workers.
pub struct PodWorker;

impl PodWorker {
    /// Spawns the worker for `pod`. Send newer versions through the handle; one with
    /// deletionTimestamp set terminates the pod. Dropping the handle's sender detaches the
    /// worker and leaves the pod running (the agent is stopping).
    pub fn spawn(ctx: Arc<NodeContext>, pod: Pod) -> PodHandle {
        let (tx, rx) = watch::channel(pod);
        let task = tokio::spawn(run(ctx, rx));
        PodHandle { pod: tx, task }
    }
}

/// The sandbox of a pod that has one.
struct Sandbox {
    id: String,
    config: cri::PodSandboxConfig,
    ip: String,
}

/// A pod with a sandbox: its volumes and containers.
struct PodRuntime {
    sandbox: Sandbox,
    volumes: Volumes,
    inits: Vec<ContainerWorker>,
    apps: Vec<ContainerWorker>,
    /// `kubectl debug`'s containers, in the order the pod's spec added them.
    ephemerals: Vec<ContainerWorker>,
    sandbox_stopped: bool,
    /// The pod's CSI volumes were unpublished (it completed: nothing will run again).
    csi_released: bool,
}

enum State {
    Admitted,
    MountingVolumes { backoff: BackOff },
    CreatingSandbox { volumes: Volumes, backoff: BackOff },
    Initializing(PodRuntime),
    Running(PodRuntime),
    Completed(PodRuntime),
    Terminating(Option<PodRuntime>),
    Terminated,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Admitted => "Admitted",
            State::MountingVolumes { .. } => "MountingVolumes",
            State::CreatingSandbox { .. } => "CreatingSandbox",
            State::Initializing(_) => "Initializing",
            State::Running(_) => "Running",
            State::Completed(_) => "Completed",
            State::Terminating(_) => "Terminating",
            State::Terminated => "Terminated",
        }
    }
}

struct Worker {
    ctx: Arc<NodeContext>,
    pods: watch::Receiver<Pod>,
    pod: Pod,
    pod_ref: PodRef,
    /// The agent dropped this worker's sender: it is going away. Stop driving the pod and
    /// leave it running, for the next agent to adopt.
    detached: bool,
    start_time: Time,
    last_status: Option<PodStatus>,
}

async fn run(ctx: Arc<NodeContext>, mut pods: watch::Receiver<Pod>) {
    let pod = pods.borrow_and_update().clone();
    let start_time = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .unwrap_or_else(super::now);
    let mut w = Worker {
        pod_ref: PodRef::of(&pod),
        ctx,
        pods,
        pod,
        detached: false,
        start_time,
        last_status: None,
    };
    let mut state = State::Admitted;
    info!(pod = %w.pod_ref, uid = %w.pod_ref.uid, "pod worker started");
    loop {
        let from = state.name();
        state = w.step(state).await;
        if w.detached {
            info!(pod = %w.pod_ref, state = state.name(), "pod worker detached; the pod keeps running");
            break;
        }
        if state.name() != from {
            info!(pod = %w.pod_ref, from, to = state.name(), "pod transition");
        }
        if let State::Terminated = state {
            break;
        }
    }
}

impl Worker {
    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }

    fn event(&self, reason: Reason, message: String) {
        self.ctx.reporter.event(
            &self.pod_ref,
            PodEvent {
                reason,
                message,
                field_path: None,
            },
        );
    }

    /// Sleeps up to `d`, waking early when a newer Pod arrives.
    async fn wait(&mut self, d: Duration) {
        if d.is_zero() || self.detached {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            changed = self.pods.changed() => match changed {
                Ok(()) => self.pod = self.pods.borrow_and_update().clone(),
                Err(_) => self.detached = true,
            },
        }
    }

    async fn step(&mut self, state: State) -> State {
        if self.deleting() && !matches!(state, State::Terminating(_) | State::Terminated) {
            return State::Terminating(match state {
                State::Initializing(rt) | State::Running(rt) | State::Completed(rt) => Some(rt),
                _ => None,
            });
        }
        match state {
            State::Admitted => self.admitted().await,
            State::MountingVolumes { backoff } => self.mount_volumes(backoff).await,
            State::CreatingSandbox { volumes, backoff } => {
                self.create_sandbox(volumes, backoff).await
            }
            State::Initializing(rt) => self.initialize(rt).await,
            State::Running(rt) => self.running(rt).await,
            State::Completed(rt) => self.completed(rt).await,
            State::Terminating(rt) => self.terminate(rt).await,
            State::Terminated => State::Terminated,
        }
    }

    fn facts<'a>(&'a self, pod_ip: &'a str) -> PodFacts<'a> {
        PodFacts {
            pod: &self.pod,
            pod_ip,
            host_ip: self.ctx.host_ip.as_deref().unwrap_or_default(),
            node_name: self.ctx.node.as_str(),
        }
    }

    fn containers(&self, kind: ContainerKind) -> Vec<k8s_openapi::api::core::v1::Container> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        match kind {
            ContainerKind::Init => spec.init_containers.unwrap_or_default(),
            ContainerKind::App => spec.containers,
            ContainerKind::Ephemeral => spec::ephemeral_containers(&self.pod)
                .into_iter()
                .map(|(c, _)| c)
                .collect(),
        }
    }

    /// A pod the runtime already runs (the agent restarted) is adopted as it is.
    async fn admitted(&mut self) -> State {
        let cri = self.ctx.cri.clone();
        let labels = HashMap::from([(spec::POD_UID.to_string(), self.pod_ref.uid.clone())]);
        let sandboxes = match cri.list_pod_sandboxes(labels).await {
            Ok(s) => s,
            Err(e) => {
                warn!(pod = %self.pod_ref, error = %e, "listing sandboxes failed; retrying");
                self.wait(self.ctx.timing.sync_interval).await;
                return State::Admitted;
            }
        };
        let ready = cri::PodSandboxState::SandboxReady as i32;
        let (live, dead): (Vec<_>, Vec<_>) = sandboxes.into_iter().partition(|s| s.state == ready);
        for s in dead.iter().chain(live.iter().skip(1)) {
            let _ = cri.stop_pod_sandbox(&s.id).await;
            let _ = cri.remove_pod_sandbox(&s.id).await;
        }
        let Some(found) = live.into_iter().next() else {
            return State::MountingVolumes {
                backoff: BackOff::default(),
            };
        };
        match self.adopt(found).await {
            Ok(rt) => {
                info!(pod = %self.pod_ref, sandbox = %rt.sandbox.id, "adopted running pod");
                if rt.inits.iter().all(ContainerWorker::succeeded) {
                    State::Running(rt)
                } else {
                    State::Initializing(rt)
                }
            }
            Err(e) => {
                warn!(pod = %self.pod_ref, error = %e, "adopting the pod's sandbox failed; retrying");
                self.wait(self.ctx.timing.sync_interval).await;
                State::Admitted
            }
        }
    }

    async fn adopt(&mut self, found: cri::PodSandbox) -> Result<PodRuntime, crate::cri::CriError> {
        let cri = &self.ctx.cri;
        let st = cri.pod_sandbox_status(&found.id).await?;
        let ip = self.sandbox_ip(st.network.map(|n| n.ip).unwrap_or_default());
        let attempt = found.metadata.as_ref().map_or(0, |m| m.attempt);
        let config = spec::sandbox_config(&self.pod, &self.ctx, attempt);
        let volumes = match volumes::prepare(
            &self.facts(&ip),
            &self.ctx.layout,
            self.ctx.objects.as_ref(),
            self.ctx.csi.as_deref(),
        )
        .await
        {
            Ok(v) => v,
            Err(e) => {
                warn!(pod = %self.pod_ref, error = %e, "volumes of an adopted pod");
                Volumes::default()
            }
        };
        let mut statuses: HashMap<(String, String), Vec<cri::ContainerStatus>> = HashMap::new();
        for c in cri.list_containers(Some(&found.id)).await? {
            let s = cri.container_status(&c.id).await?;
            let key = (
                s.labels
                    .get(spec::CONTAINER_KIND)
                    .cloned()
                    .unwrap_or_else(|| "app".into()),
                s.labels
                    .get(spec::CONTAINER_NAME)
                    .cloned()
                    .unwrap_or_default(),
            );
            statuses.entry(key).or_default().push(s);
        }
        let mut adopt = |kind: ContainerKind,
                         specs: Vec<k8s_openapi::api::core::v1::Container>|
         -> Vec<ContainerWorker> {
            specs
                .into_iter()
                .map(|c| {
                    let found = statuses
                        .remove(&(kind.as_str().to_string(), c.name.clone()))
                        .unwrap_or_default();
                    ContainerWorker::adopt(kind, c, found)
                })
                .collect()
        };
        let inits = adopt(ContainerKind::Init, self.containers(ContainerKind::Init));
        let apps = adopt(ContainerKind::App, self.containers(ContainerKind::App));
        // Ephemeral containers the runtime has; those it lacks start on the next round.
        let ephemerals = self
            .containers(ContainerKind::Ephemeral)
            .into_iter()
            .filter_map(|c| {
                let found = statuses.remove(&(
                    ContainerKind::Ephemeral.as_str().to_string(),
                    c.name.clone(),
                ))?;
                Some(ContainerWorker::adopt(ContainerKind::Ephemeral, c, found))
            })
            .collect();
        let mut inits = inits;
        // Init containers the runtime no longer has but whose apps run were done already.
        if apps.iter().any(|a| a.current_id().is_some()) {
            for i in inits.iter_mut().filter(|i| i.current_id().is_none()) {
                i.state = super::container::State::Exited(super::container::Exited {
                    id: String::new(),
                    exit_code: 0,
                    reason: "Completed".into(),
                    message: String::new(),
                    started_at: None,
                    finished_at: None,
                    ran: Duration::ZERO,
                });
            }
        }
        Ok(PodRuntime {
            sandbox: Sandbox {
                id: found.id,
                config,
                ip,
            },
            volumes,
            inits,
            apps,
            ephemerals,
            sandbox_stopped: false,
            csi_released: false,
        })
    }

    fn sandbox_ip(&self, cni_ip: String) -> String {
        if spec::host_network(&self.pod) {
            self.ctx.host_ip.clone().unwrap_or_default()
        } else {
            cni_ip
        }
    }

    async fn mount_volumes(&mut self, mut backoff: BackOff) -> State {
        self.report_pending();
        match volumes::prepare(
            &self.facts(""),
            &self.ctx.layout,
            self.ctx.objects.as_ref(),
            self.ctx.csi.as_deref(),
        )
        .await
        {
            Ok(volumes) => State::CreatingSandbox {
                volumes,
                backoff: BackOff::default(),
            },
            Err(e) => {
                self.event(Reason::FailedMount, e.to_string());
                let delay = backoff.next_pull(&self.ctx.timing.image_backoff);
                self.wait(delay).await;
                State::MountingVolumes { backoff }
            }
        }
    }

    async fn create_sandbox(&mut self, volumes: Volumes, mut backoff: BackOff) -> State {
        let cri = self.ctx.cri.clone();
        let config = spec::sandbox_config(&self.pod, &self.ctx, 0);
        let log_dir = std::path::PathBuf::from(&config.log_directory);
        let _ = std::fs::create_dir_all(&log_dir);
        let result = async {
            let id = cri.run_pod_sandbox(config.clone()).await?;
            let status = cri.pod_sandbox_status(&id).await?;
            Ok::<_, crate::cri::CriError>((id, status.network.map(|n| n.ip).unwrap_or_default()))
        }
        .await;
        match result {
            Ok((id, ip)) => {
                let ip = self.sandbox_ip(ip);
                let inits = self
                    .containers(ContainerKind::Init)
                    .into_iter()
                    .map(|c| ContainerWorker::new(ContainerKind::Init, c))
                    .collect();
                let apps = self
                    .containers(ContainerKind::App)
                    .into_iter()
                    .map(|c| ContainerWorker::new(ContainerKind::App, c))
                    .collect();
                State::Initializing(PodRuntime {
                    sandbox: Sandbox { id, config, ip },
                    volumes,
                    inits,
                    apps,
                    ephemerals: Vec::new(),
                    sandbox_stopped: false,
                    csi_released: false,
                })
            }
            Err(e) => {
                self.event(
                    Reason::FailedCreatePodSandBox,
                    format!("Failed to create pod sandbox: {}", e.message()),
                );
                let delay = backoff.next_pull(&self.ctx.timing.image_backoff);
                self.wait(delay).await;
                State::CreatingSandbox { volumes, backoff }
            }
        }
    }

    async fn initialize(&mut self, mut rt: PodRuntime) -> State {
        self.renew_tokens(&mut rt).await;
        let policy = RestartPolicy::of(&self.pod);
        let Some(i) = rt.inits.iter().position(|c| !c.succeeded()) else {
            self.report(&rt);
            return State::Running(rt);
        };
        {
            let env = self.env(&rt.sandbox, &rt.volumes);
            rt.inits[i].step(&env, policy).await;
        }
        self.report(&rt);
        if rt.inits[i].finished(policy) && !rt.inits[i].succeeded() {
            return State::Completed(rt);
        }
        if rt.inits[i].succeeded() {
            return State::Initializing(rt);
        }
        let due = rt.inits[i].next_due();
        self.wait(self.until(due)).await;
        State::Initializing(rt)
    }

    async fn running(&mut self, mut rt: PodRuntime) -> State {
        self.renew_tokens(&mut rt).await;
        let policy = RestartPolicy::of(&self.pod);
        {
            let env = PodEnv {
                ctx: &self.ctx,
                pod: &self.pod,
                pod_ref: &self.pod_ref,
                sandbox_id: &rt.sandbox.id,
                sandbox_config: &rt.sandbox.config,
                pod_ip: &rt.sandbox.ip,
                volumes: &rt.volumes,
            };
            for c in rt.apps.iter_mut() {
                c.step(&env, policy).await;
            }
            add_ephemerals(&self.pod, &rt.apps, &mut rt.ephemerals);
            for c in rt.ephemerals.iter_mut() {
                c.step(&env, RestartPolicy::Never).await;
            }
        }
        self.report(&rt);
        // Ephemeral containers never keep a pod from completing.
        if rt.apps.iter().all(|c| c.finished(policy)) {
            return State::Completed(rt);
        }
        let due = rt
            .apps
            .iter()
            .chain(&rt.ephemerals)
            .filter_map(ContainerWorker::next_due)
            .min();
        self.wait(self.until(due)).await;
        State::Running(rt)
    }

    /// Renews the projected service account tokens once they are due: the volumes are
    /// written again (atomically: containers keep running and read the new files). Each
    /// worker keeps its own pod's deadline, so the node's cost is per pod, never a scan.
    async fn renew_tokens(&mut self, rt: &mut PodRuntime) {
        let Some(due) = rt.volumes.refresh_due() else {
            return;
        };
        if SystemTime::now() < due {
            return;
        }
        let renewed = volumes::prepare(
            &self.facts(&rt.sandbox.ip),
            &self.ctx.layout,
            self.ctx.objects.as_ref(),
            self.ctx.csi.as_deref(),
        )
        .await;
        match renewed {
            Ok(v) => {
                info!(pod = %self.pod_ref, "service account tokens renewed");
                rt.volumes = v;
            }
            Err(e) => {
                warn!(pod = %self.pod_ref, error = %e, "renewing the pod's tokens failed; retrying");
                self.event(Reason::FailedMount, e.to_string());
                rt.volumes.retry_refresh_at(SystemTime::now() + TOKEN_RETRY);
            }
        }
    }

    /// How long to sleep: until `due`, at most one sync interval.
    fn until(&self, due: Option<Instant>) -> Duration {
        let sync = self.ctx.timing.sync_interval;
        due.map_or(sync, |d| {
            d.saturating_duration_since(Instant::now()).min(sync)
        })
    }

    /// Nothing will run again: stop the sandbox (containers stay for their logs) and wait
    /// for the pod's deletion.
    async fn completed(&mut self, mut rt: PodRuntime) -> State {
        if !rt.sandbox_stopped {
            let _ = self.ctx.cri.stop_pod_sandbox(&rt.sandbox.id).await;
            rt.sandbox_stopped = true;
            self.report(&rt);
        }
        // Nothing runs any more: its CSI volumes go now, as the kubelet unmounts a terminated
        // pod's volumes before the pod is deleted (exited containers keep only their logs).
        if !rt.csi_released {
            match self.ctx.csi.clone() {
                Some(csi) => match csi.tear_down_pod(&self.pod_ref.uid).await {
                    Ok(()) => rt.csi_released = true,
                    Err(e) => {
                        warn!(pod = %self.pod_ref, error = %e, "unmounting a completed pod's CSI volumes failed; retrying");
                        self.wait(self.ctx.timing.sync_interval).await;
                        return State::Completed(rt);
                    }
                },
                None => rt.csi_released = true,
            }
        }
        self.wait(Duration::from_secs(3600)).await;
        State::Completed(rt)
    }

    async fn terminate(&mut self, rt: Option<PodRuntime>) -> State {
        let grace = grace_period(&self.pod);
        let cri = self.ctx.cri.clone();
        if let Some(mut rt) = rt {
            {
                let env = PodEnv {
                    ctx: &self.ctx,
                    pod: &self.pod,
                    pod_ref: &self.pod_ref,
                    sandbox_id: &rt.sandbox.id,
                    sandbox_config: &rt.sandbox.config,
                    pod_ip: &rt.sandbox.ip,
                    volumes: &rt.volumes,
                };
                let kills = rt
                    .apps
                    .iter_mut()
                    .chain(rt.inits.iter_mut())
                    .chain(rt.ephemerals.iter_mut())
                    .map(|c| c.kill(&env, grace, ""));
                futures::future::join_all(kills).await;
            }
            self.report(&rt);
        }
        // Everything of this pod in the runtime, whichever state we came from.
        let labels = HashMap::from([(spec::POD_UID.to_string(), self.pod_ref.uid.clone())]);
        match cri.list_pod_sandboxes(labels).await {
            Ok(sandboxes) => {
                for s in sandboxes {
                    if let Err(e) = cri.stop_pod_sandbox(&s.id).await {
                        warn!(pod = %self.pod_ref, error = %e, "stopping the sandbox failed");
                    }
                    if let Err(e) = cri.remove_pod_sandbox(&s.id).await {
                        warn!(pod = %self.pod_ref, error = %e, "removing the sandbox failed");
                    }
                }
            }
            Err(e) => warn!(pod = %self.pod_ref, error = %e, "listing the pod's sandboxes failed"),
        }
        // The driver unmounts its volumes before the pod's directory goes; the pod stays
        // until it has (the kubelet's order: containers, then volumes, then the object).
        if let Some(csi) = self.ctx.csi.clone() {
            let mut backoff = BackOff::default();
            while let Err(e) = csi.tear_down_pod(&self.pod_ref.uid).await {
                warn!(pod = %self.pod_ref, error = %e, "unmounting the pod's CSI volumes failed; retrying");
                let delay = backoff.next_pull(&self.ctx.timing.image_backoff);
                self.wait(delay).await;
                if self.detached {
                    return State::Terminating(None);
                }
            }
        }
        volumes::remove(&self.ctx.layout, &self.pod);
        let m = &self.pod.metadata;
        let _ = std::fs::remove_dir_all(self.ctx.layout.pod_log_dir(
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default(),
            &self.pod_ref.uid,
        ));
        crate::cgroups::remove_tree(&self.ctx.node.pod_cgroup(&self.pod_ref.uid));
        self.ctx.reporter.terminated(&self.pod_ref);
        State::Terminated
    }

    fn env<'a>(&'a self, sandbox: &'a Sandbox, volumes: &'a Volumes) -> PodEnv<'a> {
        PodEnv {
            ctx: &self.ctx,
            pod: &self.pod,
            pod_ref: &self.pod_ref,
            sandbox_id: &sandbox.id,
            sandbox_config: &sandbox.config,
            pod_ip: &sandbox.ip,
            volumes,
        }
    }

    /// Status before the sandbox exists: Pending, every container ContainerCreating.
    fn report_pending(&mut self) {
        let waiting = |name: String, reason: &str| ContainerStatus {
            name,
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let init = self
            .containers(ContainerKind::Init)
            .into_iter()
            .map(|c| waiting(c.name, "PodInitializing"))
            .collect();
        let app = self
            .containers(ContainerKind::App)
            .into_iter()
            .map(|c| waiting(c.name, "ContainerCreating"))
            .collect();
        self.publish(init, app, Vec::new(), None, false);
    }

    fn report(&mut self, rt: &PodRuntime) {
        let init = rt.inits.iter().map(ContainerWorker::status).collect();
        let app = rt.apps.iter().map(ContainerWorker::status).collect();
        let ephemeral = rt.ephemerals.iter().map(ContainerWorker::status).collect();
        self.publish(
            init,
            app,
            ephemeral,
            Some(rt.sandbox.ip.clone()).filter(|ip| !ip.is_empty()),
            true,
        );
    }

    fn publish(
        &mut self,
        init: Vec<ContainerStatus>,
        app: Vec<ContainerStatus>,
        ephemeral: Vec<ContainerStatus>,
        pod_ip: Option<String>,
        sandbox_ready: bool,
    ) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let mut status = status::compute(Inputs {
            spec: &spec,
            init,
            app,
            pod_ip,
            host_ip: self.ctx.host_ip.clone(),
            start_time: Some(self.start_time.clone()),
            sandbox_ready,
            previous: self.last_status.as_ref(),
            now: super::now(),
        });
        status.ephemeral_container_statuses = (!ephemeral.is_empty()).then_some(ephemeral);
        if self.last_status.as_ref() != Some(&status) {
            self.ctx.reporter.status(&self.pod_ref, &status);
            self.last_status = Some(status);
        }
    }
}

/// Workers for the ephemeral containers the pod's spec has gained (they are only ever
/// added), each targeting the current attempt of the app container it names, if any.
fn add_ephemerals(pod: &Pod, apps: &[ContainerWorker], ephemerals: &mut Vec<ContainerWorker>) {
    // A pod's ephemeral containers can only be added (the API refuses removing one), so an
    // unchanged count means nothing new: no conversion of the spec on every sync round.
    let listed = pod
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .map_or(0, Vec::len);
    if listed == ephemerals.len() {
        return;
    }
    for (c, target) in spec::ephemeral_containers(pod) {
        if ephemerals.iter().any(|e| e.spec.name == c.name) {
            continue;
        }
        let mut w = ContainerWorker::new(ContainerKind::Ephemeral, c);
        w.target_id = target.and_then(|t| {
            apps.iter()
                .find(|a| a.spec.name == t)
                .and_then(|a| a.current_id().map(str::to_string))
        });
        ephemerals.push(w);
    }
}
