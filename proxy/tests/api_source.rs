//! The proxy's API source (`proxy run --source api`) against skiff's real API server,
//! started in-process: Services and EndpointSlices created through the API reach the real
//! eBPF programs in the test's own cgroup and network namespace; changes move traffic and
//! are measured as network programming latency; objects of another proxy are left alone;
//! the watch survives the API server's restart, and a relist after a 410 deletes what
//! vanished meanwhile.

mod support;

use control_plane::apiserver::{Config, RunningServer, Server};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use skiff_tests::wait_until;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use support::*;

const ECONNREFUSED: i32 = 111;
const HTTP: &[(&str, u16, &str)] = &[("http", 80, "TCP")];
const HTTP_TARGET: &[(&str, u16, &str)] = &[("http", 8080, "TCP")];
/// Long enough for the watcher's back-off after the server was away.
const RECONNECT: Duration = Duration::from_secs(60);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn client(kubeconfig: &Path) -> Client {
    control_plane::runtime::client::from_kubeconfig(kubeconfig)
        .await
        .unwrap()
}

fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// A Service through the API (cluster IP requested from the test's own range).
async fn create_service(api: &Api<Service>, name: &str, vip: IpAddr, labels: &str) {
    let mut svc: Service = from_yaml(&service(name, &[vip], HTTP, ""));
    if !labels.is_empty() {
        let (k, v) = labels.split_once('=').unwrap();
        svc.metadata.labels = Some([(k.to_string(), v.to_string())].into());
    }
    api.create(&PostParams::default(), &svc).await.unwrap();
}

/// An EndpointSlice for `service`, all `ready`, stamped with a trigger time of now.
fn endpoint_slice(name: &str, service: &str, ready: &[IpAddr]) -> EndpointSlice {
    let mut s: EndpointSlice = from_yaml(&slice(name, service, "IPv4", HTTP_TARGET, ready, &[]));
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    s.metadata.annotations =
        Some([(proxy::latency::TRIGGER_TIME_ANNOTATION.to_string(), now)].into());
    s
}

async fn put_slice(api: &Api<EndpointSlice>, name: &str, service: &str, ready: &[IpAddr]) {
    let mut s = endpoint_slice(name, service, ready);
    match api.get_opt(name).await.unwrap() {
        Some(old) => {
            s.metadata.resource_version = old.metadata.resource_version;
            api.replace(name, &PostParams::default(), &s).await.unwrap();
        }
        None => {
            api.create(&PostParams::default(), &s).await.unwrap();
        }
    }
}

fn api_config(dir: &Path, listen: SocketAddr, w: &World) -> Config {
    let mut config = Config::new(dir, listen);
    config.service_cidr = w.vip_cidr().parse().unwrap();
    config
}

fn wait_for_backend(w: &World, vip: SocketAddr, want: &str, timeout: Duration) {
    wait_until(&format!("{vip} answered by {want}"), timeout, || {
        match w.ask(vip) {
            Ok(b) if b == want => Ok(()),
            other => Err(other),
        }
    });
}

fn wait_refused(w: &World, vip: SocketAddr, timeout: Duration) {
    wait_until(&format!("{vip} refused"), timeout, || match w.ask(vip) {
        Err(Some(ECONNREFUSED)) => Ok(()),
        other => Err(other),
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn services_and_slices_from_the_api_are_programmed_and_follow_changes() {
    let w = World::new(Mode::Ebpf);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(api_config(dir.path(), "127.0.0.1:0".parse().unwrap(), &w))
        .await
        .unwrap();
    let c = client(server.kubeconfig_path()).await;
    let services: Api<Service> = Api::namespaced(c.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), "default");
    let vip = SocketAddr::new(w.vip(10), 80);
    let mut w = w.with_api(server.kubeconfig_path());
    // Backends after the world: they must stop before its namespace goes.
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    create_service(&services, "web", vip.ip(), "").await;
    put_slice(&slices, "web-1", "web", &[ip("127.0.0.2")]).await;
    // Another proxy's service, with a slice of its own: never programmed.
    let foreign = SocketAddr::new(w.vip(11), 80);
    create_service(
        &services,
        "foreign",
        foreign.ip(),
        "service.kubernetes.io/service-proxy-name=someone-else",
    )
    .await;
    put_slice(&slices, "foreign-1", "foreign", &[ip("127.0.0.3")]).await;
    w.start();
    // The initial listing was programmed before /healthz turned ready.
    assert_eq!(w.ask(vip), Ok("b1".into()));
    let programmed = w.metric("skiff_proxy_services");
    // web and the API server's own `kubernetes` Service (no endpoints here: the server is
    // on loopback), not the foreign one.
    assert_eq!(
        programmed,
        2.0,
        "web and kubernetes are the proxy's:\n{}",
        w.metrics()
    );
    assert!(
        w.ask(foreign).is_err(),
        "the foreign service is not translated"
    );

    // An endpoint change through the API moves new connections, and its latency is measured.
    put_slice(&slices, "web-1", "web", &[ip("127.0.0.3")]).await;
    wait_for_backend(&w, vip, "b2", WAIT);
    let observed = w.metric("skiff_proxy_network_programming_duration_seconds_count");
    assert!(observed >= 1.0, "latency observed:\n{}", w.metrics());
    let sum = w.metric("skiff_proxy_network_programming_duration_seconds_sum");
    assert!(
        sum < 60.0 * observed,
        "latencies are from this run, not from before the start: {sum}"
    );

    // Two backends, then the slice goes: connections are refused at once.
    put_slice(&slices, "web-1", "web", &[ip("127.0.0.2"), ip("127.0.0.3")]).await;
    wait_until("both backends answer", WAIT, || {
        let replies: Vec<String> = w
            .probe("http", vip, 40)
            .into_iter()
            .filter_map(|a| a.reply)
            .collect();
        match (
            replies.iter().any(|r| r == "b1"),
            replies.iter().any(|r| r == "b2"),
        ) {
            (true, true) => Ok(()),
            _ => Err(replies),
        }
    });
    slices
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_refused(&w, vip, WAIT);
    put_slice(&slices, "web-1", "web", &[ip("127.0.0.2")]).await;
    wait_for_backend(&w, vip, "b1", WAIT);
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("web no longer programmed", WAIT, || {
        match w.metric("skiff_proxy_services") {
            1.0 => Ok(()),
            n => Err(n),
        }
    });
    assert_eq!(
        w.metric("skiff_proxy_input_errors_total{reason=\"invalid\"}"),
        0.0
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watch_survives_a_server_restart_and_relists_after_410() {
    let w = World::new(Mode::Ebpf);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("api");
    // A short watch history: a watch resumed after a few changes gets 410 Expired.
    let mut config = api_config(&data, "127.0.0.1:0".parse().unwrap(), &w);
    config.watch_history = 4;
    let server = Server::start(config.clone()).await.unwrap();
    let listen = server.addr();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::copy(server.kubeconfig_path(), &kubeconfig).unwrap();
    let c = client(&kubeconfig).await;
    let web = SocketAddr::new(w.vip(10), 80);
    let gone = SocketAddr::new(w.vip(12), 80);
    let mut w = w.with_api(&kubeconfig);
    let _b1 = w.http_backend(ip("127.0.0.2"), 8080, "b1");
    let _b2 = w.http_backend(ip("127.0.0.3"), 8080, "b2");
    {
        let services: Api<Service> = Api::namespaced(c.clone(), "default");
        let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), "default");
        create_service(&services, "web", web.ip(), "").await;
        put_slice(&slices, "web-1", "web", &[ip("127.0.0.2")]).await;
        create_service(&services, "gone", gone.ip(), "").await;
        put_slice(&slices, "gone-1", "gone", &[ip("127.0.0.2")]).await;
    }
    w.start();
    assert_eq!(w.ask(web), Ok("b1".into()));
    assert_eq!(w.ask(gone), Ok("b1".into()));

    // 1. A plain restart on the same port: the watch resumes and sees later changes.
    server.shutdown().await;
    let server = Server::start(Config {
        listen,
        ..config.clone()
    })
    .await
    .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), "default");
    put_slice(&slices, "web-1", "web", &[ip("127.0.0.3")]).await;
    wait_for_backend(&w, web, "b2", RECONNECT);
    server.shutdown().await;

    // 2. Changes the proxy cannot see (the server answers elsewhere), more than the watch
    // history holds; back on the proxy's port its resume gets 410 and it relists.
    let elsewhere = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        kubeconfig: Some(dir.path().join("elsewhere.kubeconfig")),
        ..config.clone()
    })
    .await
    .unwrap();
    {
        let c = client(elsewhere.kubeconfig_path()).await;
        let slices: Api<EndpointSlice> = Api::namespaced(c, "default");
        slices
            .delete("gone-1", &DeleteParams::default())
            .await
            .unwrap();
        for i in 0..6 {
            put_slice(
                &slices,
                &format!("filler-{i}"),
                "filler",
                &[ip("127.0.0.9")],
            )
            .await;
        }
        put_slice(&slices, "web-1", "web", &[ip("127.0.0.2")]).await;
    }
    elsewhere.shutdown().await;
    let server: RunningServer = Server::start(Config {
        listen,
        ..config.clone()
    })
    .await
    .unwrap();
    wait_for_backend(&w, web, "b1", RECONNECT);
    // The slice deleted while the proxy was away: gone has no endpoints left.
    wait_refused(&w, gone, WAIT);
    let logs = w.proxy().logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("watch failed") && (l.contains("410") || l.contains("Expired"))),
        "the resume was refused with 410 Expired and the watcher relisted:\n{}",
        logs.join("\n")
    );
    server.shutdown().await;
}
