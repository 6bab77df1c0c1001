//! Project automation: `cargo xtask <command>`. Every command installs what it needs first,
//! idempotently, so a fresh machine needs nothing but this repository and a Rust toolchain.

mod bench;
mod ebpf;
mod images;
mod setup;
mod testrun;
mod up;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "skiff project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the machine prerequisites (Debian packages, toolchain components). Idempotent.
    Setup,
    /// Build the eBPF programs (proxy-ebpf), installing rust-src and bpf-linker first.
    BuildEbpf,
    /// Build the container images (echo, pause, skiff/dns, library/busybox) and push them to
    /// the local registry on 127.0.0.1:5000, starting it if needed. Idempotent, fast when
    /// nothing changed.
    Images,
    /// Benchmarks (`bench proxy`: eBPF vs iptables vs direct).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// The benchmark client (run by `bench` inside its namespace and cgroup).
    #[command(hide = true)]
    #[command(subcommand)]
    BenchClient(bench::client::ClientCmd),
    /// Bring up a cluster on this machine: control plane and N nodes (network namespaces
    /// with node agent, containerd and eBPF proxy). `--proxy-only`: the proxy alone.
    Up(up::Opts),
    /// Stop the cluster and remove everything it made. Idempotent.
    Down {
        /// Another cluster's state directory (e.g. one a killed test left under /tmp);
        /// default: the one `up` made (.skiff).
        #[arg(long)]
        state_dir: Option<std::path::PathBuf>,
    },
    /// Run a command as a node-level process of a node of the cluster (its network
    /// namespace and cgroup): `cargo xtask node-exec node-1 -- curl http://10.96.0.10/`.
    NodeExec {
        node: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// The cluster's relay to the nodes (started by `up`): LISTEN=TO...
    #[command(hide = true)]
    Relay {
        #[arg(required = true)]
        forwards: Vec<skiff_launcher::cluster::relay::Forward>,
    },
    /// Run the whole test suite, as CI does (installs prerequisites first).
    Test {
        /// Extra arguments for `cargo test`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::all(),
        Command::BuildEbpf => ebpf::build(),
        Command::Bench(cmd) => {
            setup::all()?;
            bench::run(cmd)
        }
        Command::BenchClient(cmd) => bench::client::run(cmd),
        Command::Up(opts) => up::up(opts),
        Command::Down { state_dir } => up::down(state_dir),
        Command::NodeExec { node, command } => up::node_exec(&node, &command),
        Command::Relay { forwards } => Ok(skiff_launcher::cluster::relay::Relay::run_forever(
            &forwards,
        )?),
        Command::Images => {
            setup::all()?;
            images::all()
        }
        Command::Test { args } => {
            setup::all()?;
            images::all()?;
            ebpf::build()?;
            testrun::cargo_test(&["test", "--workspace", "--no-fail-fast"], &args)
        }
    }
}
