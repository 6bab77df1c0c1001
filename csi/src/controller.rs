//! The CSI Controller service, for the volumes of this node only (distributed provisioning:
//! each node plugin's provisioner calls its own Controller service).

use crate::driver::{blocking, check_capability, io_status, Driver};
use crate::proto::csi::v1 as csi;
use crate::volumes::{round_up_mib, valid_id, GIB, MIB};
use csi::controller_service_capability::{self as cap, rpc::Type as Rpc};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};

pub struct Controller {
    pub driver: Arc<Driver>,
}

/// The size to give a volume for a capacity range: the required bytes rounded up to whole
/// MiB (1 GiB when nothing is asked), within the limit.
pub fn volume_size(range: Option<&csi::CapacityRange>) -> Result<u64, Status> {
    let (req, lim) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if req < 0 || lim < 0 {
        return Err(Status::invalid_argument(
            "capacity_range must not be negative",
        ));
    }
    let (req, lim) = (req as u64, lim as u64);
    if lim > 0 && req > lim {
        return Err(Status::invalid_argument(format!(
            "capacity_range: required_bytes {req} exceeds limit_bytes {lim}"
        )));
    }
    let mut size = match (req, lim) {
        (0, 0) => GIB,
        (0, lim) => GIB.min(lim),
        (req, _) => req,
    };
    size = round_up_mib(size);
    if lim > 0 && size > lim {
        // whole 4 KiB blocks within the limit
        size = lim / 4096 * 4096;
    }
    if size < req.max(MIB) {
        return Err(Status::out_of_range(format!(
            "capacity_range [{req}, {lim}] allows no volume size (whole MiB or 4 KiB blocks, \
             at least 1 MiB)"
        )));
    }
    Ok(size)
}

fn fits(capacity: u64, range: Option<&csi::CapacityRange>) -> bool {
    let (req, lim) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    capacity >= req.max(0) as u64 && (lim <= 0 || capacity <= lim as u64)
}

impl Controller {
    fn volume(&self, id: String, capacity: u64) -> csi::Volume {
        csi::Volume {
            capacity_bytes: capacity as i64,
            volume_id: id,
            volume_context: HashMap::new(),
            accessible_topology: vec![self.driver.topology()],
        }
    }

    async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        // The volume id is the name: CreateVolume is idempotent by name without a table.
        if !valid_id(&req.name) {
            return Err(Status::invalid_argument(format!(
                "invalid volume name {:?}: 1 to 128 of [A-Za-z0-9._-], not starting with '.'",
                req.name
            )));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        for c in &req.volume_capabilities {
            check_capability(c)?;
        }
        if let Some(t) = &req.accessibility_requirements {
            // Only this node can hold the volume; preferred topologies are a wish.
            if !t.requisite.is_empty() && !t.requisite.iter().any(|t| self.driver.is_here(t)) {
                return Err(Status::resource_exhausted(format!(
                    "node {} is not in the requisite topology (volumes of {} are created on \
                     the node whose plugin is called)",
                    self.driver.node,
                    crate::DRIVER_NAME
                )));
            }
        }
        let size = volume_size(req.capacity_range.as_ref())?;
        let d = self.driver.clone();
        let range = req.capacity_range;
        let id = req.name;
        let created = blocking(move || {
            let _g = d.capacity_lock.lock().unwrap_or_else(|e| e.into_inner());
            let existing = d
                .store
                .capacity(&id)
                .map_err(|e| io_status("reading the volume", e))?;
            if let Some(c) = existing {
                return match fits(c, range.as_ref()) {
                    true => Ok((id, c)),
                    false => Err(Status::already_exists(format!(
                        "volume {id} exists with capacity {c} bytes, outside the requested range"
                    ))),
                };
            }
            let available = d.store.available().map_err(|e| io_status("capacity", e))?;
            if size > available {
                return Err(Status::resource_exhausted(format!(
                    "not enough capacity on node {}: requested {size} bytes, available \
                     {available} bytes",
                    d.node
                )));
            }
            d.store
                .create(&id, size)
                .map_err(|e| io_status("creating the volume file", e))?;
            tracing::info!(volume = %id, bytes = size, "volume created");
            d.update_gauges();
            Ok((id, size))
        })
        .await?;
        Ok(self.volume(created.0, created.1))
    }

    async fn delete(&self, id: String) -> Result<(), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if !valid_id(&id) {
            // never created here: deleting it is done
            return Ok(());
        }
        let d = self.driver.clone();
        blocking(move || {
            let _g = d.capacity_lock.lock().unwrap_or_else(|e| e.into_inner());
            let image = d.store.image(&id);
            if image.exists() {
                if let Some(dev) =
                    crate::sys::find_loop_for(&image).map_err(|e| io_status("loop devices", e))?
                {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is in use ({} is attached to it)",
                        dev.display()
                    )));
                }
            }
            if d.store
                .delete(&id)
                .map_err(|e| io_status("removing the volume", e))?
            {
                tracing::info!(volume = %id, "volume deleted");
            }
            d.update_gauges();
            Ok(())
        })
        .await
    }

    async fn expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        if !valid_id(&req.volume_id) {
            return Err(Status::not_found(format!("no volume {:?}", req.volume_id)));
        }
        if req.capacity_range.is_none() {
            return Err(Status::invalid_argument("capacity_range is required"));
        }
        if let Some(c) = &req.volume_capability {
            check_capability(c)?;
        }
        let size = volume_size(req.capacity_range.as_ref())?;
        let d = self.driver.clone();
        let id = req.volume_id;
        blocking(move || {
            let _g = d.capacity_lock.lock().unwrap_or_else(|e| e.into_inner());
            let current = d
                .store
                .capacity(&id)
                .map_err(|e| io_status("reading the volume", e))?
                .ok_or_else(|| Status::not_found(format!("no volume {id}")))?;
            if current >= size {
                // Already this size (a retry after a lost answer, say): the filesystem may
                // still be the old size, and growing it on the node is idempotent.
                return Ok(csi::ControllerExpandVolumeResponse {
                    capacity_bytes: current as i64,
                    node_expansion_required: true,
                });
            }
            let available = d.store.available().map_err(|e| io_status("capacity", e))?;
            if size - current > available {
                return Err(Status::resource_exhausted(format!(
                    "not enough capacity on node {} to grow volume {id} from {current} to \
                     {size} bytes: requested {} more bytes, available {available} bytes",
                    d.node,
                    size - current
                )));
            }
            d.store
                .grow(&id, size)
                .map_err(|e| io_status("growing the volume file", e))?;
            tracing::info!(volume = %id, from = current, to = size, "volume expanded");
            d.update_gauges();
            Ok(csi::ControllerExpandVolumeResponse {
                capacity_bytes: size as i64,
                node_expansion_required: true,
            })
        })
        .await
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Controller {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let start = Instant::now();
        let r = self.create(req.into_inner()).await;
        self.driver.metrics.observe("CreateVolume", start, &r);
        if let Err(e) = &r {
            tracing::warn!(code = ?e.code(), message = e.message(), "CreateVolume failed");
        }
        r.map(|v| Response::new(csi::CreateVolumeResponse { volume: Some(v) }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let start = Instant::now();
        let r = self.delete(req.into_inner().volume_id).await;
        self.driver.metrics.observe("DeleteVolume", start, &r);
        r.map(|()| Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let d = self.driver.clone();
        let id = req.volume_id.clone();
        let r = async {
            if req.volume_capabilities.is_empty() {
                return Err(Status::invalid_argument("volume_capabilities is required"));
            }
            let exists = blocking(move || {
                d.store
                    .capacity(&id)
                    .map_err(|e| io_status("reading the volume", e))
            })
            .await?;
            if exists.is_none() {
                return Err(Status::not_found(format!("no volume {:?}", req.volume_id)));
            }
            let unsupported = req
                .volume_capabilities
                .iter()
                .find_map(|c| check_capability(c).err());
            Ok(match unsupported {
                Some(s) => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: s.message().to_string(),
                },
                None => csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                        volume_context: req.volume_context,
                        volume_capabilities: req.volume_capabilities,
                        parameters: req.parameters,
                    }),
                    message: String::new(),
                },
            })
        }
        .await;
        self.driver
            .metrics
            .observe("ValidateVolumeCapabilities", start, &r);
        r.map(Response::new)
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let d = self.driver.clone();
        let r = async {
            for c in &req.volume_capabilities {
                check_capability(c)?;
            }
            if let Some(t) = &req.accessible_topology {
                if !d.is_here(t) {
                    return Ok(csi::GetCapacityResponse {
                        available_capacity: 0,
                        maximum_volume_size: Some(0),
                        minimum_volume_size: None,
                    });
                }
            }
            let available =
                blocking(move || d.store.available().map_err(|e| io_status("capacity", e))).await?;
            Ok(csi::GetCapacityResponse {
                available_capacity: available as i64,
                maximum_volume_size: Some(available as i64),
                minimum_volume_size: Some(MIB as i64),
            })
        }
        .await;
        self.driver.metrics.observe("GetCapacity", start, &r);
        r.map(Response::new)
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: Rpc| csi::ControllerServiceCapability {
            r#type: Some(cap::Type::Rpc(cap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(Rpc::CreateDeleteVolume),
                rpc(Rpc::GetCapacity),
                rpc(Rpc::ExpandVolume),
                rpc(Rpc::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let start = Instant::now();
        let r = self.expand(req.into_inner()).await;
        self.driver
            .metrics
            .observe("ControllerExpandVolume", start, &r);
        r.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(req: i64, lim: i64) -> Option<csi::CapacityRange> {
        Some(csi::CapacityRange {
            required_bytes: req,
            limit_bytes: lim,
        })
    }

    #[test]
    fn sizes_round_up_to_mib_within_the_limit() {
        assert_eq!(volume_size(None).unwrap(), GIB);
        assert_eq!(volume_size(range(1, 0).as_ref()).unwrap(), MIB);
        assert_eq!(volume_size(range(GIB as i64, 0).as_ref()).unwrap(), GIB);
        assert_eq!(
            volume_size(range(MIB as i64 + 1, 0).as_ref()).unwrap(),
            2 * MIB
        );
        assert_eq!(
            volume_size(range(MIB as i64 + 1, MIB as i64 + 8192).as_ref()).unwrap(),
            MIB + 8192
        );
        assert_eq!(
            volume_size(range(0, 4 * MIB as i64).as_ref()).unwrap(),
            4 * MIB
        );
        assert_eq!(
            volume_size(range(2, 1).as_ref()).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            volume_size(range(-1, 0).as_ref()).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            volume_size(range(MIB as i64 + 1, MIB as i64 + 2).as_ref())
                .unwrap_err()
                .code(),
            tonic::Code::OutOfRange
        );
    }
}
