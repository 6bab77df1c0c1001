//! The resources the server serves. Adding a resource is one entry in [`RESOURCES`]: its
//! group/version/kind, names, scope, subresources and selectable fields; its defaulting,
//! validation and table columns come from `machinery::kinds` by group and kind.

/// A subresource the server implements for a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    /// `/status`: writes change only `.status`; the main resource ignores `.status`.
    Status,
    /// `/scale`: an autoscaling/v1 Scale view of `.spec.replicas`.
    Scale,
    /// `pods/binding`: assigns a pod to a node.
    Binding,
    /// `pods/log`: a container's log, proxied from the node agent's kubelet API.
    Log,
    /// `pods/exec`: a command in a container, an HTTP upgrade (SPDY or WebSocket) relayed to
    /// the runtime's streaming server through the node agent's kubelet API.
    Exec,
    /// `pods/eviction`: a policy/v1 Eviction, a graceful delete (`kubectl drain`).
    Eviction,
    /// `pods/attach`: the container's own stdio, an HTTP upgrade relayed like exec.
    Attach,
    /// `pods/portforward`: a connection to pod ports, an HTTP upgrade relayed like exec.
    PortForward,
    /// `pods/ephemeralcontainers`: the pod, whose writes change only
    /// `spec.ephemeralContainers` (`kubectl debug`).
    EphemeralContainers,
    /// `pods/proxy`, `services/proxy`, `nodes/proxy`: any HTTP request relayed to the pod, a
    /// ready endpoint of the service, or the node agent (`kubectl proxy`, `get --raw`).
    Proxy,
    /// `serviceaccounts/token`: an authentication.k8s.io/v1 TokenRequest, answered with a
    /// bound service account token (`kubectl create token`).
    Token,
    /// `certificatesigningrequests/approval`: writes change only the Approved and Denied
    /// conditions (`kubectl certificate approve|deny`).
    Approval,
}

impl Subresource {
    pub fn name(self) -> &'static str {
        match self {
            Subresource::Status => "status",
            Subresource::Scale => "scale",
            Subresource::Binding => "binding",
            Subresource::Log => "log",
            Subresource::Exec => "exec",
            Subresource::Eviction => "eviction",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
            Subresource::EphemeralContainers => "ephemeralcontainers",
            Subresource::Proxy => "proxy",
            Subresource::Token => "token",
            Subresource::Approval => "approval",
        }
    }
}

/// Whether a resource lives in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// What happens to `.status` on create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusOnCreate {
    /// Kept as sent (nodes report their status when they register; kinds without status).
    Keep,
    /// Cleared, as Kubernetes' create strategies do for controller-owned status.
    Reset,
}

/// One served resource.
#[derive(Debug)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub scope: Scope,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub subresources: &'static [Subresource],
    /// Field-selector fields beyond metadata.name and metadata.namespace.
    pub fields: &'static [&'static str],
    /// Fields with a watch channel per value (O(changed) fan-out).
    pub indexed: &'static [&'static str],
    pub status_on_create: StatusOnCreate,
    /// Where its objects live.
    pub storage: Storage,
    /// Its OpenAPI schema (from the k8s-openapi type), for `kubectl explain`.
    pub schema: Schema,
}

/// Where a resource's objects live.
#[derive(Debug)]
pub enum Storage {
    /// In the store under its own prefix (and in the watch cache).
    Own,
    /// In another resource's storage, converted on the way in and out.
    View(&'static Conversion),
    /// Nowhere: a create is answered at once and nothing is kept (access and token
    /// reviews). The only verb is `create`.
    None,
    /// Resource metrics (metrics.k8s.io), scraped from the node agents and kept in memory;
    /// the verbs are `get` and `list`.
    Metrics,
    /// A version of a CustomResourceDefinition: stored under `/registry/<group>/<plural>/`
    /// with the storage version's apiVersion, in the watch cache's one cache of custom objects.
    Custom(&'static super::crd::Custom),
}

/// How a resource's OpenAPI schema is made: its component name and its schema, which
/// registers what it refers to with the generator.
#[derive(Clone, Copy)]
pub struct Schema {
    pub name: fn() -> std::borrow::Cow<'static, str>,
    pub build: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.name)())
    }
}

const fn schema<K: schemars::JsonSchema>() -> Schema {
    Schema {
        name: K::schema_name,
        build: K::json_schema,
    }
}

/// The schema entry of a resource without a Rust type (custom resources: their OpenAPI comes
/// from their definition).
pub const fn untyped_schema() -> Schema {
    schema::<serde_json::Value>()
}

/// The verbs of a resource that answers creates without storing anything.
const CREATE_ONLY: &[&str] = &["create"];

/// The verbs of metrics.k8s.io (no watch, as metrics-server).
const READ_ONLY: &[&str] = &["get", "list"];

/// The verbs of a stored resource (and of Kubernetes' "read-write" rules).
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl Resource {
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }

    pub fn verbs(&self) -> &'static [&'static str] {
        match self.storage {
            Storage::None => CREATE_ONLY,
            Storage::Metrics => READ_ONLY,
            Storage::Own | Storage::View(_) | Storage::Custom(_) => VERBS,
        }
    }

    /// The conversion of a view (None: the resource is stored as served, or not at all).
    pub fn stored_as(&self) -> Option<&'static Conversion> {
        match self.storage {
            Storage::View(c) => Some(c),
            Storage::Own | Storage::None | Storage::Metrics | Storage::Custom(_) => None,
        }
    }

    /// Whether the watch cache keeps this resource's own objects (a built-in resource's own
    /// cache; custom resources share one, [`Resource::cache_prefix`]).
    pub fn cached(&self) -> bool {
        matches!(self.storage, Storage::Own)
    }

    /// The definition behind a custom resource.
    pub fn custom(&self) -> Option<&'static super::crd::Custom> {
        match self.storage {
            Storage::Custom(c) => Some(c),
            _ => None,
        }
    }

    /// The prefix of the watch cache that holds this resource's objects.
    pub fn cache_prefix(&self) -> String {
        match self.storage {
            Storage::Custom(_) => crate::store::cache::CUSTOM_PREFIX.to_string(),
            _ => self.storage_prefix(),
        }
    }

    pub fn has(&self, s: Subresource) -> bool {
        self.subresources.contains(&s)
    }

    /// The store prefix of every object of this resource, laid out as Kubernetes lays out
    /// its built-in resources in etcd: `/registry/<plural>/` (of the storage resource, for a
    /// view).
    /// Custom resources are under `/registry/<group>/<plural>/`, as Kubernetes keeps them.
    pub fn prefix(&self) -> String {
        self.storage_prefix()
    }

    fn storage_prefix(&self) -> String {
        if let Storage::Custom(_) = self.storage {
            return format!("/registry/{}/{}/", self.group, self.plural);
        }
        let plural = self.stored_as().map_or(self.plural, |c| c.storage.2);
        format!("/registry/{plural}/")
    }

    /// The store prefix of the objects in `namespace` (all of them when None).
    pub fn namespace_prefix(&self, namespace: Option<&str>) -> String {
        match (self.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => format!("{}{ns}/", self.prefix()),
            _ => self.prefix(),
        }
    }

    /// The store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{name}", self.namespace_prefix(namespace))
    }

    /// The resource whose storage holds this one's objects (itself unless it is a view).
    pub fn storage(&'static self) -> &'static Resource {
        self.stored_as()
            .and_then(|c| find(c.storage.0, c.storage.1, c.storage.2))
            .unwrap_or(self)
    }

    /// Every field a field selector may name for this resource.
    pub fn selectable_fields(&self) -> Vec<&'static str> {
        let mut f = vec!["metadata.name", "metadata.namespace"];
        f.extend_from_slice(self.fields);
        f
    }
}

use super::conversion::{Conversion, EVENTS_V1, HPA_V1};
use Subresource::*;

const NONE: &[&str] = &[];
const ALL: &[&str] = &["all"];

/// Every resource the server serves, in discovery order.
pub static RESOURCES: &[Resource] = &[
    Resource {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        singular: "namespace",
        scope: Scope::Cluster,
        short_names: &["ns"],
        categories: NONE,
        subresources: &[Status],
        fields: &["status.phase"],
        indexed: NONE,
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Namespace>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        singular: "pod",
        scope: Scope::Namespaced,
        short_names: &["po"],
        categories: ALL,
        subresources: &[
            Status,
            Binding,
            Eviction,
            Log,
            Exec,
            Attach,
            PortForward,
            EphemeralContainers,
            Proxy,
        ],
        fields: &[
            "spec.nodeName",
            "status.phase",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        indexed: &["spec.nodeName", "metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Pod>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        singular: "service",
        scope: Scope::Namespaced,
        short_names: &["svc"],
        categories: ALL,
        subresources: &[Status, Proxy],
        fields: &["spec.clusterIP", "spec.type"],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Service>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Endpoints",
        plural: "endpoints",
        singular: "endpoints",
        scope: Scope::Namespaced,
        short_names: &["ep"],
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Endpoints>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        singular: "node",
        scope: Scope::Cluster,
        short_names: &["no"],
        categories: NONE,
        subresources: &[Status, Proxy],
        fields: &["spec.unschedulable"],
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Node>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        scope: Scope::Namespaced,
        short_names: &["ev"],
        categories: NONE,
        subresources: &[],
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Event>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        singular: "configmap",
        scope: Scope::Namespaced,
        short_names: &["cm"],
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::ConfigMap>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        singular: "secret",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: &["type"],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::Secret>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        scope: Scope::Namespaced,
        short_names: &["sa"],
        categories: NONE,
        subresources: &[Token],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::ServiceAccount>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
        singular: "persistentvolumeclaim",
        scope: Scope::Namespaced,
        short_names: &["pvc"],
        categories: NONE,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "PersistentVolume",
        plural: "persistentvolumes",
        singular: "persistentvolume",
        scope: Scope::Cluster,
        short_names: &["pv"],
        categories: NONE,
        subresources: &[Status],
        fields: &["status.phase"],
        indexed: NONE,
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::PersistentVolume>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "LimitRange",
        plural: "limitranges",
        singular: "limitrange",
        scope: Scope::Namespaced,
        short_names: &["limits"],
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::LimitRange>(),
    },
    Resource {
        group: "",
        version: "v1",
        kind: "ResourceQuota",
        plural: "resourcequotas",
        singular: "resourcequota",
        scope: Scope::Namespaced,
        short_names: &["quota"],
        categories: NONE,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::core::v1::ResourceQuota>(),
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        singular: "deployment",
        scope: Scope::Namespaced,
        short_names: &["deploy"],
        categories: ALL,
        subresources: &[Status, Scale],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::apps::v1::Deployment>(),
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        singular: "replicaset",
        scope: Scope::Namespaced,
        short_names: &["rs"],
        categories: ALL,
        subresources: &[Status, Scale],
        fields: &["status.replicas"],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::apps::v1::ReplicaSet>(),
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        singular: "daemonset",
        scope: Scope::Namespaced,
        short_names: &["ds"],
        categories: ALL,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::apps::v1::DaemonSet>(),
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        singular: "statefulset",
        scope: Scope::Namespaced,
        short_names: &["sts"],
        categories: ALL,
        subresources: &[Status, Scale],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::apps::v1::StatefulSet>(),
    },
    Resource {
        group: "apps",
        version: "v1",
        kind: "ControllerRevision",
        plural: "controllerrevisions",
        singular: "controllerrevision",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::apps::v1::ControllerRevision>(),
    },
    Resource {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        singular: "job",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: ALL,
        subresources: &[Status],
        fields: &["status.successful"],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::batch::v1::Job>(),
    },
    Resource {
        group: "batch",
        version: "v1",
        kind: "CronJob",
        plural: "cronjobs",
        singular: "cronjob",
        scope: Scope::Namespaced,
        short_names: &["cj"],
        categories: ALL,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::batch::v1::CronJob>(),
    },
    Resource {
        group: "discovery.k8s.io",
        version: "v1",
        kind: "EndpointSlice",
        plural: "endpointslices",
        singular: "endpointslice",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::discovery::v1::EndpointSlice>(),
    },
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        singular: "lease",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::coordination::v1::Lease>(),
    },
    Resource {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        singular: "event",
        scope: Scope::Namespaced,
        short_names: &["ev"],
        categories: NONE,
        subresources: &[],
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::View(&EVENTS_V1),
        schema: schema::<k8s_openapi::api::events::v1::Event>(),
    },
    Resource {
        group: "authentication.k8s.io",
        version: "v1",
        kind: "TokenReview",
        plural: "tokenreviews",
        singular: "tokenreview",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authentication::v1::TokenReview>(),
    },
    Resource {
        group: "authentication.k8s.io",
        version: "v1",
        kind: "SelfSubjectReview",
        plural: "selfsubjectreviews",
        singular: "selfsubjectreview",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authentication::v1::SelfSubjectReview>(),
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        singular: "clusterrole",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::rbac::v1::ClusterRole>(),
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(),
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "Role",
        plural: "roles",
        singular: "role",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::rbac::v1::Role>(),
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        singular: "rolebinding",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::rbac::v1::RoleBinding>(),
    },
    Resource {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "LocalSubjectAccessReview",
        plural: "localsubjectaccessreviews",
        singular: "localsubjectaccessreview",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authorization::v1::LocalSubjectAccessReview>(),
    },
    Resource {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SelfSubjectAccessReview",
        plural: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(),
    },
    Resource {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SelfSubjectRulesReview",
        plural: "selfsubjectrulesreviews",
        singular: "selfsubjectrulesreview",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authorization::v1::SelfSubjectRulesReview>(),
    },
    Resource {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SubjectAccessReview",
        plural: "subjectaccessreviews",
        singular: "subjectaccessreview",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::None,
        schema: schema::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(),
    },
    Resource {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "MutatingWebhookConfiguration",
        plural: "mutatingwebhookconfigurations",
        singular: "mutatingwebhookconfiguration",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: &["api-extensions"],
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>(
        ),
    },
    Resource {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingWebhookConfiguration",
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: &["api-extensions"],
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>(
        ),
    },
    Resource {
        group: "certificates.k8s.io",
        version: "v1",
        kind: "CertificateSigningRequest",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        scope: Scope::Cluster,
        short_names: &["csr"],
        categories: NONE,
        subresources: &[Status, Approval],
        fields: &["spec.signerName"],
        indexed: NONE,
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>(),
    },
    // autoscaling/v2 first: the group's preferred (and storage) version.
    Resource {
        group: "autoscaling",
        version: "v2",
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        singular: "horizontalpodautoscaler",
        scope: Scope::Namespaced,
        short_names: &["hpa"],
        categories: ALL,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(),
    },
    Resource {
        group: "autoscaling",
        version: "v1",
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        singular: "horizontalpodautoscaler",
        scope: Scope::Namespaced,
        short_names: &["hpa"],
        categories: ALL,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::View(&HPA_V1),
        schema: schema::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>(),
    },
    Resource {
        group: "scheduling.k8s.io",
        version: "v1",
        kind: "PriorityClass",
        plural: "priorityclasses",
        singular: "priorityclass",
        scope: Scope::Cluster,
        short_names: &["pc"],
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::scheduling::v1::PriorityClass>(),
    },
    Resource {
        group: "storage.k8s.io",
        version: "v1",
        kind: "StorageClass",
        plural: "storageclasses",
        singular: "storageclass",
        scope: Scope::Cluster,
        short_names: &["sc"],
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::storage::v1::StorageClass>(),
    },
    Resource {
        group: "storage.k8s.io",
        version: "v1",
        kind: "CSIDriver",
        plural: "csidrivers",
        singular: "csidriver",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::storage::v1::CSIDriver>(),
    },
    Resource {
        group: "storage.k8s.io",
        version: "v1",
        kind: "CSINode",
        plural: "csinodes",
        singular: "csinode",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::storage::v1::CSINode>(),
    },
    Resource {
        group: "storage.k8s.io",
        version: "v1",
        kind: "VolumeAttachment",
        plural: "volumeattachments",
        singular: "volumeattachment",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[Status],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::storage::v1::VolumeAttachment>(),
    },
    Resource {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        scope: Scope::Namespaced,
        short_names: &["pdb"],
        categories: NONE,
        subresources: &[Status],
        fields: NONE,
        indexed: &["metadata.namespace"],
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(),
    },
    Resource {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        scope: Scope::Cluster,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        subresources: &[Status],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Reset,
        storage: Storage::Own,
        schema: schema::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(),
    },
    Resource {
        group: "metrics.k8s.io",
        version: "v1beta1",
        kind: "NodeMetrics",
        plural: "nodes",
        singular: "",
        scope: Scope::Cluster,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Metrics,
        schema: schema::<crate::resource_metrics::api::NodeMetrics>(),
    },
    Resource {
        group: "metrics.k8s.io",
        version: "v1beta1",
        kind: "PodMetrics",
        plural: "pods",
        singular: "",
        scope: Scope::Namespaced,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        indexed: NONE,
        status_on_create: StatusOnCreate::Keep,
        storage: Storage::Metrics,
        schema: schema::<crate::resource_metrics::api::PodMetrics>(),
    },
];

/// Every resource served now: the built-in ones, then the versions of established
/// CustomResourceDefinitions.
pub fn all() -> Vec<&'static Resource> {
    let mut out: Vec<&'static Resource> = RESOURCES.iter().collect();
    out.extend(super::crd::served());
    out
}

/// The groups in discovery order (each with its versions: [`group_versions`]).
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in all() {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

/// The preferred version of a group: the first served (autoscaling is served at v2 and v1).
pub fn group_version(group: &str) -> &'static str {
    group_versions(group).first().copied().unwrap_or("v1")
}

/// Every version a group is served at, the preferred first.
pub fn group_versions(group: &str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in all().into_iter().filter(|r| r.group == group) {
        if !out.contains(&r.version) {
            out.push(r.version);
        }
    }
    out
}

/// The resource at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .or_else(|| super::crd::find(group, version, plural))
}

/// The resource serving `apiVersion`/`kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
        .or_else(|| super::crd::by_kind(api_version, kind))
}

/// Whether the server serves any resource in `group`/`version`.
pub fn serves(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
        || super::crd::find_version(group, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_by_namespace() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(
            pods.key(Some("default"), "web"),
            "/registry/pods/default/web"
        );
        assert_eq!(pods.namespace_prefix(None), "/registry/pods/");
        let nodes = find("", "v1", "nodes").unwrap();
        assert_eq!(nodes.key(None, "n1"), "/registry/nodes/n1");
        assert_eq!(
            find("apps", "v1", "deployments").unwrap().api_version(),
            "apps/v1"
        );
    }

    #[test]
    fn no_two_resources_share_a_store_prefix_unless_intended() {
        let stored: Vec<&Resource> = RESOURCES.iter().filter(|r| r.cached()).collect();
        for view in RESOURCES.iter().filter(|r| r.stored_as().is_some()) {
            let storage = stored.iter().find(|s| s.prefix() == view.prefix());
            assert!(
                storage.is_some(),
                "{} is stored by a served resource",
                view.plural
            );
            for f in view.selectable_fields() {
                let c = view.stored_as().unwrap();
                let to = (c.field)(f).unwrap_or_else(|| panic!("{f} of {}", view.plural));
                assert!(
                    storage.unwrap().selectable_fields().contains(&to),
                    "{f} -> {to}"
                );
            }
        }
        for (i, a) in stored.iter().enumerate() {
            for b in &stored[i + 1..] {
                assert!(
                    !a.prefix().starts_with(&b.prefix()) && !b.prefix().starts_with(&a.prefix()),
                    "{} and {}",
                    a.prefix(),
                    b.prefix()
                );
            }
            for f in a.indexed {
                assert!(a.selectable_fields().contains(f), "{f} of {}", a.plural);
            }
        }
    }
}
