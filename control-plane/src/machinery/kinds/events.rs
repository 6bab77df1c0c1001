//! Events in both API groups: core/v1 Event (what `kubectl get events` and `describe` read)
//! and events.k8s.io/v1 Event (the same object with newer field names). Validation as
//! Kubernetes does it for each, kubectl's event columns (LAST SEEN TYPE REASON OBJECT
//! MESSAGE), and the field selectors `describe` uses (involvedObject.*).

use k8s_openapi::api::core::v1::{Event, EventSeries, ObjectReference};
use k8s_openapi::api::events::v1 as eventsv1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{decode, default_row, meta_errors, meta_field, scalar_at, validate_typed};
use crate::machinery::duration;
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_subdomain_errors, invalid_each, qualified_name_errors, FieldPath, NameRule, Scope,
};

const LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;
const TYPES: &[&str] = &["Normal", "Warning"];

fn too_long(path: &str, limit: usize) -> FieldError {
    FieldError::invalid(path, "", &format!("can have at most {limit} characters"))
}

/// Checks shared by both groups for events written by the new API (with `eventTime`).
fn validate_new_style(
    errs: &mut Vec<FieldError>,
    controller_field: &str,
    controller: &str,
    instance: &str,
    action: &str,
    reason: &str,
    note: (&str, &str),
) {
    if controller.is_empty() {
        errs.push(FieldError::required(controller_field));
    }
    errs.extend(invalid_each(
        &FieldPath::new(controller_field),
        controller,
        if controller.is_empty() {
            vec![]
        } else {
            qualified_name_errors(controller)
        },
    ));
    for (field, value) in [
        ("reportingInstance", instance),
        ("action", action),
        ("reason", reason),
    ] {
        if value.is_empty() {
            errs.push(FieldError::required(field));
        } else if value.len() > LENGTH_LIMIT {
            errs.push(too_long(field, LENGTH_LIMIT));
        }
    }
    if note.1.len() > NOTE_LENGTH_LIMIT {
        errs.push(too_long(note.0, NOTE_LENGTH_LIMIT));
    }
}

/// Kubernetes' `legacyValidateEvent` for core/v1.
pub fn validate_core(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Event, old: Option<&Event>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let ns = new.metadata.namespace.as_deref().unwrap_or("");
        let involved_ns = new.involved_object.namespace.as_deref().unwrap_or("");
        let mismatch = || {
            FieldError::invalid(
                FieldPath::new("involvedObject").child("namespace"),
                involved_ns,
                "does not match event.namespace",
            )
        };
        if new.event_time.is_none() {
            let ok = if involved_ns.is_empty() {
                ns.is_empty() || ns == "default"
            } else {
                ns == involved_ns
            };
            if !ok {
                errs.push(mismatch());
            }
        } else {
            if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
                errs.push(mismatch());
            }
            validate_new_style(
                &mut errs,
                "reportingComponent",
                new.reporting_component.as_deref().unwrap_or(""),
                new.reporting_instance.as_deref().unwrap_or(""),
                new.action.as_deref().unwrap_or(""),
                new.reason.as_deref().unwrap_or(""),
                ("message", new.message.as_deref().unwrap_or("")),
            );
        }
        errs
    })
}

/// events.k8s.io/v1: every new-style field is required, type is Normal or Warning.
pub fn validate_events_v1(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &eventsv1::Event, old: Option<&eventsv1::Event>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            if new.event_time.is_none() {
                errs.push(FieldError::required("eventTime"));
            }
            let kind = new.type_.as_deref().unwrap_or("");
            if !TYPES.contains(&kind) {
                errs.push(FieldError::not_supported("type", kind, TYPES));
            }
            validate_new_style(
                &mut errs,
                "reportingController",
                new.reporting_controller.as_deref().unwrap_or(""),
                new.reporting_instance.as_deref().unwrap_or(""),
                new.action.as_deref().unwrap_or(""),
                new.reason.as_deref().unwrap_or(""),
                ("note", new.note.as_deref().unwrap_or("")),
            );
            let ns = new.metadata.namespace.as_deref().unwrap_or("");
            errs.extend(invalid_each(
                &FieldPath::new("metadata").child("namespace"),
                ns,
                if ns.is_empty() {
                    vec![]
                } else {
                    dns1123_subdomain_errors(ns)
                },
            ));
            errs
        },
    )
}

/// The core/v1 shape of an events.k8s.io/v1 Event (Kubernetes stores one type for both).
fn as_core(e: eventsv1::Event) -> Event {
    Event {
        metadata: e.metadata,
        involved_object: e.regarding.unwrap_or_default(),
        related: e.related,
        message: e.note,
        reason: e.reason,
        type_: e.type_,
        action: e.action,
        count: e.deprecated_count,
        first_timestamp: e.deprecated_first_timestamp,
        last_timestamp: e.deprecated_last_timestamp,
        source: e.deprecated_source,
        event_time: e.event_time,
        reporting_component: e.reporting_controller,
        reporting_instance: e.reporting_instance,
        series: e.series.map(|s| EventSeries {
            count: Some(s.count),
            last_observed_time: Some(s.last_observed_time),
        }),
    }
}

pub fn columns() -> Vec<TableColumnDefinition> {
    use ColumnType::String as S;
    let mut name =
        TableColumnDefinition::new("Name", S, "Name must be unique within a namespace.").wide();
    name.format = "name".into();
    vec![
        TableColumnDefinition::new("Last Seen", S, "The time at which the most recent occurrence of this event was recorded."),
        TableColumnDefinition::new("Type", S, "Type of this event (Normal, Warning), new types could be added in the future"),
        TableColumnDefinition::new("Reason", S, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
        TableColumnDefinition::new("Object", S, "The object that this event is about."),
        TableColumnDefinition::new("Subobject", S, "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].").wide(),
        TableColumnDefinition::new("Source", S, "The component reporting this event. Should be a short machine understandable string.").wide(),
        TableColumnDefinition::new("Message", S, "A human-readable description of the status of this operation."),
        TableColumnDefinition::new("First Seen", S, "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)").wide(),
        TableColumnDefinition::new("Count", S, "The number of times this event has occurred.").wide(),
        name,
    ]
}

fn since(t: Option<Timestamp>, now: Timestamp) -> String {
    duration::age(t, now)
}

fn time(t: &Option<Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

fn micro(t: &Option<MicroTime>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

/// kubectl's `printEvent`.
fn event_row(e: &Event, now: Timestamp) -> Vec<Value> {
    let first = match time(&e.first_timestamp) {
        Some(t) => since(Some(t), now),
        None => since(micro(&e.event_time), now),
    };
    let mut last = match time(&e.last_timestamp) {
        Some(t) => since(Some(t), now),
        None => first.clone(),
    };
    let mut count = e.count.unwrap_or(0);
    if let Some(series) = e.series.as_ref() {
        last = since(micro(&series.last_observed_time), now);
        count = series.count.unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let o: &ObjectReference = &e.involved_object;
    let kind = o.kind.clone().unwrap_or_default().to_lowercase();
    let target = match o.name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => format!("{kind}/{n}"),
        None => kind,
    };
    let source = e.source.clone().unwrap_or_default();
    let component = source
        .component
        .filter(|c| !c.is_empty())
        .or(e.reporting_component.clone())
        .unwrap_or_default();
    let instance = source
        .host
        .filter(|h| !h.is_empty())
        .or(e.reporting_instance.clone())
        .unwrap_or_default();
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, true) => String::new(),
        (_, true) => component,
        _ => format!("{component}, {instance}"),
    };
    vec![
        Value::from(last),
        Value::from(e.type_.clone().unwrap_or_default()),
        Value::from(e.reason.clone().unwrap_or_default()),
        Value::from(target),
        Value::from(o.field_path.clone().unwrap_or_default()),
        Value::from(source),
        Value::from(e.message.clone().unwrap_or_default().trim().to_string()),
        Value::from(first),
        Value::from(count),
        Value::from(e.metadata.name.clone().unwrap_or_default()),
    ]
}

pub fn core_row(v: &Value, now: Timestamp) -> Vec<Value> {
    match decode::<Event>(v) {
        Ok(e) => event_row(&e, now),
        Err(_) => default_row(v, now),
    }
}

pub fn events_v1_row(v: &Value, now: Timestamp) -> Vec<Value> {
    match decode::<eventsv1::Event>(v) {
        Ok(e) => event_row(&as_core(e), now),
        Err(_) => default_row(v, now),
    }
}

const INVOLVED: &[&str] = &[
    "kind",
    "namespace",
    "name",
    "uid",
    "apiVersion",
    "resourceVersion",
    "fieldPath",
];

/// core/v1 field selectors: `involvedObject.*`, reason, reportingComponent, source, type.
pub fn core_field(v: &Value, field: &str) -> Option<String> {
    if let Some(sub) = field.strip_prefix("involvedObject.") {
        return INVOLVED
            .contains(&sub)
            .then(|| scalar_at(v, &format!("/involvedObject/{sub}")));
    }
    match field {
        "reason" => Some(scalar_at(v, "/reason")),
        "type" => Some(scalar_at(v, "/type")),
        "reportingComponent" => Some(scalar_at(v, "/reportingComponent")),
        "source" => Some(scalar_at(v, "/source/component")),
        _ => meta_field(v, field),
    }
}

/// events.k8s.io/v1 accepts the same selectors under both names (`regarding.*` and the
/// core names it converts to).
pub fn events_v1_field(v: &Value, field: &str) -> Option<String> {
    let sub = field
        .strip_prefix("regarding.")
        .or_else(|| field.strip_prefix("involvedObject."));
    if let Some(sub) = sub {
        return INVOLVED
            .contains(&sub)
            .then(|| scalar_at(v, &format!("/regarding/{sub}")));
    }
    match field {
        "reason" => Some(scalar_at(v, "/reason")),
        "type" => Some(scalar_at(v, "/type")),
        "reportingController" | "reportingComponent" => Some(scalar_at(v, "/reportingController")),
        "source" | "deprecatedSource" => Some(scalar_at(v, "/deprecatedSource/component")),
        _ => meta_field(v, field),
    }
}
