//! The node's volumes: one sparse file `<data-dir>/<id>.img` per volume plus `<id>.json`
//! recording the capacity the claim was given, and the capacity accounting.
//!
//! The image file is larger than the capacity: ext4 spends part of a device on its journal,
//! inode tables and the blocks it keeps for its own metadata, and a claim of N bytes must
//! get N usable bytes, so the file has room for that overhead ([`file_size`]) and the
//! filesystem is sized at first stage so that N bytes (and less than N + 1 MiB) fit in it
//! (see `node`). The file is sparse: what it occupies on the host is what was written.
//!
//! Capacity: the sum of the capacities of the node's volumes stays within `--capacity`,
//! and a new volume must fit in the data directory's free space minus what existing
//! volumes may still fill (their capacity less what they already occupy).

use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The image file size for a volume of `capacity` bytes: the capacity, 1/32 more and 256 MiB
/// for ext4's metadata (journal up to 1 GiB on huge devices, inode tables 1/64, reserve).
pub fn file_size(capacity: u64) -> u64 {
    capacity + round_up_mib(capacity / 32) + 256 * MIB
}

pub fn round_up_mib(n: u64) -> u64 {
    n.div_ceil(MIB) * MIB
}

/// Whether `id` can name a volume (and a file): 1..=128 of `[A-Za-z0-9._-]`, not starting
/// with a dot.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[derive(Serialize, Deserialize)]
struct Meta {
    capacity_bytes: u64,
}

/// The volumes of this node in the data directory.
pub struct Store {
    dir: PathBuf,
    limit: u64,
}

impl Store {
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> io::Result<Store> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(Store { dir, limit })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn image(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.img"))
    }

    fn meta(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The capacity of volume `id`, None when there is no such volume.
    pub fn capacity(&self, id: &str) -> io::Result<Option<u64>> {
        if !valid_id(id) {
            return Ok(None);
        }
        match std::fs::read(self.meta(id)) {
            Ok(b) => serde_json::from_slice::<Meta>(&b)
                .map(|m| Some(m.capacity_bytes))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every volume with its capacity.
    pub fn list(&self) -> io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if let Some(c) = self.capacity(id)? {
                out.push((id.to_string(), c));
            }
        }
        Ok(out)
    }

    /// Bytes a new volume may still take: within `--capacity` after the existing volumes,
    /// and within the data directory's free space after what existing volumes may still fill.
    pub fn available(&self) -> io::Result<u64> {
        let volumes = self.list()?;
        let allocated: u64 = volumes.iter().map(|(_, c)| c).sum();
        let mut pending = 0u64;
        for (id, c) in &volumes {
            let used = match std::fs::metadata(self.image(id)) {
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            };
            pending += c.saturating_sub(used);
        }
        let free = crate::sys::usage(&self.dir)?.available_bytes;
        Ok(self
            .limit
            .saturating_sub(allocated)
            .min(free.saturating_sub(pending)))
    }

    /// Sum of the volumes' capacities.
    pub fn allocated(&self) -> io::Result<u64> {
        Ok(self.list()?.iter().map(|(_, c)| c).sum())
    }

    fn write_meta(&self, id: &str, capacity: u64) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{id}.json.tmp"));
        let body = serde_json::to_vec(&Meta {
            capacity_bytes: capacity,
        })
        .map_err(io::Error::other)?;
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, self.meta(id))
    }

    /// Creates the sparse image then the record (a crash between the two leaves an image
    /// without a record, which does not count and is replaced by the retried create).
    pub fn create(&self, id: &str, capacity: u64) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{id}.img.tmp"));
        let f = std::fs::File::create(&tmp)?;
        f.set_len(file_size(capacity))?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, self.image(id))?;
        self.write_meta(id, capacity)
    }

    /// Grows volume `id` to `capacity` (the image file first, then the record).
    pub fn grow(&self, id: &str, capacity: u64) -> io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.image(id))?;
        let want = file_size(capacity);
        if f.metadata()?.len() < want {
            f.set_len(want)?;
        }
        self.write_meta(id, capacity)
    }

    /// Removes volume `id`: the record first, so a crash leaves only an uncounted image.
    /// Returns whether it existed.
    pub fn delete(&self, id: &str) -> io::Result<bool> {
        let existed = match std::fs::remove_file(self.meta(id)) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        match std::fs::remove_file(self.image(id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(existed),
            Err(e) => Err(e),
        }
    }
}

/// Parses a size: plain bytes or a Kubernetes quantity suffix (Ki, Mi, Gi, Ti, k, M, G, T).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("20Gi"), Ok(20 * GIB));
        assert_eq!(parse_size("1048576"), Ok(MIB));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert!(parse_size("1.5Gi").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn ids_are_file_names() {
        assert!(valid_id("pvc-1b2c3d4e-0000-4000-8000-000000000000"));
        assert!(!valid_id("../etc"));
        assert!(!valid_id(".hidden"));
        assert!(!valid_id(""));
        assert!(!valid_id(&"a".repeat(129)));
    }

    #[test]
    fn create_grow_delete_and_accounting() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path(), 10 * GIB).unwrap();
        assert_eq!(store.capacity("v").unwrap(), None);
        store.create("v", GIB).unwrap();
        assert_eq!(store.capacity("v").unwrap(), Some(GIB));
        let img = std::fs::metadata(store.image("v")).unwrap();
        assert_eq!(img.len(), file_size(GIB));
        assert!(img.blocks() * 512 < MIB, "the image is sparse");
        assert_eq!(store.allocated().unwrap(), GIB);
        assert!(store.available().unwrap() <= 9 * GIB);
        store.grow("v", 2 * GIB).unwrap();
        assert_eq!(store.capacity("v").unwrap(), Some(2 * GIB));
        assert_eq!(
            std::fs::metadata(store.image("v")).unwrap().len(),
            file_size(2 * GIB)
        );
        assert!(store.delete("v").unwrap());
        assert!(!store.delete("v").unwrap());
        assert!(!store.image("v").exists());
        assert_eq!(store.list().unwrap(), vec![]);
    }
}
