//! Finds the eBPF object that `cargo xtask build-ebpf` writes and hands its path to the
//! loader's include_bytes!. Without it the build stops with one clear message (see
//! src/loader/object.rs) instead of a missing-file error.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(skiff_no_ebpf_object)");
    println!("cargo::rerun-if-env-changed=SKIFF_EBPF_OBJECT");
    let object = match std::env::var_os("SKIFF_EBPF_OBJECT") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../proxy-ebpf/target/bpfel-unknown-none/release/proxy-ebpf"),
    };
    println!("cargo::rerun-if-changed={}", object.display());
    if object.exists() {
        println!("cargo::rustc-env=SKIFF_EBPF_OBJECT={}", object.display());
    } else {
        // Re-run once the object appears.
        if let Some(dir) = object.parent() {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        println!("cargo::rustc-cfg=skiff_no_ebpf_object");
    }
}
