//! cgroup v2 fixtures: a child cgroup of the test's own with a unique name, processes
//! started inside it, and cleanup on Drop (processes killed, directory removed). Programs
//! attached to it (e.g. the proxy's socket hooks) see only the test's own processes.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cgroup v2 is mounted: `/sys/fs/cgroup/unified` on hybrid hosts, else
/// `/sys/fs/cgroup`.
pub fn v2_root() -> PathBuf {
    let hybrid = Path::new("/sys/fs/cgroup/unified");
    if hybrid.join("cgroup.procs").exists() {
        hybrid.to_path_buf()
    } else {
        PathBuf::from("/sys/fs/cgroup")
    }
}

/// The cgroup v2 this process is in, as a path under [`v2_root`].
pub fn own() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("reading /proc/self/cgroup");
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/")
        .trim_start_matches('/');
    v2_root().join(rel)
}

/// A child cgroup of the test's own, removed on Drop.
pub struct Cgroup {
    path: PathBuf,
    procs: File,
}

impl Cgroup {
    pub fn new(prefix: &str) -> Cgroup {
        let path = own().join(crate::netns::unique_name(prefix));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let procs = OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))
            .unwrap_or_else(|e| panic!("opening {}/cgroup.procs: {e}", path.display()));
        Cgroup { path, procs }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `cmd` join this cgroup before it executes.
    pub fn enter_before_exec(&self, cmd: &mut Command) {
        let fd = self.procs.as_raw_fd();
        // SAFETY: write(2) is async-signal-safe; "0" moves the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Process ids in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // cgroup.kill (5.14+) ends every process inside; then the directory can go.
        if let Ok(mut f) = OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.kill"))
        {
            let _ = f.write_all(b"1");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.pids().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_runs_inside_and_cleanup_removes_everything() {
        let cg = Cgroup::new("cgt");
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        cg.enter_before_exec(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        assert_eq!(cg.pids(), vec![child.id()]);
        let path = cg.path().to_path_buf();
        drop(cg);
        assert!(!child.wait().unwrap().success(), "killed by the cleanup");
        assert!(!path.exists());
    }
}
