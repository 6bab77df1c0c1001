//! The node agent's CSI client against real parts: a CSI Node service and a plugin
//! Registration service served over real unix sockets (an in-test driver that records every
//! call and stages and publishes with real bind mounts), a real API server and node agent
//! with its containerd (tests/common/cluster.rs), real containers that write through the
//! published volume.

mod common;

use common::cluster::{running_ready, Cluster, T};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use node::csi::mountinfo;
use node::csi::volumes::{ClaimVolume, CsiVolumes};
use node::csi::{Driver, Drivers};
use node::layout::Layout;
use node::metrics::Metrics;
use serde_json::json;
use skiff_csi::proto::csi::v1 as csi;
use skiff_csi::proto::registration as reg;
use skiff_tests::registry::BUSYBOX_IMAGE;
use skiff_tests::wait_until_async;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "local.csi.skiff.io";
const TOPOLOGY_KEY: &str = "topology.local.csi.skiff.io/node";

// ---------------------------------------------------------------- unit: paths, mountinfo

#[test]
fn a_claim_needs_its_filesystem_grown_when_pending_or_smaller_than_its_resized_volume() {
    use node::csi::expand::resize_target;
    let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "v"},
                                      "spec": {"capacity": {"storage": "128Mi"}}}))
    .unwrap();
    let claim = |annotated: bool, capacity: &str, pending: Option<&str>| {
        let mut c = json!({"metadata": {"name": "c"},
                           "status": {"capacity": {"storage": capacity}}});
        if annotated {
            c["metadata"]["annotations"] = json!({"volume.kubernetes.io/storage-resizer": DRIVER});
        }
        if let Some(status) = pending {
            c["status"]["conditions"] =
                json!([{"type": "FileSystemResizePending", "status": status}]);
        }
        serde_json::from_value::<PersistentVolumeClaim>(c).unwrap()
    };
    let want = Some((128i64 << 20, "128Mi".to_string()));
    assert_eq!(
        resize_target(&pv, &claim(false, "64Mi", Some("True"))),
        want
    );
    assert_eq!(resize_target(&pv, &claim(true, "64Mi", None)), want);
    // 128Mi written otherwise is the same size: nothing to grow.
    assert_eq!(resize_target(&pv, &claim(true, "134217728", None)), None);
    assert_eq!(resize_target(&pv, &claim(false, "64Mi", None)), None);
    assert_eq!(
        resize_target(&pv, &claim(false, "64Mi", Some("False"))),
        None
    );
}

#[test]
fn kubelet_paths_map_to_the_agents_root_and_back() {
    let l = Layout::new("/tmp/skn-x/node");
    assert_eq!(
        l.host_path(Path::new("/var/lib/kubelet")),
        PathBuf::from("/tmp/skn-x/node")
    );
    assert_eq!(
        l.host_path(Path::new("/var/lib/kubelet/plugins/d/csi.sock")),
        PathBuf::from("/tmp/skn-x/node/plugins/d/csi.sock")
    );
    // Only whole components: /var/lib/kubeletx is another directory; others are unchanged.
    assert_eq!(
        l.host_path(Path::new("/var/lib/kubeletx/a")),
        PathBuf::from("/var/lib/kubeletx/a")
    );
    assert_eq!(
        l.host_path(Path::new("/etc/hosts")),
        PathBuf::from("/etc/hosts")
    );
    assert_eq!(
        l.kubelet_path(Path::new("/tmp/skn-x/node/pods/u/volumes")),
        Some(PathBuf::from("/var/lib/kubelet/pods/u/volumes"))
    );
    assert_eq!(
        l.kubelet_path(Path::new("/tmp/skn-x/node")),
        Some(PathBuf::from("/var/lib/kubelet"))
    );
    assert_eq!(l.kubelet_path(Path::new("/tmp/skn-x/nodeother/a")), None);
    // Round trip of the paths the agent hands a driver.
    let staging = l.csi_staging_dir(DRIVER, "vol-1").join("globalmount");
    assert_eq!(l.host_path(&l.kubelet_path(&staging).unwrap()), staging);
    // The staging dir is named by the SHA-256 of the handle (hex), as the kubelet names it.
    let name = l.csi_staging_dir(DRIVER, "abc");
    assert_eq!(
        name,
        PathBuf::from(format!(
            "/tmp/skn-x/node/plugins/kubernetes.io/csi/{DRIVER}/\
             ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        ))
    );
    assert_eq!(
        l.csi_publish_dir("uid-1", "pv-1").join("mount"),
        PathBuf::from("/tmp/skn-x/node/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount")
    );
}

#[test]
fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
    let text = "\
36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
412 27 254:0 /tmp/skn/disk /tmp/skn/node/pods/u/volumes/kubernetes.io~csi/pv\\040a/mount rw,relatime shared:210 master:3 - ext4 /dev/vda rw
bad line
413 27 0:50 / /tmp/x rw - tmpfs tmp\\134fs rw
";
    let m = mountinfo::parse(text);
    assert_eq!(m.len(), 3, "{m:?}");
    assert_eq!(m[0].id, 36);
    assert_eq!(m[0].parent, 35);
    assert_eq!(m[0].root, PathBuf::from("/mnt1"));
    assert_eq!(m[0].mount_point, PathBuf::from("/mnt/parent"));
    assert_eq!(m[0].optional, vec!["master:1".to_string()]);
    assert_eq!(m[0].fs_type, "ext3");
    assert_eq!(m[0].source, "/dev/root");
    assert!(!m[0].is_shared());
    assert_eq!(
        m[1].mount_point,
        PathBuf::from("/tmp/skn/node/pods/u/volumes/kubernetes.io~csi/pv a/mount")
    );
    assert!(m[1].is_shared());
    assert!(m[2].optional.is_empty());
    assert_eq!(m[2].source, "tmp\\fs");
    assert!(mountinfo::is_mount_point_in(&m, Path::new("/tmp/x")));
    assert!(!mountinfo::is_mount_point_in(&m, Path::new("/tmp")));
    // This process's own table has the root.
    assert!(mountinfo::is_mount_point(Path::new("/")));
}

#[test]
fn csi_versions_and_volume_capabilities() {
    use node::csi::plugins::supports_v1;
    assert!(supports_v1(&["1.0.0".into()]));
    assert!(supports_v1(&["0.3.0".into(), "v1.5".into()]));
    assert!(!supports_v1(&["0.3.0".into(), "2.0.0".into()]));
    assert!(!supports_v1(&[]));
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv"},
        "spec": {"accessModes": ["ReadOnlyMany", "ReadWriteOnce"], "mountOptions": ["noatime"],
                 "csi": {"driver": DRIVER, "volumeHandle": "h", "fsType": "ext4"}}
    }))
    .unwrap();
    let cap = node::csi::volumes::volume_capability(&pv).unwrap();
    assert_eq!(
        cap.access_mode.unwrap().mode,
        csi::volume_capability::access_mode::Mode::MultiNodeReaderOnly as i32
    );
    match cap.access_type {
        Some(csi::volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4");
            assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    let mut block = pv.clone();
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert!(node::csi::volumes::volume_capability(&block).is_err());
}

// ---------------------------------------------------------------- the in-test driver

/// Every call the driver got, in order: (rpc, volume id, path in the kubelet's form).
#[derive(Default)]
struct Calls(Mutex<Vec<(String, String, String)>>);

impl Calls {
    fn push(&self, rpc: &str, id: &str, path: &str) {
        self.0
            .lock()
            .unwrap()
            .push((rpc.into(), id.into(), path.into()));
    }
    fn of(&self, rpc: &str) -> Vec<(String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _, _)| r == rpc)
            .map(|(_, id, p)| (id.clone(), p.clone()))
            .collect()
    }
}

/// A CSI Node service that stages a volume by bind-mounting its "disk" (a directory of the
/// test) on the staging path and publishes by bind-mounting the staging path (read-only when
/// asked), as a mount-type driver does; it records each call and each stage request.
struct TestNodeService {
    layout: Layout,
    disks: PathBuf,
    node_id: String,
    calls: Arc<Calls>,
    stages: Arc<Mutex<Vec<csi::NodeStageVolumeRequest>>>,
    publishes: Arc<Mutex<Vec<csi::NodePublishVolumeRequest>>>,
}

fn status(e: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::internal(e.to_string())
}

fn bind(src: &Path, dst: &Path, readonly: bool) -> Result<(), tonic::Status> {
    use nix::mount::{mount, MsFlags};
    if mountinfo::is_mount_point(dst) {
        return Ok(()); // idempotent
    }
    std::fs::create_dir_all(dst).map_err(status)?;
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(status)?;
    if readonly {
        mount(
            None::<&str>,
            dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(status)?;
    }
    Ok(())
}

fn unmount(p: &Path) -> Result<(), tonic::Status> {
    while mountinfo::is_mount_point(p) {
        nix::mount::umount2(p, nix::mount::MntFlags::empty()).map_err(status)?;
    }
    Ok(())
}

#[tonic::async_trait]
impl csi::node_server::Node for TestNodeService {
    async fn node_stage_volume(
        &self,
        r: tonic::Request<csi::NodeStageVolumeRequest>,
    ) -> Result<tonic::Response<csi::NodeStageVolumeResponse>, tonic::Status> {
        let r = r.into_inner();
        self.calls
            .push("NodeStageVolume", &r.volume_id, &r.staging_target_path);
        self.stages.lock().unwrap().push(r.clone());
        let disk = self.disks.join(&r.volume_id);
        std::fs::create_dir_all(&disk).map_err(status)?;
        let staging = self.layout.host_path(Path::new(&r.staging_target_path));
        bind(&disk, &staging, false)?;
        Ok(tonic::Response::new(csi::NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        r: tonic::Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<tonic::Response<csi::NodeUnstageVolumeResponse>, tonic::Status> {
        let r = r.into_inner();
        self.calls
            .push("NodeUnstageVolume", &r.volume_id, &r.staging_target_path);
        unmount(&self.layout.host_path(Path::new(&r.staging_target_path)))?;
        Ok(tonic::Response::new(csi::NodeUnstageVolumeResponse {}))
    }
    async fn node_publish_volume(
        &self,
        r: tonic::Request<csi::NodePublishVolumeRequest>,
    ) -> Result<tonic::Response<csi::NodePublishVolumeResponse>, tonic::Status> {
        let r = r.into_inner();
        self.calls
            .push("NodePublishVolume", &r.volume_id, &r.target_path);
        self.publishes.lock().unwrap().push(r.clone());
        let staging = self.layout.host_path(Path::new(&r.staging_target_path));
        if !mountinfo::is_mount_point(&staging) {
            return Err(tonic::Status::failed_precondition("volume not staged"));
        }
        let target = self.layout.host_path(Path::new(&r.target_path));
        bind(&staging, &target, r.readonly)?;
        Ok(tonic::Response::new(csi::NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        r: tonic::Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<tonic::Response<csi::NodeUnpublishVolumeResponse>, tonic::Status> {
        let r = r.into_inner();
        self.calls
            .push("NodeUnpublishVolume", &r.volume_id, &r.target_path);
        let target = self.layout.host_path(Path::new(&r.target_path));
        unmount(&target)?;
        let _ = std::fs::remove_dir(&target);
        Ok(tonic::Response::new(csi::NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        r: tonic::Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<tonic::Response<csi::NodeGetVolumeStatsResponse>, tonic::Status> {
        let r = r.into_inner();
        self.calls
            .push("NodeGetVolumeStats", &r.volume_id, &r.volume_path);
        let path = self.layout.host_path(Path::new(&r.volume_path));
        let s = nix::sys::statvfs::statvfs(&path).map_err(status)?;
        let frsize = s.fragment_size() as i64;
        let (total, free) = (
            s.blocks() as i64 * frsize,
            s.blocks_available() as i64 * frsize,
        );
        let (files, ffree) = (s.files() as i64, s.files_free() as i64);
        use csi::volume_usage::Unit;
        Ok(tonic::Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    available: free,
                    total,
                    used: total - free,
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: ffree,
                    total: files,
                    used: files - ffree,
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        }))
    }
    async fn node_expand_volume(
        &self,
        _r: tonic::Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<tonic::Response<csi::NodeExpandVolumeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no expansion"))
    }
    async fn node_get_capabilities(
        &self,
        _r: tonic::Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<tonic::Response<csi::NodeGetCapabilitiesResponse>, tonic::Status> {
        use csi::node_service_capability::{rpc::Type, Rpc, Type as Cap};
        let cap = |t: Type| csi::NodeServiceCapability {
            r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(tonic::Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![cap(Type::StageUnstageVolume), cap(Type::GetVolumeStats)],
        }))
    }
    async fn node_get_info(
        &self,
        _r: tonic::Request<csi::NodeGetInfoRequest>,
    ) -> Result<tonic::Response<csi::NodeGetInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(csi::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 10,
            accessible_topology: Some(csi::Topology {
                segments: [(TOPOLOGY_KEY.to_string(), self.node_id.clone())].into(),
            }),
        }))
    }
}

/// The plugin side of registration: names the driver's endpoint in the kubelet's form and
/// keeps what the agent told it.
struct TestRegistration {
    endpoint: String,
    statuses: Arc<Mutex<Vec<reg::RegistrationStatus>>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for TestRegistration {
    async fn get_info(
        &self,
        _r: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }
    async fn notify_registration_status(
        &self,
        r: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        self.statuses.lock().unwrap().push(r.into_inner());
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The in-test driver, serving until dropped.
struct TestDriver {
    calls: Arc<Calls>,
    stages: Arc<Mutex<Vec<csi::NodeStageVolumeRequest>>>,
    publishes: Arc<Mutex<Vec<csi::NodePublishVolumeRequest>>>,
    statuses: Arc<Mutex<Vec<reg::RegistrationStatus>>>,
    disks: PathBuf,
    csi_socket: PathBuf,
    _stop: tokio_util::sync::DropGuard,
}

fn serve_unix(path: &Path, routes: tonic::service::Routes, stop: CancellationToken) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
            .unwrap();
    });
}

impl TestDriver {
    /// Serves the CSI Node service on `<root>/plugins/<driver>/csi.sock`, then the
    /// registration socket in `<root>/plugins_registry/` (the order a node plugin uses).
    fn start(layout: &Layout, node_id: &str, disks: PathBuf) -> TestDriver {
        let stop = CancellationToken::new();
        let calls = Arc::new(Calls::default());
        let stages = Arc::new(Mutex::new(Vec::new()));
        let publishes = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let csi_socket = layout.plugins_dir().join(DRIVER).join("csi.sock");
        serve_unix(
            &csi_socket,
            tonic::service::Routes::new(csi::node_server::NodeServer::new(TestNodeService {
                layout: layout.clone(),
                disks: disks.clone(),
                node_id: node_id.into(),
                calls: calls.clone(),
                stages: stages.clone(),
                publishes: publishes.clone(),
            })),
            stop.clone(),
        );
        serve_unix(
            &layout
                .plugins_registry_dir()
                .join(format!("{DRIVER}-reg.sock")),
            tonic::service::Routes::new(reg::registration_server::RegistrationServer::new(
                TestRegistration {
                    endpoint: format!("/var/lib/kubelet/plugins/{DRIVER}/csi.sock"),
                    statuses: statuses.clone(),
                },
            )),
            stop.clone(),
        );
        TestDriver {
            calls,
            stages,
            publishes,
            statuses,
            disks,
            csi_socket,
            _stop: stop.drop_guard(),
        }
    }
}

// ---------------------------------------------------------------- through the API

/// The driver's CSIDriver object, as deploy/csi.yaml installs it for skiff's driver
/// (`attach_required` false) or as a driver whose volumes must be attached has it.
async fn create_csidriver(c: &Cluster, attach_required: bool) {
    let d: CSIDriver = serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": attach_required, "podInfoOnMount": false,
                 "volumeLifecycleModes": ["Persistent"]}
    }))
    .unwrap();
    Api::<CSIDriver>::all(c.client.clone())
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
}

async fn volumes_in_use(c: &Cluster) -> Vec<String> {
    Api::<Node>::all(c.client.clone())
        .get(&c.node_name())
        .await
        .ok()
        .and_then(|n| n.status)
        .and_then(|s| s.volumes_in_use)
        .unwrap_or_default()
}

async fn failed_mount_messages(c: &Cluster, pod: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(pod))
                .filter(|e| e.reason.as_deref() == Some("FailedMount"))
                .filter_map(|e| e.message)
                .collect()
        })
        .unwrap_or_default()
}

async fn exec(c: &Cluster, pod: &str, cmd: &str) -> (i32, String) {
    let p = c.pods().get(pod).await.unwrap();
    let id = p
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|s| s.name == "app")
        .and_then(|s| s.container_id)
        .expect("a container id");
    let out = c
        .agent()
        .cri()
        .exec_sync(
            id.trim_start_matches("containerd://"),
            vec!["sh".into(), "-c".into(), cmd.into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_driver_stages_publishes_and_tears_down_a_claim_of_a_pod() {
    let mut c = Cluster::start_with("csi", |config| {
        config.volume_stats_interval = Duration::from_millis(500);
    })
    .await;
    c.assign_pod_cidr().await;
    create_csidriver(&c, false).await;
    let layout = Layout::new(&c.config.data_dir);
    let node = c.node_name();

    // The root dir is a shared mount (drivers' mounts propagate to the pods).
    let root = layout.root().canonicalize().unwrap();
    let table = mountinfo::read();
    let m = table.iter().rev().find(|m| m.mount_point == root);
    assert!(m.is_some_and(|m| m.is_shared()), "{m:?}");

    // A pod whose claim does not exist waits with FailedMount (as for a ConfigMap).
    c.create_pod(
        "early",
        json!({"containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
               "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
               "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "nothere"}}]}),
    )
    .await;
    let msgs = wait_until_async("FailedMount for a missing claim", T, || {
        let c = &c;
        async move {
            let m = failed_mount_messages(c, "early").await;
            m.iter()
                .find(|m| m.contains("persistentvolumeclaim \"nothere\" not found"))
                .cloned()
                .ok_or(m)
        }
    })
    .await;
    assert!(
        msgs.starts_with("MountVolume.SetUp failed for volume \"d\""),
        "{msgs}"
    );

    // The driver registers through its socket: CSINode with the driver, the Node labelled.
    let driver = TestDriver::start(&layout, &node, c.scratch().join("disks"));
    let csinodes: Api<CSINode> = Api::all(c.client.clone());
    let entry = wait_until_async("CSINode with the driver", T, || {
        let csinodes = csinodes.clone();
        let node = node.clone();
        async move {
            let n = csinodes.get(&node).await.map_err(|e| e.to_string())?;
            n.spec
                .drivers
                .iter()
                .find(|d| d.name == DRIVER)
                .cloned()
                .ok_or(format!("{:?}", n.spec.drivers))
        }
    })
    .await;
    assert_eq!(entry.node_id, node);
    assert_eq!(entry.topology_keys, Some(vec![TOPOLOGY_KEY.to_string()]));
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(10));
    let nodes: Api<Node> = Api::all(c.client.clone());
    let csinode = csinodes.get(&node).await.unwrap();
    let owner = &csinode.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    let n = nodes.get(&node).await.unwrap();
    assert_eq!(
        n.metadata.labels.unwrap().get(TOPOLOGY_KEY),
        Some(&node),
        "the topology segment as a Node label"
    );
    assert_eq!(owner.uid, n.metadata.uid.unwrap());
    wait_until_async("registration status told to the plugin", T, || {
        let s = driver.statuses.clone();
        async move {
            let s = s.lock().unwrap();
            match s.last() {
                Some(st) if st.plugin_registered => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // A PV of the driver and a claim bound to it (the binder's work, done by hand).
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let pv_name = format!("pv-{node}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "mountOptions": ["noatime"],
                 "claimRef": {"namespace": "default", "name": "data"},
                 "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "fsType": "ext4",
                         "volumeAttributes": {"size": "1Gi"}}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();

    // Not Bound yet: the pod waits with the kubelet's message.
    c.create_pod(
        "user",
        json!({"containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
               "volumeMounts": [
                   {"name": "d", "mountPath": "/data"},
                   {"name": "d", "mountPath": "/sub", "subPath": "sub/dir"},
                   {"name": "d", "mountPath": "/ro", "readOnly": true},
                   {"name": "reg", "mountPath": "/reg", "readOnly": true}]}],
               "terminationGracePeriodSeconds": 1,
               "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                           {"name": "reg", "hostPath": {"path": "/var/lib/kubelet/plugins_registry",
                                                        "type": "Directory"}}]}),
    )
    .await;
    wait_until_async("FailedMount for an unbound claim", T, || {
        let c = &c;
        async move {
            let m = failed_mount_messages(c, "user").await;
            m.iter()
                .any(|m| m.contains("persistentvolumeclaim \"data\" is not bound"))
                .then_some(())
                .ok_or(m)
        }
    })
    .await;
    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                   "capacity": {"storage": "1Gi"}}});
    claims
        .patch_status("data", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let pod = c
        .wait_pod("user", "the claim's pod Running", running_ready)
        .await;
    let uid = pod.metadata.uid.clone().unwrap();

    // Staged once at the kubelet's staging path, published at the pod's target path.
    let sha = layout.csi_staging_dir(DRIVER, "vol-1");
    let staging = format!(
        "/var/lib/kubelet/plugins/kubernetes.io/csi/{DRIVER}/{}/globalmount",
        sha.file_name().unwrap().to_string_lossy()
    );
    let target = format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount");
    assert_eq!(
        driver.calls.of("NodeStageVolume"),
        vec![("vol-1".to_string(), staging.clone())]
    );
    assert_eq!(
        driver.calls.of("NodePublishVolume"),
        vec![("vol-1".to_string(), target.clone())]
    );
    {
        let stage = driver.stages.lock().unwrap()[0].clone();
        let cap = stage.volume_capability.unwrap();
        assert_eq!(
            cap.access_mode.unwrap().mode,
            csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32
        );
        match cap.access_type {
            Some(csi::volume_capability::AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "ext4");
                assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            stage.volume_context.get("size").map(String::as_str),
            Some("1Gi")
        );
        let publish = driver.publishes.lock().unwrap()[0].clone();
        assert_eq!(publish.staging_target_path, staging);
        assert!(!publish.readonly);
    }
    let target_host = layout.host_path(Path::new(&target));
    assert!(mountinfo::is_mount_point(&target_host));

    // The container writes through the published volume into the driver's disk; subPath is
    // a directory of the volume; the readOnly mount refuses writes.
    let (code, out) = exec(
        &c,
        "user",
        "echo hello > /data/f && echo sub > /sub/g && cat /data/f",
    )
    .await;
    assert_eq!((code, out.trim()), (0, "hello"));
    let disk = driver.disks.join("vol-1");
    assert_eq!(std::fs::read_to_string(disk.join("f")).unwrap(), "hello\n");
    assert_eq!(
        std::fs::read_to_string(disk.join("sub/dir/g")).unwrap(),
        "sub\n"
    );
    // A hostPath under /var/lib/kubelet is this agent's root dir: the driver's socket is there.
    let (code, out) = exec(&c, "user", "ls /reg").await;
    assert_eq!(
        (code, out.trim()),
        (0, format!("{DRIVER}-reg.sock").as_str())
    );
    let (code, out) = exec(&c, "user", "echo no > /ro/h").await;
    assert_ne!(code, 0, "a readOnly mount of the volume is writable: {out}");
    assert!(!disk.join("h").exists());

    // Volume stats reach the kubelet's metrics, labelled by namespace and claim.
    let line = wait_until_async("volume stats in /metrics", T, || {
        let c = &c;
        async move {
            let body = c.kubelet_get("/metrics").await;
            body.lines()
                .find(|l| {
                    l.starts_with("kubelet_volume_stats_capacity_bytes{")
                        && l.contains("namespace=\"default\"")
                        && l.contains("persistentvolumeclaim=\"data\"")
                })
                .map(str::to_string)
                .ok_or_else(|| {
                    body.lines()
                        .filter(|l| l.contains("volume"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
        }
    })
    .await;
    let capacity: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(capacity > 0, "{line}");
    let body = c.kubelet_get("/metrics").await;
    for m in [
        "kubelet_volume_stats_available_bytes{",
        "kubelet_volume_stats_used_bytes{",
        "kubelet_volume_stats_inodes{",
        "kubelet_volume_stats_inodes_free{",
        "kubelet_volume_stats_inodes_used{",
    ] {
        assert!(body.lines().any(|l| l.starts_with(m)), "{m} missing");
    }

    // The agent restarts: the running pod keeps its volume, nothing is unpublished, and the
    // container still sees its data.
    c.restart_agent().await;
    wait_until_async("the driver registered again", T, || {
        let s = driver.statuses.clone();
        async move {
            let n = s
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.plugin_registered)
                .count();
            if n >= 2 {
                Ok(())
            } else {
                Err(n)
            }
        }
    })
    .await;
    let (code, out) = exec(&c, "user", "cat /data/f").await;
    assert_eq!((code, out.trim()), (0, "hello"));
    assert!(mountinfo::is_mount_point(&target_host));
    assert!(driver.calls.of("NodeUnpublishVolume").is_empty());
    assert!(driver.calls.of("NodeUnstageVolume").is_empty());
    assert_eq!(driver.calls.of("NodePublishVolume").len(), 1);

    // Deleted: unpublished, then (no other pod uses it) unstaged; nothing left mounted.
    c.pods()
        .delete("user", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async("unpublished and unstaged", T, || {
        let calls = driver.calls.clone();
        async move {
            let (u, s) = (
                calls.of("NodeUnpublishVolume"),
                calls.of("NodeUnstageVolume"),
            );
            if !u.is_empty() && !s.is_empty() {
                Ok((u, s))
            } else {
                Err((u, s))
            }
        }
    })
    .await;
    assert_eq!(
        driver.calls.of("NodeUnpublishVolume"),
        vec![("vol-1".to_string(), target.clone())]
    );
    assert_eq!(
        driver.calls.of("NodeUnstageVolume"),
        vec![("vol-1".to_string(), staging.clone())]
    );
    assert!(!mountinfo::is_mount_point(&target_host));
    assert!(!mountinfo::is_mount_point(
        &layout.host_path(Path::new(&staging))
    ));
    // The data stays on the driver's disk; the claim's volume metrics go with the volume.
    assert_eq!(std::fs::read_to_string(disk.join("f")).unwrap(), "hello\n");
    let body = c.kubelet_get("/metrics").await;
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("kubelet_volume_stats_") && l.contains("\"data\"")),
        "volume metrics of an unpublished claim"
    );

    // A pod that completes (restartPolicy Never) gives its volume back before it is deleted.
    c.create_pod(
        "job",
        json!({"restartPolicy": "Never",
               "containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                               "command": ["sh", "-c", "echo done > /data/j"],
                               "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
               "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}),
    )
    .await;
    c.wait_pod("job", "job Succeeded", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })
    .await;
    wait_until_async(
        "the completed pod's volume unpublished and unstaged",
        T,
        || {
            let calls = driver.calls.clone();
            async move {
                let n = (
                    calls.of("NodeUnpublishVolume").len(),
                    calls.of("NodeUnstageVolume").len(),
                );
                if n == (2, 2) {
                    Ok(())
                } else {
                    Err(n)
                }
            }
        },
    )
    .await;
    assert_eq!(std::fs::read_to_string(disk.join("j")).unwrap(), "done\n");
    assert!(
        c.pods().get_opt("job").await.unwrap().is_some(),
        "the pod stays"
    );

    // The driver goes: its CSINode entry goes, the label stays.
    drop(driver);
    let _ = std::fs::remove_file(
        layout
            .plugins_registry_dir()
            .join(format!("{DRIVER}-reg.sock")),
    );
    wait_until_async("CSINode without the driver", T, || {
        let csinodes = csinodes.clone();
        let node = node.clone();
        async move {
            let n = csinodes.get(&node).await.map_err(|e| e.to_string())?;
            if n.spec.drivers.iter().all(|d| d.name != DRIVER) {
                Ok(())
            } else {
                Err(format!("{:?}", n.spec.drivers))
            }
        }
    })
    .await;
    let n = nodes.get(&node).await.unwrap();
    assert!(n.metadata.labels.unwrap().contains_key(TOPOLOGY_KEY));
}

// ---------------------------------------------------------------- restart: orphans

fn test_pv(name: &str, handle: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4"}}
    }))
    .unwrap()
}

/// The driver as the registry holds it, connected over its real socket.
fn registered(drivers: &Drivers, layout: &Layout, socket: &Path) {
    let _ = layout;
    drivers.insert(Driver {
        name: DRIVER.into(),
        endpoint: socket.to_path_buf(),
        node_id: "n".into(),
        stage_unstage: true,
        volume_stats: true,
        expand_volume: false,
        node: csi::node_client::NodeClient::new(node::cri::unix_channel(socket)),
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_restart_published_volumes_are_taken_over_and_orphans_cleaned_up() {
    let dir = tempfile::Builder::new()
        .prefix("skc")
        .tempdir_in("/tmp")
        .unwrap();
    let layout = Layout::new(dir.path().join("node"));
    std::fs::create_dir_all(layout.root()).unwrap();
    let driver = TestDriver::start(&layout, "n", dir.path().join("disks"));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let metrics = Arc::new(Metrics::default());

    // The first agent publishes two pods' volumes; both pods share vol-a, one has vol-b.
    let first = {
        let drivers = Drivers::default();
        registered(&drivers, &layout, &driver.csi_socket);
        CsiVolumes::new(layout.clone(), drivers, metrics.clone(), stop.clone())
    };
    let (pv_a, pv_b) = (test_pv("pv-a", "vol-a"), test_pv("pv-b", "vol-b"));
    for (uid, pv) in [("live", &pv_a), ("gone", &pv_a), ("gone", &pv_b)] {
        first
            .publish(ClaimVolume {
                pod_uid: uid,
                pod_name: uid,
                pvc: None,
                namespace: "default",
                claim: "c",
                pv,
                readonly: false,
            })
            .await
            .unwrap();
    }
    assert_eq!(
        driver.calls.of("NodeStageVolume").len(),
        2,
        "staged once per volume"
    );
    assert_eq!(driver.calls.of("NodePublishVolume").len(), 3);
    drop(first);

    // The agent restarts: the table comes back from disk and the mount table, before any
    // driver registered again, and a live pod's volume is not published again.
    let drivers = Drivers::default();
    let second = Arc::new(CsiVolumes::new(
        layout.clone(),
        drivers.clone(),
        metrics,
        stop.clone(),
    ));
    second.rebuild();
    assert_eq!(
        second.published(),
        vec![
            ("gone".to_string(), "pv-a".to_string()),
            ("gone".to_string(), "pv-b".to_string()),
            ("live".to_string(), "pv-a".to_string())
        ]
    );
    assert_eq!(
        second.staged(),
        vec!["vol-a".to_string(), "vol-b".to_string()]
    );
    let path = second
        .publish(ClaimVolume {
            pod_uid: "live",
            pod_name: "live",
            pvc: None,
            namespace: "default",
            claim: "c",
            pv: &pv_a,
            readonly: false,
        })
        .await
        .expect("a published volume is taken over without its driver");
    assert_eq!(path, layout.csi_publish_dir("live", "pv-a").join("mount"));
    assert_eq!(driver.calls.of("NodePublishVolume").len(), 3);

    // Orphans wait for their driver, then go: pv-b unstaged, vol-a kept for the live pod.
    second.orphans(&HashSet::from(["live".to_string()]));
    registered(&drivers, &layout, &driver.csi_socket);
    wait_until_async("the orphaned pod's volumes unpublished", T, || {
        let second = second.clone();
        async move {
            let p = second.published();
            if p == vec![("live".to_string(), "pv-a".to_string())] {
                Ok(())
            } else {
                Err(p)
            }
        }
    })
    .await;
    wait_until_async("vol-b unstaged", T, || {
        let second = second.clone();
        async move {
            let s = second.staged();
            if s == vec!["vol-a".to_string()] {
                Ok(())
            } else {
                Err(s)
            }
        }
    })
    .await;
    assert_eq!(driver.calls.of("NodeUnpublishVolume").len(), 2);
    assert_eq!(
        driver.calls.of("NodeUnstageVolume"),
        vec![(
            "vol-b".to_string(),
            node::csi::kubelet_form(
                &layout,
                &layout.csi_staging_dir(DRIVER, "vol-b").join("globalmount")
            )
        )]
    );
    assert!(!layout.csi_publish_dir("gone", "pv-a").exists());
    assert!(mountinfo::is_mount_point(&path));

    // The last pod goes: unpublished and unstaged.
    second.tear_down_pod("live").await.unwrap();
    assert!(second.published().is_empty() && second.staged().is_empty());
    assert!(!mountinfo::is_mount_point(&path));
    node::pod::volumes::unmount_below(dir.path());
}

// ---------------------------------------------------------------- the real driver

/// skiff's driver (the csi crate's node plugin servers), run as its DaemonSet runs it: a
/// process of its own (this test binary again, running [`real_driver_process`]) in a mount
/// namespace of its own where `/var/lib/kubelet` is the agent's root dir, bound with its
/// propagation (the root dir is shared), so its loop mounts and bind mounts reach the agent
/// and the pods as a Bidirectional hostPath mount makes them. Stopped (stdin closed) on drop.
struct RealDriver {
    child: Option<std::process::Child>,
}

impl RealDriver {
    fn start(root: &Path, node: &str) -> RealDriver {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let c = |p: &[u8]| CString::new(p).unwrap();
        let root = c(root.as_os_str().as_bytes());
        let (var_lib, kubelet, tmpfs) = (c(b"/var/lib"), c(b"/var/lib/kubelet"), c(b"tmpfs"));
        // A tmpfs over /var/lib in the driver's namespace only gives it a kubelet dir without
        // touching the machine's: the mount it lands on must not propagate it (made a slave,
        // itself only: the agent's root dir is a mount of its own, whose propagation counts).
        let table = mountinfo::read();
        let slave = table
            .iter()
            .filter(|m| Path::new("/var/lib").starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count())
            .filter(|m| m.is_shared())
            .map(|m| c(m.mount_point.as_os_str().as_bytes()));
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "real_driver_process", "--ignored", "--nocapture"])
            .env("SKIFF_TEST_CSI_NODE", node)
            .stdin(std::process::Stdio::piped());
        // SAFETY: between fork and exec only raw system calls on strings made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                let null = std::ptr::null::<libc::c_char>();
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return fail();
                }
                if let Some(p) = &slave {
                    if libc::mount(null, p.as_ptr(), null, libc::MS_SLAVE, std::ptr::null()) != 0 {
                        return fail();
                    }
                }
                if libc::mount(
                    tmpfs.as_ptr(),
                    var_lib.as_ptr(),
                    tmpfs.as_ptr(),
                    0,
                    std::ptr::null(),
                ) != 0
                {
                    return fail();
                }
                if libc::mkdir(kubelet.as_ptr(), 0o755) != 0 {
                    return fail();
                }
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(
                    root.as_ptr(),
                    kubelet.as_ptr(),
                    null,
                    flags,
                    std::ptr::null(),
                ) != 0
                {
                    return fail();
                }
                // The root dir stays visible at its own path here (a container sees it at
                // /var/lib/kubelet only): private, it gets none of the driver's mounts, so
                // the driver counts each of its mounts once (it grows a filesystem only
                // while it is mounted once, at the staging path). Its /var/lib/kubelet
                // copy is still a peer of the agent's root dir.
                let private = libc::MS_PRIVATE | libc::MS_REC;
                if libc::mount(null, root.as_ptr(), null, private, std::ptr::null()) != 0 {
                    return fail();
                }
                Ok(())
            });
        }
        RealDriver {
            child: Some(cmd.spawn().expect("the driver process starts")),
        }
    }
}

impl Drop for RealDriver {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        drop(child.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The driver process [`RealDriver`] starts (not a test of its own): skiff's node plugin
/// with the DaemonSet's paths, until its stdin closes.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "the driver process of skiffs_driver_gives_a_pod_an_ext4_volume_whose_data_outlives_the_pod"]
async fn real_driver_process() {
    let node = std::env::var("SKIFF_TEST_CSI_NODE").expect("started by RealDriver");
    let socket = format!("/var/lib/kubelet/plugins/{DRIVER}/csi.sock");
    let cfg = skiff_csi::plugin::PluginConfig {
        node,
        endpoint: socket.clone().into(),
        registration_socket: Some(
            format!("/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock").into(),
        ),
        kubelet_endpoint: socket,
        data_dir: format!("/var/lib/kubelet/plugins/{DRIVER}/volumes").into(),
        capacity: 1 << 30,
    };
    let metrics = Arc::new(skiff_csi::metrics::Metrics::new());
    let plugin = skiff_csi::plugin::start(cfg, metrics).await.unwrap();
    tokio::task::spawn_blocking(|| {
        use std::io::Read;
        let mut b = [0u8; 64];
        while std::io::stdin().read(&mut b).is_ok_and(|n| n > 0) {}
    })
    .await
    .unwrap();
    plugin.shutdown().await;
}

async fn wait_registered(c: &Cluster) {
    let csinodes: Api<CSINode> = Api::all(c.client.clone());
    let node = c.node_name();
    wait_until_async("CSINode with skiff's driver", T, || {
        let (csinodes, node) = (csinodes.clone(), node.clone());
        async move {
            let n = csinodes.get(&node).await.map_err(|e| e.to_string())?;
            n.spec
                .drivers
                .iter()
                .any(|d| d.name == DRIVER && d.node_id == node)
                .then_some(())
                .ok_or(format!("{:?}", n.spec.drivers))
        }
    })
    .await;
}

/// What [`provision_bound_claim`] made: the driver's Controller client, the capability the
/// volume was created with, and the volume.
struct Provisioned {
    controller: csi::controller_client::ControllerClient<tonic::transport::Channel>,
    cap: csi::VolumeCapability,
    volume: csi::Volume,
}

/// The provisioner's and the binder's part for a claim `name` of 64Mi: CreateVolume
/// `pvc-<name>` on the driver's Controller service (pinned to this node), the PV with its
/// claimRef, and the claim bound to it.
async fn provision_bound_claim(
    c: &Cluster,
    layout: &Layout,
    node: &str,
    name: &str,
) -> Provisioned {
    let pv_name = format!("pvc-{name}");
    let socket = layout.plugins_dir().join(DRIVER).join("csi.sock");
    let mut controller =
        csi::controller_client::ControllerClient::new(node::cri::unix_channel(&socket));
    let topology = csi::Topology {
        segments: [(TOPOLOGY_KEY.to_string(), node.to_string())].into(),
    };
    let cap = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    let volume = controller
        .create_volume(csi::CreateVolumeRequest {
            name: pv_name.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 64 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap.clone()],
            parameters: Default::default(),
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology.clone()],
                preferred: vec![topology],
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "claimRef": {"namespace": "default", "name": name},
                 "csi": {"driver": DRIVER, "volumeHandle": volume.volume_id, "fsType": "ext4",
                         "volumeAttributes": volume.volume_context}}
    }))
    .unwrap();
    Api::<PersistentVolume>::all(c.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": pv_name, "resources": {"requests": {"storage": "64Mi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                   "capacity": {"storage": "64Mi"}}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    Provisioned {
        controller,
        cap,
        volume,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn skiffs_driver_gives_a_pod_an_ext4_volume_whose_data_outlives_the_pod() {
    let c = Cluster::start("csireal").await;
    c.assign_pod_cidr().await;
    create_csidriver(&c, false).await;
    let layout = Layout::new(&c.config.data_dir);
    let node = c.node_name();
    let root = layout.root().canonicalize().unwrap();
    let driver = RealDriver::start(&root, &node);
    wait_registered(&c).await;

    // The provisioner's part: CreateVolume on the driver's Controller service, then the PV
    // and its claim bound to it.
    let Provisioned {
        controller, volume, ..
    } = provision_bound_claim(&c, &layout, &node, "real").await;

    let spec = json!({"containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                       "command": ["sleep", "3600"],
                       "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
                      "terminationGracePeriodSeconds": 1,
                      "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "real"}}]});
    c.create_pod("writer", spec.clone()).await;
    let pod = c.wait_pod("writer", "writer Running", running_ready).await;
    let uid = pod.metadata.uid.unwrap();
    // The container's /data is the driver's ext4 on its loop device.
    let (code, out) = exec(
        &c,
        "writer",
        "grep ' /data ' /proc/mounts && echo kept > /data/f",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" ext4 "), "{out}");
    let staging = layout
        .csi_staging_dir(DRIVER, &volume.volume_id)
        .join("globalmount");
    let target = layout.csi_publish_dir(&uid, "pvc-real").join("mount");
    assert!(mountinfo::is_mount_point(&staging), "staged on the host");
    assert!(mountinfo::is_mount_point(&target), "published on the host");

    // The pod goes: unpublished and unstaged through the driver.
    c.pods()
        .delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async("the volume unstaged", T, || {
        let (staging, target) = (staging.clone(), target.clone());
        async move {
            let s = (
                mountinfo::is_mount_point(&staging),
                mountinfo::is_mount_point(&target),
            );
            if s == (false, false) {
                Ok(())
            } else {
                Err(s)
            }
        }
    })
    .await;
    wait_until_async("writer gone", T, || {
        let pods = c.pods();
        async move {
            match pods.get_opt("writer").await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // A new pod of the same claim reads the file back.
    c.create_pod("reader", spec).await;
    c.wait_pod("reader", "reader Running", running_ready).await;
    let (code, out) = exec(&c, "reader", "cat /data/f").await;
    assert_eq!((code, out.trim()), (0, "kept"));
    c.pods()
        .delete("reader", &DeleteParams::default())
        .await
        .unwrap();
    // Unstaged by the agent (the staging directory goes once NodeUnstageVolume succeeded),
    // then the volume can be deleted once the kernel has let go of its loop device (autoclear
    // is asynchronous: the driver refuses while it is attached, a provisioner retries).
    let staging_dir = staging.parent().unwrap().to_path_buf();
    wait_until_async("unstaged again", T, || {
        let (staging, dir) = (staging.clone(), staging_dir.clone());
        async move {
            (!mountinfo::is_mount_point(&staging) && !dir.exists())
                .then_some(())
                .ok_or(())
        }
    })
    .await;
    wait_until_async("the volume deleted", T, || {
        let mut controller = controller.clone();
        let id = volume.volume_id.clone();
        async move {
            controller
                .delete_volume(csi::DeleteVolumeRequest { volume_id: id })
                .await
                .map(|_| ())
                .map_err(|s| s.message().to_string())
        }
    })
    .await;
    drop(driver);
}

/// The claim's condition types now.
async fn claim_conditions(claims: &Api<PersistentVolumeClaim>, name: &str) -> Vec<String> {
    let claim = claims.get(name).await.unwrap();
    claim
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect()
}

/// kubelet_volume_stats_used_bytes of claim default/grow (0 before the first pass).
async fn used_bytes(c: &Cluster) -> u64 {
    let body = c.kubelet_get("/metrics").await;
    body.lines()
        .find(|l| {
            l.starts_with("kubelet_volume_stats_used_bytes{")
                && l.contains("persistentvolumeclaim=\"grow\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The (type, message) of the Events about `pod` with `reason`.
async fn events_of(c: &Cluster, pod: &str, reason: &str) -> Vec<(String, String)> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(pod))
                .filter(|e| e.reason.as_deref() == Some(reason))
                .map(|e| (e.type_.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// Volume expansion with skiff's driver, which grows filesystems offline only: a 64Mi
/// volume of a running pod grown to 128Mi (the test plays the resizer) is refused online
/// (one FileSystemResizeFailed Warning, the condition stays); the next pod of the claim gets
/// it grown (NodeExpandVolume after staging), the claim's status says 128Mi without the
/// condition, and the pod has FileSystemResizeSuccessful.
#[tokio::test(flavor = "multi_thread")]
async fn a_grown_claim_gets_its_filesystem_grown_when_its_next_pod_starts() {
    let c = Cluster::start_with("csigrow", |config| {
        config.volume_stats_interval = Duration::from_millis(300);
    })
    .await;
    c.assign_pod_cidr().await;
    create_csidriver(&c, false).await;
    let layout = Layout::new(&c.config.data_dir);
    let node = c.node_name();
    let root = layout.root().canonicalize().unwrap();
    let driver = RealDriver::start(&root, &node);
    wait_registered(&c).await;

    let Provisioned {
        mut controller,
        cap,
        volume,
    } = provision_bound_claim(&c, &layout, &node, "grow").await;
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");

    let spec = json!({"containers": [{"name": "app", "image": BUSYBOX_IMAGE,
                       "command": ["sleep", "3600"],
                       "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
                      "terminationGracePeriodSeconds": 1,
                      "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "grow"}}]});
    c.create_pod("small", spec.clone()).await;
    c.wait_pod("small", "small Running", running_ready).await;
    let (code, out) = exec(&c, "small", "echo kept > /data/f && df -k /data").await;
    assert_eq!(code, 0, "{out}");

    // The resizer's part: the volume grown by the Controller service, the PV's capacity,
    // the claim waiting for the node.
    let grown = controller
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: volume.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 128 << 20,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(grown.capacity_bytes >= 128 << 20, "{grown:?}");
    assert!(grown.node_expansion_required, "{grown:?}");
    pvs.patch(
        "pvc-grow",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"capacity": {"storage": "128Mi"}}})),
    )
    .await
    .unwrap();
    let pending = json!({"status": {"conditions": [{
        "type": "FileSystemResizePending", "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]}});
    claims
        .patch_status("grow", &PatchParams::default(), &Patch::Merge(&pending))
        .await
        .unwrap();

    // Online, the driver refuses (the volume is published): one Warning, the claim as it is.
    let warnings = wait_until_async("FileSystemResizeFailed on the running pod", T, || {
        let c = &c;
        async move {
            let w = events_of(c, "small", "FileSystemResizeFailed").await;
            (!w.is_empty()).then_some(w).ok_or(())
        }
    })
    .await;
    assert_eq!(warnings[0].0, "Warning");
    assert!(warnings[0].1.contains("FailedPrecondition"), "{warnings:?}");
    // Two more passes of the volume timer (each sees a file written after the last: the
    // pass that saw the first has tried the expansion again before the next one starts):
    // still one Warning, still pending.
    for (i, mib) in [(1, 2), (2, 4)] {
        let before = used_bytes(&c).await;
        let (code, out) = exec(
            &c,
            "small",
            &format!("dd if=/dev/zero of=/data/fill{i} bs=1M count={mib} && sync"),
        )
        .await;
        assert_eq!(code, 0, "{out}");
        wait_until_async("the volume pass sees the file", T, || {
            let c = &c;
            async move {
                let now = used_bytes(c).await;
                (now >= before + (mib << 20)).then_some(()).ok_or(now)
            }
        })
        .await;
    }
    assert_eq!(
        events_of(&c, "small", "FileSystemResizeFailed").await.len(),
        1
    );
    assert!(claim_conditions(&claims, "grow")
        .await
        .contains(&"FileSystemResizePending".to_string()));

    // The user starts the pod again: the new pod's setup grows the filesystem.
    c.pods()
        .delete("small", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async("small gone", T, || {
        let pods = c.pods();
        async move {
            match pods.get_opt("small").await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    c.create_pod("big", spec).await;
    let pod = wait_until_async("big Running", T, || {
        let c = &c;
        async move {
            let pod = c.pods().get("big").await.map_err(|e| e.to_string())?;
            if running_ready(&pod) {
                return Ok(pod);
            }
            let failed = events_of(c, "big", "FileSystemResizeFailed").await;
            Err(format!(
                "{:?} {failed:?}",
                failed_mount_messages(c, "big").await
            ))
        }
    })
    .await;
    let uid = pod.metadata.uid.unwrap();
    let target = layout.csi_publish_dir(&uid, "pvc-grow").join("mount");
    let fs = nix::sys::statvfs::statvfs(&target).unwrap();
    let size = fs.blocks() as u64 * fs.fragment_size() as u64;
    assert!(size >= 128 << 20, "the filesystem has {size} bytes");
    let (code, out) = exec(&c, "big", "cat /data/f && df -k /data").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("kept"), "{out}");

    let claim = claims.get("grow").await.unwrap();
    let status = claim.status.unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "128Mi");
    assert!(
        !status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "FileSystemResizePending"),
        "the condition is gone"
    );
    let ok = events_of(&c, "big", "FileSystemResizeSuccessful").await;
    assert_eq!(
        ok,
        vec![(
            "Normal".to_string(),
            format!("MountVolume.NodeExpandVolume succeeded for volume \"pvc-grow\" {node}")
        )]
    );

    c.pods()
        .delete("big", &DeleteParams::default())
        .await
        .unwrap();
    let staging = layout
        .csi_staging_dir(DRIVER, &volume.volume_id)
        .join("globalmount");
    let staging_dir = staging.parent().unwrap().to_path_buf();
    wait_until_async("unstaged", T, || {
        let (staging, dir) = (staging.clone(), staging_dir.clone());
        async move {
            (!mountinfo::is_mount_point(&staging) && !dir.exists())
                .then_some(())
                .ok_or(())
        }
    })
    .await;
    wait_until_async("the volume deleted", T, || {
        let mut controller = controller.clone();
        let id = volume.volume_id.clone();
        async move {
            controller
                .delete_volume(csi::DeleteVolumeRequest { volume_id: id })
                .await
                .map(|_| ())
                .map_err(|s| s.message().to_string())
        }
    })
    .await;
    drop(driver);
}

// ---------------------------------------------------------------- attach required

/// A driver whose CSIDriver says attachRequired: the pod waits (FailedMount with the
/// kubelet's AttachVolume message, nothing staged) until the volume's VolumeAttachment
/// (`csi-<sha256(handle + driver + node)>`) says attached; its attachmentMetadata is the
/// publish_context of stage and publish; Node.status.volumesInUse lists the volume while the
/// pod runs and not once it is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_that_must_be_attached_waits_for_its_volume_attachment() {
    use sha2::{Digest, Sha256};
    let c = Cluster::start_with("csiattach", |config| {
        config.volume_stats_interval = Duration::from_millis(500);
    })
    .await;
    c.assign_pod_cidr().await;
    create_csidriver(&c, true).await;
    let layout = Layout::new(&c.config.data_dir);
    let node = c.node_name();
    let driver = TestDriver::start(&layout, &node, c.scratch().join("disks"));
    let csinodes: Api<CSINode> = Api::all(c.client.clone());
    wait_until_async("CSINode with the driver", T, || {
        let csinodes = csinodes.clone();
        let node = node.clone();
        async move {
            let n = csinodes.get(&node).await.map_err(|e| e.to_string())?;
            n.spec
                .drivers
                .iter()
                .any(|d| d.name == DRIVER)
                .then_some(())
                .ok_or(format!("{:?}", n.spec.drivers))
        }
    })
    .await;

    let pv_name = "pv-attach";
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "claimRef": {"namespace": "default", "name": "att"},
                 "csi": {"driver": DRIVER, "volumeHandle": "vol-att", "fsType": "ext4"}}
    }))
    .unwrap();
    Api::<PersistentVolume>::all(c.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "att"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let bound = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                  "capacity": {"storage": "1Gi"}}});
    claims
        .patch_status("att", &PatchParams::default(), &Patch::Merge(&bound))
        .await
        .unwrap();

    c.create_pod(
        "attpod",
        json!({"containers": [{"name": "app", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
               "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
               "terminationGracePeriodSeconds": 1,
               "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "att"}}]}),
    )
    .await;
    let msg = wait_until_async("FailedMount: not attached", T, || {
        let c = &c;
        async move {
            let m = failed_mount_messages(c, "attpod").await;
            m.iter()
                .find(|m| m.contains("AttachVolume.Attach failed for volume \"pv-attach\""))
                .cloned()
                .ok_or(m)
        }
    })
    .await;
    assert!(
        msg.contains("volume pv-attach is not attached yet"),
        "{msg}"
    );
    assert!(driver.calls.of("NodeStageVolume").is_empty());

    // The attacher's part: the attachment the controller names, then attached.
    let mut h = Sha256::new();
    h.update(b"vol-att");
    h.update(DRIVER.as_bytes());
    h.update(node.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let va_name = format!("csi-{hex}");
    let vas: Api<VolumeAttachment> = Api::all(c.client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": va_name},
        "spec": {"attacher": DRIVER, "nodeName": node,
                 "source": {"persistentVolumeName": pv_name}}
    }))
    .unwrap();
    vas.create(&PostParams::default(), &va).await.unwrap();
    // Created, not yet attached: still waiting.
    wait_until_async("FailedMount: attachment not attached", T, || {
        let c = &c;
        async move {
            let m = failed_mount_messages(c, "attpod").await;
            m.iter()
                .any(|m| m.contains("(volumeattachment csi-"))
                .then_some(())
                .ok_or(m)
        }
    })
    .await;
    assert!(driver.calls.of("NodeStageVolume").is_empty());
    let attached = json!({"status": {"attached": true,
                                     "attachmentMetadata": {"devicePath": "/dev/fake0"}}});
    vas.patch_status(&va_name, &PatchParams::default(), &Patch::Merge(&attached))
        .await
        .unwrap();
    c.wait_pod("attpod", "the attached volume's pod Running", running_ready)
        .await;
    let context = |m: &std::collections::HashMap<String, String>| m.get("devicePath").cloned();
    let stage = driver.stages.lock().unwrap()[0].clone();
    assert_eq!(
        context(&stage.publish_context).as_deref(),
        Some("/dev/fake0")
    );
    let publish = driver.publishes.lock().unwrap()[0].clone();
    assert_eq!(
        context(&publish.publish_context).as_deref(),
        Some("/dev/fake0")
    );

    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-att");
    wait_until_async("volumesInUse lists the volume", T, || {
        let c = &c;
        let unique = unique.clone();
        async move {
            let v = volumes_in_use(c).await;
            (v == vec![unique]).then_some(()).ok_or(v)
        }
    })
    .await;

    c.pods()
        .delete("attpod", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_async("volumesInUse empty after the pod", T, || {
        let c = &c;
        async move {
            let v = volumes_in_use(c).await;
            v.is_empty().then_some(()).ok_or(v)
        }
    })
    .await;
    assert_eq!(driver.calls.of("NodeUnstageVolume").len(), 1);
}
