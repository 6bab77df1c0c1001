//! `cargo xtask bench ...`: benchmarks that run the real components, compare against a
//! baseline measured in the same run, and write tables, JSON and plots.

pub mod api;
pub mod api_authz;
pub mod api_tls;
pub mod client;
pub mod crd;
pub mod csi;
pub mod density;
pub mod dns;
pub mod jobs;
pub mod node;
pub mod northsouth;
pub mod plot;
pub mod progstats;
pub mod proxy;
pub mod scheduler;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// The API server: latency and throughput by verb and concurrency (TLS+RBAC next to plain
    /// HTTP without authorization; `--store etcd`: etcd next to the embedded store, and the
    /// fail-over time after an etcd leader kill), watch fan-out, TLS handshakes/s, memory.
    Api(api::Opts),
    /// The service proxy: eBPF vs iptables vs direct, 1 to 100,000 services (ClusterIP from
    /// inside the node; `--north-south`: NodePort from outside, with tc and XDP, and Maglev).
    Proxy(proxy::Opts),
    /// The node agent: pod startup latency (bound -> Running/Ready) for 1, 10, 50 pods.
    Node(node::Opts),
    /// The density scenario: 20 and 200 pods on 2 nodes created, rolled under a looping
    /// client, scaled down: pods/s, control-plane CPU per 100 pods, failed requests.
    Density(density::Opts),
    /// Cluster DNS: skiff-dns's queries/s and p99 on one core with 10,000 Services against
    /// the same hickory listeners on a static zone, and Service creation to resolvable.
    Dns(dns::Opts),
    /// The scheduler: pods bound per second and latency at 100 to 5,000 nodes, 1,000 to
    /// 30,000 pods, against the decision rate in-process.
    Scheduler(scheduler::Opts),
    /// The Job controller: a Job of 100 and of 1,000 trivial pods on 2 nodes, creation to
    /// Complete, pods completed per second against the smallest Job.
    Jobs(jobs::Opts),
    /// CustomResourceDefinitions: create p99 and paged-list throughput of 10,000 custom
    /// objects (schema + CEL) next to as many ConfigMaps in the same run.
    Crd(crd::Opts),
    /// Persistent volumes of skiff's CSI driver: claim created to pod Running, p50/p99 for 1,
    /// 10 and 50 claims at once, against the same pods with an emptyDir in the same run.
    Csi(csi::Opts),
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Api(opts) => api::run_bench(opts),
        BenchCmd::Proxy(opts) => proxy::run_bench(opts),
        BenchCmd::Node(opts) => node::run_bench(opts),
        BenchCmd::Scheduler(opts) => scheduler::run_bench(opts),
        BenchCmd::Density(opts) => density::run_bench(opts),
        BenchCmd::Dns(opts) => dns::run_bench(opts),
        BenchCmd::Jobs(opts) => jobs::run_bench(opts),
        BenchCmd::Crd(opts) => crd::run_bench(opts),
        BenchCmd::Csi(opts) => csi::run_bench(opts),
    }
}

pub use skiff_tests::e2e::cpu_seconds;

/// A kube client for the admin kubeconfig at `path`.
pub async fn client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The release binaries a cluster bench runs: the eBPF object, the images and the release
/// build first, so a bench never measures a stale or debug binary.
pub fn release_binaries() -> anyhow::Result<skiff_launcher::cluster::Binaries> {
    crate::ebpf::build()?;
    crate::images::all()?;
    crate::up::build_release()?;
    Ok(skiff_launcher::cluster::Binaries::in_dir(
        &crate::images::target_dir().join("release"),
    ))
}

/// A fresh 2-node cluster on a subnet of its own, named `<prefix>-...`; torn down and its
/// state directory removed on Drop.
pub struct BenchCluster {
    cluster: Option<skiff_launcher::cluster::Cluster>,
    dir: std::path::PathBuf,
    /// Held while the cluster lives.
    _lease: skiff_tests::subnet::SubnetLease,
}

impl BenchCluster {
    pub fn up(
        prefix: &str,
        binaries: &skiff_launcher::cluster::Binaries,
    ) -> anyhow::Result<BenchCluster> {
        Self::up_with(prefix, binaries, |_, _| {})
    }

    /// [`BenchCluster::up`] with `configure` changing the spec first (add-ons, the pod
    /// network of the subnet lease).
    pub fn up_with(
        prefix: &str,
        binaries: &skiff_launcher::cluster::Binaries,
        configure: impl FnOnce(&mut skiff_launcher::cluster::Spec, &skiff_tests::subnet::SubnetLease),
    ) -> anyhow::Result<BenchCluster> {
        let lease = skiff_tests::subnet::lease();
        let name = skiff_launcher::netns::unique_name(prefix);
        let dir = std::env::temp_dir().join(&name);
        let mut spec = skiff_launcher::cluster::Spec::new(
            &name,
            2,
            &dir,
            lease.cidr().parse().map_err(anyhow::Error::msg)?,
            binaries.clone(),
        );
        configure(&mut spec, &lease);
        let cluster = skiff_launcher::cluster::Cluster::up(spec)?;
        Ok(BenchCluster {
            cluster: Some(cluster),
            dir,
            _lease: lease,
        })
    }
}

impl std::ops::Deref for BenchCluster {
    type Target = skiff_launcher::cluster::Cluster;
    fn deref(&self) -> &Self::Target {
        self.cluster.as_ref().expect("present until Drop")
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        // The cluster's processes and interfaces first, then its files.
        drop(self.cluster.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
