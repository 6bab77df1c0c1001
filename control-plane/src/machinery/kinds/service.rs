//! core/v1 Service: defaults (type ClusterIP, sessionAffinity None, TCP, targetPort = port,
//! traffic policies, IP families), validation (DNS-1035 names, ports, types, cluster IPs that
//! may not change once set), kubectl's columns and the Service field selectors. Allocating
//! cluster IPs and node ports is the server's job, not this module's.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, Service, ServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, format_labels, is_ip, meta_errors, meta_field,
    name_cell, port_name_errors, scalar_at, validate_typed, IP_MSG, PORT_RANGE_MSG, PROTOCOLS,
};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_label_errors, dns1123_subdomain_errors, immutable_value, invalid_each, validate_labels,
    FieldPath, NameRule, Scope,
};

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const AFFINITIES: &[&str] = &["ClientIP", "None"];
const TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];
const IP_FAMILIES: &[&str] = &["IPv4", "IPv6"];
const IP_FAMILY_POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
/// Kubernetes' default ClientIP affinity timeout (3 hours).
const DEFAULT_AFFINITY_TIMEOUT: i32 = 10800;

pub fn default(v: &mut Value) {
    default_typed(v, |svc: &mut Service| {
        let spec = svc.spec.get_or_insert_with(ServiceSpec::default);
        let kind = spec.type_.get_or_insert_with(|| "ClusterIP".into()).clone();
        let affinity = spec
            .session_affinity
            .get_or_insert_with(|| "None".into())
            .clone();
        if affinity == "ClientIP" {
            let cfg = spec
                .session_affinity_config
                .get_or_insert_with(SessionAffinityConfig::default);
            let ip = cfg.client_ip.get_or_insert_with(ClientIPConfig::default);
            ip.timeout_seconds.get_or_insert(DEFAULT_AFFINITY_TIMEOUT);
        }
        for p in spec.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
            let unset = match &p.target_port {
                None => true,
                Some(IntOrString::Int(0)) => true,
                Some(IntOrString::String(s)) => s.is_empty(),
                _ => false,
            };
            if unset {
                p.target_port = Some(IntOrString::Int(p.port));
            }
        }
        if kind == "ExternalName" {
            // ExternalName services have no IPs, so no IP families (Kubernetes clears them).
            spec.ip_families = None;
            spec.ip_family_policy = None;
            return;
        }
        spec.internal_traffic_policy
            .get_or_insert_with(|| "Cluster".into());
        let external_ips = spec
            .external_ips
            .as_ref()
            .is_some_and(|ips| !ips.is_empty());
        if kind == "NodePort" || kind == "LoadBalancer" || external_ips {
            spec.external_traffic_policy
                .get_or_insert_with(|| "Cluster".into());
        }
        if kind == "LoadBalancer" {
            spec.allocate_load_balancer_node_ports.get_or_insert(true);
        }
        let cluster_ip = spec.cluster_ip.clone().filter(|ip| !ip.is_empty());
        if let Some(ip) = &cluster_ip {
            if spec.cluster_ips.as_ref().is_none_or(Vec::is_empty) {
                spec.cluster_ips = Some(vec![ip.clone()]);
            }
        }
        let family = match cluster_ip.as_deref() {
            Some(ip) if ip.contains(':') => "IPv6",
            _ => "IPv4",
        };
        spec.ip_families.get_or_insert_with(|| vec![family.into()]);
        spec.ip_family_policy
            .get_or_insert_with(|| "SingleStack".into());
    });
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Service, old: Option<&Service>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1035Label,
        );
        let path = FieldPath::new("spec");
        let spec = new.spec.clone().unwrap_or_default();
        let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
        if !TYPES.contains(&kind) {
            errs.push(FieldError::not_supported(path.child("type"), kind, TYPES));
        }
        let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
        let headless = cluster_ip == "None";
        let ports = spec.ports.as_deref().unwrap_or(&[]);
        if ports.is_empty() && kind != "ExternalName" && !headless {
            errs.push(FieldError::required(path.child("ports")));
        }
        errs.extend(validate_ports(ports, kind, &path));
        if kind == "ExternalName" {
            let name = spec.external_name.as_deref().unwrap_or("");
            if name.is_empty() {
                errs.push(FieldError::required(path.child("externalName")));
            } else {
                errs.extend(invalid_each(
                    &path.child("externalName"),
                    name,
                    dns1123_subdomain_errors(name.trim_end_matches('.')),
                ));
            }
        } else if !cluster_ip.is_empty() && !headless && !is_ip(cluster_ip) {
            errs.push(FieldError::invalid(
                path.child("clusterIPs").index(0),
                cluster_ip,
                IP_MSG,
            ));
        }
        if let Some(a) = spec.session_affinity.as_deref() {
            if !AFFINITIES.contains(&a) {
                errs.push(FieldError::not_supported(
                    path.child("sessionAffinity"),
                    a,
                    AFFINITIES,
                ));
            }
        }
        if let Some(t) = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
        {
            if !(1..=86400).contains(&t) {
                errs.push(FieldError::invalid_number(
                    path.child("sessionAffinityConfig")
                        .child("clientIP")
                        .child("timeoutSeconds"),
                    t.into(),
                    "must be greater than 0 and less than 86400",
                ));
            }
        }
        for (field, value) in [
            ("externalTrafficPolicy", &spec.external_traffic_policy),
            ("internalTrafficPolicy", &spec.internal_traffic_policy),
        ] {
            if let Some(p) = value.as_deref() {
                if !TRAFFIC_POLICIES.contains(&p) {
                    errs.push(FieldError::not_supported(
                        path.child(field),
                        p,
                        TRAFFIC_POLICIES,
                    ));
                }
            }
        }
        errs.extend(validate_ip_families(&spec, kind, &path));
        if headless && (kind == "NodePort" || kind == "LoadBalancer") {
            errs.push(FieldError::invalid(
                path.child("clusterIPs").index(0),
                "None",
                &format!("may not be set to 'None' for {kind} services"),
            ));
        }
        // externalTrafficPolicy belongs to externally reachable Services; one that stops
        // being one keeps what it had until the next write sets it anew.
        let external = |s: &ServiceSpec| {
            matches!(s.type_.as_deref(), Some("NodePort" | "LoadBalancer"))
                || s.external_ips.as_ref().is_some_and(|ips| !ips.is_empty())
        };
        let was_external = old.is_some_and(|o| o.spec.as_ref().is_some_and(external));
        if let Some(p) = spec.external_traffic_policy.as_deref() {
            if !external(&spec) && !was_external {
                errs.push(FieldError::invalid(
                    path.child("externalTrafficPolicy"),
                    p,
                    "may only be set for externally-accessible services",
                ));
            }
        }
        if let Some(sel) = spec.selector.as_ref() {
            errs.extend(validate_labels(sel, &path.child("selector")));
        }
        for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
            if !is_ip(ip) {
                errs.push(FieldError::invalid(
                    path.child("externalIPs").index(i),
                    ip,
                    IP_MSG,
                ));
            }
        }
        if let Some(old) = old {
            let old_spec = old.spec.clone().unwrap_or_default();
            let old_ip = old_spec.cluster_ip.as_deref().unwrap_or("");
            let old_kind = old_spec.type_.as_deref().unwrap_or("ClusterIP");
            // Changing to or from ExternalName releases or allocates the IP; otherwise a set IP
            // stays. An empty new IP keeps the old one (the server carries it over).
            let allowed = old_ip.is_empty()
                || cluster_ip.is_empty()
                || kind == "ExternalName"
                || old_kind == "ExternalName";
            if !allowed && cluster_ip != old_ip {
                errs.push(immutable_value(path.child("clusterIP"), cluster_ip));
            }
        }
        errs
    })
}

/// `ipFamilies` and `ipFamilyPolicy` on their own (Kubernetes' validateIPFamilies and the
/// policy checks); whether the cluster has the families is the allocator's to say.
fn validate_ip_families(spec: &ServiceSpec, kind: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let families = spec.ip_families.as_deref().unwrap_or(&[]);
    if kind == "ExternalName" {
        return errs;
    }
    let policy = spec.ip_family_policy.as_deref();
    if let Some(p) = policy {
        if !IP_FAMILY_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("ipFamilyPolicy"),
                p,
                IP_FAMILY_POLICIES,
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for (i, f) in families.iter().enumerate() {
        let fp = path.child("ipFamilies").index(i);
        if !IP_FAMILIES.contains(&f.as_str()) {
            errs.push(FieldError::not_supported(fp, f, IP_FAMILIES));
        } else if !seen.insert(f.as_str()) {
            errs.push(FieldError::duplicate(fp, f));
        }
    }
    if families.len() > 2 {
        errs.push(FieldError::invalid(
            path.child("ipFamilies"),
            format!("{families:?}"),
            "may specify no more than two IP families",
        ));
    }
    if policy == Some("SingleStack") {
        if spec.cluster_ips.as_ref().is_some_and(|ips| ips.len() == 2) {
            errs.push(FieldError::invalid(
                path.child("ipFamilyPolicy"),
                "SingleStack",
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified",
            ));
        }
        if families.len() == 2 {
            errs.push(FieldError::invalid(
                path.child("ipFamilyPolicy"),
                "SingleStack",
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
            ));
        }
    }
    errs
}

fn validate_ports(ports: &[ServicePort], kind: &str, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut names = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let pp = path.child("ports").index(i);
        match p.name.as_deref().filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => errs.push(FieldError::required(pp.child("name"))),
            None => {}
            Some(n) => {
                errs.extend(invalid_each(&pp.child("name"), n, dns1123_label_errors(n)));
                if !names.insert(n) {
                    errs.push(FieldError::duplicate(pp.child("name"), n));
                }
            }
        }
        if !(1..=65535).contains(&p.port) {
            errs.push(FieldError::invalid_number(
                pp.child("port"),
                p.port.into(),
                PORT_RANGE_MSG,
            ));
        }
        let protocol = p.protocol.as_deref().unwrap_or("TCP");
        if !PROTOCOLS.contains(&protocol) {
            errs.push(FieldError::not_supported(
                pp.child("protocol"),
                protocol,
                PROTOCOLS,
            ));
        }
        if !seen.insert((p.port, protocol)) {
            errs.push(FieldError::duplicate(&pp, format!("{}/{protocol}", p.port)));
        }
        match &p.target_port {
            Some(IntOrString::Int(t)) if !(1..=65535).contains(t) => errs.push(
                FieldError::invalid_number(pp.child("targetPort"), (*t).into(), PORT_RANGE_MSG),
            ),
            Some(IntOrString::String(s)) => errs.extend(invalid_each(
                &pp.child("targetPort"),
                s,
                port_name_errors(s),
            )),
            _ => {}
        }
        if let Some(np) = p.node_port.filter(|n| *n != 0) {
            if kind == "ClusterIP" || kind == "ExternalName" {
                errs.push(FieldError::forbidden(
                    pp.child("nodePort"),
                    &format!("may not be used when `type` is '{kind}'"),
                ));
            } else if !(1..=65535).contains(&np) {
                errs.push(FieldError::invalid_number(
                    pp.child("nodePort"),
                    np.into(),
                    PORT_RANGE_MSG,
                ));
            }
        }
    }
    errs
}

pub fn columns() -> Vec<TableColumnDefinition> {
    use ColumnType::String as S;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Type", S, "type determines how the Service is exposed."),
        TableColumnDefinition::new("Cluster-IP", S, "clusterIP is the IP address of the service and is usually assigned randomly."),
        TableColumnDefinition::new("External-IP", S, "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service."),
        TableColumnDefinition::new("Port(s)", S, "The list of ports that are exposed by this service."),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("Selector", S, "Route service traffic to pods with label keys and values matching this selector.").wide(),
    ]
}

/// kubectl's `printService`.
pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(svc) = decode::<Service>(v) else {
        return default_row(v, now);
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let kind = spec.type_.clone().unwrap_or_default();
    let cluster_ip = spec
        .cluster_ips
        .as_ref()
        .and_then(|ips| ips.first().cloned())
        .or(spec.cluster_ip.clone())
        .filter(|ip| !ip.is_empty())
        .unwrap_or_else(|| "<none>".into());
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            match p.node_port.filter(|n| *n > 0) {
                Some(np) => format!("{}:{np}/{proto}", p.port),
                None => format!("{}/{proto}", p.port),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    };
    vec![
        name_cell(&svc.metadata),
        Value::from(kind),
        Value::from(cluster_ip),
        Value::from(external_ip(&svc)),
        Value::from(ports),
        age_cell(&svc.metadata, now),
        Value::from(format_labels(spec.selector.as_ref())),
    ]
}

fn external_ip(svc: &Service) -> String {
    let spec = svc.spec.clone().unwrap_or_default();
    let external: Vec<String> = spec.external_ips.clone().unwrap_or_default();
    match spec.type_.as_deref().unwrap_or("") {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let mut ips: Vec<String> = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or(i.hostname.clone()))
                .collect();
            ips.extend(external);
            if ips.is_empty() {
                "<pending>".into()
            } else {
                ips.join(",")
            }
        }
        "ExternalName" => spec.external_name.clone().unwrap_or_default(),
        _ => "<unknown>".into(),
    }
}

pub fn field(v: &Value, field: &str) -> Option<String> {
    match field {
        "spec.clusterIP" => Some(scalar_at(v, "/spec/clusterIP")),
        "spec.type" => Some(scalar_at(v, "/spec/type")),
        _ => meta_field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    /// What `kubectl expose deployment web --port=80` sends.
    fn exposed() -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "creationTimestamp": "2025-01-01T11:59:55Z"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}], "selector": {"app": "web"}},
            "status": {"loadBalancer": {}}})
    }

    fn errors(v: &Value, old: Option<&Value>) -> Vec<String> {
        validate(v, old)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn defaults() {
        let mut v = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"},
            "spec": {"sessionAffinity": "ClientIP", "ports": [{"port": 443}]}});
        default(&mut v);
        let spec = &v["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(
            spec["ports"][0],
            json!({"port": 443, "protocol": "TCP", "targetPort": 443})
        );
        assert_eq!(
            spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            10800
        );
        assert_eq!(spec["internalTrafficPolicy"], "Cluster");
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert!(spec.get("externalTrafficPolicy").is_none());
        let mut np = exposed();
        np["spec"]["type"] = json!("NodePort");
        np["spec"]["clusterIP"] = json!("10.96.0.10");
        default(&mut np);
        assert_eq!(np["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(np["spec"]["clusterIPs"], json!(["10.96.0.10"]));
        assert_eq!(np["spec"]["sessionAffinity"], "None");
    }

    #[test]
    fn validation() {
        let mut v = exposed();
        default(&mut v);
        assert!(errors(&v, None).is_empty());
        let mut bad = v.clone();
        bad["metadata"]["name"] = json!("1web");
        bad["spec"]["type"] = json!("Magic");
        bad["spec"]["ports"] =
            json!([{"port": 0, "nodePort": 30080}, {"port": 80, "targetPort": "-bad"}]);
        let errs = errors(&bad, None);
        for e in [
            "spec.type: Unsupported value: \"Magic\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
            "spec.ports[0].name: Required value",
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.ports[1].name: Required value",
        ] {
            assert!(errs.iter().any(|x| x == e), "missing {e:?} in {errs:#?}");
        }
        assert!(errs
            .iter()
            .any(|e| e.starts_with("metadata.name: Invalid value: \"1web\": a DNS-1035 label")));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("spec.ports[1].targetPort: Invalid value: \"-bad\"")));
        let mut np_on_cluster_ip = v.clone();
        np_on_cluster_ip["spec"]["ports"][0]["nodePort"] = json!(30080);
        assert_eq!(
            errors(&np_on_cluster_ip, None),
            vec!["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"]
        );
        let mut no_ports = v.clone();
        no_ports["spec"]["ports"] = json!([]);
        assert_eq!(errors(&no_ports, None), vec!["spec.ports: Required value"]);
        let mut headless = no_ports.clone();
        headless["spec"]["clusterIP"] = json!("None");
        assert!(errors(&headless, None).is_empty());
        let mut bad_ip = v.clone();
        bad_ip["spec"]["clusterIP"] = json!("10.96.0.300");
        assert_eq!(errors(&bad_ip, None), vec!["spec.clusterIPs[0]: Invalid value: \"10.96.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]);
    }

    #[test]
    fn external_policy_and_headless_node_ports_as_kubernetes() {
        let mut v = exposed();
        v["spec"]["externalTrafficPolicy"] = json!("Local");
        default(&mut v);
        assert_eq!(
            errors(&v, None),
            vec!["spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services"]
        );
        let mut np = exposed();
        np["spec"]["type"] = json!("NodePort");
        default(&mut np);
        assert!(errors(&np, None).is_empty());
        // A NodePort Service turned ClusterIP keeps its policy through that update.
        let mut back = np.clone();
        back["spec"]["type"] = json!("ClusterIP");
        assert!(
            errors(&back, Some(&np)).is_empty(),
            "{:?}",
            errors(&back, Some(&np))
        );
        let mut headless = exposed();
        headless["spec"]["type"] = json!("NodePort");
        headless["spec"]["clusterIP"] = json!("None");
        default(&mut headless);
        assert!(errors(&headless, None).contains(
            &"spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services".to_string()
        ));
    }

    #[test]
    fn ip_families_are_checked_on_their_own() {
        let mut v = exposed();
        v["spec"]["ipFamilies"] = json!(["IPv5", "IPv4", "IPv4"]);
        v["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        default(&mut v);
        let errs = errors(&v, None);
        assert!(errs.contains(&"spec.ipFamilies[0]: Unsupported value: \"IPv5\": supported values: \"IPv4\", \"IPv6\"".to_string()), "{errs:?}");
        assert!(
            errs.contains(&"spec.ipFamilies[2]: Duplicate value: \"IPv4\"".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("may specify no more than two IP families")),
            "{errs:?}"
        );
        let mut v = exposed();
        v["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
        v["spec"]["ipFamilyPolicy"] = json!("Sometimes");
        default(&mut v);
        assert_eq!(
            errors(&v, None),
            vec!["spec.ipFamilyPolicy: Unsupported value: \"Sometimes\": supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""]
        );
        let mut external = exposed();
        external["spec"]["type"] = json!("ExternalName");
        external["spec"]["externalName"] = json!("example.com");
        external["spec"]["ipFamilies"] = json!(["IPv4"]);
        default(&mut external);
        assert!(
            external["spec"].get("ipFamilies").is_none(),
            "cleared for ExternalName"
        );
    }

    #[test]
    fn cluster_ip_is_immutable_once_set() {
        let mut unset = exposed();
        default(&mut unset);
        let mut set = unset.clone();
        set["spec"]["clusterIP"] = json!("10.96.0.10");
        assert!(
            errors(&set, Some(&unset)).is_empty(),
            "setting it the first time is fine"
        );
        let mut changed = set.clone();
        changed["spec"]["clusterIP"] = json!("10.96.0.11");
        assert_eq!(
            errors(&changed, Some(&set)),
            vec!["spec.clusterIP: Invalid value: \"10.96.0.11\": field is immutable"]
        );
        let mut external = changed.clone();
        external["spec"]["type"] = json!("ExternalName");
        external["spec"]["externalName"] = json!("example.com");
        external["spec"]["clusterIP"] = json!("");
        assert!(errors(&external, Some(&set)).is_empty());
    }

    #[test]
    fn rows_like_kubectl() {
        let mut v = exposed();
        v["spec"]["clusterIP"] = json!("10.96.0.10");
        default(&mut v);
        // NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE SELECTOR
        assert_eq!(
            row(&v, now()),
            vec![
                json!("web"),
                json!("ClusterIP"),
                json!("10.96.0.10"),
                json!("<none>"),
                json!("80/TCP"),
                json!("5s"),
                json!("app=web")
            ]
        );
        let mut np = v.clone();
        np["spec"]["type"] = json!("NodePort");
        np["spec"]["ports"][0]["nodePort"] = json!(30080);
        np["spec"]["ports"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}));
        assert_eq!(row(&np, now())[4], "80:30080/TCP,53:30053/UDP");
        let mut lb = v.clone();
        lb["spec"]["type"] = json!("LoadBalancer");
        assert_eq!(row(&lb, now())[3], "<pending>");
        lb["status"]["loadBalancer"]["ingress"] = json!([{"ip": "192.0.2.1"}]);
        assert_eq!(row(&lb, now())[3], "192.0.2.1");
        let mut headless = v.clone();
        headless["spec"]["clusterIP"] = json!("None");
        headless["spec"]["clusterIPs"] = json!(["None"]);
        headless["spec"].as_object_mut().unwrap().remove("selector");
        let cells = row(&headless, now());
        assert_eq!(cells[2], "None");
        assert_eq!(cells[6], "<none>");
        assert_eq!(field(&v, "spec.clusterIP").as_deref(), Some("10.96.0.10"));
        assert_eq!(field(&v, "spec.type").as_deref(), Some("ClusterIP"));
    }
}
