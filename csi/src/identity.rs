//! The CSI Identity service.

use crate::proto::csi::v1 as csi;
use csi::plugin_capability::{self, service, volume_expansion};
use tonic::{Request, Response, Status};

pub struct Identity;

fn service(t: service::Type) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: crate::DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                // The Controller service runs in every node plugin (distributed provisioning).
                service(service::Type::ControllerService),
                // A volume is reachable from its node only.
                service(service::Type::VolumeAccessibilityConstraints),
                // Volumes grow while in use when this process may resize a mounted ext4,
                // else while only staged (see node::expand).
                csi::PluginCapability {
                    r#type: Some(plugin_capability::Type::VolumeExpansion(
                        plugin_capability::VolumeExpansion {
                            r#type: match crate::sys::can_resize_online() {
                                true => volume_expansion::Type::Online,
                                false => volume_expansion::Type::Offline,
                            } as i32,
                        },
                    )),
                },
            ],
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
