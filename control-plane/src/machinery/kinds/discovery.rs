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
