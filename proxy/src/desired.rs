//! The desired state: Services and EndpointSlices joined into frontends with their
//! backends, as seen from one node. Each change names the services it affects, so a data
//! path re-derives only those: O(size of the changed service), never O(all services).
//!
//! A Service becomes up to three kinds of frontend per port:
//! - `Scope::Cluster`: its cluster IPs, external IPs and LoadBalancer addresses, for clients
//!   inside the cluster (socket level), with the internal endpoints (internalTrafficPolicy);
//! - `Scope::NodePort`: its node port at any of the node's addresses, for the node's own
//!   pods and processes (socket level), with the internal endpoints, as kube-proxy sends
//!   in-cluster clients of an external address to the internal endpoints;
//! - `Scope::External`: its node port, external IPs and LoadBalancer addresses for traffic
//!   arriving at a node interface (packet level), with the external endpoints
//!   (externalTrafficPolicy: every endpoint, or this node's only).
//!
//! Where no endpoint is ready, the serving terminating ones are used (KEP-1669), per set.

use crate::model::{
    Affinity, Family, Port, Protocol, ServiceKind, ServiceName, ServiceSpec, SliceName, SliceSpec,
    TrafficPolicy,
};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// Which clients a frontend serves (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Cluster,
    NodePort,
    External,
}

/// A frontend: what a client connects to. A node port's address is unspecified (0.0.0.0):
/// it answers on every node address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    pub ip: IpAddr,
    pub port: Port,
    pub protocol: Protocol,
    pub scope: Scope,
}

impl FrontendKey {
    /// A cluster-scope frontend (a cluster IP and port).
    pub fn cluster(ip: IpAddr, port: Port, protocol: Protocol) -> FrontendKey {
        FrontendKey {
            ip,
            port,
            protocol,
            scope: Scope::Cluster,
        }
    }
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = self.protocol.as_str();
        match self.ip {
            ip if ip.is_unspecified() => write!(f, "*:{}/{proto}", self.port)?,
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{proto}", self.port)?,
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{proto}", self.port)?,
        }
        match self.scope {
            Scope::Cluster => Ok(()),
            Scope::NodePort => f.write_str(" (nodeport)"),
            Scope::External => f.write_str(" (external)"),
        }
    }
}

/// A backend address: an endpoint and the slice's port for the frontend's port name, and
/// whether it runs on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: Port,
    pub local: bool,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// Where a frontend's address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontendKind {
    ClusterIp,
    ExternalIp,
    LoadBalancerIp,
    NodePort,
}

/// What one frontend should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub backends: BTreeSet<Endpoint>,
    pub affinity: Affinity,
    /// The service port's name, for logs, metrics and iptables comments.
    pub port_name: String,
    pub kind: FrontendKind,
    /// Packet level with externalTrafficPolicy Cluster: a backend on another node is
    /// reached with the source translated to this node.
    pub snat_remote: bool,
    /// loadBalancerSourceRanges (LoadBalancer addresses at packet level; empty: anyone).
    pub source_ranges: Vec<IpNet>,
    /// Packet level: the service's cluster frontend on the same port (where kube-proxy's
    /// KUBE-EXT chain sends the node's own clients).
    pub internal: Option<FrontendKey>,
}

/// All frontends of one service.
pub type Frontends = BTreeMap<FrontendKey, DesiredFrontend>;

/// A change from a source, already validated into the model.
#[derive(Clone, Debug)]
pub enum Change {
    Service(ServiceName, Option<ServiceSpec>),
    Slice(SliceName, Option<SliceSpec>),
}

/// A change that was refused; the state is as before it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    #[error("cluster IP {ip} of {service} is already used by {owner}")]
    DuplicateClusterIp {
        service: ServiceName,
        ip: IpAddr,
        owner: ServiceName,
    },
    #[error("{frontend} of {service} is already used by {owner}")]
    DuplicateFrontend {
        service: ServiceName,
        frontend: FrontendKey,
        owner: ServiceName,
    },
}

/// A health check node port and what it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub port: Port,
    /// Endpoints of the service on this node.
    pub local_endpoints: usize,
}

#[derive(Default)]
pub struct DesiredState {
    /// The node this proxy runs on (None: no endpoint counts as local).
    node: Option<String>,
    services: HashMap<ServiceName, ServiceSpec>,
    slices: HashMap<SliceName, SliceSpec>,
    slices_of: HashMap<ServiceName, BTreeSet<SliceName>>,
    ip_owner: HashMap<IpAddr, ServiceName>,
    /// Owners of the packet-level frontends (external addresses and node ports), which
    /// two Services must not share.
    claims: HashMap<FrontendKey, ServiceName>,
}

/// Which endpoints a frontend uses.
#[derive(Clone, Copy)]
struct Selection {
    family: Family,
    local_only: bool,
}

/// The packet-level keys a Service claims.
fn claimed_keys(spec: &ServiceSpec) -> Vec<FrontendKey> {
    let mut out = Vec::new();
    for sp in &spec.ports {
        for ip in external_addrs(spec) {
            out.push(FrontendKey {
                ip,
                port: sp.port,
                protocol: sp.protocol,
                scope: Scope::External,
            });
        }
        if let Some(np) = sp.node_port {
            out.push(FrontendKey {
                ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port: np,
                protocol: sp.protocol,
                scope: Scope::External,
            });
        }
    }
    out
}

/// External IPs and LoadBalancer addresses, with their kind.
fn external_addrs(spec: &ServiceSpec) -> impl Iterator<Item = IpAddr> + '_ {
    spec.external_ips
        .iter()
        .chain(&spec.load_balancer_ips)
        .copied()
}

impl DesiredState {
    /// The desired state as seen from `node`.
    pub fn for_node(node: Option<String>) -> DesiredState {
        DesiredState {
            node,
            ..DesiredState::default()
        }
    }

    pub fn has_service(&self, name: &ServiceName) -> bool {
        self.services.contains_key(name)
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn service_names(&self) -> impl Iterator<Item = &ServiceName> {
        self.services.keys()
    }

    /// Slices whose service does not exist (O(services with slices); for start-up checks).
    pub fn orphan_slices(&self) -> Vec<(&SliceName, &ServiceName)> {
        self.slices_of
            .iter()
            .filter(|(svc, _)| !self.services.contains_key(svc))
            .flat_map(|(svc, slices)| slices.iter().map(move |s| (s, svc)))
            .collect()
    }

    fn release(&mut self, name: &ServiceName) {
        if let Some(old) = self.services.get(name) {
            for ip in &old.cluster_ips {
                self.ip_owner.remove(ip);
            }
            for k in claimed_keys(old) {
                self.claims.remove(&k);
            }
        }
    }

    /// Applies a change; returns the services whose frontends may have changed.
    pub fn apply(&mut self, change: Change) -> Result<Vec<ServiceName>, Rejection> {
        match change {
            Change::Service(name, Some(spec)) => {
                for ip in &spec.cluster_ips {
                    if let Some(owner) = self.ip_owner.get(ip) {
                        if *owner != name {
                            return Err(Rejection::DuplicateClusterIp {
                                service: name,
                                ip: *ip,
                                owner: owner.clone(),
                            });
                        }
                    }
                }
                let keys = claimed_keys(&spec);
                for k in &keys {
                    if let Some(owner) = self.claims.get(k).filter(|o| **o != name) {
                        return Err(Rejection::DuplicateFrontend {
                            service: name,
                            frontend: *k,
                            owner: owner.clone(),
                        });
                    }
                }
                self.release(&name);
                for ip in &spec.cluster_ips {
                    self.ip_owner.insert(*ip, name.clone());
                }
                for k in keys {
                    self.claims.insert(k, name.clone());
                }
                self.services.insert(name.clone(), spec);
                Ok(vec![name])
            }
            Change::Service(name, None) => {
                self.release(&name);
                self.services.remove(&name);
                Ok(vec![name])
            }
            Change::Slice(name, spec) => {
                let mut affected = Vec::new();
                if let Some(old) = self.slices.remove(&name) {
                    if let Some(set) = self.slices_of.get_mut(&old.service) {
                        set.remove(&name);
                        if set.is_empty() {
                            self.slices_of.remove(&old.service);
                        }
                    }
                    affected.push(old.service);
                }
                if let Some(spec) = spec {
                    self.slices_of
                        .entry(spec.service.clone())
                        .or_default()
                        .insert(name.clone());
                    if !affected.contains(&spec.service) {
                        affected.push(spec.service.clone());
                    }
                    self.slices.insert(name, spec);
                }
                Ok(affected)
            }
        }
    }

    fn slices(&self, name: &ServiceName) -> Vec<&SliceSpec> {
        self.slices_of
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect()
    }

    fn is_local(&self, node: &Option<String>) -> bool {
        self.node.is_some() && *node == self.node
    }

    /// The endpoints of `slices` for service port `sp` that `sel` admits: the ready ones,
    /// or when none is ready the serving terminating ones (KEP-1669).
    fn endpoints(
        &self,
        slices: &[&SliceSpec],
        sp: &crate::model::ServicePort,
        sel: Selection,
    ) -> BTreeSet<Endpoint> {
        let mut ready = BTreeSet::new();
        let mut fallback = BTreeSet::new();
        for slice in slices.iter().filter(|s| s.family == sel.family) {
            let Some(port) = slice
                .ports
                .iter()
                .find(|p| p.name == sp.name && p.protocol == sp.protocol)
            else {
                continue;
            };
            for ep in &slice.endpoints {
                let local = self.is_local(&ep.node);
                if sel.local_only && !local {
                    continue;
                }
                let e = Endpoint {
                    ip: ep.ip,
                    port: port.port,
                    local,
                };
                if ep.ready {
                    ready.insert(e);
                } else if ep.serving_terminating() {
                    fallback.insert(e);
                }
            }
        }
        if ready.is_empty() {
            fallback
        } else {
            ready
        }
    }

    /// The frontends of a service (empty if it does not exist), as described in the module
    /// docs.
    pub fn frontends(&self, name: &ServiceName) -> Frontends {
        let mut out = Frontends::new();
        let Some(spec) = self.services.get(name) else {
            return out;
        };
        let slices = self.slices(name);
        let internal_local = spec.internal_policy == TrafficPolicy::Local;
        let external_local = spec.external_policy == TrafficPolicy::Local;
        let frontend = |backends, kind, sp: &crate::model::ServicePort| DesiredFrontend {
            backends,
            affinity: spec.affinity,
            port_name: sp.name.0.clone(),
            kind,
            snat_remote: false,
            source_ranges: Vec::new(),
            internal: None,
        };
        for sp in &spec.ports {
            // The first cluster IP of the same family stands for the service internally.
            let cluster_of = |family: Family| {
                spec.cluster_ips
                    .iter()
                    .find(|ip| Family::of(ip) == family)
                    .map(|ip| FrontendKey::cluster(*ip, sp.port, sp.protocol))
            };
            for ip in &spec.cluster_ips {
                let sel = Selection {
                    family: Family::of(ip),
                    local_only: internal_local,
                };
                out.insert(
                    FrontendKey::cluster(*ip, sp.port, sp.protocol),
                    frontend(
                        self.endpoints(&slices, sp, sel),
                        FrontendKind::ClusterIp,
                        sp,
                    ),
                );
            }
            let externals = spec
                .external_ips
                .iter()
                .map(|ip| (*ip, FrontendKind::ExternalIp))
                .chain(
                    spec.load_balancer_ips
                        .iter()
                        .map(|ip| (*ip, FrontendKind::LoadBalancerIp)),
                );
            for (ip, kind) in externals {
                let family = Family::of(&ip);
                let internal = Selection {
                    family,
                    local_only: internal_local,
                };
                out.insert(
                    FrontendKey::cluster(ip, sp.port, sp.protocol),
                    frontend(self.endpoints(&slices, sp, internal), kind, sp),
                );
                // Packets from outside: IPv4 (the packet-level programs' family).
                if family == Family::V4 {
                    let external = Selection {
                        family,
                        local_only: external_local,
                    };
                    let mut f = frontend(self.endpoints(&slices, sp, external), kind, sp);
                    f.snat_remote = !external_local;
                    f.internal = cluster_of(family);
                    if kind == FrontendKind::LoadBalancerIp {
                        f.source_ranges = spec.source_ranges.clone();
                    }
                    out.insert(
                        FrontendKey {
                            ip,
                            port: sp.port,
                            protocol: sp.protocol,
                            scope: Scope::External,
                        },
                        f,
                    );
                }
            }
            let Some(np) = sp.node_port else { continue };
            if cluster_of(Family::V4).is_none() {
                continue;
            }
            let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            let internal = Selection {
                family: Family::V4,
                local_only: internal_local,
            };
            out.insert(
                FrontendKey {
                    ip: any,
                    port: np,
                    protocol: sp.protocol,
                    scope: Scope::NodePort,
                },
                frontend(
                    self.endpoints(&slices, sp, internal),
                    FrontendKind::NodePort,
                    sp,
                ),
            );
            let external = Selection {
                family: Family::V4,
                local_only: external_local,
            };
            let mut f = frontend(
                self.endpoints(&slices, sp, external),
                FrontendKind::NodePort,
                sp,
            );
            f.snat_remote = !external_local;
            f.internal = cluster_of(Family::V4);
            out.insert(
                FrontendKey {
                    ip: any,
                    port: np,
                    protocol: sp.protocol,
                    scope: Scope::External,
                },
                f,
            );
        }
        out
    }

    /// The service's health check node port and its local endpoint count (LoadBalancer,
    /// externalTrafficPolicy Local), as kube-proxy counts them: this node's endpoints that
    /// serve (ready, or serving terminating when none is ready) on any port.
    pub fn health_check(&self, name: &ServiceName) -> Option<HealthCheck> {
        let spec = self.services.get(name)?;
        let port = spec.health_check_node_port?;
        if spec.external_policy != TrafficPolicy::Local || spec.kind != ServiceKind::LoadBalancer {
            return None;
        }
        let slices = self.slices(name);
        let mut local: BTreeSet<IpAddr> = BTreeSet::new();
        for sp in &spec.ports {
            let sel = Selection {
                family: Family::V4,
                local_only: true,
            };
            local.extend(self.endpoints(&slices, sp, sel).iter().map(|e| e.ip));
        }
        Some(HealthCheck {
            port,
            local_endpoints: local.len(),
        })
    }

    /// The LoadBalancer addresses of the service this node announces (answers ARP for): for
    /// each address, one node among those with a ready endpoint of the service (with
    /// externalTrafficPolicy Local they are the only ones that can serve it), chosen by
    /// rendezvous hashing, so every proxy makes the same choice and a change of endpoints
    /// moves few addresses.
    pub fn announced(&self, name: &ServiceName) -> Vec<Ipv4Addr> {
        let (Some(me), Some(spec)) = (self.node.as_deref(), self.services.get(name)) else {
            return Vec::new();
        };
        let mut nodes: BTreeSet<&str> = BTreeSet::new();
        for slice in self.slices(name) {
            for ep in slice.endpoints.iter().filter(|e| e.ready) {
                if let Some(n) = ep.node.as_deref() {
                    nodes.insert(n);
                }
            }
        }
        spec.load_balancer_ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .filter(|ip| speaker(&nodes, *ip) == Some(me))
            .collect()
    }
}

/// The node that announces `ip`: the highest rendezvous score among `nodes`.
fn speaker<'a>(nodes: &BTreeSet<&'a str>, ip: Ipv4Addr) -> Option<&'a str> {
    let score = |node: &str| {
        node.bytes()
            .chain(ip.octets())
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            })
    };
    nodes.iter().copied().max_by_key(|n| score(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ObjectKey, PortName, ServicePort, SliceEndpoint, SlicePort};

    pub(crate) fn svc(name: &str, ip: &str, port: u16) -> (ServiceName, ServiceSpec) {
        (
            ServiceName(ObjectKey::new("default", name)),
            ServiceSpec::cluster_ip(
                vec![ip.parse().unwrap()],
                vec![ServicePort {
                    name: PortName("http".into()),
                    port: Port::new(port).unwrap(),
                    protocol: Protocol::Tcp,
                    node_port: None,
                }],
            ),
        )
    }

    /// A LoadBalancer Service with node port 30080, LB address 10.249.0.200 and the given
    /// external policy.
    fn lb(name: &str, ip: &str, local: bool) -> (ServiceName, ServiceSpec) {
        let (n, mut s) = svc(name, ip, 80);
        s.kind = ServiceKind::LoadBalancer;
        s.ports[0].node_port = Port::new(30080);
        s.load_balancer_ips = vec!["10.249.0.200".parse().unwrap()];
        s.source_ranges = vec!["10.249.0.0/24".parse().unwrap()];
        s.health_check_node_port = Port::new(32000);
        if local {
            s.external_policy = TrafficPolicy::Local;
        }
        (n, s)
    }

    fn on(mut s: (SliceName, SliceSpec), nodes: &[&str]) -> (SliceName, SliceSpec) {
        for (ep, n) in s.1.endpoints.iter_mut().zip(nodes) {
            ep.node = Some(n.to_string());
        }
        s
    }

    fn keys(f: &Frontends) -> Vec<String> {
        f.iter()
            .map(|(k, d)| format!("{k} -> {}", d.backends.len()))
            .collect()
    }

    #[test]
    fn a_load_balancer_becomes_socket_and_packet_level_frontends() {
        let mut d = DesiredState::for_node(Some("n1".into()));
        let (n, s) = lb("web", "10.96.0.1", false);
        d.apply(Change::Service(n.clone(), Some(s))).unwrap();
        let (sn, ss) = on(
            slice("web-a", "web", 8080, &["10.244.1.2", "10.244.2.2"]),
            &["n1", "n2"],
        );
        d.apply(Change::Slice(sn, Some(ss))).unwrap();
        let f = d.frontends(&n);
        assert_eq!(
            keys(&f),
            [
                "*:30080/tcp (nodeport) -> 2",
                "*:30080/tcp (external) -> 2",
                "10.96.0.1:80/tcp -> 2",
                "10.249.0.200:80/tcp -> 2",
                "10.249.0.200:80/tcp (external) -> 2",
            ]
        );
        let ext = f
            .values()
            .find(|d| d.kind == FrontendKind::LoadBalancerIp && d.snat_remote)
            .unwrap();
        assert_eq!(ext.source_ranges.len(), 1);
        assert_eq!(
            ext.internal.map(|k| k.to_string()).as_deref(),
            Some("10.96.0.1:80/tcp")
        );
        let local: Vec<bool> = ext.backends.iter().map(|e| e.local).collect();
        assert_eq!(local, [true, false]);
    }

    #[test]
    fn traffic_policies_local_keep_this_nodes_endpoints() {
        let mut d = DesiredState::for_node(Some("n1".into()));
        let (n, mut s) = lb("web", "10.96.0.1", true);
        s.internal_policy = TrafficPolicy::Local;
        d.apply(Change::Service(n.clone(), Some(s))).unwrap();
        let (sn, ss) = on(
            slice(
                "web-a",
                "web",
                8080,
                &["10.244.1.2", "10.244.2.2", "10.244.2.3"],
            ),
            &["n1", "n2", "n2"],
        );
        d.apply(Change::Slice(sn, Some(ss))).unwrap();
        for (k, f) in d.frontends(&n) {
            assert_eq!(f.backends.len(), 1, "{k}");
            assert!(!f.snat_remote, "{k}");
        }
        assert_eq!(
            d.health_check(&n),
            Some(HealthCheck {
                port: Port::new(32000).unwrap(),
                local_endpoints: 1
            })
        );
        // Seen from n3 (no endpoint there): nothing to serve, health check 0.
        let mut d3 = DesiredState::for_node(Some("n3".into()));
        let (n, s) = lb("web", "10.96.0.1", true);
        d3.apply(Change::Service(n.clone(), Some(s))).unwrap();
        let (sn, ss) = on(slice("web-a", "web", 8080, &["10.244.1.2"]), &["n1"]);
        d3.apply(Change::Slice(sn, Some(ss))).unwrap();
        assert_eq!(d3.health_check(&n).unwrap().local_endpoints, 0);
        let ext: Vec<usize> = d3
            .frontends(&n)
            .iter()
            .filter(|(k, _)| k.scope == Scope::External)
            .map(|(_, f)| f.backends.len())
            .collect();
        assert_eq!(ext, [0, 0]);
    }

    #[test]
    fn exactly_one_node_with_endpoints_announces_an_address() {
        let nodes = ["n1", "n2", "n3"];
        let mut speakers = Vec::new();
        for me in nodes {
            let mut d = DesiredState::for_node(Some(me.into()));
            let (n, s) = lb("web", "10.96.0.1", true);
            d.apply(Change::Service(n.clone(), Some(s))).unwrap();
            let (sn, ss) = on(
                slice("web-a", "web", 8080, &["10.244.1.2", "10.244.2.2"]),
                &["n1", "n2"],
            );
            d.apply(Change::Slice(sn, Some(ss))).unwrap();
            if !d.announced(&n).is_empty() {
                speakers.push(me);
            }
        }
        assert_eq!(speakers.len(), 1, "{speakers:?}");
        assert_ne!(speakers[0], "n3", "n3 has no endpoint");
    }

    #[test]
    fn two_services_cannot_share_a_node_port_or_external_address() {
        let mut d = DesiredState::default();
        let (a, s) = lb("a", "10.96.0.1", false);
        d.apply(Change::Service(a, Some(s))).unwrap();
        let (b, s) = lb("b", "10.96.0.2", false);
        assert!(matches!(
            d.apply(Change::Service(b.clone(), Some(s))),
            Err(Rejection::DuplicateFrontend { .. })
        ));
        assert!(!d.has_service(&b));
    }

    fn slice(name: &str, service: &str, port: u16, ips: &[&str]) -> (SliceName, SliceSpec) {
        (
            SliceName(ObjectKey::new("default", name)),
            SliceSpec {
                service: ServiceName(ObjectKey::new("default", service)),
                family: Family::V4,
                ports: vec![SlicePort {
                    name: PortName("http".into()),
                    port: Port::new(port).unwrap(),
                    protocol: Protocol::Tcp,
                }],
                endpoints: ips
                    .iter()
                    .map(|i| SliceEndpoint::ready(i.parse().unwrap()))
                    .collect(),
            },
        )
    }

    #[test]
    fn slices_join_their_service_by_label_and_port_name() {
        let mut d = DesiredState::default();
        let (n, s) = svc("web", "10.96.0.1", 80);
        d.apply(Change::Service(n.clone(), Some(s))).unwrap();
        let (sn, ss) = slice("web-a", "web", 8080, &["10.244.0.1", "10.244.0.2"]);
        assert_eq!(
            d.apply(Change::Slice(sn, Some(ss))).unwrap(),
            vec![n.clone()]
        );
        let (sn, ss) = slice("web-b", "web", 8080, &["10.244.0.3"]);
        d.apply(Change::Slice(sn, Some(ss))).unwrap();
        let f = d.frontends(&n);
        assert_eq!(f.len(), 1);
        assert_eq!(f.values().next().unwrap().backends.len(), 3);
    }

    #[test]
    fn serving_terminating_endpoints_serve_only_when_none_is_ready() {
        let mut d = DesiredState::default();
        let (n, s) = svc("web", "10.96.0.1", 80);
        d.apply(Change::Service(n.clone(), Some(s))).unwrap();
        let (sn, mut ss) = slice("web-a", "web", 8080, &["10.244.0.1", "10.244.0.2"]);
        ss.endpoints[1] = SliceEndpoint {
            ready: false,
            terminating: true,
            ..ss.endpoints[1].clone()
        };
        d.apply(Change::Slice(sn.clone(), Some(ss.clone())))
            .unwrap();
        let ips = |d: &DesiredState| -> Vec<String> {
            d.frontends(&n)
                .values()
                .next()
                .unwrap()
                .backends
                .iter()
                .map(|e| e.ip.to_string())
                .collect()
        };
        assert_eq!(ips(&d), ["10.244.0.1"]);
        // The last ready one starts terminating too: both serve until they stop serving.
        ss.endpoints[0] = SliceEndpoint {
            ready: false,
            terminating: true,
            ..ss.endpoints[0].clone()
        };
        d.apply(Change::Slice(sn.clone(), Some(ss.clone())))
            .unwrap();
        assert_eq!(ips(&d), ["10.244.0.1", "10.244.0.2"]);
        ss.endpoints[0].serving = false;
        d.apply(Change::Slice(sn, Some(ss))).unwrap();
        assert_eq!(ips(&d), ["10.244.0.2"]);
    }

    #[test]
    fn a_duplicate_cluster_ip_is_refused_and_leaves_the_owner_alone() {
        let mut d = DesiredState::default();
        let (a, sa) = svc("a", "10.96.0.1", 80);
        let (b, sb) = svc("b", "10.96.0.1", 81);
        d.apply(Change::Service(a.clone(), Some(sa))).unwrap();
        assert!(matches!(
            d.apply(Change::Service(b.clone(), Some(sb))),
            Err(Rejection::DuplicateClusterIp { .. })
        ));
        assert!(!d.has_service(&b));
        assert_eq!(d.frontends(&a).len(), 1);
    }

    #[test]
    fn orphan_slices_are_those_without_their_service() {
        let mut d = DesiredState::default();
        let (sn, ss) = slice("web-a", "web", 8080, &["10.244.0.1"]);
        d.apply(Change::Slice(sn, Some(ss))).unwrap();
        assert_eq!(d.orphan_slices().len(), 1);
        let (n, s) = svc("web", "10.96.0.1", 80);
        d.apply(Change::Service(n, Some(s))).unwrap();
        assert!(d.orphan_slices().is_empty());
    }

    #[test]
    fn a_slice_moving_to_another_service_affects_both() {
        let mut d = DesiredState::default();
        let (sn, ss) = slice("s", "a", 8080, &["10.244.0.1"]);
        d.apply(Change::Slice(sn.clone(), Some(ss))).unwrap();
        let (_, ss) = slice("s", "b", 8080, &["10.244.0.1"]);
        let affected = d.apply(Change::Slice(sn, Some(ss))).unwrap();
        assert_eq!(affected.len(), 2);
    }
}
