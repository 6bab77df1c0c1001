//! The API server as a real process (`control-plane apiserver`), for tests that must kill it
//! (kill -9 durability) or restart it: started on a free loopback port (kept across
//! restarts) with its own data directory, ready once /readyz answers over TLS (the cluster
//! CA from the kubeconfig it wrote), killed on Drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::kubeconfig::KubeconfigAccess;
use crate::wait::wait_until;

/// A running `control-plane apiserver` process.
pub struct ApiServerProcess {
    binary: PathBuf,
    data_dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
    url: String,
}

impl ApiServerProcess {
    /// Starts `binary apiserver --data-dir DATA_DIR --listen 127.0.0.1:0` and waits until it
    /// serves. `extra_args` are passed on every (re)start.
    pub fn start(binary: &Path, data_dir: &Path, extra_args: &[&str]) -> ApiServerProcess {
        let mut p = ApiServerProcess {
            binary: binary.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            child: None,
            url: String::new(),
        };
        p.spawn("127.0.0.1:0");
        p
    }

    /// The admin kubeconfig (rewritten on every start: the port changes).
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("kubeconfig")
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin's access (server, CA, client certificate) from the kubeconfig.
    pub fn admin(&self) -> KubeconfigAccess {
        KubeconfigAccess::read(&self.kubeconfig()).expect("the admin kubeconfig")
    }

    /// The PKI directory (CA, service account key) under the data directory.
    pub fn pki_dir(&self) -> PathBuf {
        self.data_dir.join("pki")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self, listen: &str) {
        let kubeconfig = self.kubeconfig();
        let _ = std::fs::remove_file(&kubeconfig);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.with_extension("log"))
            .expect("opening the server log");
        let child = Command::new(&self.binary)
            .arg("apiserver")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen", listen])
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting control-plane apiserver");
        self.child = Some(child);
        let access = wait_until(
            "the apiserver writes its kubeconfig",
            Duration::from_secs(30),
            || KubeconfigAccess::read(&kubeconfig),
        );
        wait_until(
            "the apiserver is ready",
            Duration::from_secs(30),
            || match access.get("/readyz", Duration::from_secs(5))? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code}: {body}")),
            },
        );
        self.url = access.server;
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for a clean exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let status = wait_until("the apiserver exits", Duration::from_secs(30), || {
            c.try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still running".to_string())
        });
        status.success()
    }

    /// Starts it again on the same data directory and port (clients keep working).
    pub fn restart(&mut self) {
        self.kill9();
        let listen = self
            .url
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .to_string();
        self.spawn(&listen);
    }
}

impl Drop for ApiServerProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
