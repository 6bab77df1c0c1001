//! One container's life inside a pod, as a typed state machine: Waiting (for its image, its
//! back-off, or its first creation) -> Running (probed) -> Exited -> Waiting again when the
//! restart policy says so. Each `step` makes at most one transition and logs it.

use super::backoff::BackOff;
use super::env::{self, PodFacts};
use super::events::{PodEvent, Reason};
use super::image::{self, PullError, PullPolicy};
use super::probe::{ProbeKind, ProbeState, Target, Verdict};
use super::spec::{self, ContainerInputs, ContainerKind};
use super::volumes::Volumes;
use super::{now, NodeContext, PodRef};
use crate::cri;
use k8s_openapi::api::core::v1::{
    Container, ContainerState as K8sState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tracing::info;

/// The pod's restartPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn of(pod: &Pod) -> RestartPolicy {
        match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }
}

/// Why a container is not running yet (its status' waiting reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    ContainerCreating,
    PodInitializing,
    ErrImagePull,
    ImagePullBackOff,
    ErrImageNeverPull,
    CrashLoopBackOff,
    CreateContainerConfigError,
    CreateContainerError,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::ContainerCreating => "ContainerCreating",
            WaitReason::PodInitializing => "PodInitializing",
            WaitReason::ErrImagePull => "ErrImagePull",
            WaitReason::ImagePullBackOff => "ImagePullBackOff",
            WaitReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitReason::CreateContainerError => "CreateContainerError",
        }
    }
}

/// A finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Exited {
    pub id: String,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub started_at: Option<Time>,
    pub finished_at: Option<Time>,
    /// How long it ran (for back-off reset).
    pub ran: Duration,
}

/// The container's state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    Waiting {
        reason: WaitReason,
        message: Option<String>,
        retry_at: Instant,
    },
    Running {
        id: String,
        started_at: Option<Time>,
        since: Instant,
    },
    Exited(Exited),
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Waiting { reason, .. } => reason.as_str(),
            State::Running { .. } => "Running",
            State::Exited(_) => "Exited",
        }
    }
}

/// Everything a container step needs from its pod.
pub struct PodEnv<'a> {
    pub ctx: &'a NodeContext,
    pub pod: &'a Pod,
    pub pod_ref: &'a PodRef,
    pub sandbox_id: &'a str,
    pub sandbox_config: &'a cri::PodSandboxConfig,
    pub pod_ip: &'a str,
    pub volumes: &'a Volumes,
}

impl PodEnv<'_> {
    fn emit(&self, kind: ContainerKind, name: &str, reason: Reason, message: String) {
        self.ctx.reporter.event(
            self.pod_ref,
            PodEvent {
                reason,
                message,
                field_path: Some(kind.field_path(name)),
            },
        );
    }
}

/// One container of a pod.
pub struct ContainerWorker {
    pub kind: ContainerKind,
    pub spec: Container,
    pub state: State,
    pub restart_count: u32,
    last_termination: Option<Exited>,
    restart_backoff: BackOff,
    pull_backoff: BackOff,
    image_id: String,
    probes: Vec<ProbeState>,
    ready: bool,
    started: bool,
    /// Dead attempts still in the runtime (the newest is kept for `logs --previous`).
    dead: VecDeque<String>,
    /// An ephemeral container's target: the runtime id of the container whose process
    /// namespace it joins, set by the pod worker before it starts.
    pub target_id: Option<String>,
}

fn time_from_nanos(n: i64) -> Option<Time> {
    (n > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(n)).ok().map(Time))
        .flatten()
}

impl ContainerWorker {
    pub fn new(kind: ContainerKind, spec: Container) -> ContainerWorker {
        let reason = match kind {
            ContainerKind::Init => WaitReason::PodInitializing,
            ContainerKind::App | ContainerKind::Ephemeral => WaitReason::ContainerCreating,
        };
        ContainerWorker {
            kind,
            spec,
            state: State::Waiting {
                reason,
                message: None,
                retry_at: Instant::now(),
            },
            restart_count: 0,
            last_termination: None,
            restart_backoff: BackOff::default(),
            pull_backoff: BackOff::default(),
            image_id: String::new(),
            probes: Vec::new(),
            ready: false,
            started: false,
            dead: VecDeque::new(),
            target_id: None,
        }
    }

    /// A container found in the runtime after an agent restart: its newest attempt becomes
    /// the current state, older ones are history.
    pub fn adopt(
        kind: ContainerKind,
        spec: Container,
        mut found: Vec<cri::ContainerStatus>,
    ) -> ContainerWorker {
        let mut w = ContainerWorker::new(kind, spec);
        found.sort_by_key(|s| s.metadata.as_ref().map_or(0, |m| m.attempt));
        let Some(newest) = found.pop() else { return w };
        w.dead = found.iter().map(|s| s.id.clone()).collect();
        w.restart_count = newest.metadata.as_ref().map_or(0, |m| m.attempt);
        w.image_id = newest.image_ref.clone();
        w.state = if newest.state == cri::ContainerState::ContainerRunning as i32 {
            let since = Instant::now();
            w.arm_probes(since);
            State::Running {
                id: newest.id.clone(),
                started_at: time_from_nanos(newest.started_at),
                since,
            }
        } else {
            State::Exited(exited_from(&newest))
        };
        w
    }

    fn transition(&mut self, pod: &PodRef, next: State) {
        if std::mem::discriminant(&self.state) != std::mem::discriminant(&next)
            || self.state.name() != next.name()
        {
            info!(pod = %pod, container = %self.spec.name, from = self.state.name(), to = next.name(), "container transition");
        }
        self.state = next;
    }

    fn arm_probes(&mut self, since: Instant) {
        self.probes.clear();
        let s = &self.spec;
        for (kind, probe) in [
            (ProbeKind::Startup, &s.startup_probe),
            (ProbeKind::Liveness, &s.liveness_probe),
            (ProbeKind::Readiness, &s.readiness_probe),
        ] {
            if let Some(p) = probe {
                self.probes.push(ProbeState::new(kind, p.clone(), since));
            }
        }
        self.started = !self.probes.iter().any(|p| p.kind == ProbeKind::Startup);
        self.ready = self.kind == ContainerKind::App
            && self.started
            && !self.probes.iter().any(|p| p.kind == ProbeKind::Readiness);
    }

    /// When this container next needs attention (a back-off ending or a probe due).
    pub fn next_due(&self) -> Option<Instant> {
        match &self.state {
            State::Waiting { retry_at, .. } => Some(*retry_at),
            State::Running { .. } => self
                .probes
                .iter()
                .filter(|p| self.probe_active(p))
                .map(ProbeState::next_at)
                .min(),
            State::Exited(_) => None,
        }
    }

    fn probe_active(&self, p: &ProbeState) -> bool {
        match p.kind {
            ProbeKind::Startup => !self.started,
            _ => self.started,
        }
    }

    /// Exited and the restart policy will not run it again.
    pub fn finished(&self, policy: RestartPolicy) -> bool {
        match &self.state {
            State::Exited(e) => !self.should_restart(policy, e.exit_code),
            _ => false,
        }
    }

    /// Exited with status 0.
    pub fn succeeded(&self) -> bool {
        matches!(&self.state, State::Exited(e) if e.exit_code == 0)
    }

    fn should_restart(&self, policy: RestartPolicy, exit_code: i32) -> bool {
        match (self.kind, policy) {
            (ContainerKind::Init, RestartPolicy::Never) => false,
            (ContainerKind::Init, _) => exit_code != 0,
            (ContainerKind::App, RestartPolicy::Always) => true,
            (ContainerKind::App, RestartPolicy::OnFailure) => exit_code != 0,
            (ContainerKind::App, RestartPolicy::Never) => false,
            // Ephemeral containers run once (Kubernetes never restarts them).
            (ContainerKind::Ephemeral, _) => false,
        }
    }

    /// The runtime id of the current attempt, if it was created.
    pub fn current_id(&self) -> Option<&str> {
        match &self.state {
            State::Running { id, .. } => Some(id),
            State::Exited(e) => Some(&e.id),
            State::Waiting { .. } => None,
        }
    }

    /// One round: start it if due, observe it if running, schedule a restart if exited.
    pub async fn step(&mut self, env: &PodEnv<'_>, policy: RestartPolicy) {
        let now = Instant::now();
        match self.state.clone() {
            State::Waiting { retry_at, .. } if retry_at > now => {}
            State::Waiting {
                reason: WaitReason::ErrImagePull,
                message,
                ..
            } => {
                // Show ErrImagePull once, then wait out the back-off as ImagePullBackOff.
                let delay = self.pull_backoff.next_pull(&env.ctx.timing.image_backoff);
                let image = self.spec.image.clone().unwrap_or_default();
                env.emit(
                    self.kind,
                    &self.spec.name,
                    Reason::BackOff,
                    format!("Back-off pulling image \"{image}\""),
                );
                self.transition(
                    env.pod_ref,
                    State::Waiting {
                        reason: WaitReason::ImagePullBackOff,
                        message,
                        retry_at: now + delay,
                    },
                );
            }
            State::Waiting { .. } => self.start(env).await,
            State::Running {
                id,
                since,
                started_at,
            } => self.observe(env, &id, since, started_at).await,
            State::Exited(e) => {
                if self.should_restart(policy, e.exit_code) {
                    let delay = self
                        .restart_backoff
                        .next_restart(&env.ctx.timing.restart_backoff, e.ran);
                    let reason = if delay.is_zero() {
                        WaitReason::ContainerCreating
                    } else {
                        env.emit(
                            self.kind,
                            &self.spec.name,
                            Reason::BackOff,
                            format!(
                                "Back-off restarting failed container {} in pod {}",
                                self.spec.name, env.pod_ref
                            ),
                        );
                        WaitReason::CrashLoopBackOff
                    };
                    let message = (!delay.is_zero()).then(|| {
                        format!(
                            "back-off {:?} restarting failed container={} pod={}",
                            delay, self.spec.name, env.pod_ref
                        )
                    });
                    self.dead.push_back(e.id.clone());
                    self.last_termination = Some(e);
                    self.transition(
                        env.pod_ref,
                        State::Waiting {
                            reason,
                            message,
                            retry_at: now + delay,
                        },
                    );
                }
            }
        }
    }

    fn wait(&mut self, env: &PodEnv<'_>, reason: WaitReason, message: String, delay: Duration) {
        self.transition(
            env.pod_ref,
            State::Waiting {
                reason,
                message: Some(message),
                retry_at: Instant::now() + delay,
            },
        );
    }

    async fn start(&mut self, env: &PodEnv<'_>) {
        let cri = &env.ctx.cri;
        let image = self.spec.image.clone().unwrap_or_default();
        let policy = PullPolicy::of(&self.spec);
        let (kind, name) = (self.kind, self.spec.name.clone());
        match image::ensure(cri, &image, policy, env.sandbox_config, |r, m| {
            env.emit(kind, &name, r, m)
        })
        .await
        {
            Ok(id) => {
                self.pull_backoff.reset();
                self.image_id = id;
            }
            // ErrImagePull shows for one sync round, then ImagePullBackOff for the back-off.
            Err(PullError::Failed(msg)) => {
                return self.wait(
                    env,
                    WaitReason::ErrImagePull,
                    msg,
                    env.ctx.timing.sync_interval,
                )
            }
            Err(PullError::NeverPull(msg)) => {
                let delay = self.pull_backoff.next_pull(&env.ctx.timing.image_backoff);
                return self.wait(env, WaitReason::ErrImageNeverPull, msg, delay);
            }
        }
        let facts = PodFacts {
            pod: env.pod,
            pod_ip: env.pod_ip,
            host_ip: env.ctx.host_ip.as_deref().unwrap_or_default(),
            node_name: env.ctx.node.as_str(),
        };
        let config_error = |me: &mut Self, msg: String| {
            env.emit(kind, &name, Reason::Failed, format!("Error: {msg}"));
            let delay = me.pull_backoff.next_pull(&env.ctx.timing.image_backoff);
            me.wait(env, WaitReason::CreateContainerConfigError, msg, delay);
        };
        let env_vars = match env::resolve(&facts, &self.spec, env.ctx.objects.as_ref()).await {
            Ok(v) => v,
            Err(e) => return config_error(self, e.0),
        };
        let mounts = match env.volumes.mounts(&self.spec) {
            Ok(m) => m,
            Err(e) => return config_error(self, e.to_string()),
        };
        let attempt = self.restart_count
            + u32::from(self.current_id().is_some() || self.last_termination.is_some());
        let config = spec::container_config(
            env.pod,
            &self.spec,
            ContainerInputs {
                kind,
                attempt,
                image: image.clone(),
                env: env_vars,
                mounts,
                target_id: self.target_id.clone(),
            },
        );
        let id = match cri
            .create_container(env.sandbox_id, config, env.sandbox_config.clone())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                env.emit(
                    kind,
                    &name,
                    Reason::Failed,
                    format!("Error: {}", e.message()),
                );
                let delay = self.pull_backoff.next_pull(&env.ctx.timing.image_backoff);
                return self.wait(env, WaitReason::CreateContainerError, e.message(), delay);
            }
        };
        self.restart_count = attempt;
        env.emit(
            kind,
            &name,
            Reason::Created,
            format!("Created container {name}"),
        );
        // Keep only the newest dead attempt (for `logs --previous`).
        while self.dead.len() > 1 {
            if let Some(old) = self.dead.pop_front() {
                let _ = cri.remove_container(&old).await;
            }
        }
        if let Err(e) = cri.start_container(&id).await {
            env.emit(
                kind,
                &name,
                Reason::Failed,
                format!("Error: {}", e.message()),
            );
            let ended = now();
            self.transition(
                env.pod_ref,
                State::Exited(Exited {
                    id,
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: e.message(),
                    started_at: Some(ended.clone()),
                    finished_at: Some(ended),
                    ran: Duration::ZERO,
                }),
            );
            return;
        }
        env.emit(
            kind,
            &name,
            Reason::Started,
            format!("Started container {name}"),
        );
        let since = Instant::now();
        self.arm_probes(since);
        self.transition(
            env.pod_ref,
            State::Running {
                id,
                started_at: Some(now()),
                since,
            },
        );
    }

    async fn observe(
        &mut self,
        env: &PodEnv<'_>,
        id: &str,
        since: Instant,
        started_at: Option<Time>,
    ) {
        let cri = &env.ctx.cri;
        match cri.container_status(id).await {
            Ok(s) if s.state == cri::ContainerState::ContainerExited as i32 => {
                let mut e = exited_from(&s);
                e.ran = since.elapsed();
                self.ready = false;
                return self.transition(env.pod_ref, State::Exited(e));
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                // Removed behind our back: count it as a failed attempt.
                let t = now();
                let gone = Exited {
                    id: id.to_string(),
                    exit_code: 137,
                    reason: "ContainerStatusUnknown".into(),
                    message: "The container could not be located when the pod was terminated"
                        .into(),
                    started_at,
                    finished_at: Some(t),
                    ran: since.elapsed(),
                };
                self.ready = false;
                return self.transition(env.pod_ref, State::Exited(gone));
            }
            Err(_) => return, // runtime unavailable (restarting): look again next round
        }
        let now = Instant::now();
        let target = Target {
            ip: env.pod_ip,
            container: &self.spec,
            container_id: id,
            cri,
        };
        let mut kill: Option<String> = None;
        for i in 0..self.probes.len() {
            if !self.probe_active(&self.probes[i]) || self.probes[i].next_at() > now {
                continue;
            }
            let result = self.probes[i].run(&target).await;
            let kind = self.probes[i].kind;
            if let Err(msg) = &result {
                env.emit(
                    self.kind,
                    &self.spec.name,
                    Reason::Unhealthy,
                    format!("{} probe failed: {msg}", kind.as_str()),
                );
            }
            match (kind, self.probes[i].record(result.is_ok(), Instant::now())) {
                (ProbeKind::Startup, Some(Verdict::Success)) => {
                    self.started = true;
                    self.ready = !self.probes.iter().any(|p| p.kind == ProbeKind::Readiness);
                    let later = Instant::now();
                    self.probes
                        .iter_mut()
                        .filter(|p| p.kind != ProbeKind::Startup)
                        .for_each(|p| p.rearm(later));
                }
                (ProbeKind::Readiness, Some(v)) => self.ready = v == Verdict::Success,
                (ProbeKind::Startup | ProbeKind::Liveness, Some(Verdict::Failure)) => {
                    kill = Some(format!(
                        "Container {} failed {} probe, will be restarted",
                        self.spec.name,
                        kind.as_str().to_lowercase()
                    ));
                }
                _ => {}
            }
        }
        if let Some(message) = kill {
            env.emit(self.kind, &self.spec.name, Reason::Killing, message);
            let grace = grace_period(env.pod);
            let _ = cri.stop_container(id, grace).await;
            self.ready = false;
            // The exit is observed on the next round, from the runtime's own record.
        }
    }

    /// preStop hook, then SIGTERM and SIGKILL after `grace` (what remains of the pod's).
    pub async fn kill(&mut self, env: &PodEnv<'_>, grace: Duration, reason: &str) {
        let State::Running { id, .. } = self.state.clone() else {
            return;
        };
        let started = Instant::now();
        env.emit(
            self.kind,
            &self.spec.name,
            Reason::Killing,
            format!("Stopping container {}{reason}", self.spec.name),
        );
        if let Some(hook) = self
            .spec
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
        {
            let cri = &env.ctx.cri;
            let run = async {
                if let Some(exec) = &hook.exec {
                    let cmd = exec.command.clone().unwrap_or_default();
                    let _ = cri.exec_sync(&id, cmd, grace).await;
                } else if let Some(http) = &hook.http_get {
                    let probe = k8s_openapi::api::core::v1::Probe {
                        http_get: Some(http.clone()),
                        ..Default::default()
                    };
                    let state = ProbeState::new(ProbeKind::Liveness, probe, Instant::now());
                    let target = Target {
                        ip: env.pod_ip,
                        container: &self.spec,
                        container_id: &id,
                        cri,
                    };
                    let _ = state.run(&target).await;
                }
            };
            let _ = tokio::time::timeout(grace, run).await;
        }
        let remaining = grace.saturating_sub(started.elapsed());
        let _ = env.ctx.cri.stop_container(&id, remaining).await;
        if let Ok(s) = env.ctx.cri.container_status(&id).await {
            let mut e = exited_from(&s);
            e.ran = Duration::ZERO;
            self.ready = false;
            self.transition(env.pod_ref, State::Exited(e));
        }
    }

    /// The Kubernetes status of this container.
    pub fn status(&self) -> ContainerStatus {
        let image = self.spec.image.clone().unwrap_or_default();
        let (state, container_id) = match &self.state {
            State::Waiting {
                reason, message, ..
            } => (
                K8sState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.as_str().into()),
                        message: message.clone(),
                    }),
                    ..Default::default()
                },
                None,
            ),
            State::Running { id, started_at, .. } => (
                K8sState {
                    running: Some(ContainerStateRunning {
                        started_at: started_at.clone(),
                    }),
                    ..Default::default()
                },
                Some(id.clone()),
            ),
            State::Exited(e) => (
                K8sState {
                    terminated: Some(terminated(e)),
                    ..Default::default()
                },
                Some(e.id.clone()),
            ),
        };
        ContainerStatus {
            name: self.spec.name.clone(),
            image,
            image_id: self.image_id.clone(),
            container_id: container_id.map(|id| format!("containerd://{id}")),
            state: Some(state),
            last_state: Some(
                self.last_termination
                    .as_ref()
                    .map_or_else(K8sState::default, |e| K8sState {
                        terminated: Some(terminated(e)),
                        ..Default::default()
                    }),
            ),
            ready: self.ready && matches!(self.state, State::Running { .. }),
            started: Some(self.started && matches!(self.state, State::Running { .. })),
            restart_count: self.restart_count as i32,
            ..Default::default()
        }
    }
}

fn terminated(e: &Exited) -> ContainerStateTerminated {
    ContainerStateTerminated {
        container_id: Some(format!("containerd://{}", e.id)),
        exit_code: e.exit_code,
        reason: Some(e.reason.clone()),
        message: (!e.message.is_empty()).then(|| e.message.clone()),
        started_at: e.started_at.clone(),
        finished_at: e.finished_at.clone(),
        ..Default::default()
    }
}

fn exited_from(s: &cri::ContainerStatus) -> Exited {
    let reason = match (s.reason.as_str(), s.exit_code) {
        ("", 0) => "Completed".to_string(),
        ("", _) => "Error".to_string(),
        (r, _) => r.to_string(),
    };
    Exited {
        id: s.id.clone(),
        exit_code: s.exit_code,
        reason,
        message: s.message.clone(),
        started_at: time_from_nanos(s.started_at),
        finished_at: time_from_nanos(s.finished_at),
        ran: Duration::from_nanos(s.finished_at.saturating_sub(s.started_at).max(0) as u64),
    }
}

/// The pod's termination grace period (default 30 s).
pub fn grace_period(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}
