//! The cluster's daemons as detached processes: each in its own process group (a Ctrl-C in
//! the terminal that ran `up` does not reach them), optionally inside a node's network
//! namespace and cgroup, output appended to a log file; stopped by pid with SIGTERM, then
//! SIGKILL after a grace period. A pid is only signalled while /proc says it still runs the
//! expected program, so a recycled pid is never hit.

use super::Error;
use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where a process starts.
#[derive(Default)]
pub struct Placement<'a> {
    /// A named network namespace (entered with setns only: /sys stays the host's, so runc
    /// finds the cgroup mounts, unlike under `ip netns exec`).
    pub netns: Option<&'a str>,
    /// A cgroup v2 directory to join before exec.
    pub cgroup: Option<&'a Path>,
    /// Whether the process is one of the cluster's own daemons (see [`SYSTEM_NICE`]).
    pub priority: Priority,
}

/// The CPU priority a process starts with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    /// The caller's.
    #[default]
    Inherited,
    /// The cluster's own daemons: [`SYSTEM_NICE`].
    System,
}

/// The nice value of the cluster's daemons (control plane, node agents, proxies, relay).
/// On one machine they share the CPU with every container the cluster runs, where a real
/// cluster gives the control plane machines of its own and reserves CPU for node daemons
/// (the kubelet's kube-reserved and system-reserved): without it, a rollout that starts
/// dozens of containers at once starves the API server and the proxies (measured: the
/// control plane's threads waited 8 s on the run queue for every second they ran, and
/// endpoint removals reached the proxies seconds after the pods had stopped serving).
/// Ignored where the caller may not raise priority (not root).
pub const SYSTEM_NICE: i32 = -10;

/// Gives the calling thread [`SYSTEM_NICE`] (threads it starts afterwards inherit it).
pub fn raise_thread_priority() {
    // SAFETY: setpriority on the calling thread (tid 0 = the caller); failure is harmless.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, SYSTEM_NICE);
    }
}

fn c_path(p: &Path) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::new(format!("{}: NUL in path", p.display())))
}

impl Placement<'_> {
    /// Makes `cmd` enter the namespace and join the cgroup between fork and exec.
    pub fn apply(&self, cmd: &mut Command) -> Result<(), Error> {
        let netns = match self.netns {
            Some(name) => Some(c_path(&Path::new("/run/netns").join(name))?),
            None => None,
        };
        let procs = match self.cgroup {
            Some(dir) => Some(c_path(&dir.join("cgroup.procs"))?),
            None => None,
        };
        let system = self.priority == Priority::System;
        // SAFETY: only async-signal-safe system calls (open, setns, write, close, setpriority) run
        // between fork and exec; the paths were allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(path) = &netns {
                    let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let r = libc::setns(fd, libc::CLONE_NEWNET);
                    libc::close(fd);
                    if r != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(path) = &procs {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0" moves the writing process itself.
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    libc::close(fd);
                    if !ok {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if system {
                    // A failure (not root) leaves the caller's priority.
                    libc::setpriority(libc::PRIO_PROCESS, 0, SYSTEM_NICE);
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// Starts `cmd` detached with stdout and stderr appended to `log`; returns its pid.
pub fn spawn(cmd: &mut Command, log: &Path, at: Placement<'_>) -> Result<u32, Error> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::new(format!("opening {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::new(format!("{}: {e}", log.display())))?;
    at.apply(cmd)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| Error::new(format!("starting {cmd:?}: {e}")))?;
    Ok(child.id())
}

/// Whether `pid` runs a program whose path ends with `program` (and is not a zombie).
pub fn alive(pid: u32, program: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name.
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    if stat.is_empty() || zombie {
        reap(pid);
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(argv0).ends_with(program)
}

/// Collects the exit status if `pid` is our child (else a no-op).
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid on a pid with WNOHANG never blocks; ECHILD for non-children is fine.
    unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
}

/// SIGTERM, up to `grace` for the exit, then SIGKILL. Returns whether it was running.
pub fn stop(pid: u32, program: &str, grace: Duration) -> bool {
    if !alive(pid, program) {
        return false;
    }
    // SAFETY: kill(2) on a pid verified to run our program.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while alive(pid, program) {
        if Instant::now() >= deadline {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let hard = Instant::now() + Duration::from_secs(5);
            while alive(pid, program) && Instant::now() < hard {
                std::thread::sleep(Duration::from_millis(20));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The file name of a program path, as /proc shows its argv[0] suffix.
pub fn program_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawns_detached_logs_and_stops() {
        let dir = tempfile_dir();
        let log = dir.join("sleep.log");
        let pid = spawn(
            Command::new("/bin/sh").args(["-c", "echo started; exec sleep 600"]),
            &log,
            Placement::default(),
        )
        .unwrap();
        // The shell logs, then becomes sleep: the log line may come before the exec.
        crate::wait_until(
            "the log line, then sleep running",
            Duration::from_secs(10),
            || match std::fs::read_to_string(&log) {
                Ok(t) if t.contains("started") && alive(pid, "sleep") => Ok(()),
                other => Err(other.map_err(|e| e.to_string())),
            },
        );
        assert!(
            !alive(pid, "something-else"),
            "pid checked against the program"
        );
        assert!(stop(pid, "sleep", Duration::from_secs(5)));
        assert!(!alive(pid, "sleep"));
        assert!(!stop(pid, "sleep", Duration::from_secs(1)), "already gone");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(crate::netns::unique_name("skp"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
