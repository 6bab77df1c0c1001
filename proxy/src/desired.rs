//! The desired state: Services and EndpointSlices joined into frontends (cluster IP, port,
//! protocol) with their ready backends. Each change names the services it affects, so a
//! data path re-derives only those: O(size of the changed service), never O(all services).

use crate::model::{
    Affinity, Family, Port, Protocol, ServiceName, ServiceSpec, SliceName, SliceSpec,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;

/// A frontend: what a client connects to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    pub ip: IpAddr,
    pub port: Port,
    pub protocol: Protocol,
}

impl fmt::Display for FrontendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol.as_str()),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol.as_str()),
        }
    }
}

/// A backend address: a ready endpoint and the slice's port for the frontend's port name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: Port,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// What one frontend should do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFrontend {
    pub backends: BTreeSet<Endpoint>,
    pub affinity: Affinity,
    /// The service port's name, for logs, metrics and iptables comments.
    pub port_name: String,
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
}

#[derive(Default)]
pub struct DesiredState {
    services: HashMap<ServiceName, ServiceSpec>,
    slices: HashMap<SliceName, SliceSpec>,
    slices_of: HashMap<ServiceName, BTreeSet<SliceName>>,
    ip_owner: HashMap<IpAddr, ServiceName>,
}

impl DesiredState {
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
                if let Some(old) = self.services.get(&name) {
                    for ip in &old.cluster_ips {
                        self.ip_owner.remove(ip);
                    }
                }
                for ip in &spec.cluster_ips {
                    self.ip_owner.insert(*ip, name.clone());
                }
                self.services.insert(name.clone(), spec);
                Ok(vec![name])
            }
            Change::Service(name, None) => {
                if let Some(old) = self.services.remove(&name) {
                    for ip in &old.cluster_ips {
                        self.ip_owner.remove(ip);
                    }
                }
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

    /// The frontends of a service (empty if it does not exist): for each cluster IP and
    /// port, the ready endpoints of the slices of the same family whose port has the same
    /// name and protocol; when none is ready, the serving terminating ones (KEP-1669).
    pub fn frontends(&self, name: &ServiceName) -> Frontends {
        let mut out = Frontends::new();
        let Some(spec) = self.services.get(name) else {
            return out;
        };
        let slices: Vec<&SliceSpec> = self
            .slices_of
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect();
        for ip in &spec.cluster_ips {
            let family = Family::of(ip);
            for sp in &spec.ports {
                let mut ready = BTreeSet::new();
                let mut fallback = BTreeSet::new();
                for slice in slices.iter().filter(|s| s.family == family) {
                    let Some(port) = slice
                        .ports
                        .iter()
                        .find(|p| p.name == sp.name && p.protocol == sp.protocol)
                    else {
                        continue;
                    };
                    for ep in &slice.endpoints {
                        let e = Endpoint {
                            ip: ep.ip,
                            port: port.port,
                        };
                        if ep.ready {
                            ready.insert(e);
                        } else if ep.serving_terminating() {
                            fallback.insert(e);
                        }
                    }
                }
                let backends = if ready.is_empty() { fallback } else { ready };
                out.insert(
                    FrontendKey {
                        ip: *ip,
                        port: sp.port,
                        protocol: sp.protocol,
                    },
                    DesiredFrontend {
                        backends,
                        affinity: spec.affinity,
                        port_name: sp.name.0.clone(),
                    },
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ObjectKey, PortName, ServicePort, SliceEndpoint, SlicePort};

    pub(crate) fn svc(name: &str, ip: &str, port: u16) -> (ServiceName, ServiceSpec) {
        (
            ServiceName(ObjectKey::new("default", name)),
            ServiceSpec {
                cluster_ips: vec![ip.parse().unwrap()],
                ports: vec![ServicePort {
                    name: PortName("http".into()),
                    port: Port::new(port).unwrap(),
                    protocol: Protocol::Tcp,
                }],
                affinity: Affinity::None,
            },
        )
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
