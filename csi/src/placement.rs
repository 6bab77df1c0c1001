//! The placement controller (`skiff-csi controller`): gives unbound claims of Immediate classes of
//! this driver a `volume.kubernetes.io/selected-node`. STUB: filled in by its owner.

/// Runs until the process ends. STUB: waits forever.
pub async fn run(client: kube::Client, driver: String) -> anyhow::Result<()> {
    let _ = (client, driver);
    std::future::pending::<()>().await;
    Ok(())
}
