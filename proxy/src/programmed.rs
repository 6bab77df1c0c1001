//! When this proxy wrote each service into its data path: the wall-clock time of the last
//! write, and per backend address the time it first became usable there. `kubectl skiff
//! trace` reads it (`GET /programmed?namespace=NS&name=NAME` on the status port, reached
//! through the API server's pods/proxy) to show when a pod's endpoint was programmed on
//! each node.
//!
//! One record per service in the desired state and one time per backend address it
//! programs: memory follows the services and endpoints the proxy already holds; a lookup
//! is one hash probe; a batch updates only the services it changed.

use crate::desired::Frontends;
use crate::model::{ObjectKey, ServiceName};
use serde::Serialize;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::SystemTime;

/// One service's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When the service was first written.
    pub first: SystemTime,
    /// When the service was last written.
    pub last: SystemTime,
    /// Backend addresses in the data path, with when each was first written there.
    pub endpoints: HashMap<IpAddr, SystemTime>,
}

/// Every programmed service's record.
#[derive(Debug, Default)]
pub struct Programmed {
    services: HashMap<ServiceName, Record>,
}

impl Programmed {
    /// The service was written with `frontends` at `now`; no frontends (a deleted or no
    /// longer proxied service) removes its record.
    pub fn record(&mut self, service: &ServiceName, frontends: &Frontends, now: SystemTime) {
        if frontends.is_empty() {
            self.services.remove(service);
            return;
        }
        let record = self
            .services
            .entry(service.clone())
            .or_insert_with(|| Record {
                first: now,
                last: now,
                endpoints: HashMap::new(),
            });
        record.last = now;
        let mut endpoints = HashMap::with_capacity(record.endpoints.len());
        for ep in frontends.values().flat_map(|f| f.backends.iter()) {
            let since = record.endpoints.get(&ep.ip).copied().unwrap_or(now);
            endpoints.insert(ep.ip, since);
        }
        record.endpoints = endpoints;
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Record> {
        // The key owns its strings; building it costs two short allocations per lookup.
        self.services
            .get(&ServiceName(ObjectKey::new(namespace, name)))
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// The JSON answer of `/programmed`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report<'a> {
    pub node: Option<&'a str>,
    pub namespace: &'a str,
    pub name: &'a str,
    /// RFC 3339 with nanoseconds.
    pub first_programmed: String,
    pub last_programmed: String,
    pub endpoints: Vec<EndpointReport>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointReport {
    pub ip: IpAddr,
    pub programmed: String,
}

/// RFC 3339 in UTC with the clock's full resolution.
pub fn rfc3339(t: SystemTime) -> String {
    match k8s_openapi::jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.to_string(),
        Err(_) => String::new(),
    }
}

impl<'a> Report<'a> {
    pub fn new(node: Option<&'a str>, namespace: &'a str, name: &'a str, r: &Record) -> Self {
        let mut endpoints: Vec<EndpointReport> = r
            .endpoints
            .iter()
            .map(|(ip, t)| EndpointReport {
                ip: *ip,
                programmed: rfc3339(*t),
            })
            .collect();
        endpoints.sort_by_key(|e| e.ip);
        Report {
            node,
            namespace,
            name,
            first_programmed: rfc3339(r.first),
            last_programmed: rfc3339(r.last),
            endpoints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{DesiredFrontend, Endpoint, FrontendKey, FrontendKind};
    use crate::model::{Affinity, Port, Protocol};
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn svc() -> ServiceName {
        ServiceName(ObjectKey::new("default", "web"))
    }

    fn frontends(ips: &[&str]) -> Frontends {
        let backends: BTreeSet<Endpoint> = ips
            .iter()
            .map(|ip| Endpoint {
                ip: ip.parse().unwrap(),
                port: Port::new(8080).unwrap(),
                local: false,
            })
            .collect();
        let mut f = Frontends::new();
        f.insert(
            FrontendKey::cluster(
                "10.96.0.20".parse().unwrap(),
                Port::new(80).unwrap(),
                Protocol::Tcp,
            ),
            DesiredFrontend {
                backends,
                affinity: Affinity::None,
                port_name: String::new(),
                kind: FrontendKind::ClusterIp,
                snat_remote: false,
                source_ranges: Vec::new(),
                internal: None,
            },
        );
        f
    }

    #[test]
    fn endpoints_keep_their_first_time_and_services_their_last() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (t1, t2) = (t0 + Duration::from_millis(5), t0 + Duration::from_millis(9));
        let mut p = Programmed::default();
        // Created without endpoints, then a pod becomes ready, then a second one.
        p.record(&svc(), &frontends(&[]), t0);
        p.record(&svc(), &frontends(&["10.1.0.5"]), t1);
        p.record(&svc(), &frontends(&["10.1.0.5", "10.2.0.7"]), t2);
        let r = p.get("default", "web").unwrap();
        assert_eq!((r.first, r.last), (t0, t2));
        assert_eq!(r.endpoints[&"10.1.0.5".parse::<IpAddr>().unwrap()], t1);
        assert_eq!(r.endpoints[&"10.2.0.7".parse::<IpAddr>().unwrap()], t2);
        // A backend that left and came back counts from its return.
        p.record(
            &svc(),
            &frontends(&["10.2.0.7"]),
            t2 + Duration::from_secs(1),
        );
        p.record(
            &svc(),
            &frontends(&["10.1.0.5", "10.2.0.7"]),
            t2 + Duration::from_secs(2),
        );
        let r = p.get("default", "web").unwrap();
        assert_eq!(
            r.endpoints[&"10.1.0.5".parse::<IpAddr>().unwrap()],
            t2 + Duration::from_secs(2)
        );
        assert!(p.get("default", "other").is_none());
    }

    #[test]
    fn a_service_without_frontends_is_forgotten() {
        let mut p = Programmed::default();
        p.record(&svc(), &frontends(&["10.1.0.5"]), SystemTime::now());
        assert_eq!(p.len(), 1);
        p.record(&svc(), &Frontends::new(), SystemTime::now());
        assert!(p.is_empty());
    }

    #[test]
    fn report_is_rfc3339_with_sub_second_times() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let mut p = Programmed::default();
        p.record(&svc(), &frontends(&["10.1.0.5"]), t);
        let r = Report::new(
            Some("n1"),
            "default",
            "web",
            p.get("default", "web").unwrap(),
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["node"], "n1");
        assert_eq!(v["lastProgrammed"], "2023-11-14T22:13:20.123456789Z");
        assert_eq!(v["endpoints"][0]["ip"], "10.1.0.5");
        assert_eq!(
            v["endpoints"][0]["programmed"],
            "2023-11-14T22:13:20.123456789Z"
        );
    }
}
