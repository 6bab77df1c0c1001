//! `cargo xtask bench ...`: benchmarks that run the real components, compare against a
//! baseline measured in the same run, and write tables, JSON and plots.

pub mod client;
pub mod plot;
pub mod proxy;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// The service proxy: eBPF vs iptables vs direct, 1 to 100,000 services.
    Proxy(proxy::Opts),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Proxy(opts) => proxy::run_bench(opts),
    }
}
