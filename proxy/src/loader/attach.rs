//! Attaching the north-south programs to a node interface: TCX ingress and egress (and
//! XDP in native mode with `--nodeport-acceleration native`), each through a link pinned
//! as `links/<program>@<ifindex>`, so a restarted proxy swaps its programs into the same
//! links (BPF_LINK_UPDATE) and traffic from outside never passes untranslated.

use super::{link, LoadError};
use aya::programs::links::{FdLink, LinkError};
use aya::programs::xdp::XdpMode;
use aya::programs::{tc::TcAttachOptions, LinkOrder, SchedClassifier, TcAttachType, Xdp};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

pub const TC_INGRESS: &str = "skiff_tc_ingress";
pub const TC_EGRESS: &str = "skiff_tc_egress";
pub const XDP: &str = "skiff_xdp";

/// Whether XDP runs in front of tc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acceleration {
    /// tc only.
    Disabled,
    /// XDP in the driver (veth, most physical NICs); where the driver refuses, tc alone.
    Native,
}

fn pin_path(links: &Path, program: &str, ifindex: u32) -> PathBuf {
    links.join(format!("{program}@{ifindex}"))
}

fn link_err<'a>(name: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> LoadError + 'a {
    move |source| LoadError::Link {
        name,
        path: path.display().to_string(),
        source,
    }
}

fn pin(
    fd_link: Result<FdLink, LinkError>,
    name: &'static str,
    path: &Path,
) -> Result<(), LoadError> {
    let fd_link = fd_link.map_err(|e| LoadError::Link {
        name,
        path: path.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    fd_link
        .pin(path)
        .map_err(|source| LoadError::Pin { name, source })?;
    Ok(())
}

/// Swaps `prog_fd` into the link pinned at `path`; false if there is none.
fn replace(
    path: &Path,
    name: &'static str,
    prog_fd: std::os::fd::RawFd,
) -> Result<bool, LoadError> {
    if !path.exists() {
        return Ok(false);
    }
    let l = link::open_pinned(path).map_err(link_err(name, path))?;
    link::update(&l, prog_fd).map_err(link_err(name, path))?;
    Ok(true)
}

/// Attaches (or re-points) the tc programs, and XDP if asked, on interface `ifindex`.
pub fn attach(
    ebpf: &mut aya::Ebpf,
    links: &Path,
    ifindex: u32,
    ifname: &str,
    accel: Acceleration,
) -> Result<(), LoadError> {
    for (name, kind) in [
        (TC_INGRESS, TcAttachType::Ingress),
        (TC_EGRESS, TcAttachType::Egress),
    ] {
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram(name))?
            .try_into()
            .map_err(|source| LoadError::Program { name, source })?;
        let path = pin_path(links, name, ifindex);
        let fd = prog
            .fd()
            .map_err(|source| LoadError::Program { name, source })?
            .as_fd()
            .as_raw_fd();
        if replace(&path, name, fd)? {
            continue;
        }
        let id = prog
            .attach_with_options(
                ifname,
                kind,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(|source| LoadError::Program { name, source })?;
        let l = prog
            .take_link(id)
            .map_err(|source| LoadError::Program { name, source })?;
        pin(l.try_into(), name, &path)?;
    }
    let path = pin_path(links, XDP, ifindex);
    match accel {
        Acceleration::Disabled => {
            // Turned off since the last run: the pin is the attachment.
            let _ = std::fs::remove_file(&path);
        }
        Acceleration::Native => {
            let name = XDP;
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .ok_or(LoadError::MissingProgram(name))?
                .try_into()
                .map_err(|source| LoadError::Program { name, source })?;
            let fd = prog
                .fd()
                .map_err(|source| LoadError::Program { name, source })?
                .as_fd()
                .as_raw_fd();
            if !replace(&path, name, fd)? {
                let id = prog
                    .attach_to_if_index(ifindex, XdpMode::Driver)
                    .map_err(|source| LoadError::Program { name, source })?;
                let l = prog
                    .take_link(id)
                    .map_err(|source| LoadError::Program { name, source })?;
                pin(l.try_into(), name, &path)?;
            }
        }
    }
    Ok(())
}

/// Detaches everything from interface `ifindex` (it is no longer a node interface).
pub fn detach(links: &Path, ifindex: u32) {
    for name in [TC_INGRESS, TC_EGRESS, XDP] {
        let _ = std::fs::remove_file(pin_path(links, name, ifindex));
    }
}

/// The interfaces that have pinned north-south links.
pub fn attached(links: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir(links)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (prog, idx) = name.split_once('@')?;
            (prog == TC_INGRESS).then(|| idx.parse().ok()).flatten()
        })
        .collect();
    out.sort();
    out
}
