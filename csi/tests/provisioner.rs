//! The provisioner and the placement controller against skiff's real API server (in-process)
//! and the real driver (its CSI servers in-process on a unix socket, volumes as sparse files
//! in a scratch data dir). No PV binder runs here: the tests play its part (the
//! storage-provisioner annotation on claims, phase Released on volumes) and watch what the
//! provisioner does through the API, the Events and the driver's files.

mod support;
use support::eventually;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use control_plane::apiserver::{Config as ApiConfig, RunningServer, Server as ApiServer};
use csi::controller_client::ControllerClient;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use skiff_csi::plugin::{self, Plugin, PluginConfig};
use skiff_csi::proto::csi::v1 as csi;
use skiff_csi::provisioner::{self, FINALIZER, PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER};
use skiff_csi::{placement, DRIVER_NAME, TOPOLOGY_KEY};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

const GIB: u64 = 1 << 30;

/// An API server in a scratch directory and an admin client of it.
struct Cluster {
    _dir: tempfile::TempDir,
    _api: RunningServer,
    client: Client,
    /// The admin kubeconfig.
    kubeconfig: PathBuf,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let api = ApiServer::start(ApiConfig::new(dir.path(), "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let client = control_plane::runtime::client::from_kubeconfig(api.kubeconfig_path())
            .await
            .unwrap();
        Cluster {
            _dir: dir,
            kubeconfig: api.kubeconfig_path().to_path_buf(),
            _api: api,
            client,
        }
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    async fn create<K>(&self, api: &Api<K>, v: Value) -> K
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let obj: K = serde_json::from_value(v).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap()
    }

    async fn class(&self, name: &str, reclaim: &str, mode: &str) {
        self.class_of(name, DRIVER_NAME, reclaim, mode).await;
    }

    async fn class_of(&self, name: &str, provisioner: &str, reclaim: &str, mode: &str) {
        let api: Api<StorageClass> = Api::all(self.client.clone());
        self.create(
            &api,
            json!({
                "metadata": {"name": name},
                "provisioner": provisioner,
                "reclaimPolicy": reclaim,
                "volumeBindingMode": mode,
                "parameters": {"csi.storage.k8s.io/fstype": "ext4"},
            }),
        )
        .await;
    }

    /// A claim of `class` for `size`, handed to the driver (as the binder does) and, with
    /// `node`, placed there (as the scheduler does).
    async fn claim(
        &self,
        name: &str,
        class: &str,
        size: &str,
        node: Option<&str>,
    ) -> PersistentVolumeClaim {
        let mut annotations = BTreeMap::from([(STORAGE_PROVISIONER, DRIVER_NAME)]);
        if let Some(n) = node {
            annotations.insert(SELECTED_NODE, n);
        }
        self.create(
            &self.claims(),
            json!({
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "resources": {"requests": {"storage": size}}},
            }),
        )
        .await
    }

    /// A CSINode of `node` listing `driver`.
    async fn csinode(&self, node: &str, driver: &str) {
        let api: Api<CSINode> = Api::all(self.client.clone());
        self.create(
            &api,
            json!({
                "metadata": {"name": node},
                "spec": {"drivers": [{"name": driver, "nodeID": node,
                    "topologyKeys": [TOPOLOGY_KEY]}]},
            }),
        )
        .await;
    }

    /// The Events about the object with `uid`: (type, reason, message).
    async fn events(&self, uid: &str) -> Vec<(String, String, String)> {
        support::events(&self.client, uid).await
    }

    /// Waits for an Event `reason` about `uid` and returns its (type, message).
    async fn wait_event(&self, uid: &str, reason: &str) -> (String, String) {
        support::wait_event(&self.client, uid, reason).await
    }

    async fn wait_volume(&self, name: &str) -> PersistentVolume {
        eventually(&format!("PV {name}"), || async {
            self.volumes()
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not there".to_string())
        })
        .await
    }

    /// Plays the binder after the claim went: the volume's phase becomes Released.
    async fn release(&self, name: &str) {
        self.volumes()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Released"}})),
            )
            .await
            .unwrap();
    }
}

/// The real driver of `node` (its CSI servers on a socket in `dir`) with `capacity` bytes.
struct Driver {
    plugin: Option<Plugin>,
    socket: PathBuf,
    data: PathBuf,
}

impl Driver {
    async fn start(dir: &Path, node: &str, capacity: u64) -> Driver {
        let socket = dir.join(format!("{node}.sock"));
        let data = dir.join(format!("{node}-volumes"));
        let plugin = plugin::start(
            PluginConfig {
                node: node.into(),
                endpoint: socket.clone(),
                registration_socket: None,
                kubelet_endpoint: socket.display().to_string(),
                data_dir: data.clone(),
                capacity,
            },
            Arc::new(skiff_csi::metrics::Metrics::new()),
        )
        .await
        .unwrap();
        Driver {
            plugin: Some(plugin),
            socket,
            data,
        }
    }

    /// The file of volume `id` (the design's `<data dir>/<volume id>.img`).
    fn file(&self, id: &str) -> PathBuf {
        self.data.join(format!("{id}.img"))
    }

    /// Runs the provisioner of `node` against this driver until the handle is aborted.
    fn provisioner(&self, client: &Client, node: &str) -> JoinHandle<anyhow::Result<()>> {
        tokio::spawn(provisioner::run(provisioner::Config {
            client: client.clone(),
            csi: plugin::unix_channel(&self.socket),
            driver: DRIVER_NAME.into(),
            node: node.into(),
            metrics: control_plane::runtime::Metrics::new(),
        }))
    }

    async fn stop(mut self) {
        if let Some(p) = self.plugin.take() {
            p.shutdown().await;
        }
    }
}

fn pv_name(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.uid().unwrap())
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.finalizers().iter().any(|f| f == FINALIZER)
}

/// The counters' text exposition.
fn metrics_text() -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    provisioner::register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_selected_for_this_node_gets_a_pinned_pre_bound_volume_and_others_are_left_alone() {
    let c = Cluster::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let driver = Driver::start(scratch.path(), "n1", 2 * GIB).await;
    c.class("local", "Delete", "WaitForFirstConsumer").await;
    // Created first: by the time the second claim is provisioned, this one's events were
    // seen (one watch, in order) and passed over.
    let other = c.claim("elsewhere", "local", "64Mi", Some("n2")).await;
    let unplaced = c.claim("unplaced", "local", "64Mi", None).await;
    let claim = c.claim("data", "local", "64Mi", Some("n1")).await;
    let task = driver.provisioner(&c.client, "n1");

    let pv = c.wait_volume(&pv_name(&claim)).await;
    let spec = pv.spec.clone().unwrap();
    assert_eq!(
        pv.annotations().get(PROVISIONED_BY).map(String::as_str),
        Some(DRIVER_NAME)
    );
    assert!(has_finalizer(&pv), "finalizers: {:?}", pv.finalizers());
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, DRIVER_NAME);
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "64Mi");
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_string()][..])
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    let r = spec.claim_ref.clone().unwrap();
    assert_eq!(
        (
            r.kind.as_deref(),
            r.api_version.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref()
        ),
        (
            Some("PersistentVolumeClaim"),
            Some("v1"),
            Some("default"),
            Some("data")
        )
    );
    assert_eq!(r.uid, claim.uid());
    let affinity = serde_json::to_value(&spec.node_affinity).unwrap();
    assert_eq!(
        affinity,
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}]}]}})
    );
    // The driver really made it: a sparse file with room for the 64 MiB (and ext4's own).
    let file = driver.file(&csi.volume_handle);
    assert!(std::fs::metadata(&file).unwrap().len() >= 64 << 20);

    let uid = claim.uid().unwrap();
    let (kind, message) = c.wait_event(&uid, "Provisioning").await;
    assert_eq!(kind, "Normal");
    assert_eq!(
        message,
        "External provisioner is provisioning volume for claim \"default/data\""
    );
    let (kind, message) = c.wait_event(&uid, "ProvisioningSucceeded").await;
    assert_eq!(kind, "Normal");
    assert_eq!(
        message,
        format!("Successfully provisioned volume {}", pv_name(&claim))
    );

    // Another node's claim and an unplaced one: no volume, no event from this node.
    for left in [&other, &unplaced] {
        assert!(c.volumes().get_opt(&pv_name(left)).await.unwrap().is_none());
        assert_eq!(c.events(&left.uid().unwrap()).await, vec![]);
    }
    assert!(metrics_text()
        .contains("controller_persistentvolumeclaim_provision_total{class=\"local\"} 1"));
    task.abort();
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_too_large_for_the_node_fails_with_the_drivers_reason_and_goes_back_to_the_scheduler(
) {
    let c = Cluster::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let driver = Driver::start(scratch.path(), "n1", GIB).await;
    c.class("small", "Delete", "WaitForFirstConsumer").await;
    let task = driver.provisioner(&c.client, "n1");
    let claim = c.claim("huge", "small", "100Gi", Some("n1")).await;

    let uid = claim.uid().unwrap();
    let (kind, message) = c.wait_event(&uid, "ProvisioningFailed").await;
    assert_eq!(kind, "Warning");
    let prefix = "failed to provision volume with StorageClass \"small\": rpc error: code = ResourceExhausted desc = ";
    assert!(message.starts_with(prefix), "{message}");
    // The driver's own words: what was asked and what is left.
    assert!(
        message.contains(&format!("requested {} bytes", 100 * GIB)),
        "{message}"
    );
    let unselected = eventually("selected-node removed", || async {
        let cl = c.claims().get("huge").await.map_err(|e| e.to_string())?;
        match cl.annotations().contains_key(SELECTED_NODE) {
            false => Ok(cl),
            true => Err(format!("annotations: {:?}", cl.annotations())),
        }
    })
    .await;
    // Only that annotation went.
    assert_eq!(
        unselected
            .annotations()
            .get(STORAGE_PROVISIONER)
            .map(String::as_str),
        Some(DRIVER_NAME)
    );
    assert!(c
        .volumes()
        .get_opt(&pv_name(&claim))
        .await
        .unwrap()
        .is_none());
    assert!(!driver.file(&pv_name(&claim)).exists());

    // Block volumes: refused by the provisioner itself, given back the same way.
    let block: PersistentVolumeClaim = c
        .create(
            &c.claims(),
            json!({
                "metadata": {"name": "raw", "annotations": {
                    STORAGE_PROVISIONER: DRIVER_NAME, SELECTED_NODE: "n1"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "small",
                    "volumeMode": "Block", "resources": {"requests": {"storage": "8Mi"}}},
            }),
        )
        .await;
    let (kind, message) = c
        .wait_event(&block.uid().unwrap(), "ProvisioningFailed")
        .await;
    assert_eq!(kind, "Warning");
    assert!(message.contains("volumeMode Block"), "{message}");
    eventually("selected-node removed from the Block claim", || async {
        let cl = c.claims().get("raw").await.map_err(|e| e.to_string())?;
        match cl.annotations().contains_key(SELECTED_NODE) {
            false => Ok(()),
            true => Err(format!("annotations: {:?}", cl.annotations())),
        }
    })
    .await;
    assert!(metrics_text()
        .contains("controller_persistentvolumeclaim_provision_failed_total{class=\"small\"}"));
    task.abort();
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn released_volumes_are_deleted_with_their_data_under_delete_and_kept_under_retain() {
    let c = Cluster::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let driver = Driver::start(scratch.path(), "n1", 2 * GIB).await;
    c.class("scratch", "Delete", "WaitForFirstConsumer").await;
    c.class("keep", "Retain", "WaitForFirstConsumer").await;
    let task = driver.provisioner(&c.client, "n1");
    let kept = c.claim("kept", "keep", "32Mi", Some("n1")).await;
    let gone = c.claim("gone", "scratch", "32Mi", Some("n1")).await;
    let kept_pv = c.wait_volume(&pv_name(&kept)).await;
    let gone_pv = c.wait_volume(&pv_name(&gone)).await;
    assert_eq!(
        kept_pv
            .spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    let kept_file = driver.file(
        &kept_pv
            .spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle,
    );
    let gone_file = driver.file(
        &gone_pv
            .spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle,
    );
    assert!(kept_file.exists() && gone_file.exists());

    // The claims went (the binder's part): Retain's first, so it was seen first.
    c.release(&kept_pv.name_any()).await;
    c.release(&gone_pv.name_any()).await;
    eventually("the Delete volume's file removed", || async {
        match gone_file.exists() {
            false => Ok(()),
            true => Err(format!("{} still there", gone_file.display())),
        }
    })
    .await;
    // Its PV goes: deleted, our finalizer off (pv-protection's own is its controller's).
    eventually("the Delete PV deleted", || async {
        match c
            .volumes()
            .get_opt(&gone_pv.name_any())
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(pv) if pv.metadata.deletion_timestamp.is_some() && !has_finalizer(&pv) => Ok(()),
            Some(pv) => Err(format!(
                "{:?} {:?}",
                pv.metadata.deletion_timestamp,
                pv.finalizers()
            )),
        }
    })
    .await;
    // Retain: the volume and its data stay.
    let still = c.volumes().get(&kept_pv.name_any()).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_none());
    assert!(has_finalizer(&still));
    assert!(kept_file.exists());

    // An administrator deletes the retained PV: our finalizer goes, the data stays.
    c.volumes()
        .delete(&kept_pv.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Retain PV's finalizer removed", || async {
        match c
            .volumes()
            .get_opt(&kept_pv.name_any())
            .await
            .map_err(|e| e.to_string())?
        {
            Some(pv) if has_finalizer(&pv) => Err(format!("finalizers {:?}", pv.finalizers())),
            _ => Ok(()),
        }
    })
    .await;
    assert!(kept_file.exists());
    assert!(
        metrics_text().contains("controller_persistentvolume_delete_total{class=\"scratch\"} 1")
    );
    assert!(!metrics_text().contains("controller_persistentvolume_delete_total{class=\"keep\"}"));
    task.abort();
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn immediate_claims_go_to_the_registered_node_with_the_fewest_bytes() {
    const ABSENT: &str = "absent.csi.example.com";
    let c = Cluster::start().await;
    c.class("now", "Delete", "Immediate").await;
    c.class("later", "Delete", "WaitForFirstConsumer").await;
    c.class_of("nowhere", ABSENT, "Delete", "Immediate").await;
    // 10 GiB already on n1; n3 has another driver only (and nothing provisioned: it would
    // win otherwise). All there before the controllers start, so their first choice knows.
    c.create(
        &c.volumes(),
        json!({
            "metadata": {"name": "existing"},
            "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": DRIVER_NAME, "volumeHandle": "existing"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": TOPOLOGY_KEY, "operator": "In", "values": ["n1"]}]}]}}},
        }),
    )
    .await;
    for (node, driver) in [
        ("n3", "other.csi.example.com"),
        ("n1", DRIVER_NAME),
        ("n2", DRIVER_NAME),
    ] {
        c.csinode(node, driver).await;
    }
    let (ours_metrics, absent_metrics) = (
        control_plane::runtime::Metrics::new(),
        control_plane::runtime::Metrics::new(),
    );
    let ours = tokio::spawn(placement::run(
        c.client.clone(),
        DRIVER_NAME.into(),
        ours_metrics.clone(),
    ));
    let absent = tokio::spawn(placement::run(
        c.client.clone(),
        ABSENT.into(),
        absent_metrics.clone(),
    ));

    let selected = |name: &'static str| {
        let api = c.claims();
        async move {
            eventually(&format!("{name} placed"), || async {
                let cl = api.get(name).await.map_err(|e| e.to_string())?;
                cl.annotations()
                    .get(SELECTED_NODE)
                    .cloned()
                    .ok_or_else(|| "no selected-node".to_string())
            })
            .await
        }
    };
    c.claim("first", "now", "1Gi", None).await;
    assert_eq!(selected("first").await, "n2");
    // A claim of a WaitForFirstConsumer class is the scheduler's: queued before the next
    // one (one worker, in order), and left alone.
    c.claim("waits", "later", "1Gi", None).await;
    // 10 GiB more on n2 (1 GiB placed there already): n2 now has 11, n1 10.
    c.claim("second", "now", "10Gi", None).await;
    assert_eq!(selected("second").await, "n2");
    c.claim("third", "now", "1Gi", None).await;
    assert_eq!(selected("third").await, "n1");
    let waits = c.claims().get("waits").await.unwrap();
    assert!(!waits.annotations().contains_key(SELECTED_NODE));

    // A driver no node has registered: the claim waits with a Warning, and goes to the first
    // node that registers it.
    let lost = c.claim("lost", "nowhere", "1Gi", None).await;
    let (kind, message) = c
        .wait_event(&lost.uid().unwrap(), "ProvisioningFailed")
        .await;
    assert_eq!(kind, "Warning");
    assert_eq!(
        message,
        format!("no node has the driver {ABSENT} registered")
    );
    c.csinode("n4", ABSENT).await;
    assert_eq!(selected("lost").await, "n4");
    // Both ran on the controller runtime: the lost claim's failure is the absent driver's
    // controller's failed reconcile; ours placed its claims without one.
    let errors = |m: &control_plane::runtime::Metrics| {
        support::series_value(
            &m.render(),
            "skiff_controller_reconcile_errors_total{controller=\"placement\"}",
        )
    };
    assert!(
        errors(&absent_metrics) >= 1.0,
        "{}",
        absent_metrics.render()
    );
    assert_eq!(errors(&ours_metrics), 0.0, "{}", ours_metrics.render());
    assert!(ours_metrics.reconcile_count("placement") >= 3);
    ours.abort();
    absent.abort();
}

/// The real driver's Controller service behind a proxy that first fails the given number
/// of CreateVolume and DeleteVolume calls (error injection only; the rest is the driver's).
struct Flaky {
    real: ControllerClient<Channel>,
    create_failures: AtomicU32,
    delete_failures: AtomicU32,
    creates: AtomicU32,
}

/// Takes one failure from `left`, if any is left.
fn fail_once(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Flaky {
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        if fail_once(&self.create_failures) {
            return Err(Status::unavailable("driver busy"));
        }
        self.real.clone().create_volume(r.into_inner()).await
    }

    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        if fail_once(&self.delete_failures) {
            return Err(Status::internal("disk busy"));
        }
        self.real.clone().delete_volume(r.into_inner()).await
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.real
            .clone()
            .validate_volume_capabilities(r.into_inner())
            .await
    }

    async fn get_capacity(
        &self,
        r: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.real.clone().get_capacity(r.into_inner()).await
    }

    async fn controller_get_capabilities(
        &self,
        r: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.real
            .clone()
            .controller_get_capabilities(r.into_inner())
            .await
    }

    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.real
            .clone()
            .controller_expand_volume(r.into_inner())
            .await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_errors_are_retried_keeping_the_node_and_failed_deletes_are_reported() {
    let c = Cluster::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let driver = Driver::start(scratch.path(), "n1", GIB).await;
    let flaky = Arc::new(Flaky {
        real: ControllerClient::new(plugin::unix_channel(&driver.socket)),
        create_failures: AtomicU32::new(1),
        delete_failures: AtomicU32::new(1),
        creates: AtomicU32::new(0),
    });
    let proxy = scratch.path().join("flaky.sock");
    let listener = plugin::listen(&proxy).unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(csi::controller_server::ControllerServer::from_arc(
                flaky.clone(),
            ))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    c.class("local", "Delete", "WaitForFirstConsumer").await;
    let controllers = control_plane::runtime::Metrics::new();
    let task = tokio::spawn(provisioner::run(provisioner::Config {
        client: c.client.clone(),
        csi: plugin::unix_channel(&proxy),
        driver: DRIVER_NAME.into(),
        node: "n1".into(),
        metrics: controllers.clone(),
    }));
    let claim = c.claim("busy", "local", "16Mi", Some("n1")).await;
    let uid = claim.uid().unwrap();
    let (kind, message) = c.wait_event(&uid, "ProvisioningFailed").await;
    assert_eq!(kind, "Warning");
    assert_eq!(
        message,
        "failed to provision volume with StorageClass \"local\": rpc error: code = Unavailable desc = driver busy"
    );
    // Retried after its back-off, on the same node: the claim kept its selected node.
    let pv = c.wait_volume(&pv_name(&claim)).await;
    assert_eq!(flaky.creates.load(Ordering::SeqCst), 2);
    let still = c.claims().get("busy").await.unwrap();
    assert_eq!(
        still.annotations().get(SELECTED_NODE).map(String::as_str),
        Some("n1")
    );
    c.wait_event(&uid, "ProvisioningSucceeded").await;

    c.release(&pv.name_any()).await;
    let (kind, message) = c.wait_event(&pv.uid().unwrap(), "VolumeFailedDelete").await;
    assert_eq!(kind, "Warning");
    assert_eq!(message, "rpc error: code = Internal desc = disk busy");
    let file = driver.file(
        &pv.spec
            .as_ref()
            .unwrap()
            .csi
            .as_ref()
            .unwrap()
            .volume_handle,
    );
    eventually("the volume deleted on the retry", || async {
        match file.exists() {
            false => Ok(()),
            true => Err(format!("{} still there", file.display())),
        }
    })
    .await;
    eventually("the PV deleted", || async {
        match c
            .volumes()
            .get_opt(&pv.name_any())
            .await
            .map_err(|e| e.to_string())?
        {
            Some(pv) if pv.metadata.deletion_timestamp.is_none() || has_finalizer(&pv) => {
                Err(format!("{:?}", pv.finalizers()))
            }
            _ => Ok(()),
        }
    })
    .await;
    // Both retries were the controller runtime's: its failed reconciles of the provisioner
    // (the failed CreateVolume and the failed DeleteVolume).
    let errors = support::series_value(
        &controllers.render(),
        "skiff_controller_reconcile_errors_total{controller=\"provisioner\"}",
    );
    assert!(errors >= 2.0, "{}", controllers.render());
    task.abort();
    server.abort();
    driver.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_whose_pv_cannot_be_written_is_deleted_again_when_its_claim_goes() {
    let c = Cluster::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let driver = Driver::start(scratch.path(), "n1", GIB).await;
    c.class("local", "Delete", "WaitForFirstConsumer").await;
    // A provisioner that may do everything but create PersistentVolumes (RBAC as the API
    // server enforces it, through impersonation by the admin).
    let roles: Api<ClusterRole> = Api::all(c.client.clone());
    c.create(
        &roles,
        json!({
            "metadata": {"name": "no-pv-create"},
            "rules": [
                {"apiGroups": [""], "resources": ["persistentvolumes"],
                    "verbs": ["get", "list", "watch", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["persistentvolumeclaims"],
                    "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                    "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        }),
    )
    .await;
    let bindings: Api<ClusterRoleBinding> = Api::all(c.client.clone());
    c.create(
        &bindings,
        json!({
            "metadata": {"name": "no-pv-create"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "no-pv-create"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                "name": "limited-provisioner"}],
        }),
    )
    .await;
    let kc = Kubeconfig::read_from(c.kubeconfig.as_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some("limited-provisioner".into());
    let limited = Client::try_from(config).unwrap();
    let task = driver.provisioner(&limited, "n1");

    let claim = c.claim("unlucky", "local", "16Mi", Some("n1")).await;
    let uid = claim.uid().unwrap();
    let (kind, message) = c.wait_event(&uid, "ProvisioningFailed").await;
    assert_eq!(kind, "Warning");
    assert!(
        message.starts_with(&format!(
            "failed to create PersistentVolume {} for claim \"default/unlucky\": ",
            pv_name(&claim)
        )),
        "{message}"
    );
    // The driver made the volume; no PV says so.
    let file = driver.file(&pv_name(&claim));
    assert!(file.exists());
    assert!(c
        .volumes()
        .get_opt(&pv_name(&claim))
        .await
        .unwrap()
        .is_none());

    // The claim goes (pvc-protection keeps the object while it is being deleted): the
    // volume made for it is deleted.
    c.claims()
        .delete("unlucky", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the orphaned volume deleted", || async {
        match file.exists() {
            false => Ok(()),
            true => Err(format!("{} still there", file.display())),
        }
    })
    .await;
    task.abort();
    driver.stop().await;
}
