//! Kubernetes' bootstrap RBAC policy: the default ClusterRoles (cluster-admin, admin, edit and
//! view with their aggregation labels, the `system:` roles of discovery, nodes, the scheduler,
//! the controller manager and its controllers, the proxy, CSR approval, delegated auth,
//! monitoring) and their ClusterRoleBindings, written at every start and reconciled as
//! Kubernetes reconciles them: an object annotated `rbac.authorization.kubernetes.io/autoupdate:
//! "false"` is left alone; otherwise missing rules, aggregation selectors, subjects, labels and
//! annotations are added and nothing is taken away.
//!
//! The controller manager runs as one identity (`system:kube-controller-manager`), so its role
//! is Kubernetes' own plus the rules of the per-controller roles of the controllers skiff runs
//! (the `system:controller:*` roles exist too, bound to their kube-system service accounts as in
//! Kubernetes).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::Value;

use super::rules::{covers, Rule};
use super::RBAC_GROUP;
use crate::apiserver::{meta, registry};
use crate::store::{Precondition, Store, StoreError, WriteOp};

/// The annotation that keeps a bootstrap object from being reconciled when "false".
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
/// The label every bootstrap object carries.
pub const BOOTSTRAPPING: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
pub const AGGREGATE_TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
pub const AGGREGATE_TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
pub const AGGREGATE_TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = registry::VERBS;
const EVENTS: &[&str] = &["create", "patch", "update"];

fn r(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Rule {
    Rule::resource(verbs, groups, resources)
}

fn events_rule() -> Rule {
    r(EVENTS, &["", "events.k8s.io"], &["events"])
}

/// A bootstrap ClusterRole.
fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Rule>) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_meta(name, labels),
        rules: Some(rules.iter().map(PolicyRule::from).collect()),
        aggregation_rule: None,
    }
}

/// A bootstrap ClusterRole whose rules are those of the roles carrying `label: "true"`.
fn aggregated(name: &str, labels: &[(&str, &str)], label: &str) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_meta(name, labels),
        rules: None,
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some([(label.to_string(), "true".to_string())].into()),
                match_expressions: None,
            }]),
        }),
    }
}

fn bootstrap_meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert(BOOTSTRAPPING.0.into(), BOOTSTRAPPING.1.into());
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(l),
        annotations: Some([(AUTOUPDATE.to_string(), "true".to_string())].into()),
        ..Default::default()
    }
}

/// What the Node authorizer lets every node do beyond its own pods' objects (Kubernetes'
/// `NodeRules`, which are also the `system:node` role's rules).
pub fn node_rules() -> Vec<Rule> {
    vec![
        r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        r(
            &["create"],
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews", "subjectaccessreviews"],
        ),
        r(READ, &[""], &["services"]),
        r(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        r(&["patch", "update"], &[""], &["nodes/status"]),
        r(&["patch", "update"], &[""], &["nodes"]),
        r(EVENTS, &[""], &["events"]),
        r(READ, &[""], &["pods"]),
        r(&["create", "delete"], &[""], &["pods"]),
        r(&["patch", "update"], &[""], &["pods/status"]),
        r(&["create"], &[""], &["pods/eviction"]),
        r(READ, &[""], &["configmaps", "secrets"]),
        r(
            &["get"],
            &[""],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        r(&["get"], &[""], &["endpoints"]),
        r(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        r(
            &["create", "delete", "get", "patch", "update"],
            &["coordination.k8s.io"],
            &["leases"],
        ),
        r(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        r(&["create"], &[""], &["serviceaccounts/token"]),
        r(
            &["get", "patch", "update"],
            &[""],
            &["persistentvolumeclaims/status"],
        ),
        r(READ, &["storage.k8s.io"], &["csidrivers"]),
        r(
            &["create", "delete", "get", "patch", "update"],
            &["storage.k8s.io"],
            &["csinodes"],
        ),
        r(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
}

/// The per-controller roles of the controllers skiff's controller manager runs.
fn controller_roles() -> Vec<(&'static str, Vec<Rule>)> {
    const CERTIFICATES: &str = "certificates.k8s.io";
    vec![
        (
            "certificate-controller",
            vec![
                r(
                    &["delete", "get", "list", "watch"],
                    &[CERTIFICATES],
                    &["certificatesigningrequests"],
                ),
                r(
                    &["patch", "update"],
                    &[CERTIFICATES],
                    &[
                        "certificatesigningrequests/approval",
                        "certificatesigningrequests/status",
                    ],
                ),
                r(&["approve"], &[CERTIFICATES], &["signers"])
                    .named(&["kubernetes.io/kube-apiserver-client-kubelet"]),
                r(&["sign"], &[CERTIFICATES], &["signers"]).named(&[
                    "kubernetes.io/kube-apiserver-client",
                    "kubernetes.io/kube-apiserver-client-kubelet",
                    "kubernetes.io/kubelet-serving",
                    "kubernetes.io/legacy-unknown",
                ]),
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                events_rule(),
            ],
        ),
        (
            "clusterrole-aggregation-controller",
            vec![r(
                &["escalate", "get", "list", "patch", "update", "watch"],
                &[RBAC_GROUP],
                &["clusterroles"],
            )],
        ),
        (
            "cronjob-controller",
            vec![
                r(
                    &["get", "list", "update", "watch"],
                    &["batch"],
                    &["cronjobs"],
                ),
                r(
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ],
                    &["batch"],
                    &["jobs"],
                ),
                r(&["update"], &["batch"], &["cronjobs/status"]),
                r(&["update"], &["batch"], &["cronjobs/finalizers"]),
                r(&["delete", "list"], &[""], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "daemon-set-controller",
            vec![
                r(READ, &["apps", "extensions"], &["daemonsets"]),
                r(&["update"], &["apps", "extensions"], &["daemonsets/status"]),
                r(
                    &["update"],
                    &["apps", "extensions"],
                    &["daemonsets/finalizers"],
                ),
                r(&["list", "watch"], &[""], &["nodes"]),
                r(
                    &["create", "delete", "list", "patch", "watch"],
                    &[""],
                    &["pods"],
                ),
                r(&["create"], &[""], &["pods/binding"]),
                r(
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
                events_rule(),
            ],
        ),
        (
            "deployment-controller",
            vec![
                r(
                    &["get", "list", "update", "watch"],
                    &["apps", "extensions"],
                    &["deployments"],
                ),
                r(
                    &["update"],
                    &["apps", "extensions"],
                    &["deployments/status"],
                ),
                r(
                    &["update"],
                    &["apps", "extensions"],
                    &["deployments/finalizers"],
                ),
                r(
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                r(&["get", "list", "update", "watch"], &[""], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "disruption-controller",
            vec![
                r(
                    READ,
                    &["apps", "extensions"],
                    &["deployments", "replicasets"],
                ),
                r(READ, &[""], &["replicationcontrollers"]),
                r(READ, &["policy"], &["poddisruptionbudgets"]),
                r(READ, &["apps"], &["statefulsets"]),
                r(&["update"], &["policy"], &["poddisruptionbudgets/status"]),
                r(&["patch", "update"], &[""], &["pods/status"]),
                r(&["get"], &["*"], &["*/scale"]),
                // Kubernetes' role leaves pod reads to the shared informers (see
                // root-ca-cert-publisher).
                r(&["list", "watch"], &[""], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "endpoint-controller",
            vec![
                r(READ, &[""], &["pods", "services"]),
                r(
                    &["create", "delete", "get", "list", "update", "watch"],
                    &[""],
                    &["endpoints"],
                ),
                r(&["create"], &[""], &["endpoints/restricted"]),
                events_rule(),
            ],
        ),
        (
            "endpointslice-controller",
            vec![
                r(READ, &[""], &["nodes", "pods", "services"]),
                r(&["update"], &[""], &["services/finalizers"]),
                r(
                    &["create", "delete", "get", "list", "update", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
                events_rule(),
            ],
        ),
        (
            "generic-garbage-collector",
            vec![
                r(
                    &["delete", "get", "list", "patch", "update", "watch"],
                    &["*"],
                    &["*"],
                ),
                events_rule(),
            ],
        ),
        (
            "job-controller",
            vec![
                r(&["get", "list", "update", "watch"], &["batch"], &["jobs"]),
                r(&["update"], &["batch"], &["jobs/status"]),
                r(&["update"], &["batch"], &["jobs/finalizers"]),
                r(
                    &["create", "delete", "list", "patch", "watch"],
                    &[""],
                    &["pods"],
                ),
                events_rule(),
            ],
        ),
        (
            "namespace-controller",
            vec![
                r(&["delete", "get", "list", "watch"], &[""], &["namespaces"]),
                r(
                    &["update"],
                    &[""],
                    &["namespaces/finalize", "namespaces/status"],
                ),
                r(
                    &["delete", "deletecollection", "get", "list", "watch"],
                    &["*"],
                    &["*"],
                ),
            ],
        ),
        (
            "node-controller",
            vec![
                r(
                    &["delete", "get", "list", "patch", "update", "watch"],
                    &[""],
                    &["nodes"],
                ),
                r(&["patch", "update"], &[""], &["nodes/status"]),
                r(&["patch", "update"], &[""], &["pods/status"]),
                r(&["delete", "get", "list", "watch"], &[""], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "pod-garbage-collector",
            vec![
                r(&["delete", "list", "watch"], &[""], &["pods"]),
                r(READ, &[""], &["nodes"]),
                r(&["patch"], &[""], &["pods/status"]),
            ],
        ),
        (
            // Kubernetes' service controller; skiff's is the built-in LoadBalancer
            // (controllers/servicelb.rs).
            "service-controller",
            vec![
                r(&["get", "list", "watch"], &[""], &["services"]),
                r(&["patch", "update"], &[""], &["services/status"]),
                r(&["list", "watch"], &[""], &["nodes"]),
                events_rule(),
            ],
        ),
        (
            "replicaset-controller",
            vec![
                r(
                    &["get", "list", "update", "watch"],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                r(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/status"],
                ),
                r(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/finalizers"],
                ),
                r(
                    &["create", "delete", "list", "patch", "watch"],
                    &[""],
                    &["pods"],
                ),
                events_rule(),
            ],
        ),
        (
            "resourcequota-controller",
            vec![
                // Usage of any kind a quota can count.
                r(&["list", "watch"], &["*"], &["*"]),
                r(&["update"], &[""], &["resourcequotas/status"]),
                events_rule(),
            ],
        ),
        (
            "root-ca-cert-publisher",
            vec![
                r(&["create", "update"], &[""], &["configmaps"]),
                // Kubernetes' role leaves reads to the shared informers; skiff's controller
                // manager runs as the union of these roles, so they are named here.
                r(&["list", "watch"], &[""], &["configmaps", "namespaces"]),
                events_rule(),
            ],
        ),
        (
            "service-account-controller",
            vec![
                r(&["create"], &[""], &["serviceaccounts"]),
                r(
                    &["list", "watch"],
                    &[""],
                    &["namespaces", "serviceaccounts"],
                ),
                events_rule(),
            ],
        ),
        (
            "horizontal-pod-autoscaler",
            vec![
                r(
                    &["get", "list", "watch"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers"],
                ),
                r(
                    &["patch", "update"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers/status"],
                ),
                r(&["get", "patch", "update"], &["*"], &["*/scale"]),
                r(&["list"], &[""], &["pods"]),
                r(&["list"], &["metrics.k8s.io"], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "statefulset-controller",
            vec![
                r(&["list", "watch"], &[""], &["pods"]),
                r(READ, &["apps"], &["statefulsets"]),
                r(&["update"], &["apps"], &["statefulsets/status"]),
                r(&["update"], &["apps"], &["statefulsets/finalizers"]),
                r(
                    &["create", "delete", "get", "patch", "update"],
                    &[""],
                    &["pods"],
                ),
                r(
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
                r(&["create", "get"], &[""], &["persistentvolumeclaims"]),
                r(&["update", "patch"], &[""], &["persistentvolumeclaims"]),
                events_rule(),
            ],
        ),
        (
            "pvc-protection-controller",
            vec![
                r(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
                r(&["get", "list", "watch"], &[""], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "pv-protection-controller",
            vec![
                r(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumes"],
                ),
                events_rule(),
            ],
        ),
        (
            "attachdetach-controller",
            vec![
                r(
                    READ,
                    &[""],
                    &["persistentvolumes", "persistentvolumeclaims"],
                ),
                r(READ, &[""], &["nodes"]),
                r(&["patch", "update"], &[""], &["nodes/status"]),
                r(&["list", "watch"], &[""], &["pods"]),
                r(
                    &["create", "delete", "get", "list", "watch"],
                    &["storage.k8s.io"],
                    &["volumeattachments"],
                ),
                r(READ, &["storage.k8s.io"], &["csidrivers", "csinodes"]),
                events_rule(),
            ],
        ),
        (
            "persistent-volume-binder",
            vec![
                r(
                    &[
                        "create", "delete", "get", "list", "patch", "update", "watch",
                    ],
                    &[""],
                    &["persistentvolumes"],
                ),
                r(&["patch", "update"], &[""], &["persistentvolumes/status"]),
                r(
                    &["get", "list", "patch", "update", "watch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
                r(
                    &["patch", "update"],
                    &[""],
                    &["persistentvolumeclaims/status"],
                ),
                r(
                    &["create", "delete", "get", "list", "watch"],
                    &[""],
                    &["pods"],
                ),
                r(READ, &[""], &["nodes"]),
                r(READ, &["storage.k8s.io"], &["storageclasses"]),
                events_rule(),
            ],
        ),
        (
            "ttl-after-finished-controller",
            vec![
                r(&["delete", "get", "list", "watch"], &["batch"], &["jobs"]),
                events_rule(),
            ],
        ),
    ]
}

/// Kubernetes' `system:kube-controller-manager` rules (what it needs beside its controllers').
fn controller_manager_rules() -> Vec<Rule> {
    vec![
        events_rule(),
        r(&["create"], &["coordination.k8s.io"], &["leases"]),
        // list and watch of the one name: a standby watches the Lease (runtime/leader.rs).
        r(
            &["get", "list", "update", "watch"],
            &["coordination.k8s.io"],
            &["leases"],
        )
        .named(&["kube-controller-manager"]),
        r(&["create"], &[""], &["secrets", "serviceaccounts"]),
        r(&["delete"], &[""], &["secrets"]),
        r(
            &["get"],
            &[""],
            &["configmaps", "namespaces", "secrets", "serviceaccounts"],
        ),
        r(&["update"], &[""], &["secrets", "serviceaccounts"]),
        r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        r(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
        ),
        r(&["list", "watch"], &["*"], &["*"]),
        r(&["create"], &[""], &["serviceaccounts/token"]),
    ]
}

/// Every bootstrap ClusterRole.
pub fn cluster_roles() -> Vec<ClusterRole> {
    let admin_edit = [(AGGREGATE_TO_ADMIN, "true")];
    let mut roles = vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![r(&["*"], &["*"], &["*"]), Rule::urls(&["*"], &["*"])],
        ),
        aggregated("admin", &[], AGGREGATE_TO_ADMIN),
        aggregated("edit", &admin_edit, AGGREGATE_TO_EDIT),
        aggregated("view", &[(AGGREGATE_TO_EDIT, "true")], AGGREGATE_TO_VIEW),
        cluster_role(
            "system:aggregate-to-admin",
            &admin_edit,
            vec![
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                r(READ_WRITE, &[RBAC_GROUP], &["rolebindings", "roles"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(AGGREGATE_TO_EDIT, "true")],
            vec![
                r(
                    READ,
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                ),
                r(&["impersonate"], &[""], &["serviceaccounts"]),
                r(
                    WRITE,
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                ),
                r(&["create"], &[""], &["pods/eviction"]),
                r(
                    WRITE,
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                ),
                r(&["create"], &[""], &["serviceaccounts/token"]),
                r(
                    WRITE,
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                ),
                r(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                r(WRITE, &["batch"], &["cronjobs", "jobs"]),
                r(WRITE, &["policy"], &["poddisruptionbudgets"]),
                r(
                    WRITE,
                    &["networking.k8s.io"],
                    &["ingresses", "networkpolicies"],
                ),
                r(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
            ],
        ),
        // Kubernetes' metrics-server installs this one; skiff serves metrics.k8s.io itself.
        cluster_role(
            "system:aggregated-metrics-reader",
            &[
                (AGGREGATE_TO_VIEW, "true"),
                (AGGREGATE_TO_EDIT, "true"),
                (AGGREGATE_TO_ADMIN, "true"),
            ],
            vec![r(&["get", "list"], &["metrics.k8s.io"], &["nodes", "pods"])],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(AGGREGATE_TO_VIEW, "true")],
            vec![
                r(
                    READ,
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                ),
                r(
                    READ,
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                ),
                r(READ, &[""], &["namespaces"]),
                r(READ, &["discovery.k8s.io"], &["endpointslices"]),
                r(
                    READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                ),
                r(
                    READ,
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                r(
                    READ,
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                ),
                r(
                    READ,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                r(
                    READ,
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                ),
            ],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![Rule::urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                r(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![Rule::urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        cluster_role(
            "system:monitoring",
            &[],
            vec![Rule::urls(
                &["get"],
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                ],
            )],
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        cluster_role("system:node", &[], node_rules()),
        cluster_role(
            "system:node-bootstrapper",
            &[],
            vec![r(
                &["create", "get", "list", "watch"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
            )],
        ),
        cluster_role(
            "system:node-proxier",
            &[],
            vec![
                r(&["list", "watch"], &[""], &["endpoints", "services"]),
                r(READ, &[""], &["nodes"]),
                events_rule(),
                r(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        cluster_role(
            "system:kube-scheduler",
            &[],
            vec![
                events_rule(),
                r(&["create"], &["coordination.k8s.io"], &["leases"]),
                // list and watch of the one name: a standby watches the Lease (runtime/leader.rs).
                r(
                    &["get", "list", "update", "watch"],
                    &["coordination.k8s.io"],
                    &["leases"],
                )
                .named(&["kube-scheduler"]),
                r(READ, &[""], &["nodes"]),
                r(&["delete", "get", "list", "watch"], &[""], &["pods"]),
                r(&["create"], &[""], &["bindings", "pods/binding"]),
                r(&["patch", "update"], &[""], &["pods/status"]),
                r(READ, &[""], &["replicationcontrollers", "services"]),
                r(READ, &["apps", "extensions"], &["replicasets"]),
                r(READ, &["apps"], &["statefulsets"]),
                r(READ, &["policy"], &["poddisruptionbudgets"]),
                r(
                    READ,
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                r(READ, &["storage.k8s.io"], &["csinodes"]),
                r(READ, &[""], &["namespaces"]),
                r(
                    READ,
                    &["storage.k8s.io"],
                    &["csidrivers", "csistoragecapacities"],
                ),
            ],
        ),
        cluster_role(
            "system:volume-scheduler",
            &[],
            vec![
                r(
                    &["get", "list", "patch", "update", "watch"],
                    &[""],
                    &["persistentvolumes"],
                ),
                r(READ, &["storage.k8s.io"], &["storageclasses"]),
                r(
                    &["get", "list", "patch", "update", "watch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        cluster_role(
            "system:kubelet-api-admin",
            &[],
            vec![
                r(READ, &[""], &["nodes"]),
                r(&["proxy"], &[""], &["nodes"]),
                r(
                    &["*"],
                    &[""],
                    &["nodes/log", "nodes/metrics", "nodes/proxy", "nodes/stats"],
                ),
            ],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![r(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![r(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
    ];
    for (name, signer) in [
        (
            "kube-apiserver-client-approver",
            "kubernetes.io/kube-apiserver-client",
        ),
        (
            "kube-apiserver-client-kubelet-approver",
            "kubernetes.io/kube-apiserver-client-kubelet",
        ),
        ("kubelet-serving-approver", "kubernetes.io/kubelet-serving"),
        ("legacy-unknown-approver", "kubernetes.io/legacy-unknown"),
    ] {
        roles.push(cluster_role(
            &format!("system:certificates.k8s.io:{name}"),
            &[],
            vec![r(&["approve"], &["certificates.k8s.io"], &["signers"]).named(&[signer])],
        ));
    }
    let mut manager = controller_manager_rules();
    for (name, rules) in controller_roles() {
        manager.extend(rules.iter().cloned());
        roles.push(cluster_role(
            &format!("system:controller:{name}"),
            &[],
            rules,
        ));
    }
    roles.push(cluster_role("system:kube-controller-manager", &[], manager));
    roles
}

fn subject(kind: &str, name: &str) -> Subject {
    let (api_group, namespace, name) = match kind {
        "ServiceAccount" => {
            let (ns, n) = name.split_once('/').unwrap_or(("kube-system", name));
            (None, Some(ns.to_string()), n.to_string())
        }
        _ => (Some(RBAC_GROUP.to_string()), None, name.to_string()),
    };
    Subject {
        api_group,
        kind: kind.to_string(),
        name,
        namespace,
    }
}

fn binding(name: &str, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: bootstrap_meta(name, &[]),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.to_string(),
            kind: "ClusterRole".to_string(),
            name: role.to_string(),
        },
        subjects: (!subjects.is_empty()).then_some(subjects),
    }
}

/// Every bootstrap ClusterRoleBinding.
pub fn cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let authenticated = || subject("Group", "system:authenticated");
    let mut out = vec![
        binding(
            "cluster-admin",
            "cluster-admin",
            vec![subject("Group", "system:masters")],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            vec![authenticated()],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            vec![authenticated()],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![authenticated(), subject("Group", "system:unauthenticated")],
        ),
        binding(
            "system:monitoring",
            "system:monitoring",
            vec![subject("Group", "system:monitoring")],
        ),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            vec![subject("User", "system:kube-controller-manager")],
        ),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            vec![subject("User", "system:kube-scheduler")],
        ),
        binding(
            "system:volume-scheduler",
            "system:volume-scheduler",
            vec![subject("User", "system:kube-scheduler")],
        ),
        // Nodes are authorized by the Node authorizer; the binding exists with no subjects.
        binding("system:node", "system:node", vec![]),
        binding(
            "system:node-proxier",
            "system:node-proxier",
            vec![subject("User", "system:kube-proxy")],
        ),
        // The API server's calls to node agents (logs, exec, attach, port-forward, proxy),
        // which the node agents authorize with a SubjectAccessReview (kubeadm binds its
        // apiserver-kubelet-client the same way).
        binding(
            "kube-apiserver-kubelet-client",
            "system:kubelet-api-admin",
            vec![subject(
                "User",
                crate::apiserver::certs::KUBELET_CLIENT_USER,
            )],
        ),
    ];
    // kubeadm's node bootstrap bindings: a node agent joining with a bootstrap token of the
    // default node group may ask for a node client certificate (approved automatically), and
    // a node may renew its own.
    let node_tokens = || subject("Group", crate::apiserver::auth::bootstrap::NODE_GROUP);
    out.push(binding(
        "kubeadm:kubelet-bootstrap",
        "system:node-bootstrapper",
        vec![node_tokens()],
    ));
    out.push(binding(
        "kubeadm:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        vec![node_tokens()],
    ));
    out.push(binding(
        "kubeadm:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        vec![subject("Group", "system:nodes")],
    ));
    for (name, _) in controller_roles() {
        let full = format!("system:controller:{name}");
        out.push(binding(
            &full,
            &full,
            vec![subject("ServiceAccount", &format!("kube-system/{name}"))],
        ));
    }
    out
}

/// What reconciling one object did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Created,
    Updated,
    Unchanged,
    /// Annotated autoupdate "false".
    Skipped,
}

/// Writes every bootstrap role and binding that is missing and tops up those that lack part
/// of their bootstrap content (unless annotated autoupdate "false").
pub async fn reconcile(store: &dyn Store) -> Result<(), StoreError> {
    let roles = registry::find(RBAC_GROUP, "v1", "clusterroles").expect("clusterroles are served");
    let bindings = registry::find(RBAC_GROUP, "v1", "clusterrolebindings")
        .expect("clusterrolebindings are served");
    // Every object at once: the store's writer commits the writes waiting together in one
    // transaction (one fsync for all of them), where one after the other each paid its
    // own; start-up waits for this.
    let writes = cluster_roles()
        .into_iter()
        .map(|role| {
            let name = role.metadata.name.clone().unwrap_or_default();
            (
                roles.key(None, &name),
                typed_value(&role, "ClusterRole"),
                merge_role as Merge,
            )
        })
        .chain(cluster_role_bindings().into_iter().map(|b| {
            let name = b.metadata.name.clone().unwrap_or_default();
            let wanted = typed_value(&b, "ClusterRoleBinding");
            (bindings.key(None, &name), wanted, merge_binding as Merge)
        }));
    let outcomes = futures::future::try_join_all(writes.map(|(key, wanted, merge)| async move {
        reconcile_one(store, &key, wanted, merge).await
    }))
    .await?;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for o in &outcomes {
        *counts.entry(outcome_name(o)).or_default() += 1;
    }
    tracing::info!(?counts, "bootstrap RBAC policy reconciled");
    Ok(())
}

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Created => "created",
        Outcome::Updated => "updated",
        Outcome::Unchanged => "unchanged",
        Outcome::Skipped => "skipped",
    }
}

fn typed_value<T: serde::Serialize>(t: &T, kind: &str) -> Value {
    let mut v = serde_json::to_value(t).unwrap_or(Value::Null);
    v["apiVersion"] = Value::from(format!("{RBAC_GROUP}/v1"));
    v["kind"] = Value::from(kind);
    v
}

/// Adds what `wanted` has and the stored object lacks; whether anything changed.
type Merge = fn(&mut Value, &Value) -> bool;

/// Creates `wanted` at `key`, or merges it into what is there; retries lost races.
async fn reconcile_one(
    store: &dyn Store,
    key: &str,
    wanted: Value,
    merge: Merge,
) -> Result<Outcome, StoreError> {
    loop {
        let op = match store.get(key).await? {
            None => {
                let mut obj = wanted.clone();
                obj["metadata"]["uid"] = Value::from(meta::new_uid());
                obj["metadata"]["creationTimestamp"] = Value::from(meta::now());
                WriteOp::Put {
                    key: key.to_string(),
                    value: serde_json::to_vec(&obj).unwrap_or_default().into(),
                    precondition: Precondition::MustNotExist,
                }
            }
            Some(kv) => {
                let Ok(mut cur) = serde_json::from_slice::<Value>(&kv.value) else {
                    tracing::error!(key, "stored bootstrap object does not decode; left alone");
                    return Ok(Outcome::Skipped);
                };
                if cur.pointer(&format!(
                    "/metadata/annotations/{}",
                    AUTOUPDATE.replace('/', "~1")
                )) == Some(&Value::from("false"))
                {
                    return Ok(Outcome::Skipped);
                }
                if !merge(&mut cur, &wanted) {
                    return Ok(Outcome::Unchanged);
                }
                WriteOp::Put {
                    key: key.to_string(),
                    value: serde_json::to_vec(&cur).unwrap_or_default().into(),
                    precondition: Precondition::ModRevision(kv.mod_revision),
                }
            }
        };
        let created = matches!(
            op,
            WriteOp::Put {
                precondition: Precondition::MustNotExist,
                ..
            }
        );
        match store.write(op).await {
            Ok(_) if created => return Ok(Outcome::Created),
            Ok(_) => return Ok(Outcome::Updated),
            Err(StoreError::AlreadyExists(_) | StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Adds the labels and annotations of `wanted` that `cur` lacks (the existing values win).
fn merge_meta(cur: &mut Value, wanted: &Value) -> bool {
    let mut changed = false;
    for field in ["labels", "annotations"] {
        let Some(w) = wanted["metadata"][field].as_object() else {
            continue;
        };
        if !cur["metadata"][field].is_object() {
            cur["metadata"][field] = Value::Object(Default::default());
        }
        let c = cur["metadata"][field]
            .as_object_mut()
            .expect("made an object above");
        for (k, v) in w {
            if !c.contains_key(k) {
                c.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    changed
}

fn merge_role(cur: &mut Value, wanted: &Value) -> bool {
    let mut changed = merge_meta(cur, wanted);
    let (Ok(mut have), Ok(want)) = (
        serde_json::from_value::<ClusterRole>(cur.clone()),
        serde_json::from_value::<ClusterRole>(wanted.clone()),
    ) else {
        return changed;
    };
    match &want.aggregation_rule {
        Some(w) => {
            // Aggregated roles' rules belong to the aggregation controller; only selectors.
            let selectors = have
                .aggregation_rule
                .get_or_insert_with(Default::default)
                .cluster_role_selectors
                .get_or_insert_with(Vec::new);
            for s in w.cluster_role_selectors.iter().flatten() {
                if !selectors.contains(s) {
                    selectors.push(s.clone());
                    changed = true;
                }
            }
        }
        None => {
            let own: Vec<Rule> = have.rules.iter().flatten().map(Rule::from).collect();
            let wanted_rules: Vec<Rule> = want.rules.iter().flatten().map(Rule::from).collect();
            if let Err(missing) = covers(&own, &wanted_rules) {
                have.rules
                    .get_or_insert_with(Vec::new)
                    .extend(missing.iter().map(PolicyRule::from));
                changed = true;
            }
        }
    }
    if changed {
        let meta = cur["metadata"].clone();
        *cur = typed_value(&have, "ClusterRole");
        cur["metadata"] = meta;
    }
    changed
}

fn merge_binding(cur: &mut Value, wanted: &Value) -> bool {
    let mut changed = merge_meta(cur, wanted);
    let (Ok(mut have), Ok(want)) = (
        serde_json::from_value::<ClusterRoleBinding>(cur.clone()),
        serde_json::from_value::<ClusterRoleBinding>(wanted.clone()),
    ) else {
        return changed;
    };
    for s in want.subjects.iter().flatten() {
        let subjects = have.subjects.get_or_insert_with(Vec::new);
        if !subjects.contains(s) {
            subjects.push(s.clone());
            changed = true;
        }
    }
    if changed {
        let meta = cur["metadata"].clone();
        *cur = typed_value(&have, "ClusterRoleBinding");
        cur["metadata"] = meta;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::kinds::rbac;

    #[test]
    fn every_bootstrap_object_is_valid_and_bindings_name_existing_roles() {
        let roles = cluster_roles();
        for role in &roles {
            let v = typed_value(role, "ClusterRole");
            let errs = rbac::validate_cluster_role(&v, None);
            assert!(errs.is_empty(), "{:?}: {errs:?}", role.metadata.name);
        }
        let names: Vec<&str> = roles
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .collect();
        for b in cluster_role_bindings() {
            let mut v = typed_value(&b, "ClusterRoleBinding");
            rbac::default_cluster_role_binding(&mut v);
            let errs = rbac::validate_cluster_role_binding(&v, None);
            assert!(errs.is_empty(), "{:?}: {errs:?}", b.metadata.name);
            assert!(
                names.contains(&b.role_ref.name.as_str()),
                "{}",
                b.role_ref.name
            );
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "role names are unique");
    }

    #[test]
    fn reconciling_adds_what_is_missing_and_keeps_the_rest() {
        let wanted = typed_value(
            &cluster_role("system:x", &[], vec![r(&["get", "list"], &[""], &["pods"])]),
            "ClusterRole",
        );
        let mut cur = wanted.clone();
        cur["rules"] = serde_json::json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
        ]);
        cur["metadata"]["labels"] = serde_json::json!({"mine": "yes"});
        assert!(merge_role(&mut cur, &wanted));
        let rules: Vec<Rule> = serde_json::from_value::<ClusterRole>(cur.clone())
            .unwrap()
            .rules
            .unwrap()
            .iter()
            .map(Rule::from)
            .collect();
        assert_eq!(
            rules.len(),
            3,
            "the extra rule stays, the missing verb is added"
        );
        assert!(covers(
            &rules,
            &[r(&["get", "list"], &[""], &["pods", "secrets"]).named(&[])]
        )
        .is_err());
        assert!(covers(&rules, &[r(&["get", "list"], &[""], &["pods"])]).is_ok());
        assert_eq!(cur["metadata"]["labels"]["mine"], "yes");
        assert_eq!(cur["metadata"]["labels"][BOOTSTRAPPING.0], BOOTSTRAPPING.1);
        assert!(
            !merge_role(&mut cur, &wanted),
            "a second pass changes nothing"
        );
        let b = typed_value(
            &binding("b", "view", vec![subject("User", "a")]),
            "ClusterRoleBinding",
        );
        let mut cur = b.clone();
        cur["subjects"] =
            serde_json::json!([{"kind": "User", "name": "z", "apiGroup": RBAC_GROUP}]);
        assert!(merge_binding(&mut cur, &b));
        assert_eq!(cur["subjects"].as_array().unwrap().len(), 2);
        assert!(!merge_binding(&mut cur, &b));
    }
}
