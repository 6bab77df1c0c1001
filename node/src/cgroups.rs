//! Cgroup directories the runtime leaves behind: runc removes a container's own cgroups, but
//! the pod and node parents the agent names stay until someone removes them, deepest first,
//! in every mounted hierarchy (cgroup v1 controllers and the v2 unified tree).

use std::path::{Path, PathBuf};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// Removes `path` (a cgroup path such as `/skiff-n1/pod<uid>`) and everything below it in
/// every hierarchy. Directories that still hold processes stay (rmdir fails with EBUSY).
pub fn remove_tree(path: &str) {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return;
    }
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(rel);
        if dir.is_dir() {
            remove_deepest_first(&dir);
        }
    }
}

/// Mounted hierarchies: each v1 controller directory, and the v2 tree if mounted apart.
fn hierarchies() -> Vec<PathBuf> {
    if Path::new(CGROUP_FS).join("cgroup.controllers").exists() {
        // Pure v2: one tree.
        return vec![PathBuf::from(CGROUP_FS)];
    }
    let Ok(entries) = std::fs::read_dir(CGROUP_FS) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        // v1 links co-mounted controllers (cpu -> cpu,cpuacct): visit each tree once.
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect()
}

fn remove_deepest_first(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_deepest_first(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
