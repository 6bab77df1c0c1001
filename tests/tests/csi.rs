//! Persistent volumes end to end through skiff's CSI driver: a cluster of two nodes brought up
//! by the same library as `cargo xtask up` with [`Spec::csi`] (deploy/csi.yaml applied with
//! the real kubectl: the node plugin DaemonSet registers itself with each node agent through
//! the plugin registration directory, the controller Deployment, the default StorageClass
//! `skiff-local`), real containerd, real loop devices, ext4 and mounts. In order:
//!
//! 1. every node's CSINode lists the driver with its topology key, the Node has the label;
//! 2. a claim of the default class waits for its first consumer, binds when its pod is
//!    scheduled (PV on that node), the pod writes a file; the pod is deleted, a new pod of the
//!    same claim lands on the same node (the volume's affinity) and reads it back;
//! 3. the node agent restarted keeps the running pod's mount (the pod reads and writes on);
//! 4. the node agent's kubelet volume metrics name the claim;
//! 5. a 1 GiB volume refuses the 1,025th MiB with ENOSPC; a claim grown is a filesystem grown;
//! 6. a StatefulSet of 3 gets a claim and a volume each;
//! 7. a claim too large for any node: ProvisioningFailed with the driver's reason, its pod
//!    Pending with FailedScheduling naming the claim;
//! 8. reclaim Delete removes the volume's data on the node; Retain keeps it, the PV Released;
//! 9. bad input: an unknown class is the claim's event, an invalid access mode and a shrink
//!    are refused with the API's Status.
//!
//! One cluster for all the steps (CI time). Needs the daemons built and the images in the
//! local registry (`cargo xtask images`: echo, pause, library/busybox, skiff/csi).

use serde_json::Value;
use skiff_tests::cluster::{Cluster, Spec, CSI_DRIVER, CSI_STORAGE_CLASS};
use skiff_tests::e2e::{self, binaries};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::netns::unique_name;
use skiff_tests::registry::{require_image, require_images, BUSYBOX_IMAGE, CSI_IMAGE};
use skiff_tests::{subnet, wait_until};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);
const TOPOLOGY_KEY: &str = "topology.local.csi.skiff.io/node";

fn json(k: &Kubectl, args: &[&str]) -> Value {
    e2e::json(k, args)
}

fn apply(k: &Kubectl, yaml: &str) {
    let r = k.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert!(
        r.success,
        "kubectl apply:\n{yaml}\n{}{}",
        r.stdout, r.stderr
    );
}

/// `kubectl apply` that the API refuses: its message.
fn refused(k: &Kubectl, yaml: &str) -> String {
    let r = k.run_with_stdin(&["apply", "-f", "-"], yaml);
    assert!(!r.success, "kubectl apply succeeded:\n{yaml}\n{}", r.stdout);
    r.stderr
}

fn exec(k: &Kubectl, pod: &str, cmd: &[&str]) -> Result<String, String> {
    let mut args = vec!["exec", pod, "--"];
    args.extend(cmd);
    let r = k.run(&args);
    if r.success {
        Ok(r.stdout)
    } else {
        Err(format!("{}{}", r.stdout, r.stderr))
    }
}

fn claim(name: &str, size: &str, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("  storageClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n{class}  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n"
    )
}

/// A busybox pod with `claim` at /data running `script`; `node` pins it with a selector.
fn pod(name: &str, claim: &str, script: &str, node: Option<&str>, restart: &str) -> String {
    let selector = node
        .map(|n| format!("  nodeSelector:\n    kubernetes.io/hostname: {n}\n"))
        .unwrap_or_default();
    let script = serde_json::to_string(script).unwrap();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{selector}  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, {script}]\n    volumeMounts:\n    - name: v\n      mountPath: /data\n  volumes:\n  - name: v\n    persistentVolumeClaim:\n      claimName: {claim}\n"
    )
}

fn phase(k: &Kubectl, kind: &str, name: &str) -> String {
    let r = k.run(&["get", kind, name, "-o", "jsonpath={.status.phase}"]);
    if r.success {
        r.stdout
    } else {
        format!("({})", r.stderr.trim())
    }
}

fn wait_phase(k: &Kubectl, kind: &str, name: &str, want: &str) {
    wait_until(&format!("{kind} {name} {want}"), T, || {
        match phase(k, kind, name) {
            p if p == want => Ok(()),
            p => Err(p),
        }
    });
}

/// The events of an object: (reason, message).
fn events(k: &Kubectl, kind: &str, name: &str) -> Vec<(String, String)> {
    let sel = format!("involvedObject.kind={kind},involvedObject.name={name}");
    json(k, &["get", "events", "--field-selector", &sel])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits for an event of `reason` on the object whose message contains `needle`; returns it.
fn wait_event(k: &Kubectl, kind: &str, name: &str, reason: &str, needle: &str) -> String {
    wait_until(&format!("event {reason} on {kind} {name}"), T, || {
        let all = events(k, kind, name);
        all.iter()
            .find(|(r, m)| r == reason && m.contains(needle))
            .map(|(_, m)| m.clone())
            .ok_or_else(|| format!("{all:?}"))
    })
}

/// The PV bound to a claim.
fn volume_of(k: &Kubectl, claim: &str) -> Value {
    let c = json(k, &["get", "pvc", claim]);
    let pv = c["spec"]["volumeName"].as_str().expect("a bound claim");
    json(k, &["get", "pv", pv])
}

/// The node a PV's nodeAffinity names.
fn pv_node(pv: &Value) -> String {
    let terms = &pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"];
    let expr = &terms[0]["matchExpressions"][0];
    assert_eq!(expr["key"], TOPOLOGY_KEY, "{pv}");
    expr["values"][0].as_str().unwrap_or_default().to_string()
}

/// Where the driver keeps a volume's file on a node (its data dir plays /var/lib/kubelet).
fn volume_file(c: &Cluster, node: &str, pv: &Value) -> PathBuf {
    let n = c
        .state()
        .nodes
        .iter()
        .find(|n| n.name == node)
        .expect("a node of the cluster");
    let id = pv["spec"]["csi"]["volumeHandle"].as_str().unwrap();
    n.data_dir
        .join("plugins")
        .join(CSI_DRIVER)
        .join("volumes")
        .join(format!("{id}.img"))
}

/// The host's mounts below a directory.
fn mounts_below(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| std::path::Path::new(p).starts_with(dir))
        .map(str::to_string)
        .collect()
}

#[test]
fn persistent_volumes_through_skiffs_csi_driver() {
    require_images();
    require_image(BUSYBOX_IMAGE);
    require_image(CSI_IMAGE);
    let lease = subnet::lease();
    let name = unique_name("csi");
    let dir = std::env::temp_dir().join(&name);
    let mut spec = Spec::new(&name, 2, &dir, lease.cidr().parse().unwrap(), binaries());
    // The driver's pods reach the API through the `kubernetes` Service.
    spec.own_pod_network(lease.octet());
    spec.csi = true;
    // As `cargo xtask up`: node agents with their own identities (system:node:<name>), so
    // the Node authorizer's rules for claims, volumes, CSINodes and attachments are used.
    spec.tls_bootstrap = true;
    eprintln!("cluster {name} in {}", dir.display());
    let started = Instant::now();
    let mut c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    eprintln!(
        "up with the CSI driver registered in {:.1?}",
        started.elapsed()
    );
    let k = c.kubectl().within(Duration::from_secs(60));
    let nodes: Vec<String> = c.state().nodes.iter().map(|n| n.name.clone()).collect();

    // 1. Registration: CSINode and the topology label, the default class.
    for n in &nodes {
        let csinode = json(&k, &["get", "csinode", n]);
        let d = &csinode["spec"]["drivers"][0];
        assert_eq!(d["name"], CSI_DRIVER, "{csinode}");
        assert_eq!(d["nodeID"], n.as_str(), "{csinode}");
        assert_eq!(d["topologyKeys"][0], TOPOLOGY_KEY, "{csinode}");
        let node = json(&k, &["get", "node", n]);
        assert_eq!(
            node["metadata"]["labels"][TOPOLOGY_KEY],
            n.as_str(),
            "{node}"
        );
    }
    let classes = k.ok(&["get", "storageclass"]);
    assert!(
        classes.contains(&format!("{CSI_STORAGE_CLASS} (default)")),
        "{classes}"
    );

    // 2. WaitForFirstConsumer: Pending until a pod uses it, then bound on the pod's node.
    apply(&k, &claim("data", "64Mi", None));
    let c0 = json(&k, &["get", "pvc", "data"]);
    assert_eq!(c0["spec"]["storageClassName"], CSI_STORAGE_CLASS, "{c0}");
    wait_event(
        &k,
        "PersistentVolumeClaim",
        "data",
        "WaitForFirstConsumer",
        "",
    );
    assert_eq!(phase(&k, "pvc", "data"), "Pending");
    let t0 = Instant::now();
    apply(
        &k,
        &pod(
            "writer",
            "data",
            "echo hello-from-writer > /data/hello && sleep 3600",
            Some(&nodes[0]),
            "Always",
        ),
    );
    wait_phase(&k, "pvc", "data", "Bound");
    wait_phase(&k, "pod", "writer", "Running");
    eprintln!("claim bound and pod Running in {:.1?}", t0.elapsed());
    let pv = volume_of(&k, "data");
    assert_eq!(pv_node(&pv), nodes[0], "{pv}");
    assert_eq!(pv["spec"]["csi"]["driver"], CSI_DRIVER, "{pv}");
    assert_eq!(pv["spec"]["claimRef"]["name"], "data", "{pv}");
    assert_eq!(pv["status"]["phase"], "Bound", "{pv}");
    wait_event(
        &k,
        "PersistentVolumeClaim",
        "data",
        "ProvisioningSucceeded",
        "",
    );
    let hello = wait_until("the writer's file", T, || {
        exec(&k, "writer", &["cat", "/data/hello"])
    });
    assert_eq!(hello.trim(), "hello-from-writer");
    // A real filesystem of its own, not a directory of the node's.
    let mounts = exec(&k, "writer", &["cat", "/proc/mounts"]).unwrap();
    assert!(
        mounts.lines().any(|l| l.contains(" /data ext4 ")),
        "{mounts}"
    );
    let file = volume_file(&c, &nodes[0], &pv);
    assert!(file.exists(), "{} is the volume's file", file.display());
    k.ok(&["delete", "pod", "writer", "--wait=true"]);
    apply(
        &k,
        &pod(
            "reader",
            "data",
            "cat /data/hello && sleep 3600",
            None,
            "Always",
        ),
    );
    wait_phase(&k, "pod", "reader", "Running");
    let reader = json(&k, &["get", "pod", "reader"]);
    assert_eq!(reader["spec"]["nodeName"], nodes[0].as_str(), "{reader}");
    let back = wait_until("the reader's file", T, || {
        exec(&k, "reader", &["cat", "/data/hello"])
    });
    assert_eq!(back.trim(), "hello-from-writer");

    // 3. The node agent restarted: the running pod keeps its volume.
    let uid = reader["metadata"]["uid"].as_str().unwrap().to_string();
    let pod_volumes = c.state().nodes[0]
        .data_dir
        .join("pods")
        .join(&uid)
        .join("volumes");
    let before = mounts_below(&pod_volumes);
    assert!(!before.is_empty(), "the publish mount of {uid}");
    c.restart_agent(0).unwrap();
    wait_until("the node Ready again after the restart", T, || {
        let ready = c.ready_nodes().map_err(|e| e.to_string())?;
        if ready.contains(&nodes[0]) {
            Ok(())
        } else {
            Err(format!("{ready:?}"))
        }
    });
    // Give the new agent a full sync: a later write must still reach the same volume.
    let after_restart = wait_until("the reader writes after the restart", T, || {
        exec(
            &k,
            "reader",
            &[
                "sh",
                "-c",
                "echo after-restart >> /data/hello && cat /data/hello",
            ],
        )
    });
    assert_eq!(after_restart, "hello-from-writer\nafter-restart\n");
    assert_eq!(mounts_below(&pod_volumes), before, "the mounts are kept");
    let reader = json(&k, &["get", "pod", "reader"]);
    assert_eq!(reader["metadata"]["uid"], uid.as_str());
    assert_eq!(
        reader["status"]["containerStatuses"][0]["restartCount"], 0,
        "{reader}"
    );

    // 4. Volume metrics on the node agent.
    let metrics_path = format!("/api/v1/nodes/{}/proxy/metrics", nodes[0]);
    let line = wait_until("kubelet_volume_stats for the claim", T, || {
        let m = k.ok(&["get", "--raw", &metrics_path]);
        m.lines()
            .find(|l| {
                l.starts_with("kubelet_volume_stats_capacity_bytes{")
                    && l.contains("persistentvolumeclaim=\"data\"")
                    && l.contains("namespace=\"default\"")
            })
            .map(str::to_string)
            .ok_or_else(|| "no line yet".to_string())
    });
    let capacity: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(capacity >= 60.0 * 1024.0 * 1024.0, "{line}");

    // 5. A 1 GiB volume: 1,024 MiB fit, the 1,025th does not.
    apply(&k, &claim("gib", "1Gi", None));
    apply(
        &k,
        &pod(
            "filler",
            "gib",
            "dd if=/dev/zero of=/data/f bs=1M count=1025; echo rc=$?; sync; stat -c size=%s /data/f",
            None,
            "Never",
        ),
    );
    wait_phase(&k, "pod", "filler", "Succeeded");
    let log = k.ok(&["logs", "filler"]);
    assert!(log.contains("No space left on device"), "{log}");
    assert!(!log.contains("rc=0"), "{log}");
    let size: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        (1024 << 20..1025 << 20).contains(&size),
        "1,024 MiB written, not the 1,025th: {size} bytes\n{log}"
    );

    // 5b. Expansion: the claim grows, the volume grows (ControllerExpandVolume), the
    // filesystem grows on the node (online where the driver may, else when the pod is
    // restarted: FileSystemResizePending until then), the claim's capacity follows.
    apply(&k, &claim("grow", "64Mi", None));
    apply(&k, &pod("grower", "grow", "sleep 3600", None, "Always"));
    wait_phase(&k, "pod", "grower", "Running");
    k.ok(&[
        "patch",
        "pvc",
        "grow",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}"#,
    ]);
    let capacity_of = |k: &Kubectl| {
        json(k, &["get", "pvc", "grow"])["status"]["capacity"]["storage"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let pending = wait_until("the claim resized or waiting for its node", T, || {
        let c = json(&k, &["get", "pvc", "grow"]);
        let pending = c["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x["type"] == "FileSystemResizePending" && x["status"] == "True");
        match (pending, capacity_of(&k).as_str()) {
            (true, _) => Ok(true),
            (false, "128Mi") => Ok(false),
            (_, other) => Err(format!("capacity {other}: {c}")),
        }
    });
    assert_eq!(
        volume_of(&k, "grow")["spec"]["capacity"]["storage"],
        "128Mi"
    );
    let grower = if pending {
        // Offline: the pod is restarted, the node grows the filesystem at stage.
        k.ok(&["delete", "pod", "grower", "--wait=true"]);
        apply(&k, &pod("grower2", "grow", "sleep 3600", None, "Always"));
        wait_phase(&k, "pod", "grower2", "Running");
        "grower2"
    } else {
        "grower"
    };
    wait_until("the claim's capacity 128Mi", T, || match capacity_of(&k) {
        c if c == "128Mi" => Ok(()),
        c => Err(c),
    });
    let df = exec(&k, grower, &["df", "-k", "/data"]).unwrap();
    let total_kib: u64 = df
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{df}"));
    assert!(total_kib >= 128 * 1024, "{df}");
    if pending {
        wait_event(&k, "Pod", grower, "FileSystemResizeSuccessful", "");
    }

    // 6. A StatefulSet of 3: a claim and a volume each.
    apply(
        &k,
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: busybox
        command: [sh, -c, "hostname > /data/id && sleep 3600"]
        volumeMounts:
        - name: www
          mountPath: /data
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 32Mi
"#,
    );
    e2e::wait_ready(&k, "app=web", 3, Duration::from_secs(240));
    let mut handles = std::collections::BTreeSet::new();
    for i in 0..3 {
        let claim = format!("www-web-{i}");
        assert_eq!(phase(&k, "pvc", &claim), "Bound");
        handles.insert(volume_of(&k, &claim)["spec"]["csi"]["volumeHandle"].to_string());
        let id = wait_until(&format!("web-{i} wrote its id"), T, || {
            exec(&k, &format!("web-{i}"), &["cat", "/data/id"])
        });
        assert_eq!(id.trim(), format!("web-{i}"));
    }
    assert_eq!(handles.len(), 3, "a volume each: {handles:?}");

    // 7. Too large for any node: the driver's reason, the pod Pending naming the claim.
    apply(&k, &claim("huge", "1Ti", None));
    apply(&k, &pod("wants-huge", "huge", "sleep 3600", None, "Always"));
    let failed = wait_event(
        &k,
        "PersistentVolumeClaim",
        "huge",
        "ProvisioningFailed",
        "ResourceExhausted",
    );
    eprintln!("ProvisioningFailed: {failed}");
    let sched = wait_event(&k, "Pod", "wants-huge", "FailedScheduling", "\"huge\"");
    eprintln!("FailedScheduling: {sched}");
    assert_eq!(phase(&k, "pod", "wants-huge"), "Pending");
    assert_eq!(phase(&k, "pvc", "huge"), "Pending");
    let p = json(&k, &["get", "pod", "wants-huge"]);
    assert!(p["spec"]["nodeName"].is_null(), "{p}");

    // 8. Reclaim: Delete removes the data; Retain keeps it, the PV Released.
    k.ok(&["delete", "pod", "reader", "--wait=true"]);
    let pv = volume_of(&k, "data");
    let pv_name = pv["metadata"]["name"].as_str().unwrap().to_string();
    let file = volume_file(&c, &nodes[0], &pv);
    assert!(file.exists(), "{}", file.display());
    k.ok(&["delete", "pvc", "data", "--wait=true"]);
    wait_until("the PV of a deleted claim deleted (Delete)", T, || {
        let r = k.run(&["get", "pv", &pv_name]);
        if r.success {
            Err(r.stdout)
        } else {
            Ok(())
        }
    });
    assert!(!file.exists(), "{} removed with its volume", file.display());

    apply(
        &k,
        &format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: skiff-retain\nprovisioner: {CSI_DRIVER}\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Retain\n"
        ),
    );
    apply(&k, &claim("keep", "16Mi", Some("skiff-retain")));
    apply(
        &k,
        &pod(
            "keeper",
            "keep",
            "echo kept > /data/k && sleep 3600",
            None,
            "Always",
        ),
    );
    wait_phase(&k, "pod", "keeper", "Running");
    let pv = volume_of(&k, "keep");
    let pv_name = pv["metadata"]["name"].as_str().unwrap().to_string();
    let file = volume_file(&c, &pv_node(&pv), &pv);
    k.ok(&["delete", "pod", "keeper", "--wait=true"]);
    k.ok(&["delete", "pvc", "keep", "--wait=true"]);
    wait_phase(&k, "pv", &pv_name, "Released");
    assert!(file.exists(), "Retain keeps {}", file.display());

    // 9. Bad input.
    apply(&k, &claim("nowhere", "1Gi", Some("no-such-class")));
    wait_event(
        &k,
        "PersistentVolumeClaim",
        "nowhere",
        "ProvisioningFailed",
        "storageclass.storage.k8s.io \"no-such-class\" not found",
    );
    let err = refused(
        &k,
        &claim("odd", "1Gi", None).replace("ReadWriteOnce", "ReadWriteSometimes"),
    );
    assert!(
        err.contains("spec.accessModes[0]: Unsupported value: \"ReadWriteSometimes\""),
        "{err}"
    );
    let err = k.fails(&[
        "patch",
        "pvc",
        "gib",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}"#,
    ]);
    assert!(
        err.contains("spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"),
        "{err}"
    );
}
