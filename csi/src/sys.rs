//! The Linux parts of a volume's life on a node, as blocking calls (the gRPC handlers run them
//! on tokio's blocking pool): loop devices through the loop-control/loop ioctls, the ext4
//! superblock read directly, mounts through mount(2) and /proc/self/mountinfo, and the two
//! e2fsprogs tools (mkfs.ext4, resize2fs) the image ships.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

// <linux/loop.h>
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
// <linux/fs.h>: BLKGETSIZE64 = _IOR(0x12, 114, size_t)
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// The major number of loop devices.
const LOOP_MAJOR: u64 = 7;

#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn zeroed_info() -> LoopInfo64 {
    LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    }
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An attached loop device, held open: with autoclear the kernel detaches it when the last
/// holder (this handle, then the mount) lets go, so a failed stage leaves nothing behind.
pub struct LoopDevice {
    pub path: PathBuf,
    pub file: File,
}

fn open_loop(n: u32) -> io::Result<File> {
    let path = PathBuf::from(format!("/dev/loop{n}"));
    match OpenOptions::new().read(true).write(true).open(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A /dev that is not devtmpfs does not get the node by itself.
            let dev = libc::makedev(LOOP_MAJOR as u32, n);
            nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFBLK,
                nix::sys::stat::Mode::from_bits_truncate(0o660),
                dev,
            )
            .map_err(io::Error::from)?;
            OpenOptions::new().read(true).write(true).open(&path)
        }
        r => r,
    }
}

/// Attaches `backing` to a free loop device (LOOP_CTL_GET_FREE, then LOOP_CONFIGURE with
/// autoclear). Another process may take the same free device between the two calls: that
/// shows as EBUSY and is retried with the next free one.
pub fn attach_loop(backing: &Path) -> io::Result<LoopDevice> {
    let file = OpenOptions::new().read(true).write(true).open(backing)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = io::Error::other("no free loop device");
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) })?;
        let dev = open_loop(n as u32)?;
        let mut cfg = LoopConfig {
            fd: file.as_raw_fd() as u32,
            block_size: 0,
            info: zeroed_info(),
            reserved: [0; 8],
        };
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        let name = backing.as_os_str().as_encoded_bytes();
        let len = name.len().min(63);
        cfg.info.lo_file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: cfg is a valid struct loop_config that outlives the call.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg) };
        match check(r) {
            Ok(_) => {
                return Ok(LoopDevice {
                    path: PathBuf::from(format!("/dev/loop{n}")),
                    file: dev,
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The (st_dev, st_ino) of the file behind the loop device `dev`, None when it is unbound.
pub fn loop_backing(dev: &File) -> io::Result<Option<(u64, u64)>> {
    let mut info = zeroed_info();
    // SAFETY: info is a valid struct loop_info64 the kernel fills in.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    match check(r) {
        Ok(_) => Ok(Some((info.lo_device, info.lo_inode))),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Re-reads the backing file's size after it grew (LOOP_SET_CAPACITY).
pub fn loop_set_capacity(dev: &File) -> io::Result<()> {
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_CAPACITY as _, 0) }).map(|_| ())
}

/// A block device's size in bytes.
pub fn block_size_bytes(dev: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), BLKGETSIZE64 as _, &mut size) })?;
    Ok(size)
}

/// The loop device currently backed by `file` (matched by device and inode), if any.
pub fn find_loop_for(file: &Path) -> io::Result<Option<PathBuf>> {
    let meta = std::fs::metadata(file)?;
    let want = (meta.dev(), meta.ino());
    let entries = match std::fs::read_dir("/sys/block") {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("loop") || !entry.path().join("loop").exists() {
            continue;
        }
        let dev = PathBuf::from("/dev").join(name);
        let Ok(f) = File::open(&dev) else { continue };
        if loop_backing(&f)? == Some(want) {
            return Ok(Some(dev));
        }
    }
    Ok(None)
}

/// Whether `dev` (a loop device path) is bound to `file`.
pub fn loop_backs(dev: &Path, file: &Path) -> io::Result<bool> {
    let meta = std::fs::metadata(file)?;
    let f = File::open(dev)?;
    Ok(loop_backing(&f)? == Some((meta.dev(), meta.ino())))
}

/// The ext2/3/4 superblock magic, little endian at byte 1080 of the device (superblock at
/// 1024, s_magic at 56).
const EXT_MAGIC: u16 = 0xEF53;

/// Whether the device already carries an ext4 (ext2/3) filesystem.
pub fn has_ext_fs(dev: &File) -> io::Result<bool> {
    let mut b = [0u8; 2];
    match dev.read_exact_at(&mut b, 1080) {
        Ok(()) => Ok(u16::from_le_bytes(b) == EXT_MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// (block size, blocks count) from the ext4 superblock.
pub fn ext_geometry(dev: &File) -> io::Result<(u64, u64)> {
    let mut sb = [0u8; 1024];
    dev.read_exact_at(&mut sb, 1024)?;
    let u32_at = |o: usize| u32::from_le_bytes([sb[o], sb[o + 1], sb[o + 2], sb[o + 3]]) as u64;
    if u16::from_le_bytes([sb[56], sb[57]]) != EXT_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no ext4 superblock",
        ));
    }
    let block = 1024u64 << u32_at(24);
    let mut blocks = u32_at(4);
    // INCOMPAT_64BIT: the high half of the count is valid.
    if u32_at(0x60) & 0x80 != 0 {
        blocks |= u32_at(0x150) << 32;
    }
    Ok((block, blocks))
}

/// A program of e2fsprogs: on PATH, else in /sbin or /usr/sbin (a container's PATH may
/// leave those out).
pub fn tool(name: &str) -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/sbin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} not found")))
}

fn run(program: &Path, args: &[&OsStr]) -> io::Result<()> {
    let out = Command::new(program).args(args).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} {}: {}: {}",
        program.display(),
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Formats `dev` as ext4 of `blocks` 4 KiB blocks: no root reserve (-m 0: a claim's bytes are
/// all the pod's), no discard (a fresh sparse file has nothing to discard), lazy inode table
/// and journal initialisation (formatting takes milliseconds, not seconds).
pub fn mkfs_ext4(dev: &Path, blocks: u64) -> io::Result<()> {
    let blocks = blocks.to_string();
    run(
        &tool("mkfs.ext4")?,
        &[
            "-F".as_ref(),
            "-q".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-b".as_ref(),
            "4096".as_ref(),
            "-E".as_ref(),
            "nodiscard,lazy_itable_init=1,lazy_journal_init=1".as_ref(),
            dev.as_os_str(),
            blocks.as_ref(),
        ],
    )
}

/// Grows the ext4 on `dev` to `blocks` filesystem blocks: online when it is mounted (the
/// kernel requires CAP_SYS_RESOURCE for that), else offline; `-f` because resize2fs wants a
/// fresh fsck of an unmounted filesystem, and ours was just unmounted cleanly by us.
pub fn resize2fs(dev: &Path, blocks: u64) -> io::Result<()> {
    let blocks = blocks.to_string();
    run(
        &tool("resize2fs")?,
        &["-f".as_ref(), dev.as_os_str(), blocks.as_ref()],
    )
}

/// Whether this process may grow a mounted ext4 (online resize needs CAP_SYS_RESOURCE, which
/// some sandboxes withhold even from root and privileged containers).
pub fn can_resize_online() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The mounts of the device `major:minor` (the staging mount and its bind mounts).
pub fn mounts_of(major: u64, minor: u64) -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .filter(|m| (m.major, m.minor) == (major, minor))
        .collect())
}

/// One line of /proc/self/mountinfo, the parts used here.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// The device (st_dev of files on it): major, minor.
    pub major: u64,
    pub minor: u64,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    pub options: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (major, minor) = l.get(2)?.split_once(':')?;
            Some(MountEntry {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
                mount_point: PathBuf::from(unescape(l.get(4)?)),
                options: l.get(5)?.to_string(),
                fs_type: r.first()?.to_string(),
                source: unescape(r.get(1)?),
            })
        })
        .collect()
}

/// The topmost mount at exactly `path` (after resolving symlinks), if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// The loop device behind a mount, from its device number.
pub fn loop_of(mount: &MountEntry) -> Option<PathBuf> {
    (mount.major == LOOP_MAJOR).then(|| PathBuf::from(format!("/dev/loop{}", mount.minor)))
}

/// Mounts the ext4 on `dev` at `target`.
pub fn mount_ext4(dev: &Path, target: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(dev),
        target,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Bind-mounts `source` at `target`, read-only when asked (a bind mount takes MS_RDONLY
/// only on a remount).
pub fn bind(source: &Path, target: &Path, readonly: bool) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    if readonly {
        let r = mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        );
        if let Err(e) = r {
            let _ = umount(target);
            return Err(e.into());
        }
    }
    Ok(())
}

pub fn umount(target: &Path) -> io::Result<()> {
    nix::mount::umount(target).map_err(io::Error::from)
}

/// Filesystem usage at a path (statvfs), in bytes and inodes.
pub struct FsUsage {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub available_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

pub fn usage(path: &Path) -> io::Result<FsUsage> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frag = s.fragment_size() as u64;
    Ok(FsUsage {
        total_bytes: s.blocks() as u64 * frag,
        free_bytes: s.blocks_free() as u64 * frag,
        available_bytes: s.blocks_available() as u64 * frag,
        total_inodes: s.files() as u64,
        free_inodes: s.files_free() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let text =
            "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop3 rw,errors=continue\n\
                    37 35 0:21 / /proc rw shared:2 - proc proc rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!((m[0].major, m[0].minor), (98, 0));
        assert_eq!(m[0].fs_type, "ext4");
        assert_eq!(m[0].source, "/dev/loop3");
        assert_eq!(m[1].options, "rw");
        assert_eq!(loop_of(&m[0]), None);
    }
}
