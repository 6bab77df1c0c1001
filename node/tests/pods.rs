//! The pod worker against a real containerd with the real images: each test drives workers
//! with Pod objects directly and watches the statuses and events they report.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::ByteString;
use serde_json::json;
use skiff_tests::registry::ECHO_IMAGE;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn echo_pod_runs_answers_on_its_ip_and_reports_events_in_order() {
    let node = TestNode::start("echo").await;
    let p = pod(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{
            "name": "echo", "image": ECHO_IMAGE,
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
            ]
        }]}
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "Running and Ready", T, |s| {
        phase(s) == "Running" && condition(s, "Ready")
    });
    let ip = s.pod_ip.clone().expect("a pod IP");
    let cidr: node::cni::Cidr = node.rt.subnet.cidr().parse().unwrap();
    assert!(
        cidr.contains(ip.parse().unwrap()),
        "{ip} in the node's pod CIDR {cidr}"
    );
    let body =
        skiff_tests::wait_until_async("echo answers", T, || http_get_owned(format!("{ip}:8080")))
            .await;
    // The echo image may add ` client=<the address the pod saw>` (the test's own).
    let expected = format!("pod=web namespace=default ip={ip} node={}", node.rt.node);
    assert!(body.starts_with(&expected), "{body}");
    let c = container(&s, "echo").unwrap();
    assert!(c.image_id.contains("sha256:"), "imageID {}", c.image_id);
    assert_eq!(c.restart_count, 0);
    assert_eq!(
        node.reasons(&uid(&p)),
        ["Pulling", "Pulled", "Created", "Started"]
    );
    assert!(s.start_time.is_some() && s.host_ip.as_deref() == Some("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_containers_share_localhost_and_an_init_container_runs_first() {
    let node = TestNode::start("shared").await;
    let p = pod(json!({
        "metadata": {"name": "pair"},
        "spec": {
            "volumes": [{"name": "work", "emptyDir": {}}],
            "initContainers": [{
                "name": "setup", "image": ECHO_IMAGE, "imagePullPolicy": "IfNotPresent",
                "args": ["write", "/work/setup", "init ran"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}]
            }],
            "containers": [
                {"name": "server", "image": ECHO_IMAGE, "env": [{"name": "POD_NAME", "value": "pair"}],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                {"name": "client", "image": ECHO_IMAGE, "env": [{"name": "PORT", "value": "8081"}]}
            ]
        }
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "both running", T, |s| {
        phase(s) == "Running" && condition(s, "Ready")
    });
    assert!(condition(&s, "Initialized"));
    let init = &s.init_container_statuses.as_ref().unwrap()[0];
    let t = init
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .expect("init terminated");
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    let (code, out) = exec(&node, &s, "server", &["/echo", "cat", "/work/setup"]).await;
    assert_eq!((code, out.as_str()), (0, "init ran"));
    let (code, out) = exec(
        &node,
        &s,
        "client",
        &["/echo", "fetch", "http://127.0.0.1:8080/"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("pod=pair "), "{out}");
    let reasons = node.reasons(&uid(&p));
    let first_app_start = reasons
        .iter()
        .enumerate()
        .filter(|(_, r)| *r == "Started")
        .nth(1)
        .unwrap()
        .0;
    let events = node.events(&uid(&p));
    assert_eq!(
        events
            .iter()
            .find(|e| e.reason.as_str() == "Started")
            .unwrap()
            .field_path
            .as_deref(),
        Some("spec.initContainers{setup}")
    );
    assert!(first_app_start > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_liveness_probe_restarts_with_back_off() {
    let node = TestNode::start("live").await;
    let p = pod(json!({
        "metadata": {"name": "sick"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "echo", "image": ECHO_IMAGE,
            "livenessProbe": {"httpGet": {"path": "/env/NOT_SET", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}
        }]}
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "two restarts", Duration::from_secs(60), |s| {
        container(s, "echo").is_some_and(|c| c.restart_count >= 2)
    });
    let last = container(&s, "echo").unwrap().last_state.clone().unwrap();
    assert!(
        last.terminated.is_some(),
        "lastState records the killed attempt"
    );
    let reasons = node.reasons(&uid(&p));
    assert!(reasons.iter().any(|r| r == "Unhealthy"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "Killing"), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r == "BackOff"),
        "the second restart backs off: {reasons:?}"
    );
    // The probe reaches the server and gets its 404 (early ones may find it not listening yet).
    let events = node.events(&uid(&p));
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_str() == "Unhealthy" && e.message.contains("statuscode: 404")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_probe_gates_the_ready_condition() {
    let node = TestNode::start("ready").await;
    let p = pod(json!({
        "metadata": {"name": "gate"},
        "spec": {"containers": [{
            "name": "echo", "image": ECHO_IMAGE, "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1}
        }]}
    }));
    let _h = node.spawn(&p);
    let u = uid(&p);
    let s = node.wait_status(&u, "Ready", T, |s| condition(s, "Ready"));
    let ip = s.pod_ip.clone().unwrap();
    http_get(&format!("{ip}:8080"), "/control/unready")
        .await
        .unwrap();
    let s = node.wait_status(&u, "not Ready", T, |s| !condition(s, "Ready"));
    assert_eq!(phase(&s), "Running", "unready is still running");
    assert!(!container(&s, "echo").unwrap().ready);
    http_get(&format!("{ip}:8080"), "/control/ready")
        .await
        .unwrap();
    node.wait_status(&u, "Ready again", T, |s| {
        condition(s, "Ready") && condition(s, "ContainersReady")
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_startup_probe_holds_back_the_other_probes_and_restarts_when_it_fails() {
    let node = TestNode::start("startup").await;
    // Readiness and liveness would fail (404) and say so in Events, but they run only once the
    // startup probe has passed, and that one probes a port nothing listens on.
    let never = pod(json!({
        "metadata": {"name": "never-started"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "echo", "image": ECHO_IMAGE,
            "startupProbe": {"tcpSocket": {"port": 9999}, "periodSeconds": 1, "failureThreshold": 2},
            "readinessProbe": {"httpGet": {"path": "/env/NOT_SET", "port": 8080}, "periodSeconds": 1},
            "livenessProbe": {"httpGet": {"path": "/env/NOT_SET", "port": 8080}, "periodSeconds": 1}
        }]}
    }));
    // The same with a startup probe that passes once the server listens.
    let started = pod(json!({
        "metadata": {"name": "started"},
        "spec": {"containers": [{
            "name": "echo", "image": ECHO_IMAGE,
            "startupProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1, "failureThreshold": 30},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1}
        }]}
    }));
    let _a = node.spawn(&never);
    let _b = node.spawn(&started);

    let s = node.wait_status(&uid(&started), "started and Ready", T, |s| {
        condition(s, "Ready")
    });
    let c = container(&s, "echo").unwrap();
    assert_eq!((c.started, c.ready, c.restart_count), (Some(true), true, 0));

    let s = node.wait_status(&uid(&never), "restarted by its startup probe", T, |s| {
        container(s, "echo").is_some_and(|c| c.restart_count >= 1)
    });
    let c = container(&s, "echo").unwrap();
    assert_ne!(c.started, Some(true), "{c:?}");
    assert!(
        !c.ready && !condition(&s, "Ready"),
        "readiness never ran: {c:?}"
    );
    let events = node.events(&uid(&never));
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_str() == "Unhealthy"
                && e.message.starts_with("Startup probe failed")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.reason.as_str() == "Killing"
            && e.message
                .contains("failed startup probe, will be restarted")),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e.message.starts_with("Readiness") || e.message.starts_with("Liveness")),
        "only the startup probe ran: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_port_forwards_the_nodes_port_to_the_pod() {
    let node = TestNode::start("hostport").await;
    // A port of this test's own (tests run in parallel on one host).
    let host_port = 20000 + (std::process::id() % 10000) as u16;
    let p = pod(json!({
        "metadata": {"name": "hp"},
        "spec": {"containers": [{
            "name": "echo", "image": ECHO_IMAGE,
            "env": [{"name": "POD_NAME", "value": "hp"}],
            "ports": [{"containerPort": 8080, "hostPort": host_port}]
        }]}
    }));
    let _h = node.spawn(&p);
    node.wait_status(&uid(&p), "Running", T, |s| phase(s) == "Running");
    // The node's address on the pod network (the bridge's): the connection is DNATed to the
    // pod by the portmap plugin's rules.
    let cidr: node::cni::Cidr = node.rt.subnet.cidr().parse().unwrap();
    let addr = format!("{}:{host_port}", cidr.gateway());
    let body = skiff_tests::wait_until_async("the host port answers", T, || {
        let addr = addr.clone();
        async move { http_get(&addr, "/").await }
    })
    .await;
    assert!(body.starts_with("pod=hp "), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit_gone_with_the_pod() {
    let node = TestNode::start("tmpfs").await;
    let mount = json!([{"name": "scratch", "mountPath": "/scratch"}]);
    let p = pod(json!({
        "metadata": {"name": "mem"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "2Mi"}}],
            "initContainers": [{"name": "w", "image": ECHO_IMAGE, "volumeMounts": mount,
                "command": ["/echo", "write", "/scratch/f", "hello"]}],
            "containers": [{"name": "echo", "image": ECHO_IMAGE, "volumeMounts": mount}]}
    }));
    let h = node.spawn(&p);
    node.wait_status(&uid(&p), "Running", T, |s| phase(s) == "Running");

    let dir = node
        .rt
        .layout
        .pod_dir(&uid(&p))
        .join("volumes/empty-dir/scratch");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == dir.to_str())
        .unwrap_or_else(|| panic!("{} is not a mount point", dir.display()));
    let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
    assert_eq!(fstype, Some("tmpfs"), "{line}");
    let st = nix::sys::statvfs::statvfs(&dir).unwrap();
    assert_eq!(
        st.blocks() as u64 * st.fragment_size() as u64,
        2 << 20,
        "sizeLimit is the tmpfs size"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("f")).unwrap(),
        "hello",
        "what the init container wrote is there for the app container"
    );

    let mut deleted = p.clone();
    deleted.metadata.deletion_timestamp = Some(node::pod::now());
    h.pod.send_replace(deleted);
    node.wait_terminated(&uid(&p), "the pod removed", T);
    skiff_tests::wait_until("the tmpfs unmounted and the pod dir gone", T, || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounted = info.lines().any(|l| l.split(' ').nth(4) == dir.to_str());
        let exists = node.rt.layout.pod_dir(&uid(&p)).exists();
        (!mounted && !exists).then_some(()).ok_or((mounted, exists))
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_image_ends_in_image_pull_back_off_with_the_error_in_an_event() {
    let node = TestNode::start("badimg").await;
    let p = pod(json!({
        "metadata": {"name": "bad"},
        "spec": {"containers": [{"name": "c", "image": "127.0.0.1:5000/skiff/does-not-exist:v1"}]}
    }));
    let _h = node.spawn(&p);
    let u = uid(&p);
    node.wait_status(&u, "ErrImagePull", T, |s| {
        waiting_reason(s, "c").as_deref() == Some("ErrImagePull")
    });
    let s = node.wait_status(&u, "ImagePullBackOff", T, |s| {
        waiting_reason(s, "c").as_deref() == Some("ImagePullBackOff")
    });
    assert_eq!(phase(&s), "Pending");
    let failed = node
        .events(&u)
        .into_iter()
        .find(|e| e.reason.as_str() == "Failed")
        .expect("a Failed event");
    assert!(
        failed.message.contains("does-not-exist") && failed.message.contains("not found"),
        "{}",
        failed.message
    );
    assert!(node.reasons(&u).iter().any(|r| r == "BackOff"));
}

#[tokio::test(flavor = "multi_thread")]
async fn config_maps_and_secrets_reach_files_and_env() {
    let node = TestNode::start("config").await;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"greeting": "hello", "mode": "fast"}})).unwrap();
    let mut secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "creds", "namespace": "default"}}))
            .unwrap();
    secret.data = Some([("password".to_string(), ByteString(b"s3cret".to_vec()))].into());
    node.objects
        .config_maps
        .lock()
        .unwrap()
        .insert(("default".into(), "cfg".into()), cm);
    node.objects
        .secrets
        .lock()
        .unwrap()
        .insert(("default".into(), "creds".into()), secret);
    let p = pod(json!({
        "metadata": {"name": "configured", "labels": {"app": "demo"}},
        "spec": {
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "creds", "secret": {"secretName": "creds", "items": [{"key": "password", "path": "db/pw"}]}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels['app']"}}]}}
            ],
            "containers": [{
                "name": "c", "image": ECHO_IMAGE,
                "securityContext": {"readOnlyRootFilesystem": true},
                "readinessProbe": {"exec": {"command": ["/echo", "exists", "/etc/creds/db/pw"]}, "periodSeconds": 1},
                "env": [
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "COMBINED", "value": "$(GREETING)-world"}
                ],
                "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": true},
                    {"name": "creds", "mountPath": "/etc/creds", "readOnly": true},
                    {"name": "info", "mountPath": "/etc/info"}
                ]
            }]
        }
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "Ready (exec probe)", T, |s| condition(s, "Ready"));
    let (_, out) = exec(
        &node,
        &s,
        "c",
        &[
            "/echo",
            "cat",
            "/etc/cfg/greeting",
            "/etc/creds/db/pw",
            "/etc/info/labels",
        ],
    )
    .await;
    assert_eq!(out, "hellos3cretdemo");
    let (_, env) = exec(&node, &s, "c", &["/echo", "env"]).await;
    for line in [
        "GREETING=hello",
        "PASSWORD=s3cret",
        "COMBINED=hello-world",
        "CFG_mode=fast",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} in {env}");
    }
    let (code, _) = exec(&node, &s, "c", &["/echo", "write", "/tmp/x", "y"]).await;
    assert_ne!(code, 0, "the root filesystem is read-only");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projected_token_is_renewed_in_place_and_services_become_variables() {
    let node = TestNode::start("projected").await;
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "PEM"}}),
    )
    .unwrap();
    node.objects
        .config_maps
        .lock()
        .unwrap()
        .insert(("default".into(), "kube-root-ca.crt".into()), cm);
    for (ns, name, ip, port) in [
        ("default", "kubernetes", "10.96.0.1", 443),
        ("default", "web-front", "10.96.0.20", 8080),
        ("other", "elsewhere", "10.96.0.30", 80),
    ] {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}
        }))
        .unwrap();
        node.objects
            .services
            .lock()
            .unwrap()
            .insert((ns.into(), name.into()), svc);
    }
    // The API's minimum life is 600 s; the test's fake TokenRequest honours 2 s, so the
    // renewal (at 80%) happens while the test watches, in a running container.
    let p = pod(json!({
        "metadata": {"name": "sa-user"},
        "spec": {
            "serviceAccountName": "robot",
            "volumes": [{"name": "api", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 2}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
            ]}}],
            "containers": [{
                "name": "c", "image": ECHO_IMAGE,
                "env": [{"name": "WEB_FRONT_SERVICE_HOST", "value": "mine"}],
                "volumeMounts": [{"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            }]
        }
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "Running", T, |s| phase(s) == "Running");
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let (_, out) = exec(
        &node,
        &s,
        "c",
        &[
            "/echo",
            "cat",
            &format!("{dir}/ca.crt"),
            &format!("{dir}/namespace"),
        ],
    )
    .await;
    assert_eq!(out, "PEMdefault");
    let (_, first) = exec(&node, &s, "c", &["/echo", "cat", &format!("{dir}/token")]).await;
    assert!(first.ends_with("-default-robot"), "{first}");
    let request = node.objects.token_requests.lock().unwrap()[0].clone();
    let bound = request.spec.bound_object_ref.unwrap();
    assert_eq!(
        (bound.kind.as_deref(), bound.uid),
        (Some("Pod"), p.metadata.uid.clone())
    );
    let (code, _) = exec(
        &node,
        &s,
        "c",
        &["/echo", "write", &format!("{dir}/token"), "x"],
    )
    .await;
    assert_ne!(code, 0, "a projected volume is read-only");

    // Renewed in place: the same container reads a new token.
    let mut renewed = String::new();
    for _ in 0..60 {
        let (_, now) = exec(&node, &s, "c", &["/echo", "cat", &format!("{dir}/token")]).await;
        if now != first && !now.is_empty() {
            renewed = now;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        renewed.ends_with("-default-robot"),
        "the token was renewed: {renewed:?}"
    );
    let still = node.status(&uid(&p)).expect("a status");
    assert_eq!(phase(&still), "Running", "renewal does not restart the pod");

    let (_, env) = exec(&node, &s, "c", &["/echo", "env"]).await;
    for line in [
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
        "WEB_FRONT_SERVICE_HOST=mine",
        "WEB_FRONT_PORT_8080_TCP=tcp://10.96.0.20:8080",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} in {env}");
    }
    assert!(
        !env.contains("ELSEWHERE_"),
        "another namespace's service: {env}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_config_map_gives_failed_mount_until_it_appears() {
    let node = TestNode::start("mount").await;
    let p = pod(json!({
        "metadata": {"name": "waits"},
        "spec": {"volumes": [{"name": "cfg", "configMap": {"name": "later"}}],
                 "containers": [{"name": "c", "image": ECHO_IMAGE, "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}
    }));
    let _h = node.spawn(&p);
    let u = uid(&p);
    skiff_tests::wait_until("FailedMount", T, || {
        let e = node.events(&u);
        e.iter()
            .find(|e| e.reason.as_str() == "FailedMount")
            .cloned()
            .ok_or(e)
    });
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "later"}, "data": {"k": "v"}})).unwrap();
    node.objects
        .config_maps
        .lock()
        .unwrap()
        .insert(("default".into(), "later".into()), cm);
    node.wait_status(&u, "Running once the ConfigMap exists", T, |s| {
        phase(s) == "Running"
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn exceeding_the_memory_limit_ends_as_oom_killed() {
    let node = TestNode::start("oom").await;
    // The server allocates only once asked, when the container is surely running: a
    // process killed while its start is still in flight is reported by containerd as a
    // plain Error (its OOM watch on the cgroup begins with the start), as in Kubernetes.
    let p = pod(json!({
        "metadata": {"name": "hog"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": ECHO_IMAGE,
            "resources": {"limits": {"memory": "32Mi"}}
        }]}
    }));
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "Running", T, |s| phase(s) == "Running");
    let ip = s.pod_ip.clone().expect("a pod IP");
    skiff_tests::wait_until_async("echo answers", T, || http_get_owned(format!("{ip}:8080"))).await;
    // The answer never comes: the allocation kills the server.
    let refused = http_get(&format!("{ip}:8080"), "/control/alloc/256").await;
    assert!(
        refused.is_err(),
        "a 32Mi container held 256 MiB: {refused:?}"
    );
    let s = node.wait_status(&uid(&p), "Failed", T, |s| phase(s) == "Failed");
    let t = container(&s, "c")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(t.reason.as_deref(), Some("OOMKilled"), "{t:?}");
    assert_eq!(t.exit_code, 137);
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_policy_never_and_on_failure() {
    let node = TestNode::start("policy").await;
    let done = pod(
        json!({"metadata": {"name": "job"}, "spec": {"restartPolicy": "OnFailure",
        "containers": [{"name": "c", "image": ECHO_IMAGE, "args": ["exit", "0"]}]}}),
    );
    let failing = pod(
        json!({"metadata": {"name": "retry"}, "spec": {"restartPolicy": "OnFailure",
        "containers": [{"name": "c", "image": ECHO_IMAGE, "args": ["exit", "3"]}]}}),
    );
    let _a = node.spawn(&done);
    let _b = node.spawn(&failing);
    let s = node.wait_status(&uid(&done), "Succeeded", T, |s| phase(s) == "Succeeded");
    assert_eq!(container(&s, "c").unwrap().restart_count, 0);
    let s = node.wait_status(&uid(&failing), "restarted", T, |s| {
        container(s, "c").is_some_and(|c| c.restart_count >= 2)
    });
    let last = container(&s, "c")
        .unwrap()
        .last_state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_worker_adopts_running_containers() {
    let node = TestNode::start("adopt").await;
    let p = pod(
        json!({"metadata": {"name": "keeper"}, "spec": {"containers": [{"name": "c", "image": ECHO_IMAGE}]}}),
    );
    let u = uid(&p);
    let h = node.spawn(&p);
    let before = node.wait_status(&u, "Running", T, |s| {
        phase(s) == "Running" && condition(s, "Ready")
    });
    // The agent dies: its worker is gone, the runtime keeps running.
    h.task.abort();
    let _ = h.task.await;
    node.collector.statuses.lock().unwrap().clear();
    let events_before = node.events(&u).len();
    let mut adopted = p.clone();
    adopted.status = Some(before.clone());
    let _h = node.spawn(&adopted);
    let after = node.wait_status(&u, "reported again", T, |s| {
        phase(s) == "Running" && condition(s, "Ready")
    });
    let id =
        |s: &k8s_openapi::api::core::v1::PodStatus| container(s, "c").unwrap().container_id.clone();
    assert_eq!(id(&after), id(&before), "same container");
    assert_eq!(after.pod_ip, before.pod_ip);
    assert_eq!(after.start_time, before.start_time);
    assert_eq!(container(&after, "c").unwrap().restart_count, 0);
    assert_eq!(
        node.events(&u).len(),
        events_before,
        "nothing was created or started again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deletion_stops_within_the_grace_period_and_removes_everything() {
    let node = TestNode::start("delete").await;
    let stubborn = pod(
        json!({"metadata": {"name": "stubborn"}, "spec": {"terminationGracePeriodSeconds": 2,
        "containers": [{"name": "c", "image": ECHO_IMAGE, "env": [{"name": "IGNORE_SIGTERM", "value": "1"}]}]}}),
    );
    // The polite one also runs a preStop hook that leaves a mark in a hostPath volume.
    let host_dir = tempfile::tempdir().unwrap();
    let mark = host_dir.path().join("hooks");
    let polite = pod(
        json!({"metadata": {"name": "polite"}, "spec": {"terminationGracePeriodSeconds": 30,
        "volumes": [{"name": "host", "hostPath": {"path": mark, "type": "DirectoryOrCreate"}}],
        "containers": [{"name": "c", "image": ECHO_IMAGE,
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            "lifecycle": {"preStop": {"exec": {"command": ["/echo", "write", "/host/prestop", "ran"]}}}}]}}),
    );
    let hs = node.spawn(&stubborn);
    let hp = node.spawn(&polite);
    for p in [&stubborn, &polite] {
        node.wait_status(&uid(p), "Running", T, |s| phase(s) == "Running");
    }
    for (h, p) in [(&hs, &stubborn), (&hp, &polite)] {
        let mut deleted = p.clone();
        deleted.metadata.deletion_timestamp = Some(node::pod::now());
        h.pod.send_replace(deleted);
    }
    node.wait_terminated(&uid(&polite), "polite pod terminated", T);
    node.wait_terminated(&uid(&stubborn), "stubborn pod terminated", T);
    // The stubborn one ignored SIGTERM and was SIGKILLed after its grace period; the polite
    // one exited on SIGTERM.
    let exit = |p: &k8s_openapi::api::core::v1::Pod| {
        let s = node.status(&uid(p)).unwrap();
        container(&s, "c")
            .unwrap()
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap()
            .exit_code
    };
    assert_eq!(exit(&stubborn), 137);
    assert_eq!(exit(&polite), 0);
    assert_eq!(
        std::fs::read_to_string(mark.join("prestop")).unwrap(),
        "ran",
        "the preStop hook ran first"
    );
    let left = node
        .rt
        .cri
        .list_pod_sandboxes(Default::default())
        .await
        .unwrap();
    assert!(left.is_empty(), "no sandbox left: {left:?}");
    assert!(!node.rt.layout.pod_dir(&uid(&polite)).exists());
    assert!(node.reasons(&uid(&stubborn)).iter().any(|r| r == "Killing"));
}

#[tokio::test(flavor = "multi_thread")]
async fn host_network_pods_use_the_node_address() {
    let node = TestNode::start("hostnet").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = pod(
        json!({"metadata": {"name": "hostnet"}, "spec": {"hostNetwork": true,
        "containers": [{"name": "c", "image": ECHO_IMAGE, "env": [{"name": "PORT", "value": port.to_string()}, {"name": "POD_NAME", "value": "hostnet"}],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}}),
    );
    let _h = node.spawn(&p);
    let s = node.wait_status(&uid(&p), "Ready", T, |s| condition(s, "Ready"));
    assert_eq!(s.pod_ip.as_deref(), Some("127.0.0.1"));
    let body = http_get(&format!("127.0.0.1:{port}"), "/").await.unwrap();
    assert!(body.starts_with("pod=hostnet"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pods_resolv_conf_follows_its_dns_policy() {
    use node::pod::dns::{DnsSettings, ResolvConf};
    let dns = DnsSettings {
        cluster_dns: vec!["10.96.0.10".parse().unwrap()],
        cluster_domain: "cluster.local".into(),
        host: ResolvConf::parse("nameserver 192.0.2.53\nsearch corp.example\n"),
    };
    let node = TestNode::start_with_dns("resolv", dns).await;
    let cluster_first = pod(json!({
        "metadata": {"name": "cf", "namespace": "shop"},
        "spec": {"containers": [{"name": "echo", "image": ECHO_IMAGE}]}
    }));
    let none = pod(json!({
        "metadata": {"name": "none"},
        "spec": {"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["192.0.2.1"], "searches": ["a.example"],
            "options": [{"name": "ndots", "value": "2"}]},
            "containers": [{"name": "echo", "image": ECHO_IMAGE}]}
    }));
    let _h1 = node.spawn(&cluster_first);
    let _h2 = node.spawn(&none);
    let read = |p: &k8s_openapi::api::core::v1::Pod| {
        let s = node.wait_status(&uid(p), "Running", T, |s| phase(s) == "Running");
        let node = &node;
        async move {
            let (code, out) = exec(node, &s, "echo", &["/echo", "cat", "/etc/resolv.conf"]).await;
            assert_eq!(code, 0, "{out}");
            out
        }
    };
    let conf = ResolvConf::parse(&read(&cluster_first).await);
    assert_eq!(
        conf,
        ResolvConf {
            nameservers: vec!["10.96.0.10".into()],
            searches: [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
            .map(String::from)
            .to_vec(),
            options: vec!["ndots:5".into()],
        }
    );
    let conf = ResolvConf::parse(&read(&none).await);
    assert_eq!(
        conf,
        ResolvConf {
            nameservers: vec!["192.0.2.1".into()],
            searches: vec!["a.example".into()],
            options: vec!["ndots:2".into()],
        }
    );
}
