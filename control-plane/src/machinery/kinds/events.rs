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

/// The core/v1 shape of an events.k8s.io/v1 Event (Kubernetes stores one type for both:
/// regarding <-> involvedObject, note <-> message, reportingController <-> reportingComponent,
/// deprecated* <-> source, firstTimestamp, lastTimestamp, count).
pub fn as_core(e: eventsv1::Event) -> Event {
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

/// The events.k8s.io/v1 view of a stored core/v1 Event (the inverse of [`as_core`]). A
/// core series without its time is dropped: events.k8s.io/v1 requires both fields.
pub fn as_events_v1(e: Event) -> eventsv1::Event {
    let series = e.series.and_then(|s| {
        Some(eventsv1::EventSeries {
            count: s.count.unwrap_or(0),
            last_observed_time: s.last_observed_time?,
        })
    });
    eventsv1::Event {
        metadata: e.metadata,
        regarding: Some(e.involved_object),
        related: e.related,
        note: e.message,
        reason: e.reason,
        type_: e.type_,
        action: e.action,
        deprecated_count: e.count,
        deprecated_first_timestamp: e.first_timestamp,
        deprecated_last_timestamp: e.last_timestamp,
        deprecated_source: e.source,
        event_time: e.event_time,
        reporting_controller: e.reporting_component,
        reporting_instance: e.reporting_instance,
        series,
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

/// The core/v1 field an events.k8s.io/v1 field selector names (Kubernetes' field label
/// conversion for events.k8s.io/v1: `regarding.*` -> `involvedObject.*`,
/// `reportingController` -> `reportingComponent`); the core names are accepted as they are.
pub fn core_field_label(field: &str) -> Option<&'static str> {
    let involved = |sub: &str| {
        Some(match sub {
            "kind" => "involvedObject.kind",
            "namespace" => "involvedObject.namespace",
            "name" => "involvedObject.name",
            "uid" => "involvedObject.uid",
            "apiVersion" => "involvedObject.apiVersion",
            "resourceVersion" => "involvedObject.resourceVersion",
            "fieldPath" => "involvedObject.fieldPath",
            _ => return None,
        })
    };
    if let Some(sub) = field
        .strip_prefix("regarding.")
        .or_else(|| field.strip_prefix("involvedObject."))
    {
        return involved(sub);
    }
    Some(match field {
        "reason" => "reason",
        "type" => "type",
        "reportingController" | "reportingComponent" => "reportingComponent",
        "deprecatedSource" | "source" => "source",
        "metadata.name" => "metadata.name",
        "metadata.namespace" => "metadata.namespace",
        _ => return None,
    })
}

/// events.k8s.io/v1 field selectors: the core field each names, on the core shape.
pub fn events_v1_field(v: &Value, field: &str) -> Option<String> {
    let label = core_field_label(field)?;
    let core = decode::<eventsv1::Event>(v)
        .ok()
        .and_then(|e| serde_json::to_value(as_core(e)).ok())
        .unwrap_or(Value::Null);
    core_field(&core, label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn scheduled() -> Value {
        json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web-1.17a8e5f3", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1", "uid": "u-1", "apiVersion": "v1", "resourceVersion": "42"},
            "reason": "Scheduled", "message": "Successfully assigned default/web-1 to node-1", "type": "Normal",
            "source": {"component": "default-scheduler"},
            "firstTimestamp": "2025-01-01T11:59:55Z", "lastTimestamp": "2025-01-01T11:59:55Z", "count": 1})
    }

    #[test]
    fn core_rows_like_kubectl() {
        // LAST SEEN TYPE REASON OBJECT MESSAGE (+ SUBOBJECT SOURCE FIRST SEEN COUNT NAME)
        assert_eq!(
            core_row(&scheduled(), now()),
            vec![
                json!("5s"),
                json!("Normal"),
                json!("Scheduled"),
                json!("pod/web-1"),
                json!(""),
                json!("default-scheduler"),
                json!("Successfully assigned default/web-1 to node-1"),
                json!("5s"),
                json!(1),
                json!("web-1.17a8e5f3")
            ]
        );
        let mut backoff = scheduled();
        backoff["reason"] = json!("BackOff");
        backoff["type"] = json!("Warning");
        backoff["involvedObject"]["fieldPath"] = json!("spec.containers{web}");
        backoff["source"] = json!({"component": "kubelet", "host": "node-1"});
        backoff["firstTimestamp"] = json!("2025-01-01T11:50:00Z");
        backoff["count"] = json!(7);
        let cells = core_row(&backoff, now());
        assert_eq!(cells[0], "5s");
        assert_eq!(cells[4], "spec.containers{web}");
        assert_eq!(cells[5], "kubelet, node-1");
        assert_eq!(cells[7], "10m");
        assert_eq!(cells[8], 7);
        let names: Vec<String> = columns()
            .into_iter()
            .filter(|c| c.priority == 0)
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["Last Seen", "Type", "Reason", "Object", "Message"]);
    }

    #[test]
    fn series_and_new_style_events() {
        let v = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "eventTime": "2025-01-01T11:58:00.000000Z",
            "series": {"count": 4, "lastObservedTime": "2025-01-01T11:59:30.000000Z"},
            "regarding": {"kind": "Pod", "name": "web-1", "namespace": "default"},
            "reason": "Pulling", "action": "Pull", "note": "Pulling image \"nginx\"", "type": "Normal",
            "reportingController": "kubelet", "reportingInstance": "node-1"});
        assert!(validate_events_v1(&v, None).is_empty());
        let cells = events_v1_row(&v, now());
        assert_eq!(
            (cells[0].as_str(), cells[3].as_str(), cells[5].as_str()),
            (Some("30s"), Some("pod/web-1"), Some("kubelet, node-1"))
        );
        assert_eq!(
            (cells[7].as_str(), cells[8].as_i64()),
            (Some("2m"), Some(4))
        );
        assert_eq!(
            events_v1_field(&v, "regarding.name").as_deref(),
            Some("web-1")
        );
        assert_eq!(
            events_v1_field(&v, "involvedObject.kind").as_deref(),
            Some("Pod")
        );
        let mut bad = v.clone();
        bad["type"] = json!("Info");
        bad.as_object_mut().unwrap().remove("action");
        let errs: Vec<String> = validate_events_v1(&bad, None)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert_eq!(
            errs,
            vec![
                "type: Unsupported value: \"Info\": supported values: \"Normal\", \"Warning\"",
                "action: Required value"
            ]
        );
    }

    #[test]
    fn both_shapes_convert_into_each_other() {
        let v1: eventsv1::Event = decode(&json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default", "resourceVersion": "7"},
            "eventTime": "2025-01-01T11:58:00.000000Z",
            "series": {"count": 4, "lastObservedTime": "2025-01-01T11:59:30.000000Z"},
            "regarding": {"kind": "Pod", "name": "web-1", "namespace": "default", "fieldPath": "spec.containers{c}"},
            "related": {"kind": "Node", "name": "n1"},
            "reason": "Pulling", "action": "Pull", "note": "Pulling image", "type": "Normal",
            "reportingController": "kubelet", "reportingInstance": "node-1",
            "deprecatedSource": {"component": "kubelet", "host": "node-1"},
            "deprecatedFirstTimestamp": "2025-01-01T11:58:00Z",
            "deprecatedLastTimestamp": "2025-01-01T11:59:30Z", "deprecatedCount": 4}))
        .unwrap();
        let core = as_core(v1.clone());
        assert_eq!(core.involved_object.name.as_deref(), Some("web-1"));
        assert_eq!(core.message.as_deref(), Some("Pulling image"));
        assert_eq!(core.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(
            core.source.as_ref().unwrap().host.as_deref(),
            Some("node-1")
        );
        assert_eq!(core.count, Some(4));
        assert_eq!(core.series.as_ref().unwrap().count, Some(4));
        assert_eq!(as_events_v1(core), v1, "a round trip loses nothing");

        let legacy: Event = decode(&scheduled()).unwrap();
        let view = as_events_v1(legacy.clone());
        assert_eq!(view.regarding.as_ref().unwrap().uid.as_deref(), Some("u-1"));
        assert_eq!(
            view.deprecated_source
                .as_ref()
                .unwrap()
                .component
                .as_deref(),
            Some("default-scheduler")
        );
        assert_eq!(view.deprecated_count, Some(1));
        assert_eq!(as_core(view), legacy);
        assert_eq!(
            core_field_label("regarding.name"),
            Some("involvedObject.name")
        );
        assert_eq!(
            core_field_label("reportingController"),
            Some("reportingComponent")
        );
        assert_eq!(core_field_label("note"), None);
        assert_eq!(core_field_label("regarding.bogus"), None);
    }

    #[test]
    fn validation_and_fields() {
        assert!(validate_core(&scheduled(), None).is_empty());
        let mut elsewhere = scheduled();
        elsewhere["involvedObject"]["namespace"] = json!("other");
        assert_eq!(
            validate_core(&elsewhere, None)[0].message,
            "Invalid value: \"other\": does not match event.namespace"
        );
        let v = scheduled();
        for (f, want) in [
            ("involvedObject.name", "web-1"),
            ("involvedObject.namespace", "default"),
            ("involvedObject.uid", "u-1"),
            ("involvedObject.kind", "Pod"),
            ("involvedObject.apiVersion", "v1"),
            ("involvedObject.resourceVersion", "42"),
            ("involvedObject.fieldPath", ""),
            ("reason", "Scheduled"),
            ("type", "Normal"),
            ("source", "default-scheduler"),
        ] {
            assert_eq!(core_field(&v, f).as_deref(), Some(want), "{f}");
        }
        assert_eq!(core_field(&v, "involvedObject.bogus"), None);
        assert_eq!(core_field(&v, "message"), None);
    }
}
