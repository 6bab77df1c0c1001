//! The Pod Security Standards' checks (k8s.io/pod-security-admission/policy), each a pure
//! function of a pod spec: which level it belongs to, the reason Kubernetes gives when it
//! fails and the detail naming the containers, volumes or fields at fault. Run in the order
//! of their ids, as Kubernetes does, so that messages read the same.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Capabilities, PodSpec, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Pod Security Standards level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// One failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub reason: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.detail.as_str() {
            "" => f.write_str(self.reason),
            d => write!(f, "{} ({d})", self.reason),
        }
    }
}

/// What a check looks at.
pub struct Subject<'a> {
    pub meta: &'a ObjectMeta,
    pub spec: &'a PodSpec,
}

type Check = fn(&Subject<'_>) -> Option<Violation>;

/// Every check, by id, with its level; a restricted check that replaces a baseline one lists
/// the one it replaces.
const CHECKS: &[(&str, Level, Check, Option<&str>)] = &[
    (
        "allowPrivilegeEscalation",
        Level::Restricted,
        allow_privilege_escalation,
        None,
    ),
    ("appArmorProfile", Level::Baseline, app_armor, None),
    (
        "capabilities_baseline",
        Level::Baseline,
        capabilities_baseline,
        None,
    ),
    (
        "capabilities_restricted",
        Level::Restricted,
        capabilities_restricted,
        Some("capabilities_baseline"),
    ),
    ("hostNamespaces", Level::Baseline, host_namespaces, None),
    ("hostPathVolumes", Level::Baseline, host_path_volumes, None),
    ("hostPorts", Level::Baseline, host_ports, None),
    ("privileged", Level::Baseline, privileged, None),
    ("procMount", Level::Baseline, proc_mount, None),
    (
        "restrictedVolumes",
        Level::Restricted,
        restricted_volumes,
        Some("hostPathVolumes"),
    ),
    ("runAsNonRoot", Level::Restricted, run_as_non_root, None),
    ("runAsUser", Level::Restricted, run_as_user, None),
    ("seLinuxOptions", Level::Baseline, se_linux_options, None),
    (
        "seccompProfile_baseline",
        Level::Baseline,
        seccomp_baseline,
        None,
    ),
    (
        "seccompProfile_restricted",
        Level::Restricted,
        seccomp_restricted,
        Some("seccompProfile_baseline"),
    ),
    ("sysctls", Level::Baseline, sysctls, None),
    (
        "windowsHostProcess",
        Level::Baseline,
        windows_host_process,
        None,
    ),
];

/// Every violation of `level` by the pod, in Kubernetes' order.
pub fn evaluate(level: Level, subject: &Subject<'_>) -> Vec<Violation> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let overridden: BTreeSet<&str> = CHECKS
        .iter()
        .filter(|(_, l, _, _)| *l <= level)
        .filter_map(|(_, _, _, o)| *o)
        .collect();
    let overridden = &overridden;
    // Baseline checks first, then restricted ones, each by id: Kubernetes' order.
    [Level::Baseline, Level::Restricted]
        .into_iter()
        .filter(|l| *l <= level)
        .flat_map(|l| {
            CHECKS
                .iter()
                .filter(move |(id, cl, _, _)| *cl == l && !overridden.contains(id))
        })
        .filter_map(|(_, _, check, _)| check(subject))
        .collect()
}

/// `violates PodSecurity "restricted:latest": a (x), b (y)`
pub fn message(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------- helpers

struct Named<'a> {
    name: &'a str,
    sc: Option<&'a SecurityContext>,
    ports: Vec<i32>,
}

/// Init containers, containers, ephemeral containers, in that order (visitContainers).
fn containers<'a>(spec: &'a PodSpec) -> Vec<Named<'a>> {
    let mut out = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        out.push(Named {
            name: &c.name,
            sc: c.security_context.as_ref(),
            ports: c
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.host_port)
                .collect(),
        });
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        out.push(Named {
            name: &c.name,
            sc: c.security_context.as_ref(),
            ports: c
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.host_port)
                .collect(),
        });
    }
    out
}

fn pluralize<'a>(one: &'a str, many: &'a str, n: usize) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    items
        .iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn violation(reason: &'static str, details: Vec<String>) -> Option<Violation> {
    (!details.is_empty()).then(|| Violation {
        reason,
        detail: details.join("; "),
    })
}

/// `container "a"` / `containers "a", "b"`
fn which_containers(names: &[&str]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

// ---------------------------------------------------------------- baseline

fn host_namespaces(s: &Subject<'_>) -> Option<Violation> {
    let mut set = Vec::new();
    if s.spec.host_network == Some(true) {
        set.push("hostNetwork=true".to_string());
    }
    if s.spec.host_pid == Some(true) {
        set.push("hostPID=true".to_string());
    }
    if s.spec.host_ipc == Some(true) {
        set.push("hostIPC=true".to_string());
    }
    (!set.is_empty()).then(|| Violation {
        reason: "host namespaces",
        detail: set.join(", "),
    })
}

fn privileged(s: &Subject<'_>) -> Option<Violation> {
    let bad: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| c.sc.and_then(|sc| sc.privileged) == Some(true))
        .map(|c| c.name)
        .collect();
    violation(
        "privileged",
        (!bad.is_empty())
            .then(|| {
                format!(
                    "{} must not set securityContext.privileged=true",
                    which_containers(&bad)
                )
            })
            .into_iter()
            .collect(),
    )
}

/// The capabilities a baseline container may add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn added(sc: Option<&SecurityContext>) -> Vec<String> {
    sc.and_then(|sc| sc.capabilities.as_ref())
        .and_then(|c: &Capabilities| c.add.clone())
        .unwrap_or_default()
}

fn forbidden_adds(s: &Subject<'_>, allowed: &[&str]) -> (Vec<String>, BTreeSet<String>) {
    let mut bad = Vec::new();
    let mut caps = BTreeSet::new();
    for c in containers(s.spec) {
        let over: Vec<String> = added(c.sc)
            .into_iter()
            .filter(|a| !allowed.contains(&a.as_str()))
            .collect();
        if !over.is_empty() {
            bad.push(c.name.to_string());
            caps.extend(over);
        }
    }
    (bad, caps)
}

fn add_detail(bad: &[String], caps: &BTreeSet<String>) -> String {
    let names: Vec<&str> = bad.iter().map(String::as_str).collect();
    let caps: Vec<&String> = caps.iter().collect();
    format!(
        "{} must not include {} in securityContext.capabilities.add",
        which_containers(&names),
        join_quote(&caps)
    )
}

fn capabilities_baseline(s: &Subject<'_>) -> Option<Violation> {
    let (bad, caps) = forbidden_adds(s, BASELINE_CAPABILITIES);
    violation(
        "non-default capabilities",
        (!bad.is_empty())
            .then(|| add_detail(&bad, &caps))
            .into_iter()
            .collect(),
    )
}

fn host_path_volumes(s: &Subject<'_>) -> Option<Violation> {
    let bad: Vec<&str> = s
        .spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name.as_str())
        .collect();
    (!bad.is_empty()).then(|| Violation {
        reason: "hostPath volumes",
        detail: format!(
            "{} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad)
        ),
    })
}

fn host_ports(s: &Subject<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut ports = Vec::new();
    for c in containers(s.spec) {
        let used: Vec<i32> = c.ports.iter().copied().filter(|p| *p != 0).collect();
        if !used.is_empty() {
            bad.push(c.name);
            ports.extend(used.into_iter().map(|p| p.to_string()));
        }
    }
    (!bad.is_empty()).then(|| Violation {
        reason: "hostPort",
        detail: format!(
            "{} {} {} {}",
            which_containers(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    })
}

fn app_armor(s: &Subject<'_>) -> Option<Violation> {
    let ok = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    let mut bad = Vec::new();
    if let Some(t) = s
        .spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.app_armor_profile.as_ref())
        .map(|p| p.type_.as_str())
        .filter(|t| !ok(t))
    {
        bad.push(format!(
            "pod must not set securityContext.appArmorProfile.type to \"{t}\""
        ));
    }
    for c in containers(s.spec) {
        if let Some(t) =
            c.sc.and_then(|sc| sc.app_armor_profile.as_ref())
                .map(|p| p.type_.as_str())
                .filter(|t| !ok(t))
        {
            bad.push(format!(
                "container \"{}\" must not set securityContext.appArmorProfile.type to \"{t}\"",
                c.name
            ));
        }
    }
    for (k, v) in s.meta.annotations.iter().flatten() {
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/")
            && !(v == "runtime/default" || v.starts_with("localhost/"))
        {
            bad.push(format!("{k}=\"{v}\""));
        }
    }
    violation("forbidden AppArmor profile", bad)
}

fn se_linux_options(s: &Subject<'_>) -> Option<Violation> {
    const TYPES: &[&str] = &[
        "",
        "container_t",
        "container_init_t",
        "container_kvm_t",
        "container_engine_t",
    ];
    let mut bad = Vec::new();
    let mut check = |who: String, o: Option<&k8s_openapi::api::core::v1::SELinuxOptions>| {
        let Some(o) = o else { return };
        let mut why = Vec::new();
        if let Some(t) = o.type_.as_deref().filter(|t| !TYPES.contains(t)) {
            why.push(format!("type \"{t}\""));
        }
        if let Some(u) = o.user.as_deref().filter(|u| !u.is_empty()) {
            why.push(format!("user \"{u}\""));
        }
        if let Some(r) = o.role.as_deref().filter(|r| !r.is_empty()) {
            why.push(format!("role \"{r}\""));
        }
        if !why.is_empty() {
            bad.push(format!(
                "{who} set forbidden securityContext.seLinuxOptions: {}",
                why.join(", ")
            ));
        }
    };
    check(
        "pod".into(),
        s.spec
            .security_context
            .as_ref()
            .and_then(|sc| sc.se_linux_options.as_ref()),
    );
    for c in containers(s.spec) {
        check(
            format!("container \"{}\"", c.name),
            c.sc.and_then(|sc| sc.se_linux_options.as_ref()),
        );
    }
    violation("seLinuxOptions", bad)
}

fn proc_mount(s: &Subject<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut values = BTreeSet::new();
    for c in containers(s.spec) {
        if let Some(m) =
            c.sc.and_then(|sc| sc.proc_mount.as_deref())
                .filter(|m| *m != "Default")
        {
            bad.push(c.name);
            values.insert(m.to_string());
        }
    }
    let values: Vec<&String> = values.iter().collect();
    violation(
        "procMount",
        (!bad.is_empty())
            .then(|| {
                format!(
                    "{} must not set securityContext.procMount to {}",
                    which_containers(&bad),
                    join_quote(&values)
                )
            })
            .into_iter()
            .collect(),
    )
}

fn pod_seccomp<'a>(s: &Subject<'a>) -> Option<&'a str> {
    s.spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
}

fn container_seccomp<'a>(c: &Named<'a>) -> Option<&'a str> {
    c.sc.and_then(|sc| sc.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
}

fn seccomp_baseline(s: &Subject<'_>) -> Option<Violation> {
    let mut details = Vec::new();
    if pod_seccomp(s) == Some("Unconfined") {
        details.push(
            "pod must not set securityContext.seccompProfile.type to \"Unconfined\"".to_string(),
        );
    }
    let bad: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| container_seccomp(c) == Some("Unconfined"))
        .map(|c| c.name)
        .collect();
    if !bad.is_empty() {
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to \"Unconfined\"",
            which_containers(&bad)
        ));
    }
    violation("seccompProfile", details)
}

/// The sysctls Kubernetes considers safe (in every pod's own namespaces).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

fn sysctls(s: &Subject<'_>) -> Option<Violation> {
    let bad: Vec<String> = s
        .spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref())
        .into_iter()
        .flatten()
        .filter(|x| !SAFE_SYSCTLS.contains(&x.name.as_str()))
        .map(|x| x.name.clone())
        .collect();
    (!bad.is_empty()).then(|| Violation {
        reason: "forbidden sysctls",
        detail: bad.join(", "),
    })
}

fn windows_host_process(s: &Subject<'_>) -> Option<Violation> {
    let pod = s
        .spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.windows_options.as_ref())
        .and_then(|w| w.host_process)
        == Some(true);
    let bad: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| {
            c.sc.and_then(|sc| sc.windows_options.as_ref())
                .and_then(|w| w.host_process)
                == Some(true)
        })
        .map(|c| c.name)
        .collect();
    let who = match (pod, bad.is_empty()) {
        (false, true) => return None,
        (true, true) => "pod".to_string(),
        (false, false) => which_containers(&bad),
        (true, false) => format!("pod and {}", which_containers(&bad)),
    };
    Some(Violation {
        reason: "hostProcess",
        detail: format!("{who} must not set securityContext.windowsOptions.hostProcess=true"),
    })
}

// ---------------------------------------------------------------- restricted

fn allow_privilege_escalation(s: &Subject<'_>) -> Option<Violation> {
    let bad: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| c.sc.and_then(|sc| sc.allow_privilege_escalation) != Some(false))
        .map(|c| c.name)
        .collect();
    violation(
        "allowPrivilegeEscalation != false",
        (!bad.is_empty())
            .then(|| {
                format!(
                    "{} must set securityContext.allowPrivilegeEscalation=false",
                    which_containers(&bad)
                )
            })
            .into_iter()
            .collect(),
    )
}

fn capabilities_restricted(s: &Subject<'_>) -> Option<Violation> {
    let missing: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| {
            !c.sc
                .and_then(|sc| sc.capabilities.as_ref())
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|x| x == "ALL"))
        })
        .map(|c| c.name)
        .collect();
    let mut details = Vec::new();
    if !missing.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            which_containers(&missing)
        ));
    }
    let (bad, caps) = forbidden_adds(s, &["NET_BIND_SERVICE"]);
    if !bad.is_empty() {
        details.push(add_detail(&bad, &caps));
    }
    violation("unrestricted capabilities", details)
}

/// The volume sources a restricted pod may use.
fn volume_type(v: &k8s_openapi::api::core::v1::Volume) -> Option<&'static str> {
    // Every source but the allowed ones, by the name Kubernetes prints.
    let kinds: [(&'static str, bool); 22] = [
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("rbd", v.rbd.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("cinder", v.cinder.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("flocker", v.flocker.is_some()),
        ("fc", v.fc.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("image", v.image.is_some()),
    ];
    kinds.iter().find(|(_, set)| *set).map(|(k, _)| *k)
}

fn restricted_volumes(s: &Subject<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = BTreeSet::new();
    for v in s.spec.volumes.iter().flatten() {
        if let Some(t) = volume_type(v) {
            bad.push(v.name.as_str());
            types.insert(t);
        }
    }
    let types: Vec<&str> = types.into_iter().collect();
    (!bad.is_empty()).then(|| Violation {
        reason: "restricted volume types",
        detail: format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                types.len()
            ),
            join_quote(&types)
        ),
    })
}

fn run_as_non_root(s: &Subject<'_>) -> Option<Violation> {
    let pod = s
        .spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.run_as_non_root);
    let mut details = Vec::new();
    if pod == Some(false) {
        details.push("pod must not set securityContext.runAsNonRoot=false".to_string());
    }
    let cs = containers(s.spec);
    let explicit_false: Vec<&str> = cs
        .iter()
        .filter(|c| c.sc.and_then(|sc| sc.run_as_non_root) == Some(false))
        .map(|c| c.name)
        .collect();
    if !explicit_false.is_empty() {
        details.push(format!(
            "{} must not set securityContext.runAsNonRoot=false",
            which_containers(&explicit_false)
        ));
    }
    if pod != Some(true) {
        let unset: Vec<&str> = cs
            .iter()
            .filter(|c| c.sc.and_then(|sc| sc.run_as_non_root).is_none())
            .map(|c| c.name)
            .collect();
        if !unset.is_empty() {
            details.push(format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                which_containers(&unset)
            ));
        }
    }
    violation("runAsNonRoot != true", details)
}

fn run_as_user(s: &Subject<'_>) -> Option<Violation> {
    let mut details = Vec::new();
    if s.spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.run_as_user)
        == Some(0)
    {
        details.push("pod must not set runAsUser=0".to_string());
    }
    let bad: Vec<&str> = containers(s.spec)
        .iter()
        .filter(|c| c.sc.and_then(|sc| sc.run_as_user) == Some(0))
        .map(|c| c.name)
        .collect();
    if !bad.is_empty() {
        details.push(format!(
            "{} must not set runAsUser=0",
            which_containers(&bad)
        ));
    }
    violation("runAsUser=0", details)
}

fn seccomp_restricted(s: &Subject<'_>) -> Option<Violation> {
    let ok = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    let mut details = Vec::new();
    let pod = pod_seccomp(s);
    if let Some(t) = pod.filter(|t| !ok(t)) {
        details.push(format!(
            "pod must not set securityContext.seccompProfile.type to \"{t}\""
        ));
    }
    let cs = containers(s.spec);
    let mut bad = Vec::new();
    let mut bad_values = BTreeSet::new();
    let mut unset = Vec::new();
    for c in &cs {
        match container_seccomp(c) {
            Some(t) if !ok(t) => {
                bad.push(c.name);
                bad_values.insert(t);
            }
            Some(_) => {}
            None => unset.push(c.name),
        }
    }
    if !bad.is_empty() {
        let values: Vec<&str> = bad_values.into_iter().collect();
        details.push(format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            which_containers(&bad),
            join_quote(&values)
        ));
    }
    if !pod.is_some_and(ok) && !unset.is_empty() {
        details.push(format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            which_containers(&unset)
        ));
    }
    violation("seccompProfile", details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(level: Level, spec: serde_json::Value) -> String {
        let spec: PodSpec = serde_json::from_value(spec).unwrap();
        let meta = ObjectMeta::default();
        message(&evaluate(
            level,
            &Subject {
                meta: &meta,
                spec: &spec,
            },
        ))
    }

    #[test]
    fn a_plain_pod_is_baseline_but_not_restricted() {
        let spec = json!({"containers":[{"name":"web","image":"nginx"}]});
        assert_eq!(run(Level::Baseline, spec.clone()), "");
        assert_eq!(
            run(Level::Restricted, spec),
            "allowPrivilegeEscalation != false (container \"web\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"web\" must set securityContext.capabilities.drop=[\"ALL\"]), \
             runAsNonRoot != true (pod or container \"web\" must set securityContext.runAsNonRoot=true), \
             seccompProfile (pod or container \"web\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
    }

    #[test]
    fn baseline_violations() {
        let spec = json!({"hostNetwork":true,"hostPID":true,
            "volumes":[{"name":"root","hostPath":{"path":"/"}}],
            "securityContext":{"sysctls":[{"name":"kernel.msgmax","value":"1"}]},
            "containers":[
              {"name":"a","image":"i","securityContext":{"privileged":true,
                 "capabilities":{"add":["NET_ADMIN","CHOWN"]}},"ports":[{"containerPort":80,"hostPort":8080}]},
              {"name":"b","image":"i","securityContext":{"privileged":true,"seccompProfile":{"type":"Unconfined"}}}]});
        assert_eq!(
            run(Level::Baseline, spec.clone()),
            "non-default capabilities (container \"a\" must not include \"NET_ADMIN\" in securityContext.capabilities.add), \
             host namespaces (hostNetwork=true, hostPID=true), \
             hostPath volumes (volume \"root\"), \
             hostPort (container \"a\" uses hostPort 8080), \
             privileged (containers \"a\", \"b\" must not set securityContext.privileged=true), \
             seccompProfile (container \"b\" must not set securityContext.seccompProfile.type to \"Unconfined\"), \
             forbidden sysctls (kernel.msgmax)"
        );
        // restricted replaces the baseline hostPath and capability checks with its own
        let r = run(Level::Restricted, spec);
        assert!(r.contains("restricted volume types (volume \"root\" uses restricted volume type \"hostPath\")"), "{r}");
        assert!(!r.contains("hostPath volumes"), "{r}");
        assert!(!r.contains("non-default capabilities"), "{r}");
    }

    #[test]
    fn a_restricted_pod_passes() {
        let spec = json!({"securityContext":{"runAsNonRoot":true,"seccompProfile":{"type":"RuntimeDefault"}},
            "volumes":[{"name":"c","configMap":{"name":"x"}}],
            "containers":[{"name":"web","image":"i","securityContext":{"allowPrivilegeEscalation":false,
                "capabilities":{"drop":["ALL"],"add":["NET_BIND_SERVICE"]}}}]});
        assert_eq!(run(Level::Restricted, spec), "");
    }
}
