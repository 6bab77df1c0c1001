//! apps/v1 StatefulSet and ControllerRevision, and the core/v1 PersistentVolumeClaim kind a
//! StatefulSet's volumeClaimTemplates create (served minimally until the storage issue binds
//! claims): Kubernetes' defaulters (OrderedReady, RollingUpdate at partition 0, replicas 1,
//! history 10, claims retained), validation (what a StatefulSet update may change, the
//! strategies, claim templates; a claim's access modes and storage request), and kubectl's
//! columns.

use k8s_openapi::api::apps::v1::{
    ControllerRevision, RollingUpdateStatefulSetStrategy, StatefulSet,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Volume,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::apps::{
    containers_and_images, int_or_percent, non_negative, present_selector, validate_selector,
    ALWAYS,
};
use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, meta_field, name_cell, scalar_at,
    validate_typed,
};
use super::pod::{default_template, validate_template};
use crate::machinery::status::FieldError;
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{FieldPath, NameRule, Scope};

const POD_MANAGEMENT: &[&str] = &["OrderedReady", "Parallel"];
const STRATEGIES: &[&str] = &["OnDelete", "RollingUpdate"];
const RETENTION: &[&str] = &["Delete", "Retain"];
const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];

// ---------------------------------------------------------------- StatefulSet

pub fn default_stateful_set(v: &mut Value) {
    default_typed(v, |ss: &mut StatefulSet| {
        let spec = ss.spec.get_or_insert_with(Default::default);
        spec.pod_management_policy
            .get_or_insert_with(|| "OrderedReady".into());
        let strategy = spec
            .update_strategy
            .get_or_insert_with(StatefulSetUpdateStrategy::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
        if kind == "RollingUpdate" {
            strategy
                .rolling_update
                .get_or_insert_with(RollingUpdateStatefulSetStrategy::default)
                .partition
                .get_or_insert(0);
        }
        spec.replicas.get_or_insert(1);
        spec.revision_history_limit.get_or_insert(10);
        let retention = spec
            .persistent_volume_claim_retention_policy
            .get_or_insert_with(StatefulSetPersistentVolumeClaimRetentionPolicy::default);
        retention
            .when_deleted
            .get_or_insert_with(|| "Retain".into());
        retention.when_scaled.get_or_insert_with(|| "Retain".into());
        for claim in spec.volume_claim_templates.iter_mut().flatten() {
            let s = claim.spec.get_or_insert_with(Default::default);
            s.volume_mode.get_or_insert_with(|| "Filesystem".into());
        }
        default_template(&mut spec.template);
    });
}

pub fn validate_stateful_set(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &StatefulSet, old: Option<&StatefulSet>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Label,
        );
        let path = FieldPath::new("spec");
        let Some(spec) = new.spec.as_ref() else {
            errs.push(FieldError::required(&path));
            return errs;
        };
        non_negative(&mut errs, path.child("replicas"), spec.replicas);
        non_negative(
            &mut errs,
            path.child("minReadySeconds"),
            spec.min_ready_seconds,
        );
        non_negative(
            &mut errs,
            path.child("revisionHistoryLimit"),
            spec.revision_history_limit,
        );
        if let Some(start) = spec.ordinals.as_ref().and_then(|o| o.start) {
            non_negative(
                &mut errs,
                path.child("ordinals").child("start"),
                Some(start),
            );
        }
        let policy = spec
            .pod_management_policy
            .as_deref()
            .unwrap_or("OrderedReady");
        if !POD_MANAGEMENT.contains(&policy) {
            errs.push(FieldError::not_supported(
                path.child("podManagementPolicy"),
                policy,
                POD_MANAGEMENT,
            ));
        }
        if let Some(strategy) = &spec.update_strategy {
            let sp = path.child("updateStrategy");
            let kind = strategy.type_.as_deref().unwrap_or("RollingUpdate");
            if !STRATEGIES.contains(&kind) {
                errs.push(FieldError::not_supported(
                    sp.child("type"),
                    kind,
                    STRATEGIES,
                ));
            }
            if kind == "OnDelete" && strategy.rolling_update.is_some() {
                errs.push(FieldError::invalid(
                    sp.child("rollingUpdate"),
                    "",
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
            if let Some(ru) = &strategy.rolling_update {
                let rp = sp.child("rollingUpdate");
                non_negative(&mut errs, rp.child("partition"), ru.partition);
                if let Some(m) = &ru.max_unavailable {
                    let (e, zero) = int_or_percent(m, &rp.child("maxUnavailable"), true);
                    errs.extend(e);
                    if zero {
                        errs.push(FieldError::invalid_number(
                            rp.child("maxUnavailable"),
                            0,
                            "must be greater than 0",
                        ));
                    }
                }
            }
        }
        if let Some(r) = &spec.persistent_volume_claim_retention_policy {
            let rp = path.child("persistentVolumeClaimRetentionPolicy");
            for (field, v) in [
                ("whenDeleted", &r.when_deleted),
                ("whenScaled", &r.when_scaled),
            ] {
                if let Some(v) = v.as_deref().filter(|v| !RETENTION.contains(v)) {
                    errs.push(FieldError::not_supported(rp.child(field), v, RETENTION));
                }
            }
        }
        errs.extend(validate_selector(
            present_selector(&spec.selector),
            None,
            Some(&spec.template),
            "statefulset",
        ));
        // Containers mount the claim templates by name: the controller adds a volume per
        // template to each pod it makes, so the template is checked with them in place.
        let mut template = spec.template.clone();
        if let Some(pod) = template.spec.as_mut() {
            let volumes = pod.volumes.get_or_insert_with(Vec::new);
            for claim in spec.volume_claim_templates.iter().flatten() {
                let name = claim.metadata.name.clone().unwrap_or_default();
                if name.is_empty() || volumes.iter().any(|v| v.name == name) {
                    continue;
                }
                volumes.push(Volume {
                    name: name.clone(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: name,
                        read_only: None,
                    }),
                    ..Default::default()
                });
            }
        }
        errs.extend(validate_template(
            &template,
            &path.child("template"),
            ALWAYS,
        ));
        let mut names = std::collections::BTreeSet::new();
        for (i, claim) in spec.volume_claim_templates.iter().flatten().enumerate() {
            let cp = path.child("volumeClaimTemplates").index(i);
            let name = claim.metadata.name.clone().unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(cp.child("metadata").child("name")));
            } else if !names.insert(name.clone()) {
                errs.push(FieldError::duplicate(
                    cp.child("metadata").child("name"),
                    &name,
                ));
            }
            errs.extend(validate_claim_spec(claim, &cp.child("spec")));
        }
        if let Some(old) = old.and_then(|o| o.spec.as_ref()) {
            // Kubernetes' ValidateStatefulSetUpdate: only these may change.
            let mut a = spec.clone();
            let mut b = old.clone();
            for s in [&mut a, &mut b] {
                s.replicas = None;
                s.ordinals = None;
                s.template = Default::default();
                s.update_strategy = None;
                s.revision_history_limit = None;
                s.persistent_volume_claim_retention_policy = None;
                s.min_ready_seconds = None;
            }
            if a != b {
                errs.push(FieldError::forbidden(
                    &path,
                    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
                ));
            }
        }
        errs
    })
}

pub fn stateful_set_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Ready",
            ColumnType::String,
            "Number of the pod with ready state",
        ),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new(
            "Containers",
            ColumnType::String,
            "Names of each container in the template.",
        )
        .wide(),
        TableColumnDefinition::new(
            "Images",
            ColumnType::String,
            "Images referenced by each container in the template.",
        )
        .wide(),
    ]
}

pub fn stateful_set_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(ss) = decode::<StatefulSet>(v) else {
        let mut r = default_row(v, now);
        r.resize(stateful_set_columns().len(), Value::from(""));
        return r;
    };
    let spec = ss.spec.clone().unwrap_or_default();
    let status = ss.status.clone().unwrap_or_default();
    let (containers, images) = containers_and_images(Some(&spec.template));
    vec![
        name_cell(&ss.metadata),
        Value::from(format!(
            "{}/{}",
            status.ready_replicas.unwrap_or(0),
            spec.replicas.unwrap_or(0)
        )),
        age_cell(&ss.metadata, now),
        containers,
        images,
    ]
}

// ---------------------------------------------------------------- ControllerRevision

pub fn validate_controller_revision(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &ControllerRevision, old: Option<&ControllerRevision>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            if new.revision < 0 {
                errs.push(FieldError::invalid_number(
                    "revision",
                    new.revision,
                    "must be greater than or equal to 0",
                ));
            }
            if let Some(old) = old {
                if old.data != new.data {
                    errs.push(FieldError::immutable("data"));
                }
            }
            errs
        },
    )
}

pub fn controller_revision_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Controller", ColumnType::String, "Controller of the object"),
        TableColumnDefinition::new(
            "Revision",
            ColumnType::Integer,
            "Revision indicates the revision of the state represented by Data.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn controller_revision_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(cr) = decode::<ControllerRevision>(v) else {
        let mut r = default_row(v, now);
        r.resize(controller_revision_columns().len(), Value::from(""));
        return r;
    };
    let controller = cr
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| {
            let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
            if group.is_empty() {
                format!("{}/{}", r.kind.to_lowercase(), r.name)
            } else {
                format!("{}.{group}/{}", r.kind.to_lowercase(), r.name)
            }
        })
        .unwrap_or_else(|| "<none>".into());
    vec![
        name_cell(&cr.metadata),
        Value::from(controller),
        Value::from(cr.revision),
        age_cell(&cr.metadata, now),
    ]
}

// ---------------------------------------------------------------- PersistentVolumeClaim

fn validate_claim_spec(claim: &PersistentVolumeClaim, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let spec = claim.spec.clone().unwrap_or_default();
    let modes = spec.access_modes.unwrap_or_default();
    if modes.is_empty() {
        errs.push(FieldError::required_because(
            path.child("accessModes"),
            "at least 1 access mode is required",
        ));
    }
    for (i, m) in modes.iter().enumerate() {
        if !ACCESS_MODES.contains(&m.as_str()) {
            errs.push(FieldError::not_supported(
                path.child("accessModes").index(i),
                m,
                ACCESS_MODES,
            ));
        }
    }
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    match storage {
        None => errs.push(FieldError::required(
            path.child("resources").child("requests").key("storage"),
        )),
        Some(q) => match crate::machinery::Quantity::parse(&q.0) {
            Ok(v) if v.nano_value() > 0 => {}
            _ => errs.push(FieldError::invalid(
                path.child("resources").child("requests").key("storage"),
                &q.0,
                "must be greater than zero",
            )),
        },
    }
    if let Some(m) = spec
        .volume_mode
        .as_deref()
        .filter(|m| !["Block", "Filesystem"].contains(m))
    {
        errs.push(FieldError::not_supported(
            path.child("volumeMode"),
            m,
            &["Block", "Filesystem"],
        ));
    }
    if let Some(c) = spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
        errs.extend(crate::machinery::validation::invalid_each(
            &path.child("storageClassName"),
            c,
            crate::machinery::validation::dns1123_subdomain_errors(c),
        ));
    }
    errs
}

pub fn default_claim(v: &mut Value) {
    default_typed(v, |c: &mut PersistentVolumeClaim| {
        let spec = c.spec.get_or_insert_with(Default::default);
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
        // Kubernetes' defaulter: a claim without a phase is Pending.
        let status = c.status.get_or_insert_with(Default::default);
        if status.phase.as_deref().unwrap_or_default().is_empty() {
            status.phase = Some("Pending".into());
        }
    });
}

/// The storage a claim requests (None when absent or not a quantity).
fn requested(spec: &PersistentVolumeClaimSpec) -> Option<crate::machinery::Quantity> {
    let q = spec.resources.as_ref()?.requests.as_ref()?.get("storage")?;
    crate::machinery::Quantity::parse(&q.0).ok()
}

/// Kubernetes' ValidatePersistentVolumeClaimUpdate: the spec is immutable but for the
/// storage request of a bound claim (which may not go below its status capacity), the
/// volume name and the class while they are unset, and the attributes class.
fn claim_update_errors(
    new: &PersistentVolumeClaim,
    old: &PersistentVolumeClaim,
) -> Vec<FieldError> {
    let mut errs = vec![];
    let (mut a, mut b) = (
        new.spec.clone().unwrap_or_default(),
        old.spec.clone().unwrap_or_default(),
    );
    let bound = old.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if b.volume_name.as_deref().unwrap_or_default().is_empty() {
        b.volume_name = a.volume_name.clone();
    }
    let class_from_annotation = old
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("volume.beta.kubernetes.io/storage-class"));
    if !class_from_annotation
        && b.storage_class_name.is_none()
        && a.storage_class_name
            .as_deref()
            .is_some_and(|c| !c.is_empty())
    {
        b.storage_class_name = a.storage_class_name.clone();
    }
    b.volume_attributes_class_name = a.volume_attributes_class_name.clone();
    if bound {
        let want = b
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned();
        let requests = a
            .resources
            .get_or_insert_with(Default::default)
            .requests
            .get_or_insert_with(Default::default);
        match want {
            Some(q) => {
                requests.insert("storage".into(), q);
            }
            None => {
                requests.remove("storage");
            }
        }
    }
    if serde_json::to_value(&a).ok() != serde_json::to_value(&b).ok() {
        errs.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    let old_spec = old.spec.clone().unwrap_or_default();
    let new_spec = new.spec.clone().unwrap_or_default();
    if let (Some(n), Some(o)) = (requested(&new_spec), requested(&old_spec)) {
        if n.nano_value() < o.nano_value() {
            // Shrinking is allowed down to just above the capacity the volume has, to
            // recover from a failed expansion (RecoverVolumeExpansionFailure).
            let capacity = old
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .and_then(|q| crate::machinery::Quantity::parse(&q.0).ok())
                .map_or(0, |q| q.nano_value());
            if n.nano_value() <= capacity {
                errs.push(FieldError::forbidden(
                    "spec.resources.requests.storage",
                    "field can not be less than status.capacity",
                ));
            }
        }
    }
    errs
}

pub fn validate_claim(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |new: &PersistentVolumeClaim, old: Option<&PersistentVolumeClaim>| {
            let mut errs = meta_errors(
                &new.metadata,
                old.map(|o| &o.metadata),
                Scope::Namespaced,
                NameRule::Dns1123Subdomain,
            );
            errs.extend(validate_claim_spec(new, &FieldPath::new("spec")));
            if let Some(old) = old {
                errs.extend(claim_update_errors(new, old));
            }
            errs
        },
    )
}

pub fn claim_columns() -> Vec<TableColumnDefinition> {
    let s = ColumnType::String;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Status", s, "Phase represents the current phase of PersistentVolumeClaim."),
        TableColumnDefinition::new("Volume", s, "VolumeName is the binding reference to the PersistentVolume backing this claim."),
        TableColumnDefinition::new("Capacity", s, "Capacity represents the actual resources of the underlying volume."),
        TableColumnDefinition::new("Access Modes", s, "AccessModes contains the desired access modes the volume should have."),
        TableColumnDefinition::new("StorageClass", s, "StorageClassName is the name of the StorageClass required by the claim."),
        TableColumnDefinition::new("VolumeAttributesClass", s, "VolumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim."),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("VolumeMode", s, "VolumeMode defines what type of volume is required by the claim.").wide(),
    ]
}

/// kubectl's access-mode short forms: RWO, ROX, RWX, RWOP.
fn access_modes(modes: &[String]) -> String {
    modes
        .iter()
        .map(|m| match m.as_str() {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub fn claim_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(c) = decode::<PersistentVolumeClaim>(v) else {
        let mut r = default_row(v, now);
        r.resize(claim_columns().len(), Value::from(""));
        return r;
    };
    let spec = c.spec.clone().unwrap_or_default();
    let status = c.status.clone().unwrap_or_default();
    let bound = status.phase.as_deref() == Some("Bound");
    let capacity = status
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .filter(|_| bound)
        .map(|q| q.0.clone())
        .unwrap_or_default();
    let modes = if bound {
        access_modes(status.access_modes.as_deref().unwrap_or(&[]))
    } else {
        String::new()
    };
    vec![
        name_cell(&c.metadata),
        Value::from(status.phase.unwrap_or_default()),
        Value::from(spec.volume_name.unwrap_or_default()),
        Value::from(capacity),
        Value::from(modes),
        Value::from(spec.storage_class_name.unwrap_or_default()),
        Value::from(
            spec.volume_attributes_class_name
                .unwrap_or_else(|| "<unset>".into()),
        ),
        age_cell(&c.metadata, now),
        Value::from(spec.volume_mode.unwrap_or_default()),
    ]
}

/// Claims select on their phase besides metadata.
pub fn claim_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "status.phase" => Some(scalar_at(v, "/status/phase")),
        _ => meta_field(v, field),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"serviceName": "web", "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}})
    }

    #[test]
    fn defaults_and_what_an_update_may_change() {
        let mut v = set();
        default_stateful_set(&mut v);
        let spec = &v["spec"];
        assert_eq!(spec["podManagementPolicy"], "OrderedReady");
        assert_eq!(spec["updateStrategy"]["type"], "RollingUpdate");
        assert_eq!(spec["updateStrategy"]["rollingUpdate"]["partition"], 0);
        assert_eq!(
            spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"],
            "Retain"
        );
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert!(
            validate_stateful_set(&v, None).is_empty(),
            "{:?}",
            validate_stateful_set(&v, None)
        );
        let mut scaled = v.clone();
        scaled["spec"]["replicas"] = json!(5);
        scaled["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
        scaled["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(2);
        assert!(validate_stateful_set(&scaled, Some(&v)).is_empty());
        let mut renamed = v.clone();
        renamed["spec"]["serviceName"] = json!("other");
        let errs = validate_stateful_set(&renamed, Some(&v));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].message.contains("are forbidden"));
        let mut bad = v.clone();
        bad["spec"]["podManagementPolicy"] = json!("Random");
        bad["spec"]["volumeClaimTemplates"][0]["spec"] = json!({});
        let fields: Vec<String> = validate_stateful_set(&bad, None)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert!(
            fields.contains(&"spec.podManagementPolicy".to_string()),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"spec.volumeClaimTemplates[0].spec.accessModes".to_string()),
            "{fields:?}"
        );
        assert!(
            fields.contains(
                &"spec.volumeClaimTemplates[0].spec.resources.requests[storage]".to_string()
            ),
            "{fields:?}"
        );
        let row = stateful_set_row(&v, "2025-01-01T00:01:00Z".parse().unwrap());
        assert_eq!(row[1], "0/3");
    }

    #[test]
    fn containers_mount_claim_templates_by_name() {
        let mut v = set();
        default_stateful_set(&mut v);
        v["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "www", "mountPath": "/data"}]);
        assert!(
            validate_stateful_set(&v, None).is_empty(),
            "{:?}",
            validate_stateful_set(&v, None)
        );
        v["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "nowhere", "mountPath": "/data"}]);
        let errs = validate_stateful_set(&v, None);
        assert_eq!(
            errs.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(),
            ["spec.template.spec.containers[0].volumeMounts[0].name"],
            "{errs:?}"
        );
    }

    #[test]
    fn revisions_and_claims_read_like_kubectl() {
        let cr = json!({"metadata": {"name": "web-6d5f", "namespace": "default", "creationTimestamp": "2025-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u", "controller": true}]},
            "revision": 2, "data": {"spec": {}}});
        assert!(validate_controller_revision(&cr, None).is_empty());
        let row = controller_revision_row(&cr, "2025-01-01T00:01:00Z".parse().unwrap());
        assert_eq!(row[1], "statefulset.apps/web");
        assert_eq!(row[2], 2);
        let mut changed = cr.clone();
        changed["data"] = json!({"x": 1});
        assert_eq!(
            validate_controller_revision(&changed, Some(&cr))[0].field,
            "data"
        );

        let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "www-web-0", "namespace": "default", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}});
        assert!(validate_claim(&claim, None).is_empty());
        let row = claim_row(&claim, "2025-01-01T00:01:00Z".parse().unwrap());
        assert_eq!(row[1], "Pending");
        assert_eq!(
            claim_field(&claim, "status.phase").as_deref(),
            Some("Pending")
        );
    }

    fn claim(size: &str) -> Value {
        let mut c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}});
        default_claim(&mut c);
        c
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn claims_change_only_their_request_once_bound() {
        let pending = claim("1Gi");
        assert_eq!(pending["status"]["phase"], "Pending");
        assert!(validate_claim(&pending, Some(&pending)).is_empty());
        // Unbound: the request is part of the immutable spec; the class may be set once.
        let grown = claim("2Gi");
        assert_eq!(
            messages(&validate_claim(&grown, Some(&pending))),
            vec!["spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"]
        );
        let mut classed = pending.clone();
        classed["spec"]["storageClassName"] = json!("fast");
        assert!(validate_claim(&classed, Some(&pending)).is_empty());
        let mut reclassed = classed.clone();
        reclassed["spec"]["storageClassName"] = json!("slow");
        assert_eq!(validate_claim(&reclassed, Some(&classed)).len(), 1);
        // Bound at 1Gi: it may grow, never shrink to its capacity or below.
        let mut bound = pending.clone();
        bound["spec"]["volumeName"] = json!("pv1");
        bound["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
        let mut bigger = bound.clone();
        bigger["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert!(validate_claim(&bigger, Some(&bound)).is_empty());
        let mut smaller = bigger.clone();
        smaller["spec"]["resources"]["requests"]["storage"] = json!("512Mi");
        assert_eq!(
            messages(&validate_claim(&smaller, Some(&bigger))),
            vec!["spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"]
        );
        let mut modes = bound.clone();
        modes["spec"]["accessModes"] = json!(["ReadWriteMany"]);
        assert_eq!(validate_claim(&modes, Some(&bound)).len(), 1);
        let mut block = claim("1Gi");
        block["spec"]["volumeMode"] = json!("Disk");
        assert_eq!(
            messages(&validate_claim(&block, None)),
            vec!["spec.volumeMode: Unsupported value: \"Disk\": supported values: \"Block\", \"Filesystem\""]
        );
    }
}
