//! The plugin as kubectl runs it: real kubectl (1.33) finds `kubectl-skiff` on a PATH that
//! holds only the built binary's directory and kubectl's own, and passes `skiff ...` on. No
//! cluster: what needs one is in tests/tests/proxy_daemonset.rs.

use std::path::Path;
use std::process::{Command, Output};

fn kubectl(args: &[&str]) -> Output {
    let plugin = Path::new(env!("CARGO_BIN_EXE_kubectl-skiff"));
    let kubectl = which("kubectl").expect("kubectl on PATH");
    let path = std::env::join_paths([plugin.parent().unwrap(), kubectl.parent().unwrap()]).unwrap();
    Command::new(&kubectl)
        .args(args)
        .env("PATH", path)
        // No cluster is reached: a kubeconfig pointing nowhere the tests could not own.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("running kubectl")
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[test]
fn kubectl_finds_the_plugin() {
    let out = kubectl(&["plugin", "list", "--name-only"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.trim() == "kubectl-skiff"),
        "kubectl plugin list: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(&["skiff", "trace", "--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("deployment/NAME"), "{help}");
}

#[test]
fn a_bad_target_is_refused_before_any_call() {
    let out = kubectl(&["skiff", "trace", "node/n1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("expected deployment/NAME, service/NAME or pod/NAME"),
        "{err}"
    );
}
