//! Where audit lines go: standard output, or a file rotated by size as kube-apiserver's
//! (lumberjack) does: when the next line would pass the limit the file is renamed to
//! `<stem>-<UTC time>.<ext>` beside it, a new one is started, and only the newest backups are
//! kept. The file is created 0600 (it names every caller and object).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where the log goes (`--audit-log-path`, `-` for standard output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    Stdout,
    File(PathBuf),
}

impl std::str::FromStr for Destination {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Destination, Self::Err> {
        Ok(if s == "-" {
            Destination::Stdout
        } else {
            Destination::File(PathBuf::from(s))
        })
    }
}

/// When a file is rotated and how many old ones are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before the file would grow past this many bytes (None: never).
    pub max_bytes: Option<u64>,
    /// Backups kept (0: all, as kube-apiserver's `--audit-log-maxbackup 0`).
    pub max_backups: usize,
}

/// An open audit log.
pub enum LogFile {
    Stdout(BufWriter<io::Stdout>),
    File(RotatingFile),
}

impl LogFile {
    pub fn open(dest: &Destination, rotation: Rotation) -> io::Result<LogFile> {
        Ok(match dest {
            Destination::Stdout => LogFile::Stdout(BufWriter::new(io::stdout())),
            Destination::File(path) => LogFile::File(RotatingFile::open(path, rotation)?),
        })
    }

    /// Writes one line (with its newline), rotating first if it would not fit.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        match self {
            LogFile::Stdout(w) => w.write_all(line),
            LogFile::File(f) => f.write_line(line),
        }
    }

    /// Flushes buffered lines; `durable` also syncs the file to disk.
    pub fn flush(&mut self, durable: bool) -> io::Result<()> {
        match self {
            LogFile::Stdout(w) => w.flush(),
            LogFile::File(f) => {
                f.file.flush()?;
                if durable {
                    f.file.get_ref().sync_data()?;
                }
                Ok(())
            }
        }
    }
}

/// A file rotated by size.
pub struct RotatingFile {
    path: PathBuf,
    file: BufWriter<File>,
    size: u64,
    rotation: Rotation,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl RotatingFile {
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
            size,
            rotation,
        })
    }

    fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let len = line.len() as u64;
        if let Some(max) = self.rotation.max_bytes {
            if self.size > 0 && self.size + len > max {
                self.rotate()?;
            }
        }
        self.file.write_all(line)?;
        self.size += len;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        let backup = self.backup_name(&jiff::Timestamp::now());
        std::fs::rename(&self.path, &backup)?;
        self.file = BufWriter::new(open_append(&self.path)?);
        self.size = 0;
        if self.rotation.max_backups > 0 {
            let mut backups = self.backups()?;
            // Oldest first: the names sort by their timestamps.
            backups.sort();
            let excess = backups.len().saturating_sub(self.rotation.max_backups);
            for old in &backups[..excess] {
                std::fs::remove_file(old)?;
            }
        }
        Ok(())
    }

    /// `(<dir>/<stem>-, .<ext>)`: the parts around a backup's timestamp.
    fn backup_affixes(&self) -> (String, String) {
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ext = self
            .path
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        (format!("{stem}-"), ext)
    }

    /// `<stem>-2026-12-02T01-20-00.123456.<ext>` (microseconds, so rotations in one
    /// millisecond do not collide; a collision still gets a unique name).
    fn backup_name(&self, at: &jiff::Timestamp) -> PathBuf {
        let (prefix, ext) = self.backup_affixes();
        let stamp = at.strftime("%Y-%m-%dT%H-%M-%S%.6f").to_string();
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut candidate = dir.join(format!("{prefix}{stamp}{ext}"));
        let mut n = 1;
        while candidate.exists() {
            candidate = dir.join(format!("{prefix}{stamp}-{n}{ext}"));
            n += 1;
        }
        candidate
    }

    /// The backups of this log beside it.
    pub fn backups(&self) -> io::Result<Vec<PathBuf>> {
        let (prefix, ext) = self.backup_affixes();
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some(stamp) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(&ext))
            else {
                continue;
            };
            // `2026-12-02T01-20-00.123456`, maybe with a `-N` collision suffix.
            if stamp.len() >= 26 && stamp.as_bytes()[10] == b'T' {
                found.push(dir.join(name));
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_keeps_the_newest_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let rotation = Rotation {
            max_bytes: Some(100),
            max_backups: 2,
        };
        let mut f = RotatingFile::open(&path, rotation).unwrap();
        let line = |i: usize| format!("{:<39}\n", format!("line {i}")).into_bytes();
        for i in 0..10 {
            f.write_line(&line(i)).unwrap();
        }
        f.file.flush().unwrap();
        // 40-byte lines, 100-byte files: two lines a file; 10 lines made 4 rotations.
        let current = std::fs::read_to_string(&path).unwrap();
        assert_eq!(current.lines().count(), 2, "{current}");
        assert!(current.starts_with("line 8"), "{current}");
        let mut backups = f.backups().unwrap();
        backups.sort();
        assert_eq!(backups.len(), 2, "{backups:?}");
        let newest = std::fs::read_to_string(&backups[1]).unwrap();
        assert!(newest.starts_with("line 6"), "{newest}");
        let oldest = std::fs::read_to_string(&backups[0]).unwrap();
        assert!(oldest.starts_with("line 4"), "{oldest}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn an_existing_log_is_appended_to_and_counts_toward_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit");
        std::fs::write(&path, vec![b'x'; 90]).unwrap();
        let rotation = Rotation {
            max_bytes: Some(100),
            max_backups: 0,
        };
        let mut f = RotatingFile::open(&path, rotation).unwrap();
        f.write_line(b"0123456789abcdef\n").unwrap();
        f.file.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789abcdef\n");
        let backups = f.backups().unwrap();
        assert_eq!(backups.len(), 1, "{backups:?}");
        assert_eq!(std::fs::read(&backups[0]).unwrap(), vec![b'x'; 90]);
    }
}
