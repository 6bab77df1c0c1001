//! Storage: core/v1 PersistentVolume and storage.k8s.io/v1 StorageClass, CSIDriver, CSINode
//! and VolumeAttachment. Kubernetes' defaulters (a volume's Retain and Filesystem, a class's
//! Delete and Immediate, a driver's attach and mount flags), validation (capacity, access
//! modes, exactly one volume source, node affinity; what an update may change), and
//! kubectl's columns.

use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSINode, StorageClass, VolumeAttachment, VolumeAttachmentSpec,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::common::{
    age_cell, decode, default_row, default_typed, meta_errors, meta_field, name_cell,
    validate_typed,
};
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_subdomain_errors, invalid_each, qualified_name_errors, FieldPath, NameRule, Scope,
};
use crate::machinery::Quantity;

pub const GROUP: &str = "storage.k8s.io";

/// The annotation that marks the default StorageClass (and its beta spelling).
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
pub const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";

pub const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
const CLASS_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];
const FS_GROUP_POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];
const LIFECYCLE_MODES: &[&str] = &["Ephemeral", "Persistent"];
const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

/// Whether a StorageClass is marked the default (either annotation "true").
pub fn is_default_class(class: &Value) -> bool {
    let a = &class["metadata"]["annotations"];
    a[DEFAULT_CLASS_ANNOTATION] == "true" || a[BETA_DEFAULT_CLASS_ANNOTATION] == "true"
}

/// kubectl's access-mode short forms: RWO, ROX, RWX, RWOP.
pub fn access_modes_short(modes: &[String]) -> String {
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

/// A CSI driver's name (Kubernetes' ValidateCSIDriverName): a DNS subdomain of at most 63.
fn csi_driver_name_errors(name: &str, path: &FieldPath) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(path)];
    }
    let mut errs = vec![];
    if name.len() > 63 {
        errs.push(FieldError::too_long(path, 63));
    }
    errs.extend(invalid_each(
        path,
        name,
        dns1123_subdomain_errors(&name.to_lowercase()),
    ));
    errs
}

/// A storage quantity that must be above zero.
fn positive_quantity(q: &str, path: &FieldPath) -> Option<FieldError> {
    match Quantity::parse(q) {
        Ok(v) if v.nano_value() > 0 => None,
        Ok(_) => Some(FieldError::invalid(path, q, "must be greater than zero")),
        Err(_) => Some(FieldError::invalid(
            path,
            q,
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )),
    }
}

/// Access modes of a volume or claim: at least one, known ones, ReadWriteOncePod alone.
pub fn access_mode_errors(modes: &[String], path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    if modes.is_empty() {
        errs.push(FieldError::required(path));
    }
    for m in modes {
        if !ACCESS_MODES.contains(&m.as_str()) {
            errs.push(FieldError::not_supported(path, m, ACCESS_MODES));
        }
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        errs.push(FieldError::forbidden(
            path,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    errs
}

/// A required node selector (a volume's node affinity).
fn node_selector_errors(s: &NodeSelector, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let terms = path.child("nodeSelectorTerms");
    if s.node_selector_terms.is_empty() {
        errs.push(FieldError::required_because(
            &terms,
            "must have at least one node selector term",
        ));
    }
    for (i, t) in s.node_selector_terms.iter().enumerate() {
        let tp = terms.index(i);
        for (j, e) in t.match_expressions.iter().flatten().enumerate() {
            let ep = tp.child("matchExpressions").index(j);
            errs.extend(invalid_each(
                &ep.child("key"),
                &e.key,
                qualified_name_errors(&e.key),
            ));
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required_because(
                    ep.child("values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                )),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    errs.push(FieldError::forbidden(
                        ep.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ))
                }
                "Gt" | "Lt" if values.len() != 1 => errs.push(FieldError::required_because(
                    ep.child("values"),
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )),
                "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
                op => errs.push(FieldError::invalid(
                    ep.child("operator"),
                    op,
                    "not a valid selector operator",
                )),
            }
        }
    }
    errs
}

// ---------------------------------------------------------------- PersistentVolume

/// The volume sources set in a volume's spec, by their JSON names.
fn volume_sources(spec: &Value) -> Vec<&'static str> {
    const SOURCES: &[&str] = &[
        "awsElasticBlockStore",
        "azureDisk",
        "azureFile",
        "cephfs",
        "cinder",
        "csi",
        "fc",
        "flexVolume",
        "flocker",
        "gcePersistentDisk",
        "glusterfs",
        "hostPath",
        "iscsi",
        "local",
        "nfs",
        "photonPersistentDisk",
        "portworxVolume",
        "quobyte",
        "rbd",
        "scaleIO",
        "storageos",
        "vsphereVolume",
    ];
    SOURCES
        .iter()
        .copied()
        .filter(|s| spec.get(*s).is_some_and(|v| !v.is_null()))
        .collect()
}

pub fn default_volume(v: &mut Value) {
    default_typed(v, |pv: &mut PersistentVolume| {
        let spec = pv.spec.get_or_insert_with(Default::default);
        spec.persistent_volume_reclaim_policy
            .get_or_insert_with(|| "Retain".into());
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
        if let Some(h) = spec.host_path.as_mut() {
            h.type_.get_or_insert_with(String::new);
        }
        let status = pv.status.get_or_insert_with(Default::default);
        if status.phase.as_deref().unwrap_or_default().is_empty() {
            status.phase = Some("Pending".into());
        }
    });
}

fn validate_volume_spec(spec: &PersistentVolumeSpec, raw: &Value) -> Vec<FieldError> {
    let path = FieldPath::new("spec");
    let mut errs = vec![];
    let capacity = spec.capacity.clone().unwrap_or_default();
    if capacity.is_empty() {
        errs.push(FieldError::required(path.child("capacity")));
    }
    for (k, q) in &capacity {
        if k != "storage" {
            errs.push(FieldError::not_supported(
                path.child("capacity"),
                k,
                &["storage"],
            ));
            continue;
        }
        errs.extend(positive_quantity(&q.0, &path.child("capacity").key(k)));
    }
    if !capacity.is_empty() && !capacity.contains_key("storage") {
        errs.push(FieldError::required(path.child("capacity").key("storage")));
    }
    errs.extend(access_mode_errors(
        spec.access_modes.as_deref().unwrap_or_default(),
        &path.child("accessModes"),
    ));
    if let Some(p) = spec
        .persistent_volume_reclaim_policy
        .as_deref()
        .filter(|p| !PV_RECLAIM_POLICIES.contains(p))
    {
        errs.push(FieldError::not_supported(
            path.child("persistentVolumeReclaimPolicy"),
            p,
            PV_RECLAIM_POLICIES,
        ));
    }
    if let Some(m) = spec
        .volume_mode
        .as_deref()
        .filter(|m| !VOLUME_MODES.contains(m))
    {
        errs.push(FieldError::not_supported(
            path.child("volumeMode"),
            m,
            VOLUME_MODES,
        ));
    }
    if let Some(c) = spec.storage_class_name.as_deref().filter(|c| !c.is_empty()) {
        errs.extend(invalid_each(
            &path.child("storageClassName"),
            c,
            dns1123_subdomain_errors(c),
        ));
    }
    let sources = volume_sources(raw);
    match sources.as_slice() {
        [] => errs.push(FieldError::required_because(
            &path,
            "must specify a volume type",
        )),
        [_] => {}
        [_, rest @ ..] => {
            for s in rest {
                errs.push(FieldError::forbidden(
                    path.child(s),
                    "may not specify more than 1 volume type",
                ));
            }
        }
    }
    if let Some(csi) = &spec.csi {
        let p = path.child("csi");
        errs.extend(csi_driver_name_errors(&csi.driver, &p.child("driver")));
        if csi.volume_handle.is_empty() {
            errs.push(FieldError::required(p.child("volumeHandle")));
        }
    }
    if let Some(h) = &spec.host_path {
        let p = path.child("hostPath");
        if h.path.is_empty() {
            errs.push(FieldError::required(p.child("path")));
        } else if h.path.split('/').any(|s| s == "..") {
            errs.push(FieldError::invalid(
                p.child("path"),
                &h.path,
                "must not contain '..'",
            ));
        }
        if let Some(t) = h.type_.as_deref().filter(|t| !HOST_PATH_TYPES.contains(t)) {
            errs.push(FieldError::not_supported(
                p.child("type"),
                t,
                HOST_PATH_TYPES,
            ));
        }
    }
    if let Some(l) = &spec.local {
        let p = path.child("local");
        if l.path.is_empty() {
            errs.push(FieldError::required(p.child("path")));
        }
        if spec.node_affinity.is_none() {
            errs.push(FieldError::required_because(
                path.child("nodeAffinity"),
                "Local volume requires node affinity",
            ));
        }
    }
    if let Some(a) = &spec.node_affinity {
        let p = path.child("nodeAffinity");
        match &a.required {
            None => errs.push(FieldError::required_because(
                p.child("required"),
                "must specify required node constraints",
            )),
            Some(r) => errs.extend(node_selector_errors(r, &p.child("required"))),
        }
    }
    errs
}

pub fn validate_volume(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let raw_spec = new.get("spec").cloned().unwrap_or(Value::Null);
    validate_typed(
        new,
        old,
        |pv: &PersistentVolume, old: Option<&PersistentVolume>| {
            let mut errs = meta_errors(
                &pv.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            let spec = pv.spec.clone().unwrap_or_default();
            errs.extend(validate_volume_spec(&spec, &raw_spec));
            if let Some(old) = old {
                let o = old.spec.clone().unwrap_or_default();
                let source = |s: &PersistentVolumeSpec| {
                    let v = serde_json::to_value(s).unwrap_or(Value::Null);
                    volume_sources(&v)
                        .into_iter()
                        .map(|k| (k, v[k].clone()))
                        .collect::<Vec<_>>()
                };
                if source(&spec) != source(&o) {
                    errs.push(FieldError::forbidden(
                        "spec.persistentvolumesource",
                        "spec.persistentvolumesource is immutable after creation",
                    ));
                }
                if spec.volume_mode != o.volume_mode {
                    errs.push(FieldError::invalid(
                        "spec.volumeMode",
                        spec.volume_mode.as_deref().unwrap_or_default(),
                        "field is immutable",
                    ));
                }
                if o.node_affinity.is_some() && spec.node_affinity != o.node_affinity {
                    errs.push(FieldError::new(
                        CauseType::Invalid,
                        "spec.nodeAffinity",
                        "field is immutable",
                    ));
                }
            }
            errs
        },
    )
}

pub fn volume_columns() -> Vec<TableColumnDefinition> {
    let s = ColumnType::String;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Capacity", s, "capacity is the description of the persistent volume's resources and capacity."),
        TableColumnDefinition::new("Access Modes", s, "accessModes contains all ways the volume can be mounted."),
        TableColumnDefinition::new("Reclaim Policy", s, "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim."),
        TableColumnDefinition::new("Status", s, "phase indicates if a volume is available, bound to a claim, or released by a claim."),
        TableColumnDefinition::new("Claim", s, "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim."),
        TableColumnDefinition::new("StorageClass", s, "storageClassName is the name of StorageClass to which this persistent volume belongs."),
        TableColumnDefinition::new("VolumeAttributesClass", s, "Name of VolumeAttributesClass to which this persistent volume belongs."),
        TableColumnDefinition::new("Reason", s, "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI."),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("VolumeMode", s, "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.").wide(),
    ]
}

pub fn volume_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(pv) = decode::<PersistentVolume>(v) else {
        let mut r = default_row(v, now);
        r.resize(volume_columns().len(), Value::from(""));
        return r;
    };
    let spec = pv.spec.clone().unwrap_or_default();
    let status = pv.status.clone().unwrap_or_default();
    let capacity = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "0".into());
    let claim = spec
        .claim_ref
        .as_ref()
        .map(|c| {
            format!(
                "{}/{}",
                c.namespace.as_deref().unwrap_or_default(),
                c.name.as_deref().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let phase = if pv.metadata.deletion_timestamp.is_some() {
        "Terminating".to_string()
    } else {
        status.phase.unwrap_or_default()
    };
    vec![
        name_cell(&pv.metadata),
        Value::from(capacity),
        Value::from(access_modes_short(
            spec.access_modes.as_deref().unwrap_or_default(),
        )),
        Value::from(spec.persistent_volume_reclaim_policy.unwrap_or_default()),
        Value::from(phase),
        Value::from(claim),
        Value::from(spec.storage_class_name.unwrap_or_default()),
        Value::from(
            spec.volume_attributes_class_name
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "<unset>".into()),
        ),
        Value::from(status.reason.unwrap_or_default()),
        age_cell(&pv.metadata, now),
        Value::from(spec.volume_mode.unwrap_or_else(|| "<unset>".into())),
    ]
}

/// Volumes select on their phase besides metadata.
pub fn volume_field(v: &Value, field: &str) -> Option<String> {
    match field {
        "status.phase" => Some(super::common::scalar_at(v, "/status/phase")),
        _ => meta_field(v, field),
    }
}

// ---------------------------------------------------------------- StorageClass

pub fn default_class(v: &mut Value) {
    default_typed(v, |c: &mut StorageClass| {
        c.reclaim_policy.get_or_insert_with(|| "Delete".into());
        c.volume_binding_mode
            .get_or_insert_with(|| "Immediate".into());
    });
}

pub fn validate_class(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |c: &StorageClass, old: Option<&StorageClass>| {
        let mut errs = meta_errors(
            &c.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::Dns1123Subdomain,
        );
        if c.provisioner.is_empty() {
            errs.push(FieldError::required("provisioner"));
        } else {
            if c.provisioner.len() > 63 {
                errs.push(FieldError::too_long("provisioner", 63));
            }
            errs.extend(invalid_each(
                &FieldPath::new("provisioner"),
                &c.provisioner,
                qualified_name_errors(&c.provisioner.to_lowercase()),
            ));
        }
        for k in c.parameters.iter().flatten().map(|(k, _)| k) {
            if k.is_empty() {
                errs.push(FieldError::invalid(
                    "parameters",
                    k,
                    "field can not be empty.",
                ));
            }
        }
        match c.reclaim_policy.as_deref() {
            Some(p) if !CLASS_RECLAIM_POLICIES.contains(&p) => errs.push(
                FieldError::not_supported("reclaimPolicy", p, CLASS_RECLAIM_POLICIES),
            ),
            _ => {}
        }
        match c.volume_binding_mode.as_deref() {
            None => errs.push(FieldError::required("volumeBindingMode")),
            Some(m) if !BINDING_MODES.contains(&m) => errs.push(FieldError::not_supported(
                "volumeBindingMode",
                m,
                BINDING_MODES,
            )),
            _ => {}
        }
        for (i, t) in c.allowed_topologies.iter().flatten().enumerate() {
            let p = FieldPath::new("allowedTopologies").index(i);
            let exprs = t.match_label_expressions.as_deref().unwrap_or_default();
            if exprs.is_empty() {
                errs.push(FieldError::required_because(
                    p.child("matchLabelExpressions"),
                    "must have at least one label expression",
                ));
            }
            for (j, e) in exprs.iter().enumerate() {
                let ep = p.child("matchLabelExpressions").index(j);
                errs.extend(invalid_each(
                    &ep.child("key"),
                    &e.key,
                    qualified_name_errors(&e.key),
                ));
                if e.values.is_empty() {
                    errs.push(FieldError::required_because(
                        ep.child("values"),
                        "must specify as least one value",
                    ));
                }
            }
        }
        if let Some(old) = old {
            if c.parameters.clone().unwrap_or_default()
                != old.parameters.clone().unwrap_or_default()
            {
                errs.push(FieldError::forbidden(
                    "parameters",
                    "updates to parameters are forbidden.",
                ));
            }
            if c.provisioner != old.provisioner {
                errs.push(FieldError::forbidden(
                    "provisioner",
                    "updates to provisioner are forbidden.",
                ));
            }
            if c.reclaim_policy != old.reclaim_policy {
                errs.push(FieldError::forbidden(
                    "reclaimPolicy",
                    "updates to reclaimPolicy are forbidden.",
                ));
            }
            if c.volume_binding_mode != old.volume_binding_mode {
                errs.push(FieldError::invalid(
                    "volumeBindingMode",
                    c.volume_binding_mode.as_deref().unwrap_or_default(),
                    "field is immutable",
                ));
            }
        }
        errs
    })
}

pub fn class_columns() -> Vec<TableColumnDefinition> {
    let s = ColumnType::String;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Provisioner", s, "provisioner indicates the type of the provisioner."),
        TableColumnDefinition::new("ReclaimPolicy", s, "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class."),
        TableColumnDefinition::new("VolumeBindingMode", s, "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound."),
        TableColumnDefinition::new("AllowVolumeExpansion", s, "allowVolumeExpansion shows whether the storage class allow volume expand."),
        TableColumnDefinition::age_column(),
    ]
}

pub fn class_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(c) = decode::<StorageClass>(v) else {
        let mut r = default_row(v, now);
        r.resize(class_columns().len(), Value::from(""));
        return r;
    };
    let mut name = c.metadata.name.clone().unwrap_or_default();
    if is_default_class(v) {
        name.push_str(" (default)");
    }
    vec![
        Value::from(name),
        Value::from(c.provisioner.clone()),
        Value::from(c.reclaim_policy.unwrap_or_else(|| "Delete".into())),
        Value::from(c.volume_binding_mode.unwrap_or_else(|| "Immediate".into())),
        Value::from(c.allow_volume_expansion.unwrap_or(false).to_string()),
        age_cell(&c.metadata, now),
    ]
}

// ---------------------------------------------------------------- CSIDriver

pub fn default_driver(v: &mut Value) {
    default_typed(v, |d: &mut CSIDriver| {
        let s = &mut d.spec;
        s.attach_required.get_or_insert(true);
        s.pod_info_on_mount.get_or_insert(false);
        s.storage_capacity.get_or_insert(false);
        s.requires_republish.get_or_insert(false);
        s.se_linux_mount.get_or_insert(false);
        s.fs_group_policy
            .get_or_insert_with(|| "ReadWriteOnceWithFSType".into());
        if s.volume_lifecycle_modes.as_ref().is_none_or(Vec::is_empty) {
            s.volume_lifecycle_modes = Some(vec!["Persistent".into()]);
        }
    });
}

pub fn validate_driver(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |d: &CSIDriver, old: Option<&CSIDriver>| {
        let mut errs = meta_errors(
            &d.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::Dns1123Subdomain,
        );
        let name = d.metadata.name.as_deref().unwrap_or_default();
        if !name.is_empty() && name.len() > 63 {
            errs.push(FieldError::too_long("metadata.name", 63));
        }
        let spec = FieldPath::new("spec");
        let s = &d.spec;
        for (field, v) in [
            ("attachRequired", s.attach_required),
            ("podInfoOnMount", s.pod_info_on_mount),
            ("storageCapacity", s.storage_capacity),
            ("requiresRepublish", s.requires_republish),
        ] {
            if v.is_none() {
                errs.push(FieldError::required(spec.child(field)));
            }
        }
        match s.fs_group_policy.as_deref() {
            None => errs.push(FieldError::required(spec.child("fsGroupPolicy"))),
            Some(p) if !FS_GROUP_POLICIES.contains(&p) => errs.push(FieldError::not_supported(
                spec.child("fsGroupPolicy"),
                p,
                FS_GROUP_POLICIES,
            )),
            _ => {}
        }
        for m in s.volume_lifecycle_modes.iter().flatten() {
            if !LIFECYCLE_MODES.contains(&m.as_str()) {
                errs.push(FieldError::not_supported(
                    spec.child("volumeLifecycleModes"),
                    m,
                    LIFECYCLE_MODES,
                ));
            }
        }
        let mut audiences: Vec<&str> = vec![];
        for (i, t) in s.token_requests.iter().flatten().enumerate() {
            let p = spec.child("tokenRequests").index(i);
            if audiences.contains(&t.audience.as_str()) {
                errs.push(FieldError::duplicate(p.child("audience"), &t.audience));
            }
            audiences.push(&t.audience);
            if let Some(e) = t.expiration_seconds.filter(|e| *e < 600) {
                errs.push(FieldError::invalid_number(
                    p.child("expirationSeconds"),
                    e,
                    "may not specify a duration less than 10 minutes",
                ));
            }
        }
        if let Some(p) = s.node_allocatable_update_period_seconds.filter(|p| *p < 10) {
            errs.push(FieldError::invalid_number(
                spec.child("nodeAllocatableUpdatePeriodSeconds"),
                p,
                "must be greater than or equal to 10 seconds",
            ));
        }
        if let Some(old) = old {
            if s.attach_required != old.spec.attach_required {
                errs.push(FieldError::invalid(
                    spec.child("attachRequired"),
                    s.attach_required.unwrap_or_default(),
                    "field is immutable",
                ));
            }
            if s.volume_lifecycle_modes != old.spec.volume_lifecycle_modes {
                errs.push(FieldError::new(
                    CauseType::Invalid,
                    spec.child("volumeLifecycleModes"),
                    "field is immutable",
                ));
            }
        }
        errs
    })
}

pub fn driver_columns() -> Vec<TableColumnDefinition> {
    let (s, b) = (ColumnType::String, ColumnType::Boolean);
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("AttachRequired", b, "attachRequired indicates this CSI volume driver requires an attach operation."),
        TableColumnDefinition::new("PodInfoOnMount", b, "podInfoOnMount indicates this CSI volume driver requires additional pod information during mount operations."),
        TableColumnDefinition::new("StorageCapacity", b, "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity."),
        TableColumnDefinition::new("TokenRequests", s, "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication."),
        TableColumnDefinition::new("RequiresRepublish", b, "requiresRepublish indicates the CSI driver wants NodePublishVolume being periodically called."),
        TableColumnDefinition::new("Modes", s, "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports."),
        TableColumnDefinition::age_column(),
    ]
}

pub fn driver_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(d) = decode::<CSIDriver>(v) else {
        let mut r = default_row(v, now);
        r.resize(driver_columns().len(), Value::from(""));
        return r;
    };
    let s = &d.spec;
    let tokens: Vec<&str> = s
        .token_requests
        .iter()
        .flatten()
        .map(|t| t.audience.as_str())
        .collect();
    let modes = s.volume_lifecycle_modes.clone().unwrap_or_default();
    vec![
        name_cell(&d.metadata),
        Value::from(s.attach_required.unwrap_or(true)),
        Value::from(s.pod_info_on_mount.unwrap_or(false)),
        Value::from(s.storage_capacity.unwrap_or(false)),
        Value::from(if tokens.is_empty() {
            "<unset>".to_string()
        } else {
            tokens.join(",")
        }),
        Value::from(s.requires_republish.unwrap_or(false)),
        Value::from(if modes.is_empty() {
            "<none>".to_string()
        } else {
            modes.join(",")
        }),
        age_cell(&d.metadata, now),
    ]
}

// ---------------------------------------------------------------- CSINode

pub fn validate_node(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |n: &CSINode, old: Option<&CSINode>| {
        let mut errs = meta_errors(
            &n.metadata,
            old.map(|o| &o.metadata),
            Scope::Cluster,
            NameRule::Dns1123Subdomain,
        );
        let drivers = FieldPath::new("spec").child("drivers");
        let mut names: Vec<&str> = vec![];
        for (i, d) in n.spec.drivers.iter().enumerate() {
            let p = drivers.index(i);
            errs.extend(csi_driver_name_errors(&d.name, &p.child("name")));
            if names.contains(&d.name.as_str()) {
                errs.push(FieldError::duplicate(p.child("name"), &d.name));
            }
            names.push(&d.name);
            if d.node_id.is_empty() {
                errs.push(FieldError::required(p.child("nodeID")));
            } else if d.node_id.len() > 192 {
                errs.push(FieldError::too_long(p.child("nodeID"), 192));
            }
            let mut keys: Vec<&str> = vec![];
            for (j, k) in d.topology_keys.iter().flatten().enumerate() {
                let kp = p.child("topologyKeys").index(j);
                if k.is_empty() {
                    errs.push(FieldError::required(&kp));
                } else {
                    errs.extend(invalid_each(&kp, k, qualified_name_errors(k)));
                }
                if keys.contains(&k.as_str()) {
                    errs.push(FieldError::duplicate(&kp, k));
                }
                keys.push(k);
            }
            if let Some(c) = d.allocatable.as_ref().and_then(|a| a.count) {
                if c < 0 {
                    errs.push(FieldError::invalid_number(
                        p.child("allocatable").child("count"),
                        c.into(),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        if let Some(old) = old {
            for (i, d) in n.spec.drivers.iter().enumerate() {
                let Some(o) = old.spec.drivers.iter().find(|o| o.name == d.name) else {
                    continue;
                };
                let p = drivers.index(i);
                if d.node_id != o.node_id {
                    errs.push(FieldError::invalid(
                        p.child("nodeID"),
                        &d.node_id,
                        "field is immutable",
                    ));
                }
                if d.topology_keys.clone().unwrap_or_default()
                    != o.topology_keys.clone().unwrap_or_default()
                {
                    errs.push(FieldError::new(
                        CauseType::Invalid,
                        p.child("topologyKeys"),
                        "field is immutable",
                    ));
                }
                if d.allocatable != o.allocatable {
                    errs.push(FieldError::new(
                        CauseType::Invalid,
                        p.child("allocatable"),
                        "field is immutable",
                    ));
                }
            }
        }
        errs
    })
}

pub fn node_columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Drivers",
            ColumnType::Integer,
            "Drivers indicates the number of CSI drivers registered on the node",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn node_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(n) = decode::<CSINode>(v) else {
        let mut r = default_row(v, now);
        r.resize(node_columns().len(), Value::from(""));
        return r;
    };
    vec![
        name_cell(&n.metadata),
        json!(n.spec.drivers.len()),
        age_cell(&n.metadata, now),
    ]
}

// ---------------------------------------------------------------- VolumeAttachment

fn validate_attachment_spec(s: &VolumeAttachmentSpec) -> Vec<FieldError> {
    let spec = FieldPath::new("spec");
    let mut errs = csi_driver_name_errors(&s.attacher, &spec.child("attacher"));
    if s.node_name.is_empty() {
        errs.push(FieldError::required(spec.child("nodeName")));
    }
    let source = spec.child("source");
    let pv = s.source.persistent_volume_name.as_ref();
    match (pv, s.source.inline_volume_spec.as_ref()) {
        (None, None) => errs.push(FieldError::required_because(
            &source,
            "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
        )),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden(
            &source,
            "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
        )),
        (Some(name), None) if name.is_empty() => {
            errs.push(FieldError::required(source.child("persistentVolumeName")))
        }
        (None, Some(inline)) if inline.csi.is_none() => errs.push(FieldError::required_because(
            source.child("inlineVolumeSpec").child("csi"),
            "must specify csi",
        )),
        _ => {}
    }
    errs
}

pub fn validate_attachment(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(
        new,
        old,
        |a: &VolumeAttachment, old: Option<&VolumeAttachment>| {
            let mut errs = meta_errors(
                &a.metadata,
                old.map(|o| &o.metadata),
                Scope::Cluster,
                NameRule::Dns1123Subdomain,
            );
            errs.extend(validate_attachment_spec(&a.spec));
            if let Some(old) = old {
                if a.spec != old.spec {
                    errs.push(FieldError::new(
                        CauseType::Invalid,
                        "spec",
                        "field is immutable",
                    ));
                }
            }
            errs
        },
    )
}

pub fn attachment_columns() -> Vec<TableColumnDefinition> {
    let s = ColumnType::String;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new(
            "Attacher",
            s,
            "Attacher indicates the name of the volume driver that MUST handle this request.",
        ),
        TableColumnDefinition::new("PV", s, "Name of the persistent volume to attach."),
        TableColumnDefinition::new("Node", s, "The node that the volume should be attached to."),
        TableColumnDefinition::new(
            "Attached",
            ColumnType::Boolean,
            "Indicates the volume is successfully attached.",
        ),
        TableColumnDefinition::age_column(),
    ]
}

pub fn attachment_row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(a) = decode::<VolumeAttachment>(v) else {
        let mut r = default_row(v, now);
        r.resize(attachment_columns().len(), Value::from(""));
        return r;
    };
    vec![
        name_cell(&a.metadata),
        Value::from(a.spec.attacher.clone()),
        Value::from(
            a.spec
                .source
                .persistent_volume_name
                .clone()
                .unwrap_or_default(),
        ),
        Value::from(a.spec.node_name.clone()),
        Value::from(a.status.as_ref().is_some_and(|s| s.attached)),
        age_cell(&a.metadata, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    fn meta(name: &str) -> Value {
        json!({"name": name, "creationTimestamp": "2025-01-01T11:00:00Z"})
    }

    fn volume(spec: Value) -> Value {
        let mut v = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta("pv1"),
            "spec": spec});
        default_volume(&mut v);
        v
    }

    fn csi_spec() -> Value {
        json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "csi.skiff.dev", "volumeHandle": "vol-1"}})
    }

    #[test]
    fn volumes_default_and_validate_like_kubernetes() {
        let v = volume(csi_spec());
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert_eq!(v["status"]["phase"], "Pending");
        assert!(
            validate_volume(&v, None).is_empty(),
            "{:?}",
            validate_volume(&v, None)
        );
        assert!(validate_volume(&v, Some(&v)).is_empty());

        let mut bad = csi_spec();
        bad.as_object_mut().unwrap().remove("capacity");
        bad["accessModes"] = json!(["ReadWriteOncePod", "ReadWriteOnce"]);
        bad["persistentVolumeReclaimPolicy"] = json!("Keep");
        bad["csi"]["volumeHandle"] = json!("");
        bad["hostPath"] = json!({"path": "/data"});
        assert_eq!(
            messages(&validate_volume(&volume(bad), None)),
            vec![
                "spec.capacity: Required value",
                "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
                "spec.persistentVolumeReclaimPolicy: Unsupported value: \"Keep\": supported values: \"Delete\", \"Recycle\", \"Retain\"",
                "spec.hostPath: Forbidden: may not specify more than 1 volume type",
                "spec.csi.volumeHandle: Required value",
            ]
        );
        let mut modes = csi_spec();
        modes["accessModes"] = json!(["ReadWriteSometimes"]);
        modes["capacity"]["storage"] = json!("0");
        assert_eq!(
            messages(&validate_volume(&volume(modes), None)),
            vec![
                "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero",
                "spec.accessModes: Unsupported value: \"ReadWriteSometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"",
            ]
        );
        let none = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]});
        assert_eq!(
            messages(&validate_volume(&volume(none), None)),
            vec!["spec: Required value: must specify a volume type"]
        );
        let local = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/disk"}, "volumeMode": "Disk"});
        assert_eq!(
            messages(&validate_volume(&volume(local), None)),
            vec![
                "spec.volumeMode: Unsupported value: \"Disk\": supported values: \"Block\", \"Filesystem\"",
                "spec.nodeAffinity: Required value: Local volume requires node affinity",
            ]
        );
        let mut affinity = csi_spec();
        affinity["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In"},
            {"key": "zone", "operator": "Near", "values": ["a"]}]}]}});
        assert_eq!(
            messages(&validate_volume(&volume(affinity), None)),
            vec![
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[1].operator: Invalid value: \"Near\": not a valid selector operator",
            ]
        );
        let mut empty = csi_spec();
        empty["nodeAffinity"] = json!({});
        assert_eq!(
            messages(&validate_volume(&volume(empty), None)),
            vec!["spec.nodeAffinity.required: Required value: must specify required node constraints"]
        );
    }

    #[test]
    fn a_volume_keeps_its_source_and_mode() {
        let old = volume(csi_spec());
        let mut new = old.clone();
        new["spec"]["csi"]["volumeHandle"] = json!("vol-2");
        new["spec"]["volumeMode"] = json!("Block");
        new["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
        new["spec"]["capacity"]["storage"] = json!("2Gi");
        assert_eq!(
            messages(&validate_volume(&new, Some(&old))),
            vec![
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation",
                "spec.volumeMode: Invalid value: \"Block\": field is immutable",
            ]
        );
    }

    #[test]
    fn volume_rows_like_kubectl() {
        let mut v = volume(csi_spec());
        v["spec"]["claimRef"] = json!({"namespace": "default", "name": "data"});
        v["spec"]["storageClassName"] = json!("standard");
        v["status"]["phase"] = json!("Bound");
        assert_eq!(
            volume_row(&v, now()),
            vec![
                json!("pv1"),
                json!("1Gi"),
                json!("RWO"),
                json!("Retain"),
                json!("Bound"),
                json!("default/data"),
                json!("standard"),
                json!("<unset>"),
                json!(""),
                json!("60m"),
                json!("Filesystem"),
            ]
        );
        assert_eq!(volume_field(&v, "status.phase").as_deref(), Some("Bound"));
    }

    fn class(provisioner: &str) -> Value {
        let mut v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": meta("fast"), "provisioner": provisioner,
            "parameters": {"type": "ssd"}});
        default_class(&mut v);
        v
    }

    #[test]
    fn classes_default_validate_and_keep_their_provisioner() {
        let v = class("csi.skiff.dev");
        assert_eq!(v["reclaimPolicy"], "Delete");
        assert_eq!(v["volumeBindingMode"], "Immediate");
        assert!(validate_class(&v, None).is_empty());
        let mut bad = class("");
        bad["reclaimPolicy"] = json!("Recycle");
        bad["volumeBindingMode"] = json!("Later");
        bad["allowedTopologies"] = json!([{"matchLabelExpressions": []}]);
        assert_eq!(
            messages(&validate_class(&bad, None)),
            vec![
                "provisioner: Required value",
                "reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\"",
                "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
                "allowedTopologies[0].matchLabelExpressions: Required value: must have at least one label expression",
            ]
        );
        let mut new = v.clone();
        new["parameters"]["type"] = json!("hdd");
        new["provisioner"] = json!("other.dev");
        new["reclaimPolicy"] = json!("Retain");
        new["volumeBindingMode"] = json!("WaitForFirstConsumer");
        new["allowVolumeExpansion"] = json!(true);
        assert_eq!(
            messages(&validate_class(&new, Some(&v))),
            vec![
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable",
            ]
        );
        let mut expand = v.clone();
        expand["allowVolumeExpansion"] = json!(true);
        expand["metadata"]["annotations"] = json!({DEFAULT_CLASS_ANNOTATION: "true"});
        assert!(validate_class(&expand, Some(&v)).is_empty());
        assert_eq!(
            class_row(&expand, now()),
            vec![
                json!("fast (default)"),
                json!("csi.skiff.dev"),
                json!("Delete"),
                json!("Immediate"),
                json!("true"),
                json!("60m"),
            ]
        );
    }

    fn driver() -> Value {
        let mut v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": meta("csi.skiff.dev"), "spec": {}});
        default_driver(&mut v);
        v
    }

    #[test]
    fn drivers_default_and_keep_attach_and_modes() {
        let v = driver();
        let s = &v["spec"];
        assert_eq!(s["attachRequired"], true);
        assert_eq!(s["podInfoOnMount"], false);
        assert_eq!(s["storageCapacity"], false);
        assert_eq!(s["requiresRepublish"], false);
        assert_eq!(s["fsGroupPolicy"], "ReadWriteOnceWithFSType");
        assert_eq!(s["volumeLifecycleModes"], json!(["Persistent"]));
        assert!(validate_driver(&v, None).is_empty());
        let mut new = v.clone();
        new["spec"]["attachRequired"] = json!(false);
        new["spec"]["podInfoOnMount"] = json!(true);
        new["spec"]["volumeLifecycleModes"] = json!(["Persistent", "Ephemeral"]);
        assert_eq!(
            messages(&validate_driver(&new, Some(&v))),
            vec![
                "spec.attachRequired: Invalid value: \"false\": field is immutable",
                "spec.volumeLifecycleModes: field is immutable",
            ]
        );
        let mut bad = v.clone();
        bad["spec"]["fsGroupPolicy"] = json!("Sometimes");
        bad["spec"]["volumeLifecycleModes"] = json!(["Forever"]);
        assert_eq!(
            messages(&validate_driver(&bad, None)),
            vec![
                "spec.fsGroupPolicy: Unsupported value: \"Sometimes\": supported values: \"File\", \"None\", \"ReadWriteOnceWithFSType\"",
                "spec.volumeLifecycleModes: Unsupported value: \"Forever\": supported values: \"Ephemeral\", \"Persistent\"",
            ]
        );
        assert_eq!(
            driver_row(&v, now()),
            vec![
                json!("csi.skiff.dev"),
                json!(true),
                json!(false),
                json!(false),
                json!("<unset>"),
                json!(false),
                json!("Persistent"),
                json!("60m"),
            ]
        );
    }

    #[test]
    fn csi_nodes_name_each_driver_once() {
        let v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": meta("node-1"),
            "spec": {"drivers": [{"name": "csi.skiff.dev", "nodeID": "node-1",
                "topologyKeys": ["topology.skiff.dev/node"], "allocatable": {"count": 10}}]}});
        assert!(
            validate_node(&v, None).is_empty(),
            "{:?}",
            validate_node(&v, None)
        );
        assert_eq!(
            node_row(&v, now()),
            vec![json!("node-1"), json!(1), json!("60m")]
        );
        let mut bad = v.clone();
        bad["spec"]["drivers"] = json!([{"name": "csi.skiff.dev", "nodeID": "node-1"},
            {"name": "csi.skiff.dev", "nodeID": ""}]);
        assert_eq!(
            messages(&validate_node(&bad, None)),
            vec![
                "spec.drivers[1].name: Duplicate value: \"csi.skiff.dev\"",
                "spec.drivers[1].nodeID: Required value",
            ]
        );
        let mut moved = v.clone();
        moved["spec"]["drivers"][0]["nodeID"] = json!("node-2");
        assert_eq!(
            messages(&validate_node(&moved, Some(&v))),
            vec!["spec.drivers[0].nodeID: Invalid value: \"node-2\": field is immutable"]
        );
    }

    #[test]
    fn attachments_name_one_source_and_never_change() {
        let v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": meta("csi-123"),
            "spec": {"attacher": "csi.skiff.dev", "nodeName": "node-1",
                "source": {"persistentVolumeName": "pv1"}}});
        assert!(validate_attachment(&v, None).is_empty());
        assert_eq!(
            attachment_row(&v, now()),
            vec![
                json!("csi-123"),
                json!("csi.skiff.dev"),
                json!("pv1"),
                json!("node-1"),
                json!(false),
                json!("60m"),
            ]
        );
        let bad = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": meta("csi-123"), "spec": {"attacher": "csi.skiff.dev", "source": {}}});
        assert_eq!(
            messages(&validate_attachment(&bad, None)),
            vec![
                "spec.nodeName: Required value",
                "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            ]
        );
        let mut moved = v.clone();
        moved["spec"]["nodeName"] = json!("node-2");
        assert_eq!(
            messages(&validate_attachment(&moved, Some(&v))),
            vec!["spec: field is immutable"]
        );
        let mut attached = v.clone();
        attached["status"] = json!({"attached": true});
        assert!(validate_attachment(&attached, Some(&v)).is_empty());
    }
}
