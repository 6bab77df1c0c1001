//! Pod volumes on the node: emptyDir, configMap, secret, downwardAPI (files the agent writes
//! under the pod's directory) and hostPath, and the CRI mounts of each container.

use super::env::{config_map_data, field, secret_data, PodFacts};
use super::Objects;
use crate::layout::Layout;
use control_plane::machinery::quantity::Quantity;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// A volume that could not be set up (the pod waits, with a FailedMount event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// The host path behind each of a pod's volumes.
#[derive(Debug, Default, Clone)]
pub struct Volumes {
    host_paths: HashMap<String, PathBuf>,
}

fn err(volume: &str, message: impl Into<String>) -> VolumeError {
    VolumeError {
        volume: volume.into(),
        message: message.into(),
    }
}

/// Creates or refreshes every volume of the pod under `layout.pod_dir(uid)/volumes`.
pub async fn prepare(
    facts: &PodFacts<'_>,
    layout: &Layout,
    objects: &dyn Objects,
) -> Result<Volumes, VolumeError> {
    let pod = facts.pod;
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let root = layout.pod_dir(uid).join("volumes");
    let mut out = Volumes::default();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let io = |e: std::io::Error| err(&v.name, e.to_string());
        let path = if let Some(ed) = &v.empty_dir {
            let p = root.join("empty-dir").join(&v.name);
            std::fs::create_dir_all(&p).map_err(io)?;
            if ed.medium.as_deref() == Some("Memory") && !is_mount_point(&p) {
                let size = ed
                    .size_limit
                    .as_ref()
                    .and_then(|q| Quantity::parse(&q.0).ok())
                    .map(|q| q.value());
                mount_tmpfs(&p, size).map_err(io)?;
            }
            // Writable by any user the container runs as, as emptyDir is.
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).map_err(io)?;
            p
        } else if let Some(src) = &v.config_map {
            let data = config_map_data(objects, ns, &src.name)
                .await
                .map_err(|e| err(&v.name, e.0))?;
            let data = match data {
                Some(d) => d,
                None if src.optional.unwrap_or(false) => BTreeMap::new(),
                None => {
                    return Err(err(
                        &v.name,
                        format!("configmap \"{}\" not found", src.name),
                    ))
                }
            };
            let p = root.join("configmap").join(&v.name);
            write_files(
                &p,
                &data,
                src.items.as_deref(),
                src.default_mode.unwrap_or(0o644),
            )
            .map_err(io)?;
            p
        } else if let Some(src) = &v.secret {
            let name = src.secret_name.clone().unwrap_or_default();
            let data = secret_data(objects, ns, &name)
                .await
                .map_err(|e| err(&v.name, e.0))?;
            let data = match data {
                Some(d) => d,
                None if src.optional.unwrap_or(false) => BTreeMap::new(),
                None => return Err(err(&v.name, format!("secret \"{name}\" not found"))),
            };
            let p = root.join("secret").join(&v.name);
            write_files(
                &p,
                &data,
                src.items.as_deref(),
                src.default_mode.unwrap_or(0o644),
            )
            .map_err(io)?;
            p
        } else if let Some(src) = &v.downward_api {
            let mut data = BTreeMap::new();
            for item in src.items.iter().flatten() {
                let Some(f) = &item.field_ref else { continue };
                let value = field(facts, &f.field_path).map_err(|e| err(&v.name, e.0))?;
                data.insert(item.path.clone(), value);
            }
            let p = root.join("downward-api").join(&v.name);
            write_files(&p, &data, None, src.default_mode.unwrap_or(0o644)).map_err(io)?;
            p
        } else if let Some(src) = &v.host_path {
            let p = PathBuf::from(&src.path);
            match src.type_.as_deref() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).map_err(io)?,
                Some("FileOrCreate") if !p.exists() => {
                    if let Some(parent) = p.parent() {
                        std::fs::create_dir_all(parent).map_err(io)?;
                    }
                    std::fs::write(&p, b"").map_err(io)?;
                }
                Some("Directory") if !p.is_dir() => {
                    return Err(err(
                        &v.name,
                        format!(
                            "hostPath type check failed: {} is not a directory",
                            src.path
                        ),
                    ))
                }
                Some("File") if !p.is_file() => {
                    return Err(err(
                        &v.name,
                        format!("hostPath type check failed: {} is not a file", src.path),
                    ))
                }
                _ => {}
            }
            p
        } else {
            return Err(err(&v.name, "unsupported volume type on this node"));
        };
        out.host_paths.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// Writes `data` as files under `dir` (only `items` if given), replacing what was there.
fn write_files(
    dir: &Path,
    data: &BTreeMap<String, String>,
    items: Option<&[KeyToPath]>,
    mode: i32,
) -> std::io::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let entries: Vec<(&str, &str, i32)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|i| {
                data.get(&i.key)
                    .map(|v| (i.path.as_str(), v.as_str(), i.mode.unwrap_or(mode)))
            })
            .collect(),
        None => data
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str(), mode))
            .collect(),
    };
    for (rel, value, mode) in entries {
        let Some(path) = safe_join(dir, rel) else {
            continue;
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, value)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode as u32 & 0o7777))?;
    }
    Ok(())
}

/// `dir/rel` when `rel` stays inside `dir` (no `..`, not absolute): keys come from the API.
fn safe_join(dir: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel);
    rel.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| dir.join(rel))
}

impl Volumes {
    /// The CRI mounts for one container's volumeMounts.
    pub fn mounts(&self, container: &Container) -> Result<Vec<cri::Mount>, VolumeError> {
        let mut out = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let Some(host) = self.host_paths.get(&m.name) else {
                return Err(err(&m.name, "no volume of that name in the pod"));
            };
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    let p = safe_join(host, sub)
                        .ok_or_else(|| err(&m.name, format!("invalid subPath {sub:?}")))?;
                    if !p.exists() {
                        std::fs::create_dir_all(&p).map_err(|e| err(&m.name, e.to_string()))?;
                    }
                    p
                }
                None => host.clone(),
            };
            out.push(cri::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: m.read_only.unwrap_or(false),
                ..Default::default()
            });
        }
        Ok(out)
    }
}

/// Removes the pod's volume directories (never hostPath targets: those are not under it).
pub fn remove(layout: &Layout, pod: &Pod) {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !uid.is_empty() {
        remove_pod_dir(&layout.pod_dir(uid));
    }
}

/// Removes a pod's directory, unmounting what is mounted below it first (memory-backed
/// emptyDirs), so no mount outlives its pod and no tmpfs content is left behind.
pub fn remove_pod_dir(dir: &Path) {
    unmount_below(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// An emptyDir with `medium: Memory`: a tmpfs of its own, `sizeLimit` as its size (the
/// kubelet does the same; what is written there counts against the pod's memory).
fn mount_tmpfs(dir: &Path, size: Option<i64>) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let mut options = "mode=0777".to_string();
    if let Some(bytes) = size.filter(|b| *b > 0) {
        options.push_str(&format!(",size={bytes}"));
    }
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(std::io::Error::from)
}

/// The mount points at or below `dir`, deepest first, from /proc/self/mountinfo.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Spaces and such are octal-escaped in mountinfo; pod paths have none.
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found
}

fn is_mount_point(dir: &Path) -> bool {
    mounts_below(dir).iter().any(|m| m == dir)
}

/// Detaches every mount at or below `dir`.
pub fn unmount_below(dir: &Path) {
    for m in mounts_below(dir) {
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %m.display(), error = %e, "unmounting a pod volume failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_escape_the_volume() {
        let d = Path::new("/v");
        assert_eq!(safe_join(d, "a/b"), Some(PathBuf::from("/v/a/b")));
        assert_eq!(safe_join(d, "../etc/passwd"), None);
        assert_eq!(safe_join(d, "/etc/passwd"), None);
    }

    #[test]
    fn files_from_items_with_modes() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = BTreeMap::new();
        data.insert("a".to_string(), "1".to_string());
        data.insert("b".to_string(), "2".to_string());
        let items = [KeyToPath {
            key: "b".into(),
            path: "sub/bee".into(),
            mode: Some(0o600),
        }];
        write_files(dir.path(), &data, Some(&items), 0o644).unwrap();
        assert!(!dir.path().join("a").exists());
        let bee = dir.path().join("sub/bee");
        assert_eq!(std::fs::read_to_string(&bee).unwrap(), "2");
        assert_eq!(
            std::fs::metadata(&bee).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
