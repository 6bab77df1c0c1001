//! Loading the kernel programs: maps created or reused from bpffs pins (sized from the
//! flags), programs attached to a cgroup v2 through pinned links. A restarted proxy finds
//! the pins, keeps the maps (and so every translation) and swaps its programs into the
//! existing links atomically, so routing never stops.

pub mod attach;
mod bpffs;
pub mod bpflog;
pub mod fence;
mod link;
pub mod maps;
mod object;
mod sys;
pub mod udp_iter;

use aya::programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr};
use aya::EbpfLoader;
use maps::BpfMaps;
use proxy_common::{
    GLOBAL_LOG_LEVEL, GLOBAL_MAGLEV_M, MAGLEV_CHUNK, MAP_AFFINITY, MAP_BACKENDS, MAP_COUNTERS,
    MAP_CT, MAP_DEVICES, MAP_MAGLEV, MAP_NODE_ADDRS, MAP_SERVICES, MAP_SOCK_REVNAT,
    MAP_SOURCE_RANGES,
};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

/// The programs in the object, one per cgroup hook.
pub const PROGRAMS: [&str; 8] = [
    "skiff_connect4",
    "skiff_connect6",
    "skiff_sendmsg4",
    "skiff_sendmsg6",
    "skiff_recvmsg4",
    "skiff_recvmsg6",
    "skiff_getpeername4",
    "skiff_getpeername6",
];

/// Map capacities (the daemon's flags).
#[derive(Clone, Copy, Debug)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub affinity: u32,
    /// North-south connection tracking: two entries per flow.
    pub ct: u32,
    /// Packet-level frontends that may hold a Maglev table at once.
    pub maglev_frontends: u32,
    /// loadBalancerSourceRanges prefixes over all frontends.
    pub source_ranges: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            services: 65_536,
            backends: 262_144,
            affinity: 65_536,
            ct: 262_144,
            maglev_frontends: 4_096,
            source_ranges: 16_384,
        }
    }
}

/// How the programs behave, fixed at load (constants the verifier sees).
#[derive(Clone, Copy, Debug)]
pub struct ProgramOptions {
    /// The Maglev table size M (`--maglev-table-size`).
    pub maglev_m: u32,
    /// Kernel-side debug logging (`--bpf-log`).
    pub bpf_log: bool,
}

/// Where the pins live below the proxy's bpffs directory.
pub fn maps_dir(bpffs: &Path) -> PathBuf {
    bpffs.join("maps")
}

fn links_dir(bpffs: &Path) -> PathBuf {
    bpffs.join("links")
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("bpffs at {path}: {source}")]
    Bpffs {
        path: String,
        source: std::io::Error,
    },
    #[error("loading the eBPF object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("kernel log (--bpf-log): {0}")]
    Log(#[source] aya_log::Error),
    #[error("program {0} is missing from the object")]
    MissingProgram(&'static str),
    #[error("opening cgroup {path}: {source}")]
    Cgroup {
        path: String,
        source: std::io::Error,
    },
    #[error("link for {name} at {path}: {source}")]
    Link {
        name: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("pinning the link for {name}: {source}")]
    Pin {
        name: &'static str,
        source: aya::pin::PinError,
    },
    #[error(transparent)]
    Maps(#[from] maps::MapsError),
    #[error("the grace-period fence map: {0}")]
    Fence(std::io::Error),
}

/// What `load` hands the daemon.
pub struct Loaded {
    pub maps: BpfMaps,
    pub attach: Attach,
    /// The loaded programs, for attaching the north-south ones to interfaces as they come.
    pub programs: Programs,
    /// Waits out readers before retired slots and ids are reclaimed.
    pub fence: fence::Fence,
    /// Destroys connected UDP sockets to removed backends; `None` on kernels without
    /// `bpf_sock_destroy` (before 6.5), where such sockets keep their backend.
    pub udp_destroyer: Option<udp_iter::UdpDestroyer>,
    /// The programs' log records (`--bpf-log`), to be drained by [`bpflog::spawn`].
    pub kernel_log: Option<bpflog::KernelLog>,
}

/// aya-log's level constant: `Level::Debug` (Error = 1 .. Trace = 5) with `--bpf-log`,
/// else 0, which makes every log statement dead code.
fn log_level(on: bool) -> u8 {
    const DEBUG: u8 = 4;
    if on {
        DEBUG
    } else {
        0
    }
}

/// How the programs got attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// New links created and pinned.
    Fresh,
    /// Existing pinned links now run the programs just loaded.
    Replaced,
}

/// The loaded object: its north-south programs are attached to interfaces by [`Programs::attach`].
pub struct Programs {
    ebpf: aya::Ebpf,
    links: PathBuf,
}

impl Programs {
    /// Attaches (or re-points after a restart) the north-south programs on an interface.
    pub fn attach(
        &mut self,
        ifindex: u32,
        ifname: &str,
        accel: attach::Acceleration,
    ) -> Result<(), LoadError> {
        attach::attach(&mut self.ebpf, &self.links, ifindex, ifname, accel)
    }

    /// Detaches them from an interface that is no longer a node interface.
    pub fn detach(&self, ifindex: u32) {
        attach::detach(&self.links, ifindex)
    }

    /// Interfaces the north-south programs are attached to (also by a previous run).
    pub fn attached(&self) -> Vec<u32> {
        attach::attached(&self.links)
    }
}

/// Loads the programs, attaches them to `cgroup`, pins everything under `bpffs` and
/// returns the maps for the sync engine.
pub fn load(
    bpffs: &Path,
    cgroup: &Path,
    sizes: MapSizes,
    options: ProgramOptions,
) -> Result<Loaded, LoadError> {
    let bpffs_err = |source| LoadError::Bpffs {
        path: bpffs.display().to_string(),
        source,
    };
    bpffs::ensure(bpffs).map_err(bpffs_err)?;
    let maps = maps_dir(bpffs);
    let links = links_dir(bpffs);
    std::fs::create_dir_all(&maps).map_err(bpffs_err)?;
    std::fs::create_dir_all(&links).map_err(bpffs_err)?;
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(&maps)
        // A BTF map carries no pinning attribute: pinned by path, so live sockets keep
        // their reverse translations across a restart.
        .map_pin_path(MAP_SOCK_REVNAT, maps.join(MAP_SOCK_REVNAT))
        .map_max_entries(MAP_SERVICES, sizes.services)
        .map_max_entries(MAP_BACKENDS, sizes.backends)
        .map_max_entries(MAP_AFFINITY, sizes.affinity)
        // Counters are indexed by frontend id, which is below the services capacity.
        .map_max_entries(MAP_COUNTERS, sizes.services)
        .map_max_entries(MAP_CT, sizes.ct)
        .map_max_entries(
            MAP_MAGLEV,
            sizes.maglev_frontends * (options.maglev_m as usize).div_ceil(MAGLEV_CHUNK) as u32,
        )
        .map_max_entries(MAP_SOURCE_RANGES, sizes.source_ranges)
        .map_max_entries(MAP_NODE_ADDRS, 1_024)
        .map_max_entries(MAP_DEVICES, 256)
        .override_global(GLOBAL_MAGLEV_M, &options.maglev_m, true)
        .override_global(GLOBAL_LOG_LEVEL, &log_level(options.bpf_log), true)
        .load(object::bytes())?;
    let cgroup_fd = std::fs::File::open(cgroup).map_err(|source| LoadError::Cgroup {
        path: cgroup.display().to_string(),
        source,
    })?;
    let mut attach = Attach::Fresh;
    for name in PROGRAMS {
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram(name))?
            .try_into()
            .map_err(|source| LoadError::Program { name, source })?;
        prog.load()
            .map_err(|source| LoadError::Program { name, source })?;
        let pin = links.join(name);
        let link_err = |source| LoadError::Link {
            name,
            path: pin.display().to_string(),
            source,
        };
        if pin.exists() {
            let link = link::open_pinned(&pin).map_err(link_err)?;
            let fd = prog
                .fd()
                .map_err(|source| LoadError::Program { name, source })?;
            link::update(&link, fd.as_fd().as_raw_fd()).map_err(link_err)?;
            attach = Attach::Replaced;
        } else {
            let id = prog
                .attach(&cgroup_fd, CgroupAttachMode::Single)
                .map_err(|source| LoadError::Program { name, source })?;
            let owned = prog
                .take_link(id)
                .map_err(|source| LoadError::Program { name, source })?;
            let fd_link: FdLink =
                owned
                    .try_into()
                    .map_err(|e: aya::programs::links::LinkError| LoadError::Link {
                        name,
                        path: pin.display().to_string(),
                        source: std::io::Error::other(e.to_string()),
                    })?;
            fd_link
                .pin(&pin)
                .map_err(|source| LoadError::Pin { name, source })?;
        }
    }
    // The north-south programs are loaded (and so verified) now, attached per interface
    // later.
    for name in [attach::TC_INGRESS, attach::TC_EGRESS] {
        let prog: &mut aya::programs::SchedClassifier = ebpf
            .program_mut(name)
            .ok_or(LoadError::MissingProgram(name))?
            .try_into()
            .map_err(|source| LoadError::Program { name, source })?;
        prog.load()
            .map_err(|source| LoadError::Program { name, source })?;
    }
    let name = attach::XDP;
    let xdp: &mut aya::programs::Xdp = ebpf
        .program_mut(name)
        .ok_or(LoadError::MissingProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })?;
    xdp.load()
        .map_err(|source| LoadError::Program { name, source })?;
    let udp_destroyer = load_udp_destroyer(&ebpf);
    let kernel_log = if options.bpf_log {
        Some(
            aya_log::EbpfLogger::init_with_logger(&mut ebpf, bpflog::ToTracing)
                .map_err(LoadError::Log)?,
        )
    } else {
        None
    };
    let maps = BpfMaps::from_loaded(&mut ebpf)?;
    Ok(Loaded {
        maps,
        attach,
        programs: Programs { ebpf, links },
        fence: fence::Fence::new().map_err(LoadError::Fence)?,
        udp_destroyer,
        kernel_log,
    })
}

fn load_udp_destroyer(ebpf: &aya::Ebpf) -> Option<udp_iter::UdpDestroyer> {
    let revnat = ebpf.map(MAP_SOCK_REVNAT).and_then(|m| match m {
        aya::maps::Map::SkStorage(data) => data.fd().as_fd().try_clone_to_owned().ok(),
        _ => None,
    });
    let result = aya::Btf::from_sys_fs()
        .map_err(|e| udp_iter::IterError::Btf(e.to_string()))
        .and_then(|btf| match &revnat {
            Some(fd) => udp_iter::UdpDestroyer::load(&btf, fd),
            None => Err(udp_iter::IterError::Btf(format!(
                "{MAP_SOCK_REVNAT} is missing from the object"
            ))),
        });
    match result {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(error = %e, "connected UDP sockets to removed backends will not be destroyed");
            None
        }
    }
}

/// Removes every pin under `bpffs` (links first: the programs detach), for `proxy reset`.
pub fn unpin_all(bpffs: &Path) -> std::io::Result<()> {
    for dir in [links_dir(bpffs), maps_dir(bpffs)] {
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for e in entries {
                    std::fs::remove_file(e?.path())?;
                }
                std::fs::remove_dir(&dir)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
