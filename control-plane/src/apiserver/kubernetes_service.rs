//! The `kubernetes` Service in `default`: how software in a pod finds the API (client-go's
//! and kube-rs' in-cluster configuration dial `KUBERNETES_SERVICE_HOST:PORT`, which the node
//! agent sets from this Service). As Kubernetes' API server does, each API server:
//!
//! - creates the Service at start if it is missing: ClusterIP the first address of the
//!   service range (a SAN of the serving certificate), port `https` 443 to the server's port;
//! - keeps a Lease `kube-system/kube-apiserver-<address>-<port>` (label
//!   `apiserver.kubernetes.io/identity=kube-apiserver`) renewed every [`RENEW`], naming the
//!   address nodes reach it at; Kubernetes' "lease" endpoint reconciler keeps the same
//!   records as TTL keys in etcd, skiff keeps them as API objects so they can be listed;
//! - writes the Endpoints and the EndpointSlice `kubernetes` (no selector: nothing else
//!   writes them) with the address of every API server whose Lease is live, writing only
//!   when the set changed; on a clean shutdown it takes itself out.
//!
//! The work per round is O(API servers): a range over kube-system's Leases (a handful).
//! A server with no address nodes can reach (listening on loopback, no
//! `--advertise-address`) keeps the Service but publishes no endpoint.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::handlers::Ctx;
use super::{meta, registry, rules};
use crate::store::{Precondition, Revision, StoreError, WriteOp};

/// How often the Lease is renewed and the endpoints reconciled (Kubernetes: 10 s).
pub const RENEW: Duration = Duration::from_secs(10);
/// How long a Lease counts after its last renewal (three missed renewals).
const LEASE_SECONDS: i64 = 30;
/// The label of API server identity Leases, as Kubernetes has it.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// Where a Lease says its server is reached (`ip:port`).
pub const ENDPOINT_ANNOTATION: &str = "skiff.dev/advertise-endpoint";
pub const SERVICE: &str = "kubernetes";
const NAMESPACE: &str = "default";
const LEASE_NAMESPACE: &str = "kube-system";
const PORT_NAME: &str = "https";

/// The address and port this server is reached at from nodes and pods.
pub fn published_endpoint(listen: SocketAddr, advertise: Option<IpAddr>) -> Option<SocketAddr> {
    let ip = advertise.unwrap_or(listen.ip());
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(SocketAddr::new(ip, listen.port()))
}

/// One round now (the Service exists once the server answers), then every [`RENEW`]
/// in the background until `ctx.shutdown`.
pub async fn start(
    ctx: Arc<Ctx>,
    cluster_ip: IpAddr,
    port: u16,
    me: Option<SocketAddr>,
) -> tokio::task::JoinHandle<()> {
    if let Err(e) = round(&ctx, cluster_ip, port, me).await {
        tracing::warn!(error = %e, "reconciling the kubernetes service");
    }
    tokio::spawn(run(ctx, cluster_ip, port, me))
}

/// Keeps the Service, this server's Lease and the endpoints until `ctx.shutdown`.
async fn run(ctx: Arc<Ctx>, cluster_ip: IpAddr, port: u16, me: Option<SocketAddr>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + RENEW, RENEW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = round(&ctx, cluster_ip, port, me).await {
            tracing::warn!(error = %e, "reconciling the kubernetes service");
        }
    }
    if let Some(me) = me {
        // Out of the endpoints before the listener closes, so new connections go elsewhere.
        let _ = delete(
            &ctx,
            "coordination.k8s.io",
            "leases",
            LEASE_NAMESPACE,
            &lease_name(me),
        )
        .await;
        if let Err(e) = endpoints(&ctx, Some(me)).await {
            tracing::warn!(error = %e, "removing this server from the kubernetes endpoints");
        }
    }
}

async fn round(
    ctx: &Ctx,
    cluster_ip: IpAddr,
    port: u16,
    me: Option<SocketAddr>,
) -> Result<(), String> {
    ensure_service(ctx, cluster_ip, port).await?;
    if let Some(me) = me {
        renew(ctx, me).await?;
    }
    endpoints(ctx, None).await
}

fn resource(group: &str, plural: &str) -> &'static registry::Resource {
    registry::find(group, "v1", plural).expect("registered")
}

fn lease_name(me: SocketAddr) -> String {
    let ip = me.ip().to_string().replace(['.', ':'], "-");
    format!("kube-apiserver-{ip}-{}", me.port())
}

async fn read(ctx: &Ctx, key: &str) -> Result<Option<(Value, Revision)>, String> {
    let kv = ctx.store.get(key).await.map_err(|e| e.to_string())?;
    kv.map(|kv| {
        serde_json::from_slice(&kv.value)
            .map(|v| (v, kv.mod_revision))
            .map_err(|e| format!("{key}: {e}"))
    })
    .transpose()
}

/// Writes `obj` at `key` (without a resourceVersion: the store's revision is the object's).
async fn put(
    ctx: &Ctx,
    key: String,
    mut obj: Value,
    precondition: Precondition,
) -> Result<(), String> {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    let value = serde_json::to_vec(&obj).map_err(|e| e.to_string())?.into();
    match ctx
        .store
        .write(WriteOp::Put {
            key,
            value,
            precondition,
        })
        .await
    {
        // Another API server wrote first: the next round sees its write.
        Ok(_) | Err(StoreError::AlreadyExists(_)) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

async fn delete(ctx: &Ctx, group: &str, plural: &str, ns: &str, name: &str) -> Result<(), String> {
    let key = resource(group, plural).key(Some(ns), name);
    match ctx
        .store
        .write(WriteOp::Delete {
            key,
            precondition: Precondition::Any,
        })
        .await
    {
        Ok(_) | Err(StoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn new_meta(name: &str, ns: &str, labels: Value) -> Value {
    json!({
        "name": name,
        "namespace": ns,
        "uid": meta::new_uid(),
        "creationTimestamp": meta::now(),
        "labels": labels,
    })
}

/// Creates the Service if it is missing (an existing one is left as its owner changed it).
async fn ensure_service(ctx: &Ctx, cluster_ip: IpAddr, port: u16) -> Result<(), String> {
    let r = resource("", "services");
    let key = r.key(Some(NAMESPACE), SERVICE);
    if ctx
        .store
        .get(&key)
        .await
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Ok(());
    }
    let mut obj = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": new_meta(SERVICE, NAMESPACE,
            json!({"component": "apiserver", "provider": "kubernetes"})),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip.to_string(),
            "ports": [{"name": PORT_NAME, "port": 443, "protocol": "TCP", "targetPort": port}],
            "sessionAffinity": "None",
        },
    });
    // The first address is never handed out by the allocator: it is kept for this Service.
    rules::default(r, &mut obj);
    put(ctx, key, obj, Precondition::MustNotExist).await?;
    tracing::info!(%cluster_ip, "the kubernetes service is in place");
    Ok(())
}

/// Renews (or creates) this server's Lease.
async fn renew(ctx: &Ctx, me: SocketAddr) -> Result<(), String> {
    let name = lease_name(me);
    let key = resource("coordination.k8s.io", "leases").key(Some(LEASE_NAMESPACE), &name);
    let now = micro_now();
    let (mut obj, precondition) = match read(ctx, &key).await? {
        Some((old, rev)) => (old, Precondition::ModRevision(rev)),
        None => {
            let mut m = new_meta(
                &name,
                LEASE_NAMESPACE,
                json!({IDENTITY_LABEL: "kube-apiserver"}),
            );
            m["annotations"] = json!({ENDPOINT_ANNOTATION: me.to_string()});
            let obj = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": m,
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                         "acquireTime": now},
            });
            (obj, Precondition::MustNotExist)
        }
    };
    obj["spec"]["renewTime"] = json!(now);
    put(ctx, key, obj, precondition).await
}

/// metav1.MicroTime now.
fn micro_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// The endpoints of live Leases, without `leaving`.
async fn live_endpoints(
    ctx: &Ctx,
    leaving: Option<SocketAddr>,
) -> Result<BTreeSet<SocketAddr>, String> {
    let prefix = resource("coordination.k8s.io", "leases").namespace_prefix(Some(LEASE_NAMESPACE));
    let leases = ctx.store.range(&prefix).await.map_err(|e| e.to_string())?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut out = BTreeSet::new();
    for kv in leases.kvs {
        let Ok(lease) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if lease.pointer(&format!(
            "/metadata/labels/{}",
            IDENTITY_LABEL.replace('/', "~1")
        )) != Some(&json!("kube-apiserver"))
        {
            continue;
        }
        let endpoint = lease
            .pointer(&format!(
                "/metadata/annotations/{}",
                ENDPOINT_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<SocketAddr>().ok());
        let renewed = lease
            .pointer("/spec/renewTime")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        let seconds = lease
            .pointer("/spec/leaseDurationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(LEASE_SECONDS);
        let live = renewed.is_some_and(|t| now.duration_since(t).as_secs() <= seconds);
        if let (Some(e), true) = (endpoint, live) {
            if Some(e) != leaving {
                out.insert(e);
            }
        }
    }
    Ok(out)
}

/// Writes the Endpoints and EndpointSlice when the set of live API servers changed.
async fn endpoints(ctx: &Ctx, leaving: Option<SocketAddr>) -> Result<(), String> {
    let live = live_endpoints(ctx, leaving).await?;
    let subsets = subsets(&live);
    let er = resource("", "endpoints");
    let key = er.key(Some(NAMESPACE), SERVICE);
    let (mut obj, precondition) = match read(ctx, &key).await? {
        Some((old, _)) if old.get("subsets").unwrap_or(&json!([])) == &subsets => {
            return slice(ctx, &live).await
        }
        Some((old, rev)) => (old, Precondition::ModRevision(rev)),
        // No server nodes can reach: no endpoints to publish, none written.
        None if live.is_empty() => return Ok(()),
        None => (
            json!({
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": new_meta(SERVICE, NAMESPACE,
                    json!({"endpointslice.kubernetes.io/skip-mirror": "true"})),
            }),
            Precondition::MustNotExist,
        ),
    };
    obj["subsets"] = subsets;
    put(ctx, key, obj, precondition).await?;
    slice(ctx, &live).await
}

/// Endpoints subsets: one per port, the addresses sorted.
fn subsets(live: &BTreeSet<SocketAddr>) -> Value {
    let ports: BTreeSet<u16> = live.iter().map(SocketAddr::port).collect();
    let subsets: Vec<Value> = ports
        .into_iter()
        .map(|port| {
            let addresses: Vec<Value> = live
                .iter()
                .filter(|e| e.port() == port)
                .map(|e| json!({"ip": e.ip().to_string()}))
                .collect();
            json!({"addresses": addresses,
                   "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}]})
        })
        .collect();
    json!(subsets)
}

async fn slice(ctx: &Ctx, live: &BTreeSet<SocketAddr>) -> Result<(), String> {
    let sr = resource("discovery.k8s.io", "endpointslices");
    let key = sr.key(Some(NAMESPACE), SERVICE);
    // One slice (an EndpointSlice has one port list): the first port's servers.
    let port = live.iter().map(SocketAddr::port).min();
    let endpoints: Vec<Value> = live
        .iter()
        .filter(|e| Some(e.port()) == port)
        .map(|e| {
            json!({"addresses": [e.ip().to_string()],
                   "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    let ports = match port {
        Some(p) => json!([{"name": PORT_NAME, "port": p, "protocol": "TCP"}]),
        None => json!([]),
    };
    let (mut obj, precondition) = match read(ctx, &key).await? {
        Some((old, _)) if old["endpoints"] == json!(endpoints) && old["ports"] == ports => {
            return Ok(())
        }
        Some((old, rev)) => (old, Precondition::ModRevision(rev)),
        None if live.is_empty() => return Ok(()),
        None => (
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": new_meta(SERVICE, NAMESPACE,
                    json!({"kubernetes.io/service-name": SERVICE})),
                "addressType": "IPv4",
            }),
            Precondition::MustNotExist,
        ),
    };
    obj["endpoints"] = json!(endpoints);
    obj["ports"] = ports;
    put(ctx, key, obj, precondition).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_address_nodes_reach_is_published() {
        let l: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        assert_eq!(published_endpoint(l, None), None);
        let a: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(
            published_endpoint(l, Some(a)),
            Some("10.0.0.5:6443".parse().unwrap())
        );
        let any: SocketAddr = "0.0.0.0:6443".parse().unwrap();
        assert_eq!(published_endpoint(any, None), None);
        let bridge: SocketAddr = "10.1.0.1:7443".parse().unwrap();
        assert_eq!(published_endpoint(bridge, None), Some(bridge));
    }

    #[test]
    fn subsets_group_addresses_by_port() {
        let live: BTreeSet<SocketAddr> = ["10.0.0.2:6443", "10.0.0.1:6443", "10.0.0.3:7443"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let s = subsets(&live);
        assert_eq!(
            s[0]["addresses"],
            json!([{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}])
        );
        assert_eq!(s[0]["ports"][0]["port"], 6443);
        assert_eq!(s[1]["addresses"], json!([{"ip": "10.0.0.3"}]));
        assert_eq!(
            lease_name("10.0.0.1:6443".parse().unwrap()),
            "kube-apiserver-10-0-0-1-6443"
        );
    }
}
