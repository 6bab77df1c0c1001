//! Backups of either store: `control-plane snapshot save FILE` and `restore FILE`.
//!
//! Embedded store: a snapshot is a consistent copy of the redb database (every key and the
//! revision, read in one transaction). A running server makes it on request over a unix
//! socket in its data directory (`snapshot.sock`, 0600, callers of the server's own uid
//! only), since only one process may open the database; with no server running, the command
//! opens the store itself. Restore writes the copy as the store of an empty data directory.
//!
//! etcd: a snapshot is etcd's own (the maintenance Snapshot stream: the member's database
//! with a SHA-256 of it appended, checked here before the file is kept); restoring is etcd's
//! procedure, `etcdctl snapshot restore` into a fresh data directory per member, which
//! `restore` runs for one member.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::etcd::{EtcdConfig, EtcdStore};
use super::redb::{self, RedbOptions, RedbStore};
use super::{Revision, StoreError};

/// The socket a server with the embedded store answers snapshot requests on.
pub const SOCKET: &str = "snapshot.sock";
/// The file name of the embedded store in a data directory.
const STORE_FILE: &str = "store.redb";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let what = what.into();
    move |source| SnapshotError::Io { what, source }
}

/// What a saved snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub bytes: u64,
    /// The store revision of the copy (embedded store; etcd's is inside its file).
    pub revision: Option<Revision>,
}

/// Serves snapshots of `store` on `dir/snapshot.sock` until `stop` fires.
pub fn serve(store: RedbStore, dir: &Path, stop: CancellationToken) -> Result<(), SnapshotError> {
    let path = dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(io(format!("binding {}", path.display())))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io(format!("restricting {}", path.display())))?;
    let dir = dir.to_path_buf();
    tokio::spawn(async move {
        loop {
            let (conn, _) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "snapshot socket accept failed");
                        continue;
                    }
                },
                _ = stop.cancelled() => break,
            };
            let (store, dir) = (store.clone(), dir.clone());
            tokio::spawn(async move {
                if let Err(e) = answer(store, &dir, conn).await {
                    tracing::warn!(error = %e, "snapshot request failed");
                }
            });
        }
        let _ = std::fs::remove_file(dir.join(SOCKET));
    });
    Ok(())
}

/// Writes a fresh copy of the store to the caller, who must run as this process's user.
async fn answer(store: RedbStore, dir: &Path, mut conn: UnixStream) -> Result<(), SnapshotError> {
    let peer = conn
        .peer_cred()
        .map_err(io("reading the caller's credentials"))?;
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if peer.uid() != me {
        return Err(SnapshotError::Invalid(format!(
            "refused a snapshot to uid {} (the server runs as {me})",
            peer.uid()
        )));
    }
    let tmp = dir.join(format!("snapshot-{}.redb.part", rand::random::<u64>()));
    let copy = {
        let tmp = tmp.clone();
        tokio::task::spawn_blocking(move || store.snapshot_to(&tmp))
            .await
            .map_err(|e| SnapshotError::Invalid(format!("snapshot task: {e}")))?
    };
    let sent = async {
        let revision = copy?;
        let mut file = tokio::fs::File::open(&tmp)
            .await
            .map_err(io("opening the copy"))?;
        tokio::io::copy(&mut file, &mut conn)
            .await
            .map_err(io("sending the copy"))?;
        conn.shutdown().await.map_err(io("closing the socket"))?;
        tracing::info!(%revision, "snapshot sent");
        Ok(())
    }
    .await;
    let _ = tokio::fs::remove_file(&tmp).await;
    sent
}

/// Saves a snapshot of the embedded store in `data_dir` to `file`: from the running server
/// if there is one, else from the store file itself.
pub async fn save_embedded(data_dir: &Path, file: &Path) -> Result<Saved, SnapshotError> {
    let part = part_path(file);
    let socket = data_dir.join(SOCKET);
    match UnixStream::connect(&socket).await {
        Ok(mut conn) => {
            let mut out = tokio::fs::File::create(&part)
                .await
                .map_err(io(format!("creating {}", part.display())))?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = conn
                    .read(&mut buf)
                    .await
                    .map_err(io("reading the snapshot from the server"))?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])
                    .await
                    .map_err(io(format!("writing {}", part.display())))?;
            }
            out.sync_all()
                .await
                .map_err(io(format!("syncing {}", part.display())))?;
        }
        Err(e) if socket.exists() && e.kind() != std::io::ErrorKind::ConnectionRefused => {
            return Err(io(format!("connecting to {}", socket.display()))(e));
        }
        Err(_) => {
            // No server: the store is ours to open (redb refuses if another process has it).
            if !data_dir.join(STORE_FILE).exists() {
                return Err(SnapshotError::Invalid(format!(
                    "no store in {} (and no server answering on {})",
                    data_dir.display(),
                    socket.display()
                )));
            }
            let (dir, p) = (data_dir.to_path_buf(), part.clone());
            tokio::task::spawn_blocking(move || -> Result<Revision, StoreError> {
                let store = RedbStore::open(&dir, RedbOptions::default())?;
                let r = store.snapshot_to(&p);
                store.close();
                r
            })
            .await
            .map_err(|e| SnapshotError::Invalid(format!("snapshot task: {e}")))??;
        }
    }
    let (revision, _) = redb::inspect(&part).map_err(|e| {
        SnapshotError::Invalid(format!("the snapshot received is not a store: {e}"))
    })?;
    keep(&part, file)?;
    Ok(Saved {
        bytes: size(file)?,
        revision: Some(revision),
    })
}

/// Restores a snapshot of the embedded store as the store of `data_dir`, which must not have
/// one (move it away first: nothing is overwritten).
pub fn restore_embedded(file: &Path, data_dir: &Path) -> Result<Saved, SnapshotError> {
    let (revision, keys) = redb::inspect(file).map_err(|e| {
        SnapshotError::Invalid(format!("{} is not a store snapshot: {e}", file.display()))
    })?;
    let target = data_dir.join(STORE_FILE);
    if target.exists() {
        return Err(SnapshotError::Invalid(format!(
            "{} already exists: move it away first (restore never overwrites a store)",
            target.display()
        )));
    }
    std::fs::create_dir_all(data_dir).map_err(io(format!("creating {}", data_dir.display())))?;
    let part = part_path(&target);
    std::fs::copy(file, &part).map_err(io(format!("copying to {}", part.display())))?;
    std::fs::File::open(&part)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("syncing {}", part.display())))?;
    keep(&part, &target)?;
    tracing::info!(%revision, keys, dir = %data_dir.display(), "store restored");
    Ok(Saved {
        bytes: size(&target)?,
        revision: Some(revision),
    })
}

/// Saves etcd's snapshot of the member the client reaches to `file`, after checking the
/// SHA-256 etcd appends to it.
pub async fn save_etcd(config: &EtcdConfig, file: &Path) -> Result<Saved, SnapshotError> {
    let store = EtcdStore::connect(&EtcdConfig {
        compaction_interval: std::time::Duration::ZERO,
        ..config.clone()
    })
    .await?;
    let part = part_path(file);
    let mut out =
        std::fs::File::create(&part).map_err(io(format!("creating {}", part.display())))?;
    let mut stream = store
        .client()
        .maintenance_client()
        .snapshot()
        .await
        .map_err(super::etcd::error)?;
    let mut hasher = Sha256::new();
    // The last 32 bytes are the digest of everything before them: hold them back.
    let mut tail: Vec<u8> = Vec::with_capacity(64);
    let mut bytes = 0u64;
    while let Some(chunk) = stream.message().await.map_err(super::etcd::error)? {
        tail.extend_from_slice(chunk.blob());
        if tail.len() > 32 {
            let body = tail.len() - 32;
            hasher.update(&tail[..body]);
            out.write_all(&tail[..body])
                .map_err(io(format!("writing {}", part.display())))?;
            bytes += body as u64;
            tail.drain(..body);
        }
    }
    store.close();
    if tail.len() != 32 || hasher.finalize().as_slice() != tail.as_slice() {
        let _ = std::fs::remove_file(&part);
        return Err(SnapshotError::Invalid(
            "the etcd snapshot's SHA-256 does not match its data".into(),
        ));
    }
    // Kept as etcdctl keeps it: with the digest, which `etcdctl snapshot restore` checks.
    out.write_all(&tail)
        .and_then(|_| out.sync_all())
        .map_err(io(format!("writing {}", part.display())))?;
    keep(&part, file)?;
    Ok(Saved {
        bytes: bytes + 32,
        revision: None,
    })
}

/// One etcd member to restore: etcd's `snapshot restore` flags.
#[derive(Clone, Debug)]
pub struct EtcdMember {
    pub name: String,
    /// `name=peer-url,...` of every member of the restored cluster.
    pub initial_cluster: String,
    pub initial_advertise_peer_url: String,
    /// A new cluster token, so the restored members never join the old cluster.
    pub initial_cluster_token: String,
    /// Must not exist yet.
    pub data_dir: PathBuf,
}

/// Restores an etcd snapshot into a fresh data directory for one member (run it for each
/// member, then start them on their directories).
pub fn restore_etcd(file: &Path, member: &EtcdMember) -> Result<(), SnapshotError> {
    if member.data_dir.exists() {
        return Err(SnapshotError::Invalid(format!(
            "{} already exists: etcd restores into a fresh data directory",
            member.data_dir.display()
        )));
    }
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(file)
        .args(["--name", &member.name])
        .args(["--initial-cluster", &member.initial_cluster])
        .args([
            "--initial-advertise-peer-urls",
            &member.initial_advertise_peer_url,
        ])
        .args(["--initial-cluster-token", &member.initial_cluster_token])
        .arg("--data-dir")
        .arg(&member.data_dir)
        .output()
        .map_err(io("running etcdctl (Debian package etcd-client)"))?;
    if !out.status.success() {
        return Err(SnapshotError::Invalid(format!(
            "etcdctl snapshot restore failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn part_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    file.with_file_name(name)
}

/// Moves a complete file into place (a crash leaves the old file or the new, never half).
fn keep(part: &Path, file: &Path) -> Result<(), SnapshotError> {
    std::fs::rename(part, file).map_err(io(format!("renaming to {}", file.display())))?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

fn size(file: &Path) -> Result<u64, SnapshotError> {
    Ok(std::fs::metadata(file)
        .map_err(io(format!("reading {}", file.display())))?
        .len())
}
