//! A grace period from user space: waits until every BPF program that was running when it
//! was called has finished, so whatever those programs may have read (a backend count, a
//! frontend id) can be reclaimed.
//!
//! The kernel offers no `synchronize_rcu()` syscall, but it runs one for every update of a
//! map-in-map from user space ("so that userspace, when we return to it, knows that all
//! non-sleepable programs that could be running use the new map value",
//! `maybe_wait_bpf_programs` in kernel/bpf/syscall.c). A one-slot `ARRAY_OF_MAPS` whose
//! slot is rewritten with the same inner map is therefore an exact fence. Every skiff
//! program (cgroup hooks, tc, XDP) runs non-sleepable inside an RCU read section.

use super::sys::{self, MapSpec};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The fence: an outer map and the inner map it is rewritten with.
pub struct Fence {
    outer: OwnedFd,
    inner: OwnedFd,
}

impl Fence {
    pub fn new() -> io::Result<Fence> {
        let inner = sys::map_create(MapSpec {
            map_type: sys::BPF_MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            ..Default::default()
        })?;
        let outer = sys::map_create(MapSpec {
            map_type: sys::BPF_MAP_TYPE_ARRAY_OF_MAPS,
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            inner_map_fd: inner.as_raw_fd() as u32,
            ..Default::default()
        })?;
        Ok(Fence { outer, inner })
    }

    /// Returns once every BPF program running at the time of the call has finished (an RCU
    /// grace period: milliseconds). Blocking: call it off the async runtime.
    pub fn wait(&self) -> io::Result<Duration> {
        let t = Instant::now();
        let value: u32 = self.inner.as_raw_fd() as u32;
        sys::map_update(&self.outer, &0u32, &value)?;
        Ok(t.elapsed())
    }
}
