//! Credential files: written atomically, readable by their owner only (0600), their
//! directory created as needed.

use std::io::Write;
use std::path::Path;

use super::PkiError;

/// Writes a file only its owner can read (it holds a credential), atomically (a temporary
/// file renamed over it), synced to disk.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Reads a PEM (or other text) file, naming it in the error.
pub fn read_text(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(PkiError::io(format!("reading {}", path.display())))
}

/// Reads `path` if it exists (None if it does not).
pub fn read_optional(path: &Path) -> Result<Option<String>, PkiError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PkiError::Io {
            what: format!("reading {}", path.display()),
            source: e,
        }),
    }
}
