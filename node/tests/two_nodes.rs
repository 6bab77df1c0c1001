//! Two nodes, each in a network namespace of its own with its own agent process (and so its
//! own containerd, bridge and pod CIDR), joined by a bridge on the test's side: a pod on one
//! node reaches a pod on the other through the routes each agent learns from the Node
//! objects. The API server runs in-process on the link's host address.

mod common;

use common::settings;
use control_plane::apiserver::{Config, RunningServer, Server};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use node::cri::Cri;
use serde_json::json;
use skiff_tests::netns::{must, unique_name, NetNs, Veth};
use skiff_tests::registry::{ECHO_IMAGE, REGISTRY};
use skiff_tests::subnet::{self, SubnetLease};
use skiff_tests::wait_until_async;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A Linux bridge in the test's namespace joining the nodes' veths, deleted on drop.
struct HostBridge(String);

impl Drop for HostBridge {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

/// The local registry (loopback only) relayed to the link's host address, for the nodes'
/// containerds in their namespaces; stops on drop.
struct Relay(tokio::task::JoinHandle<()>);

impl Relay {
    async fn start(listen: &str, to: &str) -> Relay {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        let to = to.to_string();
        Relay(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = to.clone();
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        }))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One node: its namespace, link, agent process and data dir; torn down on drop.
struct NodeProc {
    name: String,
    ip: String,
    data_dir: PathBuf,
    child: Option<Child>,
    /// The agent's arguments and log, to start it again (`restart_after`).
    args: Vec<std::ffi::OsString>,
    log: PathBuf,
    ns: NetNs,
    _veth: Veth,
    _cidr: SubnetLease,
}

impl NodeProc {
    fn start(
        name: &str,
        ip: &str,
        link: &SubnetLease,
        bridge: &str,
        kubeconfig: &Path,
        dir: &Path,
    ) -> NodeProc {
        let api_dir = dir.join("api");
        let registry = format!(
            "{REGISTRY}=http://{}:5000",
            link.cidr().replace(".0/24", ".1")
        );
        let ns = NetNs::new("skn");
        let veth = Veth::new(None, &ns);
        must(Command::new("ip").args(["link", "set", &veth.host, "master", bridge]));
        let host_ip = link.cidr().replace(".0/24", ".1");
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", &veth.peer]);
        ns.ip(&["route", "add", "default", "via", &host_ip]);
        let data_dir = dir.join(name);
        let pki = dir.join(format!("{name}-pki"));
        let tls = common::cluster::serving_tls_files(&api_dir, name, &[ip, name], &pki);
        let log = dir.join(format!("{name}.log"));
        let mut args: Vec<std::ffi::OsString> = [
            "run",
            "--name",
            name,
            "--node-ip",
            ip,
            "--listen",
            "127.0.0.1:0",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.extend(tls.iter().map(Into::into));
        args.extend(["--kubeconfig".into(), kubeconfig.as_os_str().to_owned()]);
        args.extend(["--data-dir".into(), data_dir.as_os_str().to_owned()]);
        args.extend(
            [
                "--pause-image",
                &settings().sandbox_image,
                "--insecure-registry",
                &registry,
            ]
            .iter()
            .map(Into::into),
        );
        let child = spawn_agent(&ns, &args, &log);
        NodeProc {
            name: name.into(),
            ip: ip.into(),
            data_dir,
            child: Some(child),
            args,
            log,
            ns,
            _veth: veth,
            _cidr: subnet::lease(),
        }
    }

    /// Kills the agent with `signal` (SIGKILL: a crash that cleans nothing up), runs `meanwhile`,
    /// and starts it again with the same arguments and data dir.
    fn restart_after(&mut self, signal: i32, meanwhile: impl FnOnce()) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, signal) };
            let _ = c.wait();
        }
        meanwhile();
        self.child = Some(spawn_agent(&self.ns, &self.args, &self.log));
    }

    fn cri(&self) -> Cri {
        Cri::new(&self.data_dir.join("containerd/containerd.sock"))
    }
}

/// Starts a node agent in `ns`, appending to `log`.
fn spawn_agent(ns: &NetNs, args: &[std::ffi::OsString], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    ns.command(env!("CARGO_BIN_EXE_node"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting the node agent")
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        // The agent leaves pods running by design: remove them, its bridge and cgroups.
        let _ = self
            .ns
            .command(env!("CARGO_BIN_EXE_node"))
            .args(["reset", "--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--pause-image", &settings().sandbox_image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

struct TwoNodes {
    _relay: Relay,
    a: NodeProc,
    b: NodeProc,
    server: Option<RunningServer>,
    client: Client,
    _identity: common::Controllers,
    _bridge: HostBridge,
    _link: SubnetLease,
    _dir: tempfile::TempDir,
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(s.shutdown())
            });
        }
    }
}

async fn two_nodes() -> TwoNodes {
    skiff_tests::registry::require_images();
    let dir = tempfile::Builder::new()
        .prefix("sk2")
        .tempdir_in("/tmp")
        .unwrap();
    let link = subnet::lease();
    let host_ip = link.cidr().replace(".0/24", ".1");
    let bridge = HostBridge(unique_name("skl"));
    must(Command::new("ip").args(["link", "add", &bridge.0, "type", "bridge"]));
    must(Command::new("ip").args(["addr", "add", &format!("{host_ip}/24"), "dev", &bridge.0]));
    must(Command::new("ip").args(["link", "set", &bridge.0, "up"]));
    let server = Server::start(Config::new(
        dir.path().join("api"),
        format!("{host_ip}:0").parse().unwrap(),
    ))
    .await
    .unwrap();
    let relay = Relay::start(&format!("{host_ip}:5000"), REGISTRY).await;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let client = control_plane::runtime::client::from_kubeconfig(&kubeconfig)
        .await
        .unwrap();
    let identity = common::identity_controllers(client.clone(), &kubeconfig).await;
    let tag = std::process::id();
    let a = NodeProc::start(
        &format!("na{tag}"),
        &link.cidr().replace(".0/24", ".2"),
        &link,
        &bridge.0,
        &kubeconfig,
        dir.path(),
    );
    let b = NodeProc::start(
        &format!("nb{tag}"),
        &link.cidr().replace(".0/24", ".3"),
        &link,
        &bridge.0,
        &kubeconfig,
        dir.path(),
    );
    TwoNodes {
        _relay: relay,
        a,
        b,
        server: Some(server),
        client,
        _identity: identity,
        _bridge: bridge,
        _link: link,
        _dir: dir,
    }
}

async fn ready_pod(pods: &Api<Pod>, name: &str) -> Pod {
    wait_until_async(&format!("{name} Running"), T, || {
        let (pods, name) = (pods.clone(), name.to_string());
        async move {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some() {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_on_one_node_reaches_a_pod_on_the_other() {
    let mut c = two_nodes().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    for n in [&c.a, &c.b] {
        wait_until_async(&format!("{} registered", n.name), T, || {
            let (nodes, name) = (nodes.clone(), n.name.clone());
            async move { nodes.get_opt(&name).await.ok().flatten().ok_or(()) }
        })
        .await;
        let cidr = n._cidr.cidr();
        let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
        nodes
            .patch(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    for (name, node) in [("pa", &c.a), ("pb", &c.b)] {
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node.name, "containers": [{"name": "echo", "image": ECHO_IMAGE,
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let pa = ready_pod(&pods, "pa").await;
    let pb = ready_pod(&pods, "pb").await;
    let ip_b = pb.status.unwrap().pod_ip.unwrap();
    let id_a = pa.status.unwrap().container_statuses.unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    // From inside pod a (node a's netns, through its bridge and route) to pod b.
    let cri = c.a.cri();
    let out = wait_until_async("pa reaches pb", T, || {
        let (cri, id, url) = (
            cri.clone(),
            id_a.trim_start_matches("containerd://").to_string(),
            format!("http://{ip_b}:8080/"),
        );
        async move {
            let r = cri
                .exec_sync(
                    &id,
                    vec!["/echo".into(), "fetch".into(), url],
                    Duration::from_secs(5),
                )
                .await
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&r.stdout).into_owned();
            if r.exit_code == 0 {
                Ok(text)
            } else {
                Err(text)
            }
        }
    })
    .await;
    assert!(
        out.starts_with(&format!(
            "pod=pb namespace=default ip={ip_b} node={}",
            c.b.name
        )),
        "{out}"
    );
    let route = c.a.ns.ip(&["route", "show", c.b._cidr.cidr()]);
    assert!(
        route.contains(&format!("via {}", c.b.ip)),
        "node a routes b's pods via b: {route}"
    );

    // A third node (an object only: its InternalIP on the link, nobody behind it) gets a
    // route on a; deleted while a's agent is down (killed: no clean-up), the restarted agent
    // finds the route it installed earlier (skiff's route protocol) and removes it, and keeps
    // the route to b.
    let ghost = format!("ng{}", std::process::id());
    // Any address on the link will do: it is only a gateway.
    let ghost_ip = format!("{}.9", c.b.ip.rsplit_once('.').unwrap().0);
    let ghost_cidr = "10.250.77.0/24";
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": ghost},
        "spec": {"podCIDR": ghost_cidr, "podCIDRs": [ghost_cidr]}}))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {"addresses": [{"type": "InternalIP",
        "address": ghost_ip}]}});
    nodes
        .patch_status(&ghost, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let ns_a = &c.a.ns;
    wait_until_async("a routes the third node's pods", T, || async {
        let r = ns_a.ip(&["route", "show", ghost_cidr, "proto", "83"]);
        if r.contains("via") {
            Ok(())
        } else {
            Err(r)
        }
    })
    .await;
    let (client, ghost2) = (c.client.clone(), ghost.clone());
    c.a.restart_after(libc::SIGKILL, move || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let nodes: Api<Node> = Api::all(client);
                nodes.delete(&ghost2, &Default::default()).await.unwrap();
            })
        })
    });
    let ns_a = &c.a.ns;
    wait_until_async(
        "the restarted agent removes the gone node's route",
        T,
        || async {
            let r = ns_a.ip(&["route", "show", ghost_cidr]);
            if r.trim().is_empty() {
                Ok(())
            } else {
                Err(r)
            }
        },
    )
    .await;
    let route = c.a.ns.ip(&["route", "show", c.b._cidr.cidr()]);
    assert!(
        route.contains(&format!("via {}", c.b.ip)),
        "the route to a node that still exists stays: {route}"
    );
}
