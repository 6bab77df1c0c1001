//! The kubelet plugin registration service (pluginregistration v1): the node agent's plugin
//! watcher finds the socket in its registration directory, asks GetInfo for the driver's
//! name and endpoint, and reports whether it registered the driver.

use crate::proto::registration as reg;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

pub struct Registration {
    pub name: String,
    /// The driver socket as the node agent sees it (`/var/lib/kubelet/plugins/...`).
    pub endpoint: String,
    /// A refused registration is reported here; the plugin then exits, so that it is
    /// restarted and registers again.
    pub refused: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "CSIPlugin".to_string(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.name, "registered with the node agent");
        } else {
            tracing::error!(driver = %self.name, error = %s.error, "the node agent refused the registration");
            let _ = self.refused.send(s.error);
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}
