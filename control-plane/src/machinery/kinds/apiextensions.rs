//! apiextensions.k8s.io/v1 CustomResourceDefinition: defaulting, Kubernetes' validation of a
//! definition (names, scope, versions, the structural schema of each version compiled by
//! `machinery::schema`, subresources, printer columns, conversion) and kubectl's columns
//! (NAME, CREATED AT).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{json, Value};

use super::common::{meta_errors, validate_typed};
use crate::machinery::schema::Structural;
use crate::machinery::status::FieldError;
use crate::machinery::validation::{
    dns1123_label_errors, dns1123_subdomain_errors, invalid_each, FieldPath, NameRule, Scope,
};

pub const GROUP: &str = "apiextensions.k8s.io";

/// The finalizer the API server puts on every definition: its objects are deleted before the
/// definition goes (Kubernetes' CRD finalizer).
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

const PRINTER_TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];

pub fn default(v: &mut Value) {
    let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("conversion")
        .or_insert_with(|| json!({"strategy": "None"}));
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if !kind.is_empty() {
            names
                .entry("singular")
                .or_insert_with(|| json!(kind.to_lowercase()));
            names
                .entry("listKind")
                .or_insert_with(|| json!(format!("{kind}List")));
        }
    }
}

/// Kubernetes' `ValidateCustomResourceDefinition` (and its update rules), as far as skiff
/// serves definitions: conversion `None` only (no conversion webhooks).
pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = validate_typed(
        new,
        old,
        |n: &CustomResourceDefinition, o: Option<&CustomResourceDefinition>| {
            let mut errs = meta_errors(
                &n.metadata,
                o.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            errs.extend(spec_errors(n));
            if let Some(o) = o {
                if o.spec.scope != n.spec.scope {
                    errs.push(FieldError::invalid(
                        "spec.scope",
                        &n.spec.scope,
                        "field is immutable",
                    ));
                }
                if o.spec.group != n.spec.group {
                    errs.push(FieldError::invalid(
                        "spec.group",
                        &n.spec.group,
                        "field is immutable",
                    ));
                }
                if o.spec.names.plural != n.spec.names.plural {
                    errs.push(FieldError::invalid(
                        "spec.names.plural",
                        &n.spec.names.plural,
                        "field is immutable",
                    ));
                }
            }
            errs
        },
    );
    errs.extend(schema_errors(new));
    errs
}

fn spec_errors(crd: &CustomResourceDefinition) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = &crd.spec;
    let name = crd.metadata.name.as_deref().unwrap_or("");
    let expected = format!("{}.{}", spec.names.plural, spec.group);
    if name != expected {
        errs.push(FieldError::invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if spec.group.is_empty() {
        errs.push(FieldError::required("spec.group"));
    } else {
        errs.extend(invalid_each(
            &FieldPath::new("spec.group"),
            &spec.group,
            dns1123_subdomain_errors(&spec.group),
        ));
        if !spec.group.contains('.') {
            errs.push(FieldError::invalid(
                "spec.group",
                &spec.group,
                "should be a domain with at least one dot",
            ));
        }
    }
    if !matches!(spec.scope.as_str(), "Namespaced" | "Cluster") {
        errs.push(FieldError::not_supported(
            "spec.scope",
            &spec.scope,
            &["Cluster", "Namespaced"],
        ));
    }
    let names = &spec.names;
    for (field, value, required) in [
        ("plural", names.plural.as_str(), true),
        ("singular", names.singular.as_deref().unwrap_or(""), false),
    ] {
        let path = format!("spec.names.{field}");
        if value.is_empty() {
            if required {
                errs.push(FieldError::required(path));
            }
            continue;
        }
        errs.extend(invalid_each(
            &FieldPath::new(&path),
            value,
            dns1123_label_errors(value),
        ));
    }
    for (field, value) in [
        ("kind", names.kind.as_str()),
        ("listKind", names.list_kind.as_deref().unwrap_or("")),
    ] {
        let path = format!("spec.names.{field}");
        if value.is_empty() {
            if field == "kind" {
                errs.push(FieldError::required(path));
            }
            continue;
        }
        let lower = value.to_lowercase();
        if !dns1123_label_errors(&lower).is_empty() {
            errs.push(FieldError::invalid(
                path,
                value,
                "may have mixed case, but should otherwise match: [a-z0-9]([-a-z0-9]*[a-z0-9])?",
            ));
        }
    }
    if names.list_kind.as_deref() == Some(names.kind.as_str()) && !names.kind.is_empty() {
        errs.push(FieldError::invalid(
            "spec.names.listKind",
            &names.kind,
            "kind and listKind may not be the same",
        ));
    }
    for (i, s) in names.short_names.iter().flatten().enumerate() {
        errs.extend(invalid_each(
            &FieldPath::new(&format!("spec.names.shortNames[{i}]")),
            s,
            dns1123_label_errors(s),
        ));
    }
    for (i, c) in names.categories.iter().flatten().enumerate() {
        errs.extend(invalid_each(
            &FieldPath::new(&format!("spec.names.categories[{i}]")),
            c,
            dns1123_label_errors(c),
        ));
    }
    if let Some(conv) = &spec.conversion {
        if conv.strategy != "None" {
            errs.push(FieldError::not_supported(
                "spec.conversion.strategy",
                &conv.strategy,
                &["None"],
            ));
        }
    }
    if spec.versions.is_empty() {
        errs.push(FieldError::required("spec.versions"));
    }
    let mut seen = std::collections::HashSet::new();
    let storage = spec.versions.iter().filter(|v| v.storage).count();
    if !spec.versions.is_empty() && storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            format!("{storage} storage versions"),
            "must have exactly one version marked as storage version",
        ));
    }
    if !spec.versions.is_empty() && !spec.versions.iter().any(|v| v.served) {
        errs.push(FieldError::invalid(
            "spec.versions",
            "no served versions",
            "must have at least one version served",
        ));
    }
    for (i, v) in spec.versions.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        if !seen.insert(v.name.clone()) {
            errs.push(FieldError::duplicate(format!("{path}.name"), &v.name));
        }
        errs.extend(invalid_each(
            &FieldPath::new(&format!("{path}.name")),
            &v.name,
            dns1123_label_errors(&v.name),
        ));
        if let Some(sub) = &v.subresources {
            if let Some(scale) = &sub.scale {
                if !scale.spec_replicas_path.starts_with(".spec.") {
                    errs.push(FieldError::invalid(
                        format!("{path}.subresources.scale.specReplicasPath"),
                        &scale.spec_replicas_path,
                        "should be a json path under .spec",
                    ));
                }
                if !scale.status_replicas_path.starts_with(".status.") {
                    errs.push(FieldError::invalid(
                        format!("{path}.subresources.scale.statusReplicasPath"),
                        &scale.status_replicas_path,
                        "should be a json path under .status",
                    ));
                }
                if let Some(l) = &scale.label_selector_path {
                    if !l.starts_with(".spec.") && !l.starts_with(".status.") {
                        errs.push(FieldError::invalid(
                            format!("{path}.subresources.scale.labelSelectorPath"),
                            l,
                            "should be a json path under either .spec or .status",
                        ));
                    }
                }
            }
        }
        for (j, c) in v.additional_printer_columns.iter().flatten().enumerate() {
            let cpath = format!("{path}.additionalPrinterColumns[{j}]");
            if c.name.is_empty() {
                errs.push(FieldError::required(format!("{cpath}.name")));
            }
            if !PRINTER_TYPES.contains(&c.type_.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("{cpath}.type"),
                    &c.type_,
                    PRINTER_TYPES,
                ));
            }
            if c.json_path.is_empty() {
                errs.push(FieldError::required(format!("{cpath}.jsonPath")));
            } else if crate::machinery::jsonpath::Path::parse(&c.json_path).is_err() {
                errs.push(FieldError::invalid(
                    format!("{cpath}.jsonPath"),
                    &c.json_path,
                    "must be a simple json path",
                ));
            }
        }
    }
    errs
}

/// Every version's schema compiled (structural rules, CEL rules, defaults).
fn schema_errors(crd: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(versions) = crd.pointer("/spec/versions").and_then(Value::as_array) else {
        return errs;
    };
    for (i, v) in versions.iter().enumerate() {
        let path = FieldPath::new(&format!("spec.versions[{i}].schema.openAPIV3Schema"));
        match v.pointer("/schema/openAPIV3Schema") {
            None | Some(Value::Null) => errs.push(FieldError::required(path.as_str())),
            Some(schema) => {
                if let Err(e) = Structural::compile(schema, &path) {
                    errs.extend(e);
                }
            }
        }
    }
    errs
}
