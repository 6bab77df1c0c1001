//! The admission chain against a real `control-plane apiserver` process, driven by the real
//! kubectl: every refusal is the Status Kubernetes gives (code, reason, message) and stores
//! nothing; defaults and warnings reach what kubectl shows.

use serde_json::Value;
use skiff_tests::kubectl::{Kubectl, ServerFixture};

/// An AdmissionConfiguration exempting one namespace from PodSecurity.
const ADMISSION_CONFIG: &str = "apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: privileged
    exemptions:
      namespaces: [exempt]
";

fn start() -> ServerFixture {
    // Read once at start: the file need not outlive it.
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("admission.yaml");
    std::fs::write(&config, ADMISSION_CONFIG).unwrap();
    ServerFixture::start(
        env!("CARGO_BIN_EXE_control-plane").as_ref(),
        &["--admission-control-config-file", config.to_str().unwrap()],
    )
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// A pod manifest with one container `web` and the given container fields (YAML, indented
/// for the container).
fn pod(name: &str, ns: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  containers:
  - name: web
    image: nginx:1.27
{container_extra}"
    )
}

/// `kubectl get` of something that must not exist.
fn absent(k: &Kubectl, args: &[&str]) {
    let err = k.fails(&[&["get"], args].concat());
    assert!(err.contains("NotFound"), "{err}");
}

#[test]
fn limit_ranges_default_and_bound_containers_and_pods() {
    let f = start();
    f.k.ok(&["create", "namespace", "lr"]);
    f.k.run_with_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1
kind: LimitRange
metadata: {name: limits, namespace: lr}
spec:
  limits:
  - type: Container
    default: {cpu: 500m, memory: 128Mi}
    defaultRequest: {cpu: 100m}
    max: {cpu: '1'}
    maxLimitRequestRatio: {cpu: '10'}
  - type: Pod
    max: {memory: 200Mi}
",
    );
    let lr = json(&f.k.ok(&["get", "limitrange", "limits", "-n", "lr", "-o", "json"]));
    // LimitRange defaulting: defaultRequest's memory from default.
    assert_eq!(lr["spec"]["limits"][0]["defaultRequest"]["memory"], "128Mi");
    let table = f.k.ok(&["get", "limits", "-n", "lr"]);
    assert!(
        table.starts_with("NAME") && table.contains("limits"),
        "{table}"
    );

    // A pod without resources gets the defaults, and the annotation says so.
    let run =
        f.k.run_with_stdin(&["apply", "-f", "-"], &pod("plain", "lr", ""));
    assert!(run.success, "{}", run.stderr);
    let p = json(&f.k.ok(&["get", "pod", "plain", "-n", "lr", "-o", "json"]));
    let r = &p["spec"]["containers"][0]["resources"];
    assert_eq!(r["limits"]["cpu"], "500m");
    assert_eq!(r["limits"]["memory"], "128Mi");
    assert_eq!(r["requests"]["cpu"], "100m");
    assert_eq!(r["requests"]["memory"], "128Mi");
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container web; cpu, memory limit for container web"
    );

    // Over the container maximum: 403 with Kubernetes' message, nothing stored.
    let big = pod(
        "big",
        "lr",
        "    resources:\n      limits: {cpu: '2', memory: 64Mi}\n      requests: {cpu: '1'}\n",
    );
    let run = f.k.run_with_stdin(&["create", "-f", "-"], &big);
    assert!(!run.success);
    assert!(
        run.stderr.contains(
            "Error from server (Forbidden): error when creating \"STDIN\": pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        ),
        "{}",
        run.stderr
    );
    absent(&f.k, &["pod", "big", "-n", "lr"]);

    // Two containers within their own maximum but over the pod's: both rules reported.
    let two = "apiVersion: v1
kind: Pod
metadata: {name: two, namespace: lr}
spec:
  containers:
  - {name: a, image: i, resources: {limits: {memory: 150Mi}}}
  - {name: b, image: i, resources: {limits: {memory: 150Mi, cpu: '2'}}}
";
    let run = f.k.run_with_stdin(&["create", "-f", "-"], two);
    assert!(!run.success);
    assert!(
        run.stderr.contains("pods \"two\" is forbidden: [maximum cpu usage per Container is 1, but limit is 2, maximum memory usage per Pod is 200Mi, but limit is 300Mi]"),
        "{}",
        run.stderr
    );
    absent(&f.k, &["pod", "two", "-n", "lr"]);
}

#[test]
fn pod_security_enforces_warns_and_exempts() {
    let f = start();
    let privileged = "    securityContext: {privileged: true}\n";
    let restricted = "    securityContext:
      allowPrivilegeEscalation: false
      runAsNonRoot: true
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
";
    // enforce=restricted: a privileged pod is refused with every reason, nothing stored.
    f.k.ok(&["create", "namespace", "locked"]);
    f.k.ok(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("priv", "locked", privileged));
    assert!(!run.success);
    assert!(
        run.stderr.contains(
            "pods \"priv\" is forbidden: violates PodSecurity \"restricted:latest\": \
             privileged (container \"web\" must not set securityContext.privileged=true), \
             allowPrivilegeEscalation != false (container \"web\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"web\" must set securityContext.capabilities.drop=[\"ALL\"]), \
             runAsNonRoot != true (pod or container \"web\" must set securityContext.runAsNonRoot=true), \
             seccompProfile (pod or container \"web\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        ),
        "{}",
        run.stderr
    );
    absent(&f.k, &["pod", "priv", "-n", "locked"]);
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("fine", "locked", restricted));
    assert!(run.success, "{}", run.stderr);

    // warn=baseline: admitted, and kubectl prints the warning.
    f.k.ok(&["create", "namespace", "watched"]);
    f.k.ok(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/warn=baseline",
    ]);
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("priv", "watched", privileged));
    assert!(run.success, "{}", run.stderr);
    let warning = "Warning: would violate PodSecurity \"baseline:latest\": privileged (container \"web\" must not set securityContext.privileged=true)";
    assert!(run.stderr.contains(warning), "{}", run.stderr);
    // A workload's pod template is warned about too (never enforced).
    let deployment = "apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: watched}
spec:
  selector: {matchLabels: {app: d}}
  template:
    metadata: {labels: {app: d}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        securityContext: {privileged: true}
";
    let run = f.k.run_with_stdin(&["apply", "-f", "-"], deployment);
    assert!(run.success, "{}", run.stderr);
    assert!(run.stderr.contains(warning), "{}", run.stderr);
    // So are a StatefulSet's, a Job's and a CronJob's (its template inside jobTemplate).
    let container = "      containers:
      - name: web
        image: nginx:1.27
        securityContext: {privileged: true}
";
    let set = format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: s, namespace: watched}}
spec:
  serviceName: s
  selector: {{matchLabels: {{app: s}}}}
  template:
    metadata: {{labels: {{app: s}}}}
    spec:
{container}"
    );
    let job = format!(
        "apiVersion: batch/v1
kind: Job
metadata: {{name: j, namespace: watched}}
spec:
  template:
    spec:
      restartPolicy: Never
{container}"
    );
    let indented: String = container.lines().map(|l| format!("    {l}\n")).collect();
    let cron = format!(
        "apiVersion: batch/v1
kind: CronJob
metadata: {{name: c, namespace: watched}}
spec:
  schedule: '*/5 * * * *'
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
{indented}"
    );
    for manifest in [&set, &job, &cron] {
        let run = f.k.run_with_stdin(&["apply", "-f", "-"], manifest);
        assert!(run.success, "{manifest}\n{}", run.stderr);
        assert!(run.stderr.contains(warning), "{manifest}\n{}", run.stderr);
    }

    // Enforcing baseline where a pod already violates it: kubectl prints which.
    let run = f.k.run(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    assert!(run.success, "{}", run.stderr);
    assert!(
        run.stderr.contains("Warning: existing pods in namespace \"watched\" violate the new PodSecurity enforce level \"baseline:latest\"")
            && run.stderr.contains("Warning: priv: privileged (container \"web\" must not set securityContext.privileged=true)"),
        "{}",
        run.stderr
    );
    // An invalid level is refused on the namespace itself.
    let err = f.k.fails(&[
        "label",
        "--overwrite",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/enforce=bogus",
    ]);
    assert!(
        err.contains("Unsupported value: \"bogus\": supported values: \"privileged\", \"baseline\", \"restricted\""),
        "{err}"
    );

    // An exempt namespace (the server's admission configuration) is not enforced.
    f.k.ok(&["create", "namespace", "exempt"]);
    f.k.ok(&[
        "label",
        "namespace",
        "exempt",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("priv", "exempt", privileged));
    assert!(run.success, "{}", run.stderr);
}

#[test]
fn namespace_lifecycle() {
    let f = start();
    let err = f.k.fails(&["delete", "namespace", "default"]);
    assert!(
        err.contains("namespace default is forbidden: this namespace may not be deleted"),
        "{err}"
    );
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("p", "nowhere", ""));
    assert!(!run.success);
    assert!(
        run.stderr.contains("namespaces \"nowhere\" not found"),
        "{}",
        run.stderr
    );
}

/// `kubectl create -f -` of `manifest`; stderr when it fails, else the panic.
fn create_fails(k: &Kubectl, manifest: &str) -> String {
    let run = k.run_with_stdin(&["create", "-f", "-"], manifest);
    assert!(!run.success, "created: {}", run.stdout);
    run.stderr
}

/// `kubectl create -f -` of `manifest`, which must succeed.
fn created(k: &Kubectl, manifest: &str) {
    let run = k.run_with_stdin(&["create", "-f", "-"], manifest);
    assert!(run.success, "{}", run.stderr);
}

/// A pod's (priorityClassName, priority, preemptionPolicy) as stored.
fn priority_of(k: &Kubectl, pod: &str) -> (Value, Value, Value) {
    priority_in(k, pod, "default")
}

fn priority_in(k: &Kubectl, pod: &str, ns: &str) -> (Value, Value, Value) {
    let p = json(&k.ok(&["get", "pod", pod, "-n", ns, "-o", "json"]));
    let s = &p["spec"];
    (
        s["priorityClassName"].clone(),
        s["priority"].clone(),
        s["preemptionPolicy"].clone(),
    )
}

#[test]
fn priority_classes_resolve_pod_priority() {
    let f = start();
    // The built-in classes, as `kubectl get priorityclasses` shows them.
    let table = f.k.ok(&["get", "pc"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].split_whitespace().collect::<Vec<_>>()
            == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"],
        "{table}"
    );
    for (name, value) in [
        ("system-cluster-critical", "2000000000"),
        ("system-node-critical", "2000001000"),
    ] {
        assert!(
            lines.iter().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w[0] == name && w[1] == value && w[2] == "false"
            }),
            "{table}"
        );
    }

    // No class, no default: priority 0.
    created(&f.k, &pod("plain", "default", ""));
    assert_eq!(
        priority_of(&f.k, "plain"),
        (
            Value::Null,
            Value::from(0),
            Value::from("PreemptLowerPriority")
        )
    );

    // A class of the pod's naming.
    created(
        &f.k,
        "apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
preemptionPolicy: Never
description: batch work that must not wait
",
    );
    let high = format!(
        "{}  priorityClassName: high\n",
        pod("important", "default", "")
    );
    created(&f.k, &high);
    assert_eq!(
        priority_of(&f.k, "important"),
        (Value::from("high"), Value::from(1000), Value::from("Never"))
    );
    let critical = format!(
        "{}  priorityClassName: system-node-critical\n",
        pod("critical", "kube-system", "")
    );
    created(&f.k, &critical);
    assert_eq!(
        priority_in(&f.k, "critical", "kube-system").1,
        Value::from(2000001000)
    );

    // Refusals, as Kubernetes words them; nothing stored.
    let missing = format!(
        "{}  priorityClassName: nosuch\n",
        pod("lost", "default", "")
    );
    let err = create_fails(&f.k, &missing);
    assert!(
        err.contains("pods \"lost\" is forbidden: no PriorityClass with name nosuch was found"),
        "{err}"
    );
    absent(&f.k, &["pod", "lost"]);
    let forged = format!(
        "{}  priorityClassName: high\n  priority: 7\n",
        pod("forged", "default", "")
    );
    let err = create_fails(&f.k, &forged);
    assert!(
        err.contains("the integer value of priority (7) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name"),
        "{err}"
    );
    let err = create_fails(
        &f.k,
        "apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: system-mine}
value: 10
",
    );
    assert!(
        err.contains("metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only"),
        "{err}"
    );
    let err = f.k.fails(&["delete", "pc", "system-node-critical"]);
    assert!(
        err.contains("priorityclasses.scheduling.k8s.io \"system-node-critical\" is forbidden: this is a system priority class and cannot be deleted"),
        "{err}"
    );
    let err =
        f.k.fails(&["patch", "pc", "high", "-p", r#"{"value": 2000}"#]);
    assert!(
        err.contains("value: Forbidden: may not be changed in an update."),
        "{err}"
    );

    // A global default applies to pods without a class; only one may exist.
    created(
        &f.k,
        "apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: everyday}
value: 10
globalDefault: true
",
    );
    created(&f.k, &pod("defaulted", "default", ""));
    assert_eq!(
        priority_of(&f.k, "defaulted"),
        (
            Value::from("everyday"),
            Value::from(10),
            Value::from("PreemptLowerPriority")
        )
    );
    let err = create_fails(
        &f.k,
        "apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: another}
value: 20
globalDefault: true
",
    );
    assert!(
        err.contains(
            "PriorityClass everyday is already marked as default. Only one default can exist"
        ),
        "{err}"
    );
    absent(&f.k, &["pc", "another"]);
}
