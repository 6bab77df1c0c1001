//! The whole v1 Pod (and the pod spec inside every workload template) from protobuf: what
//! `kubectl debug POD --copy-to` (a copy of a stored pod: projected token volume, probes,
//! security contexts, tolerations...) and `kubectl debug node/NAME` (hostPath of `/`,
//! hostPID, hostNetwork, hostIPC) create with their typed client.
//!
//! Each message is converted by a [`message!`] line per field: the struct is destructured
//! exhaustively, so a field added to k8s-pb breaks the build instead of being dropped
//! silently. Fields Kubernetes 1.33 does not serve (newer than the API this server
//! implements) and the in-tree volume plugins of cloud and cluster filesystems are refused
//! with 415 when set, never cut off.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Map, Value};

use super::{
    int_or_string, label_selector, map, n, nz, object_meta, quantities, s, strings, unsupported,
};
use crate::machinery::ApiError;

type Converted = Result<Option<Value>, ApiError>;

/// A protobuf message in its JSON form.
pub(super) trait ToJson {
    fn to_json(self) -> Result<Value, ApiError>;
}

/// A message field in its JSON form; None when JSON leaves it out (Go's `omitempty`).
trait Field {
    fn field(self) -> Converted;
}

impl Field for Option<String> {
    fn field(self) -> Converted {
        Ok(s(self))
    }
}

/// Scalars read as pointer fields (`*int32`, `*bool`): present means set, zero included.
/// The non-pointer `omitempty` ones go through [`nonzero`].
macro_rules! scalar_fields {
    ($($t:ty),*) => {$(
        impl Field for Option<$t> {
            fn field(self) -> Converted {
                Ok(n(self))
            }
        }
    )*};
}
scalar_fields!(bool, i32, i64);

impl Field for Vec<String> {
    fn field(self) -> Converted {
        Ok(strings(self))
    }
}

impl Field for Vec<i64> {
    fn field(self) -> Converted {
        Ok((!self.is_empty()).then(|| json!(self)))
    }
}

impl Field for BTreeMap<String, String> {
    fn field(self) -> Converted {
        Ok(map(self))
    }
}

impl Field for BTreeMap<String, Quantity> {
    fn field(self) -> Converted {
        Ok(quantities(self))
    }
}

impl Field for Option<Quantity> {
    fn field(self) -> Converted {
        Ok(self.map(|q| json!(q.string.unwrap_or_default())))
    }
}

impl Field for Option<IntOrString> {
    fn field(self) -> Converted {
        Ok(int_or_string(self))
    }
}

/// A nested message: written when present, empty or not, as Go's JSON writes a non-nil
/// pointer or a struct.
impl<T: ToJson> Field for Option<T> {
    fn field(self) -> Converted {
        self.map(ToJson::to_json).transpose()
    }
}

impl<T: ToJson> Field for Vec<T> {
    fn field(self) -> Converted {
        if self.is_empty() {
            return Ok(None);
        }
        Ok(Some(Value::Array(
            self.into_iter()
                .map(ToJson::to_json)
                .collect::<Result<_, _>>()?,
        )))
    }
}

impl ToJson for meta::ObjectMeta {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(object_meta(Some(self)))
    }
}

impl ToJson for meta::LabelSelector {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(label_selector(Some(self)).unwrap_or_else(|| json!({})))
    }
}

/// A field as its type converts it.
fn f<T: Field>(v: T, _: &str) -> Converted {
    v.field()
}

/// A non-pointer `omitempty` scalar (`hostNetwork bool`, `hostPort int32`): Go's protobuf
/// writes its zero, JSON leaves it out.
fn nonzero<T: Into<Value> + Default + PartialEq>(v: Option<T>, _: &str) -> Converted {
    Ok(nz(v))
}

/// An embedded Go struct (`VolumeSource` in `Volume`, `ProbeHandler` in `Probe`): its own
/// message in protobuf, its fields inlined in JSON (see [`put`]).
fn inline<T: ToJson>(v: Option<T>, _: &str) -> Converted {
    v.field()
}

/// A field this server does not take from protobuf: refused when set.
fn refuse<T: Field>(v: T, name: &str) -> Converted {
    match v.field() {
        Ok(None) => Ok(None),
        _ => Err(unsupported(name)),
    }
}

/// Sets `key` to `v` when present; the empty key inlines an embedded struct's fields.
fn put(m: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    match (key, v) {
        (_, None) => {}
        ("", Some(Value::Object(inner))) => m.extend(inner),
        (_, Some(v)) => {
            m.insert(key.to_string(), v);
        }
    }
}

/// `ToJson` for a k8s-pb message: `"jsonName" => converter(field)` for every field.
macro_rules! message {
    ($($ty:ident { $($key:literal => $conv:ident($field:ident)),* $(,)? })*) => {$(
        impl ToJson for core::$ty {
            fn to_json(self) -> Result<Value, ApiError> {
                let core::$ty { $($field),* } = self;
                let mut m = Map::new();
                $(put(&mut m, $key, $conv($field, $key)?);)*
                Ok(Value::Object(m))
            }
        }
    )*};
}

message! {
    PodSpec {
        "volumes" => f(volumes),
        "initContainers" => f(init_containers),
        "containers" => f(containers),
        "ephemeralContainers" => f(ephemeral_containers),
        "restartPolicy" => f(restart_policy),
        "terminationGracePeriodSeconds" => f(termination_grace_period_seconds),
        "activeDeadlineSeconds" => f(active_deadline_seconds),
        "dnsPolicy" => f(dns_policy),
        "nodeSelector" => f(node_selector),
        "serviceAccountName" => f(service_account_name),
        "serviceAccount" => f(service_account),
        "automountServiceAccountToken" => f(automount_service_account_token),
        "nodeName" => f(node_name),
        "hostNetwork" => nonzero(host_network),
        "hostPID" => nonzero(host_pid),
        "hostIPC" => nonzero(host_ipc),
        "shareProcessNamespace" => f(share_process_namespace),
        "securityContext" => f(security_context),
        "imagePullSecrets" => f(image_pull_secrets),
        "hostname" => f(hostname),
        "subdomain" => f(subdomain),
        "affinity" => f(affinity),
        "schedulerName" => f(scheduler_name),
        "tolerations" => f(tolerations),
        "hostAliases" => f(host_aliases),
        "priorityClassName" => f(priority_class_name),
        "priority" => f(priority),
        "dnsConfig" => f(dns_config),
        "readinessGates" => f(readiness_gates),
        "runtimeClassName" => f(runtime_class_name),
        "enableServiceLinks" => f(enable_service_links),
        "preemptionPolicy" => f(preemption_policy),
        "overhead" => f(overhead),
        "topologySpreadConstraints" => f(topology_spread_constraints),
        "setHostnameAsFQDN" => f(set_hostname_as_fqdn),
        "os" => f(os),
        "hostUsers" => f(host_users),
        "schedulingGates" => f(scheduling_gates),
        "resourceClaims" => f(resource_claims),
        "resources" => f(resources),
        "hostnameOverride" => refuse(hostname_override),
        "workloadRef" => refuse(workload_ref),
    }
    Container {
        "name" => f(name),
        "image" => f(image),
        "command" => f(command),
        "args" => f(args),
        "workingDir" => f(working_dir),
        "ports" => f(ports),
        "envFrom" => f(env_from),
        "env" => f(env),
        "resources" => f(resources),
        "resizePolicy" => f(resize_policy),
        "restartPolicy" => f(restart_policy),
        "restartPolicyRules" => refuse(restart_policy_rules),
        "volumeMounts" => f(volume_mounts),
        "volumeDevices" => f(volume_devices),
        "livenessProbe" => f(liveness_probe),
        "readinessProbe" => f(readiness_probe),
        "startupProbe" => f(startup_probe),
        "lifecycle" => f(lifecycle),
        "terminationMessagePath" => f(termination_message_path),
        "terminationMessagePolicy" => f(termination_message_policy),
        "imagePullPolicy" => f(image_pull_policy),
        "securityContext" => f(security_context),
        "stdin" => nonzero(stdin),
        "stdinOnce" => nonzero(stdin_once),
        "tty" => nonzero(tty),
    }
    EphemeralContainer {
        "" => inline(ephemeral_container_common),
        "targetContainerName" => f(target_container_name),
    }
    EphemeralContainerCommon {
        "name" => f(name),
        "image" => f(image),
        "command" => f(command),
        "args" => f(args),
        "workingDir" => f(working_dir),
        "ports" => f(ports),
        "envFrom" => f(env_from),
        "env" => f(env),
        "resources" => f(resources),
        "resizePolicy" => f(resize_policy),
        "restartPolicy" => f(restart_policy),
        "restartPolicyRules" => refuse(restart_policy_rules),
        "volumeMounts" => f(volume_mounts),
        "volumeDevices" => f(volume_devices),
        "livenessProbe" => f(liveness_probe),
        "readinessProbe" => f(readiness_probe),
        "startupProbe" => f(startup_probe),
        "lifecycle" => f(lifecycle),
        "terminationMessagePath" => f(termination_message_path),
        "terminationMessagePolicy" => f(termination_message_policy),
        "imagePullPolicy" => f(image_pull_policy),
        "securityContext" => f(security_context),
        "stdin" => nonzero(stdin),
        "stdinOnce" => nonzero(stdin_once),
        "tty" => nonzero(tty),
    }
    ContainerPort {
        "name" => f(name),
        "hostPort" => nonzero(host_port),
        "containerPort" => f(container_port),
        "protocol" => f(protocol),
        "hostIP" => f(host_ip),
    }
    EnvVar {
        "name" => f(name),
        "value" => f(value),
        "valueFrom" => f(value_from),
    }
    EnvVarSource {
        "fieldRef" => f(field_ref),
        "resourceFieldRef" => f(resource_field_ref),
        "configMapKeyRef" => f(config_map_key_ref),
        "secretKeyRef" => f(secret_key_ref),
        "fileKeyRef" => refuse(file_key_ref),
    }
    ObjectFieldSelector {
        "apiVersion" => f(api_version),
        "fieldPath" => f(field_path),
    }
    ResourceFieldSelector {
        "containerName" => f(container_name),
        "resource" => f(resource),
        "divisor" => f(divisor),
    }
    ConfigMapKeySelector {
        "" => inline(local_object_reference),
        "key" => f(key),
        "optional" => f(optional),
    }
    SecretKeySelector {
        "" => inline(local_object_reference),
        "key" => f(key),
        "optional" => f(optional),
    }
    LocalObjectReference {
        "name" => f(name),
    }
    EnvFromSource {
        "prefix" => f(prefix),
        "configMapRef" => f(config_map_ref),
        "secretRef" => f(secret_ref),
    }
    ConfigMapEnvSource {
        "" => inline(local_object_reference),
        "optional" => f(optional),
    }
    SecretEnvSource {
        "" => inline(local_object_reference),
        "optional" => f(optional),
    }
    ResourceRequirements {
        "limits" => f(limits),
        "requests" => f(requests),
        "claims" => f(claims),
    }
    ResourceClaim {
        "name" => f(name),
        "request" => f(request),
    }
    ContainerResizePolicy {
        "resourceName" => f(resource_name),
        "restartPolicy" => f(restart_policy),
    }
    VolumeMount {
        "name" => f(name),
        "readOnly" => nonzero(read_only),
        "recursiveReadOnly" => f(recursive_read_only),
        "mountPath" => f(mount_path),
        "subPath" => f(sub_path),
        "mountPropagation" => f(mount_propagation),
        "subPathExpr" => f(sub_path_expr),
    }
    VolumeDevice {
        "name" => f(name),
        "devicePath" => f(device_path),
    }
    Probe {
        "" => inline(handler),
        "initialDelaySeconds" => nonzero(initial_delay_seconds),
        "timeoutSeconds" => nonzero(timeout_seconds),
        "periodSeconds" => nonzero(period_seconds),
        "successThreshold" => nonzero(success_threshold),
        "failureThreshold" => nonzero(failure_threshold),
        "terminationGracePeriodSeconds" => f(termination_grace_period_seconds),
    }
    ProbeHandler {
        "exec" => f(exec),
        "httpGet" => f(http_get),
        "tcpSocket" => f(tcp_socket),
        "grpc" => f(grpc),
    }
    ExecAction {
        "command" => f(command),
    }
    HttpGetAction {
        "path" => f(path),
        "port" => f(port),
        "host" => f(host),
        "scheme" => f(scheme),
        "httpHeaders" => f(http_headers),
    }
    HttpHeader {
        "name" => f(name),
        "value" => f(value),
    }
    TcpSocketAction {
        "port" => f(port),
        "host" => f(host),
    }
    GrpcAction {
        "port" => f(port),
        "service" => f(service),
    }
    Lifecycle {
        "postStart" => f(post_start),
        "preStop" => f(pre_stop),
        "stopSignal" => f(stop_signal),
    }
    LifecycleHandler {
        "exec" => f(exec),
        "httpGet" => f(http_get),
        "tcpSocket" => f(tcp_socket),
        "sleep" => f(sleep),
    }
    SleepAction {
        "seconds" => f(seconds),
    }
    SecurityContext {
        "capabilities" => f(capabilities),
        "privileged" => f(privileged),
        "seLinuxOptions" => f(se_linux_options),
        "windowsOptions" => f(windows_options),
        "runAsUser" => f(run_as_user),
        "runAsGroup" => f(run_as_group),
        "runAsNonRoot" => f(run_as_non_root),
        "readOnlyRootFilesystem" => f(read_only_root_filesystem),
        "allowPrivilegeEscalation" => f(allow_privilege_escalation),
        "procMount" => f(proc_mount),
        "seccompProfile" => f(seccomp_profile),
        "appArmorProfile" => f(app_armor_profile),
    }
    Capabilities {
        "add" => f(add),
        "drop" => f(drop),
    }
    SeLinuxOptions {
        "user" => f(user),
        "role" => f(role),
        "type" => f(r#type),
        "level" => f(level),
    }
    WindowsSecurityContextOptions {
        "gmsaCredentialSpecName" => f(gmsa_credential_spec_name),
        "gmsaCredentialSpec" => f(gmsa_credential_spec),
        "runAsUserName" => f(run_as_user_name),
        "hostProcess" => f(host_process),
    }
    SeccompProfile {
        "type" => f(r#type),
        "localhostProfile" => f(localhost_profile),
    }
    AppArmorProfile {
        "type" => f(r#type),
        "localhostProfile" => f(localhost_profile),
    }
    PodSecurityContext {
        "seLinuxOptions" => f(se_linux_options),
        "windowsOptions" => f(windows_options),
        "runAsUser" => f(run_as_user),
        "runAsGroup" => f(run_as_group),
        "runAsNonRoot" => f(run_as_non_root),
        "supplementalGroups" => f(supplemental_groups),
        "supplementalGroupsPolicy" => f(supplemental_groups_policy),
        "fsGroup" => f(fs_group),
        "sysctls" => f(sysctls),
        "fsGroupChangePolicy" => f(fs_group_change_policy),
        "seccompProfile" => f(seccomp_profile),
        "appArmorProfile" => f(app_armor_profile),
        "seLinuxChangePolicy" => f(se_linux_change_policy),
    }
    Sysctl {
        "name" => f(name),
        "value" => f(value),
    }
    Affinity {
        "nodeAffinity" => f(node_affinity),
        "podAffinity" => f(pod_affinity),
        "podAntiAffinity" => f(pod_anti_affinity),
    }
    NodeAffinity {
        "requiredDuringSchedulingIgnoredDuringExecution" =>
            f(required_during_scheduling_ignored_during_execution),
        "preferredDuringSchedulingIgnoredDuringExecution" =>
            f(preferred_during_scheduling_ignored_during_execution),
    }
    PodAffinity {
        "requiredDuringSchedulingIgnoredDuringExecution" =>
            f(required_during_scheduling_ignored_during_execution),
        "preferredDuringSchedulingIgnoredDuringExecution" =>
            f(preferred_during_scheduling_ignored_during_execution),
    }
    PodAntiAffinity {
        "requiredDuringSchedulingIgnoredDuringExecution" =>
            f(required_during_scheduling_ignored_during_execution),
        "preferredDuringSchedulingIgnoredDuringExecution" =>
            f(preferred_during_scheduling_ignored_during_execution),
    }
    NodeSelector {
        "nodeSelectorTerms" => f(node_selector_terms),
    }
    NodeSelectorTerm {
        "matchExpressions" => f(match_expressions),
        "matchFields" => f(match_fields),
    }
    NodeSelectorRequirement {
        "key" => f(key),
        "operator" => f(operator),
        "values" => f(values),
    }
    PreferredSchedulingTerm {
        "weight" => f(weight),
        "preference" => f(preference),
    }
    WeightedPodAffinityTerm {
        "weight" => f(weight),
        "podAffinityTerm" => f(pod_affinity_term),
    }
    PodAffinityTerm {
        "labelSelector" => f(label_selector),
        "namespaces" => f(namespaces),
        "topologyKey" => f(topology_key),
        "namespaceSelector" => f(namespace_selector),
        "matchLabelKeys" => f(match_label_keys),
        "mismatchLabelKeys" => f(mismatch_label_keys),
    }
    Toleration {
        "key" => f(key),
        "operator" => f(operator),
        "value" => f(value),
        "effect" => f(effect),
        "tolerationSeconds" => f(toleration_seconds),
    }
    HostAlias {
        "ip" => f(ip),
        "hostnames" => f(hostnames),
    }
    PodDnsConfig {
        "nameservers" => f(nameservers),
        "searches" => f(searches),
        "options" => f(options),
    }
    PodDnsConfigOption {
        "name" => f(name),
        "value" => f(value),
    }
    PodReadinessGate {
        "conditionType" => f(condition_type),
    }
    TopologySpreadConstraint {
        "maxSkew" => f(max_skew),
        "topologyKey" => f(topology_key),
        "whenUnsatisfiable" => f(when_unsatisfiable),
        "labelSelector" => f(label_selector),
        "minDomains" => f(min_domains),
        "nodeAffinityPolicy" => f(node_affinity_policy),
        "nodeTaintsPolicy" => f(node_taints_policy),
        "matchLabelKeys" => f(match_label_keys),
    }
    PodOs {
        "name" => f(name),
    }
    PodSchedulingGate {
        "name" => f(name),
    }
    PodResourceClaim {
        "name" => f(name),
        "resourceClaimName" => f(resource_claim_name),
        "resourceClaimTemplateName" => f(resource_claim_template_name),
    }
    Volume {
        "name" => f(name),
        "" => inline(volume_source),
    }
    VolumeSource {
        "hostPath" => f(host_path),
        "emptyDir" => f(empty_dir),
        "secret" => f(secret),
        "nfs" => f(nfs),
        "persistentVolumeClaim" => f(persistent_volume_claim),
        "downwardAPI" => f(downward_api),
        "configMap" => f(config_map),
        "projected" => f(projected),
        "csi" => f(csi),
        "image" => f(image),
        "gcePersistentDisk" => refuse(gce_persistent_disk),
        "awsElasticBlockStore" => refuse(aws_elastic_block_store),
        "gitRepo" => refuse(git_repo),
        "iscsi" => refuse(iscsi),
        "glusterfs" => refuse(glusterfs),
        "rbd" => refuse(rbd),
        "flexVolume" => refuse(flex_volume),
        "cinder" => refuse(cinder),
        "cephfs" => refuse(cephfs),
        "flocker" => refuse(flocker),
        "fc" => refuse(fc),
        "azureFile" => refuse(azure_file),
        "vsphereVolume" => refuse(vsphere_volume),
        "quobyte" => refuse(quobyte),
        "azureDisk" => refuse(azure_disk),
        "photonPersistentDisk" => refuse(photon_persistent_disk),
        "portworxVolume" => refuse(portworx_volume),
        "scaleIO" => refuse(scale_io),
        "storageos" => refuse(storageos),
        "ephemeral" => refuse(ephemeral),
    }
    HostPathVolumeSource {
        "path" => f(path),
        "type" => f(r#type),
    }
    EmptyDirVolumeSource {
        "medium" => f(medium),
        "sizeLimit" => f(size_limit),
    }
    SecretVolumeSource {
        "secretName" => f(secret_name),
        "items" => f(items),
        "defaultMode" => f(default_mode),
        "optional" => f(optional),
    }
    KeyToPath {
        "key" => f(key),
        "path" => f(path),
        "mode" => f(mode),
    }
    NfsVolumeSource {
        "server" => f(server),
        "path" => f(path),
        "readOnly" => nonzero(read_only),
    }
    PersistentVolumeClaimVolumeSource {
        "claimName" => f(claim_name),
        "readOnly" => nonzero(read_only),
    }
    DownwardAPIVolumeSource {
        "items" => f(items),
        "defaultMode" => f(default_mode),
    }
    DownwardAPIVolumeFile {
        "path" => f(path),
        "fieldRef" => f(field_ref),
        "resourceFieldRef" => f(resource_field_ref),
        "mode" => f(mode),
    }
    ConfigMapVolumeSource {
        "" => inline(local_object_reference),
        "items" => f(items),
        "defaultMode" => f(default_mode),
        "optional" => f(optional),
    }
    ProjectedVolumeSource {
        "sources" => f(sources),
        "defaultMode" => f(default_mode),
    }
    VolumeProjection {
        "secret" => f(secret),
        "downwardAPI" => f(downward_api),
        "configMap" => f(config_map),
        "serviceAccountToken" => f(service_account_token),
        "clusterTrustBundle" => f(cluster_trust_bundle),
        "podCertificate" => refuse(pod_certificate),
    }
    SecretProjection {
        "" => inline(local_object_reference),
        "items" => f(items),
        "optional" => f(optional),
    }
    ConfigMapProjection {
        "" => inline(local_object_reference),
        "items" => f(items),
        "optional" => f(optional),
    }
    DownwardAPIProjection {
        "items" => f(items),
    }
    ServiceAccountTokenProjection {
        "audience" => f(audience),
        "expirationSeconds" => f(expiration_seconds),
        "path" => f(path),
    }
    ClusterTrustBundleProjection {
        "name" => f(name),
        "signerName" => f(signer_name),
        "labelSelector" => f(label_selector),
        "optional" => f(optional),
        "path" => f(path),
    }
    CSIVolumeSource {
        "driver" => f(driver),
        "readOnly" => f(read_only),
        "fsType" => f(fs_type),
        "volumeAttributes" => f(volume_attributes),
        "nodePublishSecretRef" => f(node_publish_secret_ref),
    }
    ImageVolumeSource {
        "reference" => f(reference),
        "pullPolicy" => f(pull_policy),
    }
}

/// Messages named only to refuse them when set (see [`refuse`]): converting them is never
/// reached.
macro_rules! refused_messages {
    ($($ty:ident),*) => {$(
        impl ToJson for core::$ty {
            fn to_json(self) -> Result<Value, ApiError> {
                Err(unsupported(stringify!($ty)))
            }
        }
    )*};
}
refused_messages!(
    ContainerRestartRule,
    WorkloadReference,
    FileKeySelector,
    PodCertificateProjection,
    GcePersistentDiskVolumeSource,
    AwsElasticBlockStoreVolumeSource,
    GitRepoVolumeSource,
    IscsiVolumeSource,
    GlusterfsVolumeSource,
    RbdVolumeSource,
    FlexVolumeSource,
    CinderVolumeSource,
    CephFsVolumeSource,
    FlockerVolumeSource,
    FcVolumeSource,
    AzureFileVolumeSource,
    VsphereVirtualDiskVolumeSource,
    QuobyteVolumeSource,
    AzureDiskVolumeSource,
    PhotonPersistentDiskVolumeSource,
    PortworxVolumeSource,
    ScaleIoVolumeSource,
    StorageOsVolumeSource,
    EphemeralVolumeSource
);

/// A pod spec; `containers` always written (required, and what the templates' tests expect).
pub(super) fn pod_spec(p: core::PodSpec) -> Result<Value, ApiError> {
    let mut v = p.to_json()?;
    if v.get("containers").is_none() {
        v["containers"] = json!([]);
    }
    Ok(v)
}

/// A v1 Pod without its status: the status is the server's and the node agent's (ignored on
/// create and on updates of the pod, as Kubernetes does; `kubectl debug --copy-to` sends the
/// original's), and pods/status refuses protobuf bodies (see [`super::converts_status`]).
pub(super) fn pod(p: core::Pod) -> Result<Value, ApiError> {
    let core::Pod {
        metadata,
        spec,
        status: _,
    } = p;
    let mut m = Map::new();
    m.insert("metadata".into(), object_meta(metadata));
    if let Some(spec) = spec {
        m.insert("spec".into(), pod_spec(spec)?);
    }
    Ok(Value::Object(m))
}

#[cfg(test)]
mod tests {
    use super::super::decode;
    use super::super::tests::envelope;
    use super::*;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use prost::Message;

    fn qty(q: &str) -> Quantity {
        Quantity {
            string: Some(q.into()),
        }
    }

    fn port(p: i32) -> Option<IntOrString> {
        Some(IntOrString {
            r#type: Some(0),
            int_val: Some(p),
            str_val: Some(String::new()),
        })
    }

    /// Decodes `p` as the API server reads a body, and checks that the JSON survives a trip
    /// through k8s-openapi's Pod: a misspelled key would be dropped there.
    fn decode_pod(p: core::Pod) -> Value {
        let v = decode(&envelope("v1", "Pod", p.encode_to_vec())).unwrap();
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), v);
        v
    }

    fn container(name: &str, command: &[&str]) -> core::Container {
        // What Go's protobuf writes for an unset non-pointer field: its zero.
        core::Container {
            name: Some(name.into()),
            image: Some("registry/echo:1".into()),
            command: command.iter().map(|c| c.to_string()).collect(),
            working_dir: Some(String::new()),
            resources: Some(Default::default()),
            termination_message_path: Some(String::new()),
            image_pull_policy: Some(String::new()),
            stdin: Some(false),
            stdin_once: Some(false),
            tty: Some(false),
            ..Default::default()
        }
    }

    #[test]
    fn decodes_the_node_debugging_pod_kubectl_debug_creates() {
        let mut debugger = container("debugger", &["/echo", "cat", "/host/etc/hostname"]);
        debugger.termination_message_policy = Some("FallbackToLogsOnError".into());
        debugger.volume_mounts = vec![core::VolumeMount {
            name: Some("host-root".into()),
            mount_path: Some("/host".into()),
            read_only: Some(false),
            sub_path: Some(String::new()),
            ..Default::default()
        }];
        let p = core::Pod {
            metadata: Some(meta::ObjectMeta {
                name: Some("node-debugger-n1-x7k2q".into()),
                labels: [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "kubectl-debug".to_string(),
                )]
                .into(),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                containers: vec![debugger],
                node_name: Some("n1".into()),
                host_ipc: Some(true),
                host_network: Some(true),
                host_pid: Some(true),
                restart_policy: Some("Never".into()),
                dns_policy: Some(String::new()),
                hostname: Some(String::new()),
                volumes: vec![core::Volume {
                    name: Some("host-root".into()),
                    volume_source: Some(core::VolumeSource {
                        host_path: Some(core::HostPathVolumeSource {
                            path: Some("/".into()),
                            r#type: None,
                        }),
                        ..Default::default()
                    }),
                }],
                tolerations: vec![core::Toleration {
                    operator: Some("Exists".into()),
                    key: Some(String::new()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        assert_eq!(
            decode_pod(p),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "node-debugger-n1-x7k2q",
                             "labels": {"app.kubernetes.io/managed-by": "kubectl-debug"}},
                "spec": {
                    "containers": [{
                        "name": "debugger", "image": "registry/echo:1",
                        "command": ["/echo", "cat", "/host/etc/hostname"],
                        "resources": {},
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "volumeMounts": [{"name": "host-root", "mountPath": "/host"}],
                    }],
                    "nodeName": "n1",
                    "hostIPC": true, "hostNetwork": true, "hostPID": true,
                    "restartPolicy": "Never",
                    "volumes": [{"name": "host-root", "hostPath": {"path": "/"}}],
                    "tolerations": [{"operator": "Exists"}],
                },
            })
        );
    }

    #[test]
    fn decodes_a_copy_of_a_stored_pod_as_kubectl_debug_copy_to_sends_it() {
        let mut app = container("app", &["/echo", "serve"]);
        app.ports = vec![core::ContainerPort {
            name: Some("http".into()),
            container_port: Some(8080),
            host_port: Some(0),
            protocol: Some("TCP".into()),
            host_ip: Some(String::new()),
        }];
        app.env = vec![
            core::EnvVar {
                name: Some("GREETING".into()),
                value: Some("hi".into()),
                value_from: None,
            },
            core::EnvVar {
                name: Some("POD_IP".into()),
                value: Some(String::new()),
                value_from: Some(core::EnvVarSource {
                    field_ref: Some(core::ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: Some("status.podIP".into()),
                    }),
                    ..Default::default()
                }),
            },
            core::EnvVar {
                name: Some("TOKEN".into()),
                value: None,
                value_from: Some(core::EnvVarSource {
                    secret_key_ref: Some(core::SecretKeySelector {
                        local_object_reference: Some(core::LocalObjectReference {
                            name: Some("s".into()),
                        }),
                        key: Some("token".into()),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
            },
        ];
        app.env_from = vec![core::EnvFromSource {
            prefix: Some("CM_".into()),
            config_map_ref: Some(core::ConfigMapEnvSource {
                local_object_reference: Some(core::LocalObjectReference {
                    name: Some("settings".into()),
                }),
                optional: None,
            }),
            secret_ref: None,
        }];
        app.resources = Some(core::ResourceRequirements {
            limits: [("memory".to_string(), qty("64Mi"))].into(),
            requests: [("cpu".to_string(), qty("100m"))].into(),
            claims: vec![],
        });
        app.readiness_probe = Some(core::Probe {
            handler: Some(core::ProbeHandler {
                http_get: Some(core::HttpGetAction {
                    path: Some("/readyz".into()),
                    port: port(8080),
                    host: Some(String::new()),
                    scheme: Some("HTTP".into()),
                    http_headers: vec![],
                }),
                ..Default::default()
            }),
            initial_delay_seconds: Some(0),
            timeout_seconds: Some(1),
            period_seconds: Some(10),
            success_threshold: Some(1),
            failure_threshold: Some(3),
            termination_grace_period_seconds: None,
        });
        app.lifecycle = Some(core::Lifecycle {
            pre_stop: Some(core::LifecycleHandler {
                sleep: Some(core::SleepAction { seconds: Some(1) }),
                ..Default::default()
            }),
            ..Default::default()
        });
        app.security_context = Some(core::SecurityContext {
            capabilities: Some(core::Capabilities {
                add: vec!["SYS_PTRACE".into()],
                drop: vec![],
            }),
            run_as_user: Some(0),
            allow_privilege_escalation: Some(false),
            seccomp_profile: Some(core::SeccompProfile {
                r#type: Some("RuntimeDefault".into()),
                localhost_profile: None,
            }),
            ..Default::default()
        });
        app.volume_mounts = vec![core::VolumeMount {
            name: Some("kube-api-access-abcde".into()),
            read_only: Some(true),
            mount_path: Some("/var/run/secrets/kubernetes.io/serviceaccount".into()),
            ..Default::default()
        }];
        app.termination_message_path = Some("/dev/termination-log".into());
        app.termination_message_policy = Some("File".into());
        app.image_pull_policy = Some("IfNotPresent".into());
        let mut dbg = container("dbg", &["/echo", "cat", "/proc/1/cmdline"]);
        dbg.stdin = Some(true);
        dbg.tty = Some(true);
        let projected = core::ProjectedVolumeSource {
            sources: vec![
                core::VolumeProjection {
                    service_account_token: Some(core::ServiceAccountTokenProjection {
                        audience: Some(String::new()),
                        expiration_seconds: Some(3607),
                        path: Some("token".into()),
                    }),
                    ..Default::default()
                },
                core::VolumeProjection {
                    config_map: Some(core::ConfigMapProjection {
                        local_object_reference: Some(core::LocalObjectReference {
                            name: Some("kube-root-ca.crt".into()),
                        }),
                        items: vec![core::KeyToPath {
                            key: Some("ca.crt".into()),
                            path: Some("ca.crt".into()),
                            mode: None,
                        }],
                        optional: None,
                    }),
                    ..Default::default()
                },
                core::VolumeProjection {
                    downward_api: Some(core::DownwardAPIProjection {
                        items: vec![core::DownwardAPIVolumeFile {
                            path: Some("namespace".into()),
                            field_ref: Some(core::ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: Some("metadata.namespace".into()),
                            }),
                            resource_field_ref: None,
                            mode: None,
                        }],
                    }),
                    ..Default::default()
                },
            ],
            default_mode: Some(420),
        };
        let p = core::Pod {
            metadata: Some(meta::ObjectMeta {
                name: Some("web-copy".into()),
                annotations: [("note".to_string(), "copied".to_string())].into(),
                ..Default::default()
            }),
            spec: Some(core::PodSpec {
                containers: vec![app, dbg],
                share_process_namespace: Some(true),
                node_name: Some("n1".into()),
                restart_policy: Some("Always".into()),
                termination_grace_period_seconds: Some(30),
                dns_policy: Some("ClusterFirst".into()),
                service_account_name: Some("default".into()),
                service_account: Some("default".into()),
                enable_service_links: Some(true),
                priority: Some(0),
                preemption_policy: Some("PreemptLowerPriority".into()),
                scheduler_name: Some("default-scheduler".into()),
                security_context: Some(core::PodSecurityContext {
                    supplemental_groups: vec![1000],
                    fs_group: Some(2000),
                    sysctls: vec![core::Sysctl {
                        name: Some("net.ipv4.ip_unprivileged_port_start".into()),
                        value: Some("0".into()),
                    }],
                    ..Default::default()
                }),
                tolerations: vec![core::Toleration {
                    key: Some("node.kubernetes.io/not-ready".into()),
                    operator: Some("Exists".into()),
                    value: Some(String::new()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(300),
                }],
                affinity: Some(core::Affinity {
                    node_affinity: Some(core::NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(
                            core::NodeSelector {
                                node_selector_terms: vec![core::NodeSelectorTerm {
                                    match_expressions: vec![core::NodeSelectorRequirement {
                                        key: Some("kubernetes.io/os".into()),
                                        operator: Some("In".into()),
                                        values: vec!["linux".into()],
                                    }],
                                    match_fields: vec![],
                                }],
                            },
                        ),
                        preferred_during_scheduling_ignored_during_execution: vec![],
                    }),
                    ..Default::default()
                }),
                volumes: vec![
                    core::Volume {
                        name: Some("kube-api-access-abcde".into()),
                        volume_source: Some(core::VolumeSource {
                            projected: Some(projected),
                            ..Default::default()
                        }),
                    },
                    core::Volume {
                        name: Some("scratch".into()),
                        volume_source: Some(core::VolumeSource {
                            empty_dir: Some(core::EmptyDirVolumeSource {
                                medium: Some(String::new()),
                                size_limit: Some(qty("1Gi")),
                            }),
                            ..Default::default()
                        }),
                    },
                ],
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let v = decode_pod(p);
        let spec = &v["spec"];
        assert_eq!(spec["shareProcessNamespace"], true);
        assert_eq!(spec["priority"], 0, "a pointer field keeps its zero");
        assert_eq!(
            spec["containers"][0],
            json!({
                "name": "app", "image": "registry/echo:1", "command": ["/echo", "serve"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [
                    {"name": "GREETING", "value": "hi"},
                    {"name": "POD_IP",
                     "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
                    {"name": "TOKEN",
                     "valueFrom": {"secretKeyRef": {"name": "s", "key": "token", "optional": false}}},
                ],
                "envFrom": [{"prefix": "CM_", "configMapRef": {"name": "settings"}}],
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "100m"}},
                "readinessProbe": {
                    "httpGet": {"path": "/readyz", "port": 8080, "scheme": "HTTP"},
                    "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                    "failureThreshold": 3,
                },
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                "securityContext": {
                    "capabilities": {"add": ["SYS_PTRACE"]}, "runAsUser": 0,
                    "allowPrivilegeEscalation": false,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            })
        );
        assert_eq!(
            spec["containers"][1],
            json!({"name": "dbg", "image": "registry/echo:1",
                   "command": ["/echo", "cat", "/proc/1/cmdline"], "resources": {},
                   "stdin": true, "tty": true})
        );
        assert_eq!(
            spec["volumes"],
            json!([
                {"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef":
                        {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
            ])
        );
        assert_eq!(
            spec["securityContext"],
            json!({"supplementalGroups": [1000], "fsGroup": 2000, "sysctls":
                   [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]})
        );
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}])
        );
        assert_eq!(
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["linux"])
        );
        assert_eq!(v["metadata"]["annotations"]["note"], "copied");
    }

    #[test]
    fn decodes_ephemeral_containers_inline() {
        let p = core::Pod {
            metadata: None,
            spec: Some(core::PodSpec {
                containers: vec![container("app", &[])],
                ephemeral_containers: vec![core::EphemeralContainer {
                    ephemeral_container_common: Some(core::EphemeralContainerCommon {
                        name: Some("dbg".into()),
                        image: Some("busybox".into()),
                        stdin: Some(true),
                        ..Default::default()
                    }),
                    target_container_name: Some("app".into()),
                }],
                ..Default::default()
            }),
            status: None,
        };
        assert_eq!(
            decode_pod(p)["spec"]["ephemeralContainers"],
            json!([{"name": "dbg", "image": "busybox", "stdin": true,
                    "targetContainerName": "app"}])
        );
    }

    #[test]
    fn refuses_what_it_does_not_convert() {
        let with_volume = |source: core::VolumeSource| core::Pod {
            metadata: None,
            spec: Some(core::PodSpec {
                containers: vec![container("app", &[])],
                volumes: vec![core::Volume {
                    name: Some("v".into()),
                    volume_source: Some(source),
                }],
                ..Default::default()
            }),
            status: None,
        };
        let refused = |p: core::Pod| {
            let e = decode(&envelope("v1", "Pod", p.encode_to_vec())).unwrap_err();
            assert_eq!(e.code, 415, "{}", e.message);
            e.message
        };
        let e = refused(with_volume(core::VolumeSource {
            git_repo: Some(Default::default()),
            ..Default::default()
        }));
        assert!(e.contains("gitRepo"), "{e}");
        let mut p = with_volume(core::VolumeSource {
            empty_dir: Some(Default::default()),
            ..Default::default()
        });
        p.spec.as_mut().unwrap().hostname_override = Some("newer-than-1.33".into());
        let e = refused(p);
        assert!(e.contains("hostnameOverride"), "{e}");
    }

    #[test]
    fn leaves_the_status_to_the_server() {
        let p = core::Pod {
            metadata: None,
            spec: Some(core::PodSpec {
                containers: vec![container("app", &[])],
                ..Default::default()
            }),
            status: Some(core::PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.244.0.7".into()),
                ..Default::default()
            }),
        };
        assert_eq!(decode_pod(p).get("status"), None);
        assert!(!crate::apiserver::protobuf::converts_status("Pod"));
    }
}
