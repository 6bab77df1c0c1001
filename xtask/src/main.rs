//! Project automation: `cargo xtask <command>`. Every command installs what it needs first,
//! idempotently, so a fresh machine needs nothing but this repository and a Rust toolchain.

mod bench;
mod ebpf;
mod images;
mod setup;
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
    /// Build skiff's container images (echo, pause) and push them to the local registry on
    /// 127.0.0.1:5000, starting it if needed. Idempotent, fast when nothing changed.
    Images,
    /// Benchmarks (`bench proxy`: eBPF vs iptables vs direct).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// The benchmark client (run by `bench` inside its namespace and cgroup).
    #[command(hide = true)]
    #[command(subcommand)]
    BenchClient(bench::client::ClientCmd),
    /// Bring skiff up (for now: the service proxy on a manifests directory).
    Up(up::Opts),
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
        Command::Images => {
            setup::all()?;
            images::all()
        }
        Command::Test { args } => {
            setup::all()?;
            images::all()?;
            ebpf::build()?;
            setup::cargo(&["test", "--workspace", "--no-fail-fast"], &args)
        }
    }
}
