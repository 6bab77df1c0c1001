//! Per-field patch strategies of every kind skiff serves: which lists merge item by item and
//! on which key (Kubernetes' `patchStrategy:"merge"` / `patchMergeKey` struct tags), which
//! lists of scalars merge as sets. Everything not listed follows the defaults: objects and
//! maps merge recursively, lists are replaced whole (atomic), scalars are replaced.
//!
//! The table mirrors the Go tags of k8s.io/api; k8s-openapi's `DeepMerge` encodes the same
//! list semantics (from `x-kubernetes-list-type`), and the tests in `strategic.rs` check the
//! two agree on every merge list listed here. One known difference is deliberate: maps that
//! the OpenAPI marks `x-kubernetes-map-type: atomic` (a Service's `selector`, a pod's
//! `nodeSelector`) are replaced whole by DeepMerge (server-side apply semantics) but merged
//! key by key by strategic merge patch, which is what kubectl relies on.

use crate::machinery::GroupKind;

/// How one field of an object is merged.
#[derive(Debug)]
pub enum FieldStrategy {
    /// A list of objects merged on `key`; matching items merge by `item`.
    MergeByKey {
        key: &'static str,
        item: &'static Schema,
    },
    /// A list of scalars merged as a set (finalizers, podCIDRs).
    MergeSet,
    /// A nested object with list fields of its own.
    Object(&'static Schema),
}

/// The strategies of an object's fields; fields not listed use the defaults.
#[derive(Debug)]
pub struct Schema {
    pub fields: &'static [(&'static str, FieldStrategy)],
}

impl Schema {
    pub fn field(&self, name: &str) -> Option<&'static FieldStrategy> {
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, s)| s)
    }

    /// The schema that governs an object-valued field (the empty schema when not listed).
    pub fn object(&self, name: &str) -> &'static Schema {
        match self.field(name) {
            Some(FieldStrategy::Object(s)) => s,
            _ => &EMPTY,
        }
    }
}

pub static EMPTY: Schema = Schema { fields: &[] };

use FieldStrategy::{MergeByKey, MergeSet, Object};

static OBJECT_META: Schema = Schema {
    fields: &[
        (
            "ownerReferences",
            MergeByKey {
                key: "uid",
                item: &EMPTY,
            },
        ),
        ("finalizers", MergeSet),
    ],
};

static CONTAINER: Schema = Schema {
    fields: &[
        (
            "ports",
            MergeByKey {
                key: "containerPort",
                item: &EMPTY,
            },
        ),
        (
            "env",
            MergeByKey {
                key: "name",
                item: &EMPTY,
            },
        ),
        (
            "volumeMounts",
            MergeByKey {
                key: "mountPath",
                item: &EMPTY,
            },
        ),
        (
            "volumeDevices",
            MergeByKey {
                key: "devicePath",
                item: &EMPTY,
            },
        ),
    ],
};

const fn by_name(item: &'static Schema) -> FieldStrategy {
    MergeByKey { key: "name", item }
}

static POD_SPEC: Schema = Schema {
    fields: &[
        ("volumes", by_name(&EMPTY)),
        ("initContainers", by_name(&CONTAINER)),
        ("containers", by_name(&CONTAINER)),
        ("ephemeralContainers", by_name(&CONTAINER)),
        ("imagePullSecrets", by_name(&EMPTY)),
        (
            "hostAliases",
            MergeByKey {
                key: "ip",
                item: &EMPTY,
            },
        ),
        (
            "topologySpreadConstraints",
            MergeByKey {
                key: "topologyKey",
                item: &EMPTY,
            },
        ),
        ("schedulingGates", by_name(&EMPTY)),
        ("resourceClaims", by_name(&EMPTY)),
    ],
};

const fn by_type() -> FieldStrategy {
    MergeByKey {
        key: "type",
        item: &EMPTY,
    }
}

static POD_STATUS: Schema = Schema {
    fields: &[
        ("conditions", by_type()),
        (
            "podIPs",
            MergeByKey {
                key: "ip",
                item: &EMPTY,
            },
        ),
        (
            "hostIPs",
            MergeByKey {
                key: "ip",
                item: &EMPTY,
            },
        ),
        ("resourceClaimStatuses", by_name(&EMPTY)),
    ],
};

static POD_TEMPLATE: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        ("spec", Object(&POD_SPEC)),
    ],
};

static POD: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        ("spec", Object(&POD_SPEC)),
        ("status", Object(&POD_STATUS)),
    ],
};

static CONDITIONS: Schema = Schema {
    fields: &[("conditions", by_type())],
};

/// Deployments, ReplicaSets, DaemonSets, StatefulSets and Jobs: a pod template and status conditions.
static WORKLOAD: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        (
            "spec",
            Object(&Schema {
                fields: &[("template", Object(&POD_TEMPLATE))],
            }),
        ),
        ("status", Object(&CONDITIONS)),
    ],
};

/// CronJobs: a Job template holding a pod template.
static CRON_JOB: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        (
            "spec",
            Object(&Schema {
                fields: &[(
                    "jobTemplate",
                    Object(&Schema {
                        fields: &[
                            ("metadata", Object(&OBJECT_META)),
                            (
                                "spec",
                                Object(&Schema {
                                    fields: &[("template", Object(&POD_TEMPLATE))],
                                }),
                            ),
                        ],
                    }),
                )],
            }),
        ),
    ],
};

static SERVICE: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        (
            "spec",
            Object(&Schema {
                fields: &[(
                    "ports",
                    MergeByKey {
                        key: "port",
                        item: &EMPTY,
                    },
                )],
            }),
        ),
        ("status", Object(&CONDITIONS)),
    ],
};

static NODE: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        (
            "spec",
            Object(&Schema {
                fields: &[("podCIDRs", MergeSet)],
            }),
        ),
        (
            "status",
            Object(&Schema {
                fields: &[("conditions", by_type()), ("addresses", by_type())],
            }),
        ),
    ],
};

static NAMESPACE: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        ("status", Object(&CONDITIONS)),
    ],
};

static SERVICE_ACCOUNT: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        ("secrets", by_name(&EMPTY)),
    ],
};

/// CSINode: its drivers merge by name.
static CSI_NODE: Schema = Schema {
    fields: &[
        ("metadata", Object(&OBJECT_META)),
        (
            "spec",
            Object(&Schema {
                fields: &[("drivers", by_name(&EMPTY))],
            }),
        ),
    ],
};

/// Kinds whose only merge lists are in their metadata.
static METADATA_ONLY: Schema = Schema {
    fields: &[("metadata", Object(&OBJECT_META))],
};

/// The schema of a kind skiff serves, or None for a kind it does not know (Kubernetes then
/// refuses strategic merge patch, as it does for custom resources).
pub fn schema_for(kind: &GroupKind) -> Option<&'static Schema> {
    Some(match (kind.group.as_str(), kind.kind.as_str()) {
        ("", "Pod") => &POD,
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet") | ("batch", "Job") => {
            &WORKLOAD
        }
        ("batch", "CronJob") => &CRON_JOB,
        ("", "Service") => &SERVICE,
        ("", "Node") => &NODE,
        // Metadata and status conditions, as a Namespace.
        ("", "Namespace" | "PersistentVolumeClaim") => &NAMESPACE,
        // Metrics are an atomic list in k8s.io/api; status conditions merge by type.
        ("autoscaling", "HorizontalPodAutoscaler") => &NAMESPACE,
        ("policy", "PodDisruptionBudget") => &NAMESPACE,
        ("", "ServiceAccount") => &SERVICE_ACCOUNT,
        ("storage.k8s.io", "CSINode") => &CSI_NODE,
        ("", "Endpoints" | "Event" | "ConfigMap" | "Secret" | "Binding")
        | ("", "LimitRange" | "ResourceQuota")
        | (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        )
        | ("discovery.k8s.io", "EndpointSlice")
        | ("coordination.k8s.io", "Lease")
        | ("scheduling.k8s.io", "PriorityClass")
        | ("", "PersistentVolume")
        | (
            "storage.k8s.io",
            "StorageClass" | "CSIDriver" | "VolumeAttachment",
        )
        | ("apiextensions.k8s.io", "CustomResourceDefinition")
        | ("events.k8s.io", "Event")
        | ("apps", "ControllerRevision")
        | ("autoscaling", "Scale")
        // Rules, subjects and aggregation selectors are atomic lists in k8s.io/api.
        | (
            "rbac.authorization.k8s.io",
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding",
        ) => &METADATA_ONLY,
        _ => return None,
    })
}
