//! `cargo xtask build-ebpf`: builds the kernel programs in proxy-ebpf/ with the nightly
//! toolchain, first installing what that needs (rust-src, a bpf-linker built against the
//! nightly's own LLVM) into the project-local `.tools/`, each step skipped when done.

use crate::setup::{root, run};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The eBPF target and the toolchain that builds it (aya-ebpf 0.2 needs nightly build-std).
const TARGET: &str = "bpfel-unknown-none";
const TOOLCHAIN: &str = "nightly";
/// bpf-linker releases that build with the LLVM feature names used below.
const BPF_LINKER_VERSION: &str = "^0.13";

/// Where the built object lands; proxy/build.rs reads the same path.
pub fn object_path() -> PathBuf {
    root()
        .join("proxy-ebpf/target")
        .join(TARGET)
        .join("release/proxy-ebpf")
}

/// Installs the prerequisites (idempotently) and builds the eBPF object.
pub fn build() -> Result<()> {
    ensure_rust_src()?;
    let linker = ensure_bpf_linker()?;
    let tools_bin = linker
        .parent()
        .expect("linker is in a bin dir")
        .to_path_buf();
    eprintln!("build-ebpf: building proxy-ebpf for {TARGET}");
    let path = std::env::join_paths(std::iter::once(tools_bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let mut cmd = nightly_cargo();
    cmd.current_dir(root().join("proxy-ebpf"))
        .args([
            "build",
            // The lock pins versions these toolchains build (aya-build 0.2.0).
            "--locked",
            "--release",
            "--target",
            TARGET,
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(root().join("proxy-ebpf/target"))
        .env("PATH", path);
    run(&mut cmd)?;
    let object = object_path();
    if !object.exists() {
        bail!(
            "build-ebpf: cargo succeeded but {} is missing",
            object.display()
        );
    }
    eprintln!("build-ebpf: {}", object.display());
    Ok(())
}

/// `rustup run nightly cargo`, with the variables the outer (stable) cargo set removed so
/// they do not leak into the nightly build.
fn nightly_cargo() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", TOOLCHAIN, "cargo"]);
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTUP_TOOLCHAIN",
        "CARGO_MANIFEST_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustc")
        .args([&format!("+{TOOLCHAIN}"), "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .context("running rustc +nightly (is the nightly toolchain installed?)")?;
    if !out.status.success() {
        bail!(
            "rustc +{TOOLCHAIN} --print sysroot failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn ensure_rust_src() -> Result<()> {
    let src = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core");
    if src.exists() {
        return Ok(());
    }
    eprintln!("build-ebpf: installing the rust-src component for {TOOLCHAIN} (build-std needs it)");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", TOOLCHAIN]))
}

/// bpf-linker must link against the same LLVM major as the nightly rustc: install it into
/// `.tools/bin` built against the toolchain's own libLLVM.
fn ensure_bpf_linker() -> Result<PathBuf> {
    let tools = root().join(".tools");
    let linker = tools.join("bin/bpf-linker");
    if linker.exists() {
        return Ok(linker);
    }
    let sysroot = nightly_sysroot()?;
    let (libllvm, major) = find_libllvm(&sysroot.join("lib"))?;
    let prefix = tools.join("llvm-prefix");
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&libllvm, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    eprintln!(
        "build-ebpf: installing bpf-linker {BPF_LINKER_VERSION} against LLVM {major} ({}) into {} (about a minute, once)",
        libllvm.display(),
        tools.display()
    );
    let mut cmd = nightly_cargo();
    cmd.args([
        "install",
        "bpf-linker",
        "--locked",
        "--version",
        BPF_LINKER_VERSION,
    ])
    .args([
        "--no-default-features",
        "--features",
        &format!("llvm-{major}"),
    ])
    .arg("--root")
    .arg(&tools)
    .env("LLVM_PREFIX", &prefix)
    // cargo install builds in a temp dir; keep its target away from ours.
    .env("CARGO_TARGET_DIR", tools.join("build"));
    run(&mut cmd)?;
    let _ = std::fs::remove_dir_all(tools.join("build"));
    Ok(linker)
}

/// The toolchain's `libLLVM.so.<major>.<minor>-rust-...` and its major version.
fn find_libllvm(lib: &Path) -> Result<(PathBuf, u32)> {
    for entry in std::fs::read_dir(lib).with_context(|| format!("reading {}", lib.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(version) = name.strip_prefix("libLLVM.so.") {
            if let Some(major) = version.split('.').next().and_then(|m| m.parse().ok()) {
                return Ok((path, major));
            }
        }
    }
    bail!(
        "no libLLVM.so.<version> in {}: is the nightly toolchain complete?",
        lib.display()
    )
}
