//! `cargo xtask up [--nodes N]`: a whole skiff cluster on this machine, from a fresh one:
//! prerequisites, the eBPF object, the images in the local registry and release builds
//! first, then the control plane, N nodes (each a network namespace on a host bridge with
//! its node agent and containerd), the eBPF service proxy as the DaemonSet of
//! deploy/proxy.yaml, Ready on every node, and the cluster DNS (deploy/dns.yaml, applied
//! through the API and waited for), and skiff's CSI driver with the default StorageClass
//! (deploy/csi.yaml, registered on every node) through the same library the end-to-end tests
//! use (`skiff_launcher::cluster`, `Spec::proxy_daemonset`, `Spec::cluster_dns`, `Spec::csi`);
//! each step is
//! timed. The daemons run detached (logs in `.skiff/logs/`); `cargo xtask down` removes
//! everything.
//! The kubectl plugin `kubectl-skiff` (`kubectl skiff trace`) is installed in /usr/local/bin.
//!
//! `cargo xtask up --control-planes 3`: three API servers (each with controllers and
//! scheduler, leader-elected) on a 3-member etcd; see `Spec::control_planes`.
//!
//! `cargo xtask up --proxy-only`: only the service proxy, in the foreground, on a manifests
//! directory (no cluster).

use crate::setup::{root, run};
use anyhow::{Context, Result};
use skiff_launcher::cluster::network::Subnet;
use skiff_launcher::cluster::{self, Binaries, Cluster, RelayMode, Spec, State};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Opts {
    /// Number of nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=250))]
    nodes: u8,
    /// The /24 of node addresses on the host bridge (the host is .1, nodes .2 and up);
    /// nothing is routed beyond it.
    #[arg(long, default_value = "10.249.0.0/24")]
    subnet: Subnet,
    /// Addresses for LoadBalancer Services, within the subnet so the host reaches them on
    /// the bridge (default: .200 to .250 of the subnet; `none` leaves them pending).
    #[arg(long)]
    lb_pool: Option<String>,
    /// Control-plane servers: 1 (the embedded store) or 3 (a 3-member etcd on loopback,
    /// each server at its own address .251 up of the subnet, controllers and scheduler
    /// leader-elected among them, each node agent balancing over them, kubectl through the
    /// relay at the bridge's address, which fails over too).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    control_planes: u8,
    /// The API server's port on the bridge's address (the first of the subnet).
    #[arg(long, default_value_t = 6443)]
    api_port: u16,
    /// The node agents' hard eviction thresholds (`node run --eviction-hard`). The default
    /// is an absolute disk floor, as the nodes share this machine's disk with its builds.
    #[arg(long, default_value = cluster::DEV_EVICTION_HARD)]
    eviction_hard: String,
    /// Only the service proxy on a manifests directory, in the foreground.
    #[arg(long)]
    proxy_only: bool,
    /// --proxy-only: the manifests directory (Services and EndpointSlices); created if
    /// missing.
    #[arg(long, default_value = ".skiff/manifests")]
    manifests: PathBuf,
    /// --proxy-only: ebpf or iptables.
    #[arg(long, default_value = "ebpf")]
    mode: String,
    /// --proxy-only: extra arguments for `proxy run` (e.g. --cgroup, --metrics).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Where the cluster keeps its state, data and logs.
pub fn state_dir() -> PathBuf {
    root().join(".skiff")
}

const CLUSTER: &str = "skiff";

pub fn up(opts: Opts) -> Result<()> {
    if opts.proxy_only {
        return proxy_only(opts);
    }
    let started = Instant::now();
    let mut timings: Vec<(String, Duration)> = Vec::new();
    let mut timed = |name: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        let t0 = Instant::now();
        f()?;
        let took = t0.elapsed();
        eprintln!("  {name:<52} {:>7.2} s", took.as_secs_f64());
        timings.push((name.to_string(), took));
        Ok(())
    };
    let dir = state_dir();
    if let Some(s) = cluster::running(&dir)? {
        eprintln!("up: the cluster is already up ({} nodes)", s.nodes.len());
        print_usage(&dir, &s);
        return Ok(());
    }
    if State::load(&dir)?.is_some() {
        eprintln!("up: removing what a previous cluster left (its control plane is gone)");
        cluster::down(&dir)?;
    }
    eprintln!("up: preparing");
    timed("prerequisites (Debian packages)", &mut crate::setup::all)?;
    timed(
        "eBPF programs (cargo xtask build-ebpf)",
        &mut crate::ebpf::build,
    )?;
    timed("images in the local registry", &mut crate::images::all)?;
    timed(
        "release build of control-plane, node, proxy, kubectl-skiff",
        &mut build_release,
    )?;
    timed(
        "kubectl plugin (kubectl-skiff in /usr/local/bin)",
        &mut install_plugin,
    )?;
    eprintln!("up: starting a cluster of {} nodes", opts.nodes);
    let mut spec = Spec::new(
        CLUSTER,
        usize::from(opts.nodes),
        &dir,
        opts.subnet,
        Binaries::in_dir(&crate::images::target_dir().join("release")),
    );
    spec.nodes = (1..=opts.nodes).map(|i| format!("node-{i}")).collect();
    spec.api_port = opts.api_port;
    spec.control_planes = usize::from(opts.control_planes);
    let [a, b, c] = opts.subnet.0;
    let pool = opts
        .lb_pool
        .clone()
        .unwrap_or_else(|| format!("{a}.{b}.{c}.200-{a}.{b}.{c}.250"));
    if pool != "none" {
        spec.control_plane_args = vec!["--service-lb-pool".into(), pool];
    }
    spec.eviction_hard = opts.eviction_hard;
    // The one cluster `up` makes owns the default pod network: the control plane reaches
    // pods (webhooks served by pods) through routes on the host.
    spec.pod_routes_on_host = true;
    // Node agents join as a node does: a bootstrap token, then their own certificate for
    // system:node:<name> through a CertificateSigningRequest (kept in the node's data dir,
    // reused when the agent restarts).
    spec.tls_bootstrap = true;
    // The proxies are a workload: deploy/proxy.yaml (DaemonSet skiff-proxy in kube-system,
    // its own ServiceAccount, the image `images::all` pushed above) applied through the API,
    // with this cluster's API address, bpffs and cgroups filled in.
    spec.proxy_daemonset();
    // Cluster DNS as a workload (deploy/dns.yaml, Service kube-dns at 10.96.0.10), its pods
    // reaching the API through the `kubernetes` Service; node agents get --cluster-dns.
    spec.cluster_dns = true;
    // Persistent volumes: skiff's CSI driver (deploy/csi.yaml: node plugin DaemonSet,
    // controller Deployment, the default StorageClass skiff-local).
    spec.csi = true;
    spec.relay = RelayMode::Process {
        program: std::env::current_exe().context("locating xtask")?,
        args: vec!["relay".into()],
        registry_port: spec.registry.port(),
    };
    let c = Cluster::up(spec)?;
    timings.extend(c.timings.iter().cloned());
    let state = c.state().clone();
    c.detach();
    eprintln!();
    eprintln!("| step | seconds |");
    eprintln!("|---|---:|");
    for (name, took) in &timings {
        eprintln!("| {name} | {:.2} |", took.as_secs_f64());
    }
    eprintln!("| total | {:.2} |", started.elapsed().as_secs_f64());
    eprintln!();
    print_usage(&dir, &state);
    Ok(())
}

/// The release build of the daemons a cluster runs.
pub fn build_release() -> Result<()> {
    crate::setup::cargo(
        &[
            "build",
            "--release",
            "-p",
            "control-plane",
            "-p",
            "node",
            "-p",
            "proxy",
            "-p",
            "skiff-cli",
        ],
        &[],
    )
}

/// Where `up` installs the kubectl plugin: a directory on every user's PATH (kubectl runs
/// `kubectl-skiff` for `kubectl skiff`).
pub const PLUGIN_DIR: &str = "/usr/local/bin";

/// Installs the release `kubectl-skiff` into [`PLUGIN_DIR`]: written beside and renamed over,
/// so a kubectl running the old one meanwhile never sees half a file.
pub fn install_plugin() -> Result<()> {
    let built = crate::images::target_dir().join("release/kubectl-skiff");
    let dir = Path::new(PLUGIN_DIR);
    let partial = dir.join(".kubectl-skiff.partial");
    std::fs::copy(&built, &partial)
        .with_context(|| format!("copying {} to {}", built.display(), partial.display()))?;
    std::fs::rename(&partial, dir.join("kubectl-skiff"))
        .with_context(|| format!("installing kubectl-skiff in {PLUGIN_DIR}"))?;
    Ok(())
}

fn print_usage(dir: &Path, s: &State) {
    let kubeconfig = dir.join("kubeconfig");
    let first = s.nodes.first().map_or("node-1", |n| n.name.as_str());
    eprintln!("The cluster is up. Use it with:");
    eprintln!("  export KUBECONFIG={}", kubeconfig.display());
    eprintln!("  kubectl get nodes -o wide");
    eprintln!("  kubectl -n kube-system get daemonset skiff-proxy   # the service proxies");
    eprintln!(
        "  kubectl create deployment echo --image=127.0.0.1:5000/skiff/echo:latest --replicas=3"
    );
    eprintln!("  kubectl expose deployment echo --port=80 --target-port=8080");
    eprintln!("  kubectl run t --image=busybox --restart=Never -- sleep 3600");
    eprintln!(
        "  kubectl exec t -- wget -qO- http://echo/   # through the cluster DNS and the proxy"
    );
    eprintln!("  kubectl skiff trace deployment/echo   # each step of its path, with its time");
    eprintln!("  cargo xtask node-exec {first} -- curl -s http://<CLUSTER-IP>/   # a node-level client, translated by the node's proxy");
    eprintln!("  cargo xtask node-exec {first} -- proxy dump                    # that node's programmed services");
    eprintln!(
        "Logs: {}/logs/   Stop and remove everything: cargo xtask down",
        dir.display()
    );
}

/// `cargo xtask down`.
pub fn down(dir: Option<PathBuf>) -> Result<()> {
    let dir = dir.unwrap_or_else(state_dir);
    let t0 = Instant::now();
    let removed = cluster::down(&dir)?;
    if removed.is_empty() {
        eprintln!(
            "down: no cluster recorded in {}: nothing to do",
            dir.display()
        );
    } else {
        for r in &removed {
            eprintln!("down: removed {r}");
        }
        eprintln!("down: done in {:.1?}", t0.elapsed());
    }
    Ok(())
}

/// `cargo xtask node-exec NODE -- CMD...`: CMD as a node-level process of NODE (its network
/// namespace and cgroup). `proxy` means that node's proxy binary, with `dump` pointed at its
/// pins.
pub fn node_exec(node: &str, cmd: &[String]) -> Result<()> {
    let dir = state_dir();
    let s = cluster::running(&dir)?.context("no cluster is up (cargo xtask up)")?;
    let n = s.nodes.iter().find(|n| n.name == node).with_context(|| {
        format!(
            "no node {node} (nodes: {:?})",
            s.nodes.iter().map(|n| &n.name).collect::<Vec<_>>()
        )
    })?;
    let (program, args) = cmd.split_first().context("a command to run")?;
    let mut c = if program == "proxy" {
        let mut c = cluster::node_command(n, &s.binaries.proxy)?;
        c.args(args);
        if args.first().is_some_and(|a| a == "dump") {
            c.arg("--bpffs").arg(&n.bpffs);
        }
        c
    } else {
        let mut c = cluster::node_command(n, program)?;
        c.args(args);
        c
    };
    let status = c.status().with_context(|| format!("running {program}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// The old `up`: the proxy alone on a manifests directory, in the foreground.
fn proxy_only(opts: Opts) -> Result<()> {
    crate::setup::all()?;
    crate::ebpf::build()?;
    let manifests = root().join(&opts.manifests);
    std::fs::create_dir_all(&manifests)?;
    eprintln!(
        "up: service proxy ({} mode) on {}; add Service and EndpointSlice manifests there; `proxy dump` shows what is programmed; Ctrl-C stops it (programmed services keep working)",
        opts.mode,
        manifests.display()
    );
    run(Command::new(env!("CARGO"))
        .current_dir(root())
        .args([
            "run",
            "--release",
            "-p",
            "proxy",
            "--",
            "run",
            "--mode",
            &opts.mode,
        ])
        .arg("--manifests")
        .arg(&manifests)
        .args(&opts.args))
}
