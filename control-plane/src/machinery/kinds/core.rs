//! The small core/v1 kinds: Namespace, ConfigMap, Secret, ServiceAccount, Binding and
//! Endpoints. Their defaults, validation (data keys and size, immutable ConfigMaps and
//! Secrets, Secret types), kubectl's columns and field selectors.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, Endpoints, Namespace, NamespaceSpec, NamespaceStatus, Secret,
    ServiceAccount,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, config_key_errors, decode, default_row, default_typed, is_ip, meta_errors,
    meta_field, name_cell, scalar_at, validate_typed, IP_MSG, PORT_RANGE_MSG, PROTOCOLS,
};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_label_errors, immutable_value, invalid_each, FieldPath, NameRule, Scope,
};

/// ConfigMaps and Secrets hold at most 1 MiB of data.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

// ---------------------------------------------------------------- Namespace

pub fn default_namespace(v: &mut Value) {
    default_typed(v, |ns: &mut Namespace| {
        let spec = ns.spec.get_or_insert_with(NamespaceSpec::default);
        spec.finalizers
            .get_or_insert_with(|| vec!["kubernetes".into()]);
        let status = ns.status.get_or_insert_with(NamespaceStatus::default);
        status.phase.get_or_insert_with(|| "Active".into());
    });
}

pub fn validate_namespace(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Namespace, old: Option<&Namespace>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::Dns1123Label,
        );
        for (i, f) in new
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
        {
            let p = FieldPath::new("spec").child("finalizers").index(i);
            errs.extend(invalid_each(
                &p,
                f,
                crate::machinery::validation::qualified_name_errors(f),
            ));
        }
        errs
    })
}

pub fn namespace_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Status", ColumnType::String, "The status of the namespace"),
        TableColumnDefinition::age_column(),
    ]
}

pub fn namespace_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(ns) = decode::<Namespace>(v) else {
        return default_row(v, now);
    };
    let phase = ns
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    vec![
        name_cell(&ns.metadata),
        Value::from(phase),
        age_cell(&ns.metadata, now),
    ]
}

pub fn namespace_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "status.phase" => Some(scalar_at(v, "/status/phase")),
        _ => meta_field(v, field),
    }
}

// ---------------------------------------------------------------- ConfigMap and Secret

/// Keys valid and not repeated across the two maps, total size within 1 MiB.
/// Each map is (field, [(key, bytes of key and value)]).
type DataMap<'a> = (&'static str, Vec<(&'a str, usize)>);

fn validate_data(maps: [DataMap<'_>; 2]) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut keys = BTreeSet::new();
    let mut total = 0usize;
    for (field, entries) in maps {
        for (k, size) in entries {
            let p = FieldPath::new(field).key(k);
            errs.extend(invalid_each(&p, k, config_key_errors(k)));
            if !keys.insert(k) {
                errs.push(FieldError::duplicate(&p, k));
            }
            total += size;
        }
    }
    if total > MAX_DATA_BYTES {
        errs.push(FieldError::too_long("data", MAX_DATA_BYTES));
    }
    errs
}

/// With `immutable: true`, the data may not change and the flag may not be cleared.
fn validate_immutable(
    old_immutable: Option<bool>,
    new_immutable: Option<bool>,
    data_changed: bool,
) -> Vec<FieldError> {
    let mut errs = vec![];
    if old_immutable == Some(true) {
        if new_immutable != Some(true) {
            errs.push(FieldError::forbidden(
                "immutable",
                "field is immutable when `immutable` is set",
            ));
        }
        if data_changed {
            errs.push(FieldError::forbidden(
                "data",
                "field is immutable when `immutable` is set",
            ));
        }
    }
    errs
}

pub fn validate_config_map(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &ConfigMap, old: Option<&ConfigMap>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        errs.extend(validate_data([
            (
                "data",
                new.data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), k.len() + v.len()))
                    .collect(),
            ),
            (
                "binaryData",
                new.binary_data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), k.len() + v.0.len()))
                    .collect(),
            ),
        ]));
        if let Some(old) = old {
            let changed = old.data != new.data || old.binary_data != new.binary_data;
            errs.extend(validate_immutable(old.immutable, new.immutable, changed));
        }
        errs
    })
}

pub fn config_map_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Data",
            ColumnType::String,
            "Data contains the configuration data.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn config_map_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(cm) = decode::<ConfigMap>(v) else {
        return default_row(v, now);
    };
    let n =
        cm.data.as_ref().map_or(0, |d| d.len()) + cm.binary_data.as_ref().map_or(0, |d| d.len());
    vec![
        name_cell(&cm.metadata),
        Value::from(n),
        age_cell(&cm.metadata, now),
    ]
}

pub fn default_secret(v: &mut Value) {
    default_typed(v, |s: &mut Secret| {
        if s.type_.as_deref().unwrap_or("").is_empty() {
            s.type_ = Some("Opaque".into());
        }
    });
}

/// Keys a Secret of a built-in type must carry.
fn required_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "kubernetes.io/tls" => &["tls.crt", "tls.key"],
        "kubernetes.io/dockerconfigjson" => &[".dockerconfigjson"],
        "kubernetes.io/dockercfg" => &[".dockercfg"],
        "kubernetes.io/basic-auth" => &[],
        "kubernetes.io/ssh-auth" => &["ssh-privatekey"],
        _ => &[],
    }
}

pub fn validate_secret(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Secret, old: Option<&Secret>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        errs.extend(validate_data([
            (
                "data",
                new.data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), k.len() + v.0.len()))
                    .collect(),
            ),
            (
                "stringData",
                new.string_data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), k.len() + v.len()))
                    .collect(),
            ),
        ]));
        let kind = new.type_.as_deref().unwrap_or("Opaque");
        let has = |k: &str| {
            new.data.as_ref().is_some_and(|d| d.contains_key(k))
                || new.string_data.as_ref().is_some_and(|d| d.contains_key(k))
        };
        for key in required_keys(kind) {
            if !has(key) {
                errs.push(FieldError::required(FieldPath::new("data").key(key)));
            }
        }
        if kind == "kubernetes.io/service-account-token"
            && new
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/service-account.name"))
                .is_none_or(|n| n.is_empty())
        {
            errs.push(FieldError::required(
                FieldPath::new("metadata")
                    .child("annotations")
                    .key("kubernetes.io/service-account.name"),
            ));
        }
        if let Some(old) = old {
            let old_kind = old.type_.as_deref().unwrap_or("Opaque");
            if old_kind != kind {
                errs.push(immutable_value("type", kind));
            }
            let changed = old.data != new.data || new.string_data.is_some();
            errs.extend(validate_immutable(old.immutable, new.immutable, changed));
        }
        errs
    })
}

pub fn secret_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Type",
            ColumnType::String,
            "Used to facilitate programmatic handling of secret data.",
        ),
        TableColumnDefinition::new("Data", ColumnType::String, "Data contains the secret data."),
        TableColumnDefinition::age_column(),
    ]
}

pub fn secret_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(s) = decode::<Secret>(v) else {
        return default_row(v, now);
    };
    vec![
        name_cell(&s.metadata),
        Value::from(s.type_.clone().unwrap_or_default()),
        Value::from(s.data.as_ref().map_or(0, |d| d.len())),
        age_cell(&s.metadata, now),
    ]
}

pub fn secret_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "type" => Some(scalar_at(v, "/type")),
        _ => meta_field(v, field),
    }
}

// ---------------------------------------------------------------- ServiceAccount

pub fn validate_service_account(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &ServiceAccount, old: Option<&ServiceAccount>| {
            meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            )
        },
    )
}

pub fn service_account_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Secrets", ColumnType::String, "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use."),
        TableColumnDefinition::age_column(),
    ]
}

pub fn service_account_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(sa) = decode::<ServiceAccount>(v) else {
        return default_row(v, now);
    };
    vec![
        name_cell(&sa.metadata),
        Value::from(sa.secrets.as_ref().map_or(0, |s| s.len())),
        age_cell(&sa.metadata, now),
    ]
}

// ---------------------------------------------------------------- Binding

pub fn validate_binding(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Binding, old: Option<&Binding>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let target = FieldPath::new("target");
        if new.target.name.as_deref().unwrap_or("").is_empty() {
            errs.push(FieldError::required(target.child("name")));
        }
        let kind = new.target.kind.as_deref().unwrap_or("");
        if !kind.is_empty() && kind != "Node" {
            errs.push(FieldError::invalid(
                target.child("kind"),
                kind,
                "must be empty or 'Node'",
            ));
        }
        let api_version = new.target.api_version.as_deref().unwrap_or("");
        if !api_version.is_empty() && api_version != "v1" {
            errs.push(FieldError::invalid(
                target.child("apiVersion"),
                api_version,
                "must be empty or 'v1'",
            ));
        }
        errs
    })
}

// ---------------------------------------------------------------- Endpoints

pub fn default_endpoints(v: &mut Value) {
    default_typed(v, |e: &mut Endpoints| {
        for s in e.subsets.iter_mut().flatten() {
            for p in s.ports.iter_mut().flatten() {
                p.protocol.get_or_insert_with(|| "TCP".into());
            }
        }
    });
}

pub fn validate_endpoints(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Endpoints, old: Option<&Endpoints>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        for (i, s) in new.subsets.iter().flatten().enumerate() {
            let sp = FieldPath::new("subsets").index(i);
            for (field, list) in [
                ("addresses", &s.addresses),
                ("notReadyAddresses", &s.not_ready_addresses),
            ] {
                for (j, a) in list.iter().flatten().enumerate() {
                    if !is_ip(&a.ip) {
                        errs.push(FieldError::invalid(
                            sp.child(field).index(j).child("ip"),
                            &a.ip,
                            IP_MSG,
                        ));
                    }
                }
            }
            let ports = s.ports.as_deref().unwrap_or(&[]);
            for (j, p) in ports.iter().enumerate() {
                let pp = sp.child("ports").index(j);
                if !(1..=65535).contains(&p.port) {
                    errs.push(FieldError::invalid_number(
                        pp.child("port"),
                        p.port.into(),
                        PORT_RANGE_MSG,
                    ));
                }
                let proto = p.protocol.as_deref().unwrap_or("TCP");
                if !PROTOCOLS.contains(&proto) {
                    errs.push(FieldError::not_supported(
                        pp.child("protocol"),
                        proto,
                        PROTOCOLS,
                    ));
                }
                match p.name.as_deref().filter(|n| !n.is_empty()) {
                    Some(n) => {
                        errs.extend(invalid_each(&pp.child("name"), n, dns1123_label_errors(n)))
                    }
                    None if ports.len() > 1 => errs.push(FieldError::required(pp.child("name"))),
                    None => {}
                }
            }
        }
        errs
    })
}

pub fn endpoints_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Endpoints",
            ColumnType::String,
            "The set of all endpoints is the union of all subsets.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

/// kubectl's `formatEndpoints`: up to three `ip:port`, then `+ N more...`.
pub fn endpoints_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(e) = decode::<Endpoints>(v) else {
        return default_row(v, now);
    };
    const MAX: usize = 3;
    let mut list = vec![];
    let mut count = 0usize;
    for s in e.subsets.iter().flatten() {
        let addresses = s.addresses.as_deref().unwrap_or(&[]);
        match s.ports.as_deref() {
            None | Some([]) => {
                count += addresses.len();
                list.extend(addresses.iter().map(|a| a.ip.clone()));
            }
            Some(ports) => {
                for p in ports {
                    count += addresses.len();
                    list.extend(addresses.iter().map(|a| {
                        if a.ip.contains(':') {
                            format!("[{}]:{}", a.ip, p.port)
                        } else {
                            format!("{}:{}", a.ip, p.port)
                        }
                    }));
                }
            }
        }
    }
    let text = if e.subsets.as_ref().is_none_or(Vec::is_empty) {
        "<none>".to_string()
    } else if count > MAX {
        format!("{} + {} more...", list[..MAX].join(","), count - MAX)
    } else {
        list.join(",")
    };
    vec![
        name_cell(&e.metadata),
        Value::from(text),
        age_cell(&e.metadata, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn errors(errs: Vec<FieldError>) -> Vec<String> {
        errs.into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn namespaces() {
        let mut v = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "creationTimestamp": "2025-01-01T11:00:00Z"}});
        default_namespace(&mut v);
        assert_eq!(v["spec"], json!({"finalizers": ["kubernetes"]}));
        assert_eq!(v["status"], json!({"phase": "Active"}));
        assert!(validate_namespace(&v, None).is_empty());
        assert_eq!(
            namespace_row(&v, now()),
            vec![json!("team-a"), json!("Active"), json!("60m")]
        );
        assert_eq!(
            namespace_field(&v, "status.phase").as_deref(),
            Some("Active")
        );
        let mut dotted = v.clone();
        dotted["metadata"]["name"] = json!("team.a");
        assert!(validate_namespace(&dotted, None)[0]
            .message
            .contains("RFC 1123 label"));
    }

    #[test]
    fn config_maps() {
        let v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default", "creationTimestamp": "2025-01-01T11:59:00Z"},
            "data": {"app.conf": "x=1", "MODE": "prod"}, "binaryData": {"blob": "AAEC"}});
        assert!(validate_config_map(&v, None).is_empty());
        assert_eq!(
            config_map_row(&v, now()),
            vec![json!("cfg"), json!(3), json!("60s")]
        );
        let mut bad = v.clone();
        bad["data"]["bad key"] = json!("v");
        bad["binaryData"]["MODE"] = json!("AA==");
        let errs = errors(validate_config_map(&bad, None));
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("data[bad key]: Invalid value: \"bad key\": a valid config key")
        );
        assert_eq!(errs[1], "binaryData[MODE]: Duplicate value: \"MODE\"");
        let mut big = v.clone();
        big["data"]["big"] = json!("x".repeat(MAX_DATA_BYTES));
        assert_eq!(
            errors(validate_config_map(&big, None)),
            vec!["data: Too long: may not be more than 1048576 bytes"]
        );
        let mut frozen = v.clone();
        frozen["immutable"] = json!(true);
        let mut changed = frozen.clone();
        changed["data"]["MODE"] = json!("dev");
        assert_eq!(
            errors(validate_config_map(&changed, Some(&frozen))),
            vec!["data: Forbidden: field is immutable when `immutable` is set"]
        );
        let mut thawed = frozen.clone();
        thawed["immutable"] = json!(false);
        assert_eq!(
            errors(validate_config_map(&thawed, Some(&frozen))),
            vec!["immutable: Forbidden: field is immutable when `immutable` is set"]
        );
        assert!(
            validate_config_map(&frozen, Some(&v)).is_empty(),
            "making it immutable is an update like any other"
        );
    }

    #[test]
    fn secrets() {
        let mut v = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default", "creationTimestamp": "2025-01-01T11:59:30Z"},
            "data": {"password": "aHVudGVyMg=="}});
        default_secret(&mut v);
        assert_eq!(v["type"], "Opaque");
        assert!(validate_secret(&v, None).is_empty());
        assert_eq!(
            secret_row(&v, now()),
            vec![json!("s"), json!("Opaque"), json!(1), json!("30s")]
        );
        assert_eq!(secret_field(&v, "type").as_deref(), Some("Opaque"));
        let mut retyped = v.clone();
        retyped["type"] = json!("kubernetes.io/tls");
        let errs = errors(validate_secret(&retyped, Some(&v)));
        assert_eq!(
            errs,
            vec![
                "data[tls.crt]: Required value",
                "data[tls.key]: Required value",
                "type: Invalid value: \"kubernetes.io/tls\": field is immutable",
            ]
        );
    }

    #[test]
    fn service_accounts_and_bindings() {
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "default", "creationTimestamp": "2025-01-01T10:00:00Z"}});
        assert!(validate_service_account(&sa, None).is_empty());
        assert_eq!(
            service_account_row(&sa, now()),
            vec![json!("default"), json!(0), json!("120m")]
        );
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web-1", "namespace": "default"}, "target": {"kind": "Pod", "name": ""}});
        assert_eq!(
            errors(validate_binding(&binding, None)),
            vec![
                "target.name: Required value",
                "target.kind: Invalid value: \"Pod\": must be empty or 'Node'",
            ]
        );
    }

    #[test]
    fn endpoints() {
        let mut v = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default", "creationTimestamp": "2025-01-01T11:59:58Z"},
            "subsets": [{"addresses": [{"ip": "10.244.1.5"}, {"ip": "10.244.2.7"}], "ports": [{"port": 80}]},
                        {"addresses": [{"ip": "10.244.3.2"}, {"ip": "10.244.3.3"}], "ports": [{"port": 80}]}]});
        default_endpoints(&mut v);
        assert_eq!(v["subsets"][0]["ports"][0]["protocol"], "TCP");
        assert!(validate_endpoints(&v, None).is_empty());
        // kubectl: ENDPOINTS shows three, then the rest as "+ N more...".
        assert_eq!(
            endpoints_row(&v, now())[1],
            "10.244.1.5:80,10.244.2.7:80,10.244.3.2:80 + 1 more..."
        );
        let empty = json!({"metadata": {"name": "web", "namespace": "default"}});
        assert_eq!(endpoints_row(&empty, now())[1], "<none>");
        let mut bad = v.clone();
        bad["subsets"][0]["addresses"][0]["ip"] = json!("nope");
        assert_eq!(
            validate_endpoints(&bad, None)[0].field,
            "subsets[0].addresses[0].ip"
        );
    }
}
