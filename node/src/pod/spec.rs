//! A Pod object as CRI configurations: the sandbox (namespaces, cgroup parent, hostname, log
//! directory, labels that let a restarted agent find its pods again) and each container
//! (image, command, env, mounts, resources, security context).

use super::NodeContext;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};
use std::collections::HashMap;

/// Sandbox and container labels (the kubelet's keys), used to adopt pods after a restart.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Marks init containers, so adoption tells them from app containers of the same name.
pub const CONTAINER_KIND: &str = "io.skiff.container.kind";

/// Init, app or ephemeral container: they run at different times and report in different
/// lists. Ephemeral containers (`kubectl debug`) are added to a running pod and never
/// restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    Init,
    App,
    Ephemeral,
}

impl ContainerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::App => "app",
            ContainerKind::Ephemeral => "ephemeral",
        }
    }

    /// The Event `fieldPath` of a container of this kind.
    pub fn field_path(self, name: &str) -> String {
        match self {
            ContainerKind::Init => format!("spec.initContainers{{{name}}}"),
            ContainerKind::App => format!("spec.containers{{{name}}}"),
            ContainerKind::Ephemeral => format!("spec.ephemeralContainers{{{name}}}"),
        }
    }
}

/// A pod's ephemeral containers as containers (the fields they share; the target is kept
/// apart by the caller), with their names' targets.
pub fn ephemeral_containers(pod: &Pod) -> Vec<(Container, Option<String>)> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| {
            let mut v = serde_json::to_value(e).ok()?;
            let target = v
                .as_object_mut()?
                .remove("targetContainerName")
                .and_then(|t| t.as_str().map(str::to_string));
            Some((serde_json::from_value(v).ok()?, target))
        })
        .collect()
}

pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let m = &pod.metadata;
    HashMap::from([
        (POD_NAME.to_string(), m.name.clone().unwrap_or_default()),
        (
            POD_NAMESPACE.to_string(),
            m.namespace.clone().unwrap_or_default(),
        ),
        (POD_UID.to_string(), m.uid.clone().unwrap_or_default()),
    ])
}

fn namespaces(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.as_ref();
    cri::NamespaceOption {
        network: if host_network(pod) {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        } as i32,
        pid: if spec.and_then(|s| s.host_pid).unwrap_or(false) {
            cri::NamespaceMode::Node
        } else if spec
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false)
        {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Container
        } as i32,
        ipc: if spec.and_then(|s| s.host_ipc).unwrap_or(false) {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        } as i32,
        ..Default::default()
    }
}

/// The sandbox configuration; `attempt` counts sandboxes made for this pod.
pub fn sandbox_config(pod: &Pod, ctx: &NodeContext, attempt: u32) -> cri::PodSandboxConfig {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let (ns, name, uid) = (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
    );
    let hostname = if host_network(pod) {
        String::new()
    } else {
        spec.and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| name.clone())
    };
    let privileged = spec.is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.privileged)
                    .unwrap_or(false)
            })
    });
    let log_dir = ctx.layout.pod_log_dir(&ns, &name, &uid);
    let port_mappings = host_ports(pod);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name,
            uid: uid.clone(),
            namespace: ns,
            attempt,
        }),
        hostname,
        dns_config: Some(super::dns::dns_config(pod, &ctx.dns)),
        port_mappings,
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels: pod_labels(pod),
        annotations: m
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: ctx.node.pod_cgroup(&uid),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(pod)),
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The containers' ports that ask for a host port, as CRI port mappings (the CNI portmap
/// plugin forwards the node's port to the pod). A hostNetwork pod listens on the node itself.
pub fn host_ports(pod: &Pod) -> Vec<cri::PortMapping> {
    if host_network(pod) {
        return Vec::new();
    }
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp,
                Some("SCTP") => cri::Protocol::Sctp,
                _ => cri::Protocol::Tcp,
            } as i32,
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// Everything a container config needs besides the Pod and the spec.
pub struct ContainerInputs {
    pub kind: ContainerKind,
    pub attempt: u32,
    pub image: String,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<cri::Mount>,
    /// An ephemeral container's target: the runtime id of the container whose process
    /// namespace it joins (`kubectl debug --target`).
    pub target_id: Option<String>,
}

/// The log file of one container attempt, relative to the sandbox's log directory.
pub fn log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}

pub fn container_config(pod: &Pod, c: &Container, inputs: ContainerInputs) -> cri::ContainerConfig {
    let mut labels = pod_labels(pod);
    labels.insert(CONTAINER_NAME.into(), c.name.clone());
    labels.insert(CONTAINER_KIND.into(), inputs.kind.as_str().into());
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.clone().unwrap_or_default();
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: inputs.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: inputs.image,
            ..Default::default()
        }),
        // `$(VAR)` in command and args from the container's environment, as the kubelet
        // expands them (a DaemonSet's `--flag=$(NODE_NAME)` from the downward API).
        command: expand_all(c.command.as_deref(), &inputs.env),
        args: expand_all(c.args.as_deref(), &inputs.env),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: inputs
            .env
            .into_iter()
            .map(|(key, value)| cri::KeyValue { key, value })
            .collect(),
        mounts: inputs.mounts,
        labels,
        log_path: log_path(&c.name, inputs.attempt),
        // `kubectl run -i/-t` and `kubectl attach`: an open stdin (closed after the first
        // attach with stdinOnce) and a terminal.
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(super::resources::linux_resources(c)),
            security_context: Some({
                let mut sc = security_context(pod, &sc, pod_sc.and_then(|p| p.run_as_user));
                if let (Some(target), Some(ns)) = (inputs.target_id, sc.namespace_options.as_mut())
                {
                    ns.pid = cri::NamespaceMode::Target as i32;
                    ns.target_id = target;
                }
                sc
            }),
        }),
        ..Default::default()
    }
}

fn expand_all(words: Option<&[String]>, env: &[(String, String)]) -> Vec<String> {
    words
        .unwrap_or_default()
        .iter()
        .map(|w| super::env::expand(w, env))
        .collect()
}

fn security_context(
    pod: &Pod,
    sc: &SecurityContext,
    pod_run_as_user: Option<i64>,
) -> cri::LinuxContainerSecurityContext {
    let caps = sc.capabilities.as_ref();
    let names = |v: Option<&Vec<String>>| v.cloned().unwrap_or_default();
    cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: names(caps.and_then(|c| c.add.as_ref())),
            drop_capabilities: names(caps.and_then(|c| c.drop.as_ref())),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(namespaces(pod)),
        run_as_user: sc
            .run_as_user
            .or(pod_run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn process_namespaces_follow_the_spec() {
        let pid = |spec| namespaces(&pod(spec)).pid;
        let c = serde_json::json!([{"name": "c"}]);
        assert_eq!(
            pid(serde_json::json!({"containers": c})),
            cri::NamespaceMode::Container as i32
        );
        assert_eq!(
            pid(serde_json::json!({"containers": c, "shareProcessNamespace": true})),
            cri::NamespaceMode::Pod as i32
        );
        // `kubectl debug node/...` pods see the node's processes.
        assert_eq!(
            pid(serde_json::json!({"containers": c, "hostPID": true})),
            cri::NamespaceMode::Node as i32
        );
    }

    #[test]
    fn an_ephemeral_container_joins_its_targets_process_namespace() {
        let p = pod(serde_json::json!({"containers": [{"name": "app"}],
            "ephemeralContainers": [{"name": "dbg", "image": "x", "targetContainerName": "app"},
                                    {"name": "dbg2", "image": "x"}]}));
        let e = ephemeral_containers(&p);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0.name, "dbg");
        assert_eq!(e[0].1.as_deref(), Some("app"));
        assert_eq!(e[1].1, None);
        let inputs = |target_id| ContainerInputs {
            kind: ContainerKind::Ephemeral,
            attempt: 0,
            image: "x".into(),
            env: vec![],
            mounts: vec![],
            target_id,
        };
        let ns = |cfg: cri::ContainerConfig| {
            cfg.linux
                .and_then(|l| l.security_context)
                .and_then(|s| s.namespace_options)
                .unwrap()
        };
        let targeted = ns(container_config(&p, &e[0].0, inputs(Some("abc".into()))));
        assert_eq!(targeted.pid, cri::NamespaceMode::Target as i32);
        assert_eq!(targeted.target_id, "abc");
        let own = ns(container_config(&p, &e[1].0, inputs(None)));
        assert_eq!(own.pid, cri::NamespaceMode::Container as i32);
        let labels = container_config(&p, &e[1].0, inputs(None)).labels;
        assert_eq!(labels[CONTAINER_KIND], "ephemeral");
    }

    #[test]
    fn command_and_args_expand_the_environment() {
        let env = vec![("NODE_NAME".to_string(), "n1".to_string())];
        let args = vec![
            "--cgroup=/c/skiff-$(NODE_NAME)".to_string(),
            "$$(NODE_NAME)".to_string(),
            "$(UNSET)".to_string(),
        ];
        assert_eq!(
            expand_all(Some(&args), &env),
            ["--cgroup=/c/skiff-n1", "$(NODE_NAME)", "$(UNSET)"]
        );
        assert!(expand_all(None, &env).is_empty());
    }
}
