//! skiff's CSI driver, `local.csi.skiff.io`, and the protocol code the node agent shares with it.
//!
//! - `proto`: the generated CSI v1 (`csi.v1`) and kubelet plugin-registration clients and servers.
//! - `provisioner`: the distributed provisioner task that runs in each node plugin.
//! - `placement`: the controller that places claims of Immediate classes on a node.

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

pub mod placement;
pub mod provisioner;
