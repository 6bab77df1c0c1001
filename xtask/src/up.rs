//! `cargo xtask up`: for now, the service proxy on a manifests directory (eBPF mode by
//! default), in the foreground. The cluster issue turns this into a whole cluster.

use crate::setup::{root, run};
use anyhow::Result;
use std::path::PathBuf;
use std::process::Command;

#[derive(clap::Args)]
pub struct Opts {
    /// Manifests directory (Services and EndpointSlices); created if missing.
    #[arg(long, default_value = ".skiff/manifests")]
    manifests: PathBuf,
    /// ebpf or iptables.
    #[arg(long, default_value = "ebpf")]
    mode: String,
    /// Extra arguments for `proxy run` (e.g. --cgroup, --metrics).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn up(opts: Opts) -> Result<()> {
    crate::setup::all()?;
    crate::ebpf::build()?;
    let manifests = root().join(&opts.manifests);
    std::fs::create_dir_all(&manifests)?;
    eprintln!(
        "up: service proxy ({} mode) on {}; add Service and EndpointSlice manifests there; `proxy dump` shows what is programmed; Ctrl-C stops it (programmed services keep working)",
        opts.mode,
        manifests.display()
    );
    run(Command::new(env!("CARGO"))
        .current_dir(root())
        .args([
            "run",
            "--release",
            "-p",
            "proxy",
            "--",
            "run",
            "--mode",
            &opts.mode,
        ])
        .arg("--manifests")
        .arg(&manifests)
        .args(&opts.args))
}
