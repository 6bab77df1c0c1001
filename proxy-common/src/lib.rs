//! Map keys and values shared by the kernel programs (proxy-ebpf) and the loader (proxy).
#![no_std]
