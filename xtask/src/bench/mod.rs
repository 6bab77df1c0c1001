//! `cargo xtask bench ...`: benchmarks that run the real components, compare against a
//! baseline measured in the same run, and write tables, JSON and plots.

pub mod api;
pub mod api_authz;
pub mod client;
pub mod node;
pub mod plot;
pub mod proxy;
pub mod scheduler;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// The API server: latency and throughput by verb and concurrency, watch fan-out, memory.
    Api(api::Opts),
    /// The service proxy: eBPF vs iptables vs direct, 1 to 100,000 services.
    Proxy(proxy::Opts),
    /// The node agent: pod startup latency (bound -> Running/Ready) for 1, 10, 50 pods.
    Node(node::Opts),
    /// The scheduler: pods bound per second and latency at 100 to 5,000 nodes, 1,000 to
    /// 30,000 pods, against the decision rate in-process.
    Scheduler(scheduler::Opts),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Api(opts) => api::run_bench(opts),
        BenchCmd::Proxy(opts) => proxy::run_bench(opts),
        BenchCmd::Node(opts) => node::run_bench(opts),
        BenchCmd::Scheduler(opts) => scheduler::run_bench(opts),
    }
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc (0 if it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name (which may contain spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime: fields 14 and 15 of stat, 11 and 12 after the command name.
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

/// A kube client for the admin kubeconfig at `path`.
pub async fn client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}
