//! Making sure the pin directory is on a BPF filesystem (mounting /sys/fs/bpf if the
//! machine has none there, as Cilium does).

use std::io;
use std::path::Path;

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

fn is_bpffs(path: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statfs writes into the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string, st a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

/// Creates `dir` on a bpffs, mounting bpffs at /sys/fs/bpf first when `dir` is below it
/// and nothing is mounted there.
pub fn ensure(dir: &Path) -> io::Result<()> {
    let root = Path::new("/sys/fs/bpf");
    if dir.starts_with(root) && !is_bpffs(root)? {
        let src = std::ffi::CString::new("bpf").expect("no NUL");
        let target = std::ffi::CString::new("/sys/fs/bpf").expect("no NUL");
        // SAFETY: valid C strings; a plain mount with no data.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        tracing::info!(path = %root.display(), "mounted bpffs");
    }
    std::fs::create_dir_all(dir)?;
    if !is_bpffs(dir)? {
        return Err(io::Error::other(format!(
            "{} is not on a bpffs (mount one: mount -t bpf bpf DIR)",
            dir.display()
        )));
    }
    Ok(())
}
