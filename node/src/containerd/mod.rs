//! Supervision of the node's own containerd: writes its configuration, replaces a stale
//! instance left by a previous agent, starts it, waits until its CRI service answers,
//! restarts it when it dies, and stops it cleanly. Containers survive all of this: their
//! shims are separate processes, and a new containerd recovers them from its state dir.

pub mod config;

use crate::cri::Cri;
use crate::layout::Layout;
pub use config::RuntimeSettings;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tracing::{info, warn};

/// How long containerd gets to answer after start, and to exit after SIGTERM.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between a crash and the restart, so a broken config cannot spin a core.
const RESTART_DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("preparing {path}: {source}")]
    Files {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting containerd: {0}")]
    Spawn(std::io::Error),
    #[error("containerd did not answer on {socket} within {READY_TIMEOUT:?}: {last} (log: {log})")]
    NotReady {
        socket: PathBuf,
        last: String,
        log: PathBuf,
    },
}

/// A running, supervised containerd. Stop it with [`Containerd::stop`]; dropping it sends
/// SIGTERM without waiting.
pub struct Containerd {
    layout: Layout,
    cri: Cri,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// State the supervisor task shares with the handle.
struct Shared {
    pid: AtomicU32,
    restarts: AtomicU64,
    stopping: AtomicBool,
}

/// The registries' hosts.toml files, afresh: a registry dropped from the flags leaves none.
fn write_registry_hosts(
    layout: &Layout,
    settings: &RuntimeSettings,
) -> Result<(), ContainerdError> {
    let dir = layout.registry_hosts_dir();
    let files = |path: PathBuf| move |source| ContainerdError::Files { path, source };
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(files(dir.clone())(e)),
        _ => {}
    }
    for hosts in config::registry_hosts(settings) {
        let registry_dir = dir.join(&hosts.registry);
        std::fs::create_dir_all(&registry_dir).map_err(files(registry_dir.clone()))?;
        let path = registry_dir.join("hosts.toml");
        std::fs::write(&path, &hosts.hosts_toml).map_err(files(path.clone()))?;
    }
    Ok(())
}

impl Containerd {
    /// Writes the config under `layout`, stops a containerd a previous agent left running
    /// there, starts a fresh one and waits until its CRI service answers.
    pub async fn start(
        layout: Layout,
        settings: &RuntimeSettings,
    ) -> Result<Containerd, ContainerdError> {
        let dir = layout.containerd_dir();
        for d in [&dir, &layout.cni_conf_dir()] {
            std::fs::create_dir_all(d).map_err(|source| ContainerdError::Files {
                path: d.clone(),
                source,
            })?;
        }
        let config_path = layout.containerd_config();
        std::fs::write(&config_path, config::render(&layout, settings)).map_err(|source| {
            ContainerdError::Files {
                path: config_path.clone(),
                source,
            }
        })?;
        write_registry_hosts(&layout, settings)?;
        stop_stale(&layout).await;
        let child = spawn(&layout)?;
        let shared = Arc::new(Shared {
            pid: AtomicU32::new(child.id().unwrap_or(0)),
            restarts: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let cri = Cri::new(&layout.containerd_socket());
        wait_ready(&cri, &layout).await?;
        info!(pid = shared.pid.load(Ordering::Relaxed), socket = %layout.containerd_socket().display(), "containerd ready");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(supervise(layout.clone(), child, shared.clone(), stopped));
        Ok(Containerd {
            layout,
            cri,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// A CRI client for this containerd (it follows restarts).
    pub fn cri(&self) -> Cri {
        self.cri.clone()
    }

    /// The current containerd process id.
    pub fn pid(&self) -> u32 {
        self.shared.pid.load(Ordering::Relaxed)
    }

    /// How often containerd died and was restarted.
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }

    /// SIGTERM, then SIGKILL after a grace period; returns once the process is gone.
    pub async fn stop(mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.shared.stopping.store(true, Ordering::SeqCst);
            signal(self.pid(), libc::SIGTERM);
        }
    }
}

fn spawn(layout: &Layout) -> Result<Child, ContainerdError> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layout.containerd_log())
        .map_err(|source| ContainerdError::Files {
            path: layout.containerd_log(),
            source,
        })?;
    let log2 = log.try_clone().map_err(ContainerdError::Spawn)?;
    let mut cmd = std::process::Command::new("containerd");
    cmd.arg("--config")
        .arg(layout.containerd_config())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a Ctrl-C meant for the agent must not kill the runtime
        // underneath running pods; the agent stops it in order.
        .process_group(0);
    let child = Command::from(cmd)
        .kill_on_drop(false)
        .spawn()
        .map_err(ContainerdError::Spawn)?;
    if let Some(pid) = child.id() {
        let _ = std::fs::write(layout.containerd_pid(), pid.to_string());
    }
    Ok(child)
}

async fn wait_ready(cri: &Cri, layout: &Layout) -> Result<(), ContainerdError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match cri.version().await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(ContainerdError::NotReady {
                    socket: layout.containerd_socket(),
                    last: e.to_string(),
                    log: layout.containerd_log(),
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

async fn supervise(
    layout: Layout,
    mut child: Child,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            status = child.wait() => {
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                warn!(?status, "containerd exited; restarting it");
                tokio::time::sleep(RESTART_DELAY).await;
                match spawn(&layout) {
                    Ok(c) => {
                        shared.pid.store(c.id().unwrap_or(0), Ordering::Relaxed);
                        shared.restarts.fetch_add(1, Ordering::Relaxed);
                        child = c;
                    }
                    Err(e) => {
                        warn!(error = %e, "restarting containerd failed; retrying");
                        // Keep waiting on the dead child: wait() returns at once again.
                    }
                }
            }
            _ = &mut stopped => {
                terminate(&mut child).await;
                let _ = std::fs::remove_file(layout.containerd_pid());
                info!("containerd stopped");
                return;
            }
        }
    }
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        signal(pid, libc::SIGTERM);
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_ok()
        {
            return;
        }
        warn!(pid, "containerd ignored SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

/// A containerd left running by an agent that died: stop it and wait until it is gone, so
/// the new one does not fight it over the socket and state dir.
async fn stop_stale(layout: &Layout) {
    let Some(pid) = std::fs::read_to_string(layout.containerd_pid())
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    else {
        return;
    };
    let is_containerd = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0)
                .next()
                .is_some_and(|argv0| argv0.ends_with(b"containerd"))
        }) && !is_zombie(pid)
    };
    if !is_containerd(pid) {
        return;
    }
    info!(pid, "stopping the containerd a previous agent left running");
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while is_containerd(pid) {
        if Instant::now() > deadline {
            signal(pid, libc::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true)
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) on a pid we started; a stale pid only yields ESRCH.
        unsafe {
            libc::kill(pid as libc::pid_t, sig);
        }
    }
}
