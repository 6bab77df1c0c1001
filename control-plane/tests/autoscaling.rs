//! autoscaling/v2 and autoscaling/v1 HorizontalPodAutoscalers against a real `control-plane
//! apiserver` process, driven by the real kubectl 1.33: `kubectl autoscale` (which posts
//! autoscaling/v1) stores the v2 object with Kubernetes' defaults, both versions read the
//! same object, `kubectl get hpa` prints kubectl's columns, and invalid specs are refused with
//! the field at fault.

use serde_json::Value;
use skiff_tests::kubectl::{Kubectl, ServerFixture};

fn start() -> ServerFixture {
    ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &[])
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn create_fails(k: &Kubectl, manifest: &str) -> String {
    let run = k.run_with_stdin(&["create", "-f", "-"], manifest);
    assert!(!run.success, "created: {}", run.stdout);
    run.stderr
}

#[test]
fn hpa_versions_table_and_validation() {
    let f = start();
    let k = &f.k;
    let versions = k.ok(&["api-versions"]);
    for v in ["autoscaling/v1", "autoscaling/v2"] {
        assert!(versions.lines().any(|l| l == v), "{versions}");
    }
    let resources = k.ok(&["api-resources", "--api-group=autoscaling"]);
    assert!(
        resources.lines().any(|l| words(l)
            == [
                "horizontalpodautoscalers",
                "hpa",
                "autoscaling/v2",
                "true",
                "HorizontalPodAutoscaler"
            ]),
        "{resources}"
    );

    k.ok(&["create", "deployment", "web", "--image=nginx:1.27"]);
    let out = k.ok(&[
        "autoscale",
        "deployment",
        "web",
        "--cpu-percent=50",
        "--min=1",
        "--max=4",
    ]);
    assert!(
        out.contains("horizontalpodautoscaler.autoscaling/web autoscaled"),
        "{out}"
    );

    // Stored as v2, read through either version.
    let v2 = json(&k.ok(&["get", "hpa", "web", "-o", "json"]));
    assert_eq!(v2["apiVersion"], "autoscaling/v2");
    assert_eq!(
        v2["spec"]["metrics"],
        serde_json::json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 50}}}])
    );
    assert_eq!(v2["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(v2["metadata"]["generation"], 1);
    let v1 = json(&k.ok(&[
        "get",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "-o",
        "json",
    ]));
    assert_eq!(v1["apiVersion"], "autoscaling/v1");
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
    assert_eq!(v1["spec"]["minReplicas"], 1);
    assert_eq!(v1["metadata"]["uid"], v2["metadata"]["uid"]);

    // kubectl's columns; no metrics yet.
    let table = k.ok(&["get", "hpa"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        words(lines[0]),
        [
            "NAME",
            "REFERENCE",
            "TARGETS",
            "MINPODS",
            "MAXPODS",
            "REPLICAS",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        &words(lines[1])[..7],
        [
            "web",
            "Deployment/web",
            "cpu:",
            "<unknown>/50%",
            "1",
            "4",
            "0"
        ],
        "{table}"
    );

    // A memory target by average value (through v2) survives a v1 read and write.
    k.ok(&[
        "patch",
        "hpa",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"metrics":[{"type":"Resource","resource":{"name":"memory","target":{"type":"AverageValue","averageValue":"100Mi"}}}]}}"#,
    ]);
    let table = k.ok(&["get", "hpa", "web", "--no-headers"]);
    assert_eq!(
        &words(&table)[2..4],
        ["memory:", "<unknown>/100Mi"],
        "{table}"
    );
    let v1 = json(&k.ok(&[
        "get",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "-o",
        "json",
    ]));
    assert!(
        v1["spec"].get("targetCPUUtilizationPercentage").is_none(),
        "{v1}"
    );
    assert!(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"]
            .as_str()
            .is_some_and(|m| m.contains("100Mi")),
        "{v1}"
    );
    k.ok(&[
        "label",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "tier=front",
    ]);
    let v2 = json(&k.ok(&["get", "hpa", "web", "-o", "json"]));
    assert_eq!(
        v2["spec"]["metrics"][0]["resource"]["target"]["averageValue"],
        "100Mi"
    );
    assert_eq!(v2["metadata"]["labels"]["tier"], "front");
    assert!(v2["metadata"].get("annotations").is_none(), "{v2}");

    // Validation: the fields at fault, as Kubernetes names them.
    let err = create_fails(
        k,
        "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: bad}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 0
  maxReplicas: 0
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization}}
  behavior:
    scaleDown:
      selectPolicy: Sometimes
      policies: [{type: Pods, value: 1, periodSeconds: 0}]
",
    );
    for want in [
        "The HorizontalPodAutoscaler \"bad\" is invalid",
        "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1",
        "spec.maxReplicas: Invalid value: 0: must be greater than 0",
        "spec.metrics[0].resource.target.averageUtilization: Required value: must set either a target raw value or a target utilization",
        "spec.behavior.scaleDown.selectPolicy: Unsupported value: \"Sometimes\"",
        "spec.behavior.scaleDown.policies[0].periodSeconds: Invalid value: 0: must be greater than zero",
    ] {
        assert!(err.contains(want), "{want}\n{err}");
    }
    // Through v1 the same rules apply (to the v2 form, as Kubernetes validates).
    let err = create_fails(
        k,
        "apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata: {name: bad}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 3
  maxReplicas: 2
",
    );
    assert!(
        err.contains(
            "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"
        ),
        "{err}"
    );
    let err = k.fails(&["get", "hpa", "bad"]);
    assert!(err.contains("NotFound"), "{err}");

    // The status subresource: writes there change only status, and the main resource
    // ignores status.
    k.ok(&[
        "patch",
        "hpa",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"currentReplicas":2,"desiredReplicas":3}}"#,
    ]);
    let v2 = json(&k.ok(&["get", "hpa", "web", "-o", "json"]));
    assert_eq!(v2["status"]["desiredReplicas"], 3);
    let table = k.ok(&["get", "hpa", "web", "--no-headers"]);
    assert_eq!(words(&table)[6], "2", "{table}");
    k.ok(&["delete", "hpa", "web"]);
    let err = k.fails(&["get", "horizontalpodautoscalers.v1.autoscaling", "web"]);
    assert!(err.contains("NotFound"), "{err}");
}
