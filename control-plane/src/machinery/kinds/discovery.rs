//! discovery.k8s.io/v1 EndpointSlice: port defaults, validation (address type fixed once set,
//! addresses matching it, ports, at most 1000 endpoints and 100 ports), kubectl's columns.

use std::collections::BTreeSet;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, name_cell, validate_typed, IP_MSG,
    PROTOCOLS,
};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_label_errors, dns1123_subdomain_errors, immutable_value, invalid_each, FieldPath,
    NameRule, Scope,
};

const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const MAX_ENDPOINTS: usize = 1000;
const MAX_PORTS: usize = 100;
const MAX_ADDRESSES: usize = 100;

pub fn default(v: &mut Value) {
    default_typed(v, |s: &mut EndpointSlice| {
        for p in s.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
            p.name.get_or_insert_with(String::new);
        }
    });
}

fn address_errors(kind: &str, address: &str) -> Vec<String> {
    let parsed = address.parse::<std::net::IpAddr>();
    match kind {
        "IPv4" if !matches!(parsed, Ok(std::net::IpAddr::V4(_))) => vec![IP_MSG.into()],
        "IPv6" if !matches!(parsed, Ok(std::net::IpAddr::V6(_))) => vec![IP_MSG.into()],
        "FQDN" => dns1123_subdomain_errors(address),
        _ => vec![],
    }
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &EndpointSlice, old: Option<&EndpointSlice>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            let kind = new.address_type.as_str();
            if kind.is_empty() {
                errs.push(FieldError::required("addressType"));
            } else if !ADDRESS_TYPES.contains(&kind) {
                errs.push(FieldError::not_supported(
                    "addressType",
                    kind,
                    ADDRESS_TYPES,
                ));
            }
            if new.endpoints.len() > MAX_ENDPOINTS {
                errs.push(FieldError::new(
                    crate::machinery::status::CauseType::TooMany,
                    "endpoints",
                    format!(
                        "Too many: {}: must have at most {MAX_ENDPOINTS} items",
                        new.endpoints.len()
                    ),
                ));
            }
            for (i, e) in new.endpoints.iter().enumerate() {
                let ep = FieldPath::new("endpoints").index(i).child("addresses");
                if e.addresses.is_empty() || e.addresses.len() > MAX_ADDRESSES {
                    errs.push(FieldError::invalid_number(
                        &ep,
                        e.addresses.len() as i64,
                        "must contain at least 1 and at most 100 addresses",
                    ));
                }
                for (j, a) in e.addresses.iter().enumerate() {
                    errs.extend(invalid_each(&ep.index(j), a, address_errors(kind, a)));
                }
            }
            let ports = new.ports.as_deref().unwrap_or(&[]);
            if ports.len() > MAX_PORTS {
                errs.push(FieldError::new(
                    crate::machinery::status::CauseType::TooMany,
                    "ports",
                    format!(
                        "Too many: {}: must have at most {MAX_PORTS} items",
                        ports.len()
                    ),
                ));
            }
            let mut names = BTreeSet::new();
            for (i, p) in ports.iter().enumerate() {
                let pp = FieldPath::new("ports").index(i);
                let name = p.name.as_deref().unwrap_or("");
                if !name.is_empty() {
                    errs.extend(invalid_each(
                        &pp.child("name"),
                        name,
                        dns1123_label_errors(name),
                    ));
                }
                if !names.insert(name) {
                    errs.push(FieldError::duplicate(pp.child("name"), name));
                }
                if let Some(port) = p.port.filter(|p| !(0..=65535).contains(p)) {
                    errs.push(FieldError::invalid_number(
                        pp.child("port"),
                        port.into(),
                        "must be between 0 and 65535, inclusive",
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
            }
            if let Some(old) = old {
                if old.address_type != new.address_type {
                    errs.push(immutable_value("addressType", kind));
                }
            }
            errs
        },
    )
}

pub fn columns() -> Vec<TableColumnDefinition> {
    use ColumnType::String as S;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "AddressType",
            S,
            "addressType specifies the type of address carried by this EndpointSlice.",
        ),
        TableColumnDefinition::new(
            "Ports",
            S,
            "ports specifies the list of network ports exposed by each endpoint in this slice.",
        ),
        TableColumnDefinition::new(
            "Endpoints",
            S,
            "endpoints is a list of unique endpoints in this slice.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

/// Up to three items, then `+ N more...`; `<unset>` when empty (kubectl's listWithMoreString).
fn list_with_more(items: Vec<String>) -> String {
    const MAX: usize = 3;
    if items.is_empty() {
        return "<unset>".into();
    }
    if items.len() > MAX {
        format!("{} + {} more...", items[..MAX].join(","), items.len() - MAX)
    } else {
        items.join(",")
    }
}

pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(s) = decode::<EndpointSlice>(v) else {
        return default_row(v, now);
    };
    let ports: Vec<String> = s
        .ports
        .iter()
        .flatten()
        .map(|p| match (p.port, p.name.as_deref()) {
            (Some(port), _) => port.to_string(),
            (None, Some(name)) if !name.is_empty() => name.to_string(),
            _ => "*".to_string(),
        })
        .collect();
    let addresses: Vec<String> = s
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    vec![
        name_cell(&s.metadata),
        Value::from(s.address_type.clone()),
        Value::from(list_with_more(ports)),
        Value::from(list_with_more(addresses)),
        age_cell(&s.metadata, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn slice() -> Value {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc12", "namespace": "default", "creationTimestamp": "2025-01-01T11:59:50Z",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}},
                          {"addresses": ["10.244.2.7"], "conditions": {"ready": false}}],
            "ports": [{"name": "http", "port": 8080}]})
    }

    #[test]
    fn rows_and_defaults() {
        let mut v = slice();
        default(&mut v);
        assert_eq!(v["ports"][0]["protocol"], "TCP");
        assert!(validate(&v, None).is_empty());
        // NAME ADDRESSTYPE PORTS ENDPOINTS AGE
        assert_eq!(
            row(&v, now()),
            vec![
                json!("web-abc12"),
                json!("IPv4"),
                json!("8080"),
                json!("10.244.1.5,10.244.2.7"),
                json!("10s")
            ]
        );
        let mut empty = v.clone();
        empty["endpoints"] = json!([]);
        empty["ports"] = json!([]);
        assert_eq!(
            &row(&empty, now())[2..4],
            &[json!("<unset>"), json!("<unset>")]
        );
        let mut many = v.clone();
        many["endpoints"] = json!((1..=5)
            .map(|i| json!({"addresses": [format!("10.0.0.{i}")]}))
            .collect::<Vec<_>>());
        assert_eq!(
            row(&many, now())[3],
            "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more..."
        );
    }

    #[test]
    fn validation() {
        let v = slice();
        let mut bad = v.clone();
        bad["endpoints"][0]["addresses"][0] = json!("fe80::1");
        bad["ports"][0]["protocol"] = json!("ICMP");
        let errs: Vec<String> = validate(&bad, None).into_iter().map(|e| e.field).collect();
        assert_eq!(errs, ["endpoints[0].addresses[0]", "ports[0].protocol"]);
        let mut v6 = v.clone();
        v6["addressType"] = json!("IPv6");
        v6["endpoints"] = json!([{"addresses": ["fd00::5"]}]);
        assert!(validate(&v6, None).is_empty());
        assert_eq!(
            validate(&v6, Some(&v))[0].message,
            "Invalid value: \"IPv6\": field is immutable"
        );
    }
}
