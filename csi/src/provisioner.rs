//! The distributed provisioner (external-provisioner's node-deployment mode): watches claims
//! selected for this node and creates/deletes their volumes through the driver's own Controller
//! service. STUB: filled in by its owner.

/// What the provisioner task needs.
pub struct Config {
    /// In-cluster API client (the node plugin's ServiceAccount).
    pub client: kube::Client,
    /// Channel to this node plugin's own CSI socket (Controller service).
    pub csi: tonic::transport::Channel,
    /// Driver name (`local.csi.skiff.io`).
    pub driver: String,
    /// This node's name.
    pub node: String,
}

/// Runs until the process ends. STUB: waits forever.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let _ = cfg;
    std::future::pending::<()>().await;
    Ok(())
}
