//! The storage API end to end against a real `control-plane apiserver` process (on both
//! stores), driven by the real kubectl: StorageClass (one marked default), PersistentVolume,
//! CSIDriver, CSINode and VolumeAttachment applied and listed with Kubernetes' columns; a
//! claim without a class gets the default one and the pvc-protection finalizer, a volume the
//! pv-protection one; bad input gets a 422 Invalid Status naming the field; `kubectl explain`
//! reads the volume's schema.

mod api_support;

use serde_json::Value;
use skiff_tests::kubectl::ServerFixture;

/// `kubectl apply` of `yaml` (written to `file`) refused: what kubectl printed.
fn apply_refused(f: &ServerFixture, file: &str, yaml: &str) -> String {
    let p = f.file(file, yaml);
    f.k.fails(&["apply", "-f", &p])
}

fn start() -> ServerFixture {
    let args = api_support::server_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &args)
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The header and first row of a table kubectl printed, split on runs of 2+ spaces.
fn table(out: &str, kind: &str) -> (Vec<String>, Vec<String>) {
    let split = |l: &str| -> Vec<String> {
        l.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut lines = out
        .split("\n\n")
        .find(|block| block.lines().nth(1).is_some_and(|l| l.contains(kind)))
        .unwrap_or_else(|| panic!("no {kind} table in:\n{out}"))
        .lines();
    let header = split(lines.next().unwrap());
    let row = split(lines.next().unwrap());
    (header, row)
}

const OBJECTS: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: csi.skiff.dev
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
parameters:
  fsType: ext4
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-one
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  storageClassName: local
  csi:
    driver: csi.skiff.dev
    volumeHandle: vol-1
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values: [node-1]
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: csi.skiff.dev
spec:
  attachRequired: false
  podInfoOnMount: true
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata:
  name: node-1
spec:
  drivers:
  - name: csi.skiff.dev
    nodeID: node-1
    topologyKeys: [topology.skiff.dev/node]
    allocatable:
      count: 100
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata:
  name: csi-0123
spec:
  attacher: csi.skiff.dev
  nodeName: node-1
  source:
    persistentVolumeName: pv-one
"#;

const CLAIM: &str = "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
";

fn kinds_apply_list_and_protect() {
    let f = start();
    let p = f.file("objects.yaml", OBJECTS);
    f.k.ok(&["apply", "-f", &p]);
    // Applying again is a no-op patch of each (strategic merge for the built-in kinds).
    f.k.ok(&["apply", "-f", &p]);
    // Server-side apply takes them over; a CSINode's drivers merge by name.
    f.k.ok(&["apply", "--server-side", "--force-conflicts", "-f", &p]);
    let second = OBJECTS.replace(
        "    allocatable:\n      count: 100\n",
        "    allocatable:\n      count: 100\n  - name: nfs.skiff.dev\n    nodeID: node-1\n",
    );
    f.k.ok(&[
        "apply",
        "--server-side",
        "-f",
        &f.file("second.yaml", &second),
    ]);
    let node = json(&f.k.ok(&["get", "csinode", "node-1", "-o", "json"]));
    assert_eq!(
        node["spec"]["drivers"][1]["name"], "nfs.skiff.dev",
        "{node}"
    );
    f.k.ok(&["apply", "--server-side", "-f", &p]);
    let node = json(&f.k.ok(&["get", "csinode", "node-1", "-o", "json"]));
    assert_eq!(
        node["spec"]["drivers"].as_array().map(Vec::len),
        Some(1),
        "{node}"
    );

    let out = f.k.ok(&["get", "pv,sc,csidriver,csinode,volumeattachment"]);
    let (h, r) = table(&out, "persistentvolume/pv-one");
    assert_eq!(
        h,
        [
            "NAME",
            "CAPACITY",
            "ACCESS MODES",
            "RECLAIM POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE"
        ]
    );
    assert_eq!(
        &r[..7],
        [
            "persistentvolume/pv-one",
            "1Gi",
            "RWO",
            "Retain",
            "Pending",
            "local",
            "<unset>"
        ],
        "{out}"
    );
    let (h, r) = table(&out, "storageclass.storage.k8s.io/local");
    assert_eq!(
        h,
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ]
    );
    assert_eq!(
        &r[..5],
        [
            "storageclass.storage.k8s.io/local (default)",
            "csi.skiff.dev",
            "Delete",
            "WaitForFirstConsumer",
            "true"
        ]
    );
    let (h, r) = table(&out, "csidriver.storage.k8s.io/csi.skiff.dev");
    assert_eq!(
        h,
        [
            "NAME",
            "ATTACHREQUIRED",
            "PODINFOONMOUNT",
            "STORAGECAPACITY",
            "TOKENREQUESTS",
            "REQUIRESREPUBLISH",
            "MODES",
            "AGE"
        ]
    );
    assert_eq!(
        &r[..7],
        [
            "csidriver.storage.k8s.io/csi.skiff.dev",
            "false",
            "true",
            "false",
            "<unset>",
            "false",
            "Persistent"
        ]
    );
    let (h, r) = table(&out, "csinode.storage.k8s.io/node-1");
    assert_eq!(h, ["NAME", "DRIVERS", "AGE"]);
    assert_eq!(&r[..2], ["csinode.storage.k8s.io/node-1", "1"]);
    let (h, r) = table(&out, "volumeattachment.storage.k8s.io/csi-0123");
    assert_eq!(h, ["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"]);
    assert_eq!(
        &r[..5],
        [
            "volumeattachment.storage.k8s.io/csi-0123",
            "csi.skiff.dev",
            "pv-one",
            "node-1",
            "false"
        ]
    );
    let wide = f.k.ok(&["get", "pv", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap().contains("VOLUMEMODE")
            && wide.lines().nth(1).unwrap().contains("Filesystem"),
        "{wide}"
    );

    // Defaults and the volume's protection.
    let pv = json(&f.k.ok(&["get", "pv", "pv-one", "-o", "json"]));
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
    assert_eq!(pv["status"]["phase"], "Pending");
    assert_eq!(
        pv["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pv-protection"])
    );
    let driver = json(&f.k.ok(&["get", "csidriver", "csi.skiff.dev", "-o", "json"]));
    assert_eq!(driver["spec"]["fsGroupPolicy"], "ReadWriteOnceWithFSType");
    assert_eq!(driver["spec"]["storageCapacity"], false);

    // A claim without a class gets the default one and its protection finalizer; one with
    // an explicit "" keeps it.
    let c = f.file("claim.yaml", CLAIM);
    f.k.ok(&["apply", "-f", &c]);
    let claim = json(&f.k.ok(&["get", "pvc", "data", "-o", "json"]));
    assert_eq!(claim["spec"]["storageClassName"], "local");
    assert_eq!(claim["status"]["phase"], "Pending");
    assert_eq!(
        claim["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pvc-protection"])
    );
    let none = f.file(
        "none.yaml",
        &CLAIM
            .replace("name: data", "name: classless")
            .replace("spec:\n", "spec:\n  storageClassName: \"\"\n"),
    );
    f.k.ok(&["apply", "-f", &none]);
    let claim = json(&f.k.ok(&["get", "pvc", "classless", "-o", "json"]));
    assert_eq!(claim["spec"]["storageClassName"], "");

    // Of two defaults the newest wins.
    f.k.ok(&[
        "create",
        "-f",
        &f.file(
            "newer.yaml",
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: newer\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\nprovisioner: csi.skiff.dev\n",
        ),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    f.k.ok(&[
        "create",
        "-f",
        &f.file(
            "newest.yaml",
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: newest\n  annotations:\n    storageclass.kubernetes.io/is-default-class: \"true\"\nprovisioner: csi.skiff.dev\n",
        ),
    ]);
    f.k.ok(&[
        "apply",
        "-f",
        &f.file("second.yaml", &CLAIM.replace("name: data", "name: second")),
    ]);
    let claim = json(&f.k.ok(&["get", "pvc", "second", "-o", "json"]));
    assert_eq!(claim["spec"]["storageClassName"], "newest");

    // Deleting a protected claim leaves it Terminating until the finalizer goes.
    f.k.ok(&["delete", "pvc", "classless", "--wait=false"]);
    let claim = json(&f.k.ok(&["get", "pvc", "classless", "-o", "json"]));
    assert!(claim["metadata"]["deletionTimestamp"].is_string());
    f.k.ok(&[
        "patch",
        "pvc",
        "classless",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    let gone = f.k.run(&["get", "pvc", "classless"]);
    assert!(!gone.success, "{}", gone.stdout);

    // The volume's schema is served for explain.
    let explained = f.k.ok(&["explain", "pv.spec.csi"]);
    assert!(
        explained.contains("FIELD: csi <CSIPersistentVolumeSource>")
            && explained.contains("volumeHandle"),
        "{explained}"
    );
    let explained = f.k.ok(&["explain", "storageclass.volumeBindingMode"]);
    assert!(
        explained.contains("GROUP:      storage.k8s.io"),
        "{explained}"
    );
}

/// kubectl's message for a 422 Invalid Status; the raw Status checked once.
fn bad_input_is_invalid_with_field_paths() {
    let f = start();
    let pv = |name: &str, spec: &str| {
        format!("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\nspec:\n{spec}")
    };
    let no_capacity = f.file(
        "nocap.yaml",
        &pv(
            "nocap",
            "  accessModes: [ReadWriteOnce]\n  hostPath:\n    path: /data\n",
        ),
    );
    let err = f.k.fails(&["apply", "-f", &no_capacity]);
    assert!(
        err.contains("The PersistentVolume \"nocap\" is invalid: spec.capacity: Required value"),
        "{err}"
    );
    let err = apply_refused(&f, "badmode.yaml",
        &pv(
            "badmode",
            "  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteSometimes]\n  hostPath:\n    path: /data\n",
        ));
    assert!(
        err.contains("spec.accessModes: Unsupported value: \"ReadWriteSometimes\""),
        "{err}"
    );
    let err = apply_refused(&f, "two.yaml",
        &pv(
            "two",
            "  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOncePod, ReadWriteOnce]\n  hostPath:\n    path: /data\n",
        ));
    assert!(
        err.contains(
            "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes"
        ),
        "{err}"
    );

    // On the wire: 422 Unprocessable Entity (kubectl's "is invalid" is reason Invalid).
    let wire = f.k.run(&["create", "-f", &no_capacity, "-v=6"]);
    assert!(!wire.success);
    assert!(
        wire.stderr.contains("422 Unprocessable Entity"),
        "{}",
        wire.stderr
    );

    // A class's parameters never change.
    let sc = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: fast\nprovisioner: csi.skiff.dev\nparameters:\n  type: ssd\n";
    f.k.ok(&["apply", "-f", &f.file("sc.yaml", sc)]);
    let err = apply_refused(&f, "sc2.yaml", &sc.replace("type: ssd", "type: hdd"));
    assert!(
        err.contains("The StorageClass \"fast\" is invalid: parameters: Forbidden: updates to parameters are forbidden."),
        "{err}"
    );

    // A claim's request: the spec is immutable while unbound; bound, it may grow but not
    // shrink to its capacity.
    let claim = CLAIM.replace("spec:\n", "spec:\n  storageClassName: fast\n");
    f.k.ok(&["apply", "-f", &f.file("claim.yaml", &claim)]);
    let err = f.k.fails(&[
        "patch",
        "pvc",
        "data",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]);
    assert!(
        err.contains("spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"),
        "{err}"
    );
    f.k.ok(&[
        "patch",
        "pvc",
        "data",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Bound","accessModes":["ReadWriteOnce"],"capacity":{"storage":"1Gi"}}}"#,
    ]);
    f.k.ok(&[
        "patch",
        "pvc",
        "data",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]);
    let err = f.k.fails(&[
        "patch",
        "pvc",
        "data",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}"#,
    ]);
    assert!(
        err.contains("The PersistentVolumeClaim \"data\" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"),
        "{err}"
    );
    let table = f.k.ok(&["get", "pvc", "data"]);
    assert!(table.contains("Bound") && table.contains("1Gi"), "{table}");

    // An attachment names its node.
    let err = apply_refused(&f, "va.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata:\n  name: va\nspec:\n  attacher: csi.skiff.dev\n  source:\n    persistentVolumeName: pv-one\n");
    assert!(
        err.contains("The VolumeAttachment \"va\" is invalid: spec.nodeName: Required value"),
        "{err}"
    );
    let out = f.k.ok(&["get", "pv,volumeattachments", "-o", "name"]);
    assert!(out.trim().is_empty(), "nothing stored: {out}");
}

on_both_stores!(
    sync: kinds_apply_list_and_protect,
    bad_input_is_invalid_with_field_paths,
);
