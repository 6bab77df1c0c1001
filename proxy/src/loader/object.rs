//! The eBPF object, embedded at build time from `cargo xtask build-ebpf`'s output (see
//! build.rs), so the proxy is one self-contained binary.

#[cfg(skiff_no_ebpf_object)]
compile_error!(
    "the eBPF object is missing: run `cargo xtask build-ebpf` (or `cargo xtask test`), then build again"
);

/// ELF parsing wants the bytes aligned like the sections inside them.
#[repr(C, align(32))]
struct Aligned<B: ?Sized>(B);

#[cfg(not(skiff_no_ebpf_object))]
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("SKIFF_EBPF_OBJECT")));

#[cfg(skiff_no_ebpf_object)]
static OBJECT: &Aligned<[u8]> = &Aligned([]);

pub fn bytes() -> &'static [u8] {
    &OBJECT.0
}
