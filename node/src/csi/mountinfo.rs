//! `/proc/self/mountinfo`: the mount table the agent rebuilds its CSI state from after a
//! restart (which volumes are staged and published), and checks mount points with.

use std::path::{Path, PathBuf};

/// One line of mountinfo (the fields the agent uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub id: u32,
    pub parent: u32,
    /// The root of the mount within its filesystem (a bind mount's source directory).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// The optional fields: `shared:N`, `master:N`, ...
    pub optional: Vec<String>,
    pub fs_type: String,
    pub source: String,
}

impl MountInfo {
    /// Whether the mount is a peer of a shared group (`shared:N`).
    pub fn is_shared(&self) -> bool {
        self.optional.iter().any(|o| o.starts_with("shared:"))
    }
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash) in a path field.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    if sep < 6 || fields.len() < sep + 3 {
        return None;
    }
    Some(MountInfo {
        id: fields[0].parse().ok()?,
        parent: fields[1].parse().ok()?,
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        optional: fields[6..sep].iter().map(|s| s.to_string()).collect(),
        fs_type: fields[sep + 1].to_string(),
        source: unescape(fields[sep + 2]),
    })
}

/// This process's mount table (empty if it cannot be read).
pub fn read() -> Vec<MountInfo> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Whether `dir` is a mount point in `table`.
pub fn is_mount_point_in(table: &[MountInfo], dir: &Path) -> bool {
    table.iter().any(|m| m.mount_point == dir)
}

/// Whether `dir` is a mount point now.
pub fn is_mount_point(dir: &Path) -> bool {
    is_mount_point_in(&read(), dir)
}
