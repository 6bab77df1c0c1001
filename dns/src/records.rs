//! The cluster zone: the records of every Service, built from the Service and its
//! EndpointSlices, and the answer to one question about a name.
//!
//! Records are kept per Service: every name under `<svc>.<ns>.svc.<domain>` belongs to
//! exactly one Service, so a change to a Service or to one of its slices replaces that
//! Service's names and nothing else (O(that Service's endpoints), never a rebuild of the
//! zone). Reverse (PTR) names can be claimed by several Services (two headless Services
//! selecting the same pods), so they are kept per address with their owner.
//!
//! Pod names (`a-b-c-d.<ns>.pod.<domain>`) are answered from the name itself, as CoreDNS's
//! `pods insecure` mode (the default of kube-dns and CoreDNS) does: no pod watch.

use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::RwLock;

/// The TTL of every cluster record (and of negative answers), as CoreDNS's default.
pub const TTL: u32 = 5;

/// The label an EndpointSlice names its Service by.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Which Service (namespace, name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// A name could not be made from the API's strings (they are validated by the API server,
/// but a DNS server must not trust that).
#[derive(Debug, thiserror::Error)]
#[error("invalid DNS name {name:?}: {reason}")]
pub struct NameError {
    name: String,
    reason: String,
}

fn name(text: &str) -> Result<Name, NameError> {
    Name::from_ascii(text)
        .map(|n| n.to_lowercase())
        .map_err(|e| NameError {
            name: text.to_string(),
            reason: e.to_string(),
        })
}

/// The cluster domain and the names derived from it.
#[derive(Clone, Debug)]
pub struct Zone {
    /// `cluster.local.`
    pub domain: Name,
    lower: LowerName,
    svc: LowerName,
    pod: LowerName,
    soa: Record,
}

impl Zone {
    pub fn new(domain: &str) -> Result<Zone, NameError> {
        let domain = name(&format!("{}.", domain.trim_end_matches('.')))?;
        let svc = name("svc")?.append_domain(&domain).map_err(|e| NameError {
            name: domain.to_string(),
            reason: e.to_string(),
        })?;
        let pod = name("pod")?.append_domain(&domain).map_err(|e| NameError {
            name: domain.to_string(),
            reason: e.to_string(),
        })?;
        let mname = name("ns.dns")?
            .append_domain(&domain)
            .map_err(|e| NameError {
                name: domain.to_string(),
                reason: e.to_string(),
            })?;
        let rname = name("hostmaster")?
            .append_domain(&domain)
            .map_err(|e| NameError {
                name: domain.to_string(),
                reason: e.to_string(),
            })?;
        // Negative answers are cached for `minimum` (RFC 2308): the same 5 s as records.
        let soa = Record::from_rdata(
            domain.clone(),
            TTL,
            RData::SOA(SOA::new(mname, rname, 1, 7200, 1800, 86400, TTL)),
        );
        Ok(Zone {
            lower: LowerName::new(&domain),
            svc: LowerName::new(&svc),
            pod: LowerName::new(&pod),
            domain,
            soa,
        })
    }

    /// Whether `name` is in the cluster domain (answered here, never forwarded).
    pub fn contains(&self, name: &LowerName) -> bool {
        self.lower.zone_of(name)
    }

    /// The zone's SOA, sent in the authority section of negative answers.
    pub fn soa(&self) -> &Record {
        &self.soa
    }

    /// `<svc>.<ns>.svc.<domain>`
    fn service_name(&self, key: &ServiceKey) -> Result<Name, NameError> {
        let ns = name(&key.namespace)?;
        let svc = name(&key.name)?;
        let base: Name = (&self.svc).into();
        let joined = svc
            .append_domain(&ns)
            .and_then(|n| n.append_domain(&base))
            .map_err(|e| NameError {
                name: format!("{}.{}", key.name, key.namespace),
                reason: e.to_string(),
            })?;
        Ok(joined)
    }

    /// The address of `a-b-c-d.<ns>.pod.<domain>` (IPv6: `2001-db8--1`), if `qname` is one.
    fn pod_address(&self, qname: &LowerName) -> Option<IpAddr> {
        let pod_labels = self.pod.num_labels() as usize;
        let qname: Name = qname.into();
        if qname.num_labels() as usize != pod_labels + 2 || !self.pod.zone_of(&(&qname).into()) {
            return None;
        }
        let first = qname.iter().next()?;
        let text = std::str::from_utf8(first).ok()?;
        if let Ok(v4) = text.replace('-', ".").parse::<Ipv4Addr>() {
            return Some(IpAddr::V4(v4));
        }
        text.replace('-', ":")
            .parse::<Ipv6Addr>()
            .ok()
            .map(IpAddr::V6)
    }
}

/// What the zone says about one question.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// The name exists; these are its records of the asked type (maybe none: NODATA).
    Records(Vec<Record>),
    /// The name does not exist in the cluster domain.
    NxDomain,
    /// Not the cluster's to answer: forward upstream.
    Forward,
}

/// One Service's part of the zone.
#[derive(Default)]
struct Owned {
    names: Vec<LowerName>,
    ptrs: Vec<IpAddr>,
}

#[derive(Default)]
struct Tables {
    names: HashMap<LowerName, Vec<Record>>,
    reverse: HashMap<IpAddr, Vec<(ServiceKey, Record)>>,
    owned: HashMap<ServiceKey, Owned>,
    learned: HashMap<ServiceKey, Learned>,
}

/// When this server learned a Service's name and each address the name answers with: the
/// "name resolvable" step of `kubectl skiff trace`, served on the metrics port as
/// `/learned?namespace=&name=`. Times are this server's clock, from the moment the records
/// were in the table queries read.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Learned {
    /// `<svc>.<ns>.svc.<domain>.`
    pub name: String,
    /// Since when the name resolves (it started again if the name went away meanwhile).
    pub learned: Timestamp,
    /// The name's A and AAAA answers (the cluster IP, or a headless Service's ready
    /// endpoints), each since it was first answered.
    pub addresses: Vec<LearnedAddress>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LearnedAddress {
    pub ip: IpAddr,
    pub learned: Timestamp,
}

/// The addresses `fqdn` answers with in `records`.
fn addresses_of(records: &ServiceRecords, fqdn: &LowerName) -> BTreeSet<IpAddr> {
    records
        .names
        .get(fqdn)
        .into_iter()
        .flatten()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// What replaced records `now` make of `old`: times of what stays are kept.
fn learn(
    old: Option<Learned>,
    fqdn: &LowerName,
    records: &ServiceRecords,
    now: Timestamp,
) -> Option<Learned> {
    if !records.names.contains_key(fqdn) {
        return None;
    }
    let kept: HashMap<IpAddr, Timestamp> = old
        .as_ref()
        .map(|o| o.addresses.iter().map(|a| (a.ip, a.learned)).collect())
        .unwrap_or_default();
    Some(Learned {
        name: fqdn.to_string(),
        learned: old.map_or(now, |o| o.learned),
        addresses: addresses_of(records, fqdn)
            .into_iter()
            .map(|ip| LearnedAddress {
                ip,
                learned: kept.get(&ip).copied().unwrap_or(now),
            })
            .collect(),
    })
}

/// The cluster's records, read by every query and replaced per Service by the watch.
pub struct Records {
    zone: Zone,
    tables: RwLock<Tables>,
}

/// The records one Service contributes: names and their records, PTRs by address.
#[derive(Debug, Default, PartialEq)]
pub struct ServiceRecords {
    pub names: BTreeMap<LowerName, Vec<Record>>,
    pub ptrs: BTreeMap<IpAddr, Record>,
}

impl ServiceRecords {
    fn add(&mut self, name: &Name, data: RData) {
        let record = Record::from_rdata(name.clone(), TTL, data);
        let list = self.names.entry(LowerName::new(name)).or_default();
        if !list.contains(&record) {
            list.push(record);
        }
    }

    fn add_address(&mut self, name: &Name, ip: IpAddr) {
        match ip {
            IpAddr::V4(v4) => self.add(name, RData::A(A(v4))),
            IpAddr::V6(v6) => self.add(name, RData::AAAA(AAAA(v6))),
        }
    }

    fn add_ptr(&mut self, ip: IpAddr, target: &Name) {
        self.ptrs.entry(ip).or_insert_with(|| {
            Record::from_rdata(Name::from(ip), TTL, RData::PTR(PTR(target.clone())))
        });
    }
}

/// A port as DNS names it: `_<name>._<protocol>`.
fn srv_prefix(port_name: &str, protocol: Option<&str>) -> Option<Name> {
    if port_name.is_empty() {
        return None;
    }
    let proto = protocol.unwrap_or("TCP").to_ascii_lowercase();
    name(&format!("_{port_name}._{proto}")).ok()
}

fn parse_ips(ips: &[String]) -> Vec<IpAddr> {
    ips.iter().filter_map(|s| s.parse().ok()).collect()
}

/// The endpoint's label under the Service's name: its hostname, else its address with
/// dashes (as CoreDNS names endpoints without a hostname).
fn endpoint_label(hostname: Option<&str>, ip: IpAddr) -> String {
    match hostname {
        Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
        _ => ip.to_string().replace(['.', ':'], "-"),
    }
}

/// The records of `service` with its `slices` (those naming it by label).
pub fn service_records(
    zone: &Zone,
    key: &ServiceKey,
    service: &Service,
    slices: &[&EndpointSlice],
) -> Result<ServiceRecords, NameError> {
    let mut out = ServiceRecords::default();
    let Some(spec) = service.spec.as_ref() else {
        return Ok(out);
    };
    let fqdn = zone.service_name(key)?;
    if spec.type_.as_deref() == Some("ExternalName") {
        if let Some(target) = spec.external_name.as_deref().filter(|t| !t.is_empty()) {
            let target = name(&format!("{}.", target.trim_end_matches('.')))?;
            out.add(&fqdn, RData::CNAME(CNAME(target)));
        }
        return Ok(out);
    }
    let cluster_ips: Vec<String> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    let headless = cluster_ips.iter().any(|ip| ip == "None");
    if !headless {
        let ips = parse_ips(&cluster_ips);
        if ips.is_empty() {
            return Ok(out);
        }
        for ip in &ips {
            out.add_address(&fqdn, *ip);
            out.add_ptr(*ip, &fqdn);
        }
        for port in spec.ports.iter().flatten() {
            if let Some(prefix) =
                srv_prefix(port.name.as_deref().unwrap_or(""), port.protocol.as_deref())
            {
                if let Ok(srv_name) = prefix.append_domain(&fqdn) {
                    let port = u16::try_from(port.port).unwrap_or(0);
                    out.add(&srv_name, RData::SRV(SRV::new(0, 100, port, fqdn.clone())));
                }
            }
        }
        return Ok(out);
    }
    // Headless: the ready endpoints' addresses under the Service's name, each endpoint
    // under its own name below it, SRV per named port of the slices.
    for slice in slices {
        let mut targets: BTreeSet<Name> = BTreeSet::new();
        for ep in &slice.endpoints {
            // Kubernetes: an unknown readiness counts as ready.
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready {
                continue;
            }
            for ip in parse_ips(&ep.addresses) {
                out.add_address(&fqdn, ip);
                let label = endpoint_label(ep.hostname.as_deref(), ip);
                let Ok(ep_name) = name(&label).and_then(|l| {
                    l.append_domain(&fqdn).map_err(|e| NameError {
                        name: label.clone(),
                        reason: e.to_string(),
                    })
                }) else {
                    continue;
                };
                out.add_address(&ep_name, ip);
                out.add_ptr(ip, &ep_name);
                targets.insert(ep_name);
            }
        }
        for port in slice.ports.iter().flatten() {
            let Some(prefix) =
                srv_prefix(port.name.as_deref().unwrap_or(""), port.protocol.as_deref())
            else {
                continue;
            };
            let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let Ok(srv_name) = prefix.append_domain(&fqdn) else {
                continue;
            };
            for target in &targets {
                out.add(
                    &srv_name,
                    RData::SRV(SRV::new(0, 100, number, target.clone())),
                );
            }
        }
    }
    Ok(out)
}

impl Records {
    pub fn new(zone: Zone) -> Records {
        Records {
            zone,
            tables: RwLock::new(Tables::default()),
        }
    }

    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// Replaces the records of Service `key` (none: the Service is gone).
    pub fn replace(&self, key: &ServiceKey, records: ServiceRecords) {
        self.replace_at(key, records, Timestamp::now())
    }

    /// When this server learned the name of Service `key`, if it resolves.
    pub fn learned(&self, key: &ServiceKey) -> Option<Learned> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        t.learned.get(key).cloned()
    }

    fn replace_at(&self, key: &ServiceKey, records: ServiceRecords, now: Timestamp) {
        let fqdn = self.zone.service_name(key).ok().map(|n| LowerName::new(&n));
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let old = t.learned.remove(key);
        if let Some(l) = fqdn.and_then(|f| learn(old, &f, &records, now)) {
            t.learned.insert(key.clone(), l);
        }
        if let Some(old) = t.owned.remove(key) {
            for n in old.names {
                t.names.remove(&n);
            }
            for ip in old.ptrs {
                if let Some(list) = t.reverse.get_mut(&ip) {
                    list.retain(|(owner, _)| owner != key);
                    if list.is_empty() {
                        t.reverse.remove(&ip);
                    }
                }
            }
        }
        if records.names.is_empty() && records.ptrs.is_empty() {
            return;
        }
        let mut owned = Owned::default();
        for (n, recs) in records.names {
            owned.names.push(n.clone());
            t.names.insert(n, recs);
        }
        for (ip, rec) in records.ptrs {
            owned.ptrs.push(ip);
            t.reverse.entry(ip).or_default().push((key.clone(), rec));
        }
        t.owned.insert(key.clone(), owned);
    }

    /// The number of Services with records.
    pub fn services(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .owned
            .len()
    }

    /// The answer to `qname` `qtype`.
    pub fn lookup(&self, qname: &LowerName, qtype: RecordType) -> Answer {
        if !self.zone.contains(qname) {
            return self.reverse(qname, qtype);
        }
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        if let Some(records) = t.names.get(qname) {
            let matching: Vec<Record> = records
                .iter()
                .filter(|r| {
                    let rt = r.record_type();
                    qtype == RecordType::ANY || rt == qtype || rt == RecordType::CNAME
                })
                .cloned()
                .collect();
            return Answer::Records(matching);
        }
        drop(t);
        if let Some(ip) = self.zone.pod_address(qname) {
            let data = match (ip, qtype) {
                (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => Some(RData::A(A(v4))),
                (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => Some(RData::AAAA(AAAA(v6))),
                _ => None,
            };
            let records = data
                .map(|d| Record::from_rdata(qname.into(), TTL, d))
                .into_iter()
                .collect();
            return Answer::Records(records);
        }
        if *qname == self.zone.lower {
            let records = match qtype {
                RecordType::SOA | RecordType::ANY => vec![self.zone.soa.clone()],
                _ => Vec::new(),
            };
            return Answer::Records(records);
        }
        // The structural names (svc., pod.) exist, without records of their own.
        if *qname == self.zone.svc || *qname == self.zone.pod {
            return Answer::Records(Vec::new());
        }
        Answer::NxDomain
    }

    /// PTR for an address a Service or headless endpoint has; anything else is forwarded.
    fn reverse(&self, qname: &LowerName, qtype: RecordType) -> Answer {
        if !matches!(qtype, RecordType::PTR | RecordType::ANY) {
            return Answer::Forward;
        }
        let name: Name = qname.into();
        let Ok(net) = name.parse_arpa_name() else {
            return Answer::Forward;
        };
        if net.prefix_len() != net.max_prefix_len() {
            return Answer::Forward;
        }
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        match t.reverse.get(&net.addr()) {
            Some(list) => Answer::Records(list.iter().map(|(_, r)| r.clone()).collect()),
            None => Answer::Forward,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn q(s: &str) -> LowerName {
        LowerName::from(Name::from_ascii(s).unwrap())
    }

    fn svc(cluster_ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta::default(),
            spec: Some(ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                cluster_ips: Some(vec![cluster_ip.into()]),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: Some(n.to_string()),
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(eps: &[(&str, Option<&str>, Option<bool>)], ports: &[(&str, i32)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: eps
                .iter()
                .map(|(ip, host, ready)| Endpoint {
                    addresses: vec![ip.to_string()],
                    hostname: host.map(str::to_string),
                    conditions: Some(EndpointConditions {
                        ready: *ready,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some(n.to_string()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            metadata: ObjectMeta::default(),
        }
    }

    fn records() -> Records {
        Records::new(Zone::new("cluster.local").unwrap())
    }

    fn put(r: &Records, ns: &str, name: &str, s: &Service, slices: &[&EndpointSlice]) {
        let key = ServiceKey::new(ns, name);
        r.replace(&key, service_records(r.zone(), &key, s, slices).unwrap());
    }

    fn rdata(a: Answer) -> Vec<String> {
        match a {
            Answer::Records(rs) => {
                let mut v: Vec<String> = rs.iter().map(|r| r.data.to_string()).collect();
                v.sort();
                v
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cluster_ip_service_has_a_srv_and_ptr() {
        let r = records();
        put(
            &r,
            "ns",
            "web",
            &svc("10.96.0.20", &[("http", 80, "TCP"), ("", 81, "TCP")]),
            &[],
        );
        assert_eq!(
            rdata(r.lookup(&q("Web.ns.svc.cluster.local."), RecordType::A)),
            ["10.96.0.20"]
        );
        assert_eq!(
            rdata(r.lookup(&q("web.ns.svc.cluster.local."), RecordType::AAAA)),
            Vec::<String>::new(),
            "NODATA"
        );
        assert_eq!(
            rdata(r.lookup(&q("_http._tcp.web.ns.svc.cluster.local."), RecordType::SRV)),
            ["0 100 80 web.ns.svc.cluster.local."]
        );
        assert_eq!(
            rdata(r.lookup(&q("20.0.96.10.in-addr.arpa."), RecordType::PTR)),
            ["web.ns.svc.cluster.local."]
        );
        assert_eq!(
            r.lookup(&q("nope.ns.svc.cluster.local."), RecordType::A),
            Answer::NxDomain
        );
        assert_eq!(r.lookup(&q("example.com."), RecordType::A), Answer::Forward);
        assert_eq!(
            r.lookup(&q("21.0.96.10.in-addr.arpa."), RecordType::PTR),
            Answer::Forward
        );
        // Deleted: gone with its PTR.
        r.replace(&ServiceKey::new("ns", "web"), ServiceRecords::default());
        assert_eq!(
            r.lookup(&q("web.ns.svc.cluster.local."), RecordType::A),
            Answer::NxDomain
        );
        assert_eq!(
            r.lookup(&q("20.0.96.10.in-addr.arpa."), RecordType::PTR),
            Answer::Forward
        );
        assert_eq!(r.services(), 0);
    }

    #[test]
    fn learned_times_follow_the_names_addresses() {
        let r = records();
        let key = ServiceKey::new("ns", "db");
        let at = |secs: i64| Timestamp::from_second(secs).unwrap();
        let headless = svc("None", &[("pg", 5432, "TCP")]);
        let put_at = |ips: &[&str], t: Timestamp| {
            let eps: Vec<(&str, Option<&str>, Option<bool>)> =
                ips.iter().map(|ip| (*ip, None, Some(true))).collect();
            let s = slice(&eps, &[("pg", 5432)]);
            let recs = service_records(r.zone(), &key, &headless, &[&s]).unwrap();
            r.replace_at(&key, recs, t);
        };
        assert_eq!(r.learned(&key), None);
        put_at(&["10.1.0.5"], at(100));
        put_at(&["10.1.0.5", "10.1.0.6"], at(200));
        let l = r.learned(&key).unwrap();
        assert_eq!(l.name, "db.ns.svc.cluster.local.");
        assert_eq!(
            l.learned,
            at(100),
            "the name resolves since the first address"
        );
        let times: Vec<(String, Timestamp)> = l
            .addresses
            .iter()
            .map(|a| (a.ip.to_string(), a.learned))
            .collect();
        assert_eq!(
            times,
            [
                ("10.1.0.5".to_string(), at(100)),
                ("10.1.0.6".into(), at(200))
            ]
        );
        // Gone and back: learned again.
        r.replace_at(&key, ServiceRecords::default(), at(300));
        assert_eq!(r.learned(&key), None);
        put_at(&["10.1.0.6"], at(400));
        let l = r.learned(&key).unwrap();
        assert_eq!((l.learned, l.addresses[0].learned), (at(400), at(400)));
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["addresses"][0]["ip"], "10.1.0.6");
        assert!(json["learned"]
            .as_str()
            .unwrap()
            .starts_with("1970-01-01T00:06:40"));
    }

    #[test]
    fn headless_service_has_ready_endpoints_hostnames_and_srv() {
        let r = records();
        let s = slice(
            &[
                ("10.1.0.5", Some("db-0"), Some(true)),
                ("10.1.0.6", None, None),
                ("10.1.0.7", Some("db-2"), Some(false)),
            ],
            &[("pg", 5432)],
        );
        put(&r, "ns", "db", &svc("None", &[("pg", 5432, "TCP")]), &[&s]);
        assert_eq!(
            rdata(r.lookup(&q("db.ns.svc.cluster.local."), RecordType::A)),
            ["10.1.0.5", "10.1.0.6"]
        );
        assert_eq!(
            rdata(r.lookup(&q("db-0.db.ns.svc.cluster.local."), RecordType::A)),
            ["10.1.0.5"]
        );
        assert_eq!(
            rdata(r.lookup(&q("10-1-0-6.db.ns.svc.cluster.local."), RecordType::A)),
            ["10.1.0.6"]
        );
        assert_eq!(
            r.lookup(&q("db-2.db.ns.svc.cluster.local."), RecordType::A),
            Answer::NxDomain,
            "not ready"
        );
        assert_eq!(
            rdata(r.lookup(&q("_pg._tcp.db.ns.svc.cluster.local."), RecordType::SRV)),
            [
                "0 100 5432 10-1-0-6.db.ns.svc.cluster.local.",
                "0 100 5432 db-0.db.ns.svc.cluster.local."
            ]
        );
        assert_eq!(
            rdata(r.lookup(&q("5.0.1.10.in-addr.arpa."), RecordType::PTR)),
            ["db-0.db.ns.svc.cluster.local."]
        );
    }

    #[test]
    fn pod_names_external_names_and_structure() {
        let r = records();
        assert_eq!(
            rdata(r.lookup(&q("10-1-2-3.ns.pod.cluster.local."), RecordType::A)),
            ["10.1.2.3"]
        );
        assert_eq!(
            rdata(r.lookup(&q("fd00--1.ns.pod.cluster.local."), RecordType::AAAA)),
            ["fd00::1"]
        );
        assert_eq!(
            r.lookup(&q("not-an-ip.ns.pod.cluster.local."), RecordType::A),
            Answer::NxDomain
        );
        let mut ext = svc("", &[]);
        let spec = ext.spec.as_mut().unwrap();
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("db.example.org".into());
        spec.cluster_ip = None;
        spec.cluster_ips = None;
        put(&r, "ns", "ext", &ext, &[]);
        assert_eq!(
            rdata(r.lookup(&q("ext.ns.svc.cluster.local."), RecordType::A)),
            ["db.example.org."]
        );
        assert_eq!(
            rdata(r.lookup(&q("cluster.local."), RecordType::SOA)).len(),
            1
        );
        assert_eq!(
            rdata(r.lookup(&q("svc.cluster.local."), RecordType::A)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn two_services_share_a_reverse_address_until_one_goes() {
        let r = records();
        let s = slice(&[("10.1.0.5", None, Some(true))], &[]);
        put(&r, "ns", "a", &svc("None", &[]), &[&s]);
        put(&r, "ns", "b", &svc("None", &[]), &[&s]);
        assert_eq!(
            rdata(r.lookup(&q("5.0.1.10.in-addr.arpa."), RecordType::PTR)).len(),
            2
        );
        r.replace(&ServiceKey::new("ns", "a"), ServiceRecords::default());
        assert_eq!(
            rdata(r.lookup(&q("5.0.1.10.in-addr.arpa."), RecordType::PTR)),
            ["10-1-0-5.b.ns.svc.cluster.local."]
        );
    }
}
