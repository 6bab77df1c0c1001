//! A whole skiff cluster on one machine, shared by `cargo xtask up`/`down` and the
//! end-to-end tests: the control plane (`control-plane server`, on the host bridge's address,
//! where nodes and pods reach it as the `kubernetes` Service's endpoint), and per node
//! a network namespace on a host bridge with the node agent (`node run`, its own
//! containerd) and the service proxy (`proxy run --source api`) whose programs are attached
//! to the node's cgroup (the pods' parent, with the node's own processes in its `host`
//! child), pins on the cluster's private bpffs. A relay makes the loopback-only registry
//! reachable from the nodes at the bridge's address.
//!
//! Everything made is recorded in `<state dir>/cluster.json` as it appears; [`down`] removes
//! exactly that, in order, and is idempotent. A [`Cluster`] handle tears its cluster down
//! on Drop (tests) unless [`Cluster::detach`]ed (`xtask up`).

pub mod network;
pub mod process;
pub mod proxy_daemonset;
pub mod relay;
pub mod state;

use crate::etcd;
use crate::kubeconfig::KubeconfigAccess;
use crate::kubectl::Kubectl;
use crate::netns::NetNs;
use network::Subnet;
use process::{Placement, Priority};
use relay::{Forward, Relay};
pub use state::{Binaries, NodeState, ServerState, State};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A cluster operation that failed, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn command_output(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(|e| Error::new(format!("starting {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How the relay runs.
#[derive(Clone, Debug)]
pub enum RelayMode {
    /// Threads of the process that brings the cluster up (tests: it lives as long as they do).
    Threads,
    /// A process of its own: `program args... LISTEN=TO`, on a fixed port (`xtask up`).
    Process {
        program: PathBuf,
        args: Vec<OsString>,
        registry_port: u16,
    },
}

/// What to bring up.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Names the bridge and veths; unique per cluster on the machine.
    pub name: String,
    /// Node names (their netns is `skiff-<node>`, their cgroup `/skiff-<node>`).
    pub nodes: Vec<String>,
    pub state_dir: PathBuf,
    pub subnet: Subnet,
    /// The API server's port on the bridge's address (0: any free port).
    pub api_port: u16,
    pub binaries: Binaries,
    pub relay: RelayMode,
    /// The local registry (loopback), relayed to the nodes.
    pub registry: SocketAddr,
    pub pause_image: String,
    /// Extra flags for `control-plane server`.
    pub control_plane_args: Vec<String>,
    /// The node agents' `--eviction-hard` (DEV_EVICTION_HARD by default).
    pub eviction_hard: String,
    /// Routes on the host to each node's podCIDR through the node, so the control plane
    /// reaches pods (admission webhooks served by pods, as on a control-plane node that is
    /// part of the pod network). Only for a cluster whose pod network is its own on the
    /// machine: `xtask up`, or a test that passes a `--cluster-cidr` of its own.
    pub pod_routes_on_host: bool,
    /// Node agents join with a bootstrap token (`control-plane token create`) and get their
    /// own client certificate through a CertificateSigningRequest (TLS bootstrap), instead
    /// of the admin kubeconfig.
    pub tls_bootstrap: bool,
    /// How each node's service proxy runs.
    pub proxy: ProxyDeployment,
    /// Cluster DNS as a workload: deploy/dns.yaml (skiff-dns, 2 replicas, Service
    /// `kube-dns` at [`CLUSTER_DNS_IP`]) applied through the API once nodes and proxies run,
    /// and waited for; node agents get `--cluster-dns` and `--cluster-domain`. Its pods
    /// reach the API through the `kubernetes` Service: with [`Spec::own_pod_network`].
    pub cluster_dns: bool,
    /// skiff's CSI driver as workloads: deploy/csi.yaml (DaemonSet `skiff-csi-node` on every
    /// node, Deployment `skiff-csi-controller`, CSIDriver `local.csi.skiff.io` and the
    /// default StorageClass `skiff-local`) applied once nodes and proxies run, and waited
    /// for until every node has the driver registered (its CSINode lists it). Its pods
    /// reach the API through the `kubernetes` Service: with [`Spec::own_pod_network`].
    pub csi: bool,
    /// Control-plane servers. One: on the embedded store, at the bridge's address. More:
    /// a 3-member etcd on loopback and that many `control-plane server`s on it, each at an
    /// address of its own on the bridge ([`Subnet::control_plane`]) sharing the cluster CA
    /// and the service-account key (controllers and scheduler leader-elected among them);
    /// the host's kubectl reaches them through the relay at the bridge's address, which
    /// fails over, and every node agent runs its own balancer over them
    /// ([`NODE_API_BALANCER`]), which the node's kubeconfigs and proxy name.
    pub control_planes: usize,
}

/// Where each node agent's API balancer listens, in the node's network namespace, with
/// several control planes (node/src/apibalancer.rs).
pub const NODE_API_BALANCER: &str = "127.0.0.1:6444";
/// The etcd members of a cluster with several control planes.
pub const ETCD_MEMBERS: usize = 3;
/// The API port of several control planes when the spec leaves it to the launcher (each
/// server has an address of its own, so the port can be the same for all, as Kubernetes'
/// `kubernetes` endpoints need).
const HA_API_PORT: u16 = 6443;

/// How each node's service proxy runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyDeployment {
    /// `proxy run` as a node-level process of each node, started by this library, with the
    /// `system:kube-proxy` client certificate.
    #[default]
    Process,
    /// deploy/proxy.yaml applied through the API (a DaemonSet in kube-system with its own
    /// ServiceAccount; see [`proxy_daemonset`]), Ready on every node before `up` returns.
    DaemonSet,
}

impl Spec {
    /// A pod network of the cluster's own, `10.251.<octet>.0/24` with a /26 per node (up to
    /// 4 nodes; `octet` from the test's subnet lease, unique on the machine), which the host
    /// routes to without meeting another cluster's: the control plane reaches pods (webhooks
    /// served by pods) and pods reach it (the `kubernetes` Service's endpoint is the host's
    /// bridge address) as on a control-plane node that is part of the pod network.
    pub fn own_pod_network(&mut self, octet: u8) {
        assert!(
            self.nodes.len() <= 4,
            "a /24 pod network holds 4 nodes' /26s"
        );
        self.control_plane_args.extend([
            "--cluster-cidr".to_string(),
            format!("10.251.{octet}.0/24"),
            "--node-cidr-mask-size".to_string(),
            "26".to_string(),
        ]);
        self.pod_routes_on_host = true;
    }

    /// The proxies as the DaemonSet of deploy/proxy.yaml instead of host processes.
    pub fn proxy_daemonset(&mut self) {
        self.proxy = ProxyDeployment::DaemonSet;
    }
}

/// Hard eviction thresholds for nodes that share the machine's disk with its builds. The
/// kubelet's `nodefs.available<10%` assumes a node's own disk; on a build machine a
/// workspace's targets alone can leave less than 10% of a large disk free while tens of GiB
/// remain, and every node would be tainted disk-pressure and nothing would schedule. An
/// absolute floor says what matters here: room for the pods' images and logs.
pub const DEV_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1Gi,nodefs.inodesFree<1%";

impl Spec {
    /// `nodes` nodes named `<name>-1`, `<name>-2`...; the API server on any free loopback
    /// port, the relay on threads, skiff's local registry and pause image.
    pub fn new(
        name: &str,
        nodes: usize,
        state_dir: &Path,
        subnet: Subnet,
        binaries: Binaries,
    ) -> Spec {
        Spec {
            name: name.to_string(),
            nodes: (1..=nodes).map(|i| format!("{name}-{i}")).collect(),
            state_dir: state_dir.to_path_buf(),
            subnet,
            api_port: 0,
            binaries,
            relay: RelayMode::Threads,
            registry: crate::registry::REGISTRY.parse().expect("registry address"),
            pause_image: crate::registry::PAUSE_IMAGE.to_string(),
            control_plane_args: Vec::new(),
            eviction_hard: DEV_EVICTION_HARD.to_string(),
            pod_routes_on_host: false,
            tls_bootstrap: false,
            proxy: ProxyDeployment::Process,
            cluster_dns: false,
            csi: false,
            control_planes: 1,
        }
    }
}

/// skiff's CSI driver as workloads (csi/): the node plugin DaemonSet, the controller
/// Deployment, the CSIDriver and the default StorageClass.
pub const CSI_MANIFEST: &str = include_str!("../../../deploy/csi.yaml");
/// The driver's name, in CSIDriver, StorageClass `skiff-local` and every CSINode.
pub const CSI_DRIVER: &str = "local.csi.skiff.io";
/// deploy/csi.yaml's StorageClass, the cluster's default.
pub const CSI_STORAGE_CLASS: &str = "skiff-local";

/// The cluster DNS Service's address (`kube-dns`, in deploy/dns.yaml), as in Kubernetes.
pub const CLUSTER_DNS_IP: &str = "10.96.0.10";
/// The cluster domain the node agents and the DNS serve.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The cluster DNS as a workload: ServiceAccount, RBAC, Deployment `skiff-dns`, Service
/// `kube-dns` (kube-system).
pub const DNS_MANIFEST: &str = include_str!("../../../deploy/dns.yaml");

/// Where the proxy of a node serves /metrics and /healthz (inside the node's namespace).
pub const PROXY_METRICS: &str = "127.0.0.1:10249";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running cluster.
pub struct Cluster {
    state: State,
    state_dir: PathBuf,
    relay: Option<Relay>,
    detached: bool,
    /// Each step of `up` and how long it took.
    pub timings: Vec<(String, Duration)>,
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::new(format!("{what}: {e}"))
}

/// Waits for `probe` with a deadline: [`crate::wait::try_wait_until`] with this module's
/// error.
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<T, String>,
) -> Result<T, Error> {
    crate::wait::try_wait_until(what, timeout, probe).map_err(Error::new)
}

impl Cluster {
    /// Brings the cluster up, step by step, printing each step's time. On failure what was
    /// made is removed again (the logs stay).
    pub fn up(spec: Spec) -> Result<Cluster, Error> {
        if let Some(s) = State::load(&spec.state_dir)? {
            return Err(Error::new(format!(
                "a cluster ({}) is recorded in {}: run `down` first",
                s.name,
                spec.state_dir.display()
            )));
        }
        let missing = spec.binaries.missing();
        if !missing.is_empty() {
            return Err(Error::new(format!("binaries missing: {missing:?}")));
        }
        for dir in ["logs", "nodes", "bpffs"] {
            std::fs::create_dir_all(spec.state_dir.join(dir))
                .map_err(io_err(spec.state_dir.join(dir).display()))?;
        }
        let state = State {
            name: spec.name.clone(),
            bridge: network::bridge_name(&spec.name),
            subnet: spec.subnet.to_string(),
            binaries: spec.binaries.clone(),
            pause_image: spec.pause_image.clone(),
            api: None,
            relay: None,
            relay_program: None,
            control_plane: None,
            servers: Vec::new(),
            etcd: Vec::new(),
            bpffs: spec.state_dir.join("bpffs"),
            bpffs_mounted: false,
            nodes: Vec::new(),
        };
        state.save(&spec.state_dir)?;
        let mut c = Cluster {
            state,
            state_dir: spec.state_dir.clone(),
            relay: None,
            detached: false,
            timings: Vec::new(),
        };
        // On an error `c` drops here and takes down what was made.
        c.bring_up(&spec)?;
        Ok(c)
    }

    fn step<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let t0 = Instant::now();
        let r = f(self);
        let took = t0.elapsed();
        match &r {
            Ok(_) => eprintln!("  {name:<52} {:>7.2} s", took.as_secs_f64()),
            Err(e) => eprintln!("  {name:<52} failed after {:.2} s: {e}", took.as_secs_f64()),
        }
        self.timings.push((name.to_string(), took));
        self.save()?;
        r
    }

    fn save(&self) -> Result<(), Error> {
        self.state.save(&self.state_dir)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{name}.log"))
    }

    fn bring_up(&mut self, spec: &Spec) -> Result<(), Error> {
        let n = spec.nodes.len();
        self.step("network: bridge, bpffs", |c| {
            network::create_bridge(&c.state.bridge, spec.subnet)?;
            command_output(
                Command::new("mount")
                    .args(["-t", "bpf", "bpf"])
                    .arg(&c.state.bpffs),
            )?;
            c.state.bpffs_mounted = true;
            Ok(())
        })?;
        let registry_relay = if spec.control_planes > 1 {
            let n = spec.control_planes;
            let members = self.step(&format!("etcd: {ETCD_MEMBERS} members on loopback"), |c| {
                c.start_etcd()
            })?;
            self.step(&format!("control planes: {n} servers on etcd"), |c| {
                c.start_servers(spec, &members)
            })?;
            self.step(
                "relay: the registry to the nodes, the API to the host",
                |c| c.start_relay(spec),
            )?
        } else {
            self.step("control plane: API server, controllers, scheduler", |c| {
                c.start_control_plane(spec)
            })?;
            self.step("relay: the registry to the nodes", |c| c.start_relay(spec))?
        };
        self.write_node_kubeconfig()?;
        self.write_proxy_kubeconfig()?;
        if spec.tls_bootstrap {
            self.step("a bootstrap token for the nodes", |c| {
                c.write_bootstrap_kubeconfig(spec)
            })?;
        }
        for (i, name) in spec.nodes.iter().enumerate() {
            self.step(&format!("node {name}: netns, veth, cgroups, agent"), |c| {
                c.start_node(spec, i, name, registry_relay)
            })?;
        }
        self.step(&format!("{n} nodes registered and Ready"), |c| {
            c.wait_nodes_ready()
        })?;
        if spec.pod_routes_on_host {
            self.step("routes from the host to the pods", |c| c.route_pods())?;
        }
        match spec.proxy {
            ProxyDeployment::Process => {
                for i in 0..n {
                    let name = spec.nodes[i].clone();
                    self.step(
                        &format!("proxy on {name}: programs attached, synced"),
                        |c| c.start_proxy(i),
                    )?;
                }
            }
            ProxyDeployment::DaemonSet => {
                self.step(
                    &format!("proxy DaemonSet applied, Ready on {n} nodes"),
                    |c| c.deploy_proxy(),
                )?;
            }
        }
        if spec.cluster_dns {
            self.step("cluster DNS: deploy/dns.yaml applied, Ready", |c| {
                c.deploy_dns()
            })?;
        }
        if spec.csi {
            self.step(
                &format!("CSI driver: deploy/csi.yaml applied, registered on {n} nodes"),
                |c| c.deploy_csi(),
            )?;
        }
        Ok(())
    }

    /// Applies [`CSI_MANIFEST`] with kubectl and waits until the node plugin is Ready on
    /// every node, the controller is Ready, and every node agent has registered the driver
    /// (its CSINode lists [`CSI_DRIVER`]).
    fn deploy_csi(&self) -> Result<(), Error> {
        self.apply("deploy/csi.yaml", CSI_MANIFEST)?;
        self.wait_csi()
    }

    /// `kubectl apply -f -` of a manifest (`what` names it in the error).
    fn apply(&self, what: &str, manifest: &str) -> Result<(), Error> {
        let applied = self
            .kubectl()
            .within(Duration::from_secs(60))
            .run_with_stdin(&["apply", "-f", "-"], manifest);
        if !applied.success {
            return Err(Error::new(format!(
                "kubectl apply {what}: {}{}",
                applied.stdout, applied.stderr
            )));
        }
        Ok(())
    }

    /// Waits until skiff's CSI driver is Ready and registered on every node.
    pub fn wait_csi(&self) -> Result<(), Error> {
        let n = self.state.nodes.len() as u64;
        wait_for(
            "the CSI node plugin Ready on every node and its controller Ready",
            READY_TIMEOUT,
            || {
                let ds = self
                    .api_get("/apis/apps/v1/namespaces/kube-system/daemonsets/skiff-csi-node")
                    .map_err(|e| e.to_string())?;
                let st = &ds["status"];
                if st["numberReady"].as_u64() != Some(n)
                    || st["updatedNumberScheduled"].as_u64() != Some(n)
                {
                    return Err(format!("node plugin: {st}"));
                }
                let d = self
                    .api_get(
                        "/apis/apps/v1/namespaces/kube-system/deployments/skiff-csi-controller",
                    )
                    .map_err(|e| e.to_string())?;
                match d.pointer("/status/readyReplicas").and_then(|v| v.as_u64()) {
                    Some(r) if r >= 1 => Ok(()),
                    _ => Err(format!("controller: {}", d["status"])),
                }
            },
        )?;
        for node in &self.state.nodes {
            wait_for(
                &format!("{CSI_DRIVER} registered on {}", node.name),
                READY_TIMEOUT,
                || {
                    let c = self
                        .api_get(&format!("/apis/storage.k8s.io/v1/csinodes/{}", node.name))
                        .map_err(|e| e.to_string())?;
                    let listed = c["spec"]["drivers"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|d| d["name"] == CSI_DRIVER));
                    if listed {
                        Ok(())
                    } else {
                        Err(format!("CSINode {c}"))
                    }
                },
            )?;
        }
        Ok(())
    }

    /// Applies deploy/proxy.yaml with this cluster's values ([`proxy_daemonset::manifest`])
    /// through the API and waits until a proxy pod is Ready on every node and each node's
    /// proxy answers /healthz (its initial sync is done).
    fn deploy_proxy(&mut self) -> Result<(), Error> {
        let api = self.node_api()?;
        let list = proxy_daemonset::manifest(&proxy_daemonset::ClusterValues {
            api,
            bpffs: &self.state.bpffs,
            cgroup_root: &crate::cgroup::v2_root(),
            log: std::env::var("SKIFF_PROXY_LOG").ok(),
        })?;
        self.apply("deploy/proxy.yaml", &list.to_string())?;
        self.wait_proxy_daemonset()
    }

    /// Waits until the proxy DaemonSet's pods are updated and Ready on every node and each
    /// node's proxy answers /healthz.
    pub fn wait_proxy_daemonset(&self) -> Result<(), Error> {
        let n = self.state.nodes.len() as u64;
        let path = format!(
            "/apis/apps/v1/namespaces/{}/daemonsets/{}",
            proxy_daemonset::NAMESPACE,
            proxy_daemonset::NAME
        );
        wait_for(
            "the proxy DaemonSet Ready on every node",
            READY_TIMEOUT,
            || {
                let ds = self.api_get(&path).map_err(|e| e.to_string())?;
                let st = &ds["status"];
                let count = |k: &str| st[k].as_u64().unwrap_or(0);
                let current = st["observedGeneration"] == ds["metadata"]["generation"];
                if !(current
                    && count("desiredNumberScheduled") == n
                    && count("updatedNumberScheduled") == n
                    && count("numberReady") == n
                    && count("numberAvailable") == n)
                {
                    return Err(format!("status {st}"));
                }
                for i in 0..self.state.nodes.len() {
                    match self.proxy_get(i, "/healthz") {
                        Ok(body) if body.trim() == "ok" => {}
                        other => return Err(format!("{}: {other:?}", self.state.nodes[i].name)),
                    }
                }
                Ok(())
            },
        )
    }

    /// Applies [`DNS_MANIFEST`] with kubectl and waits until the Deployment's replicas are
    /// all Ready and its Service has their endpoints.
    fn deploy_dns(&self) -> Result<(), Error> {
        self.apply("deploy/dns.yaml", DNS_MANIFEST)?;
        wait_for("the skiff-dns Deployment Ready", READY_TIMEOUT, || {
            let d = self
                .api_get("/apis/apps/v1/namespaces/kube-system/deployments/skiff-dns")
                .map_err(|e| e.to_string())?;
            let want = d.pointer("/spec/replicas").and_then(|v| v.as_u64());
            let ready = d.pointer("/status/readyReplicas").and_then(|v| v.as_u64());
            match (want, ready) {
                (Some(w), Some(r)) if r >= w => Ok(()),
                _ => Err(format!("replicas {want:?}, ready {ready:?}")),
            }
        })
    }

    fn start_control_plane(&mut self, spec: &Spec) -> Result<(), Error> {
        // The bridge's address, as a control-plane node's address on the node network: the
        // host (kubectl), the nodes and the pods (through the `kubernetes` Service, whose
        // endpoint this is) reach it there; every request is authenticated.
        let listen = SocketAddr::from((spec.subnet.host(), spec.api_port));
        let (kubeconfig, data_dir) = (self.kubeconfig(), self.state_dir.join("control-plane"));
        let pid = self.spawn_server(spec, &data_dir, listen, &kubeconfig, "control-plane", &[])?;
        self.state.control_plane = Some(pid);
        self.save()?;
        let server = self.wait_server(spec, pid, &kubeconfig, &self.log("control-plane"))?;
        self.state.api = Some(server);
        Ok(())
    }

    /// `control-plane server` with its data directory, address and admin kubeconfig; its pid.
    fn spawn_server(
        &self,
        spec: &Spec,
        data_dir: &Path,
        listen: SocketAddr,
        kubeconfig: &Path,
        log: &str,
        extra: &[String],
    ) -> Result<u32, Error> {
        let _ = std::fs::remove_file(kubeconfig);
        let mut cmd = Command::new(&spec.binaries.control_plane);
        cmd.arg("server")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--write-kubeconfig")
            .arg(kubeconfig)
            .arg("--advertise-address")
            .arg(listen.ip().to_string())
            // Port 0: several clusters (and other tests) on one machine never collide.
            .args([
                "--controller-manager-bind-address",
                "127.0.0.1:0",
                "--scheduler-bind-address",
                "127.0.0.1:0",
            ])
            .args(extra)
            .args(&spec.control_plane_args);
        process::spawn(
            &mut cmd,
            &self.log(log),
            Placement {
                priority: Priority::System,
                ..Placement::default()
            },
        )
    }

    /// Waits until the server `pid` has written `kubeconfig` and answers /readyz; where it
    /// serves.
    fn wait_server(
        &self,
        spec: &Spec,
        pid: u32,
        kubeconfig: &Path,
        log: &Path,
    ) -> Result<SocketAddr, Error> {
        let program = process::program_name(&spec.binaries.control_plane);
        let access = wait_for("the control plane's kubeconfig", READY_TIMEOUT, || {
            if !process::alive(pid, &program) {
                return Err(format!("control-plane exited; see {}", log.display()));
            }
            KubeconfigAccess::read(kubeconfig)
        })?;
        let server = &access.server;
        let addr: SocketAddr = server
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| Error::new(format!("server {server}: {e}")))?;
        wait_for("the API server /readyz", READY_TIMEOUT, || {
            match access.get("/readyz", Duration::from_secs(5))? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("status {code}: {body}")),
            }
        })?;
        Ok(addr)
    }

    /// Several control planes: etcd members on loopback ports (recorded as they start);
    /// their client ports once all are healthy.
    fn start_etcd(&mut self) -> Result<Vec<u16>, Error> {
        let dir = self.state_dir.join("etcd");
        let pki = self.etcd_pki();
        // A new cluster: nothing an earlier one left may be reused (no cluster is recorded
        // here, or `up` would have refused).
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io_err(dir.display()))?;
        let members: Vec<(String, u16, u16, u16)> = (0..ETCD_MEMBERS)
            .map(|i| {
                let p = etcd::free_port;
                (format!("m{i}"), p(), p(), p())
            })
            .collect();
        // TLS for clients and peers, every certificate checked: the members' own CA.
        let mut certs = Command::new(&self.state.binaries.control_plane);
        certs.arg("etcd-certs").arg("--dir").arg(&pki);
        for (name, ..) in &members {
            certs.args(["--member", name]);
        }
        command_output(&mut certs)?;
        let initial_cluster = members
            .iter()
            .map(|(name, _, peer, _)| format!("{name}={}", etcd::peer_url(*peer, true)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("skiff-{}", self.state.name);
        for (name, client_port, peer_port, metrics_port) in &members {
            let mut cmd = etcd::member_command(&etcd::MemberSpec {
                name,
                data_dir: &dir.join(name),
                client_port: *client_port,
                peer_port: *peer_port,
                initial_cluster: &initial_cluster,
                token: &token,
                tls: Some(&pki),
                metrics_port: Some(*metrics_port),
                fast_elections: false,
            });
            let pid = process::spawn(
                &mut cmd,
                &self.log(&format!("etcd-{name}")),
                Placement {
                    priority: Priority::System,
                    ..Placement::default()
                },
            )?;
            self.state.etcd.push(pid);
            self.save()?;
        }
        for (name, _, _, metrics_port) in &members {
            wait_for(
                &format!("etcd member {name} healthy"),
                READY_TIMEOUT,
                || etcd::health(*metrics_port),
            )?;
        }
        Ok(members.iter().map(|m| m.1).collect())
    }

    /// The etcd members' certificates and the API servers' client certificate for them.
    fn etcd_pki(&self) -> PathBuf {
        self.state_dir.join("etcd").join("pki")
    }

    /// Several control planes on the etcd at `etcd_ports`, one after the other: the first
    /// makes the cluster CA and the service-account key, the others start with copies of
    /// them (as `kubeadm join --control-plane` copies them), each at its own address on the
    /// bridge and the same port.
    fn start_servers(&mut self, spec: &Spec, etcd_ports: &[u16]) -> Result<(), Error> {
        let endpoints: Vec<String> = etcd_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let extra = [
            "--store".to_string(),
            format!("etcd://{}", endpoints.join(",")),
            // The host's kubectl reaches every server through the relay at the bridge's
            // address: a name in each server's certificate.
            "--tls-san".to_string(),
            spec.subnet.host().to_string(),
        ];
        let pki = self.etcd_pki();
        let client = certs_file(&pki, "apiserver-etcd-client");
        let extra: Vec<String> = extra
            .into_iter()
            .chain([
                "--etcd-cafile".into(),
                pki.join("ca.crt").display().to_string(),
                "--etcd-certfile".into(),
                client.0,
                "--etcd-keyfile".into(),
                client.1,
            ])
            .collect();
        let port = ha_api_port(spec);
        for i in 0..spec.control_planes {
            let ip = spec.subnet.control_plane(i);
            network::add_bridge_address(&self.state.bridge, ip)?;
            let (data_dir, kubeconfig) = match i {
                0 => (self.state_dir.join("control-plane"), self.kubeconfig()),
                _ => {
                    let d = self.state_dir.join(format!("control-plane-{i}"));
                    (d.clone(), d.join("admin.kubeconfig"))
                }
            };
            if i > 0 {
                copy_shared_pki(&self.state_dir.join("control-plane"), &data_dir)?;
            }
            let log = format!("control-plane-{i}");
            let addr = SocketAddr::from((ip, port));
            let pid = self.spawn_server(spec, &data_dir, addr, &kubeconfig, &log, &extra)?;
            self.state.servers.push(ServerState {
                pid: Some(pid),
                addr,
                data_dir,
                log: self.log(&log),
            });
            if i == 0 {
                self.state.control_plane = Some(pid);
                self.state.api = Some(addr);
            }
            self.save()?;
            self.wait_server(spec, pid, &kubeconfig, &self.log(&log))?;
        }
        Ok(())
    }

    /// SIGKILL the `i`-th of several control-plane servers and wait until it is gone.
    pub fn kill_server(&mut self, i: usize) -> Result<(), Error> {
        let s = self
            .state
            .servers
            .get(i)
            .ok_or_else(|| Error::new(format!("no control-plane server {i}")))?;
        let program = process::program_name(&self.state.binaries.control_plane);
        if let Some(pid) = s.pid.filter(|p| process::alive(*p, &program)) {
            // SAFETY: kill(2) on a pid verified to run the control plane.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            wait_for(
                "the killed server gone",
                READY_TIMEOUT,
                || match process::alive(pid, &program) {
                    true => Err("still running".to_string()),
                    false => Ok(()),
                },
            )?;
        }
        self.state.servers[i].pid = None;
        self.save()
    }

    /// Stops the node agent of the `i`-th node with SIGTERM, as a node's service manager
    /// does, and starts it again with the same command line, in the same namespace and
    /// cgroup. Its pods and their containers keep running; the new agent takes them over.
    pub fn restart_agent(&mut self, i: usize) -> Result<(), Error> {
        let node = self
            .state
            .nodes
            .get(i)
            .cloned()
            .ok_or_else(|| Error::new(format!("no node {i}")))?;
        let program = process::program_name(&self.state.binaries.node);
        let pid = node
            .agent
            .filter(|p| process::alive(*p, &program))
            .ok_or_else(|| Error::new(format!("the agent of {} is not running", node.name)))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(io_err(format!("the command line of {}'s agent", node.name)))?;
        let mut argv = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string());
        let exe = argv
            .next()
            .ok_or_else(|| Error::new("an empty command line"))?;
        if !process::stop(pid, &program, Duration::from_secs(30)) || process::alive(pid, &program) {
            return Err(Error::new(format!(
                "the agent of {} did not stop",
                node.name
            )));
        }
        let mut cmd = Command::new(exe);
        cmd.args(argv);
        let pid = process::spawn(
            &mut cmd,
            &self.log(&format!("node-{}", node.name)),
            Placement {
                netns: Some(&node.netns),
                cgroup: Some(&node.host_cgroup()),
                priority: Priority::System,
            },
        )?;
        self.state.nodes[i].agent = Some(pid);
        self.save()
    }

    /// The registry relay; returns the address nodes pull from.
    fn start_relay(&mut self, spec: &Spec) -> Result<SocketAddr, Error> {
        let registry_port = match &spec.relay {
            RelayMode::Threads => 0,
            RelayMode::Process { registry_port, .. } => *registry_port,
        };
        let mut forwards = vec![Forward::new(
            SocketAddr::from((spec.subnet.host(), registry_port)),
            spec.registry,
        )];
        // The host's kubectl with several control planes: the bridge's address, relayed to
        // a server that answers.
        let api_relay = (!self.state.servers.is_empty())
            .then(|| SocketAddr::from((spec.subnet.host(), ha_api_port(spec))));
        if let Some(listen) = api_relay {
            forwards.push(Forward {
                listen,
                to: self.state.servers.iter().map(|s| s.addr).collect(),
            });
        }
        match &spec.relay {
            RelayMode::Threads => {
                let relay = Relay::start(&forwards).map_err(io_err("starting the relay"))?;
                let bound = relay.bound[0];
                self.relay = Some(relay);
                self.point_admin_at(api_relay)?;
                Ok(bound)
            }
            RelayMode::Process { program, args, .. } => {
                let mut cmd = Command::new(program);
                cmd.args(args).args(forwards.iter().map(|f| f.to_string()));
                let pid = process::spawn(
                    &mut cmd,
                    &self.log("relay"),
                    Placement {
                        priority: Priority::System,
                        ..Placement::default()
                    },
                )?;
                self.state.relay = Some(pid);
                self.state.relay_program = Some(process::program_name(program));
                self.save()?;
                for f in &forwards {
                    wait_for(&format!("the relay on {}", f.listen), READY_TIMEOUT, || {
                        std::net::TcpStream::connect_timeout(&f.listen, Duration::from_secs(1))
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    })?;
                }
                self.point_admin_at(api_relay)?;
                Ok(forwards[0].listen)
            }
        }
    }

    /// The kubeconfig nodes use: the admin's, with the API server where nodes reach it
    /// ([`Cluster::node_api`]).
    fn write_node_kubeconfig(&self) -> Result<(), Error> {
        let text = std::fs::read_to_string(self.kubeconfig())
            .map_err(io_err(self.kubeconfig().display()))?;
        write_private(
            &self.node_kubeconfig(),
            &with_server(&text, self.node_api()?),
        )
    }

    /// With several control planes, the admin kubeconfig names the relay at the bridge's
    /// address (`relay`, which fails over) instead of the first server.
    fn point_admin_at(&mut self, relay: Option<SocketAddr>) -> Result<(), Error> {
        let Some(lb) = relay else {
            return Ok(());
        };
        let text = std::fs::read_to_string(self.kubeconfig())
            .map_err(io_err(self.kubeconfig().display()))?;
        write_private(&self.kubeconfig(), &with_server(&text, lb))?;
        self.state.api = Some(lb);
        self.save()
    }

    /// Where node-level clients (agents, proxies) reach the API: the API address, or with
    /// several control planes each node agent's balancer ([`NODE_API_BALANCER`]).
    fn node_api(&self) -> Result<SocketAddr, Error> {
        if !self.state.servers.is_empty() {
            return Ok(NODE_API_BALANCER.parse().expect("a valid address"));
        }
        self.state.api.ok_or_else(|| Error::new("no API server"))
    }

    /// The service proxies' kubeconfig: `system:kube-proxy` with a client certificate of the
    /// cluster CA (bound to `system:node-proxier` by the bootstrap policy), the API server at
    /// its bridge address.
    fn write_proxy_kubeconfig(&self) -> Result<(), Error> {
        let api = self.node_api()?;
        command_output(
            Command::new(&self.state.binaries.control_plane)
                .arg("kubeconfig")
                .arg("--data-dir")
                .arg(self.state_dir.join("control-plane"))
                .args(["--user", PROXY_USER])
                .arg("--server")
                .arg(format!("https://{api}"))
                .arg("--out")
                .arg(self.proxy_kubeconfig()),
        )?;
        Ok(())
    }

    /// A kubeconfig with a new bootstrap token and the API server at its bridge address,
    /// written by the real `control-plane token create --write-kubeconfig` (the token is
    /// never printed): what node agents join with under TLS bootstrap.
    fn write_bootstrap_kubeconfig(&self, spec: &Spec) -> Result<(), Error> {
        let api = self.node_api()?;
        command_output(
            Command::new(&spec.binaries.control_plane)
                .args(["token", "create", "--kubeconfig"])
                .arg(self.kubeconfig())
                .arg("--write-kubeconfig")
                .arg(self.bootstrap_kubeconfig())
                .arg("--server")
                .arg(format!("https://{api}")),
        )?;
        Ok(())
    }

    /// The kubeconfig with the nodes' bootstrap token (with `Spec::tls_bootstrap`).
    pub fn bootstrap_kubeconfig(&self) -> PathBuf {
        self.state_dir.join("bootstrap-kubeconfig")
    }

    fn start_node(
        &mut self,
        spec: &Spec,
        i: usize,
        name: &str,
        registry_relay: SocketAddr,
    ) -> Result<(), Error> {
        let node = NodeState {
            name: name.to_string(),
            netns: network::netns_name(name),
            veth: network::veth_name(&spec.name, name),
            ip: spec.subnet.node(i),
            data_dir: self.state_dir.join("nodes").join(name),
            // The node agent names its pods' cgroup parent `/skiff-<node>` (node/src/names.rs);
            // in the hybrid hierarchy runc mirrors it in the v2 tree, where the proxy attaches.
            cgroup: crate::cgroup::v2_root().join(format!("skiff-{name}")),
            bpffs: self.state.bpffs.join(name),
            agent: None,
            proxy: None,
            pod_cidr: None,
        };
        // Recorded before anything is made: `down` removes whatever part exists.
        self.state.nodes.push(node.clone());
        self.save()?;
        network::create_node(&node.netns, &node.veth, &self.state.bridge, node.ip)?;
        std::fs::create_dir_all(node.host_cgroup())
            .map_err(io_err(node.host_cgroup().display()))?;
        std::fs::create_dir_all(&node.data_dir).map_err(io_err(node.data_dir.display()))?;
        let pki = self.issue_kubelet_serving_cert(&node)?;
        let mut cmd = Command::new(&spec.binaries.node);
        cmd.arg("run");
        if spec.tls_bootstrap {
            // Its own kubeconfig, written by the agent once its certificate is issued.
            cmd.arg("--bootstrap-kubeconfig")
                .arg(self.bootstrap_kubeconfig())
                .arg("--kubeconfig")
                .arg(node.data_dir.join("kubeconfig"));
        } else {
            cmd.arg("--kubeconfig").arg(self.node_kubeconfig());
        }
        cmd.args(kubelet_tls_args(&pki))
            .args(["--name", name, "--node-ip", &node.ip.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args([
                "--listen",
                "0.0.0.0:10250",
                "--pause-image",
                &spec.pause_image,
            ])
            .arg("--insecure-registry")
            .arg(format!("{}=http://{registry_relay}", spec.registry))
            // `--image=busybox` as in every tutorial: docker.io's library images come from
            // the local registry (`cargo xtask images`), the only host for docker.io.
            .arg("--insecure-registry")
            .arg(format!("docker.io=http://{registry_relay}"))
            .arg("--eviction-hard")
            .arg(&spec.eviction_hard);
        if !self.state.servers.is_empty() {
            let servers: Vec<String> = self
                .state
                .servers
                .iter()
                .map(|s| s.addr.to_string())
                .collect();
            cmd.arg("--api-servers")
                .arg(servers.join(","))
                .args(["--api-balancer-listen", NODE_API_BALANCER]);
        }
        if spec.cluster_dns {
            // Pods resolve through the cluster DNS; the node's own resolver configuration
            // (dnsPolicy Default, hostNetwork pods, the DNS's upstreams) names no server, so
            // no query a pod makes leaves the machine: other names are refused. The option
            // line keeps the file non-empty, else containerd copies the host's instead.
            // Written once: `nameserver` lines added to it later are kept (forwarding).
            let resolv = self.state_dir.join("resolv.conf");
            if !resolv.exists() {
                std::fs::write(
                    &resolv,
                    "# skiff: no upstream resolver; the cluster's names only\noptions ndots:1\n",
                )
                .map_err(io_err(resolv.display()))?;
            }
            cmd.args([
                "--cluster-dns",
                CLUSTER_DNS_IP,
                "--cluster-domain",
                CLUSTER_DOMAIN,
            ])
            .arg("--resolv-conf")
            .arg(&resolv);
        }
        let pid = process::spawn(
            &mut cmd,
            &self.log(&format!("node-{name}")),
            Placement {
                netns: Some(&node.netns),
                cgroup: Some(&node.host_cgroup()),
                priority: Priority::System,
            },
        )?;
        self.state.nodes[i].agent = Some(pid);
        Ok(())
    }

    /// The node agent's serving certificate for its API from the cluster CA (its address
    /// and name as SANs) and the CA it checks callers' certificates against, written by
    /// `control-plane kubelet-serving-cert` into `<node data dir>/pki`; that directory.
    fn issue_kubelet_serving_cert(&self, node: &NodeState) -> Result<PathBuf, Error> {
        let dir = node.data_dir.join("pki");
        command_output(
            Command::new(&self.state.binaries.control_plane)
                .arg("kubelet-serving-cert")
                .arg("--data-dir")
                .arg(self.state_dir.join("control-plane"))
                .args(["--node", &node.name])
                .args(["--san", &node.ip.to_string(), "--san", &node.name])
                .arg("--out-dir")
                .arg(&dir),
        )?;
        Ok(dir)
    }

    fn wait_nodes_ready(&self) -> Result<(), Error> {
        let want: Vec<String> = self.state.nodes.iter().map(|n| n.name.clone()).collect();
        wait_for("every node Ready", READY_TIMEOUT, || {
            for n in &self.state.nodes {
                let program = process::program_name(&self.state.binaries.node);
                if !n.agent.is_some_and(|p| process::alive(p, &program)) {
                    return Err(format!(
                        "the agent of {} exited; see {}",
                        n.name,
                        self.log(&format!("node-{}", n.name)).display()
                    ));
                }
            }
            let ready = self.ready_nodes().map_err(|e| e.to_string())?;
            match want.iter().all(|w| ready.contains(w)) {
                true => Ok(()),
                false => Err(format!("ready: {ready:?}")),
            }
        })
    }

    /// `ip route replace <podCIDR> via <node>` on the host for every node. The routes go
    /// with the bridge at `down`.
    fn route_pods(&mut self) -> Result<(), Error> {
        for i in 0..self.state.nodes.len() {
            let node = self.state.nodes[i].clone();
            let cidr = wait_for(&format!("{}'s podCIDR", node.name), READY_TIMEOUT, || {
                let n = self
                    .api_get(&format!("/api/v1/nodes/{}", node.name))
                    .map_err(|e| e.to_string())?;
                n.pointer("/spec/podCIDR")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| "no podCIDR yet".to_string())
            })?;
            network::route_via(&cidr, node.ip)?;
            self.state.nodes[i].pod_cidr = Some(cidr);
            self.save()?;
        }
        Ok(())
    }

    /// Names of the nodes whose Ready condition is True.
    pub fn ready_nodes(&self) -> Result<Vec<String>, Error> {
        let v = self.api_get("/api/v1/nodes")?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// GET on the API server as the admin; the JSON body.
    pub fn api_get(&self, path: &str) -> Result<serde_json::Value, Error> {
        let access = KubeconfigAccess::read(&self.kubeconfig()).map_err(Error::new)?;
        let (code, text) = access
            .get(path, Duration::from_secs(5))
            .map_err(Error::new)?;
        if code != 200 {
            return Err(Error::new(format!("GET {path}: {code}")));
        }
        serde_json::from_str(&text).map_err(|e| Error::new(format!("GET {path}: {e}")))
    }

    fn start_proxy(&mut self, i: usize) -> Result<(), Error> {
        let node = self.state.nodes[i].clone();
        let mut cmd = Command::new(&self.state.binaries.proxy);
        cmd.args(["run", "--mode", "ebpf", "--source", "api", "--kubeconfig"])
            .arg(self.proxy_kubeconfig())
            .args(["--node-name", &node.name, "--metrics", PROXY_METRICS])
            .arg("--cgroup")
            .arg(&node.cgroup)
            .arg("--bpffs")
            .arg(&node.bpffs)
            // SKIFF_PROXY_LOG: a tracing filter for the proxies (debugging a test).
            .env(
                "RUST_LOG",
                std::env::var("SKIFF_PROXY_LOG").unwrap_or_else(|_| "info".into()),
            );
        let pid = process::spawn(
            &mut cmd,
            &self.log(&format!("proxy-{}", node.name)),
            Placement {
                netns: Some(&node.netns),
                cgroup: Some(&node.host_cgroup()),
                priority: Priority::System,
            },
        )?;
        self.state.nodes[i].proxy = Some(pid);
        self.save()?;
        let program = process::program_name(&self.state.binaries.proxy);
        wait_for("the proxy's initial sync (/healthz)", READY_TIMEOUT, || {
            if !process::alive(pid, &program) {
                return Err(format!(
                    "the proxy exited; see {}",
                    self.log(&format!("proxy-{}", node.name)).display()
                ));
            }
            match self.proxy_get(i, "/healthz") {
                Ok(body) if body.trim() == "ok" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
    }

    /// GET on node `i`'s proxy metrics endpoint (inside its namespace); the body.
    pub fn proxy_get(&self, i: usize, path: &str) -> Result<String, Error> {
        let node = &self.state.nodes[i];
        let addr: SocketAddr = PROXY_METRICS.parse().expect("valid address");
        NetNs::open(&node.netns)
            .and_then(|ns| {
                ns.run(|| crate::netns::http_get_path(addr, path, Duration::from_secs(2)))
            })
            .map_err(|e| Error::new(format!("GET {path} on {}: {e}", node.name)))
    }

    /// `proxy dump` of node `i`'s maps.
    pub fn proxy_dump(&self, i: usize) -> Result<String, Error> {
        command_output(
            Command::new(&self.state.binaries.proxy)
                .arg("dump")
                .arg("--bpffs")
                .arg(&self.state.nodes[i].bpffs),
        )
    }

    /// A command that runs as a node-level process of node `i` (see [`node_command`]).
    pub fn node_command(
        &self,
        i: usize,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<Command, Error> {
        node_command(&self.state.nodes[i], program)
    }

    /// The admin kubeconfig (API server on loopback).
    pub fn kubeconfig(&self) -> PathBuf {
        self.state_dir.join("kubeconfig")
    }

    fn node_kubeconfig(&self) -> PathBuf {
        self.state_dir.join("node-kubeconfig")
    }

    /// The service proxies' kubeconfig (`system:kube-proxy`, API server at the relay).
    pub fn proxy_kubeconfig(&self) -> PathBuf {
        self.state_dir.join("proxy-kubeconfig")
    }

    /// A kubeconfig for `user` (in `group`) with a new client certificate from the cluster
    /// CA (`control-plane kubeconfig`), at `<state dir>/<user>.kubeconfig`.
    pub fn user_kubeconfig(&self, user: &str, group: Option<&str>) -> Result<PathBuf, Error> {
        let out = self.state_dir.join(format!("{user}.kubeconfig"));
        let mut cmd = Command::new(&self.state.binaries.control_plane);
        cmd.arg("kubeconfig")
            .arg("--data-dir")
            .arg(self.state_dir.join("control-plane"))
            .args(["--user", user])
            .arg("--out")
            .arg(&out);
        if let Some(g) = group {
            cmd.args(["--group", g]);
        }
        command_output(&mut cmd)?;
        Ok(out)
    }

    /// The real kubectl on the admin kubeconfig (its own HOME and discovery cache).
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.kubeconfig(), &self.state_dir)
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Leaves the cluster running when the handle goes (its relay must then be a process).
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if let Err(e) = down(&self.state_dir) {
            eprintln!("cluster teardown: {e}");
        }
        // The relay threads stop last: the agents needed them while stopping.
        self.relay = None;
    }
}

/// `<dir>/<name>.crt` and `.key`, as flag values.
fn certs_file(dir: &Path, name: &str) -> (String, String) {
    let f = |ext: &str| dir.join(format!("{name}.{ext}")).display().to_string();
    (f("crt"), f("key"))
}

/// The API port of several control planes.
fn ha_api_port(spec: &Spec) -> u16 {
    match spec.api_port {
        0 => HA_API_PORT,
        p => p,
    }
}

/// What every API server of a cluster shares, copied from the first one's data directory
/// into another's: the cluster CA (certificates and signing) and the service-account token
/// key (a token one server issued is valid on all).
fn copy_shared_pki(from: &Path, to: &Path) -> Result<(), Error> {
    let (src, dst) = (from.join("pki"), to.join("pki"));
    std::fs::create_dir_all(&dst).map_err(io_err(dst.display()))?;
    for f in ["ca.crt", "ca.key", "sa.key"] {
        let text = std::fs::read_to_string(src.join(f)).map_err(io_err(src.join(f).display()))?;
        write_private(&dst.join(f), &text)?;
    }
    Ok(())
}

/// `text` (a kubeconfig) with every `server:` naming `https://<api>`.
fn with_server(text: &str, api: SocketAddr) -> String {
    text.lines()
        .map(|l| match l.trim_start().strip_prefix("server:") {
            Some(_) => {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}server: https://{api}\n")
            }
            None => format!("{l}\n"),
        })
        .collect()
}

/// The service proxies' user, bound to `system:node-proxier` as kube-proxy is.
pub const PROXY_USER: &str = "system:kube-proxy";

/// `node run`'s flags for the files `control-plane kubelet-serving-cert --out-dir <pki>`
/// writes: its serving certificate and key, and the cluster CA it checks callers against.
pub fn kubelet_tls_args(pki: &Path) -> Vec<OsString> {
    [
        ("--tls-cert-file", "kubelet.crt"),
        ("--tls-private-key-file", "kubelet.key"),
        ("--client-ca-file", "ca.crt"),
    ]
    .into_iter()
    .flat_map(|(flag, file)| [OsString::from(flag), pki.join(file).into_os_string()])
    .collect()
}

/// A command that runs as a node-level process of `node`: in its network namespace and
/// its `host` cgroup, so the node's proxy translates service addresses for it.
pub fn node_command(
    node: &NodeState,
    program: impl AsRef<std::ffi::OsStr>,
) -> Result<Command, Error> {
    let mut cmd = Command::new(program);
    Placement {
        netns: Some(&node.netns),
        cgroup: Some(&node.host_cgroup()),
        priority: Priority::Inherited,
    }
    .apply(&mut cmd)?;
    Ok(cmd)
}

fn write_private(path: &Path, text: &str) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io_err(path.display()))
}

/// Whether the cluster recorded in `state_dir` runs (its control plane is alive).
pub fn running(state_dir: &Path) -> Result<Option<State>, Error> {
    Ok(State::load(state_dir)?.filter(|s| {
        let program = process::program_name(&s.binaries.control_plane);
        s.control_plane
            .into_iter()
            .chain(s.servers.iter().filter_map(|s| s.pid))
            .any(|p| process::alive(p, &program))
    }))
}

/// Mount points at or below `dir` (deepest first).
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

fn remove_cgroup(dir: &Path) {
    let host = dir.join("host");
    if host.exists() {
        // Whatever still runs as a node-level process of this node ends now.
        let _ = std::fs::write(host.join("cgroup.kill"), "1");
        let _ = wait_for(
            "the node's host cgroup to empty",
            Duration::from_secs(5),
            || match std::fs::read_to_string(host.join("cgroup.procs")) {
                Ok(t) if !t.trim().is_empty() => Err(t),
                _ => Ok(()),
            },
        );
        let _ = std::fs::remove_dir(&host);
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes the cluster recorded in `state_dir`, in order: proxies, node agents, each node's
/// pods and runtime state (`node reset`), control plane, relay, pins, namespaces, veths,
/// bridge, cgroups, data. Idempotent; returns what it removed.
pub fn down(state_dir: &Path) -> Result<Vec<String>, Error> {
    let Some(mut s) = State::load(state_dir)? else {
        return Ok(Vec::new());
    };
    let mut done = Vec::new();
    let proxy = process::program_name(&s.binaries.proxy);
    let node = process::program_name(&s.binaries.node);
    for n in &s.nodes {
        if n.proxy
            .is_some_and(|p| process::stop(p, &proxy, Duration::from_secs(10)))
        {
            done.push(format!("proxy of {}", n.name));
        }
    }
    for n in &s.nodes {
        if n.agent
            .is_some_and(|p| process::stop(p, &node, Duration::from_secs(30)))
        {
            done.push(format!("node agent of {}", n.name));
        }
    }
    for n in &s.nodes {
        if n.data_dir.exists() {
            // Inside the node's namespace when it still exists: CNI teardown runs there.
            // (The handle lives until the command has run: it owns the fd setns uses.)
            let ns = NetNs::open(&n.netns).ok();
            let mut cmd = match &ns {
                Some(ns) => ns.command(&s.binaries.node),
                None => Command::new(&s.binaries.node),
            };
            cmd.args(["reset", "--name", &n.name, "--pause-image", &s.pause_image])
                .arg("--data-dir")
                .arg(&n.data_dir);
            match command_output(&mut cmd) {
                Ok(_) => done.push(format!("pods and containerd state of {}", n.name)),
                Err(e) => eprintln!("down: node reset of {}: {e}", n.name),
            }
        }
    }
    let cp = process::program_name(&s.binaries.control_plane);
    if s.control_plane
        .is_some_and(|p| process::stop(p, &cp, Duration::from_secs(30)))
    {
        done.push("control plane".into());
    }
    for (i, server) in s.servers.iter().enumerate() {
        if server
            .pid
            .is_some_and(|p| process::stop(p, &cp, Duration::from_secs(30)))
        {
            done.push(format!("control-plane server {i}"));
        }
    }
    for (i, pid) in s.etcd.iter().enumerate() {
        if process::stop(*pid, "etcd", Duration::from_secs(10)) {
            done.push(format!("etcd member m{i}"));
        }
    }
    if let (Some(pid), Some(program)) = (s.relay, &s.relay_program) {
        if process::stop(pid, program, Duration::from_secs(5)) {
            done.push("relay".into());
        }
    }
    if s.bpffs_mounted || mounts_below(&s.bpffs).contains(&s.bpffs) {
        // Unmounting the private bpffs drops every pin: the programs detach.
        let _ = Command::new("umount").arg(&s.bpffs).status();
        s.bpffs_mounted = false;
        done.push(format!("bpffs pins ({})", s.bpffs.display()));
    }
    for n in &s.nodes {
        if network::delete_netns(&n.netns) {
            done.push(format!("netns {}", n.netns));
        }
        if network::delete_link(&n.veth) {
            done.push(format!("veth {}", n.veth));
        }
        if n.cgroup.exists() {
            remove_cgroup(&n.cgroup);
            done.push(format!("cgroup {}", n.cgroup.display()));
        }
    }
    if network::delete_link(&s.bridge) {
        done.push(format!("bridge {}", s.bridge));
    }
    for n in &s.nodes {
        for m in mounts_below(&n.data_dir) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        if n.data_dir.exists() {
            let _ = std::fs::remove_dir_all(&n.data_dir);
            done.push(format!("data of {}", n.name));
        }
    }
    // Several control planes: their data and etcd's (a later `up` starts a new cluster;
    // members must never start on an old cluster's data with new ports).
    for server in &s.servers {
        let _ = std::fs::remove_dir_all(&server.data_dir);
    }
    if !s.etcd.is_empty() && state_dir.join("etcd").exists() {
        let _ = std::fs::remove_dir_all(state_dir.join("etcd"));
        done.push("etcd data".into());
    }
    for leftover in [
        "control-plane",
        "kubeconfig",
        "node-kubeconfig",
        "proxy-kubeconfig",
        "bootstrap-kubeconfig",
        "kubectl-home",
    ] {
        let p = state_dir.join(leftover);
        if p.is_dir() {
            let _ = std::fs::remove_dir_all(&p);
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
    let _ = std::fs::remove_dir(&s.bpffs);
    let _ = std::fs::remove_dir(state_dir.join("nodes"));
    std::fs::remove_file(state_dir.join(state::FILE))
        .map_err(io_err(state_dir.join(state::FILE).display()))?;
    Ok(done)
}
