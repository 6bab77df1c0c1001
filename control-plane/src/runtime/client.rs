//! Building a kube client from a kubeconfig file, as every controller-manager and scheduler
//! process does at start (`--kubeconfig PATH`).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

/// Why a client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Read {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {path}: {source}")]
    Config {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("building the client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for the current context of the kubeconfig at `path`.
pub async fn from_kubeconfig(path: &Path) -> Result<Client, ClientError> {
    let shown = path.display().to_string();
    let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Read {
        path: shown.clone(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::Config {
            path: shown,
            source,
        })?;
    Ok(Client::try_from(config)?)
}
