//! The bpf(2) commands skiff issues itself, where aya 0.14 has no API: opening a pinned
//! object, replacing a link's program, plain maps for the fence and the UDP destroy set,
//! and loading a program from instructions assembled here (aya cannot relocate kfunc
//! calls, which the UDP socket iterator needs).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_ITER_CREATE: libc::c_long = 33;

/// Runs one bpf(2) command on a fully initialised attribute struct.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: attr is a live, fully initialised repr(C) struct of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn new_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

#[repr(C)]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
}

/// Opens a pinned bpffs object (a link, a map).
pub fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: c.as_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_OBJ_GET, &mut attr).map(new_fd)
}

#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Makes `link` run `prog` from now on, atomically.
pub fn link_update(link: &OwnedFd, prog: RawFd) -> io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: prog as u32,
        ..Default::default()
    };
    bpf(BPF_LINK_UPDATE, &mut attr).map(|_| ())
}

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

#[repr(C)]
#[derive(Default)]
pub struct MapSpec {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: u32,
}

pub fn map_create(mut spec: MapSpec) -> io::Result<OwnedFd> {
    bpf(BPF_MAP_CREATE, &mut spec).map(new_fd)
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `map[key] = value` (both as the map's raw bytes).
pub fn map_update<K, V>(map: &OwnedFd, key: &K, value: &V) -> io::Result<()> {
    bpf(
        BPF_MAP_UPDATE_ELEM,
        &mut MapElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key as *const K as u64,
            value: value as *const V as u64,
            ..Default::default()
        },
    )
    .map(|_| ())
}

/// Removes `key`; a missing key is not an error.
pub fn map_delete<K>(map: &OwnedFd, key: &K) -> io::Result<()> {
    match bpf(
        BPF_MAP_DELETE_ELEM,
        &mut MapElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key as *const K as u64,
            ..Default::default()
        },
    ) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other.map(|_| ()),
    }
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_prog_fd: u32,
    core_relo_cnt: u32,
    fd_array: u64,
    core_relos: u64,
    core_relo_rec_size: u32,
    log_true_size: u32,
}

/// What to load.
pub struct ProgSpec<'a> {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    pub attach_btf_id: u32,
    pub name: &'a str,
    pub insns: &'a [u64],
}

/// Loads a program; on a verifier rejection the error carries the verifier's log.
pub fn prog_load(spec: &ProgSpec<'_>) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut name = [0u8; 16];
    for (d, s) in name.iter_mut().zip(spec.name.bytes().take(15)) {
        *d = s;
    }
    let attempt = |log: &mut Vec<u8>, level: u32| {
        let mut attr = ProgLoadAttr {
            prog_type: spec.prog_type,
            insn_cnt: spec.insns.len() as u32,
            insns: spec.insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: level,
            log_size: log.len() as u32,
            log_buf: if log.is_empty() {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            prog_name: name,
            expected_attach_type: spec.expected_attach_type,
            attach_btf_id: spec.attach_btf_id,
            ..Default::default()
        };
        bpf(BPF_PROG_LOAD, &mut attr).map(new_fd)
    };
    match attempt(&mut Vec::new(), 0) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let mut log = vec![0u8; 1 << 16];
            let _ = attempt(&mut log, 1);
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            Err(io::Error::new(
                e.kind(),
                format!(
                    "{e}; verifier log:\n{}",
                    String::from_utf8_lossy(&log[..end])
                ),
            ))
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
}

/// A link for an iterator program (no iterator arguments).
pub fn iter_link_create(prog: &OwnedFd, attach_type: u32) -> io::Result<OwnedFd> {
    bpf(
        BPF_LINK_CREATE,
        &mut LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            attach_type,
            ..Default::default()
        },
    )
    .map(new_fd)
}

#[repr(C)]
#[derive(Default)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

/// A new iteration: reading the returned file runs the program over every object, in the
/// network namespace of the calling thread.
pub fn iter_create(link: &OwnedFd) -> io::Result<OwnedFd> {
    bpf(
        BPF_ITER_CREATE,
        &mut IterCreateAttr {
            link_fd: link.as_raw_fd() as u32,
            flags: 0,
        },
    )
    .map(new_fd)
}
