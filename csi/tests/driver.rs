//! The node plugin's servers in-process on real unix sockets, called through the generated
//! clients, doing real work: sparse files, loop devices, mkfs.ext4, mounts (run as root).

use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use skiff_csi::metrics::Metrics;
use skiff_csi::plugin::{self, Plugin, PluginConfig};
use skiff_csi::proto::csi::v1 as csi;
use skiff_csi::proto::registration as reg;
use skiff_csi::{sys, DRIVER_NAME, TOPOLOGY_KEY};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const NODE: &str = "node-a";

/// Unmounts (lazily) what a failed test left mounted, so its temporary directory goes.
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            while let Ok(Some(_)) = sys::mount_at(p) {
                if nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
    }
}

struct Harness {
    dir: tempfile::TempDir,
    plugin: Option<Plugin>,
    channel: Channel,
}

impl Harness {
    async fn start(capacity: u64) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = dir.path().join("plugins/local.csi.skiff.io/csi.sock");
        let plugin = plugin::start(
            PluginConfig {
                node: NODE.to_string(),
                endpoint: endpoint.clone(),
                registration_socket: Some(
                    dir.path()
                        .join("plugins_registry/local.csi.skiff.io-reg.sock"),
                ),
                kubelet_endpoint: "/var/lib/kubelet/plugins/local.csi.skiff.io/csi.sock"
                    .to_string(),
                data_dir: dir.path().join("plugins/local.csi.skiff.io/volumes"),
                capacity,
            },
            Arc::new(Metrics::new()),
        )
        .await
        .unwrap();
        let channel = plugin::unix_channel(&endpoint);
        Harness {
            dir,
            plugin: Some(plugin),
            channel,
        }
    }

    fn controller(&self) -> csi::controller_client::ControllerClient<Channel> {
        csi::controller_client::ControllerClient::new(self.channel.clone())
    }

    fn node(&self) -> csi::node_client::NodeClient<Channel> {
        csi::node_client::NodeClient::new(self.channel.clone())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn image(&self, id: &str) -> PathBuf {
        self.path(&format!("plugins/local.csi.skiff.io/volumes/{id}.img"))
    }

    /// Stops the servers; returns the directory (removed when dropped).
    async fn stop(mut self) -> tempfile::TempDir {
        if let Some(p) = self.plugin.take() {
            p.shutdown().await;
        }
        self.dir
    }
}

fn capability(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".to_string(),
            mount_flags: vec![],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn here() -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_string(), NODE.to_string())]),
    }
}

fn create_request(name: &str, bytes: u64, mode: Mode) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(mode)],
        parameters: HashMap::new(),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![here()],
            preferred: vec![here()],
        }),
    }
}

fn stage_request(id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
        volume_context: HashMap::new(),
    }
}

fn publish_request(
    id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.to_string(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
        readonly,
        volume_context: HashMap::new(),
    }
}

fn unpublish_request(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.display().to_string(),
    }
}

fn unstage_request(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
    }
}

fn delete_request(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest {
        volume_id: id.to_string(),
    }
}

async fn stats(h: &Harness, id: &str, path: &Path) -> (csi::VolumeUsage, csi::VolumeUsage) {
    let r = h
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.to_string(),
            volume_path: path.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    use csi::volume_usage::Unit;
    let bytes = r
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .cloned();
    let inodes = r
        .usage
        .iter()
        .find(|u| u.unit == Unit::Inodes as i32)
        .cloned();
    (bytes.expect("bytes usage"), inodes.expect("inodes usage"))
}

/// Writes 1 MiB chunks into `file` until one fails; returns the failing chunk's number
/// (1-based) and its error.
fn fill(file: &Path, limit: u64) -> (u64, Option<std::io::Error>) {
    let mut f = std::fs::File::create(file).unwrap();
    let chunk = vec![0xa5u8; MIB as usize];
    for n in 1..=limit {
        if let Err(e) = f.write_all(&chunk) {
            return (n, Some(e));
        }
    }
    (limit, None)
}

/// Waits until no loop device is backed by `image`.
async fn wait_loop_freed(image: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = sys::find_loop_for(image).unwrap();
        if found.is_none() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} still backs {:?} after unstage",
            image.display(),
            found
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_one_gib_volume_holds_1024_mib_and_refuses_the_1025th() {
    let h = Harness::start(20 * GIB).await;
    let mut guard = Mounts(vec![]);
    let id = "pvc-lifecycle";
    let v = h
        .controller()
        .create_volume(create_request(id, GIB, Mode::SingleNodeWriter))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.volume_id, id);
    assert_eq!(v.capacity_bytes, GIB as i64);
    assert_eq!(v.accessible_topology, vec![here()]);
    // idempotent by name
    let again = h
        .controller()
        .create_volume(create_request(id, GIB, Mode::SingleNodeWriter))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, v);
    let image = h.image(id);
    assert!(image.is_file());

    let staging = h.path("plugins/kubernetes.io/csi/local.csi.skiff.io/abc/globalmount");
    let target = h.path("pods/uid-1/volumes/kubernetes.io~csi/pvc-lifecycle/mount");
    let ro_target = h.path("pods/uid-2/volumes/kubernetes.io~csi/pvc-lifecycle/mount");
    guard.0 = vec![staging.clone(), target.clone(), ro_target.clone()];
    h.node()
        .node_stage_volume(stage_request(id, &staging))
        .await
        .unwrap();
    let m = sys::mount_at(&staging).unwrap().expect("staged");
    assert_eq!(m.fs_type, "ext4");
    let dev = sys::loop_of(&m).expect("a loop device");
    assert!(sys::loop_backs(&dev, &image).unwrap());
    h.node()
        .node_stage_volume(stage_request(id, &staging))
        .await
        .expect("staging again is a no-op");
    h.node()
        .node_publish_volume(publish_request(id, &staging, &target, false))
        .await
        .unwrap();
    h.node()
        .node_publish_volume(publish_request(id, &staging, &target, false))
        .await
        .expect("publishing again is a no-op");

    let (bytes, inodes) = stats(&h, id, &target).await;
    assert!(bytes.available >= GIB as i64, "{bytes:?}");
    assert!(bytes.available < (GIB + MIB) as i64, "{bytes:?}");
    assert!(bytes.total > bytes.available, "{bytes:?}");
    assert!(inodes.total > 0 && inodes.available > 0, "{inodes:?}");

    let file = target.join("data");
    let (n, err) = tokio::task::spawn_blocking(move || fill(&file, 2048))
        .await
        .unwrap();
    let err = err.expect("the volume must fill up");
    assert_eq!(
        n, 1025,
        "1,024 MiB fit, the 1,025th MiB must not (failed at {n}: {err})"
    );
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let (bytes, _) = stats(&h, id, &target).await;
    assert!(bytes.used >= GIB as i64, "{bytes:?}");
    assert!(bytes.available < MIB as i64, "{bytes:?}");

    // a read-only publish of the same staged volume
    h.node()
        .node_publish_volume(publish_request(id, &staging, &ro_target, true))
        .await
        .unwrap();
    assert!(ro_target.join("data").is_file());
    let e = std::fs::File::create(ro_target.join("other")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));

    // in use: not deletable
    let e = h
        .controller()
        .delete_volume(delete_request(id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    for t in [&target, &ro_target] {
        for _ in 0..2 {
            h.node()
                .node_unpublish_volume(unpublish_request(id, t))
                .await
                .expect("unpublish, twice");
        }
        assert!(sys::mount_at(t).unwrap().is_none());
        assert!(!t.exists(), "{} removed", t.display());
    }
    for _ in 0..2 {
        h.node()
            .node_unstage_volume(unstage_request(id, &staging))
            .await
            .expect("unstage, twice");
    }
    assert!(sys::mount_at(&staging).unwrap().is_none());
    wait_loop_freed(&image).await;

    // staged again: the data is still there (no second mkfs)
    h.node()
        .node_stage_volume(stage_request(id, &staging))
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(staging.join("data")).unwrap().len(),
        1024 * MIB
    );
    h.node()
        .node_unstage_volume(unstage_request(id, &staging))
        .await
        .unwrap();
    wait_loop_freed(&image).await;

    for _ in 0..2 {
        h.controller()
            .delete_volume(delete_request(id))
            .await
            .expect("delete, twice");
    }
    assert!(!image.exists());
    h.stop().await;
}

#[tokio::test]
async fn capacity_and_bad_input_are_refused_with_the_spec_codes() {
    let h = Harness::start(2 * GIB).await;
    let mut c = h.controller();
    c.create_volume(create_request("pvc-one", GIB, Mode::SingleNodeWriter))
        .await
        .unwrap();
    let cap = c
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
            parameters: HashMap::new(),
            accessible_topology: Some(here()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.available_capacity, GIB as i64);

    let e = c
        .create_volume(create_request("pvc-two", 2 * GIB, Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("requested {} bytes", 2 * GIB))
            && e.message().contains(&format!("available {GIB} bytes")),
        "{}",
        e.message()
    );
    assert!(!h.image("pvc-two").exists());

    let e = c
        .create_volume(create_request("pvc-multi", MIB, Mode::MultiNodeMultiWriter))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("MULTI_NODE_MULTI_WRITER"),
        "{}",
        e.message()
    );

    let mut block = create_request("pvc-block", MIB, Mode::SingleNodeWriter);
    block.volume_capabilities[0].access_type =
        Some(AccessType::Block(csi::volume_capability::BlockVolume {}));
    let e = c.create_volume(block).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let mut elsewhere = create_request("pvc-elsewhere", MIB, Mode::SingleNodeWriter);
    elsewhere.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), "node-b".to_string())]),
        }],
        preferred: vec![],
    });
    let e = c.create_volume(elsewhere).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

    // the same name with a range the existing volume does not fit
    let mut smaller = create_request("pvc-one", 2 * MIB, Mode::SingleNodeWriter);
    smaller.capacity_range.as_mut().unwrap().limit_bytes = (2 * MIB) as i64;
    let e = c.create_volume(smaller).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // ... and one it fits: the same volume
    let same = c
        .create_volume(create_request("pvc-one", 2 * MIB, Mode::SingleNodeWriter))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(same.capacity_bytes, GIB as i64);

    let e = c
        .create_volume(create_request("../escape", MIB, Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let v = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "pvc-one".to_string(),
            volume_context: HashMap::new(),
            volume_capabilities: vec![capability(Mode::MultiNodeReaderOnly)],
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(v.confirmed.is_none() && !v.message.is_empty());
    let e = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "pvc-none".to_string(),
            volume_context: HashMap::new(),
            volume_capabilities: vec![capability(Mode::SingleNodeWriter)],
            parameters: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // deleting frees the capacity; deleting what does not exist succeeds
    c.delete_volume(delete_request("pvc-one")).await.unwrap();
    c.delete_volume(delete_request("pvc-never")).await.unwrap();
    c.create_volume(create_request("pvc-two", 2 * GIB, Mode::SingleNodeWriter))
        .await
        .expect("fits once pvc-one is gone");
    c.delete_volume(delete_request("pvc-two")).await.unwrap();

    let e = h
        .node()
        .node_stage_volume(stage_request("pvc-none", &h.path("staging")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    h.stop().await;
}

fn expand_request(id: &str, bytes: u64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
    }
}

fn node_expand_request(id: &str, path: &Path, bytes: u64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: id.to_string(),
        volume_path: path.display().to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        staging_target_path: String::new(),
        volume_capability: Some(capability(Mode::SingleNodeWriter)),
    }
}

/// Online when the process may resize a mounted ext4 (CAP_SYS_RESOURCE), else while only
/// staged; and a volume grown while unstaged grows at its next stage.
#[tokio::test]
async fn expansion_grows_the_filesystem() {
    let h = Harness::start(20 * GIB).await;
    let mut guard = Mounts(vec![]);
    let id = "pvc-grow";
    h.controller()
        .create_volume(create_request(id, 64 * MIB, Mode::SingleNodeWriter))
        .await
        .unwrap();
    let staging = h.path("staging/grow/globalmount");
    let target = h.path("pods/uid-3/mount");
    guard.0 = vec![staging.clone(), target.clone()];
    h.node()
        .node_stage_volume(stage_request(id, &staging))
        .await
        .unwrap();
    h.node()
        .node_publish_volume(publish_request(id, &staging, &target, false))
        .await
        .unwrap();
    std::fs::write(target.join("before"), b"kept").unwrap();
    let (before, _) = stats(&h, id, &target).await;
    assert!(before.available >= (64 * MIB) as i64 && before.available < (65 * MIB) as i64);

    let r = h
        .controller()
        .controller_expand_volume(expand_request(id, 512 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, (512 * MIB) as i64);
    assert!(r.node_expansion_required);
    let published = h
        .node()
        .node_expand_volume(node_expand_request(id, &target, 512 * MIB))
        .await;
    let path = if sys::can_resize_online() {
        published.expect("online expansion");
        target.clone()
    } else {
        let e = published.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("CAP_SYS_RESOURCE"), "{}", e.message());
        h.node()
            .node_unpublish_volume(unpublish_request(id, &target))
            .await
            .unwrap();
        let r = h
            .node()
            .node_expand_volume(node_expand_request(id, &staging, 512 * MIB))
            .await
            .expect("expansion of a staged volume")
            .into_inner();
        assert_eq!(r.capacity_bytes, (512 * MIB) as i64);
        staging.clone()
    };
    let (after, _) = stats(&h, id, &path).await;
    assert!(
        after.available >= (512 * MIB) as i64,
        "{before:?} -> {after:?}"
    );
    assert!(after.total > before.total);
    assert_eq!(std::fs::read(path.join("before")).unwrap(), b"kept");

    // grown while unstaged: the next stage grows the filesystem
    h.node()
        .node_unpublish_volume(unpublish_request(id, &target))
        .await
        .unwrap();
    h.node()
        .node_unstage_volume(unstage_request(id, &staging))
        .await
        .unwrap();
    h.controller()
        .controller_expand_volume(expand_request(id, GIB))
        .await
        .unwrap();
    h.node()
        .node_stage_volume(stage_request(id, &staging))
        .await
        .unwrap();
    let (restaged, _) = stats(&h, id, &staging).await;
    assert!(restaged.available >= GIB as i64, "{restaged:?}");
    assert_eq!(std::fs::read(staging.join("before")).unwrap(), b"kept");

    h.node()
        .node_unstage_volume(unstage_request(id, &staging))
        .await
        .unwrap();
    wait_loop_freed(&h.image(id)).await;
    h.controller()
        .delete_volume(delete_request(id))
        .await
        .unwrap();
    h.stop().await;
}

#[tokio::test]
async fn identity_node_info_and_registration() {
    let mut h = Harness::start(GIB).await;
    let mut id = csi::identity_client::IdentityClient::new(h.channel.clone());
    let info = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use csi::plugin_capability::{service::Type, Type as Cap};
    let services: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Cap::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(services.contains(&(Type::ControllerService as i32)));
    assert!(services.contains(&(Type::VolumeAccessibilityConstraints as i32)));
    assert_eq!(
        id.probe(csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    let ni = h
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ni.node_id, NODE);
    assert_eq!(ni.accessible_topology, Some(here()));

    let reg_socket = h.path("plugins_registry/local.csi.skiff.io-reg.sock");
    let mut r =
        reg::registration_client::RegistrationClient::new(plugin::unix_channel(&reg_socket));
    let pi = r.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(pi.r#type, "CSIPlugin");
    assert_eq!(pi.name, DRIVER_NAME);
    assert_eq!(
        pi.endpoint,
        "/var/lib/kubelet/plugins/local.csi.skiff.io/csi.sock"
    );
    assert_eq!(pi.supported_versions, vec!["1.0.0".to_string()]);
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: false,
        error: "driver name clash".to_string(),
    })
    .await
    .unwrap();
    let plugin = h.plugin.as_mut().unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), plugin.refused())
        .await
        .expect("a refused registration is reported");
    assert_eq!(refused, "driver name clash");

    // shutdown removes the sockets
    let csi_socket = h.path("plugins/local.csi.skiff.io/csi.sock");
    assert!(csi_socket.exists() && reg_socket.exists());
    let dir = h.stop().await;
    let dir = dir.path();
    assert!(!dir.join("plugins/local.csi.skiff.io/csi.sock").exists());
    assert!(!dir
        .join("plugins_registry/local.csi.skiff.io-reg.sock")
        .exists());
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = dir.path().join("csi.sock");
    std::fs::write(&endpoint, b"stale").unwrap();
    let plugin = plugin::start(
        PluginConfig {
            node: NODE.to_string(),
            endpoint: endpoint.clone(),
            registration_socket: None,
            kubelet_endpoint: String::new(),
            data_dir: dir.path().join("volumes"),
            capacity: GIB,
        },
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let mut id = csi::identity_client::IdentityClient::new(plugin::unix_channel(&endpoint));
    assert_eq!(
        id.get_plugin_info(csi::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        DRIVER_NAME
    );
    plugin.shutdown().await;
}
