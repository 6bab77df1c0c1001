//! The real kubectl against a test's server: its own KUBECONFIG, discovery cache directory and
//! HOME per runner, so parallel tests never share cached discovery.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A kubectl bound to one kubeconfig.
#[derive(Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
    home: PathBuf,
    /// Each run is killed after this long (for streaming commands that could hang).
    limit: Option<std::time::Duration>,
}

/// What one kubectl run printed.
#[derive(Debug)]
pub struct Run {
    pub success: bool,
    /// The exit code (None: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            success: o.status.success(),
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Kubectl {
    /// A runner whose HOME and discovery cache live under `scratch` (created if needed).
    pub fn new(kubeconfig: &Path, scratch: &Path) -> Kubectl {
        let home = scratch.join("kubectl-home");
        std::fs::create_dir_all(&home).expect("creating kubectl's HOME");
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
            home,
            limit: None,
        }
    }

    /// The same kubectl, each run killed (coreutils `timeout`) once `limit` has passed: a
    /// failed run rather than a hung test.
    pub fn within(&self, limit: std::time::Duration) -> Kubectl {
        Kubectl {
            limit: Some(limit),
            ..self.clone()
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = match self.limit {
            Some(limit) => {
                let mut c = Command::new("timeout");
                c.args([
                    "--kill-after=5",
                    &format!("{}s", limit.as_secs().max(1)),
                    "kubectl",
                ]);
                c
            }
            None => Command::new("kubectl"),
        };
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .arg("--cache-dir")
            .arg(self.home.join("cache"))
            .args(args);
        c
    }

    /// Runs kubectl and returns what it printed.
    pub fn run(&self, args: &[&str]) -> Run {
        self.command(args)
            .stdin(Stdio::null())
            .output()
            .expect("running kubectl")
            .into()
    }

    /// Runs kubectl with `input` on stdin (`apply -f -`).
    pub fn run_with_stdin(&self, args: &[&str], input: &str) -> Run {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl");
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(input.as_bytes())
            .expect("writing kubectl's stdin");
        child
            .wait_with_output()
            .expect("waiting for kubectl")
            .into()
    }

    /// Runs kubectl, panics with its output unless it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(
            r.success,
            "kubectl {args:?} failed:\n{}{}",
            r.stdout, r.stderr
        );
        r.stdout
    }

    /// Runs kubectl, panics unless it fails; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(!r.success, "kubectl {args:?} succeeded:\n{}", r.stdout);
        r.stderr
    }

    /// Starts a long-running kubectl (`get -w`) with stdout piped; the caller kills it.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kubectl")
    }
}
