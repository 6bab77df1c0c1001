//! EndpointSlices and Endpoints against a real in-process API server, controllers and
//! scheduler in-process, nodes played through the API: slices follow pod readiness and
//! termination, named target ports resolve per pod, slices hold at most the configured
//! number of endpoints and a change rewrites only the slice it touches, and the legacy
//! Endpoints object lists ready and not-ready addresses; all of it goes with the Service.

mod controllers_support;

use std::collections::BTreeMap;
use std::time::Duration;

use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn pod(name: &str, app: &str, port: i32, finalizer: bool) -> Pod {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "echo", "ports": [{"name": "http", "containerPort": port}]}]},
    });
    if finalizer {
        p["metadata"]["finalizers"] = json!(["skiff.test/hold"]);
    }
    serde_json::from_value(p).unwrap()
}

fn service(name: &str, app: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {"selector": {"app": app}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap()
}

async fn running_pods(c: &Cluster, names: &[&str], app: &str, ports: &[i32]) {
    let pods: Api<Pod> = c.api("default");
    for (n, p) in names.iter().zip(ports) {
        pods.create(&PostParams::default(), &pod(n, app, *p, false))
            .await
            .unwrap();
    }
    wait_until_async("pods running", WAIT, || async {
        let ps = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap()
            .items;
        let up = ps
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        (up == names.len()).then_some(()).ok_or(up)
    })
    .await;
}

async fn slices(c: &Cluster, svc: &str) -> Vec<EndpointSlice> {
    let api: Api<EndpointSlice> = c.api("default");
    api.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .unwrap()
        .items
}

/// pod name -> (ready, serving, terminating) over every slice of the Service.
async fn states(c: &Cluster, svc: &str) -> BTreeMap<String, (bool, bool, bool)> {
    let mut out = BTreeMap::new();
    for s in slices(c, svc).await {
        for e in s.endpoints {
            let cond = e.conditions.unwrap_or_default();
            out.insert(
                e.target_ref.and_then(|t| t.name).unwrap_or_default(),
                (
                    cond.ready == Some(true),
                    cond.serving == Some(true),
                    cond.terminating == Some(true),
                ),
            );
        }
    }
    out
}

#[tokio::test]
async fn endpoint_slices_follow_pod_readiness_and_termination() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    running_pods(&c, &["a", "b"], "web", &[8080, 8080]).await;
    let pods: Api<Pod> = c.api("default");
    pods.create(&PostParams::default(), &pod("held", "web", 8080, true))
        .await
        .unwrap();
    let svcs: Api<Service> = c.api("default");
    let svc = svcs
        .create(&PostParams::default(), &service("web", "web"))
        .await
        .unwrap();

    let all_ready: BTreeMap<String, (bool, bool, bool)> = ["a", "b", "held"]
        .iter()
        .map(|n| (n.to_string(), (true, true, false)))
        .collect();
    wait_until_async("3 ready endpoints", WAIT, || async {
        let s = states(&c, "web").await;
        (s == all_ready).then_some(()).ok_or(s)
    })
    .await;
    let slice = &slices(&c, "web").await[0];
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(
        slice.labels()["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(
        slice.labels()["team"],
        "a",
        "the Service's labels are copied"
    );
    assert_eq!(slice.owner_references()[0].uid, svc.uid().unwrap());
    let port = &slice.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port, port.protocol.as_deref()),
        (Some("web"), Some(8080), Some("TCP"))
    );
    for e in &slice.endpoints {
        let node = e.node_name.clone().expect("node name");
        assert!(node.starts_with("node-"));
        assert!(e.zone.as_deref().is_some_and(|z| z.starts_with("zone-")));
    }

    // Readiness lost: not ready, not serving.
    c.nodes().set_ready("default", "a", false).await;
    wait_until_async("a not ready", WAIT, || async {
        let s = states(&c, "web").await;
        (s.get("a") == Some(&(false, false, false)))
            .then_some(())
            .ok_or(s)
    })
    .await;
    let eps: Api<Endpoints> = c.api("default");
    let ep = wait_until_async("Endpoints with 2 ready, 1 not", WAIT, || async {
        let ep = eps.get_opt("web").await.unwrap().ok_or("missing")?;
        let subset = ep
            .subsets
            .clone()
            .unwrap_or_default()
            .into_iter()
            .next()
            .ok_or("no subset")?;
        let ready = subset.addresses.as_ref().map_or(0, Vec::len);
        let not_ready = subset.not_ready_addresses.as_ref().map_or(0, Vec::len);
        ((ready, not_ready) == (2, 1))
            .then_some(ep.clone())
            .ok_or("counts")
    })
    .await;
    let subset = &ep.subsets.unwrap()[0];
    assert_eq!(subset.ports.as_ref().unwrap()[0].port, 8080);

    // Terminating (held by a finalizer): serving, not ready, terminating; gone from Endpoints.
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    wait_until_async("held terminating", WAIT, || async {
        let s = states(&c, "web").await;
        (s.get("held") == Some(&(false, true, true)))
            .then_some(())
            .ok_or(s)
    })
    .await;
    wait_until_async("held out of Endpoints", WAIT, || async {
        let ep = eps.get("web").await.unwrap();
        let n: usize = ep
            .subsets
            .unwrap_or_default()
            .iter()
            .map(|s| {
                s.addresses.as_ref().map_or(0, Vec::len)
                    + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
            })
            .sum();
        (n == 2).then_some(()).ok_or(n)
    })
    .await;
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_until_async("held gone from the slices", WAIT, || async {
        let s = states(&c, "web").await;
        (!s.contains_key("held") && s.len() == 2)
            .then_some(())
            .ok_or(s)
    })
    .await;

    // The Service goes: its slices (garbage collector) and Endpoints (controller) go too.
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    wait_until_async("slices and Endpoints gone", WAIT, || async {
        let n = slices(&c, "web").await.len();
        let ep = eps.get_opt("web").await.unwrap().is_some();
        (n == 0 && !ep).then_some(()).ok_or((n, ep))
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn named_target_ports_resolve_per_pod() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    running_pods(&c, &["v1", "v2"], "mixed", &[8080, 9090]).await;
    let svcs: Api<Service> = c.api("default");
    svcs.create(&PostParams::default(), &service("mixed", "mixed"))
        .await
        .unwrap();
    let got = wait_until_async("two slices, one per port", WAIT, || async {
        let ss = slices(&c, "mixed").await;
        let mut by_port: Vec<(i32, Vec<String>)> = ss
            .iter()
            .map(|s| {
                (
                    s.ports
                        .as_ref()
                        .and_then(|p| p.first())
                        .and_then(|p| p.port)
                        .unwrap_or(0),
                    s.endpoints
                        .iter()
                        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
                        .collect(),
                )
            })
            .collect();
        by_port.sort();
        (by_port.len() == 2 && by_port.iter().all(|(_, e)| e.len() == 1))
            .then_some(by_port.clone())
            .ok_or(by_port)
    })
    .await;
    assert_eq!(
        got,
        vec![
            (8080, vec!["v1".to_string()]),
            (9090, vec!["v2".to_string()])
        ]
    );
    c.shutdown().await;
}

#[tokio::test]
async fn slices_hold_at_most_the_maximum_and_a_change_rewrites_one_slice() {
    let mut settings = fast_settings();
    settings.max_endpoints_per_slice = 10;
    let c = Cluster::start(settings, &["node-1", "node-2"]).await;
    let names: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    running_pods(&c, &refs, "many", &[8080; 25]).await;
    let svcs: Api<Service> = c.api("default");
    svcs.create(&PostParams::default(), &service("many", "many"))
        .await
        .unwrap();
    let before = wait_until_async("25 ready endpoints in 3 slices", WAIT, || async {
        let ss = slices(&c, "many").await;
        let ready = states(&c, "many").await.values().filter(|s| s.0).count();
        (ss.len() == 3 && ready == 25)
            .then_some(ss.clone())
            .ok_or((ss.len(), ready))
    })
    .await;
    assert!(before.iter().all(|s| s.endpoints.len() <= 10));
    let versions: BTreeMap<String, String> = before
        .iter()
        .map(|s| (s.name_any(), s.resource_version().unwrap()))
        .collect();
    c.nodes().set_ready("default", "p07", false).await;
    wait_until_async("p07 not ready", WAIT, || async {
        let s = states(&c, "many").await;
        (s.get("p07").map(|x| x.0) == Some(false))
            .then_some(())
            .ok_or(s.get("p07").cloned())
    })
    .await;
    let after = slices(&c, "many").await;
    let changed: Vec<String> = after
        .iter()
        .filter(|s| versions.get(&s.name_any()) != s.resource_version().as_ref())
        .map(|s| s.name_any())
        .collect();
    assert_eq!(
        changed.len(),
        1,
        "only the slice holding p07 was rewritten: {changed:?}"
    );
    assert_eq!(after.len(), 3);
    c.shutdown().await;
}
