//! The kubelet's atomic writer: the files of a configMap, secret, downwardAPI or projected
//! volume are replaced as one set, so a container reading them (a token being refreshed,
//! a ConfigMap being edited) sees either the old set or the new one, never a mix.
//!
//! ```text
//! <dir>/..2026_12_02_01_30_00.123456789/token   the payload, one directory per write
//! <dir>/..data -> ..2026_12_02_01_30_00.123456789   swapped by rename(2): the atomic step
//! <dir>/token -> ..data/token                   what the container opens
//! ```

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of a volume's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadFile {
    /// Relative to the volume; already checked to stay inside it.
    pub path: PathBuf,
    pub content: Vec<u8>,
    /// Permission bits (defaultMode or the item's mode).
    pub mode: u32,
}

impl PayloadFile {
    /// A file at `rel` inside the volume, or None when `rel` would leave it (an absolute
    /// path or `..`: keys and paths come from the API).
    pub fn new(rel: &str, content: impl Into<Vec<u8>>, mode: i32) -> Option<PayloadFile> {
        let path = Path::new(rel);
        let inside = path.components().count() > 0
            && path.components().all(|c| matches!(c, Component::Normal(_)))
            && !rel.starts_with("..");
        inside.then(|| PayloadFile {
            path: path.to_path_buf(),
            content: content.into(),
            mode: mode as u32 & 0o7777,
        })
    }
}

/// Writes `payload` as the whole content of `dir` (see the module doc), removing files of an
/// earlier payload that this one does not have.
pub fn write(dir: &Path, payload: &[PayloadFile]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let stamp = stamp_name();
    let staged = dir.join(&stamp);
    std::fs::create_dir(&staged)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))?;
    for f in payload {
        let path = staged.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &f.content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))?;
    }
    // The swap: a new symlink renamed over the old one.
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;

    let top: BTreeSet<String> = payload
        .iter()
        .filter_map(|f| f.path.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for name in &top {
        let link = dir.join(name);
        let want = Path::new(DATA).join(name);
        match std::fs::read_link(&link) {
            Ok(target) if target == want => continue,
            _ => remove_any(&link)?,
        }
        symlink(&want, &link)?;
    }
    // What the new payload no longer has: old top-level names and old payload directories.
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let keep = if name.starts_with("..") {
            name == DATA || name == stamp
        } else {
            top.contains(&name)
        };
        if !keep {
            remove_any(&dir.join(&name))?;
        }
    }
    Ok(())
}

/// Removes a file, symlink or directory tree; absent is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `..2026_12_02_01_30_00.123456789`: unique per write (nanoseconds), sorted by time.
fn stamp_name() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("..{}", now.strftime("%Y_%m_%d_%H_%M_%S.%f"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `..data` points now.
    fn current(dir: &Path) -> Option<PathBuf> {
        std::fs::read_link(dir.join(DATA)).ok()
    }

    fn file(rel: &str, content: &str, mode: i32) -> PayloadFile {
        PayloadFile::new(rel, content, mode).unwrap()
    }

    #[test]
    fn paths_cannot_escape_or_hide() {
        assert!(PayloadFile::new("../etc/passwd", "", 0o644).is_none());
        assert!(PayloadFile::new("/etc/passwd", "", 0o644).is_none());
        assert!(PayloadFile::new("..data", "", 0o644).is_none());
        assert!(PayloadFile::new("", "", 0o644).is_none());
        assert!(PayloadFile::new("a/b", "", 0o644).is_some());
    }

    #[test]
    fn a_rewrite_swaps_the_whole_set() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("vol");
        write(
            &dir,
            &[file("token", "one", 0o600), file("sub/ca.crt", "ca", 0o644)],
        )
        .unwrap();
        let first = current(&dir).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), "one");
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/ca.crt")).unwrap(),
            "ca"
        );
        assert_eq!(
            std::fs::metadata(dir.join("token"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_link(dir.join("token")).unwrap(),
            Path::new("..data/token")
        );

        write(&dir, &[file("token", "two", 0o644)]).unwrap();
        let second = current(&dir).unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), "two");
        // The old payload and the names it alone had are gone.
        assert!(!dir.join("sub").exists());
        assert!(!dir.join(&first).exists());
        let names: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            BTreeSet::from([
                "..data".to_string(),
                second.to_string_lossy().into_owned(),
                "token".to_string()
            ])
        );
    }

    #[test]
    fn plain_files_of_an_older_layout_are_replaced() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("key"), "old").unwrap();
        write(d.path(), &[file("key", "new", 0o644)]).unwrap();
        assert!(std::fs::symlink_metadata(d.path().join("key"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_to_string(d.path().join("key")).unwrap(),
            "new"
        );
    }
}
