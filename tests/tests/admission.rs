//! The mutating admission path end to end on a real 2-node cluster: a sidecar injector (the
//! echo image's `webhook` subcommand) runs as a Deployment behind a Service, serving HTTPS
//! with a certificate from a CA the test makes; a MutatingWebhookConfiguration points at
//! the Service with that CA as caBundle; pods labelled for it get a second container, and
//! both containers run. The API server calls the webhook at a ready endpoint of the Service,
//! through routes from the host to the pod network (the cluster's own, unique to the test).
//!
//! Needs the daemons built and the images in the local registry, as the e2e test does.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use skiff_tests::cluster::{Binaries, Cluster, Spec};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::tls::TestCa;
use skiff_tests::{subnet, wait_until};
use std::time::Duration;

const T: Duration = Duration::from_secs(180);

/// The daemons next to this test's binary (`target/<profile>/`).
fn binaries() -> Binaries {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let b = Binaries::in_dir(profile);
    assert!(
        b.missing().is_empty(),
        "build the daemons first (cargo build -p control-plane -p node -p proxy; cargo xtask test does): missing {:?}",
        b.missing()
    );
    b
}

fn apply(k: &Kubectl, manifest: &str) {
    let r = k.run_with_stdin(&["apply", "-f", "-"], manifest);
    assert!(r.success, "kubectl apply: {}", r.stderr);
}

fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl printed JSON")
}

/// The pods matching `selector` once there are `n`, every container of each ready.
fn wait_running(k: &Kubectl, ns: &str, selector: &str, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} pods running ({selector})"), T, || {
        let list = json_of(k, &["get", "pods", "-n", ns, "-l", selector]);
        let pods: Vec<Value> = list["items"].as_array().cloned().unwrap_or_default();
        let all_ready = |p: &Value| {
            let statuses = p["status"]["containerStatuses"].as_array();
            let want = p["spec"]["containers"].as_array().map_or(0, Vec::len);
            statuses.is_some_and(|s| {
                s.len() == want
                    && s.iter()
                        .all(|c| c["ready"] == true && !c["state"]["running"].is_null())
            })
        };
        if pods.len() == n && pods.iter().all(all_ready) {
            Ok(pods)
        } else {
            Err(pods
                .iter()
                .map(|p| (p["metadata"]["name"].clone(), p["status"].clone()))
                .collect::<Vec<_>>())
        }
    })
}

#[test]
fn a_sidecar_injector_adds_a_container_that_runs() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("adm");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    spec.own_pod_network(lease.octet());
    eprintln!("cluster {name} in {}", dir.display());
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl();

    // The injector: its serving certificate for the Service's name, from the test's CA.
    let ca = TestCa::new("injector test CA");
    let issued = ca.issue(&["injector.hooks.svc"]);
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&crt, &issued.cert_pem).unwrap();
    std::fs::write(&key, &issued.key_pem).unwrap();
    k.ok(&["create", "namespace", "hooks"]);
    k.ok(&[
        "create",
        "secret",
        "tls",
        "injector-tls",
        "-n",
        "hooks",
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    apply(
        &k,
        &format!(
            "apiVersion: apps/v1
kind: Deployment
metadata: {{name: injector, namespace: hooks}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: injector}}}}
  template:
    metadata: {{labels: {{app: injector}}}}
    spec:
      containers:
      - name: webhook
        image: {ECHO_IMAGE}
        args: [webhook, --cert, /tls/tls.crt, --key, /tls/tls.key, --sidecar-image, {ECHO_IMAGE}, --port, '8443']
        ports: [{{containerPort: 8443}}]
        readinessProbe: {{tcpSocket: {{port: 8443}}, periodSeconds: 1}}
        volumeMounts: [{{name: tls, mountPath: /tls, readOnly: true}}]
      volumes: [{{name: tls, secret: {{secretName: injector-tls}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: injector, namespace: hooks}}
spec:
  selector: {{app: injector}}
  ports: [{{port: 443, targetPort: 8443}}]
"
        ),
    );
    wait_running(&k, "hooks", "app=injector", 1);
    wait_until("the injector's endpoint", T, || {
        let slices = json_of(
            &k,
            &[
                "get",
                "endpointslices",
                "-n",
                "hooks",
                "-l",
                "kubernetes.io/service-name=injector",
            ],
        );
        let ready = slices["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .any(|e| e["conditions"]["ready"] == true);
        if ready {
            Ok(())
        } else {
            Err(slices)
        }
    });

    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "sidecar-injector"},
        "webhooks": [{
            "name": "inject.skiff.dev",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "objectSelector": {"matchLabels": {"sidecar": "inject"}},
            "clientConfig": {
                "service": {"namespace": "hooks", "name": "injector", "path": "/mutate"},
                "caBundle": STANDARD.encode(ca.cert_pem()),
            },
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        }],
    });
    apply(&k, &config.to_string());

    // A Deployment whose pods carry the label: the ReplicaSet controller's creates pass the
    // webhook, and each pod runs its own container and the sidecar.
    apply(
        &k,
        &format!(
            "apiVersion: apps/v1
kind: Deployment
metadata: {{name: app}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app, sidecar: inject}}}}
    spec:
      containers:
      - name: web
        image: {ECHO_IMAGE}
"
        ),
    );
    let pods = wait_running(&k, "default", "app=app", 2);
    for p in &pods {
        let names: Vec<&str> = p["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["web", "sidecar"], "{p}");
    }
    // The sidecar serves beside the app in the pod's network namespace.
    let pod = pods[0]["metadata"]["name"].as_str().unwrap();
    let out = k.ok(&[
        "exec",
        pod,
        "-c",
        "web",
        "--",
        "/echo",
        "fetch",
        "http://127.0.0.1:9090/",
    ]);
    assert!(out.contains(&format!("pod={pod}")), "{out}");
    // Pods without the label are not sent to the webhook.
    k.ok(&["run", "plain", "--image", ECHO_IMAGE]);
    let plain = wait_running(&k, "default", "run=plain", 1);
    assert_eq!(plain[0]["spec"]["containers"].as_array().unwrap().len(), 1);
}
