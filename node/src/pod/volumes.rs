//! Pod volumes on the node: emptyDir, configMap, secret, downwardAPI and projected
//! (serviceAccountToken, configMap, secret, downwardAPI sources: files the agent writes under
//! the pod's directory, atomically, mounted read-only), hostPath, and persistentVolumeClaim
//! (a CSI volume published into the pod's directory by its driver, see `crate::csi`), and the
//! CRI mounts of each container. A projected token is renewed by the pod's worker at [`Volumes::refresh_due`].

use super::atomic_dir::{self, PayloadFile};
use super::env::{config_map_data, field, secret_data, PodFacts};
use super::{token, Objects};
use crate::csi::volumes::ClaimVolume;
use crate::csi::CsiVolumes;
use crate::layout::Layout;
use control_plane::machinery::quantity::Quantity;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource,
};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

/// A volume that could not be set up (the pod waits, with a FailedMount event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// Whether a container may write to a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    /// configMap, secret, downwardAPI and projected volumes: whatever the mount says.
    ReadOnly,
}

#[derive(Debug, Clone)]
struct HostVolume {
    path: PathBuf,
    access: Access,
}

/// The host path behind each of a pod's volumes, and when its tokens must be renewed.
#[derive(Debug, Default, Clone)]
pub struct Volumes {
    host_paths: HashMap<String, HostVolume>,
    refresh: Option<SystemTime>,
}

fn err(volume: &str, message: impl Into<String>) -> VolumeError {
    VolumeError {
        volume: volume.into(),
        message: message.into(),
    }
}

/// Creates or refreshes every volume of the pod under `layout.pod_dir(uid)/volumes`; a
/// PersistentVolumeClaim's volume is staged and published by its CSI driver (`csi`).
pub async fn prepare(
    facts: &PodFacts<'_>,
    layout: &Layout,
    objects: &dyn Objects,
    csi: Option<&CsiVolumes>,
) -> Result<Volumes, VolumeError> {
    let pod = facts.pod;
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let root = layout.pod_dir(uid).join("volumes");
    let mut out = Volumes::default();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let io = |e: std::io::Error| err(&v.name, e.to_string());
        // What the API projects into a pod is never the pod's to change.
        let mut access = Access::ReadOnly;
        let path = if let Some(ed) = &v.empty_dir {
            access = Access::ReadWrite;
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
            let mode = src.default_mode.unwrap_or(DEFAULT_MODE);
            let data = config_map(objects, ns, &src.name, src.optional)
                .await
                .map_err(|e| err(&v.name, e))?;
            let p = root.join("configmap").join(&v.name);
            atomic_dir::write(&p, &select(&data, src.items.as_deref(), mode)).map_err(io)?;
            p
        } else if let Some(src) = &v.secret {
            let mode = src.default_mode.unwrap_or(DEFAULT_MODE);
            let name = src.secret_name.clone().unwrap_or_default();
            let data = secret(objects, ns, &name, src.optional)
                .await
                .map_err(|e| err(&v.name, e))?;
            let p = root.join("secret").join(&v.name);
            atomic_dir::write(&p, &select(&data, src.items.as_deref(), mode)).map_err(io)?;
            p
        } else if let Some(src) = &v.downward_api {
            let mode = src.default_mode.unwrap_or(DEFAULT_MODE);
            let files = downward(facts, src.items.as_deref(), mode).map_err(|e| err(&v.name, e))?;
            let p = root.join("downward-api").join(&v.name);
            atomic_dir::write(&p, &files).map_err(io)?;
            p
        } else if let Some(src) = &v.projected {
            let files = projected(facts, ns, src, objects, &mut out.refresh)
                .await
                .map_err(|e| err(&v.name, e))?;
            let p = root.join("projected").join(&v.name);
            atomic_dir::write(&p, &files).map_err(io)?;
            p
        } else if let Some(src) = &v.persistent_volume_claim {
            if !src.read_only.unwrap_or(false) {
                access = Access::ReadWrite;
            }
            claim_volume(
                (uid, pod.metadata.name.as_deref().unwrap_or_default()),
                ns,
                &src.claim_name,
                src.read_only,
                objects,
                csi,
            )
            .await
            .map_err(|e| err(&v.name, e))?
        } else if v.csi.is_some() {
            return Err(err(
                &v.name,
                "inline CSI ephemeral volumes are not supported on this node: use a \
                 persistentVolumeClaim",
            ));
        } else if let Some(src) = &v.host_path {
            access = Access::ReadWrite;
            // `/var/lib/kubelet[/...]` is this agent's root dir (several share a machine).
            let p = layout.host_path(Path::new(&src.path));
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
        out.host_paths
            .insert(v.name.clone(), HostVolume { path, access });
    }
    Ok(out)
}

/// A claim's volume: the claim must be Bound, its PV a CSI volume of a driver registered
/// here; staged and published into the pod, the published directory is what containers mount.
async fn claim_volume(
    (pod_uid, pod_name): (&str, &str),
    ns: &str,
    claim_name: &str,
    read_only: Option<bool>,
    objects: &dyn Objects,
    csi: Option<&CsiVolumes>,
) -> Result<PathBuf, String> {
    let claim = objects
        .persistent_volume_claim(ns, claim_name)
        .await?
        .ok_or_else(|| format!("persistentvolumeclaim \"{claim_name}\" not found"))?;
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty());
    let Some(pv_name) = pv_name.filter(|_| bound) else {
        return Err(format!(
            "persistentvolumeclaim \"{claim_name}\" is not bound"
        ));
    };
    let pv = objects
        .persistent_volume(&pv_name)
        .await?
        .ok_or_else(|| format!("persistentvolume \"{pv_name}\" not found"))?;
    let csi = csi.ok_or("persistent volumes are not supported on this node")?;
    csi.publish(ClaimVolume {
        pod_uid,
        pod_name,
        namespace: ns,
        claim: claim_name,
        pvc: Some(&claim),
        pv: &pv,
        readonly: read_only.unwrap_or(false),
    })
    .await
}

/// Files' mode when the volume says none (the API's default, 0644).
const DEFAULT_MODE: i32 = 0o644;

/// A ConfigMap's data; an absent optional one is empty.
async fn config_map(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, String>, String> {
    match config_map_data(objects, ns, name).await.map_err(|e| e.0)? {
        Some(d) => Ok(d),
        None if optional.unwrap_or(false) => Ok(BTreeMap::new()),
        None => Err(format!("configmap \"{name}\" not found")),
    }
}

/// A Secret's data; an absent optional one is empty.
async fn secret(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<BTreeMap<String, String>, String> {
    match secret_data(objects, ns, name).await.map_err(|e| e.0)? {
        Some(d) => Ok(d),
        None if optional.unwrap_or(false) => Ok(BTreeMap::new()),
        None => Err(format!("secret \"{name}\" not found")),
    }
}

/// The files of a downwardAPI volume or projection (fieldRef items; others are skipped).
fn downward(
    facts: &PodFacts<'_>,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: i32,
) -> Result<Vec<PayloadFile>, String> {
    let mut files = Vec::new();
    for item in items.into_iter().flatten() {
        let Some(f) = &item.field_ref else { continue };
        let value = field(facts, &f.field_path).map_err(|e| e.0)?;
        files.extend(PayloadFile::new(
            &item.path,
            value,
            item.mode.unwrap_or(mode),
        ));
    }
    Ok(files)
}

/// The files of a projected volume: each source's, in order; a service account token is
/// requested for the pod, and `refresh` lowered to when it must be renewed.
async fn projected(
    facts: &PodFacts<'_>,
    ns: &str,
    src: &ProjectedVolumeSource,
    objects: &dyn Objects,
    refresh: &mut Option<SystemTime>,
) -> Result<Vec<PayloadFile>, String> {
    let mode = src.default_mode.unwrap_or(DEFAULT_MODE);
    let mut files = Vec::new();
    for s in src.sources.iter().flatten() {
        if let Some(cm) = &s.config_map {
            let data = config_map(objects, ns, &cm.name, cm.optional).await?;
            files.extend(select(&data, cm.items.as_deref(), mode));
        } else if let Some(sec) = &s.secret {
            let data = secret(objects, ns, &sec.name, sec.optional).await?;
            files.extend(select(&data, sec.items.as_deref(), mode));
        } else if let Some(d) = &s.downward_api {
            files.extend(downward(facts, d.items.as_deref(), mode)?);
        } else if let Some(t) = &s.service_account_token {
            let account = token::service_account(facts.pod);
            let issued_at = SystemTime::now();
            let issued = objects
                .service_account_token(ns, account, token::request(facts.pod, t))
                .await
                .map_err(|e| format!("failed to fetch token: {e}"))?;
            let due = token::refresh_at(issued_at, issued.expires);
            *refresh = Some(refresh.map_or(due, |r| r.min(due)));
            files.extend(PayloadFile::new(&t.path, issued.token, mode));
        } else {
            return Err("unsupported projected volume source on this node".into());
        }
    }
    Ok(files)
}

/// `data` as files (only `items` if given, each with its own mode if it has one).
fn select(
    data: &BTreeMap<String, String>,
    items: Option<&[KeyToPath]>,
    mode: i32,
) -> Vec<PayloadFile> {
    match items {
        Some(items) => items
            .iter()
            .filter_map(|i| {
                let value = data.get(&i.key)?;
                PayloadFile::new(&i.path, value.as_bytes(), i.mode.unwrap_or(mode))
            })
            .collect(),
        None => data
            .iter()
            .filter_map(|(k, v)| PayloadFile::new(k, v.as_bytes(), mode))
            .collect(),
    }
}

/// `dir/rel` when `rel` stays inside `dir` (no `..`, not absolute): paths come from the API.
fn safe_join(dir: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel);
    rel.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| dir.join(rel))
}

impl Volumes {
    /// When the projected service account tokens must be renewed (None: the pod has none).
    pub fn refresh_due(&self) -> Option<SystemTime> {
        self.refresh
    }

    /// A renewal failed: try again at `at` (the tokens in place stay valid until then).
    pub fn retry_refresh_at(&mut self, at: SystemTime) {
        self.refresh = Some(at);
    }

    /// The CRI mounts for one container's volumeMounts.
    pub fn mounts(&self, container: &Container) -> Result<Vec<cri::Mount>, VolumeError> {
        let mut out = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let Some(HostVolume { path: host, access }) = self.host_paths.get(&m.name) else {
                return Err(err(&m.name, "no volume of that name in the pod"));
            };
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    let p = safe_join(host, sub)
                        .ok_or_else(|| err(&m.name, format!("invalid subPath {sub:?}")))?;
                    if !p.exists() {
                        std::fs::create_dir_all(&p).map_err(|e| err(&m.name, e.to_string()))?;
                    }
                    // A symlink inside the volume must not lead the mount out of it.
                    let inside = match (p.canonicalize(), host.canonicalize()) {
                        (Ok(real), Ok(base)) => real.starts_with(base),
                        _ => false,
                    };
                    if !inside {
                        return Err(err(
                            &m.name,
                            format!("subPath {sub:?} leads outside the volume"),
                        ));
                    }
                    p
                }
                None => host.clone(),
            };
            out.push(cri::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: *access == Access::ReadOnly || m.read_only.unwrap_or(false),
                propagation: propagation(m.mount_propagation.as_deref()) as i32,
                ..Default::default()
            });
        }
        Ok(out)
    }
}

/// A volumeMount's mountPropagation as the CRI says it: `HostToContainer` is rslave (mounts
/// made on the host later appear inside, as an eBPF agent's bpffs must), `Bidirectional`
/// rshared (the API server admits it for privileged containers only), anything else private.
fn propagation(mode: Option<&str>) -> cri::MountPropagation {
    match mode {
        Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
        _ => cri::MountPropagation::PropagationPrivate,
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
    fn mount_propagation_as_the_cri_says_it() {
        use cri::MountPropagation as P;
        assert_eq!(
            propagation(Some("HostToContainer")),
            P::PropagationHostToContainer
        );
        assert_eq!(
            propagation(Some("Bidirectional")),
            P::PropagationBidirectional
        );
        assert_eq!(propagation(Some("None")), P::PropagationPrivate);
        assert_eq!(propagation(None), P::PropagationPrivate);
    }

    #[test]
    fn files_from_items_with_modes() {
        let mut data = BTreeMap::new();
        data.insert("a".to_string(), "1".to_string());
        data.insert("b".to_string(), "2".to_string());
        let items = [
            KeyToPath {
                key: "b".into(),
                path: "sub/bee".into(),
                mode: Some(0o600),
            },
            KeyToPath {
                key: "a".into(),
                path: "../escape".into(),
                mode: None,
            },
        ];
        let files = select(&data, Some(&items), 0o644);
        assert_eq!(
            files,
            vec![PayloadFile::new("sub/bee", "2", 0o600).unwrap()]
        );
        assert_eq!(select(&data, None, 0o640).len(), 2);
        assert!(select(&data, None, 0o640).iter().all(|f| f.mode == 0o640));
    }
}
