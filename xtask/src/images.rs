//! `cargo xtask images`: builds skiff's container images and serves them from a local registry.
//!
//! The machines reach no public registry, so the images are made here: skiff's are each one
//! static (musl) binary (echo, pause, skiff-dns, proxy), `library/busybox` is Debian's static
//! busybox with its applet links (what `--image=busybox` finds through the nodes' docker.io
//! mirror), each plus the few paths a CRI runtime bind-mounts over (/proc, /sys, /dev,
//! /etc/{hosts,hostname,resolv.conf}), written as an OCI image layout (and a tar of it for
//! `ctr -n k8s.io images import`) under `.skiff/images/`, then pushed through the registry v2
//! HTTP API to Debian's docker-registry on 127.0.0.1:5000, which this command starts when it
//! is not running. Everything is deterministic (mtime 0), so a second run uploads nothing.
//!
//! `skiff/csi` is the CSI driver (deploy/csi.yaml): its static binary plus the host's
//! e2fsprogs programs it runs (mkfs.ext4, resize2fs) with the shared libraries `ldd` lists
//! and the dynamic loader, each at its host path, so they run in the container as on the host
//! (`cargo xtask setup` installs `e2fsprogs`).
//!
//! `skiff/proxy` is the service proxy (deploy/proxy.yaml runs it as a DaemonSet); it embeds
//! the eBPF object, so the kernel programs are built first (`cargo xtask build-ebpf`, a no-op
//! when they are current): an image with a stale object would fail on its pinned maps.

use crate::setup::{self, root};
use anyhow::{bail, Context, Result};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the local registry listens; image names below start with it.
pub const REGISTRY: &str = "127.0.0.1:5000";
const MUSL: &str = "x86_64-unknown-linux-musl";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One image: a repository in the local registry and what its layer holds.
struct Image {
    repository: &'static str,
    content: Content,
}

/// What an image holds besides the runtime's mount points.
#[derive(Clone, Copy)]
enum Content {
    /// One of skiff's static binaries (built here for musl), at /<name>, the entrypoint.
    Binary(&'static str),
    /// A static binary as `Binary`, plus host programs (found on PATH, /sbin, /usr/sbin) at
    /// their host paths with the shared libraries and loader `ldd` names for them.
    BinaryWithTools(&'static str, &'static [&'static str]),
    /// Debian's busybox-static at /bin/busybox and a link per applet where `busybox
    /// --list-full` puts it; no entrypoint, `sh` by default, as the familiar image.
    Busybox,
}

impl Image {
    /// Its directory under `.skiff/images/`.
    fn name(&self) -> &'static str {
        match self.content {
            Content::Binary(name) | Content::BinaryWithTools(name, _) => name,
            Content::Busybox => "busybox",
        }
    }
}

/// Where Debian's busybox-static puts its binary (`cargo xtask setup` installs it).
pub const BUSYBOX: &str = "/bin/busybox";

const IMAGES: &[Image] = &[
    Image {
        repository: "skiff/echo",
        content: Content::Binary("echo"),
    },
    Image {
        repository: "skiff/pause",
        content: Content::Binary("pause"),
    },
    Image {
        repository: "skiff/dns",
        content: Content::Binary("skiff-dns"),
    },
    // `docker.io/library/busybox` as the nodes' containerd sees it: they resolve docker.io
    // through a mirror that is this registry (see node/src/containerd/config.rs).
    Image {
        repository: "library/busybox",
        content: Content::Busybox,
    },
    Image {
        repository: "skiff/proxy",
        content: Content::Binary("proxy"),
    },
    Image {
        repository: "skiff/csi",
        content: Content::BinaryWithTools("skiff-csi", E2FSPROGS),
    },
];

/// The e2fsprogs programs the CSI driver runs (formatting and growing volumes).
const E2FSPROGS: &[&str] = &["mkfs.ext4", "resize2fs"];

/// Builds every image, starts the registry if needed and pushes; fast when nothing changed.
pub fn all() -> Result<()> {
    let started = Instant::now();
    musl_target()?;
    // Debian's packages the images take files from (busybox-static, e2fsprogs).
    setup::all()?;
    eprintln!(
        "images: skiff/proxy embeds the eBPF object; building it first (cargo xtask build-ebpf)"
    );
    crate::ebpf::build().context(
        "building the proxy's eBPF object (`cargo xtask build-ebpf`) for the skiff/proxy image",
    )?;
    // From scratch this is the long step (every dependency for musl, minutes on a loaded
    // machine): cargo's own progress lines are shown, not hidden behind -q.
    eprintln!(
        "images: building echo, pause, skiff-dns, proxy and skiff-csi for {MUSL} (profile image; \
         cargo's progress follows, a no-op when current)"
    );
    let build_started = Instant::now();
    // ring (TLS in `echo webhook`) compiles a little C and assembly; they are freestanding,
    // so the host's gcc builds them for the musl target and no musl toolchain is needed.
    setup::run(
        Command::new(env!("CARGO"))
            .current_dir(root())
            .env(format!("CC_{}", MUSL.replace('-', "_")), "gcc")
            .env("SKIFF_EBPF_OBJECT", crate::ebpf::object_path())
            .args([
                "build",
                "-p",
                "skiff-images",
                "-p",
                "dns",
                "-p",
                "proxy",
                "-p",
                "skiff-csi",
                "--bins",
                "--profile",
                "image",
                "--target",
                MUSL,
            ]),
    )?;
    eprintln!("images: binaries built in {:.1?}", build_started.elapsed());
    let bin_dir = target_dir().join(MUSL).join("image");
    registry()?;
    for image in IMAGES {
        let built = build(image, &bin_dir)?;
        let uploaded = push(image, &built)?;
        eprintln!(
            "images: {REGISTRY}/{}:latest {} ({} uploaded)",
            image.repository,
            built.manifest_digest,
            if uploaded == 0 {
                "nothing".to_string()
            } else {
                format!("{uploaded} blobs")
            }
        );
    }
    eprintln!("images: ready in {:.1?}", started.elapsed());
    Ok(())
}

/// Where cargo puts build output (`CARGO_TARGET_DIR`, else `target/`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn musl_target() -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(MUSL)) {
        return Ok(());
    }
    eprintln!("images: installing the {MUSL} target (static binaries)");
    setup::run(Command::new("rustup").args(["target", "add", MUSL]))
}

/// A blob: its bytes and `sha256:<hex>` digest.
struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Blob {
        Blob {
            digest: sha256(&bytes),
            bytes,
        }
    }

    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.bytes.len()})
    }
}

fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

struct Built {
    layer: Blob,
    config: Blob,
    manifest: Blob,
    manifest_digest: String,
}

fn build(image: &Image, bin_dir: &Path) -> Result<Built> {
    let (tar, config) = match image.content {
        Content::BinaryWithTools(name, tools) => {
            let path = bin_dir.join(name);
            let program =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let files = host_programs(tools)?;
            let tar = layer_tar(|entry| {
                entry(name, 0o755, &program, tar::EntryType::Regular)?;
                let mut dirs = std::collections::BTreeSet::new();
                for (path, mode, data) in &files {
                    let rel = path.trim_start_matches('/');
                    // parents first (a runtime need not create them)
                    let mut parent = String::new();
                    for part in rel
                        .split('/')
                        .collect::<Vec<_>>()
                        .split_last()
                        .map_or(&[][..], |(_, p)| p)
                    {
                        if !parent.is_empty() {
                            parent.push('/');
                        }
                        parent.push_str(part);
                        if !["dev", "proc", "sys", "etc", "tmp"].contains(&parent.as_str())
                            && dirs.insert(parent.clone())
                        {
                            entry(&parent, 0o755, &[], tar::EntryType::Directory)?;
                        }
                    }
                    entry(rel, *mode, data, tar::EntryType::Regular)?;
                }
                Ok(())
            })?;
            let config = json!({
                "Entrypoint": [format!("/{name}")],
                "Env": ["PATH=/:/usr/sbin:/usr/bin:/sbin:/bin"],
                "WorkingDir": "/",
            });
            (tar, config)
        }
        Content::Binary(name) => {
            let path = bin_dir.join(name);
            let program =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let tar = layer_tar(|entry| entry(name, 0o755, &program, tar::EntryType::Regular))?;
            let config = json!({
                "Entrypoint": [format!("/{name}")],
                "Env": ["PATH=/"],
                "WorkingDir": "/",
            });
            (tar, config)
        }
        Content::Busybox => (
            busybox_layer()?,
            json!({
                "Cmd": ["sh"],
                "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
                "WorkingDir": "/",
            }),
        ),
    };
    let diff_id = sha256(&tar);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    let layer = Blob::new(gz.finish()?);
    let config = Blob::new(serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }))?);
    let manifest = Blob::new(serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": config.descriptor(CONFIG_TYPE),
        "layers": [layer.descriptor(LAYER_TYPE)],
    }))?);
    let built = Built {
        manifest_digest: manifest.digest.clone(),
        layer,
        config,
        manifest,
    };
    write_layout(image, &built)?;
    Ok(built)
}

/// A host program on PATH, else in /sbin or /usr/sbin.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/sbin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The files that make `tools` run in an image: each program and each shared object `ldd`
/// lists for it (the loader included), at the path the host uses (symbolic links followed:
/// the content is stored at the path named), with its mode. Sorted, deduplicated.
fn host_programs(tools: &[&str]) -> Result<Vec<(String, u32, Vec<u8>)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut paths = std::collections::BTreeSet::new();
    // mke2fs's defaults, as on the host
    if Path::new("/etc/mke2fs.conf").is_file() {
        paths.insert(PathBuf::from("/etc/mke2fs.conf"));
    }
    for tool in tools {
        let program = find_program(tool).with_context(|| {
            format!("{tool} not found on PATH, /sbin or /usr/sbin (Debian package e2fsprogs)")
        })?;
        let out = Command::new("ldd")
            .arg(&program)
            .output()
            .with_context(|| format!("ldd {}", program.display()))?;
        if !out.status.success() {
            bail!(
                "ldd {}: {}",
                program.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // `libx.so.1 => /lib/.../libx.so.1 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`,
        // `linux-vdso.so.1 (0x...)` (in the kernel: no file)
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let line = line.trim();
            let file = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(f) = file.filter(|f| f.starts_with('/')) {
                paths.insert(PathBuf::from(f));
            }
        }
        paths.insert(program);
    }
    paths
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            let mode = std::fs::metadata(&p)?.permissions().mode() & 0o777;
            Ok((p.display().to_string(), mode, data))
        })
        .collect()
}

/// One entry of a layer: path, mode, contents, type.
type Entry<'a> = dyn FnMut(&str, u32, &[u8], tar::EntryType) -> std::io::Result<()> + 'a;

/// The image's only layer: the mount points a runtime needs, then what `content` adds.
fn layer_tar(content: impl FnOnce(&mut Entry) -> std::io::Result<()>) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut entry = |path: &str, mode: u32, data: &[u8], kind: tar::EntryType| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        if kind == tar::EntryType::Symlink {
            // A link's target is its header's, not data.
            h.set_size(0);
            return tar.append_link(&mut h, path, std::str::from_utf8(data).unwrap_or(""));
        }
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, path, data)
    };
    for dir in ["dev", "proc", "sys", "etc"] {
        entry(dir, 0o755, &[], tar::EntryType::Directory)?;
    }
    entry("tmp", 0o1777, &[], tar::EntryType::Directory)?;
    entry(
        "etc/hosts",
        0o644,
        b"127.0.0.1 localhost\n",
        tar::EntryType::Regular,
    )?;
    entry("etc/hostname", 0o644, b"", tar::EntryType::Regular)?;
    entry("etc/resolv.conf", 0o644, b"", tar::EntryType::Regular)?;
    content(&mut entry)?;
    Ok(tar.into_inner()?)
}

/// busybox's layer: the static binary at /bin/busybox, each applet a symbolic link to it
/// at the path `busybox --list-full` names (bin/sh, usr/bin/wget, ...), root's passwd and
/// group entries for the applets that look users up.
fn busybox_layer() -> Result<Vec<u8>> {
    let program = std::fs::read(BUSYBOX).with_context(|| {
        format!("reading {BUSYBOX} (`cargo xtask setup` installs busybox-static)")
    })?;
    let listed = Command::new(BUSYBOX)
        .arg("--list-full")
        .output()
        .with_context(|| format!("{BUSYBOX} --list-full"))?;
    let mut applets: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && l != "bin/busybox")
        .collect();
    applets.sort();
    applets.dedup();
    if !applets.iter().any(|a| a == "bin/sh") {
        bail!("{BUSYBOX} --list-full names no bin/sh: not a usable busybox");
    }
    layer_tar(|entry| {
        for dir in ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "root"] {
            entry(dir, 0o755, &[], tar::EntryType::Directory)?;
        }
        entry(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            tar::EntryType::Regular,
        )?;
        entry(
            "etc/group",
            0o644,
            b"root:x:0:\nnogroup:x:65534:\n",
            tar::EntryType::Regular,
        )?;
        entry("bin/busybox", 0o755, &program, tar::EntryType::Regular)?;
        for applet in &applets {
            entry(applet, 0o777, b"/bin/busybox", tar::EntryType::Symlink)?;
        }
        Ok(())
    })
}

/// `.skiff/images/<name>/` as an OCI image layout, and `<name>.tar` of it for `ctr import`.
fn write_layout(image: &Image, built: &Built) -> Result<()> {
    let dir = root().join(".skiff/images").join(image.name());
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    for blob in [&built.layer, &built.config, &built.manifest] {
        let path = blobs.join(blob.digest.trim_start_matches("sha256:"));
        if !path.exists() {
            std::fs::write(&path, &blob.bytes)?;
        }
    }
    let name = format!("{REGISTRY}/{}:latest", image.repository);
    let mut descriptor = built.manifest.descriptor(MANIFEST_TYPE);
    descriptor["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": "latest",
    });
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = json!({"schemaVersion": 2, "manifests": [descriptor]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    let mut tar = tar::Builder::new(std::fs::File::create(dir.with_extension("tar"))?);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.append_dir_all(".", &dir)?;
    tar.finish()?;
    Ok(())
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// Starts Debian's docker-registry on [`REGISTRY`] (config and storage under
/// `.skiff/registry/`) unless a registry already answers there.
fn registry() -> Result<()> {
    let agent = agent();
    let probe = || {
        agent
            .get(format!("http://{REGISTRY}/v2/"))
            .call()
            .is_ok_and(|r| r.status() == 200)
    };
    if probe() {
        return Ok(());
    }
    let dir = root().join(".skiff/registry");
    std::fs::create_dir_all(dir.join("data"))?;
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {REGISTRY}\n",
            dir.join("data").display()
        ),
    )?;
    let log = std::fs::File::create(dir.join("registry.log"))?;
    eprintln!(
        "images: starting docker-registry on {REGISTRY} (log: {})",
        dir.join("registry.log").display()
    );
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: it outlives this command and a Ctrl-C in the terminal.
        .process_group(0)
        .spawn()
        .context("starting docker-registry (install it with `cargo xtask setup`)")?;
    std::fs::write(dir.join("registry.pid"), child.id().to_string())?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !probe() {
        if Instant::now() > deadline {
            bail!(
                "docker-registry did not answer on {REGISTRY}: see {}",
                dir.join("registry.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Uploads the blobs the registry lacks, then the manifest as `latest`. Returns the number
/// of blobs uploaded.
fn push(image: &Image, built: &Built) -> Result<usize> {
    let agent = agent();
    let base = format!("http://{REGISTRY}/v2/{}", image.repository);
    let mut uploaded = 0;
    for blob in [&built.layer, &built.config] {
        if agent
            .head(format!("{base}/blobs/{}", blob.digest))
            .call()?
            .status()
            == 200
        {
            continue;
        }
        let started = agent.post(format!("{base}/blobs/uploads/")).send_empty()?;
        if started.status() != 202 {
            bail!("starting an upload to {base}: HTTP {}", started.status());
        }
        let location = started
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .context("registry gave no upload location")?;
        let location = if location.starts_with('/') {
            format!("http://{REGISTRY}{location}")
        } else {
            location.to_string()
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let done = agent
            .put(format!("{location}{sep}digest={}", blob.digest))
            .header("Content-Type", "application/octet-stream")
            .send(&blob.bytes[..])?;
        if done.status() != 201 {
            bail!(
                "uploading {} to {base}: HTTP {}",
                blob.digest,
                done.status()
            );
        }
        uploaded += 1;
    }
    let current = agent
        .head(format!("{base}/manifests/latest"))
        .header("Accept", MANIFEST_TYPE)
        .call()?;
    let same = current.status() == 200
        && current
            .headers()
            .get("docker-content-digest")
            .is_some_and(|d| d.to_str().ok() == Some(built.manifest_digest.as_str()));
    if !same {
        let put = agent
            .put(format!("{base}/manifests/latest"))
            .header("Content-Type", MANIFEST_TYPE)
            .send(&built.manifest.bytes[..])?;
        if put.status() != 201 {
            bail!("pushing the manifest of {base}: HTTP {}", put.status());
        }
        uploaded += 1;
    }
    Ok(uploaded)
}
