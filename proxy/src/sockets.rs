//! Connected UDP sockets to a backend that left its service are destroyed, in every
//! network namespace where the proxy's programs translate (the processes of its cgroup
//! tree: the node's pods and its own processes). A BPF socket iterator sees only the
//! sockets of the namespace it is created in, so a thread of its own enters each namespace
//! in turn; sweeps are rare (a UDP backend removed) and batched.

use crate::desired::Endpoint;
use crate::loader::udp_iter::UdpDestroyer;
use proxy_common::UdpDestroyKey;
use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// The sweeper thread's handle: removed backends go in, sweeps happen in the background.
pub struct Sweeper {
    tx: mpsc::Sender<Vec<UdpDestroyKey>>,
}

impl Sweeper {
    pub fn start(destroyer: UdpDestroyer, cgroup: PathBuf) -> std::io::Result<Sweeper> {
        let (tx, rx) = mpsc::channel::<Vec<UdpDestroyKey>>();
        std::thread::Builder::new()
            .name("udp-sweeper".into())
            .spawn(move || {
                while let Ok(mut keys) = rx.recv() {
                    // Coalesce whatever else is queued.
                    while let Ok(more) = rx.try_recv() {
                        keys.extend(more);
                    }
                    keys.sort_by_key(|k| (k.addr, k.port));
                    keys.dedup();
                    sweep(&destroyer, &cgroup, &keys);
                }
            })?;
        Ok(Sweeper { tx })
    }

    /// Queues the removed backends (IPv4 only: the iterator program reads IPv4 peers).
    pub fn removed(&self, backends: HashSet<Endpoint>) {
        let keys: Vec<UdpDestroyKey> = backends
            .into_iter()
            .filter_map(|e| match e.ip {
                IpAddr::V4(v4) => Some(UdpDestroyKey {
                    addr: u32::from_ne_bytes(v4.octets()),
                    port: e.port.get().to_be(),
                    _pad: 0,
                }),
                IpAddr::V6(_) => None,
            })
            .collect();
        if !keys.is_empty() {
            let _ = self.tx.send(keys);
        }
    }
}

fn sweep(destroyer: &UdpDestroyer, cgroup: &Path, keys: &[UdpDestroyKey]) {
    let t = std::time::Instant::now();
    if let Err(e) = destroyer.arm(keys) {
        tracing::error!(error = %e, "arming the UDP destroy set");
        return;
    }
    let own = match std::fs::File::open("/proc/thread-self/ns/net") {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %e, "opening this thread's network namespace");
            return;
        }
    };
    let mut swept = 0;
    for ns in namespaces(cgroup) {
        match enter(&ns).and_then(|_| destroyer.sweep_here()) {
            Ok(()) => swept += 1,
            // A process may exit meanwhile: its namespace goes with it.
            Err(e) => tracing::debug!(netns = %ns.display(), error = %e, "sweep skipped"),
        }
    }
    if let Err(e) = setns(&own) {
        tracing::error!(error = %e, "returning to the proxy's network namespace");
    }
    if let Err(e) = destroyer.disarm(keys) {
        tracing::error!(error = %e, "disarming the UDP destroy set");
    }
    tracing::info!(
        backends = keys.len(),
        namespaces = swept,
        took_us = t.elapsed().as_micros() as u64,
        "connected UDP sockets to removed backends destroyed"
    );
}

fn enter(ns: &Path) -> std::io::Result<()> {
    setns(&std::fs::File::open(ns)?)
}

fn setns(f: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: a valid namespace fd; only this thread changes namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One `/proc/<pid>/ns/net` path per distinct network namespace of the processes in the
/// cgroup tree.
fn namespaces(cgroup: &Path) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(m) = std::fs::metadata(&path) {
                if seen.insert((m.dev(), m.ino())) {
                    out.push(path);
                }
            }
        }
    }
    out
}
