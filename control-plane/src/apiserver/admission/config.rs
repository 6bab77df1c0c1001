//! How the chain is set up: Kubernetes' AdmissionConfiguration file
//! (`--admission-control-config-file`, apiserver.config.k8s.io/v1; today it configures
//! PodSecurity: defaults for unlabelled namespaces and exemptions) and the plugins turned off
//! (`--disable-admission-plugins`).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::plugins::pod_security;

/// The admission chain's configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub pod_security: pod_security::Config,
    /// Plugins by Kubernetes' name (`LimitRanger`, `PodSecurity`, ...) left out of the chain.
    pub disabled: BTreeSet<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

/// AdmissionConfiguration: each plugin's configuration inline or in a file of its own.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionConfiguration {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    plugins: Vec<PluginConfiguration>,
}

#[derive(Debug, Deserialize)]
struct PluginConfiguration {
    name: String,
    #[serde(default)]
    configuration: Option<Value>,
    #[serde(default)]
    path: Option<String>,
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl Config {
    /// Reads an AdmissionConfiguration file (YAML or JSON); a plugin's `path` is relative
    /// to the file's directory.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let file: AdmissionConfiguration = parse(path, &read(path)?)?;
        if file.kind != "AdmissionConfiguration" {
            return Err(ConfigError::Parse {
                path: path.display().to_string(),
                message: format!("expected kind AdmissionConfiguration, got {:?}", file.kind),
            });
        }
        let mut config = Config::default();
        for p in file.plugins {
            let value = match (p.configuration, p.path) {
                (Some(v), _) => v,
                (None, Some(rel)) => {
                    let full = path.parent().unwrap_or(Path::new(".")).join(rel);
                    parse(&full, &read(&full)?)?
                }
                (None, None) => continue,
            };
            if p.name == "PodSecurity" {
                config.pod_security =
                    serde_json::from_value(value).map_err(|e| ConfigError::Parse {
                        path: path.display().to_string(),
                        message: format!("PodSecurity: {e}"),
                    })?;
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubernetes_admission_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admission.yaml");
        std::fs::write(
            &path,
            "apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      warn: restricted
    exemptions:
      namespaces: [kube-system]
",
        )
        .unwrap();
        let c = Config::from_file(&path).unwrap();
        assert_eq!(c.pod_security.defaults.enforce, "baseline");
        assert_eq!(c.pod_security.exemptions.namespaces, vec!["kube-system"]);
        std::fs::write(&path, "kind: Something\n").unwrap();
        assert!(Config::from_file(&path).is_err());
    }
}
