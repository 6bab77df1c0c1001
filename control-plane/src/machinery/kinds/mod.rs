//! Per-kind rules, one registration each: defaulting, validation, kubectl's table columns
//! and rows, and field-selector values. A file per kind family; `rules()` is the registry
//! the API server consults by group and kind.
//!
//! Every function works on the JSON object (as stored and served) and decodes into the
//! k8s-openapi type inside where that helps.

mod admissionregistration;
pub mod apiextensions;
mod apps;
mod autoscaling;
pub mod batch;
pub mod certificates;
mod common;
mod coordination;
mod core;
mod discovery;
pub mod events;
pub mod hpa;
mod limits;
mod node;
mod pod;
pub mod policy;
pub mod rbac;
pub mod scheduling;
mod service;
mod statefulset;
pub mod storage;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::status::FieldError;
use super::table::TableColumnDefinition;

pub use common::{format_labels, format_selector, meta_field};
pub use pod::{
    add_default_tolerations, default_pod_spec, default_pull_policy, qos_class,
    validate_ephemeral_update, validate_pod_spec, validate_toleration, DEFAULT_TOLERATION_SECONDS,
};

/// What the API server does with one kind beyond storing it.
pub struct KindRules {
    /// Kubernetes' defaulters (and the stateless admission defaults) for a create or update
    /// body. Allocation of cluster IPs and node ports is the server's, not this.
    pub default: fn(&mut Value),
    /// Validation of `new`; `old` is the stored object on update (immutable fields).
    pub validate: fn(new: &Value, old: Option<&Value>) -> Vec<FieldError>,
    /// kubectl's columns for `get`; wide ones have priority 1.
    pub columns: fn() -> Vec<TableColumnDefinition>,
    /// One Table row's cells, aligned with `columns`, ages relative to `now`.
    pub row: fn(&Value, now: Timestamp) -> Vec<Value>,
    /// The value of a field-selector field, or None when the kind does not support it
    /// (the server answers 400 then, as Kubernetes does).
    pub field: fn(&Value, &str) -> Option<String>,
}

fn no_defaults(_: &mut Value) {}

/// Whether Kubernetes keeps `metadata.generation` for the kind: its strategies set it to 1 on
/// create and bump it when the spec changes for pods, workloads and EndpointSlices; other
/// kinds (ConfigMaps, Services, Nodes...) have none.
pub fn tracks_generation(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        ("", "Pod" | "ReplicationController")
            | (
                "apps",
                "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet"
            )
            | ("batch", "Job" | "CronJob")
            | ("discovery.k8s.io", "EndpointSlice")
            | ("networking.k8s.io", "Ingress" | "NetworkPolicy")
            | ("policy", "PodDisruptionBudget")
            | ("autoscaling", "HorizontalPodAutoscaler")
    )
}

static CUSTOM_RESOURCE_DEFINITION: KindRules = KindRules {
    default: apiextensions::default,
    validate: apiextensions::validate,
    columns: common::default_columns,
    row: common::default_row,
    field: common::meta_field,
};
static PRIORITY_CLASS: KindRules = KindRules {
    default: scheduling::default,
    validate: scheduling::validate,
    columns: scheduling::columns,
    row: scheduling::row,
    field: common::meta_field,
};
static POD_DISRUPTION_BUDGET: KindRules = KindRules {
    default: no_defaults,
    validate: policy::validate,
    columns: policy::columns,
    row: policy::row,
    field: common::meta_field,
};
static NAMESPACE: KindRules = KindRules {
    default: core::default_namespace,
    validate: core::validate_namespace,
    columns: core::namespace_columns,
    row: core::namespace_row,
    field: core::namespace_field,
};
static POD: KindRules = KindRules {
    default: pod::default,
    validate: pod::validate,
    columns: pod::columns,
    row: pod::row,
    field: pod::field,
};
static SERVICE: KindRules = KindRules {
    default: service::default,
    validate: service::validate,
    columns: service::columns,
    row: service::row,
    field: service::field,
};
static ENDPOINTS: KindRules = KindRules {
    default: core::default_endpoints,
    validate: core::validate_endpoints,
    columns: core::endpoints_columns,
    row: core::endpoints_row,
    field: common::meta_field,
};
static NODE: KindRules = KindRules {
    default: node::default,
    validate: node::validate,
    columns: node::columns,
    row: node::row,
    field: node::field,
};
static EVENT: KindRules = KindRules {
    default: no_defaults,
    validate: events::validate_core,
    columns: events::columns,
    row: events::core_row,
    field: events::core_field,
};
static CONFIG_MAP: KindRules = KindRules {
    default: no_defaults,
    validate: core::validate_config_map,
    columns: core::config_map_columns,
    row: core::config_map_row,
    field: common::meta_field,
};
static SECRET: KindRules = KindRules {
    default: core::default_secret,
    validate: core::validate_secret,
    columns: core::secret_columns,
    row: core::secret_row,
    field: core::secret_field,
};
static SERVICE_ACCOUNT: KindRules = KindRules {
    default: no_defaults,
    validate: core::validate_service_account,
    columns: core::service_account_columns,
    row: core::service_account_row,
    field: common::meta_field,
};
static LIMIT_RANGE: KindRules = KindRules {
    default: limits::default_limit_range,
    validate: limits::validate_limit_range,
    columns: limits::limit_range_columns,
    row: limits::limit_range_row,
    field: common::meta_field,
};
static RESOURCE_QUOTA: KindRules = KindRules {
    default: no_defaults,
    validate: limits::validate_resource_quota,
    columns: limits::resource_quota_columns,
    row: limits::resource_quota_row,
    field: common::meta_field,
};
static MUTATING_WEBHOOKS: KindRules = KindRules {
    default: admissionregistration::default_mutating,
    validate: admissionregistration::validate_mutating,
    columns: admissionregistration::columns,
    row: admissionregistration::mutating_row,
    field: common::meta_field,
};
static VALIDATING_WEBHOOKS: KindRules = KindRules {
    default: admissionregistration::default_validating,
    validate: admissionregistration::validate_validating,
    columns: admissionregistration::columns,
    row: admissionregistration::validating_row,
    field: common::meta_field,
};
static BINDING: KindRules = KindRules {
    default: no_defaults,
    validate: core::validate_binding,
    columns: common::default_columns,
    row: common::default_row,
    field: common::meta_field,
};
static DEPLOYMENT: KindRules = KindRules {
    default: apps::default_deployment,
    validate: apps::validate_deployment,
    columns: apps::deployment_columns,
    row: apps::deployment_row,
    field: common::meta_field,
};
static REPLICA_SET: KindRules = KindRules {
    default: apps::default_replica_set,
    validate: apps::validate_replica_set,
    columns: apps::replica_set_columns,
    row: apps::replica_set_row,
    field: apps::replica_set_field,
};
static DAEMON_SET: KindRules = KindRules {
    default: apps::default_daemon_set,
    validate: apps::validate_daemon_set,
    columns: apps::daemon_set_columns,
    row: apps::daemon_set_row,
    field: common::meta_field,
};
static ENDPOINT_SLICE: KindRules = KindRules {
    default: discovery::default,
    validate: discovery::validate,
    columns: discovery::columns,
    row: discovery::row,
    field: common::meta_field,
};
static LEASE: KindRules = KindRules {
    default: no_defaults,
    validate: coordination::validate,
    columns: coordination::columns,
    row: coordination::row,
    field: common::meta_field,
};
static EVENTS_V1_EVENT: KindRules = KindRules {
    default: no_defaults,
    validate: events::validate_events_v1,
    columns: events::columns,
    row: events::events_v1_row,
    field: events::events_v1_field,
};
static ROLE: KindRules = KindRules {
    default: no_defaults,
    validate: rbac::validate_role,
    columns: rbac::role_columns,
    row: common::default_row,
    field: common::meta_field,
};
static CLUSTER_ROLE: KindRules = KindRules {
    default: no_defaults,
    validate: rbac::validate_cluster_role,
    columns: rbac::role_columns,
    row: common::default_row,
    field: common::meta_field,
};
static ROLE_BINDING: KindRules = KindRules {
    default: rbac::default_role_binding,
    validate: rbac::validate_role_binding,
    columns: rbac::binding_columns,
    row: rbac::role_binding_row,
    field: common::meta_field,
};
static CLUSTER_ROLE_BINDING: KindRules = KindRules {
    default: rbac::default_cluster_role_binding,
    validate: rbac::validate_cluster_role_binding,
    columns: rbac::binding_columns,
    row: rbac::cluster_role_binding_row,
    field: common::meta_field,
};
static JOB: KindRules = KindRules {
    default: batch::default_job,
    validate: batch::validate_job,
    columns: batch::job_columns,
    row: batch::job_row,
    field: batch::job_field,
};
static CRON_JOB: KindRules = KindRules {
    default: batch::default_cron_job,
    validate: batch::validate_cron_job,
    columns: batch::cron_job_columns,
    row: batch::cron_job_row,
    field: common::meta_field,
};
static STATEFUL_SET: KindRules = KindRules {
    default: statefulset::default_stateful_set,
    validate: statefulset::validate_stateful_set,
    columns: statefulset::stateful_set_columns,
    row: statefulset::stateful_set_row,
    field: common::meta_field,
};
static CONTROLLER_REVISION: KindRules = KindRules {
    default: no_defaults,
    validate: statefulset::validate_controller_revision,
    columns: statefulset::controller_revision_columns,
    row: statefulset::controller_revision_row,
    field: common::meta_field,
};
static PERSISTENT_VOLUME_CLAIM: KindRules = KindRules {
    default: statefulset::default_claim,
    validate: statefulset::validate_claim,
    columns: statefulset::claim_columns,
    row: statefulset::claim_row,
    field: statefulset::claim_field,
};
static PERSISTENT_VOLUME: KindRules = KindRules {
    default: storage::default_volume,
    validate: storage::validate_volume,
    columns: storage::volume_columns,
    row: storage::volume_row,
    field: storage::volume_field,
};
static STORAGE_CLASS: KindRules = KindRules {
    default: storage::default_class,
    validate: storage::validate_class,
    columns: storage::class_columns,
    row: storage::class_row,
    field: common::meta_field,
};
static CSI_DRIVER: KindRules = KindRules {
    default: storage::default_driver,
    validate: storage::validate_driver,
    columns: storage::driver_columns,
    row: storage::driver_row,
    field: common::meta_field,
};
static CSI_NODE: KindRules = KindRules {
    default: no_defaults,
    validate: storage::validate_node,
    columns: storage::node_columns,
    row: storage::node_row,
    field: common::meta_field,
};
static VOLUME_ATTACHMENT: KindRules = KindRules {
    default: no_defaults,
    validate: storage::validate_attachment,
    columns: storage::attachment_columns,
    row: storage::attachment_row,
    field: common::meta_field,
};
static CERTIFICATE_SIGNING_REQUEST: KindRules = KindRules {
    default: no_defaults,
    validate: certificates::validate,
    columns: certificates::columns,
    row: certificates::row,
    field: certificates::field,
};
static HPA: KindRules = KindRules {
    default: hpa::default,
    validate: hpa::validate,
    columns: hpa::columns,
    row: hpa::row,
    field: common::meta_field,
};
/// autoscaling/v1 HorizontalPodAutoscaler: validated and printed as its v2 form.
static HPA_V1: KindRules = KindRules {
    default: hpa::default_v1,
    validate: hpa::validate_v1,
    columns: hpa::columns,
    row: hpa::row_v1,
    field: common::meta_field,
};
static SCALE: KindRules = KindRules {
    default: no_defaults,
    validate: autoscaling::validate,
    columns: common::default_columns,
    row: common::default_row,
    field: common::meta_field,
};

/// The rules of a kind at one version: the kind's own, but for a kind served at several
/// versions whose shapes differ (autoscaling/v1 HorizontalPodAutoscaler).
pub fn rules_at(group: &str, version: &str, kind: &str) -> Option<&'static KindRules> {
    match (group, version, kind) {
        (hpa::GROUP, "v1", "HorizontalPodAutoscaler") => Some(&HPA_V1),
        _ => rules(group, kind),
    }
}

/// The rules of a kind skiff serves (group "" is core), or None.
pub fn rules(group: &str, kind: &str) -> Option<&'static KindRules> {
    Some(match (group, kind) {
        ("", "Namespace") => &NAMESPACE,
        ("", "Pod") => &POD,
        ("", "Service") => &SERVICE,
        ("", "Endpoints") => &ENDPOINTS,
        ("", "Node") => &NODE,
        ("", "Event") => &EVENT,
        ("", "ConfigMap") => &CONFIG_MAP,
        ("", "Secret") => &SECRET,
        ("", "ServiceAccount") => &SERVICE_ACCOUNT,
        ("", "Binding") => &BINDING,
        ("", "LimitRange") => &LIMIT_RANGE,
        ("", "ResourceQuota") => &RESOURCE_QUOTA,
        ("apps", "Deployment") => &DEPLOYMENT,
        ("apps", "ReplicaSet") => &REPLICA_SET,
        ("apps", "DaemonSet") => &DAEMON_SET,
        ("discovery.k8s.io", "EndpointSlice") => &ENDPOINT_SLICE,
        ("coordination.k8s.io", "Lease") => &LEASE,
        ("events.k8s.io", "Event") => &EVENTS_V1_EVENT,
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => &MUTATING_WEBHOOKS,
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => &VALIDATING_WEBHOOKS,
        ("autoscaling", "Scale") => &SCALE,
        (rbac::GROUP, "Role") => &ROLE,
        (rbac::GROUP, "ClusterRole") => &CLUSTER_ROLE,
        (rbac::GROUP, "RoleBinding") => &ROLE_BINDING,
        (rbac::GROUP, "ClusterRoleBinding") => &CLUSTER_ROLE_BINDING,
        ("batch", "Job") => &JOB,
        ("batch", "CronJob") => &CRON_JOB,
        ("apps", "StatefulSet") => &STATEFUL_SET,
        ("apps", "ControllerRevision") => &CONTROLLER_REVISION,
        ("", "PersistentVolumeClaim") => &PERSISTENT_VOLUME_CLAIM,
        ("", "PersistentVolume") => &PERSISTENT_VOLUME,
        (storage::GROUP, "StorageClass") => &STORAGE_CLASS,
        (storage::GROUP, "CSIDriver") => &CSI_DRIVER,
        (storage::GROUP, "CSINode") => &CSI_NODE,
        (storage::GROUP, "VolumeAttachment") => &VOLUME_ATTACHMENT,
        (certificates::GROUP, "CertificateSigningRequest") => &CERTIFICATE_SIGNING_REQUEST,
        (scheduling::GROUP, "PriorityClass") => &PRIORITY_CLASS,
        (apiextensions::GROUP, "CustomResourceDefinition") => &CUSTOM_RESOURCE_DEFINITION,
        (hpa::GROUP, "HorizontalPodAutoscaler") => &HPA,
        (policy::GROUP, "PodDisruptionBudget") => &POD_DISRUPTION_BUDGET,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(super) fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    /// A minimal valid object of each served kind, as a client would send it.
    pub(super) fn minimal(group: &str, kind: &str) -> Value {
        let api_version = if group.is_empty() {
            "v1".to_string()
        } else if group == "autoscaling" {
            "autoscaling/v1".into()
        } else {
            format!("{group}/v1")
        };
        let namespaced = !matches!(
            kind,
            "Namespace"
                | "Node"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "CertificateSigningRequest"
                | "PriorityClass"
                | "PersistentVolume"
                | "StorageClass"
                | "CSIDriver"
                | "CSINode"
                | "VolumeAttachment"
        );
        let mut v = json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"name": "web", "creationTimestamp": "2025-01-01T11:55:00Z"}
        });
        if namespaced {
            v["metadata"]["namespace"] = json!("default");
        }
        let template = json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
        });
        match (group, kind) {
            ("", "Pod") => v["spec"] = template["spec"].clone(),
            ("", "Service") => {
                v["spec"] = json!({"selector": {"app": "web"}, "ports": [{"port": 80}]})
            }
            ("", "Event") => {
                v["involvedObject"] =
                    json!({"kind": "Pod", "name": "web-1", "namespace": "default"});
                v["reason"] = json!("Scheduled");
                v["message"] = json!("Successfully assigned default/web-1 to node-1");
                v["type"] = json!("Normal");
            }
            ("", "Binding") => v["target"] = json!({"kind": "Node", "name": "node-1"}),
            ("apps", "Deployment" | "ReplicaSet" | "DaemonSet") => {
                v["spec"] =
                    json!({"selector": {"matchLabels": {"app": "web"}}, "template": template})
            }
            ("discovery.k8s.io", "EndpointSlice") => {
                v["addressType"] = json!("IPv4");
                v["endpoints"] = json!([{"addresses": ["10.244.1.5"]}]);
                v["ports"] = json!([{"port": 8080}]);
            }
            ("events.k8s.io", "Event") => {
                v["eventTime"] = json!("2025-01-01T11:59:55.000000Z");
                v["regarding"] = json!({"kind": "Pod", "name": "web-1", "namespace": "default"});
                v["reason"] = json!("Scheduled");
                v["action"] = json!("Binding");
                v["reportingController"] = json!("default-scheduler");
                v["reportingInstance"] = json!("default-scheduler-1");
                v["type"] = json!("Normal");
                v["note"] = json!("Successfully assigned default/web-1 to node-1");
            }
            ("autoscaling", "Scale") => v["spec"] = json!({"replicas": 3}),
            (rbac::GROUP, "Role" | "ClusterRole") => {
                v["rules"] = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
            }
            (rbac::GROUP, "RoleBinding" | "ClusterRoleBinding") => {
                v["roleRef"] =
                    json!({"apiGroup": rbac::GROUP, "kind": "ClusterRole", "name": "view"});
                v["subjects"] = json!([{"kind": "User", "name": "jane"}]);
            }
            ("apps", "StatefulSet") => {
                v["spec"] = json!({"serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                    "template": template})
            }
            ("apps", "ControllerRevision") => {
                v["revision"] = json!(1);
                v["data"] = json!({"spec": {"template": template}});
            }
            ("", "PersistentVolumeClaim") => {
                v["spec"] = json!({"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}})
            }
            ("batch", "Job") => {
                // The server assigns the uid before defaulting, which derives the selector.
                v["metadata"]["uid"] = json!("6b7b2d1c-0000-4000-8000-000000000001");
                v["spec"] = json!({"template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "pi", "image": "perl"}]}}});
            }
            ("batch", "CronJob") => {
                v["spec"] = json!({"schedule": "*/1 * * * *", "jobTemplate": {"spec": {
                    "template": {"spec": {"restartPolicy": "OnFailure",
                        "containers": [{"name": "tick", "image": "busybox"}]}}}}});
            }
            (certificates::GROUP, "CertificateSigningRequest") => {
                let csr = certificates::tests::minimal("web", "jane", None);
                v["spec"] = csr["spec"].clone();
            }
            (scheduling::GROUP, "PriorityClass") => v["value"] = json!(1000),
            ("", "PersistentVolume") => {
                v["spec"] = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "csi": {"driver": "csi.skiff.dev", "volumeHandle": "vol-1"}})
            }
            (storage::GROUP, "StorageClass") => v["provisioner"] = json!("csi.skiff.dev"),
            (storage::GROUP, "CSIDriver") => v["spec"] = json!({}),
            (storage::GROUP, "CSINode") => {
                v["spec"] = json!({"drivers": [{"name": "csi.skiff.dev", "nodeID": "web"}]})
            }
            (storage::GROUP, "VolumeAttachment") => {
                v["spec"] = json!({"attacher": "csi.skiff.dev", "nodeName": "node-1",
                    "source": {"persistentVolumeName": "pv1"}})
            }
            (hpa::GROUP, "HorizontalPodAutoscaler") => {
                v["apiVersion"] = json!("autoscaling/v2");
                v["spec"] = hpa::tests::minimal("web")["spec"].clone();
            }
            (policy::GROUP, "PodDisruptionBudget") => {
                v["spec"] = json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}})
            }
            _ => {}
        }
        v
    }

    pub(super) const SERVED: &[(&str, &str)] = &[
        ("", "Namespace"),
        ("", "Pod"),
        ("", "Service"),
        ("", "Endpoints"),
        ("", "Node"),
        ("", "Event"),
        ("", "ConfigMap"),
        ("", "Secret"),
        ("", "ServiceAccount"),
        ("", "Binding"),
        ("apps", "Deployment"),
        ("apps", "ReplicaSet"),
        ("apps", "DaemonSet"),
        ("discovery.k8s.io", "EndpointSlice"),
        ("coordination.k8s.io", "Lease"),
        ("events.k8s.io", "Event"),
        ("autoscaling", "Scale"),
        (rbac::GROUP, "Role"),
        (rbac::GROUP, "ClusterRole"),
        (rbac::GROUP, "RoleBinding"),
        (rbac::GROUP, "ClusterRoleBinding"),
        ("batch", "Job"),
        ("batch", "CronJob"),
        ("apps", "StatefulSet"),
        ("apps", "ControllerRevision"),
        ("", "PersistentVolumeClaim"),
        ("", "PersistentVolume"),
        (storage::GROUP, "StorageClass"),
        (storage::GROUP, "CSIDriver"),
        (storage::GROUP, "CSINode"),
        (storage::GROUP, "VolumeAttachment"),
        (certificates::GROUP, "CertificateSigningRequest"),
        (scheduling::GROUP, "PriorityClass"),
        (hpa::GROUP, "HorizontalPodAutoscaler"),
        (policy::GROUP, "PodDisruptionBudget"),
    ];

    #[test]
    fn every_served_kind_is_registered_and_consistent() {
        for &(group, kind) in SERVED {
            let r = rules(group, kind).unwrap_or_else(|| panic!("{group}/{kind}"));
            let mut v = minimal(group, kind);
            (r.default)(&mut v);
            assert_eq!(v["kind"], kind, "defaulting keeps the kind");
            let errs = (r.validate)(&v, None);
            assert!(errs.is_empty(), "{group}/{kind}: {errs:?}");
            assert!(
                (r.validate)(&v, Some(&v)).is_empty(),
                "{group}/{kind} update"
            );
            let columns = (r.columns)();
            let row = (r.row)(&v, now());
            assert_eq!(row.len(), columns.len(), "{group}/{kind} row width");
            assert_eq!(
                columns.iter().filter(|c| c.format == "name").count(),
                1,
                "{group}/{kind}"
            );
            assert_eq!((r.field)(&v, "metadata.name").as_deref(), Some("web"));
            assert_eq!((r.field)(&v, "no.such.field"), None);
            // Defaulting is idempotent.
            let mut again = v.clone();
            (r.default)(&mut again);
            assert_eq!(again, v, "{group}/{kind}");
        }
        assert!(rules("apps", "NoSuchKind").is_none());
    }

    #[test]
    fn a_bad_body_is_a_validation_error_not_a_panic() {
        for &(group, kind) in SERVED {
            let r = rules(group, kind).unwrap();
            let mut bad = json!({"metadata": {"name": 5}, "spec": "nope"});
            (r.default)(&mut bad);
            assert!(!(r.validate)(&bad, None).is_empty(), "{group}/{kind}");
            let row = (r.row)(&bad, now());
            assert!(!row.is_empty());
            assert_eq!(
                (r.field)(&json!(null), "metadata.name").as_deref(),
                Some("")
            );
        }
    }
}
