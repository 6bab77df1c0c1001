//! Several API server processes on one etcd are one cluster: Services created concurrently
//! through two `control-plane apiserver` processes never share a ClusterIP or a NodePort
//! (the allocations are claims in the store, not per-process bitmaps). The ranges are kept
//! small so that the servers' candidates collide and the store has to refuse some.

mod controllers_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use controllers_support::Process;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

/// A `control-plane apiserver` process on the shared etcd under `prefix`, with its own data
/// directory under `dir`; once a client reaches it: the process and the client.
async fn start_apiserver(dir: &Path, name: &str, prefix: &str) -> (Process, kube::Client) {
    let data = dir.join(name);
    let kubeconfig: PathBuf = data.join("admin.kubeconfig");
    let store = format!(
        "etcd://{}",
        skiff_tests::etcd::shared().endpoints().join(",")
    );
    let args = [
        "apiserver",
        "--data-dir",
        data.to_str().unwrap(),
        "--store",
        &store,
        "--etcd-prefix",
        prefix,
        "--etcd-compaction-interval",
        "0",
        "--listen",
        "127.0.0.1:0",
        "--write-kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--service-cluster-ip-range",
        "10.96.0.0/25",
        "--service-node-port-range",
        "30000-30149",
    ];
    std::fs::create_dir_all(&data).unwrap();
    let process = Process::spawn(&args, &dir.join(format!("{name}.log")));
    let client = wait_until_async(&format!("a client of {name}"), WAIT, || async {
        let c = control_plane::runtime::client::from_kubeconfig(&kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        let services: Api<Service> = Api::namespaced(c.clone(), "default");
        services
            .get("kubernetes")
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(c)
    })
    .await;
    (process, client)
}

fn node_port_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_created_through_two_api_servers_never_share_an_address_or_port() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = skiff_tests::etcd::unique_prefix();
    let (one, c1) = start_apiserver(dir.path(), "one", &prefix).await;
    let (two, c2) = start_apiserver(dir.path(), "two", &prefix).await;

    // 8 writers per server, 60 Services per server: 120 of the 125 addresses to hand out
    // and 120 of the 150 ports, so candidates picked from stale bitmaps collide.
    const WRITERS: usize = 8;
    const PER_SERVER: usize = 60;
    let mut tasks = Vec::new();
    for (s, client) in [&c1, &c2].into_iter().enumerate() {
        for w in 0..WRITERS {
            let services: Api<Service> = Api::namespaced(client.clone(), "default");
            tasks.push(tokio::spawn(async move {
                let mut made = Vec::new();
                for i in (w..PER_SERVER).step_by(WRITERS) {
                    let name = format!("s{s}-{i:03}");
                    let created = services
                        .create(&PostParams::default(), &node_port_service(&name))
                        .await
                        .map_err(|e| format!("{name}: {e}"))?;
                    made.push(created);
                }
                Ok::<_, String>(made)
            }));
        }
    }
    let mut answered = Vec::new();
    for t in tasks {
        answered.extend(t.await.unwrap().unwrap());
    }
    assert_eq!(answered.len(), 2 * PER_SERVER);

    // What the store holds, read through either server, agrees with what was answered.
    let listed = Api::<Service>::namespaced(c2.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut ips = BTreeMap::<String, String>::new();
    let mut ports = BTreeMap::<i32, String>::new();
    for svc in listed.iter().chain(answered.iter()) {
        let name = svc.metadata.name.clone().unwrap();
        let spec = svc.spec.as_ref().unwrap();
        let ip = spec.cluster_ip.clone().unwrap();
        if let Some(other) = ips.insert(ip.clone(), name.clone()) {
            assert_eq!(other, name, "{ip} handed to both {other} and {name}");
        }
        for p in spec.ports.iter().flatten().filter_map(|p| p.node_port) {
            if let Some(other) = ports.insert(p, name.clone()) {
                assert_eq!(
                    other, name,
                    "node port {p} handed to both {other} and {name}"
                );
            }
        }
    }
    assert_eq!(
        ips.len(),
        2 * PER_SERVER + 1,
        "the kubernetes Service's too"
    );
    assert_eq!(ports.len(), 2 * PER_SERVER);

    // Deleted through one server, an address can be asked for by name through the other.
    let services1: Api<Service> = Api::namespaced(c1.clone(), "default");
    let services2: Api<Service> = Api::namespaced(c2.clone(), "default");
    let victim = &answered[0];
    let name = victim.metadata.name.clone().unwrap();
    let spec = victim.spec.clone().unwrap();
    let again = |ip: &str| {
        let mut s = node_port_service("again");
        let sp = s.spec.as_mut().unwrap();
        sp.cluster_ip = Some(ip.to_string());
        sp.ports.as_mut().unwrap()[0].node_port = spec.ports.as_ref().unwrap()[0].node_port;
        s
    };
    let ip = spec.cluster_ip.clone().unwrap();
    let refused = services2
        .create(&PostParams::default(), &again(&ip))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 422 && e.message.contains("already allocated")),
        "{refused}"
    );
    services1.delete(&name, &Default::default()).await.unwrap();
    let got = services2
        .create(&PostParams::default(), &again(&ip))
        .await
        .unwrap();
    assert_eq!(got.spec.unwrap().cluster_ip.as_deref(), Some(ip.as_str()));
    drop((one, two));
}
