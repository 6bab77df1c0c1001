//! The Container Runtime Interface client: containerd's CRI gRPC service over its unix
//! socket, with one typed method per call the agent makes. The channel is lazy and reconnects
//! on every new connection attempt, so a restarted containerd is picked up transparently.

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;

pub use cri::{
    Container, ContainerConfig, ContainerState, ContainerStatus, PodSandbox, PodSandboxConfig,
    PodSandboxState, PodSandboxStatus,
};

/// A failed CRI call: which call, and the runtime's status.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI {op}: {}", .status.message())]
    Call {
        op: &'static str,
        status: tonic::Status,
    },
}

impl CriError {
    /// The runtime reported that the object does not exist (already removed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// The runtime's own message, for Events and container state messages.
    pub fn message(&self) -> String {
        let CriError::Call { status, .. } = self;
        status.message().to_string()
    }
}

type Result<T> = std::result::Result<T, CriError>;

fn call(op: &'static str) -> impl FnOnce(tonic::Status) -> CriError {
    move |status| CriError::Call { op, status }
}

/// A lazy gRPC channel to a server on a unix socket (containerd's CRI, CSI drivers, plugin
/// registration sockets): it dials on first use and again after the connection breaks, so
/// a restarted server is picked up transparently. The CSI crate's, shared by both.
pub use skiff_csi::plugin::unix_channel;

/// A cheap-to-clone CRI client (runtime and image services on one channel).
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    /// A client for the runtime listening on `socket`; connects on first use.
    pub fn new(socket: &Path) -> Cri {
        let channel = unix_channel(socket);
        Cri {
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20),
            images: ImageServiceClient::new(channel).max_decoding_message_size(64 << 20),
        }
    }

    pub async fn version(&self) -> Result<cri::VersionResponse> {
        let req = cri::VersionRequest {
            version: "v1".into(),
        };
        Ok(self
            .runtime
            .clone()
            .version(req)
            .await
            .map_err(call("Version"))?
            .into_inner())
    }

    /// Runtime conditions (RuntimeReady, NetworkReady).
    pub async fn status(&self) -> Result<cri::RuntimeStatus> {
        let req = cri::StatusRequest { verbose: false };
        let resp = self
            .runtime
            .clone()
            .status(req)
            .await
            .map_err(call("Status"))?;
        Ok(resp.into_inner().status.unwrap_or_default())
    }

    pub async fn run_pod_sandbox(&self, config: PodSandboxConfig) -> Result<String> {
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let resp = self
            .runtime
            .clone()
            .run_pod_sandbox(req)
            .await
            .map_err(call("RunPodSandbox"))?;
        Ok(resp.into_inner().pod_sandbox_id)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatus> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let resp = self
            .runtime
            .clone()
            .pod_sandbox_status(req)
            .await
            .map_err(call("PodSandboxStatus"))?;
        Ok(resp.into_inner().status.unwrap_or_default())
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.runtime
            .clone()
            .stop_pod_sandbox(req)
            .await
            .map_err(call("StopPodSandbox"))?;
        Ok(())
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.runtime
            .clone()
            .remove_pod_sandbox(req)
            .await
            .map_err(call("RemovePodSandbox"))?;
        Ok(())
    }

    /// Sandboxes carrying every label in `labels` (all of them for an empty map).
    pub async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<PodSandbox>> {
        let filter = cri::PodSandboxFilter {
            label_selector: labels,
            ..Default::default()
        };
        let req = cri::ListPodSandboxRequest {
            filter: Some(filter),
        };
        let resp = self
            .runtime
            .clone()
            .list_pod_sandbox(req)
            .await
            .map_err(call("ListPodSandbox"))?;
        Ok(resp.into_inner().items)
    }

    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> Result<String> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp = self
            .runtime
            .clone()
            .create_container(req)
            .await
            .map_err(call("CreateContainer"))?;
        Ok(resp.into_inner().container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        self.runtime
            .clone()
            .start_container(req)
            .await
            .map_err(call("StartContainer"))?;
        Ok(())
    }

    /// Stops a container: SIGTERM (or the image's stop signal), SIGKILL after `grace`.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout: grace.as_secs() as i64,
        };
        self.runtime
            .clone()
            .stop_container(req)
            .await
            .map_err(call("StopContainer"))?;
        Ok(())
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.runtime
            .clone()
            .remove_container(req)
            .await
            .map_err(call("RemoveContainer"))?;
        Ok(())
    }

    pub async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let resp = self
            .runtime
            .clone()
            .container_status(req)
            .await
            .map_err(call("ContainerStatus"))?;
        Ok(resp.into_inner().status.unwrap_or_default())
    }

    /// Containers of one sandbox (all sandboxes for `None`).
    pub async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>> {
        let filter = cri::ContainerFilter {
            pod_sandbox_id: sandbox_id.unwrap_or_default().into(),
            ..Default::default()
        };
        let req = cri::ListContainersRequest {
            filter: Some(filter),
        };
        let resp = self
            .runtime
            .clone()
            .list_containers(req)
            .await
            .map_err(call("ListContainers"))?;
        Ok(resp.into_inner().containers)
    }

    /// Runs `cmd` in a container and waits for it (exec probes, preStop hooks, tests).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: timeout.as_secs().max(1) as i64,
        };
        let resp = self
            .runtime
            .clone()
            .exec_sync(req)
            .await
            .map_err(call("ExecSync"))?;
        Ok(resp.into_inner())
    }

    /// A streaming-server URL for an interactive exec (the kubelet API proxies to it).
    pub async fn exec(&self, req: cri::ExecRequest) -> Result<String> {
        let resp = self.runtime.clone().exec(req).await.map_err(call("Exec"))?;
        Ok(resp.into_inner().url)
    }

    /// A streaming-server URL for attaching to a running container's stdio.
    pub async fn attach(&self, req: cri::AttachRequest) -> Result<String> {
        let resp = self
            .runtime
            .clone()
            .attach(req)
            .await
            .map_err(call("Attach"))?;
        Ok(resp.into_inner().url)
    }

    /// A streaming-server URL for port forwarding into a sandbox's network namespace.
    pub async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let req = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports,
        };
        let resp = self
            .runtime
            .clone()
            .port_forward(req)
            .await
            .map_err(call("PortForward"))?;
        Ok(resp.into_inner().url)
    }

    /// The image's id if the runtime has it.
    pub async fn image_id(&self, image: &str) -> Result<Option<String>> {
        let req = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let resp = self
            .images
            .clone()
            .image_status(req)
            .await
            .map_err(call("ImageStatus"))?;
        Ok(resp.into_inner().image.map(|i| i.id))
    }

    /// Pulls an image; returns the image reference the runtime resolved it to.
    pub async fn pull_image(
        &self,
        image: &str,
        sandbox: Option<PodSandboxConfig>,
    ) -> Result<String> {
        let req = cri::PullImageRequest {
            image: Some(image_spec(image)),
            auth: None,
            sandbox_config: sandbox,
        };
        let resp = self
            .images
            .clone()
            .pull_image(req)
            .await
            .map_err(call("PullImage"))?;
        Ok(resp.into_inner().image_ref)
    }
}

fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}
