//! The CSI Node service: stage = loop device + ext4 + mount at the staging path, publish =
//! bind mount into the pod's directory, and their inverses, stats and online expansion.
//!
//! Usable bytes: a claim of N bytes gets at least N bytes a pod can write, and less than
//! N + 1 MiB. At the first stage the filesystem is formatted (`-m 0`) with a block count that
//! leaves N + 512 KiB available (statvfs f_bavail, which already excludes ext4's own metadata
//! reserve): the overhead of a given mke2fs is measured, not guessed, by formatting, mounting
//! and adjusting (usually once; the size that worked is remembered per capacity).

use crate::driver::{blocking, check_capability, io_status, read_only_mode, Driver};
use crate::proto::csi::v1 as csi;
use crate::sys;
use crate::volumes::valid_id;
use csi::node_service_capability::{self as cap, rpc::Type as Rpc};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};

const BLOCK: u64 = 4096;
/// The window of available bytes beyond the capacity a fresh filesystem is sized into.
const SLACK_LOW: u64 = 256 << 10;
const SLACK_TARGET: u64 = 512 << 10;
const SLACK_HIGH: u64 = 768 << 10;
const SIZING_ATTEMPTS: usize = 6;

pub struct Node {
    pub driver: Arc<Driver>,
}

fn required(name: &str, v: &str) -> Result<PathBuf, Status> {
    if v.is_empty() {
        return Err(Status::invalid_argument(format!("{name} is required")));
    }
    Ok(PathBuf::from(v))
}

fn volume_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if !valid_id(id) {
        return Err(Status::not_found(format!("no volume {id:?}")));
    }
    Ok(())
}

fn io(what: &'static str) -> impl FnOnce(io::Error) -> Status {
    move |e| io_status(what, e)
}

/// A first guess at the ext4 block count that leaves `capacity` bytes available with
/// mke2fs's defaults: journal by device size, 256-byte inodes per 16 KiB, ext4's metadata
/// reserve (2%, at most 4096 blocks), group descriptors.
fn estimate_blocks(capacity: u64) -> u64 {
    let b = capacity.div_ceil(BLOCK);
    let journal = match b {
        b if b < 32_768 => 1_024,
        b if b < 262_144 => 4_096,
        b if b < 524_288 => 8_192,
        b if b < 4_194_304 => 16_384,
        b if b < 8_388_608 => 32_768,
        b if b < 16_777_216 => 65_536,
        b if b < 33_554_432 => 131_072,
        _ => 262_144,
    };
    b + journal + b / 60 + (b / 50).min(4_096) + 128
}

fn stage(d: &Driver, id: &str, staging: &Path) -> Result<(), Status> {
    let capacity = d
        .store
        .capacity(id)
        .map_err(io("reading the volume"))?
        .ok_or_else(|| Status::not_found(format!("no volume {id} on node {}", d.node)))?;
    let image = d.store.image(id);
    std::fs::create_dir_all(staging).map_err(io("creating the staging directory"))?;
    if let Some(m) = sys::mount_at(staging).map_err(io("mountinfo"))? {
        let ours = match sys::loop_of(&m) {
            Some(dev) => sys::loop_backs(&dev, &image).map_err(io("loop device"))?,
            None => false,
        };
        return match ours {
            true => Ok(()),
            false => Err(Status::already_exists(format!(
                "{} already has another mount ({} {})",
                staging.display(),
                m.fs_type,
                m.source
            ))),
        };
    }
    let dev = match sys::find_loop_for(&image).map_err(io("loop devices"))? {
        // staged at another path too: the same device, the same filesystem
        Some(path) => sys::LoopDevice {
            file: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io("opening the loop device"))?,
            path,
        },
        None => sys::attach_loop(&image).map_err(io("attaching a loop device"))?,
    };
    if sys::has_ext_fs(&dev.file).map_err(io("reading the superblock"))? {
        sys::mount_ext4(&dev.path, staging).map_err(io("mounting"))?;
        // grown (ControllerExpandVolume) since it was last staged: grow the filesystem
        // now, before anyone uses it (best effort: the volume works at its old size)
        let avail = sys::usage(staging).map_err(io("statvfs"))?.available_bytes;
        if avail < capacity {
            if let Err(e) = grow_fs(&dev.path, staging, capacity) {
                tracing::warn!(volume = %id, error = %e.message(), "growing the filesystem at stage failed");
            }
        }
    } else {
        format_sized(d, &dev, capacity, staging)?;
    }
    tracing::info!(volume = %id, device = %dev.path.display(), staging = %staging.display(), "volume staged");
    // The mount holds the device now; autoclear detaches it when the last mount goes.
    Ok(())
}

/// Formats `dev` so that `capacity` bytes (and less than a MiB more) are available, and
/// leaves it mounted at `staging`.
fn format_sized(
    d: &Driver,
    dev: &sys::LoopDevice,
    capacity: u64,
    staging: &Path,
) -> Result<(), Status> {
    let dev_blocks = sys::block_size_bytes(&dev.file).map_err(io("device size"))? / BLOCK;
    let cached = d
        .fs_blocks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&capacity)
        .copied();
    let mut blocks = cached
        .unwrap_or_else(|| estimate_blocks(capacity))
        .min(dev_blocks);
    for attempt in 1..=SIZING_ATTEMPTS {
        sys::mkfs_ext4(&dev.path, blocks).map_err(io("mkfs.ext4"))?;
        sys::mount_ext4(&dev.path, staging).map_err(io("mounting"))?;
        let avail = match sys::usage(staging) {
            Ok(u) => u.available_bytes,
            Err(e) => {
                let _ = sys::umount(staging);
                return Err(io_status("statvfs", e));
            }
        };
        let next = (blocks as i64 + (capacity + SLACK_TARGET) as i64 / BLOCK as i64
            - avail as i64 / BLOCK as i64)
            .clamp(1, dev_blocks as i64) as u64;
        let exact = (capacity + SLACK_LOW..=capacity + SLACK_HIGH).contains(&avail);
        if exact || ((attempt == SIZING_ATTEMPTS || next == blocks) && avail >= capacity) {
            if exact {
                d.fs_blocks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(capacity, blocks);
            }
            tracing::debug!(capacity, blocks, avail, attempt, "filesystem sized");
            return Ok(());
        }
        sys::umount(staging).map_err(io("unmounting"))?;
        if next == blocks {
            break;
        }
        blocks = next;
    }
    Err(Status::internal(format!(
        "could not size an ext4 filesystem with {capacity} available bytes on {} ({dev_blocks} blocks)",
        dev.path.display()
    )))
}

fn unstage(staging: &Path) -> Result<(), Status> {
    while sys::mount_at(staging).map_err(io("mountinfo"))?.is_some() {
        sys::umount(staging).map_err(io("unmounting the staging path"))?;
    }
    // The CO removes the directory too; an error here (not empty, gone) changes nothing.
    let _ = std::fs::remove_dir(staging);
    Ok(())
}

fn publish(staging: &Path, target: &Path, readonly: bool) -> Result<(), Status> {
    let staged = sys::mount_at(staging)
        .map_err(io("mountinfo"))?
        .ok_or_else(|| {
            Status::failed_precondition(format!("nothing is staged at {}", staging.display()))
        })?;
    if let Some(m) = sys::mount_at(target).map_err(io("mountinfo"))? {
        let same = (m.major, m.minor) == (staged.major, staged.minor);
        let ro = m.options.split(',').any(|o| o == "ro");
        return match same && ro == readonly {
            true => Ok(()),
            false => Err(Status::already_exists(format!(
                "{} is already mounted ({} {}, {})",
                target.display(),
                m.fs_type,
                m.source,
                m.options
            ))),
        };
    }
    std::fs::create_dir_all(target).map_err(io("creating the target directory"))?;
    sys::bind(staging, target, readonly).map_err(io("bind mount"))?;
    Ok(())
}

fn unpublish(target: &Path) -> Result<(), Status> {
    while sys::mount_at(target).map_err(io("mountinfo"))?.is_some() {
        sys::umount(target).map_err(io("unmounting the target path"))?;
    }
    match std::fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_status("removing the target directory", e)),
    }
}

fn stats(path: &Path) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
    if !path.exists() {
        return Err(Status::not_found(format!(
            "{} does not exist",
            path.display()
        )));
    }
    if sys::mount_at(path).map_err(io("mountinfo"))?.is_none() {
        return Err(Status::not_found(format!(
            "no volume is mounted at {}",
            path.display()
        )));
    }
    let u = sys::usage(path).map_err(io("statvfs"))?;
    use csi::volume_usage::Unit;
    Ok(csi::NodeGetVolumeStatsResponse {
        usage: vec![
            csi::VolumeUsage {
                available: u.available_bytes as i64,
                total: u.total_bytes as i64,
                used: (u.total_bytes - u.free_bytes) as i64,
                unit: Unit::Bytes as i32,
            },
            csi::VolumeUsage {
                available: u.free_inodes as i64,
                total: u.total_inodes as i64,
                used: (u.total_inodes - u.free_inodes) as i64,
                unit: Unit::Inodes as i32,
            },
        ],
        volume_condition: Some(csi::VolumeCondition {
            abnormal: false,
            message: String::new(),
        }),
    })
}

/// Grows the filesystem of the loop device `dev_path`, mounted at `path`, until `capacity`
/// bytes are available: the loop device first takes the (already grown) file's size, then
/// resize2fs grows the filesystem, a few blocks more if new groups' inode tables took more
/// than estimated. Online when this process may (CAP_SYS_RESOURCE); else `path` must be the
/// device's only mount (staged, not published), unmounted around each resize2fs (the open
/// device keeps autoclear from detaching the loop meanwhile).
fn grow_fs(dev_path: &Path, path: &Path, capacity: u64) -> Result<(), Status> {
    let dev = std::fs::File::open(dev_path).map_err(io("opening the loop device"))?;
    sys::loop_set_capacity(&dev).map_err(io("LOOP_SET_CAPACITY"))?;
    let dev_blocks = sys::block_size_bytes(&dev).map_err(io("device size"))? / BLOCK;
    let online = sys::can_resize_online();
    for _ in 0..SIZING_ATTEMPTS {
        let avail = sys::usage(path).map_err(io("statvfs"))?.available_bytes;
        if avail >= capacity + SLACK_LOW {
            break;
        }
        let (bs, blocks) = sys::ext_geometry(&dev).map_err(io("reading the superblock"))?;
        if bs != BLOCK {
            return Err(Status::internal(format!("unexpected block size {bs}")));
        }
        let deficit = (capacity + SLACK_TARGET - avail).div_ceil(BLOCK);
        // new groups bring their inode tables (1/64) and bitmaps
        let next = (blocks + deficit + deficit / 60 + 2).min(dev_blocks);
        if next <= blocks {
            break;
        }
        if online {
            sys::resize2fs(dev_path, next).map_err(io("resize2fs"))?;
            continue;
        }
        let m = sys::mount_at(path)
            .map_err(io("mountinfo"))?
            .ok_or_else(|| {
                Status::not_found(format!("nothing is mounted at {}", path.display()))
            })?;
        let mounts = sys::mounts_of(m.major, m.minor).map_err(io("mountinfo"))?;
        if mounts.len() > 1 {
            return Err(Status::failed_precondition(format!(
                "the filesystem is in use ({} mounts): this driver may not grow a mounted \
                 filesystem here (no CAP_SYS_RESOURCE), so it grows while only staged \
                 (NodeExpandVolume on the staging path, or the next NodeStageVolume)",
                mounts.len()
            )));
        }
        sys::umount(path).map_err(io("unmounting to resize"))?;
        let resized = sys::resize2fs(dev_path, next).map_err(io("resize2fs"));
        sys::mount_ext4(dev_path, path).map_err(io("mounting after resize"))?;
        resized?;
    }
    let avail = sys::usage(path).map_err(io("statvfs"))?.available_bytes;
    if avail < capacity {
        return Err(Status::internal(format!(
            "the filesystem has {avail} available bytes after resizing, less than {capacity}"
        )));
    }
    Ok(())
}

/// NodeExpandVolume: the volume's filesystem at `path` grows to its (grown) capacity.
fn expand(d: &Driver, id: &str, path: &Path, capacity: Option<u64>) -> Result<u64, Status> {
    let stored = d
        .store
        .capacity(id)
        .map_err(io("reading the volume"))?
        .ok_or_else(|| Status::not_found(format!("no volume {id} on node {}", d.node)))?;
    let capacity = capacity.unwrap_or(stored).max(stored);
    let m = sys::mount_at(path)
        .map_err(io("mountinfo"))?
        .ok_or_else(|| Status::not_found(format!("no volume is mounted at {}", path.display())))?;
    let image = d.store.image(id);
    let dev_path = sys::loop_of(&m)
        .filter(|dev| sys::loop_backs(dev, &image).unwrap_or(false))
        .ok_or_else(|| {
            Status::invalid_argument(format!("{} is not volume {id}", path.display()))
        })?;
    grow_fs(&dev_path, path, capacity)?;
    tracing::info!(volume = %id, capacity, "filesystem expanded");
    Ok(capacity)
}

#[tonic::async_trait]
impl csi::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            volume_id(&req.volume_id)?;
            let staging = required("staging_target_path", &req.staging_target_path)?;
            let c = req
                .volume_capability
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
            check_capability(c)?;
            let _g = self.driver.lock_volume(&req.volume_id).await;
            let d = self.driver.clone();
            let id = req.volume_id.clone();
            blocking(move || stage(&d, &id, &staging)).await
        }
        .await;
        self.driver.metrics.observe("NodeStageVolume", start, &r);
        if let Err(e) = &r {
            tracing::warn!(volume = %req.volume_id, code = ?e.code(), message = e.message(), "NodeStageVolume failed");
        }
        r.map(|()| Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let staging = required("staging_target_path", &req.staging_target_path)?;
            let _g = self.driver.lock_volume(&req.volume_id).await;
            blocking(move || unstage(&staging)).await
        }
        .await;
        self.driver.metrics.observe("NodeUnstageVolume", start, &r);
        r.map(|()| Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            volume_id(&req.volume_id)?;
            let staging = required("staging_target_path", &req.staging_target_path)?;
            let target = required("target_path", &req.target_path)?;
            let c = req
                .volume_capability
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
            check_capability(c)?;
            let readonly = req.readonly || read_only_mode(Some(c));
            blocking(move || publish(&staging, &target, readonly)).await
        }
        .await;
        self.driver.metrics.observe("NodePublishVolume", start, &r);
        r.map(|()| Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let target = required("target_path", &req.target_path)?;
            blocking(move || unpublish(&target)).await
        }
        .await;
        self.driver
            .metrics
            .observe("NodeUnpublishVolume", start, &r);
        r.map(|()| Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let path = required("volume_path", &req.volume_path)?;
            blocking(move || stats(&path)).await
        }
        .await;
        self.driver.metrics.observe("NodeGetVolumeStats", start, &r);
        r.map(Response::new)
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let r = async {
            volume_id(&req.volume_id)?;
            let path = required("volume_path", &req.volume_path)?;
            if let Some(c) = &req.volume_capability {
                check_capability(c)?;
            }
            let want = req
                .capacity_range
                .as_ref()
                .map(|r| r.required_bytes.max(0) as u64)
                .filter(|b| *b > 0);
            let _g = self.driver.lock_volume(&req.volume_id).await;
            let d = self.driver.clone();
            let id = req.volume_id.clone();
            blocking(move || expand(&d, &id, &path, want)).await
        }
        .await;
        self.driver.metrics.observe("NodeExpandVolume", start, &r);
        r.map(|c| {
            Response::new(csi::NodeExpandVolumeResponse {
                capacity_bytes: c as i64,
            })
        })
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: Rpc| csi::NodeServiceCapability {
            r#type: Some(cap::Type::Rpc(cap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Rpc::StageUnstageVolume),
                rpc(Rpc::GetVolumeStats),
                rpc(Rpc::ExpandVolume),
                rpc(Rpc::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.driver.node.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(self.driver.topology()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_guess_leaves_room_for_the_capacity() {
        for gib in [1u64, 2, 20] {
            let cap = gib << 30;
            assert!(estimate_blocks(cap) * BLOCK > cap + (64 << 20));
            assert!(estimate_blocks(cap) * BLOCK < crate::volumes::file_size(cap));
        }
    }
}
