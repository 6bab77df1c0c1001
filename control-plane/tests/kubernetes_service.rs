//! The `kubernetes` Service in `default` against a real API server over TLS: created at
//! start on the first service address, its Endpoints and EndpointSlice naming the advertised
//! address and the server's port, the server's identity Lease, and the same Service (and
//! endpoints again) after a restart.

use std::time::Duration;

use control_plane::apiserver::kubernetes_service::{ENDPOINT_ANNOTATION, IDENTITY_LABEL};
use control_plane::apiserver::{Config, Server};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(30);
/// A documentation address (RFC 5737): written into objects, never dialled.
const ADVERTISED: &str = "192.0.2.10";

fn config(dir: &std::path::Path) -> Config {
    let mut c = Config::new(dir.join("data"), "127.0.0.1:0".parse().unwrap());
    c.advertise_address = Some(ADVERTISED.parse().unwrap());
    c
}

async fn endpoints_of(client: &kube::Client) -> Result<Vec<String>, String> {
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let e = eps.get("kubernetes").await.map_err(|e| e.to_string())?;
    Ok(e.subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            let port = s.ports.as_ref().and_then(|p| p.first()).map(|p| p.port);
            s.addresses
                .iter()
                .flatten()
                .map(move |a| format!("{}:{}", a.ip, port.unwrap_or(0)))
        })
        .collect())
}

/// Waits until the `kubernetes` Endpoints name exactly `me`.
async fn wait_for_endpoints(client: &kube::Client, me: &str) {
    wait_until_async(&format!("the endpoints name {me}"), WAIT, || {
        let client = client.clone();
        let me = me.to_string();
        async move {
            let eps = endpoints_of(&client).await?;
            (eps == vec![me]).then_some(()).ok_or(format!("{eps:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_service_points_at_the_api_servers_that_are_up() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(config(dir.path())).await.unwrap();
    let port = server.addr().port();
    let me = format!("{ADVERTISED}:{port}");
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services.get("kubernetes").await.unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
    let p = &spec.ports.unwrap()[0];
    assert_eq!((p.name.as_deref(), p.port), (Some("https"), 443));
    assert_eq!(
        p.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port as i32))
    );
    assert!(
        spec.selector.is_none(),
        "nothing but the API server writes its endpoints"
    );
    wait_for_endpoints(&client, &me).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = slices.get("kubernetes").await.unwrap();
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(slice.endpoints[0].addresses, vec![ADVERTISED.to_string()]);
    assert_eq!(slice.ports.unwrap()[0].port, Some(port as i32));
    assert_eq!(
        slice.metadata.labels.unwrap()["kubernetes.io/service-name"],
        "kubernetes"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mine = leases
        .list(&ListParams::default().labels(&format!("{IDENTITY_LABEL}=kube-apiserver")))
        .await
        .unwrap();
    assert_eq!(mine.items.len(), 1);
    assert_eq!(
        mine.items[0].metadata.annotations.as_ref().unwrap()[ENDPOINT_ANNOTATION],
        me
    );
    // The first address stays the kubernetes Service's: a new Service gets another.
    let other: Service = serde_json::from_value(json!({"metadata": {"name": "other"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}}))
    .unwrap();
    let other = services
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    assert_ne!(other.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.1"));

    // A restart keeps the Service and publishes the server again.
    let data = dir.path().join("data");
    let uid = services.get("kubernetes").await.unwrap().metadata.uid;
    server.shutdown().await;
    let mut c = config(dir.path());
    c.data_dir = data;
    c.listen = format!("127.0.0.1:{port}").parse().unwrap();
    let server = Server::start(c).await.unwrap();
    let client = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    assert_eq!(services.get("kubernetes").await.unwrap().metadata.uid, uid);
    wait_for_endpoints(&client, &me).await;
    server.shutdown().await;
}
