//! A node joins a real cluster by TLS bootstrap: the cluster library makes a bootstrap token
//! with the real `control-plane token create`; the node agent starts with only that token,
//! submits a CertificateSigningRequest, which the controllers approve (the token's group may
//! ask for node client certificates) and sign; the agent then registers and runs pods as
//! `system:node:<name>` (its kubeconfig's `kubectl auth whoami`), under the Node authorizer.
//! A kubeconfig with a wrong token secret is refused (401).
//!
//! Needs the daemons built and the images in the local registry, as the e2e test does.

use serde_json::Value;
use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::e2e::binaries;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_images, ECHO_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::time::Duration;

const T: Duration = Duration::from_secs(180);

fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&all)).expect("kubectl printed JSON")
}

#[test]
fn a_node_joins_with_a_bootstrap_token_and_runs_pods_as_itself() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("join");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 1, &dir, lease.cidr().parse().unwrap(), binaries());
    spec.tls_bootstrap = true;
    eprintln!("cluster {name} in {}", dir.display());
    // Up waits for the node to register and be Ready: it could only with its certificate.
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let k = c.kubectl();
    let node = c.state().nodes[0].clone();

    // One request, from the token's user, approved automatically and issued.
    let csrs = json_of(&k, &["get", "csr"]);
    let items = csrs["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{csrs}");
    let csr = &items[0];
    let requester = csr["spec"]["username"].as_str().unwrap();
    assert!(requester.starts_with("system:bootstrap:"), "{csr}");
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(csr["status"]["conditions"][0]["reason"], "AutoApproved");
    assert!(csr["status"]["certificate"].is_string(), "{csr}");
    let table = k.ok(&["get", "csr"]);
    assert!(table.contains("Approved,Issued"), "{table}");

    // The agent's own kubeconfig is the node's identity.
    let own = node.data_dir.join("kubeconfig");
    let as_node = Kubectl::new(&own, &dir.join("node-kubectl"));
    let me = json_of(&as_node, &["auth", "whoami"]);
    assert_eq!(
        me["status"]["userInfo"]["username"],
        format!("system:node:{}", node.name)
    );

    // And it runs pods bound to it.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "joined", "labels": {"app": "joined"}},
        "spec": {"nodeName": node.name,
            "containers": [{"name": "echo", "image": ECHO_IMAGE}]}
    });
    let r = k.run_with_stdin(&["create", "-f", "-"], &pod.to_string());
    assert!(r.success, "{}", r.stderr);
    wait_until("the pod runs on the joined node", T, || {
        let p = json_of(&k, &["get", "pod", "joined"]);
        match p["status"]["phase"].as_str() {
            Some("Running") => Ok(()),
            other => Err(format!("{other:?} {}", p["status"])),
        }
    });

    // The bootstrap kubeconfig `token create --write-kubeconfig` wrote holds a secret: 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(c.bootstrap_kubeconfig())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "bootstrap kubeconfig mode {mode:o}");

    // A wrong secret for the same token id: 401, as kubectl reports it.
    let bootstrap = std::fs::read_to_string(c.bootstrap_kubeconfig()).unwrap();
    let token_line = bootstrap
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .unwrap();
    let id = token_line.trim_start()["token:".len()..]
        .trim()
        .split('.')
        .next()
        .unwrap()
        .to_string();
    let wrong = dir.join("wrong-kubeconfig");
    std::fs::write(
        &wrong,
        bootstrap.replace(token_line, &format!("    token: {id}.0123456789abcdef")),
    )
    .unwrap();
    let err = Kubectl::new(&wrong, &dir.join("wrong-kubectl")).fails(&["get", "csr"]);
    assert!(
        err.contains("Unauthorized") || err.contains("provide credentials"),
        "{err}"
    );
}
