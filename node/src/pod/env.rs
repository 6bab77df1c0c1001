//! A container's environment: literal values, the downward API (`fieldRef`), ConfigMap and
//! Secret keys (`valueFrom` and `envFrom`), resolved the way the kubelet does, including
//! `$(VAR)` references to variables defined earlier; and the Services' variables
//! (`KUBERNETES_SERVICE_HOST` and, with enableServiceLinks, every Service of the namespace
//! as `<NAME>_SERVICE_HOST`, `<NAME>_PORT_<port>_TCP`, ...), which the container's own
//! variables override.

use super::Objects;
use k8s_openapi::api::core::v1::{Container, Pod, Service};
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
    let links = facts
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    // First, so that the container's variables override them and `$(VAR)` sees them.
    let mut out: Vec<(String, String)> = service_variables(objects, ns, links)?;
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

/// The variables of the Services a pod in `ns` sees: `default/kubernetes` always (the API's
/// address for in-cluster clients), and with `links` every Service of `ns` (which wins over
/// `default/kubernetes` for the same name, as in the kubelet).
pub fn service_variables(
    objects: &dyn Objects,
    ns: &str,
    links: bool,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut chosen: BTreeMap<String, Service> = BTreeMap::new();
    if let Some(api) = objects.service("default", "kubernetes").map_err(EnvError)? {
        chosen.insert("kubernetes".into(), api);
    }
    if links {
        for s in objects.services(ns).map_err(EnvError)? {
            chosen.insert(s.metadata.name.clone().unwrap_or_default(), s);
        }
    }
    Ok(chosen.values().flat_map(link_variables).collect())
}

/// One Service's variables (none without a cluster IP): `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORTNAME>`, and the Docker
/// link variables `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
pub fn link_variables(svc: &Service) -> Vec<(String, String)> {
    let spec = svc.spec.as_ref();
    let Some(ip) = spec
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
    else {
        return Vec::new();
    };
    let upper = |s: &str| s.to_uppercase().replace('-', "_");
    let name = upper(svc.metadata.name.as_deref().unwrap_or_default());
    let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let mut out = vec![(format!("{name}_SERVICE_HOST"), ip.to_string())];
    for (i, p) in ports.iter().enumerate() {
        let port = p.port.to_string();
        if i == 0 {
            out.push((format!("{name}_SERVICE_PORT"), port.clone()));
        }
        if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((format!("{name}_SERVICE_PORT_{}", upper(pn)), port.clone()));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        let url = format!("{}://{host}:{}", proto.to_lowercase(), p.port);
        let prefix = format!("{name}_PORT_{}_{}", p.port, proto.to_uppercase());
        if i == 0 {
            out.push((format!("{name}_PORT"), url.clone()));
        }
        out.push((format!("{prefix}_PROTO"), proto.to_lowercase()));
        out.push((format!("{prefix}_PORT"), p.port.to_string()));
        out.push((format!("{prefix}_ADDR"), ip.to_string()));
        out.push((prefix, url));
    }
    out
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
    fn service_variables_as_the_kubelet_names_them() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "my-api", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [
                {"name": "https", "port": 443, "protocol": "TCP"},
                {"name": "dns-udp", "port": 53, "protocol": "UDP"}
            ]}
        }))
        .unwrap();
        let got: BTreeMap<String, String> = link_variables(&svc).into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("MY_API_SERVICE_HOST", "10.96.0.1"),
            ("MY_API_SERVICE_PORT", "443"),
            ("MY_API_SERVICE_PORT_HTTPS", "443"),
            ("MY_API_SERVICE_PORT_DNS_UDP", "53"),
            ("MY_API_PORT", "tcp://10.96.0.1:443"),
            ("MY_API_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("MY_API_PORT_443_TCP_PROTO", "tcp"),
            ("MY_API_PORT_443_TCP_PORT", "443"),
            ("MY_API_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_API_PORT_53_UDP", "udp://10.96.0.1:53"),
            ("MY_API_PORT_53_UDP_PROTO", "udp"),
            ("MY_API_PORT_53_UDP_PORT", "53"),
            ("MY_API_PORT_53_UDP_ADDR", "10.96.0.1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);

        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h"}, "spec": {"clusterIP": "None"}
        }))
        .unwrap();
        assert!(link_variables(&headless).is_empty());
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
