//! skiff's CSI driver, `local.csi.skiff.io`, and the protocol code the node agent shares with it.
//!
//! - `proto`: the generated CSI v1 (`csi.v1`) and kubelet plugin-registration clients and servers.
//! - `plugin`: the node plugin's servers (Identity, Controller and Node services on the CSI
//!   socket, Registration on the registration socket) and `unix_channel` to dial such sockets.
//! - `volumes`, `sys`: the volumes (sparse files, loop devices, ext4) and capacity.
//! - `provisioner`: the distributed provisioner task that runs in each node plugin.
//! - `resizer`: the distributed resizer task (external-resizer) that runs in each node plugin.
//! - `placement`: the controller that places claims of Immediate classes on a node.
//!
//! The provisioner, the resizer and placement are reconcilers run by the control plane's
//! controller runtime (`control_plane::runtime::Controller`), as every skiff controller.

pub mod proto {
    pub mod csi {
        pub mod v1 {
            #![allow(clippy::all, missing_docs)]
            tonic::include_proto!("csi.v1");
        }
    }
    pub mod registration {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("pluginregistration");
    }
}

pub mod controller;
pub mod driver;
pub mod identity;
pub mod metrics;
pub mod node;
pub mod placement;
pub mod plugin;
pub mod provisioner;
pub mod registration;
pub mod resizer;
mod runtime;
pub mod sys;
pub mod volumes;

/// The driver's name (CSIDriver, StorageClass provisioner, PV spec.csi.driver).
pub const DRIVER_NAME: &str = "local.csi.skiff.io";
/// The topology key whose value is the node name.
pub const TOPOLOGY_KEY: &str = "topology.local.csi.skiff.io/node";
