//! Machine prerequisites, installed once and skipped when already present.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages the project's daemons and tests drive for real.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    // (package, a file it installs: present means installed)
    ("containerd", "/usr/bin/containerd"),
    ("runc", "/usr/sbin/runc"),
    ("containernetworking-plugins", "/usr/lib/cni/bridge"),
    ("etcd-server", "/usr/bin/etcd"),
    ("etcd-client", "/usr/bin/etcdctl"),
    ("iptables", "/usr/sbin/iptables-restore"),
    ("protobuf-compiler", "/usr/bin/protoc"),
    // protobuf's well-known types, which etcd-client's protos import
    (
        "libprotobuf-dev",
        "/usr/include/google/protobuf/descriptor.proto",
    ),
    ("docker-registry", "/usr/bin/docker-registry"),
    ("iproute2", "/usr/sbin/ip"),
    ("curl", "/usr/bin/curl"),
    // the `busybox` image (`cargo xtask images`)
    ("busybox-static", "/bin/busybox"),
    // mkfs.ext4 and resize2fs in the skiff/csi image (`cargo xtask images`)
    ("e2fsprogs", "/usr/sbin/mkfs.ext4"),
];

pub fn all() -> Result<()> {
    debian_packages()
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .filter(|(_, marker)| !PathBuf::from(marker).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    let status = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        // A fresh machine may have stale package lists: refresh once and retry.
        run(Command::new("apt-get").arg("update"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    Ok(())
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// Run cargo in the workspace root with `args` followed by `extra`.
pub fn cargo(args: &[&str], extra: &[String]) -> Result<()> {
    run(Command::new(env!("CARGO"))
        .current_dir(root())
        .args(args)
        .args(extra))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
