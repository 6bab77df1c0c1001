//! skiff-dns against skiff's real API server (in-process) and real DNS queries over UDP and
//! TCP with hickory's client: every record kind, a Service created becomes resolvable and
//! deleted becomes NXDOMAIN, a headless Service follows its endpoints' readiness, /readyz
//! and the metrics; names outside the cluster domain are forwarded to an upstream DNS
//! server the test runs itself on loopback (an authoritative hickory-server zone).

use control_plane::apiserver::{Config as ApiConfig, RunningServer, Server as ApiServer};
use dns::{Config, RunningDns, Upstream};
use hickory_server::net::client::{Client, ClientHandle};
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::net::tcp::TcpClientStream;
use hickory_server::net::udp::UdpClientStream;
use hickory_server::net::{DnsError, NetError};
use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, SOA};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordSet, RecordType, RrKey};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use std::collections::BTreeMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous for a loaded 2-core machine: a watch event to the records is milliseconds.
const CONVERGE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Proto {
    Udp,
    Tcp,
}

/// The response code and the answers' data (sorted, as text).
async fn ask(
    server: SocketAddr,
    proto: Proto,
    name: &str,
    rtype: RecordType,
) -> (ResponseCode, Vec<String>) {
    let mut client = match proto {
        Proto::Udp => {
            let conn = UdpClientStream::builder(server, TokioRuntimeProvider::default()).build();
            let (client, bg) = Client::<TokioRuntimeProvider>::from_sender(conn);
            tokio::spawn(bg);
            client
        }
        Proto::Tcp => {
            let (stream, sender) =
                TcpClientStream::new(server, None, None, TokioRuntimeProvider::default());
            let (client, bg) = Client::<TokioRuntimeProvider>::new(stream.await.unwrap(), sender);
            tokio::spawn(bg);
            client
        }
    };
    let name = Name::from_str(name).unwrap();
    match client.query(name, DNSClass::IN, rtype).await {
        Ok(resp) => {
            let mut data: Vec<String> = resp.answers.iter().map(|r| r.data.to_string()).collect();
            data.sort();
            (resp.response_code, data)
        }
        Err(NetError::Dns(DnsError::NoRecordsFound(no))) => (no.response_code, Vec::new()),
        Err(NetError::Dns(DnsError::ResponseCode(code))) => (code, Vec::new()),
        Err(e) => panic!("query {proto:?} failed: {e}"),
    }
}

/// Polls `probe` until it is Ok or `timeout` passes (then panics with the last result).
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {timeout:?}: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until `name` `rtype` answers `want` (code and data) over `proto`.
async fn wait_answer(
    dns: SocketAddr,
    proto: Proto,
    name: &str,
    rtype: RecordType,
    want: (ResponseCode, &[&str]),
) {
    let want_data: Vec<String> = want.1.iter().map(|s| s.to_string()).collect();
    eventually(&format!("{name} {rtype} over {proto:?}"), CONVERGE, || {
        let want_data = want_data.clone();
        async move {
            let got = ask(dns, proto, name, rtype).await;
            match got.0 == want.0 && got.1 == want_data {
                true => Ok(()),
                false => Err(format!("got {got:?}")),
            }
        }
    })
    .await
}

/// `GET path` on the metrics endpoint: (status, body).
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn api_server(dir: &std::path::Path) -> RunningServer {
    ApiServer::start(ApiConfig::new(dir, "127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap()
}

async fn start_dns(api: &RunningServer, upstream: Upstream) -> RunningDns {
    dns::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        cluster_domain: "cluster.local".into(),
        kubeconfig: Some(api.kubeconfig_path().to_path_buf()),
        upstream,
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
    })
    .await
    .unwrap()
}

fn service(name: &str, cluster_ip: Option<&str>, ports: &[(&str, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: cluster_ip.map(str::to_string),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: Some(n.to_string()),
                        port: *p,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A slice of `service`: (address, hostname, ready) per endpoint.
fn slice(name: &str, service: &str, eps: &[(&str, Option<&str>, bool)]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_string(),
                service.to_string(),
            )])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: eps
            .iter()
            .map(|(ip, host, ready)| Endpoint {
                addresses: vec![ip.to_string()],
                hostname: host.map(str::to_string),
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("pg".into()),
            port: Some(5432),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn services_slices_and_pods_resolve_and_follow_changes() {
    let dir = tempfile::tempdir().unwrap();
    let api = api_server(dir.path()).await;
    let client = control_plane::runtime::client::from_kubeconfig(api.kubeconfig_path())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let dns = start_dns(&api, Upstream::None).await;
    let addr = dns.addr;

    // Ready once the first listing is in.
    tokio::time::timeout(CONVERGE, dns.wait_synced())
        .await
        .unwrap();
    assert!(dns.synced());
    let (status, _) = http_get(dns.metrics_addr, "/readyz");
    assert_eq!(status, 200);
    assert_eq!(http_get(dns.metrics_addr, "/healthz").0, 200);

    // A ClusterIP Service created through the API becomes resolvable: A (UDP and TCP),
    // SRV for its named port, PTR for its cluster IP.
    let web = services
        .create(
            &PostParams::default(),
            &service("web", None, &[("http", 80)]),
        )
        .await
        .unwrap();
    let vip = web.spec.unwrap().cluster_ip.unwrap();
    let fqdn = "web.default.svc.cluster.local.";
    for proto in [Proto::Udp, Proto::Tcp] {
        wait_answer(
            addr,
            proto,
            fqdn,
            RecordType::A,
            (ResponseCode::NoError, &[&vip]),
        )
        .await;
    }
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "_http._tcp.web.default.svc.cluster.local.",
            RecordType::SRV
        )
        .await,
        (ResponseCode::NoError, vec![format!("0 100 80 {fqdn}")])
    );
    let ip: Ipv4Addr = vip.parse().unwrap();
    let [a, b, c, d] = ip.octets();
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            &format!("{d}.{c}.{b}.{a}.in-addr.arpa."),
            RecordType::PTR
        )
        .await,
        (ResponseCode::NoError, vec![fqdn.to_string()])
    );
    // Mixed case is the same name; no AAAA is NODATA, not NXDOMAIN.
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "WEB.Default.svc.cluster.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, vec![vip.clone()])
    );
    assert_eq!(
        ask(addr, Proto::Udp, fqdn, RecordType::AAAA).await,
        (ResponseCode::NoError, vec![])
    );
    // Unknown names in the cluster domain are NXDOMAIN, answered here (no upstream).
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "nope.default.svc.cluster.local.",
            RecordType::A
        )
        .await
        .0,
        ResponseCode::NXDomain
    );
    // Pod names from their address.
    assert_eq!(
        ask(
            addr,
            Proto::Tcp,
            "10-244-1-7.default.pod.cluster.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, vec!["10.244.1.7".to_string()])
    );

    // A headless Service: its ready endpoints, each under its hostname, SRV per named port
    // of its slices; readiness changes move the answers.
    services
        .create(
            &PostParams::default(),
            &service("db", Some("None"), &[("pg", 5432)]),
        )
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice(
                "db-1",
                "db",
                &[
                    ("10.244.1.5", Some("db-0"), true),
                    ("10.244.2.6", Some("db-1"), false),
                ],
            ),
        )
        .await
        .unwrap();
    let db = "db.default.svc.cluster.local.";
    wait_answer(
        addr,
        Proto::Udp,
        db,
        RecordType::A,
        (ResponseCode::NoError, &["10.244.1.5"]),
    )
    .await;
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "db-0.db.default.svc.cluster.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, vec!["10.244.1.5".to_string()])
    );
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "db-1.db.default.svc.cluster.local.",
            RecordType::A
        )
        .await
        .0,
        ResponseCode::NXDomain,
        "not ready: no record"
    );
    assert_eq!(
        ask(
            addr,
            Proto::Tcp,
            "_pg._tcp.db.default.svc.cluster.local.",
            RecordType::SRV
        )
        .await,
        (
            ResponseCode::NoError,
            vec!["0 100 5432 db-0.db.default.svc.cluster.local.".to_string()]
        )
    );
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "5.1.244.10.in-addr.arpa.",
            RecordType::PTR
        )
        .await,
        (
            ResponseCode::NoError,
            vec!["db-0.db.default.svc.cluster.local.".to_string()]
        )
    );
    let mut s = slices.get("db-1").await.unwrap();
    s.endpoints[0].conditions.as_mut().unwrap().ready = Some(false);
    s.endpoints[1].conditions.as_mut().unwrap().ready = Some(true);
    slices
        .replace("db-1", &PostParams::default(), &s)
        .await
        .unwrap();
    wait_answer(
        addr,
        Proto::Udp,
        db,
        RecordType::A,
        (ResponseCode::NoError, &["10.244.2.6"]),
    )
    .await;
    assert_eq!(
        ask(
            addr,
            Proto::Udp,
            "db-1.db.default.svc.cluster.local.",
            RecordType::A
        )
        .await,
        (ResponseCode::NoError, vec!["10.244.2.6".to_string()])
    );
    // A second slice adds its endpoints to the same name.
    slices
        .create(
            &PostParams::default(),
            &slice("db-2", "db", &[("10.244.3.8", None, true)]),
        )
        .await
        .unwrap();
    wait_answer(
        addr,
        Proto::Tcp,
        db,
        RecordType::A,
        (ResponseCode::NoError, &["10.244.2.6", "10.244.3.8"]),
    )
    .await;

    // Deleted: NXDOMAIN, the PTR gone with it.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_answer(
        addr,
        Proto::Udp,
        fqdn,
        RecordType::A,
        (ResponseCode::NXDomain, &[]),
    )
    .await;
    let reverse = ask(
        addr,
        Proto::Udp,
        &format!("{d}.{c}.{b}.{a}.in-addr.arpa."),
        RecordType::PTR,
    )
    .await;
    assert_ne!(reverse.0, ResponseCode::NoError, "{reverse:?}");

    // Every answer was counted, by type and code.
    let (status, metrics) = http_get(dns.metrics_addr, "/metrics");
    assert_eq!(status, 200);
    for line in [
        r#"skiff_dns_queries_total{qtype="A",rcode="NOERROR",source="Cluster"}"#,
        r#"skiff_dns_queries_total{qtype="A",rcode="NXDOMAIN",source="Cluster"}"#,
        r#"skiff_dns_queries_total{qtype="SRV",rcode="NOERROR",source="Cluster"}"#,
        "skiff_dns_request_duration_seconds_count",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    dns.shutdown().await;
    api.shutdown().await;
}

/// An authoritative zone `example.test.` (www -> 192.0.2.7) on a loopback port: the
/// upstream resolver the cluster DNS forwards to.
async fn upstream_server() -> (SocketAddr, hickory_server::Server<Catalog>) {
    let origin = Name::from_str("example.test.").unwrap();
    let soa = Record::from_rdata(
        origin.clone(),
        60,
        RData::SOA(SOA::new(
            Name::from_str("ns.example.test.").unwrap(),
            Name::from_str("hostmaster.example.test.").unwrap(),
            1,
            60,
            60,
            60,
            60,
        )),
    );
    let www = Record::from_rdata(
        Name::from_str("www.example.test.").unwrap(),
        60,
        RData::A(A::new(192, 0, 2, 7)),
    );
    let mut records = BTreeMap::new();
    for r in [soa, www] {
        let key = RrKey::new(r.name.clone().into(), r.record_type());
        records.insert(key, RecordSet::from(r));
    }
    let zone = InMemoryZoneHandler::<TokioRuntimeProvider>::new(
        origin.clone(),
        records,
        ZoneType::Primary,
        AxfrPolicy::Deny,
    )
    .unwrap();
    let mut catalog = Catalog::new();
    catalog.upsert(origin.into(), vec![Arc::new(zone)]);
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = udp.local_addr().unwrap();
    let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
    let mut server = hickory_server::Server::new(catalog);
    server.register_socket(udp);
    server.register_listener(tcp, Duration::from_secs(5), 16);
    (addr, server)
}

#[tokio::test(flavor = "multi_thread")]
async fn other_names_are_forwarded_to_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let api = api_server(dir.path()).await;
    let (upstream, mut upstream_server) = upstream_server().await;
    // The upstream answers by itself.
    assert_eq!(
        ask(upstream, Proto::Udp, "www.example.test.", RecordType::A).await,
        (ResponseCode::NoError, vec!["192.0.2.7".to_string()])
    );
    let dns = start_dns(&api, Upstream::Servers(vec![upstream])).await;
    tokio::time::timeout(CONVERGE, dns.wait_synced())
        .await
        .unwrap();
    for proto in [Proto::Udp, Proto::Tcp] {
        assert_eq!(
            ask(dns.addr, proto, "www.example.test.", RecordType::A).await,
            (ResponseCode::NoError, vec!["192.0.2.7".to_string()]),
            "{proto:?}"
        );
        assert_eq!(
            ask(dns.addr, proto, "nope.example.test.", RecordType::A)
                .await
                .0,
            ResponseCode::NXDomain,
            "{proto:?}"
        );
    }
    // Cluster names never leave: NXDOMAIN from the cluster zone, not the upstream's answer.
    assert_eq!(
        ask(
            dns.addr,
            Proto::Udp,
            "nope.svc.cluster.local.",
            RecordType::A
        )
        .await
        .0,
        ResponseCode::NXDomain
    );
    // The kubernetes Service of the API server is in the zone.
    wait_answer(
        dns.addr,
        Proto::Udp,
        "kubernetes.default.svc.cluster.local.",
        RecordType::A,
        (ResponseCode::NoError, &["10.96.0.1"]),
    )
    .await;
    let (_, metrics) = http_get(dns.metrics_addr, "/metrics");
    for line in [
        r#"skiff_dns_queries_total{qtype="A",rcode="NOERROR",source="Upstream"}"#,
        r#"skiff_dns_queries_total{qtype="A",rcode="NXDOMAIN",source="Upstream"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    dns.shutdown().await;
    upstream_server.shutdown_gracefully().await.unwrap();
    api.shutdown().await;
}
