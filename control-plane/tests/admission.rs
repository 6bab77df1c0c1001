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
