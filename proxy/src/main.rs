//! The `proxy` binary: a thin shell over the library.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use proxy::daemon::{self, LbAlgorithm, Mode, RunOptions};
use proxy::loader::attach::Acceleration;
use proxy::loader::MapSizes;
use proxy::nodenet::DeviceSelection;
use proxy::source::api::ApiConfig;
use proxy::source::SourceConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "skiff service proxy: Kubernetes Services on an eBPF socket load balancer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Ebpf,
    Iptables,
}

#[derive(Clone, Copy, ValueEnum)]
enum LbAlgorithmArg {
    Random,
    Maglev,
}

#[derive(Clone, Copy, ValueEnum)]
enum AccelerationArg {
    /// tc (TCX) programs only.
    Disabled,
    /// XDP in the driver in front of tc (packets must carry full checksums, as packets
    /// from a wire do).
    Native,
}

fn maglev_size(s: &str) -> Result<u32, String> {
    let m: u32 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if proxy::maglev::SIZES.contains(&m) {
        Ok(m)
    } else {
        Err(format!("{m} is not one of {:?}", proxy::maglev::SIZES))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SourceArg {
    /// A manifests directory (--manifests).
    Manifests,
    /// An API server (--kubeconfig, or in-cluster configuration).
    Api,
}

#[derive(Clone, Copy, ValueEnum)]
enum ProbeProto {
    /// HTTP/1.0 GET per attempt.
    Http,
    /// One datagram per attempt from an unconnected socket.
    Udp,
    /// A bare TCP connect per attempt, closed with a reset.
    Connect,
    /// One TCP connection held open; its peer printed again per line on stdin.
    Hold,
    /// One connected UDP socket sending every 20 ms until stdin closes; reconnects after
    /// an error.
    UdpConnected,
}

const DEFAULT_BPFFS: &str = "/sys/fs/bpf/skiff";

#[derive(Subcommand)]
enum Command {
    /// Program Services and EndpointSlices from a manifests directory or an API server, and
    /// keep watching it.
    Run {
        #[arg(long, value_enum, default_value = "ebpf")]
        mode: ModeArg,
        /// Where Services and EndpointSlices come from.
        #[arg(long, value_enum, default_value = "manifests")]
        source: SourceArg,
        /// Directory of YAML/JSON manifests (v1 Service, discovery.k8s.io/v1 EndpointSlice).
        #[arg(long, required_if_eq("source", "manifests"))]
        manifests: Option<PathBuf>,
        /// kubeconfig for `--source api` (default: in-cluster configuration when
        /// KUBERNETES_SERVICE_HOST is set, else $KUBECONFIG or ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The node this proxy runs on (`--source api`).
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// cgroup v2 whose processes get service translation (default: the cgroup v2 root).
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// bpffs directory for the pinned maps and links.
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
        /// Address for /metrics and /healthz.
        #[arg(long, default_value = "127.0.0.1:10249")]
        metrics: SocketAddr,
        /// Address for /healthz and /programmed (when each service was written into the
        /// data path), read by `kubectl skiff trace` through pods/proxy; off when not given.
        #[arg(long)]
        status: Option<SocketAddr>,
        /// Capacity of the services map (frontends: cluster IP x port).
        #[arg(long, default_value_t = MapSizes::default().services)]
        max_services: u32,
        /// Capacity of the backends map (slots over all frontends).
        #[arg(long, default_value_t = MapSizes::default().backends)]
        max_backends: u32,
        /// Capacity of the sessionAffinity LRU.
        #[arg(long, default_value_t = MapSizes::default().affinity)]
        max_affinity: u32,
        /// Capacity of the north-south connection-tracking map (two entries per flow).
        #[arg(long, default_value_t = MapSizes::default().ct)]
        max_ct: u32,
        /// Interfaces for NodePort, external IP and LoadBalancer traffic: `auto` (node
        /// interfaces: up, not loopback, no bridge or bridge port, with an IPv4 address),
        /// `none`, or names separated by commas.
        #[arg(long, default_value = "auto")]
        devices: DeviceSelection,
        /// XDP in front of tc on those interfaces.
        #[arg(long, value_enum, default_value = "disabled")]
        nodeport_acceleration: AccelerationArg,
        /// How north-south frontends choose a backend.
        #[arg(long, value_enum, default_value = "random")]
        lb_algorithm: LbAlgorithmArg,
        /// Maglev table size M (a prime; changing it needs `proxy reset`).
        #[arg(long, default_value_t = proxy::maglev::DEFAULT_SIZE, value_parser = maglev_size)]
        maglev_table_size: u32,
        /// Packet-level frontends that may hold a Maglev table.
        #[arg(long, default_value_t = MapSizes::default().maglev_frontends)]
        max_maglev_frontends: u32,
        /// Log the kernel programs' translation decisions and drops (aya-log, into this
        /// process's log; off: the logging code is removed at load and costs nothing).
        #[arg(long)]
        bpf_log: bool,
    },
    /// Maglev in-process (run by `cargo xtask bench proxy --north-south`): per table size,
    /// the time to build one service's table and the flows moved when one backend goes.
    /// One JSON line per size.
    #[command(hide = true)]
    MaglevBench {
        #[arg(long, default_value_t = 100)]
        backends: usize,
        #[arg(long, value_delimiter = ',', default_value = "16381,65521", value_parser = maglev_size)]
        sizes: Vec<u32>,
        /// Tables built per size for the median build time.
        #[arg(long, default_value_t = 200)]
        builds: usize,
    },
    /// Print the programmed frontends, backends and counters from the pinned maps.
    Dump {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
    },
    /// Remove the pinned links and maps: detaches the programs, translation stops.
    Reset {
        #[arg(long, default_value = DEFAULT_BPFFS)]
        bpffs: PathBuf,
    },
    /// Check connectivity through an address: HTTP/1.0 GETs or UDP datagrams, one JSON line
    /// per attempt.
    Probe {
        #[arg(value_enum)]
        protocol: ProbeProto,
        address: SocketAddr,
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Keep probing until standard input is closed; print failures only.
        #[arg(long)]
        until_stdin_closes: bool,
        /// Print failed attempts only.
        #[arg(long)]
        failures_only: bool,
        /// Seconds a connect or a read may take before the attempt fails.
        #[arg(long, default_value_t = proxy::probe::TIMEOUT.as_secs_f64())]
        timeout: f64,
    },
}

fn default_cgroup() -> PathBuf {
    // Hybrid hosts mount cgroup v2 at .../unified; unified hosts at /sys/fs/cgroup.
    let hybrid = PathBuf::from("/sys/fs/cgroup/unified");
    if hybrid.join("cgroup.procs").exists() {
        hybrid
    } else {
        PathBuf::from("/sys/fs/cgroup")
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Run {
            mode,
            source,
            manifests,
            kubeconfig,
            node_name,
            cgroup,
            bpffs,
            metrics,
            status,
            max_services,
            max_backends,
            max_affinity,
            max_ct,
            devices,
            nodeport_acceleration,
            lb_algorithm,
            maglev_table_size,
            max_maglev_frontends,
            bpf_log,
        } => {
            let opts = RunOptions {
                mode: match mode {
                    ModeArg::Ebpf => Mode::Ebpf,
                    ModeArg::Iptables => Mode::Iptables,
                },
                node_name: node_name.clone(),
                devices,
                acceleration: match nodeport_acceleration {
                    AccelerationArg::Disabled => Acceleration::Disabled,
                    AccelerationArg::Native => Acceleration::Native,
                },
                lb_algorithm: match lb_algorithm {
                    LbAlgorithmArg::Random => LbAlgorithm::Random,
                    LbAlgorithmArg::Maglev => LbAlgorithm::Maglev(maglev_table_size),
                },
                bpf_log,
                source: match (source, manifests) {
                    (SourceArg::Manifests, Some(dir)) => SourceConfig::Manifests(dir),
                    (SourceArg::Manifests, None) => {
                        anyhow::bail!("--source manifests needs --manifests DIR")
                    }
                    (SourceArg::Api, _) => SourceConfig::Api(ApiConfig {
                        kubeconfig,
                        node_name,
                    }),
                },
                cgroup: cgroup.unwrap_or_else(default_cgroup),
                bpffs,
                metrics,
                status,
                sizes: MapSizes {
                    services: max_services,
                    backends: max_backends,
                    affinity: max_affinity,
                    ct: max_ct,
                    maglev_frontends: max_maglev_frontends,
                    ..MapSizes::default()
                },
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(daemon::run(opts))?;
        }
        Command::Dump { bpffs } => {
            proxy::dump::dump(&bpffs, &mut std::io::stdout().lock())?;
        }
        Command::Reset { bpffs } => {
            proxy::loader::unpin_all(&bpffs)
                .with_context(|| format!("removing pins under {}", bpffs.display()))?;
        }
        Command::MaglevBench {
            backends,
            sizes,
            builds,
        } => {
            for m in sizes {
                let r = proxy::maglev::measure(backends, m, builds);
                println!("{}", serde_json::to_string(&r)?);
            }
        }
        Command::Probe {
            protocol,
            address,
            count,
            until_stdin_closes,
            failures_only,
            timeout,
        } => {
            let timeout = std::time::Duration::try_from_secs_f64(timeout)
                .ok()
                .filter(|t| !t.is_zero())
                .context("--timeout: a positive number of seconds")?;
            let proto = match protocol {
                ProbeProto::Http => proxy::probe::Protocol::Http,
                ProbeProto::Udp => proxy::probe::Protocol::Udp,
                ProbeProto::Connect => proxy::probe::Protocol::Connect,
                ProbeProto::Hold => {
                    return Ok(proxy::probe::hold(address, &mut std::io::stdout().lock())?)
                }
                ProbeProto::UdpConnected => {
                    return Ok(proxy::probe::udp_connected(
                        address,
                        &mut std::io::stdout().lock(),
                    )?)
                }
            };
            let tally = proxy::probe::run(
                proto,
                address,
                count,
                timeout,
                until_stdin_closes,
                failures_only,
                &mut std::io::stdout().lock(),
            )?;
            eprintln!("{tally}");
            if tally.failed > 0 {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
