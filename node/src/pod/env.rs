//! A container's environment: literal values, the downward API (`fieldRef`), ConfigMap and
//! Secret keys (`valueFrom` and `envFrom`), resolved the way the kubelet does, including
//! `$(VAR)` references to variables defined earlier.

use super::Objects;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;

/// Why an environment could not be built (the container waits with CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// The pod-level facts the downward API can expose.
pub struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub node_name: &'a str,
}

/// The value of a downward API field path.
pub fn field(facts: &PodFacts<'_>, path: &str) -> Result<String, EnvError> {
    let meta = &facts.pod.metadata;
    let from_map = |m: &Option<BTreeMap<String, String>>, key: &str| {
        m.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let spec = facts.pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| facts.node_name.into()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => facts.pod_ip.into(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.into(),
        _ => {
            if let Some(key) = subscript(path, "metadata.labels") {
                from_map(&meta.labels, key)
            } else if let Some(key) = subscript(path, "metadata.annotations") {
                from_map(&meta.annotations, key)
            } else {
                return Err(EnvError(format!("unsupported fieldRef {path:?}")));
            }
        }
    })
}

/// `metadata.labels['app']` -> `app`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

/// Builds the container's environment in definition order (envFrom first, then env).
pub async fn resolve(
    facts: &PodFacts<'_>,
    container: &Container,
    objects: &dyn Objects,
) -> Result<Vec<(String, String)>, EnvError> {
    let ns = facts.pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out: Vec<(String, String)> = Vec::new();
    let set = |out: &mut Vec<(String, String)>, k: String, v: String| match out
        .iter_mut()
        .find(|(name, _)| *name == k)
    {
        Some(slot) => slot.1 = v,
        None => out.push((k, v)),
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            let optional = r.optional.unwrap_or(false);
            match config_map_data(objects, ns, &r.name).await? {
                Some(data) => data
                    .into_iter()
                    .for_each(|(k, v)| set(&mut out, format!("{prefix}{k}"), v)),
                None if optional => {}
                None => return Err(EnvError(format!("configmap \"{}\" not found", r.name))),
            }
        }
        if let Some(r) = &from.secret_ref {
            let optional = r.optional.unwrap_or(false);
            match secret_data(objects, ns, &r.name).await? {
                Some(data) => data
                    .into_iter()
                    .for_each(|(k, v)| set(&mut out, format!("{prefix}{k}"), v)),
                None if optional => {}
                None => return Err(EnvError(format!("secret \"{}\" not found", r.name))),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field(facts, &f.field_path)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let data = config_map_data(objects, ns, &r.name).await?;
                    match (
                        data.and_then(|d| d.get(&r.key).cloned()),
                        r.optional.unwrap_or(false),
                    ) {
                        (Some(v), _) => v,
                        (None, true) => continue,
                        (None, false) => {
                            return Err(EnvError(format!(
                                "couldn't find key {} in ConfigMap {ns}/{}",
                                r.key, r.name
                            )))
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let data = secret_data(objects, ns, &r.name).await?;
                    match (
                        data.and_then(|d| d.get(&r.key).cloned()),
                        r.optional.unwrap_or(false),
                    ) {
                        (Some(v), _) => v,
                        (None, true) => continue,
                        (None, false) => {
                            return Err(EnvError(format!(
                                "couldn't find key {} in Secret {ns}/{}",
                                r.key, r.name
                            )))
                        }
                    }
                } else {
                    return Err(EnvError(format!("env {}: unsupported valueFrom", var.name)));
                }
            }
            (Some(v), None) => expand(v, &out),
            (None, None) => String::new(),
        };
        set(&mut out, var.name.clone(), value);
    }
    Ok(out)
}

/// Expands `$(NAME)` from variables defined so far; `$$` escapes; unknown references stay.
pub fn expand(value: &str, defined: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(end) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=end];
            match defined.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&rest[i..i + end + 3]),
            }
            rest = &after[end + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A ConfigMap's string data (binary data is not exposed as env), or None if it is absent.
pub async fn config_map_data(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, EnvError> {
    let cm = objects.config_map(ns, name).await.map_err(EnvError)?;
    Ok(cm.map(|cm| cm.data.unwrap_or_default()))
}

/// A Secret's data as text (stringData is merged into data by the API server).
pub async fn secret_data(
    objects: &dyn Objects,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, EnvError> {
    let s = objects.secret(ns, name).await.map_err(EnvError)?;
    Ok(s.map(|s| {
        let mut data: BTreeMap<String, String> = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        data.extend(s.string_data.unwrap_or_default());
        data
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expansion() {
        let d = vars(&[("A", "1"), ("B", "two")]);
        assert_eq!(expand("x$(A)y$(B)", &d), "x1ytwo");
        assert_eq!(expand("$(C) $$(A) $", &d), "$(C) $(A) $");
        assert_eq!(expand("$(A", &d), "$(A");
    }

    #[test]
    fn downward_api_fields() {
        let mut labels = BTreeMap::new();
        labels.insert("app".to_string(), "web".to_string());
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        let facts = PodFacts {
            pod: &pod,
            pod_ip: "10.0.0.5",
            host_ip: "192.168.1.1",
            node_name: "n1",
        };
        assert_eq!(field(&facts, "metadata.name").unwrap(), "p");
        assert_eq!(field(&facts, "status.podIP").unwrap(), "10.0.0.5");
        assert_eq!(field(&facts, "spec.nodeName").unwrap(), "n1");
        assert_eq!(field(&facts, "metadata.labels['app']").unwrap(), "web");
        assert!(field(&facts, "spec.bogus").is_err());
    }
}
