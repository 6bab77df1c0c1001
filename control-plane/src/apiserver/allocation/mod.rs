//! ClusterIP and NodePort allocation for Services (derived from the stored Services on start,
//! taken before a write, given back if it fails, released on delete); the health check node
//! port of a LoadBalancer Service with externalTrafficPolicy Local comes from the same range. Part of persisting a
//! Service, as in Kubernetes' service storage, not an admission plugin: admission
//! (`apiserver/admission/`) runs before it.

pub mod cluster_ip;
pub mod node_port;

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::sync::Mutex;

use serde_json::{json, Value};

use self::cluster_ip::{Cidr, IpAllocator};
use self::node_port::PortAllocator;
use super::registry::Resource;
use crate::machinery::{ApiError, FieldError};

/// Addresses and ports taken or freed by one write, settled once the write is (or is not)
/// committed.
#[derive(Debug, Default)]
#[must_use]
pub struct Allocation {
    taken_ips: Vec<Ipv4Addr>,
    taken_ports: Vec<u16>,
    freed_ips: Vec<Ipv4Addr>,
    freed_ports: Vec<u16>,
}

pub struct Allocator {
    ips: Mutex<IpAllocator>,
    ports: Mutex<PortAllocator>,
}

fn is_service(r: &Resource) -> bool {
    r.group.is_empty() && r.kind == "Service"
}

fn service_ips(svc: &Value) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    if let Some(ip) = svc
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
    {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The node ports a Service holds, its health check node port included.
fn node_ports(svc: &Value) -> Vec<u16> {
    ports(svc)
        .iter()
        .filter_map(|p| p.get("nodePort")?.as_u64())
        .chain(health_check_port(svc))
        .filter_map(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .collect()
}

fn health_check_port(svc: &Value) -> Option<u64> {
    svc.pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_u64)
        .filter(|p| *p != 0)
}

/// A LoadBalancer that keeps the client address needs a health check node port.
fn wants_health_check(svc: &Value) -> bool {
    svc_type(svc) == "LoadBalancer"
        && svc
            .pointer("/spec/externalTrafficPolicy")
            .and_then(Value::as_str)
            == Some("Local")
}

fn ports(svc: &Value) -> Vec<Value> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn svc_type(svc: &Value) -> &str {
    svc.pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
}

fn wants_node_ports(svc: &Value) -> bool {
    matches!(svc_type(svc), "NodePort" | "LoadBalancer")
}

impl Allocator {
    pub fn new(service_cidr: Cidr, node_ports: RangeInclusive<u16>) -> Allocator {
        Allocator {
            ips: Mutex::new(IpAllocator::new(service_cidr)),
            ports: Mutex::new(PortAllocator::new(node_ports)),
        }
    }

    fn ips(&self) -> std::sync::MutexGuard<'_, IpAllocator> {
        self.ips.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ports(&self) -> std::sync::MutexGuard<'_, PortAllocator> {
        self.ports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks what the stored Services hold as taken (on start).
    pub fn restore(&self, services: impl Iterator<Item = Value>) {
        let mut n = 0;
        for svc in services {
            for ip in service_ips(&svc) {
                let _ = self.ips().allocate(ip);
            }
            for p in node_ports(&svc) {
                let _ = self.ports().allocate(p);
            }
            n += 1;
        }
        tracing::info!(
            services = n,
            cluster_ips = self.ips().allocated(),
            "allocations restored"
        );
    }

    /// Fills in a new Service's ClusterIP and NodePorts. With `dry_run` nothing is taken.
    pub fn allocate_create(
        &self,
        r: &Resource,
        obj: &mut Value,
        dry_run: bool,
    ) -> Result<Allocation, ApiError> {
        let mut a = Allocation::default();
        if !is_service(r) {
            return Ok(a);
        }
        let result = self
            .assign_ip(obj, None, dry_run, &mut a)
            .and_then(|_| self.assign_ports(obj, None, dry_run, &mut a));
        if let Err(e) = result {
            self.rollback(a);
            return Err(e);
        }
        Ok(a)
    }

    /// Keeps an updated Service's allocations (a client may omit them), allocating what a
    /// type change newly needs and freeing what it no longer does.
    pub fn allocate_update(
        &self,
        r: &Resource,
        new: &mut Value,
        old: &Value,
        dry_run: bool,
    ) -> Result<Allocation, ApiError> {
        let mut a = Allocation::default();
        if !is_service(r) {
            return Ok(a);
        }
        let result = self
            .assign_ip(new, Some(old), dry_run, &mut a)
            .and_then(|_| self.assign_ports(new, Some(old), dry_run, &mut a));
        if let Err(e) = result {
            self.rollback(a);
            return Err(e);
        }
        Ok(a)
    }

    fn assign_ip(
        &self,
        svc: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
        a: &mut Allocation,
    ) -> Result<(), ApiError> {
        let name = super::meta::name(svc).unwrap_or_default().to_string();
        let invalid = |why: String, value: &str| {
            ApiError::invalid(
                "",
                "Service",
                &name,
                vec![FieldError::invalid("spec.clusterIPs", value, &why)],
            )
        };
        let old_ips = old.map(service_ips).unwrap_or_default();
        let requested = svc
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let external_name = svc_type(svc) == "ExternalName";
        if !external_name {
            self.check_families(svc, &name)?;
        }
        if external_name || requested == "None" {
            a.freed_ips.extend(old_ips);
            return Ok(());
        }
        if requested.is_empty() {
            if let Some(ip) = old_ips.first() {
                set_ip(svc, &ip.to_string());
                return Ok(());
            }
            let next = if dry_run {
                // What a real write would get, kept by nobody (Kubernetes' dry-run allocator).
                self.ips().next_free()
            } else {
                self.ips().allocate_next()
            };
            let ip = next
                .map_err(|e| ApiError::internal(format!("failed to allocate a serviceIP: {e}")))?;
            if dry_run {
                set_ip(svc, &ip.to_string());
                return Ok(());
            }
            a.taken_ips.push(ip);
            set_ip(svc, &ip.to_string());
            return Ok(());
        }
        let ip: Ipv4Addr = requested
            .parse()
            .map_err(|_| invalid("must be a valid IP address".into(), &requested))?;
        if old_ips.contains(&ip) {
            set_ip(svc, &requested);
            return Ok(());
        }
        // A changed address is refused by validation (immutable); here only availability.
        let r = if dry_run {
            self.ips().check(ip)
        } else {
            self.ips().allocate(ip)
        };
        r.map_err(|e| invalid(e.to_string(), &requested))?;
        if !dry_run {
            a.taken_ips.push(ip);
        }
        a.freed_ips.extend(old_ips);
        set_ip(svc, &requested);
        Ok(())
    }

    /// The Service's IP families must be ones the service CIDRs provide (Kubernetes checks
    /// them against its configured allocators), and dual stack needs two of them.
    fn check_families(&self, svc: &Value, name: &str) -> Result<(), ApiError> {
        let configured = [self.ips().cidr().family()];
        let mut errors = Vec::new();
        let families = svc.pointer("/spec/ipFamilies").and_then(Value::as_array);
        for (i, f) in families.into_iter().flatten().enumerate() {
            let f = f.as_str().unwrap_or("");
            if !configured.contains(&f) {
                errors.push(FieldError::invalid(
                    format!("spec.ipFamilies[{i}]"),
                    f,
                    "not configured on this cluster",
                ));
            }
        }
        let policy = svc.pointer("/spec/ipFamilyPolicy").and_then(Value::as_str);
        if policy == Some("RequireDualStack") && configured.len() < 2 {
            errors.push(FieldError::invalid(
                "spec.ipFamilyPolicy",
                "RequireDualStack",
                "this cluster is not configured for dual-stack services",
            ));
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(ApiError::invalid("", "Service", name, errors)),
        }
    }

    fn assign_ports(
        &self,
        svc: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
        a: &mut Allocation,
    ) -> Result<(), ApiError> {
        let old_ports = old.map(node_ports).unwrap_or_default();
        if !wants_node_ports(svc) {
            a.freed_ports.extend(old_ports);
            return Ok(());
        }
        let name = super::meta::name(svc).unwrap_or_default().to_string();
        let old_list = old.map(ports).unwrap_or_default();
        let mut list = ports(svc);
        let mut kept = Vec::new();
        let mut dry_ports: Vec<u16> = list
            .iter()
            .filter_map(|p| p.get("nodePort")?.as_u64())
            .filter_map(|p| u16::try_from(p).ok())
            .collect();
        for (i, p) in list.iter_mut().enumerate() {
            let requested = p.get("nodePort").and_then(Value::as_u64).unwrap_or(0);
            if requested == 0 {
                // Keep the port the same service port had.
                let same = old_list.iter().find(|o| {
                    o.get("port") == p.get("port")
                        && o.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                            == p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                });
                if let Some(np) = same.and_then(|o| o.get("nodePort")).and_then(Value::as_u64) {
                    p["nodePort"] = json!(np);
                    kept.push(np as u16);
                    continue;
                }
                if dry_run {
                    // Shown, not kept; distinct from the ports this request already names.
                    let np = self.ports().next_free(&dry_ports).map_err(|e| {
                        ApiError::internal(format!("failed to allocate a nodePort: {e}"))
                    })?;
                    dry_ports.push(np);
                    p["nodePort"] = json!(np);
                    continue;
                }
                let np = self.ports().allocate_next().map_err(|e| {
                    ApiError::internal(format!("failed to allocate a nodePort: {e}"))
                })?;
                a.taken_ports.push(np);
                p["nodePort"] = json!(np);
                continue;
            }
            let port = u16::try_from(requested).unwrap_or(0);
            if old_ports.contains(&port) {
                kept.push(port);
                continue;
            }
            let r = if dry_run {
                self.ports().check(port)
            } else {
                self.ports().allocate(port)
            };
            r.map_err(|e| {
                ApiError::invalid(
                    "",
                    "Service",
                    &name,
                    vec![FieldError::invalid(
                        format!("spec.ports[{i}].nodePort"),
                        requested,
                        &e.to_string(),
                    )],
                )
            })?;
            if !dry_run {
                a.taken_ports.push(port);
            }
        }
        if let Some(port) = self.assign_health_check(svc, old, dry_run, a, &dry_ports, &name)? {
            kept.push(port);
        }
        a.freed_ports
            .extend(old_ports.into_iter().filter(|p| !kept.contains(p)));
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("ports".into(), Value::Array(list));
        }
        Ok(())
    }

    /// spec.healthCheckNodePort for a LoadBalancer with externalTrafficPolicy Local: the
    /// requested port, the one it had, or the next free one. Returns the old port if it is
    /// kept (so it is not freed).
    fn assign_health_check(
        &self,
        svc: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
        a: &mut Allocation,
        dry_ports: &[u16],
        name: &str,
    ) -> Result<Option<u16>, ApiError> {
        if !wants_health_check(svc) {
            return Ok(None);
        }
        let had = old
            .and_then(health_check_port)
            .and_then(|p| u16::try_from(p).ok());
        let set = |svc: &mut Value, port: u16| {
            if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("healthCheckNodePort".into(), json!(port));
            }
        };
        let requested = health_check_port(svc);
        let Some(requested) = requested else {
            if let Some(p) = had {
                set(svc, p);
                return Ok(Some(p));
            }
            let next = if dry_run {
                self.ports().next_free(dry_ports)
            } else {
                self.ports().allocate_next()
            };
            let port = next.map_err(|e| {
                ApiError::internal(format!("failed to allocate a healthCheckNodePort: {e}"))
            })?;
            if !dry_run {
                a.taken_ports.push(port);
            }
            set(svc, port);
            return Ok(None);
        };
        let port = u16::try_from(requested).unwrap_or(0);
        if had == Some(port) {
            return Ok(Some(port));
        }
        let r = if dry_run {
            self.ports().check(port)
        } else {
            self.ports().allocate(port)
        };
        r.map_err(|e| {
            ApiError::invalid(
                "",
                "Service",
                name,
                vec![FieldError::invalid(
                    "spec.healthCheckNodePort",
                    requested,
                    &e.to_string(),
                )],
            )
        })?;
        if !dry_run {
            a.taken_ports.push(port);
        }
        Ok(None)
    }

    /// The write was committed: free what it gave up.
    pub fn commit(&self, a: Allocation) {
        for ip in a.freed_ips {
            self.ips().release(ip);
        }
        for p in a.freed_ports {
            self.ports().release(p);
        }
    }

    /// The write failed: give back what it took.
    pub fn rollback(&self, a: Allocation) {
        for ip in a.taken_ips {
            self.ips().release(ip);
        }
        for p in a.taken_ports {
            self.ports().release(p);
        }
    }

    /// An object was removed from the store.
    pub fn deleted(&self, r: &Resource, obj: &Value) {
        if is_service(r) {
            self.commit(Allocation {
                freed_ips: service_ips(obj),
                freed_ports: node_ports(obj),
                ..Default::default()
            });
        }
    }
}

fn set_ip(svc: &mut Value, ip: &str) {
    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("clusterIP".into(), json!(ip));
        spec.insert("clusterIPs".into(), json!([ip]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::find;

    fn allocator() -> Allocator {
        Allocator::new("10.96.0.0/29".parse().unwrap(), 30000..=30001)
    }

    fn svc(ty: &str, ip: &str, node_port: u64) -> Value {
        json!({"metadata":{"name":"s"},"spec":{"type":ty,"clusterIP":ip,
            "ports":[{"port":80,"protocol":"TCP","nodePort":node_port}]}})
    }

    #[test]
    fn a_local_load_balancer_gets_a_health_check_node_port_and_gives_it_back() {
        let a = Allocator::new("10.96.0.0/24".parse().unwrap(), 30000..=30002);
        let mut s = json!({"metadata":{"name":"lb"},"spec":{"type":"LoadBalancer",
            "externalTrafficPolicy":"Local","ports":[{"port":80,"protocol":"TCP"}]}});
        let r = find("", "v1", "services").unwrap();
        let t = a.allocate_create(r, &mut s, false).unwrap();
        a.commit(t);
        let np = s["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        let hc = s["spec"]["healthCheckNodePort"].as_u64().unwrap();
        assert_ne!(np, hc);
        // Kept across an update that omits it; the last port is then the only one left.
        let mut upd = json!({"metadata":{"name":"lb"},"spec":{"type":"LoadBalancer",
            "externalTrafficPolicy":"Local","ports":[{"port":80,"protocol":"TCP"}]}});
        let t = a.allocate_update(r, &mut upd, &s, false).unwrap();
        a.commit(t);
        assert_eq!(upd["spec"]["healthCheckNodePort"], hc);
        // Back to the Cluster policy: the port is freed (and can be taken again).
        let mut cluster = upd.clone();
        cluster["spec"]["externalTrafficPolicy"] = "Cluster".into();
        cluster["spec"]
            .as_object_mut()
            .unwrap()
            .remove("healthCheckNodePort");
        let t = a.allocate_update(r, &mut cluster, &upd, false).unwrap();
        a.commit(t);
        assert!(a.ports().allocate(hc as u16).is_ok());
    }

    #[test]
    fn service_gets_ip_and_node_port_and_gives_them_back() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("NodePort", "", 0);
        let alloc = a.allocate_create(r, &mut s, false).unwrap();
        a.commit(alloc);
        let ip = s["spec"]["clusterIP"].as_str().unwrap().to_string();
        assert!(ip.starts_with("10.96.0."));
        assert_eq!(s["spec"]["clusterIPs"][0], ip.as_str());
        let np = s["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        // the same IP or port again is refused
        let mut again = svc("NodePort", &ip, np);
        let e = a.allocate_create(r, &mut again, false).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("already allocated"), "{}", e.message);
        // an update that omits them keeps them
        let mut upd = svc("NodePort", "", 0);
        a.commit(a.allocate_update(r, &mut upd, &s, false).unwrap());
        assert_eq!(upd["spec"]["clusterIP"], ip.as_str());
        assert_eq!(upd["spec"]["ports"][0]["nodePort"], np);
        a.deleted(r, &upd);
        let mut again = svc("NodePort", &ip, np);
        a.commit(a.allocate_create(r, &mut again, false).unwrap());
    }

    #[test]
    fn failed_writes_roll_back_and_dry_runs_take_nothing() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        a.commit(a.allocate_create(r, &mut s, true).unwrap());
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        let alloc = a.allocate_create(r, &mut s, false).unwrap();
        a.rollback(alloc);
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        a.commit(a.allocate_create(r, &mut s, false).unwrap());
        let mut out = svc("ClusterIP", "10.97.0.2", 0);
        let e = a.allocate_create(r, &mut out, false).unwrap_err();
        assert!(e.message.contains("valid range"), "{}", e.message);
        let mut headless = svc("ClusterIP", "None", 0);
        a.commit(a.allocate_create(r, &mut headless, false).unwrap());
        assert_eq!(headless["spec"]["clusterIP"], "None");
    }

    #[test]
    fn dry_runs_show_allocations_without_keeping_them() {
        let a = Allocator::new("10.96.0.0/29".parse().unwrap(), 30000..=30003);
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("NodePort", "", 0);
        s["spec"]["ports"]
            .as_array_mut()
            .unwrap()
            .push(json!({"port": 81, "protocol": "TCP"}));
        a.commit(a.allocate_create(r, &mut s, true).unwrap());
        let ip = s["spec"]["clusterIP"].as_str().unwrap();
        assert!(ip.starts_with("10.96.0."), "{s}");
        let (p0, p1) = (
            &s["spec"]["ports"][0]["nodePort"],
            &s["spec"]["ports"][1]["nodePort"],
        );
        assert!(
            p0.as_u64().is_some_and(|p| (30000..=30003).contains(&p)),
            "{s}"
        );
        assert_ne!(p0, p1, "two ports of one dry run differ");
        assert_eq!(a.ips().allocated(), 0, "nothing kept");
        // All four ports are still free for real writes.
        for _ in 0..2 {
            let mut s = svc("NodePort", "", 0);
            s["spec"]["ports"]
                .as_array_mut()
                .unwrap()
                .push(json!({"port": 81, "protocol": "TCP"}));
            a.commit(a.allocate_create(r, &mut s, false).unwrap());
        }
    }

    #[test]
    fn ip_families_must_be_configured() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilies"] = json!(["IPv6"]);
        let e = a.allocate_create(r, &mut s, false).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Service \"s\" is invalid: spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"
        );
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        let e = a.allocate_create(r, &mut s, false).unwrap_err();
        assert!(
            e.message
                .contains("this cluster is not configured for dual-stack services"),
            "{}",
            e.message
        );
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilies"] = json!(["IPv4"]);
        s["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
        a.commit(a.allocate_create(r, &mut s, false).unwrap());
    }
}
