//! The proxy's desired model in Kubernetes terms, and its conversion from the API types
//! (k8s-openapi `Service` and `EndpointSlice`). Every source (manifests directory today,
//! an API watch later) feeds the same objects, so validation lives here, once.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::fmt;
use std::net::IpAddr;

/// The label joining an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Kubernetes' default sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// Kubernetes' upper bound for that timeout (one day).
pub const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;

/// namespace/name of an object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn from_meta(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Result<Self, ModelError> {
        let name = meta
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(ModelError::MissingName)?;
        let namespace = meta
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        Ok(ObjectKey { namespace, name })
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Service's namespace/name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceName(pub ObjectKey);

/// An EndpointSlice's namespace/name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceName(pub ObjectKey);

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for SliceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// L4 protocols the data path translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn parse(s: Option<&str>) -> Result<Self, ModelError> {
        match s.unwrap_or("TCP") {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            other => Err(ModelError::UnsupportedProtocol(other.to_string())),
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => proxy_common::PROTO_TCP,
            Protocol::Udp => proxy_common::PROTO_UDP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            proxy_common::PROTO_TCP => Some(Protocol::Tcp),
            proxy_common::PROTO_UDP => Some(Protocol::Udp),
            _ => None,
        }
    }

    /// Lower-case name, as iptables spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A port number that is never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port(std::num::NonZeroU16);

impl Port {
    pub fn new(n: u16) -> Option<Self> {
        std::num::NonZeroU16::new(n).map(Port)
    }

    fn from_i32(n: i32) -> Result<Self, ModelError> {
        u16::try_from(n)
            .ok()
            .and_then(Port::new)
            .ok_or(ModelError::InvalidPort(n))
    }

    pub fn get(self) -> u16 {
        self.0.get()
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A port's name ("" for the single unnamed port): the join between a Service port and an
/// EndpointSlice port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortName(pub String);

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: PortName,
    pub port: Port,
    pub protocol: Protocol,
    /// The port on every node (NodePort and LoadBalancer Services).
    pub node_port: Option<Port>,
}

/// spec.type, as far as the proxy cares: what reaches the service from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// externalTrafficPolicy and internalTrafficPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Every endpoint of the cluster.
    Cluster,
    /// Endpoints on this node only (north-south: the client address is kept).
    Local,
}

impl TrafficPolicy {
    fn parse(field: &'static str, s: Option<&str>) -> Result<Self, ModelError> {
        match s.unwrap_or("Cluster") {
            "Cluster" => Ok(TrafficPolicy::Cluster),
            "Local" => Ok(TrafficPolicy::Local),
            other => Err(ModelError::InvalidPolicy {
                field,
                value: other.to_string(),
            }),
        }
    }
}

/// sessionAffinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    None,
    ClientIp { timeout_s: u32 },
}

/// What the proxy needs of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub affinity: Affinity,
    pub kind: ServiceKind,
    /// spec.externalIPs.
    pub external_ips: Vec<IpAddr>,
    /// status.loadBalancer.ingress[].ip (LoadBalancer Services).
    pub load_balancer_ips: Vec<IpAddr>,
    /// spec.loadBalancerSourceRanges: who may reach the LoadBalancer addresses (empty:
    /// everyone).
    pub source_ranges: Vec<IpNet>,
    pub external_policy: TrafficPolicy,
    pub internal_policy: TrafficPolicy,
    /// spec.healthCheckNodePort (LoadBalancer with externalTrafficPolicy Local).
    pub health_check_node_port: Option<Port>,
}

impl ServiceSpec {
    /// A ClusterIP Service with these addresses and ports, everything else defaulted.
    pub fn cluster_ip(cluster_ips: Vec<IpAddr>, ports: Vec<ServicePort>) -> ServiceSpec {
        ServiceSpec {
            cluster_ips,
            ports,
            affinity: Affinity::None,
            kind: ServiceKind::ClusterIp,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            external_policy: TrafficPolicy::Cluster,
            internal_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
        }
    }
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: PortName,
    pub port: Port,
    pub protocol: Protocol,
}

/// IP family of a slice's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// One endpoint of a slice, with the conditions the proxy acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    /// May receive new connections.
    pub ready: bool,
    /// Able to answer (a terminating pod that still passes its readiness probe).
    pub serving: bool,
    pub terminating: bool,
    /// The node it runs on (for traffic policies Local).
    pub node: Option<String>,
}

impl SliceEndpoint {
    /// A ready endpoint (tests and simple sources).
    pub fn ready(ip: IpAddr) -> SliceEndpoint {
        SliceEndpoint {
            ip,
            ready: true,
            serving: true,
            terminating: false,
            node: None,
        }
    }

    /// Terminating but still serving: used only when no endpoint is ready (KEP-1669), so a
    /// rolling update of a single replica does not refuse connections.
    pub fn serving_terminating(&self) -> bool {
        !self.ready && self.serving && self.terminating
    }
}

/// What the proxy needs of an EndpointSlice: its service, its ports, its endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    pub service: ServiceName,
    pub family: Family,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<SliceEndpoint>,
}

/// Why an object cannot be programmed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("metadata.name is missing")]
    MissingName,
    #[error("spec is missing")]
    MissingSpec,
    #[error("spec.clusterIP is missing (the proxy needs an allocated cluster IP)")]
    MissingClusterIp,
    #[error("invalid IP address {0:?}")]
    InvalidIp(String),
    #[error("invalid port {0}: must be 1-65535")]
    InvalidPort(i32),
    #[error("protocol {0} is not supported (TCP and UDP are)")]
    UnsupportedProtocol(String),
    #[error("port {port}/{protocol:?} appears twice")]
    DuplicatePort { port: u16, protocol: Protocol },
    #[error("sessionAffinityConfig.clientIP.timeoutSeconds {0} is outside 1-86400")]
    InvalidAffinityTimeout(i32),
    #[error("label {SERVICE_NAME_LABEL} is missing")]
    MissingServiceLabel,
    #[error("IP family of {0} does not match the slice's addressType")]
    FamilyMismatch(IpAddr),
    #[error("spec.{field} {value:?} is not Cluster or Local")]
    InvalidPolicy { field: &'static str, value: String },
    #[error("spec.loadBalancerSourceRanges: {0:?} is not a CIDR")]
    InvalidSourceRange(String),
    #[error("spec.type {0:?} is not ClusterIP, NodePort, LoadBalancer or ExternalName")]
    InvalidType(String),
}

impl ServiceSpec {
    /// The proxy's view of a Service; `None` for Services it does not proxy (headless,
    /// ExternalName).
    pub fn from_k8s(svc: &Service) -> Result<Option<(ServiceName, ServiceSpec)>, ModelError> {
        let key = ServiceName(ObjectKey::from_meta(&svc.metadata)?);
        let spec = svc.spec.as_ref().ok_or(ModelError::MissingSpec)?;
        if spec.type_.as_deref() == Some("ExternalName") {
            return Ok(None);
        }
        let ips: Vec<&str> = match (&spec.cluster_ips, &spec.cluster_ip) {
            (Some(ips), _) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
            (_, Some(ip)) if !ip.is_empty() => vec![ip.as_str()],
            _ => return Err(ModelError::MissingClusterIp),
        };
        if ips.contains(&"None") {
            return Ok(None);
        }
        let cluster_ips = ips
            .iter()
            .map(|ip| {
                ip.parse()
                    .map_err(|_| ModelError::InvalidIp(ip.to_string()))
            })
            .collect::<Result<Vec<IpAddr>, _>>()?;
        let kind = match spec.type_.as_deref().unwrap_or("ClusterIP") {
            "ClusterIP" => ServiceKind::ClusterIp,
            "NodePort" => ServiceKind::NodePort,
            "LoadBalancer" => ServiceKind::LoadBalancer,
            other => return Err(ModelError::InvalidType(other.to_string())),
        };
        let external = kind != ServiceKind::ClusterIp;
        let mut ports: Vec<ServicePort> = Vec::new();
        for p in spec.ports.iter().flatten() {
            let node_port = match p.node_port {
                Some(n) if external && n != 0 => Some(Port::from_i32(n)?),
                _ => None,
            };
            let port = ServicePort {
                name: PortName(p.name.clone().unwrap_or_default()),
                port: Port::from_i32(p.port)?,
                protocol: Protocol::parse(p.protocol.as_deref())?,
                node_port,
            };
            if ports
                .iter()
                .any(|q| q.port == port.port && q.protocol == port.protocol)
            {
                return Err(ModelError::DuplicatePort {
                    port: port.port.get(),
                    protocol: port.protocol,
                });
            }
            ports.push(port);
        }
        let affinity = match spec.session_affinity.as_deref() {
            Some("ClientIP") => {
                let t = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S as i32);
                match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => {
                        Affinity::ClientIp { timeout_s: t }
                    }
                    _ => return Err(ModelError::InvalidAffinityTimeout(t)),
                }
            }
            _ => Affinity::None,
        };
        let parse_ips = |ips: Vec<&str>| -> Result<Vec<IpAddr>, ModelError> {
            ips.into_iter()
                .map(|ip| {
                    ip.parse()
                        .map_err(|_| ModelError::InvalidIp(ip.to_string()))
                })
                .collect()
        };
        let external_ips = parse_ips(
            spec.external_ips
                .iter()
                .flatten()
                .map(String::as_str)
                .collect(),
        )?;
        // Addresses a load balancer proxies to the nodes itself (ipMode Proxy) are not
        // captured on the nodes (KEP-1860).
        let load_balancer_ips = if kind == ServiceKind::LoadBalancer {
            parse_ips(
                svc.status
                    .iter()
                    .filter_map(|s| s.load_balancer.as_ref())
                    .flat_map(|l| l.ingress.iter().flatten())
                    .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                    .filter_map(|i| i.ip.as_deref())
                    .collect(),
            )?
        } else {
            Vec::new()
        };
        let source_ranges = spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .map(|r| {
                r.trim()
                    .parse::<IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|_| ModelError::InvalidSourceRange(r.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let external_policy = TrafficPolicy::parse(
            "externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?;
        let internal_policy = TrafficPolicy::parse(
            "internalTrafficPolicy",
            spec.internal_traffic_policy.as_deref(),
        )?;
        let health_check_node_port = match spec.health_check_node_port {
            Some(p) if p != 0 && kind == ServiceKind::LoadBalancer => Some(Port::from_i32(p)?),
            _ => None,
        };
        Ok(Some((
            key,
            ServiceSpec {
                cluster_ips,
                ports,
                affinity,
                kind,
                external_ips,
                load_balancer_ips,
                source_ranges,
                external_policy,
                internal_policy,
                health_check_node_port,
            },
        )))
    }
}

impl SliceSpec {
    /// The proxy's view of an EndpointSlice; `None` for FQDN slices (not proxied).
    pub fn from_k8s(slice: &EndpointSlice) -> Result<Option<(SliceName, SliceSpec)>, ModelError> {
        let key = SliceName(ObjectKey::from_meta(&slice.metadata)?);
        let family = match slice.address_type.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            _ => return Ok(None),
        };
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty())
            .ok_or(ModelError::MissingServiceLabel)?;
        let mut ports = Vec::new();
        for p in slice.ports.iter().flatten() {
            // A port without a number means "all ports", which ClusterIP services never
            // produce; kube-proxy ignores it too.
            let Some(n) = p.port else { continue };
            ports.push(SlicePort {
                name: PortName(p.name.clone().unwrap_or_default()),
                port: Port::from_i32(n)?,
                protocol: Protocol::parse(p.protocol.as_deref())?,
            });
        }
        let mut endpoints = Vec::new();
        for ep in &slice.endpoints {
            // As the EndpointSlice API defines them: unknown readiness and serving count as
            // true, unknown terminating as false.
            let c = ep.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            // Neither ready nor a serving terminating fallback: nothing the proxy uses.
            let usable = ready || (serving && terminating);
            if !usable {
                continue;
            }
            // Consumers use the first address only (the API says the others are ignored).
            let Some(addr) = ep.addresses.first() else {
                continue;
            };
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| ModelError::InvalidIp(addr.clone()))?;
            if Family::of(&ip) != family {
                return Err(ModelError::FamilyMismatch(ip));
            }
            endpoints.push(SliceEndpoint {
                ip,
                ready,
                serving,
                terminating,
                node: ep.node_name.clone().filter(|n| !n.is_empty()),
            });
        }
        Ok(Some((
            key.clone(),
            SliceSpec {
                service: ServiceName(ObjectKey::new(key.0.namespace, service.clone())),
                family,
                ports,
                endpoints,
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(json: serde_json::Value) -> Service {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn service_with_named_ports_and_affinity() {
        let s = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "sessionAffinity": "ClientIP",
                     "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
        }));
        let (name, spec) = ServiceSpec::from_k8s(&s).unwrap().unwrap();
        assert_eq!(name.to_string(), "shop/web");
        assert_eq!(
            spec.cluster_ips,
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(spec.ports[1].protocol, Protocol::Udp);
        assert_eq!(spec.affinity, Affinity::ClientIp { timeout_s: 10_800 });
    }

    #[test]
    fn bad_services_are_rejected_with_the_reason() {
        let port0 = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 0}]}
        }));
        assert_eq!(
            ServiceSpec::from_k8s(&port0),
            Err(ModelError::InvalidPort(0))
        );
        let no_ip = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
            "spec": {"ports": [{"port": 80}]}
        }));
        assert_eq!(
            ServiceSpec::from_k8s(&no_ip),
            Err(ModelError::MissingClusterIp)
        );
        let sctp = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80, "protocol": "SCTP"}]}
        }));
        assert!(matches!(
            ServiceSpec::from_k8s(&sctp),
            Err(ModelError::UnsupportedProtocol(_))
        ));
    }

    #[test]
    fn load_balancer_with_policies_ranges_and_health_check() {
        let mut s = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "lb"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.7",
                     "externalIPs": ["192.0.2.9"],
                     "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
                     "healthCheckNodePort": 32100,
                     "loadBalancerSourceRanges": ["10.0.0.0/8", " 192.168.1.7/24 "],
                     "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.249.0.200"},
                                                     {"ip": "10.249.0.201", "ipMode": "Proxy"}]}}
        }));
        let (_, spec) = ServiceSpec::from_k8s(&s).unwrap().unwrap();
        assert_eq!(spec.kind, ServiceKind::LoadBalancer);
        assert_eq!(spec.ports[0].node_port.map(Port::get), Some(30080));
        assert_eq!(
            spec.external_ips,
            vec!["192.0.2.9".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            spec.load_balancer_ips,
            vec!["10.249.0.200".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(spec.source_ranges[1].to_string(), "192.168.1.0/24");
        assert_eq!(spec.external_policy, TrafficPolicy::Local);
        assert_eq!(spec.internal_policy, TrafficPolicy::Local);
        assert_eq!(spec.health_check_node_port.map(Port::get), Some(32100));
        // A ClusterIP Service ignores node ports and ingress addresses.
        s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        let (_, spec) = ServiceSpec::from_k8s(&s).unwrap().unwrap();
        assert!(spec.ports[0].node_port.is_none() && spec.load_balancer_ips.is_empty());
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["nope".into()]);
        assert!(matches!(
            ServiceSpec::from_k8s(&s),
            Err(ModelError::InvalidSourceRange(_))
        ));
    }

    #[test]
    fn headless_and_external_name_are_not_proxied() {
        let headless = service(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }));
        assert_eq!(ServiceSpec::from_k8s(&headless), Ok(None));
    }

    #[test]
    fn slice_keeps_ready_endpoints_only() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.244.0.2"], "conditions": {"ready": true}, "nodeName": "n1"},
                {"addresses": ["10.244.0.3"], "conditions": {"ready": false}},
                {"addresses": ["10.244.0.4"]},
                {"addresses": ["10.244.0.5"],
                 "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }))
        .unwrap();
        let (name, spec) = SliceSpec::from_k8s(&slice).unwrap().unwrap();
        assert_eq!(name.to_string(), "shop/web-abc");
        assert_eq!(spec.service.to_string(), "shop/web");
        let ready: Vec<String> = spec
            .endpoints
            .iter()
            .filter(|e| e.ready)
            .map(|e| e.ip.to_string())
            .collect();
        assert_eq!(ready, ["10.244.0.2", "10.244.0.4"]);
        assert_eq!(spec.endpoints[0].node.as_deref(), Some("n1"));
        // Not ready and not serving: left out; serving and terminating: kept as a fallback.
        assert_eq!(spec.endpoints.len(), 3);
        assert!(spec.endpoints[2].serving_terminating());
        assert_eq!(spec.ports[0].port.get(), 8080);
    }
}
