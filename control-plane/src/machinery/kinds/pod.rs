//! Pods and pod templates: Kubernetes' defaulters (PodSpec, Container, Probe, volumes), the
//! admission defaults a pod gets on create (DefaultTolerationSeconds, service
//! account name, Pending phase and QoS class), validation of the spec and of updates (a pod is
//! immutable except images, activeDeadlineSeconds and added tolerations), kubectl's pod
//! columns with its STATUS computation, and the pod field selectors.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, EphemeralContainer, Pod, PodSpec, PodStatus, PodTemplateSpec, Probe,
    ResourceRequirements, Toleration, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::common::{
    age_cell, decode, default_typed, meta_errors, meta_field, name_cell, port_name_errors,
    scalar_at, validate_typed, PORT_RANGE_MSG, PROTOCOLS,
};
use crate::machinery::duration;
use crate::machinery::quantity::Quantity;
use crate::machinery::status::{CauseType, FieldError};
use crate::machinery::table::{ColumnType, TableColumnDefinition};
use crate::machinery::validation::{
    dns1123_label_errors, dns1123_subdomain_errors, invalid_each, qualified_name_errors,
    validate_labels, FieldPath, NameRule, Scope,
};

pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

// ---------------------------------------------------------------- defaulting

/// Kubernetes' `SetDefaults_PodSpec` and everything nested (containers, probes, volumes).
pub fn default_pod_spec(spec: &mut PodSpec) {
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.security_context.get_or_insert_with(Default::default);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    let host_network = spec.host_network == Some(true);
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        default_container(c, host_network);
    }
    for e in spec.ephemeral_containers.iter_mut().flatten() {
        // An ephemeral container takes a container's defaults (pull policy, termination
        // message), through the fields the two types share.
        if let Some(mut c) = as_container(e) {
            default_container(&mut c, host_network);
            e.image_pull_policy = c.image_pull_policy;
            e.termination_message_path = c.termination_message_path;
            e.termination_message_policy = c.termination_message_policy;
        }
    }
    for v in spec.volumes.iter_mut().flatten() {
        default_volume(v);
    }
}

/// An ephemeral container as a container (the shared fields; targetContainerName dropped).
fn as_container(e: &EphemeralContainer) -> Option<Container> {
    let mut v = serde_json::to_value(e).ok()?;
    v.as_object_mut()?.remove("targetContainerName");
    serde_json::from_value(v).ok()
}

/// `IfNotPresent` for a pinned tag or digest, `Always` for `:latest` or no tag.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

fn default_container(c: &mut Container, host_network: bool) {
    if c.image_pull_policy.is_none() {
        c.image_pull_policy = Some(default_pull_policy(c.image.as_deref().unwrap_or("")).into());
    }
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy
        .get_or_insert_with(|| "File".into());
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
        if host_network && p.host_port.is_none() {
            p.host_port = Some(p.container_port);
        }
    }
    for probe in [
        c.liveness_probe.as_mut(),
        c.readiness_probe.as_mut(),
        c.startup_probe.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        default_probe(probe);
    }
    for e in c.env.iter_mut().flatten() {
        if let Some(f) = e.value_from.as_mut().and_then(|f| f.field_ref.as_mut()) {
            f.api_version.get_or_insert_with(|| "v1".into());
        }
    }
}

fn default_probe(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(h) = p.http_get.as_mut() {
        h.path.get_or_insert_with(|| "/".into());
        h.scheme.get_or_insert_with(|| "HTTP".into());
    }
}

fn default_volume(v: &mut Volume) {
    const MODE: i32 = 0o644;
    let has_source = v.empty_dir.is_some()
        || v.config_map.is_some()
        || v.secret.is_some()
        || v.host_path.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
        || v.persistent_volume_claim.is_some()
        || v.nfs.is_some()
        || v.csi.is_some()
        || v.ephemeral.is_some()
        || v.image.is_some()
        || v.iscsi.is_some()
        || v.fc.is_some();
    if !has_source {
        v.empty_dir = Some(Default::default());
    }
    if let Some(s) = v.config_map.as_mut() {
        s.default_mode.get_or_insert(MODE);
    }
    if let Some(s) = v.secret.as_mut() {
        s.default_mode.get_or_insert(MODE);
    }
    if let Some(s) = v.downward_api.as_mut() {
        s.default_mode.get_or_insert(MODE);
    }
    if let Some(s) = v.projected.as_mut() {
        s.default_mode.get_or_insert(MODE);
    }
    if let Some(s) = v.host_path.as_mut() {
        s.type_.get_or_insert_with(String::new);
    }
}

pub fn default_template(t: &mut PodTemplateSpec) {
    if let Some(spec) = t.spec.as_mut() {
        default_pod_spec(spec);
    }
}

pub fn default(v: &mut Value) {
    default_typed(v, |pod: &mut Pod| {
        let Some(spec) = pod.spec.as_mut() else {
            return;
        };
        default_pod_spec(spec);
        // Requests default to limits on pods (not on templates), as SetDefaults_Pod does.
        for c in spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(spec.containers.iter_mut())
        {
            if let Some(ResourceRequirements {
                limits: Some(limits),
                requests,
                ..
            }) = c.resources.as_mut()
            {
                let requests = requests.get_or_insert_with(Default::default);
                for (k, v) in limits.iter() {
                    requests.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
        // Admission defaults applied to pods on create.
        add_default_tolerations(spec.tolerations.get_or_insert_with(Vec::new));
        // spec.priority and spec.preemptionPolicy are the Priority admission plugin's: from
        // the pod's class, so they cannot be defaulted before it runs.
        if spec
            .service_account_name
            .as_deref()
            .unwrap_or("")
            .is_empty()
        {
            let sa = spec
                .service_account
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into());
            spec.service_account_name = Some(sa);
        }
        let qos = qos_class(spec);
        let status = pod.status.get_or_insert_with(PodStatus::default);
        status.phase.get_or_insert_with(|| "Pending".into());
        status.qos_class.get_or_insert_with(|| qos.into());
    });
}

/// DefaultTolerationSeconds admission: tolerate not-ready and unreachable nodes for 300 s
/// unless the pod already says how.
pub fn add_default_tolerations(tolerations: &mut Vec<Toleration>) {
    let tolerates = |key: &str| {
        tolerations.iter().any(|t| {
            let k = t.key.as_deref().unwrap_or("");
            let effect = t.effect.as_deref().unwrap_or("");
            (k == key || k.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        })
    };
    let missing: Vec<&str> = [NOT_READY_TAINT, UNREACHABLE_TAINT]
        .into_iter()
        .filter(|k| !tolerates(k))
        .collect();
    for key in missing {
        tolerations.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(DEFAULT_TOLERATION_SECONDS),
            value: None,
        });
    }
}

/// Guaranteed (every container limits = requests for cpu and memory), BestEffort (no
/// requests or limits at all), else Burstable.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        let relevant = |m: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >| {
            m.map(|m| {
                m.iter()
                    .filter(|(k, q)| {
                        (*k == "cpu" || *k == "memory")
                            && Quantity::parse(&q.0).is_ok_and(|q| !q.is_zero())
                    })
                    .count()
            })
            .unwrap_or(0)
        };
        if relevant(requests) > 0 || relevant(limits) > 0 {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let l = limits
                .and_then(|l| l.get(res))
                .and_then(|q| Quantity::parse(&q.0).ok());
            let q = requests
                .and_then(|l| l.get(res))
                .and_then(|q| Quantity::parse(&q.0).ok());
            match (l, q) {
                (Some(l), Some(q)) if l == q => {}
                (Some(_), None) => {} // requests default to limits
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

// ---------------------------------------------------------------- validation

const RESTART_POLICIES: &[&str] = &["Always", "Never", "OnFailure"];
const DNS_POLICIES: &[&str] = &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const TOLERATION_OPERATORS: &[&str] = &["Equal", "Exists"];
const TAINT_EFFECTS: &[&str] = &["NoExecute", "NoSchedule", "PreferNoSchedule"];

/// Kubernetes' `ValidatePodSpec`, the parts a pod and a pod template share.
pub fn validate_pod_spec(spec: &PodSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut volumes = BTreeSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let p = path.child("volumes").index(i).child("name");
        if v.name.is_empty() {
            errs.push(FieldError::required(&p));
        } else {
            errs.extend(invalid_each(&p, &v.name, dns1123_label_errors(&v.name)));
            if !volumes.insert(v.name.as_str()) {
                errs.push(FieldError::duplicate(&p, &v.name));
            }
        }
    }
    if spec.containers.is_empty() {
        errs.push(FieldError::required(path.child("containers")));
    }
    let mut names = BTreeSet::new();
    for (list, containers) in [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("containers", spec.containers.as_slice()),
    ] {
        for (i, c) in containers.iter().enumerate() {
            errs.extend(validate_container(
                c,
                &path.child(list).index(i),
                &mut names,
                &volumes,
            ));
        }
    }
    if spec.host_network == Some(true) {
        errs.extend(host_network_ports(spec, path));
    }
    if let Some(p) = spec.restart_policy.as_deref() {
        if !RESTART_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("restartPolicy"),
                p,
                RESTART_POLICIES,
            ));
        }
    }
    if let Some(p) = spec.dns_policy.as_deref() {
        if !DNS_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("dnsPolicy"),
                p,
                DNS_POLICIES,
            ));
        }
    }
    if let Some(s) = spec.termination_grace_period_seconds {
        if s < 0 {
            errs.push(FieldError::invalid_number(
                path.child("terminationGracePeriodSeconds"),
                s,
                "must be greater than or equal to 0",
            ));
        }
    }
    if let Some(s) = spec.active_deadline_seconds {
        if s <= 0 {
            errs.push(FieldError::invalid_number(
                path.child("activeDeadlineSeconds"),
                s,
                "must be between 1 and 2147483647, inclusive",
            ));
        }
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        errs.extend(invalid_each(
            &path.child("nodeName"),
            node,
            dns1123_subdomain_errors(node),
        ));
    }
    if let Some(sel) = spec.node_selector.as_ref() {
        errs.extend(validate_labels(sel, &path.child("nodeSelector")));
    }
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        errs.extend(validate_toleration(t, &path.child("tolerations").index(i)));
    }
    if let Some(sa) = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        errs.extend(invalid_each(
            &path.child("serviceAccountName"),
            sa,
            dns1123_subdomain_errors(sa),
        ));
    }
    errs
}

/// With hostNetwork a container port is a host port: the two must agree.
fn host_network_ports(spec: &PodSpec, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    for (list, containers) in [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("containers", spec.containers.as_slice()),
    ] {
        for (i, c) in containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                if let Some(h) = p.host_port.filter(|h| *h != p.container_port) {
                    errs.push(FieldError::invalid_number(
                        path.child(list)
                            .index(i)
                            .child("ports")
                            .index(j)
                            .child("hostPort"),
                        h.into(),
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    errs
}

fn validate_container(
    c: &Container,
    path: &FieldPath,
    names: &mut BTreeSet<String>,
    volumes: &BTreeSet<&str>,
) -> Vec<FieldError> {
    let mut errs = vec![];
    let name_path = path.child("name");
    if c.name.is_empty() {
        errs.push(FieldError::required(&name_path));
    } else {
        errs.extend(invalid_each(
            &name_path,
            &c.name,
            dns1123_label_errors(&c.name),
        ));
        if !names.insert(c.name.clone()) {
            errs.push(FieldError::duplicate(&name_path, &c.name));
        }
    }
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        errs.push(FieldError::required(path.child("image")));
    }
    if let Some(p) = c.image_pull_policy.as_deref() {
        if !PULL_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("imagePullPolicy"),
                p,
                PULL_POLICIES,
            ));
        }
    }
    let mut port_names = BTreeSet::new();
    for (i, p) in c.ports.iter().flatten().enumerate() {
        let pp = path.child("ports").index(i);
        if !(1..=65535).contains(&p.container_port) {
            errs.push(FieldError::invalid_number(
                pp.child("containerPort"),
                p.container_port.into(),
                PORT_RANGE_MSG,
            ));
        }
        if let Some(h) = p.host_port.filter(|h| *h != 0) {
            if !(1..=65535).contains(&h) {
                errs.push(FieldError::invalid_number(
                    pp.child("hostPort"),
                    h.into(),
                    PORT_RANGE_MSG,
                ));
            }
        }
        if let Some(proto) = p.protocol.as_deref() {
            if !PROTOCOLS.contains(&proto) {
                errs.push(FieldError::not_supported(
                    pp.child("protocol"),
                    proto,
                    PROTOCOLS,
                ));
            }
        }
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            errs.extend(invalid_each(&pp.child("name"), n, port_name_errors(n)));
            if !port_names.insert(n) {
                errs.push(FieldError::duplicate(pp.child("name"), n));
            }
        }
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        let ep = path.child("env").index(i).child("name");
        if e.name.is_empty() {
            errs.push(FieldError::required(&ep));
        } else if e.name.contains('=') || !e.name.bytes().all(|b| (32..127).contains(&b)) {
            errs.push(FieldError::invalid(
                &ep,
                &e.name,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ));
        }
    }
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = path.child("volumeMounts").index(i);
        if m.name.is_empty() {
            errs.push(FieldError::required(mp.child("name")));
        } else if !volumes.contains(m.name.as_str()) {
            errs.push(FieldError::not_found(mp.child("name"), &m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(mp.child("mountPath")));
        }
    }
    if let Some(r) = c.resources.as_ref() {
        errs.extend(validate_resources(r, &path.child("resources")));
    }
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            errs.extend(validate_probe(p, &path.child(field)));
        }
    }
    errs
}

fn validate_probe(p: &Probe, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    for (field, value, min) in [
        ("periodSeconds", p.period_seconds, 1),
        ("timeoutSeconds", p.timeout_seconds, 1),
        ("successThreshold", p.success_threshold, 1),
        ("failureThreshold", p.failure_threshold, 1),
        ("initialDelaySeconds", p.initial_delay_seconds, 0),
    ] {
        if let Some(v) = value.filter(|v| *v < min) {
            errs.push(FieldError::invalid_number(
                path.child(field),
                v.into(),
                &format!("must be greater than or equal to {min}"),
            ));
        }
    }
    let handlers = [
        p.exec.is_some(),
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.grpc.is_some(),
    ]
    .into_iter()
    .filter(|h| *h)
    .count();
    if handlers == 0 {
        errs.push(FieldError::new(
            CauseType::Required,
            path,
            "Required value: must specify a handler type",
        ));
    } else if handlers > 1 {
        errs.push(FieldError::forbidden(
            path,
            "may not specify more than 1 handler type",
        ));
    }
    let port_errs = |port: &IntOrString, p: FieldPath| match port {
        IntOrString::Int(n) if !(1..=65535).contains(n) => {
            vec![FieldError::invalid_number(p, (*n).into(), PORT_RANGE_MSG)]
        }
        IntOrString::String(s) => invalid_each(&p, s, port_name_errors(s)),
        _ => vec![],
    };
    if let Some(h) = &p.http_get {
        errs.extend(port_errs(&h.port, path.child("httpGet").child("port")));
    }
    if let Some(t) = &p.tcp_socket {
        errs.extend(port_errs(&t.port, path.child("tcpSocket").child("port")));
    }
    errs
}

fn validate_resources(r: &ResourceRequirements, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut parsed = |field: &str,
                      list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        let mut out = std::collections::BTreeMap::new();
        for (k, q) in list.into_iter().flatten() {
            let p = path.child(field).key(k);
            errs.extend(invalid_each(&p, k, qualified_name_errors(k)));
            errs.extend(container_resource_name_errors(k, &p));
            match Quantity::parse(&q.0) {
                Ok(v) if v.nano_value() < 0 => errs.push(FieldError::invalid(
                    &p,
                    &q.0,
                    "must be greater than or equal to 0",
                )),
                Ok(v) => {
                    out.insert(k.clone(), v);
                }
                Err(e) => errs.push(FieldError::invalid(&p, &q.0, &e.to_string())),
            }
        }
        out
    };
    let limits = parsed("limits", r.limits.as_ref());
    let requests = parsed("requests", r.requests.as_ref());
    for (k, req) in &requests {
        if let Some(lim) = limits.get(k) {
            if req > lim {
                errs.push(FieldError::invalid(
                    path.child("requests"),
                    req,
                    &format!("must be less than or equal to {k} limit of {lim}"),
                ));
            }
        }
    }
    errs
}

/// Kubernetes' standard resource names (quota names included), for unqualified names.
const STANDARD_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "persistentvolumeclaims",
    "configmaps",
    "storage",
    "requests.storage",
    "services.nodeports",
    "services.loadbalancers",
];

/// A container's resources are cpu, memory, ephemeral-storage, hugepages-<size>, or a
/// qualified (extended) name (Kubernetes' validateContainerResourceName).
fn container_resource_name_errors(name: &str, path: &FieldPath) -> Vec<FieldError> {
    if name.contains('/') {
        return vec![];
    }
    let huge = name.starts_with("hugepages-");
    let mut errs = vec![];
    if !huge && !STANDARD_RESOURCES.contains(&name) {
        errs.push(FieldError::invalid(
            path,
            name,
            "must be a standard resource type or fully qualified",
        ));
    }
    if !huge && !["cpu", "memory", "ephemeral-storage"].contains(&name) {
        errs.push(FieldError::invalid(
            path,
            name,
            "must be a standard resource for containers",
        ));
    }
    errs
}

pub fn validate_toleration(t: &Toleration, path: &FieldPath) -> Vec<FieldError> {
    let mut errs = vec![];
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() {
        errs.extend(invalid_each(
            &path.child("key"),
            key,
            qualified_name_errors(key),
        ));
    }
    let op = t.operator.as_deref().unwrap_or("Equal");
    if !TOLERATION_OPERATORS.contains(&op) {
        errs.push(FieldError::not_supported(
            path.child("operator"),
            op,
            TOLERATION_OPERATORS,
        ));
    }
    if key.is_empty() && op != "Exists" {
        errs.push(FieldError::invalid(
            path.child("operator"),
            op,
            "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
        ));
    }
    if op == "Exists" && !t.value.as_deref().unwrap_or("").is_empty() {
        errs.push(FieldError::invalid(
            path.child("operator"),
            t.value.as_deref().unwrap_or(""),
            "value must be empty when `operator` is 'Exists'",
        ));
    }
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
        errs.push(FieldError::not_supported(
            path.child("effect"),
            effect,
            TAINT_EFFECTS,
        ));
    }
    if t.toleration_seconds.is_some() && effect != "NoExecute" {
        errs.push(FieldError::invalid(
            path.child("effect"),
            effect,
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ));
    }
    errs
}

/// A pod template: its labels and spec, with the restart policies its owner allows.
pub fn validate_template(
    t: &PodTemplateSpec,
    path: &FieldPath,
    restart_policies: &[&str],
) -> Vec<FieldError> {
    let mut errs = vec![];
    if let Some(labels) = t.metadata.as_ref().and_then(|m| m.labels.as_ref()) {
        errs.extend(validate_labels(
            labels,
            &path.child("metadata").child("labels"),
        ));
    }
    match t.spec.as_ref() {
        None => errs.push(FieldError::required(path.child("spec"))),
        Some(spec) => {
            let sp = path.child("spec");
            errs.extend(validate_pod_spec(spec, &sp));
            let policy = spec.restart_policy.as_deref().unwrap_or("Always");
            if !restart_policies.contains(&policy) {
                errs.push(FieldError::not_supported(
                    sp.child("restartPolicy"),
                    policy,
                    restart_policies,
                ));
            }
        }
    }
    errs
}

pub fn validate(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    validate_typed(new, old, |new: &Pod, old: Option<&Pod>| {
        let mut errs = meta_errors(
            &new.metadata,
            old.map(|o| &o.metadata),
            Scope::Namespaced,
            NameRule::Dns1123Subdomain,
        );
        let spec_path = FieldPath::new("spec");
        match new.spec.as_ref() {
            None => errs.push(FieldError::required(&spec_path)),
            Some(spec) => errs.extend(validate_pod_spec(spec, &spec_path)),
        }
        if let (Some(new_spec), Some(old_spec)) =
            (new.spec.as_ref(), old.and_then(|o| o.spec.as_ref()))
        {
            errs.extend(validate_spec_update(new_spec, old_spec));
        }
        errs
    })
}

/// Fields an ephemeral container may not set (Kubernetes' validateEphemeralContainers).
const EPHEMERAL_FORBIDDEN: &[&str] = &[
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// An update through `pods/ephemeralcontainers` (Kubernetes'
/// ValidatePodEphemeralContainersUpdate): ephemeral containers are only added, never changed
/// or removed; each is a valid container without ports, probes, lifecycle or resources,
/// named uniquely in the pod, and its target is one of the pod's containers.
pub fn validate_ephemeral_update(new: &Value, old: &Value) -> Vec<FieldError> {
    validate_typed(new, Some(old), |new: &Pod, old: Option<&Pod>| {
        let mut errs = vec![];
        let path = FieldPath::new("spec").child("ephemeralContainers");
        let (Some(spec), Some(old_spec)) = (new.spec.as_ref(), old.and_then(|o| o.spec.as_ref()))
        else {
            return vec![FieldError::required("spec")];
        };
        let now = spec.ephemeral_containers.as_deref().unwrap_or(&[]);
        for o in old_spec.ephemeral_containers.iter().flatten() {
            match now.iter().position(|e| e.name == o.name) {
                None => errs.push(FieldError::forbidden(
                    &path,
                    &format!(
                        "existing ephemeral containers {:?} may not be removed",
                        o.name
                    ),
                )),
                Some(i) if now[i] != *o => errs.push(FieldError::forbidden(
                    path.index(i),
                    &format!(
                        "existing ephemeral containers {:?} may not be changed",
                        o.name
                    ),
                )),
                Some(_) => {}
            }
        }
        let volumes: BTreeSet<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        let mut names: BTreeSet<String> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| c.name.clone())
            .collect();
        for (i, e) in now.iter().enumerate() {
            let p = path.index(i);
            if old_spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|o| o == e)
            {
                names.insert(e.name.clone());
                continue;
            }
            let raw = serde_json::to_value(e).unwrap_or_default();
            for f in EPHEMERAL_FORBIDDEN {
                if raw
                    .get(*f)
                    .is_some_and(|v| !v.is_null() && v != &Value::Object(Default::default()))
                {
                    errs.push(FieldError::forbidden(
                        p.child(f),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
            if let Some(c) = as_container(e) {
                errs.extend(validate_container(&c, &p, &mut names, &volumes));
            }
            if let Some(t) = e.target_container_name.as_deref() {
                let known = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(|c| c.name == t);
                if !known {
                    errs.push(FieldError::not_found(p.child("targetContainerName"), t));
                }
            }
        }
        errs
    })
}

const POD_UPDATE_MSG: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Kubernetes' `ValidatePodUpdate`: everything in the spec is fixed except container images,
/// activeDeadlineSeconds (set, or lowered), added tolerations and removed scheduling gates.
fn validate_spec_update(new: &PodSpec, old: &PodSpec) -> Vec<FieldError> {
    let mut errs = vec![];
    let path = FieldPath::new("spec");
    if let (Some(o), n) = (old.active_deadline_seconds, new.active_deadline_seconds) {
        if n.is_none_or(|n| n > o) {
            errs.push(FieldError::invalid(
                path.child("activeDeadlineSeconds"),
                n.map_or("nil".into(), |n| n.to_string()),
                "must be less than or equal to previous value",
            ));
        }
    }
    let old_tolerations = old.tolerations.clone().unwrap_or_default();
    let new_tolerations = new.tolerations.clone().unwrap_or_default();
    for t in &old_tolerations {
        if !new_tolerations.contains(t) {
            errs.push(FieldError::forbidden(
                path.child("tolerations"),
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            break;
        }
    }
    // Mask what may change, then the rest must be equal.
    let mut masked = new.clone();
    for (m, o) in masked.containers.iter_mut().zip(old.containers.iter()) {
        m.image = o.image.clone();
    }
    for (m, o) in masked
        .init_containers
        .iter_mut()
        .flatten()
        .zip(old.init_containers.iter().flatten())
    {
        m.image = o.image.clone();
    }
    masked.active_deadline_seconds = old.active_deadline_seconds;
    // Ephemeral containers change only through their subresource, which keeps the rest.
    masked.ephemeral_containers = old.ephemeral_containers.clone();
    masked.tolerations = old.tolerations.clone();
    if old.scheduling_gates.is_some()
        && new
            .scheduling_gates
            .as_ref()
            .is_none_or(|g| g.len() <= old.scheduling_gates.as_ref().map_or(0, Vec::len))
    {
        masked.scheduling_gates = old.scheduling_gates.clone();
    }
    if old.termination_grace_period_seconds.is_some_and(|s| s < 0)
        && new.termination_grace_period_seconds == Some(1)
    {
        masked.termination_grace_period_seconds = old.termination_grace_period_seconds;
    }
    if masked != *old {
        errs.push(FieldError::forbidden(&path, POD_UPDATE_MSG));
    }
    errs
}

// ---------------------------------------------------------------- table

pub fn columns() -> Vec<TableColumnDefinition> {
    use ColumnType::String as S;
    vec![
        TableColumnDefinition::name_column(),
        TableColumnDefinition::new("Ready", S, "The aggregate readiness state of this pod for accepting traffic."),
        TableColumnDefinition::new("Status", S, "The aggregate status of the containers in this pod."),
        TableColumnDefinition::new("Restarts", S, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
        TableColumnDefinition::age_column(),
        TableColumnDefinition::new("IP", S, "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.").wide(),
        TableColumnDefinition::new("Node", S, "NodeName indicates in which node this pod is scheduled.").wide(),
        TableColumnDefinition::new("Nominated Node", S, "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.").wide(),
        TableColumnDefinition::new("Readiness Gates", S, "If specified, all readiness gates will be evaluated for pod readiness.").wide(),
    ]
}

/// kubectl's `printPod`: READY, the computed STATUS (init progress, waiting and terminated
/// reasons, Completed vs Running, Terminating), RESTARTS with the last restart's age.
pub fn row(v: &Value, now: Timestamp) -> Vec<Value> {
    let Ok(pod) = decode::<Pod>(v) else {
        return super::common::default_row(v, now);
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let summary = summarize(&pod, &spec, &status);
    let restarts = match summary.last_restart {
        Some(t) if summary.restarts != 0 => {
            format!("{} ({} ago)", summary.restarts, duration::age(Some(t), now))
        }
        _ => summary.restarts.to_string(),
    };
    let or_none = |s: Option<String>| {
        s.filter(|s| !s.is_empty())
            .unwrap_or_else(|| "<none>".into())
    };
    let pod_ip = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .map(|ip| ip.ip.clone())
        .or(status.pod_ip.clone());
    let readiness_gates = match spec.readiness_gates.as_deref() {
        None | Some([]) => "<none>".to_string(),
        Some(gates) => {
            let conditions = status.conditions.as_deref().unwrap_or(&[]);
            let ready = gates
                .iter()
                .filter(|g| {
                    conditions
                        .iter()
                        .find(|c| c.type_ == g.condition_type)
                        .is_some_and(|c| c.status == "True")
                })
                .count();
            format!("{ready}/{}", gates.len())
        }
    };
    vec![
        name_cell(&pod.metadata),
        Value::from(format!("{}/{}", summary.ready, summary.total)),
        Value::from(summary.reason),
        Value::from(restarts),
        age_cell(&pod.metadata, now),
        Value::from(or_none(pod_ip)),
        Value::from(or_none(spec.node_name.clone())),
        Value::from(or_none(status.nominated_node_name.clone())),
        Value::from(readiness_gates),
    ]
}

struct Summary {
    ready: usize,
    total: usize,
    reason: String,
    restarts: i64,
    last_restart: Option<Timestamp>,
}

fn is_restartable_init(c: Option<&Container>) -> bool {
    c.and_then(|c| c.restart_policy.as_deref()) == Some("Always")
}

fn summarize(pod: &Pod, spec: &PodSpec, status: &PodStatus) -> Summary {
    let init_specs = spec.init_containers.as_deref().unwrap_or(&[]);
    let total = spec.containers.len()
        + init_specs
            .iter()
            .filter(|c| is_restartable_init(Some(c)))
            .count();
    let phase = status.phase.clone().unwrap_or_default();
    let mut reason = status
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| phase.clone());
    let conditions = status.conditions.as_deref().unwrap_or(&[]);
    if conditions
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"))
    {
        reason = "SchedulingGated".into();
    }
    let mut ready = 0;
    let mut restarts = 0i64;
    let mut sidecar_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_sidecar_restart: Option<Timestamp> = None;
    let later = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut initializing = false;
    for (i, c) in status.init_container_statuses.iter().flatten().enumerate() {
        let spec_c = init_specs.iter().find(|s| s.name == c.name);
        restarts += i64::from(c.restart_count);
        let finished = c
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0);
        last_restart = later(last_restart, finished);
        if is_restartable_init(spec_c) {
            sidecar_restarts += i64::from(c.restart_count);
            last_sidecar_restart = later(last_sidecar_restart, finished);
        }
        let state = c.state.clone().unwrap_or_default();
        if state.terminated.as_ref().is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if is_restartable_init(spec_c) && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = state.terminated.as_ref() {
            reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if t.signal.unwrap_or(0) != 0 => {
                    format!("Init:Signal:{}", t.signal.unwrap_or(0))
                }
                None => format!("Init:ExitCode:{}", t.exit_code),
            };
        } else if let Some(r) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }
    let initialized = conditions
        .iter()
        .any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for c in status.container_statuses.iter().flatten().rev() {
            restarts += i64::from(c.restart_count);
            let finished = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.finished_at.as_ref())
                .map(|t| t.0);
            last_restart = later(last_restart, finished);
            let state = c.state.clone().unwrap_or_default();
            let waiting = state
                .waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty());
            if let Some(w) = waiting {
                reason = w;
            } else if let Some(t) = state.terminated.as_ref() {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None if t.signal.unwrap_or(0) != 0 => {
                        format!("Signal:{}", t.signal.unwrap_or(0))
                    }
                    None => format!("ExitCode:{}", t.exit_code),
                };
            } else if c.ready && state.running.is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }
    Summary {
        ready,
        total,
        reason,
        restarts,
        last_restart,
    }
}

// ---------------------------------------------------------------- field selectors

pub fn field(v: &Value, field: &str) -> Option<String> {
    let pointer = match field {
        "spec.nodeName" => "/spec/nodeName",
        "spec.restartPolicy" => "/spec/restartPolicy",
        "spec.schedulerName" => "/spec/schedulerName",
        "spec.serviceAccountName" => "/spec/serviceAccountName",
        "spec.hostNetwork" => {
            return Some(
                v.pointer("/spec/hostNetwork")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .to_string(),
            )
        }
        "status.phase" => "/status/phase",
        "status.podIP" => "/status/podIP",
        "status.nominatedNodeName" => "/status/nominatedNodeName",
        _ => return meta_field(v, field),
    };
    Some(scalar_at(v, pointer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2025-01-01T12:00:00Z".parse().unwrap()
    }

    fn pod(spec: Value, status: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": "2025-01-01T11:55:00Z"},
               "spec": spec, "status": status})
    }

    fn one_container() -> Value {
        json!({"containers": [{"name": "web", "image": "nginx:1.27"}]})
    }

    #[test]
    fn pull_policy_follows_the_tag() {
        assert_eq!(default_pull_policy("nginx"), "Always");
        assert_eq!(default_pull_policy("nginx:latest"), "Always");
        assert_eq!(default_pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(default_pull_policy("127.0.0.1:5000/skiff/echo"), "Always");
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/skiff/echo:v1"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("nginx@sha256:abcd"), "IfNotPresent");
    }

    #[test]
    fn pod_defaults_like_kubernetes() {
        let mut v = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "web", "image": "nginx",
                "ports": [{"containerPort": 80}],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                "livenessProbe": {"httpGet": {"port": 80}},
                "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}],
                "volumes": [{"name": "scratch"}, {"name": "cfg", "configMap": {"name": "c"}}]}});
        default(&mut v);
        let spec = &v["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["dnsPolicy"], "ClusterFirst");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["enableServiceLinks"], true);
        assert!(spec.get("priority").is_none(), "the Priority plugin's");
        let c = &spec["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "500m", "memory": "64Mi"})
        );
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
                   "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
        assert_eq!(spec["volumes"][0]["emptyDir"], json!({}));
        assert_eq!(spec["volumes"][1]["configMap"]["defaultMode"], 420);
        assert_eq!(
            spec["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ])
        );
        assert_eq!(
            v["status"],
            json!({"phase": "Pending", "qosClass": "Guaranteed"})
        );
    }

    #[test]
    fn own_tolerations_win() {
        let mut t = vec![Toleration {
            key: Some(NOT_READY_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(5),
            value: None,
        }];
        add_default_tolerations(&mut t);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].toleration_seconds, Some(5));
        let mut all = vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        add_default_tolerations(&mut all);
        assert_eq!(all.len(), 1, "a wildcard toleration tolerates both");
    }

    #[test]
    fn qos_classes() {
        let spec = |resources: Value| -> PodSpec {
            serde_json::from_value(json!({"containers": [{"name": "c", "resources": resources}]}))
                .unwrap()
        };
        assert_eq!(qos_class(&spec(json!({}))), "BestEffort");
        assert_eq!(
            qos_class(&spec(json!({"requests": {"cpu": "1"}}))),
            "Burstable"
        );
        assert_eq!(
            qos_class(&spec(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&spec(
                json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}})
            )),
            "Burstable"
        );
    }

    fn errors(v: &Value, old: Option<&Value>) -> Vec<String> {
        validate(v, old)
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn ephemeral_containers_are_only_added() {
        let old = pod(one_container(), json!({}));
        let with = |eph: Value| {
            let mut v = old.clone();
            v["spec"]["ephemeralContainers"] = eph;
            v
        };
        let debugger = json!({"name": "debugger", "image": "busybox", "targetContainerName": "web",
                              "resources": {}, "terminationMessagePolicy": "File"});
        let added = with(json!([debugger]));
        assert!(validate_ephemeral_update(&added, &old).is_empty());
        let msgs = |new: &Value, old: &Value| -> Vec<String> {
            validate_ephemeral_update(new, old)
                .into_iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect()
        };
        assert_eq!(
            msgs(&old, &added),
            vec!["spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be removed"]
        );
        let mut changed = debugger.clone();
        changed["image"] = json!("other");
        assert_eq!(
            msgs(&with(json!([changed])), &added),
            vec!["spec.ephemeralContainers[0]: Forbidden: existing ephemeral containers \"debugger\" may not be changed"]
        );
        let bad = json!({"name": "web", "image": "busybox", "targetContainerName": "nope",
                         "ports": [{"containerPort": 80}]});
        assert_eq!(
            msgs(&with(json!([bad])), &old),
            vec![
                "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].name: Duplicate value: \"web\"",
                "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
            ]
        );
        // Main-resource updates leave them to the subresource.
        assert!(errors(&added, Some(&old)).is_empty());
    }

    #[test]
    fn host_network_ports_and_resource_names_as_kubernetes() {
        let v = pod(
            json!({"hostNetwork": true, "containers": [{"name": "web", "image": "i",
                   "ports": [{"containerPort": 80, "hostPort": 81}, {"containerPort": 82}]}]}),
            json!({}),
        );
        assert_eq!(
            errors(&v, None),
            vec!["spec.containers[0].ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true"]
        );
        let v = pod(
            json!({"containers": [{"name": "web", "image": "i",
                   "resources": {"limits": {"foo": "1", "pods": "1", "hugepages-2Mi": "2Mi", "example.com/gpu": "1"}}}]}),
            json!({}),
        );
        assert_eq!(
            errors(&v, None),
            vec![
                "spec.containers[0].resources.limits[foo]: Invalid value: \"foo\": must be a standard resource type or fully qualified",
                "spec.containers[0].resources.limits[foo]: Invalid value: \"foo\": must be a standard resource for containers",
                "spec.containers[0].resources.limits[pods]: Invalid value: \"pods\": must be a standard resource for containers",
            ]
        );
    }

    #[test]
    fn spec_validation_messages() {
        assert!(errors(&pod(one_container(), json!({})), None).is_empty());
        let bad = pod(
            json!({"restartPolicy": "Sometimes",
                   "containers": [
                       {"name": "web", "image": "", "ports": [{"containerPort": 0}, {"containerPort": 80, "protocol": "HTTP"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}},
                       {"name": "web", "image": "x", "imagePullPolicy": "Sometimes"}]}),
            json!({}),
        );
        let errs = errors(&bad, None);
        let expected = [
            "spec.containers[0].image: Required value",
            "spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.containers[0].ports[1].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "spec.containers[0].volumeMounts[0].name: Not found: \"data\"",
            "spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            "spec.containers[1].name: Duplicate value: \"web\"",
            "spec.containers[1].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\", \"OnFailure\"",
        ];
        for e in expected {
            assert!(errs.iter().any(|x| x == e), "missing {e:?} in {errs:#?}");
        }
        assert_eq!(errs.len(), expected.len(), "{errs:#?}");
        assert_eq!(
            errors(&pod(json!({"containers": []}), json!({})), None),
            vec!["spec.containers: Required value"]
        );
    }

    #[test]
    fn pods_are_mostly_immutable() {
        let mut old = pod(one_container(), json!({}));
        default(&mut old);
        let mut image = old.clone();
        image["spec"]["containers"][0]["image"] = json!("nginx:1.28");
        assert!(errors(&image, Some(&old)).is_empty());
        let mut more_tolerations = old.clone();
        more_tolerations["spec"]["tolerations"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "k", "operator": "Exists"}));
        assert!(errors(&more_tolerations, Some(&old)).is_empty());
        let mut fewer = old.clone();
        fewer["spec"]["tolerations"] = json!([]);
        assert_eq!(errors(&fewer, Some(&old))[0], "spec.tolerations: Forbidden: existing toleration can not be modified except its tolerationSeconds");
        let mut restart = old.clone();
        restart["spec"]["restartPolicy"] = json!("Never");
        let errs = errors(&restart, Some(&old));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"));
        let mut deadline = old.clone();
        deadline["spec"]["activeDeadlineSeconds"] = json!(30);
        assert!(errors(&deadline, Some(&old)).is_empty());
        let mut longer = deadline.clone();
        longer["spec"]["activeDeadlineSeconds"] = json!(60);
        assert_eq!(errors(&longer, Some(&deadline)), vec!["spec.activeDeadlineSeconds: Invalid value: \"60\": must be less than or equal to previous value"]);
        let mut renamed = old.clone();
        renamed["metadata"]["name"] = json!("other");
        assert_eq!(
            errors(&renamed, Some(&old)),
            vec!["metadata.name: Invalid value: \"other\": field is immutable"]
        );
    }

    fn status_of(spec: Value, status: Value) -> (String, String, String) {
        let cells = row(&pod(spec, status), now());
        (
            cells[1].as_str().unwrap().to_string(),
            cells[2].as_str().unwrap().to_string(),
            cells[3].as_str().unwrap().to_string(),
        )
    }

    fn s(a: &str, b: &str, c: &str) -> (String, String, String) {
        (a.into(), b.into(), c.into())
    }

    // Each case is what kubectl 1.33 prints for a pod in that state.
    #[test]
    fn status_column_like_kubectl() {
        let c = one_container;
        assert_eq!(
            status_of(c(), json!({"phase": "Pending"})),
            s("0/1", "Pending", "0")
        );
        assert_eq!(
            status_of(
                c(),
                json!({"phase": "Pending", "containerStatuses": [{"name": "web", "image": "nginx:1.27", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]})
            ),
            s("0/1", "ContainerCreating", "0")
        );
        assert_eq!(
            status_of(
                c(),
                json!({"phase": "Running", "containerStatuses": [{"name": "web", "image": "nginx:1.27", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2025-01-01T11:56:00Z"}}}]})
            ),
            s("1/1", "Running", "0")
        );
        assert_eq!(
            status_of(
                c(),
                json!({"phase": "Running", "containerStatuses": [{"name": "web", "image": "nginx:1.27", "imageID": "", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2025-01-01T11:58:00Z"}}}]})
            ),
            s("0/1", "CrashLoopBackOff", "3 (2m ago)")
        );
        for reason in ["ImagePullBackOff", "ErrImagePull"] {
            assert_eq!(
                status_of(
                    c(),
                    json!({"phase": "Pending", "containerStatuses": [{"name": "web", "image": "nope", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": reason}}}]})
                ),
                s("0/1", reason, "0")
            );
        }
        assert_eq!(
            status_of(
                c(),
                json!({"phase": "Succeeded", "containerStatuses": [{"name": "web", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]})
            ),
            s("0/1", "Completed", "0")
        );
        assert_eq!(
            status_of(
                c(),
                json!({"phase": "Failed", "containerStatuses": [{"name": "web", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137}}}]})
            ),
            s("0/1", "ExitCode:137", "0")
        );
        let with_init = json!({"initContainers": [{"name": "init", "image": "busybox"}], "containers": [{"name": "web", "image": "nginx"}]});
        assert_eq!(
            status_of(
                with_init.clone(),
                json!({"phase": "Pending", "initContainerStatuses": [{"name": "init", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"running": {}}}]})
            ),
            s("0/1", "Init:0/1", "0")
        );
        assert_eq!(
            status_of(
                with_init.clone(),
                json!({"phase": "Pending", "initContainerStatuses": [{"name": "init", "image": "busybox", "imageID": "", "ready": false, "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})
            ),
            s("0/1", "Init:CrashLoopBackOff", "2")
        );
        assert_eq!(
            status_of(
                with_init,
                json!({"phase": "Pending", "initContainerStatuses": [{"name": "init", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
            ),
            s("0/1", "Init:Error", "0")
        );
        let mut terminating = pod(c(), json!({"phase": "Running"}));
        terminating["metadata"]["deletionTimestamp"] = json!("2025-01-01T11:59:30Z");
        assert_eq!(row(&terminating, now())[2], "Terminating");
    }

    #[test]
    fn wide_columns_and_fields() {
        let mut v = pod(
            json!({"nodeName": "node-1", "containers": [{"name": "web", "image": "nginx"}],
                   "readinessGates": [{"conditionType": "example.com/ready"}]}),
            json!({"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
                   "conditions": [{"type": "example.com/ready", "status": "True"}]}),
        );
        let cells = row(&v, now());
        assert_eq!(cells[0], "web-1");
        assert_eq!(cells[4], "5m");
        assert_eq!(
            &cells[5..],
            &[
                json!("10.244.1.5"),
                json!("node-1"),
                json!("<none>"),
                json!("1/1")
            ]
        );
        assert_eq!(field(&v, "spec.nodeName").as_deref(), Some("node-1"));
        assert_eq!(field(&v, "status.phase").as_deref(), Some("Running"));
        assert_eq!(field(&v, "status.podIP").as_deref(), Some("10.244.1.5"));
        assert_eq!(field(&v, "spec.hostNetwork").as_deref(), Some("false"));
        assert_eq!(field(&v, "metadata.namespace").as_deref(), Some("default"));
        assert_eq!(field(&v, "spec.containers"), None);
        v["spec"].as_object_mut().unwrap().remove("nodeName");
        assert_eq!(field(&v, "spec.nodeName").as_deref(), Some(""));
        assert_eq!(row(&v, now())[6], "<none>");
    }

    proptest! {
        // Defaulting any combination of optional fields is idempotent and leaves a valid pod valid.
        #[test]
        fn defaulting_is_idempotent(image in prop_oneof![Just("nginx"), Just("nginx:1.27"), Just("r:5000/a@sha256:1")],
                                    policy in proptest::option::of(prop_oneof![Just("Always"), Just("Never")]),
                                    ports in proptest::collection::vec(1..65535i32, 0..3),
                                    host_network in any::<bool>()) {
            let mut ports: Vec<i32> = ports;
            ports.sort();
            ports.dedup();
            let mut v = pod(json!({"hostNetwork": host_network, "containers": [{"name": "c", "image": image,
                "ports": ports.iter().map(|p| json!({"containerPort": p})).collect::<Vec<_>>()}]}), json!({}));
            if let Some(p) = policy {
                v["spec"]["restartPolicy"] = json!(p);
            }
            default(&mut v);
            let once = v.clone();
            default(&mut v);
            prop_assert_eq!(&v, &once);
            prop_assert!(validate(&v, None).is_empty(), "{:?}", validate(&v, None));
        }
    }
}
