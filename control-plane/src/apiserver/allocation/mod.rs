//! ClusterIP and NodePort allocation for Services (taken before a write, given back if it
//! fails, released on delete); the health check node port of a LoadBalancer Service with
//! externalTrafficPolicy Local comes from the same range. Part of persisting a Service, as in
//! Kubernetes' service storage, not an admission plugin: admission (`apiserver/admission/`)
//! runs before it.
//!
//! The store decides who holds what (`claims`: one key per address and per port, created
//! with a must-not-exist precondition), so several API servers on one store never hand out
//! the same address. Each server keeps a bitmap of the ranges as a cache to pick candidates
//! from; a candidate another server holds is refused by the store and the next one is tried.
//! The repair pass (at start and periodically, as kube-apiserver's repair loops) creates the
//! claims of Services that have none (stored before claims existed), frees claims no
//! Service holds (a crash between the claim and the Service write) once two passes agree,
//! and reloads the bitmaps from the store.

pub mod claims;
pub mod cluster_ip;
pub mod node_port;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use self::claims::{ClaimError, Claimed, Claims, Parent};
use self::cluster_ip::{Cidr, IpAllocator, IpError};
use self::node_port::{PortAllocator, PortError};
use super::registry::Resource;
use crate::machinery::{ApiError, FieldError};
use crate::store::{Revision, Store, StoreError};

/// How many candidates a write tries before giving up (each one refused by the store was
/// taken by another API server since this one's bitmap was loaded).
const ATTEMPTS: usize = 32;

/// Addresses and ports taken or freed by one write, settled once the write is (or is not)
/// committed.
#[derive(Debug, Default)]
#[must_use]
pub struct Allocation {
    parent: Option<Parent>,
    /// Claims this write made, with their revisions.
    taken: Vec<(Claimed, Revision)>,
    /// What the write gives up once committed.
    freed: Vec<Claimed>,
}

pub struct Allocator {
    ips: Mutex<IpAllocator>,
    ports: Mutex<PortAllocator>,
    claims: Claims,
    /// Claims no Service held at the last repair pass, with their revisions: freed at the
    /// next pass if still so (a Service may be written just after its claim).
    suspects: Mutex<HashMap<Claimed, Revision>>,
}

/// What one repair pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Claims written for Services that held an address or port without one.
    pub created: usize,
    /// Claims no Service held at two passes in a row, removed.
    pub freed: usize,
    /// Claims held by no Service, to be freed at the next pass if still so.
    pub suspects: usize,
}

/// Which range a candidate is picked from.
#[derive(Clone, Copy, Debug)]
enum Pool {
    Ips,
    Ports,
}

fn store_failed(what: Claimed, e: StoreError) -> ApiError {
    match e {
        StoreError::Unavailable(_) | StoreError::Closed => {
            ApiError::unavailable(format!("allocating {what}: {e}"))
        }
        e => ApiError::internal(format!("allocating {what}: {e}")),
    }
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
    pub fn new(
        store: Arc<dyn Store>,
        service_cidr: Cidr,
        node_ports: RangeInclusive<u16>,
    ) -> Allocator {
        Allocator {
            ips: Mutex::new(IpAllocator::new(service_cidr)),
            ports: Mutex::new(PortAllocator::new(node_ports)),
            claims: Claims::new(store),
            suspects: Mutex::new(HashMap::new()),
        }
    }

    fn ips(&self) -> std::sync::MutexGuard<'_, IpAllocator> {
        self.ips.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ports(&self) -> std::sync::MutexGuard<'_, PortAllocator> {
        self.ports.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark(&self, c: Claimed) {
        match c {
            Claimed::Ip(ip) => self.ips().mark(ip),
            Claimed::Port(p) => self.ports().mark(p),
        }
    }

    fn unmark(&self, c: Claimed) {
        match c {
            Claimed::Ip(ip) => self.ips().release(ip),
            Claimed::Port(p) => self.ports().release(p),
        }
    }

    /// Claims a free address or port of `pool` in the store. `what` names it in errors.
    async fn take_next(
        &self,
        pool: Pool,
        what: &str,
        a: &mut Allocation,
    ) -> Result<Claimed, ApiError> {
        let parent = a.parent.clone().unwrap_or_default();
        for _ in 0..ATTEMPTS {
            let next = match pool {
                Pool::Ips => self
                    .ips()
                    .allocate_next()
                    .map(Claimed::Ip)
                    .map_err(|e| e.to_string()),
                Pool::Ports => self
                    .ports()
                    .allocate_next()
                    .map(Claimed::Port)
                    .map_err(|e| e.to_string()),
            };
            let c =
                next.map_err(|e| ApiError::internal(format!("failed to allocate a {what}: {e}")))?;
            match self.claims.take(c, &parent).await {
                Ok(rev) => {
                    a.taken.push((c, rev));
                    return Ok(c);
                }
                // Held by another API server: it stays marked here.
                Err(ClaimError::Taken) => continue,
                Err(ClaimError::Store(e)) => {
                    self.unmark(c);
                    return Err(store_failed(c, e));
                }
            }
        }
        Err(ApiError::internal(format!(
            "failed to allocate a {what}: {ATTEMPTS} candidates in a row were held by other API servers"
        )))
    }

    /// Claims exactly `c` (a requested address or port). The inner error says why it cannot
    /// be had (for a field error); the outer one is the store failing.
    async fn take_exact(
        &self,
        c: Claimed,
        dry_run: bool,
        a: &mut Allocation,
    ) -> Result<Result<(), String>, ApiError> {
        let (in_range, allocated) = match c {
            Claimed::Ip(ip) => (
                self.ips().check_range(ip).map_err(|e| e.to_string()),
                IpError::Allocated.to_string(),
            ),
            Claimed::Port(p) => (
                self.ports().check_range(p).map_err(|e| e.to_string()),
                PortError::Allocated.to_string(),
            ),
        };
        if let Err(why) = in_range {
            return Ok(Err(why));
        }
        if dry_run {
            let free = self
                .claims
                .is_free(c)
                .await
                .map_err(|e| store_failed(c, e))?;
            return Ok(if free { Ok(()) } else { Err(allocated) });
        }
        let parent = a.parent.clone().unwrap_or_default();
        match self.claims.take(c, &parent).await {
            Ok(rev) => {
                self.mark(c);
                a.taken.push((c, rev));
                Ok(Ok(()))
            }
            Err(ClaimError::Taken) => {
                self.mark(c);
                Ok(Err(allocated))
            }
            Err(ClaimError::Store(e)) => Err(store_failed(c, e)),
        }
    }

    /// Fills in a new Service's ClusterIP and NodePorts. With `dry_run` nothing is taken.
    pub async fn allocate_create(
        &self,
        r: &Resource,
        obj: &mut Value,
        dry_run: bool,
    ) -> Result<Allocation, ApiError> {
        self.allocate(r, obj, None, dry_run).await
    }

    /// Keeps an updated Service's allocations (a client may omit them), allocating what a
    /// type change newly needs and freeing what it no longer does.
    pub async fn allocate_update(
        &self,
        r: &Resource,
        new: &mut Value,
        old: &Value,
        dry_run: bool,
    ) -> Result<Allocation, ApiError> {
        self.allocate(r, new, Some(old), dry_run).await
    }

    async fn allocate(
        &self,
        r: &Resource,
        obj: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<Allocation, ApiError> {
        let mut a = Allocation::default();
        if !is_service(r) {
            return Ok(a);
        }
        a.parent = Some(Parent::of(obj));
        let mut result = self.assign_ip(obj, old, dry_run, &mut a).await;
        if result.is_ok() {
            result = self.assign_ports(obj, old, dry_run, &mut a).await;
        }
        if let Err(e) = result {
            self.rollback(a).await;
            return Err(e);
        }
        Ok(a)
    }

    async fn assign_ip(
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
            a.freed.extend(old_ips.into_iter().map(Claimed::Ip));
            return Ok(());
        }
        if requested.is_empty() {
            if let Some(ip) = old_ips.first() {
                set_ip(svc, &ip.to_string());
                return Ok(());
            }
            if dry_run {
                // What a real write would get, kept by nobody (Kubernetes' dry-run allocator).
                let ip = self.ips().next_free().map_err(|e| {
                    ApiError::internal(format!("failed to allocate a serviceIP: {e}"))
                })?;
                set_ip(svc, &ip.to_string());
                return Ok(());
            }
            if let Claimed::Ip(ip) = self.take_next(Pool::Ips, "serviceIP", a).await? {
                set_ip(svc, &ip.to_string());
            }
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
        self.take_exact(Claimed::Ip(ip), dry_run, a)
            .await?
            .map_err(|why| invalid(why, &requested))?;
        a.freed.extend(old_ips.into_iter().map(Claimed::Ip));
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

    async fn assign_ports(
        &self,
        svc: &mut Value,
        old: Option<&Value>,
        dry_run: bool,
        a: &mut Allocation,
    ) -> Result<(), ApiError> {
        let old_ports = old.map(node_ports).unwrap_or_default();
        if !wants_node_ports(svc) {
            a.freed.extend(old_ports.into_iter().map(Claimed::Port));
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
                if let Claimed::Port(np) = self.take_next(Pool::Ports, "nodePort", a).await? {
                    p["nodePort"] = json!(np);
                }
                continue;
            }
            let port = u16::try_from(requested).unwrap_or(0);
            if old_ports.contains(&port) {
                kept.push(port);
                continue;
            }
            self.take_exact(Claimed::Port(port), dry_run, a)
                .await?
                .map_err(|why| {
                    ApiError::invalid(
                        "",
                        "Service",
                        &name,
                        vec![FieldError::invalid(
                            format!("spec.ports[{i}].nodePort"),
                            requested,
                            &why,
                        )],
                    )
                })?;
        }
        if let Some(port) = self
            .assign_health_check(svc, old, dry_run, a, &dry_ports, &name)
            .await?
        {
            kept.push(port);
        }
        a.freed.extend(
            old_ports
                .into_iter()
                .filter(|p| !kept.contains(p))
                .map(Claimed::Port),
        );
        if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("ports".into(), Value::Array(list));
        }
        Ok(())
    }

    /// spec.healthCheckNodePort for a LoadBalancer with externalTrafficPolicy Local: the
    /// requested port, the one it had, or the next free one. Returns the old port if it is
    /// kept (so it is not freed).
    async fn assign_health_check(
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
            if dry_run {
                let port = self.ports().next_free(dry_ports).map_err(|e| {
                    ApiError::internal(format!("failed to allocate a healthCheckNodePort: {e}"))
                })?;
                set(svc, port);
                return Ok(None);
            }
            if let Claimed::Port(port) = self
                .take_next(Pool::Ports, "healthCheckNodePort", a)
                .await?
            {
                set(svc, port);
            }
            return Ok(None);
        };
        let port = u16::try_from(requested).unwrap_or(0);
        if had == Some(port) {
            return Ok(Some(port));
        }
        self.take_exact(Claimed::Port(port), dry_run, a)
            .await?
            .map_err(|why| {
                ApiError::invalid(
                    "",
                    "Service",
                    name,
                    vec![FieldError::invalid(
                        "spec.healthCheckNodePort",
                        requested,
                        &why,
                    )],
                )
            })?;
        Ok(None)
    }

    /// The write was committed: free what it gave up. A claim that cannot be removed now is
    /// left to the repair pass (the write stands either way).
    pub async fn commit(&self, a: Allocation) {
        let parent = a.parent.unwrap_or_default();
        for c in a.freed {
            self.unmark(c);
            if let Err(e) = self.claims.release(c, &parent).await {
                tracing::warn!(%c, service = %parent, error = %e, "a freed claim stays until the repair pass");
            }
        }
    }

    /// The write failed: give back what it took.
    pub async fn rollback(&self, a: Allocation) {
        for (c, rev) in a.taken {
            self.unmark(c);
            if let Err(e) = self.claims.remove_at(c, rev).await {
                tracing::warn!(%c, error = %e, "a claim of a failed write stays until the repair pass");
            }
        }
    }

    /// An object was removed from the store.
    pub async fn deleted(&self, r: &Resource, obj: &Value) {
        if is_service(r) {
            self.commit(Allocation {
                parent: Some(Parent::of(obj)),
                freed: held_by(obj),
                ..Default::default()
            })
            .await;
        }
    }

    /// One repair pass: the claims are listed, then `services` reads every stored Service
    /// (after, so a claim listed without its Service is at worst a suspect). Claims are
    /// created for what Services hold without one, claims no Service holds are freed if the
    /// previous pass found them so too (same revision), and the bitmaps are reloaded from the
    /// store's claims.
    pub async fn repair<F, Fut>(&self, services: F) -> Result<Repaired, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Value>, StoreError>>,
    {
        let claims = self.claims.list().await?;
        let mut holders: HashMap<Claimed, Parent> = HashMap::new();
        for svc in services().await? {
            let parent = Parent::of(&svc);
            for c in held_by(&svc) {
                if let Some(other) = holders.insert(c, parent.clone()) {
                    tracing::error!(%c, first = %other, second = %parent, "two Services hold the same allocation");
                }
            }
        }
        let mut report = Repaired::default();
        let claimed: HashSet<Claimed> = claims.iter().map(|c| c.what).collect();
        let mut held: Vec<Claimed> = claims.iter().map(|c| c.what).collect();
        for (c, parent) in &holders {
            if claimed.contains(c) || !self.in_range(*c) {
                continue;
            }
            match self.claims.take(*c, parent).await {
                Ok(_) => {
                    report.created += 1;
                    held.push(*c);
                }
                // Claimed since the list was read (a Service written meanwhile).
                Err(ClaimError::Taken) => held.push(*c),
                Err(ClaimError::Store(e)) => return Err(e),
            }
        }
        let previous =
            std::mem::take(&mut *self.suspects.lock().unwrap_or_else(|p| p.into_inner()));
        let mut suspects = HashMap::new();
        let mut freed = HashSet::new();
        for claim in &claims {
            let holder = holders.get(&claim.what);
            if holder.is_some() && holder == claim.parent.as_ref() {
                continue;
            }
            if previous.get(&claim.what) == Some(&claim.revision) {
                self.claims.remove_at(claim.what, claim.revision).await?;
                tracing::info!(c = %claim.what, parent = ?claim.parent, "freed a claim no Service holds");
                freed.insert(claim.what);
            } else {
                suspects.insert(claim.what, claim.revision);
            }
        }
        report.freed = freed.len();
        report.suspects = suspects.len();
        *self.suspects.lock().unwrap_or_else(|p| p.into_inner()) = suspects;
        let (cidr, range) = (self.ips().cidr(), self.ports().range());
        let mut ips = IpAllocator::new(cidr);
        let mut ports = PortAllocator::new(range);
        for c in held.into_iter().filter(|c| !freed.contains(c)) {
            match c {
                Claimed::Ip(ip) => ips.mark(ip),
                Claimed::Port(p) => ports.mark(p),
            }
        }
        *self.ips() = ips;
        *self.ports() = ports;
        Ok(report)
    }

    fn in_range(&self, c: Claimed) -> bool {
        match c {
            Claimed::Ip(ip) => self.ips().cidr().contains(ip),
            Claimed::Port(p) => self.ports().check_range(p).is_ok(),
        }
    }
}

/// The addresses and ports a Service holds.
fn held_by(svc: &Value) -> Vec<Claimed> {
    let ips = service_ips(svc).into_iter().map(Claimed::Ip);
    ips.chain(node_ports(svc).into_iter().map(Claimed::Port))
        .collect()
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
    use crate::store::redb::{RedbOptions, RedbStore};

    /// An allocator over a real embedded store in a temporary directory (kept with it).
    struct Fixture {
        a: Allocator,
        store: RedbStore,
        _dir: tempfile::TempDir,
    }

    impl std::ops::Deref for Fixture {
        type Target = Allocator;
        fn deref(&self) -> &Allocator {
            &self.a
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.store.close();
        }
    }

    fn allocator_with(cidr: &str, ports: RangeInclusive<u16>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), RedbOptions::default()).unwrap();
        Fixture {
            a: Allocator::new(Arc::new(store.clone()), cidr.parse().unwrap(), ports),
            store,
            _dir: dir,
        }
    }

    fn allocator() -> Fixture {
        allocator_with("10.96.0.0/29", 30000..=30001)
    }

    fn svc(ty: &str, ip: &str, node_port: u64) -> Value {
        json!({"metadata":{"name":"s"},"spec":{"type":ty,"clusterIP":ip,
            "ports":[{"port":80,"protocol":"TCP","nodePort":node_port}]}})
    }

    #[tokio::test]
    async fn a_local_load_balancer_gets_a_health_check_node_port_and_gives_it_back() {
        let a = allocator_with("10.96.0.0/24", 30000..=30002);
        let mut s = json!({"metadata":{"name":"lb"},"spec":{"type":"LoadBalancer",
            "externalTrafficPolicy":"Local","ports":[{"port":80,"protocol":"TCP"}]}});
        let r = find("", "v1", "services").unwrap();
        let t = a.allocate_create(r, &mut s, false).await.unwrap();
        a.commit(t).await;
        let np = s["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        let hc = s["spec"]["healthCheckNodePort"].as_u64().unwrap();
        assert_ne!(np, hc);
        // Kept across an update that omits it; the last port is then the only one left.
        let mut upd = json!({"metadata":{"name":"lb"},"spec":{"type":"LoadBalancer",
            "externalTrafficPolicy":"Local","ports":[{"port":80,"protocol":"TCP"}]}});
        let t = a.allocate_update(r, &mut upd, &s, false).await.unwrap();
        a.commit(t).await;
        assert_eq!(upd["spec"]["healthCheckNodePort"], hc);
        // Back to the Cluster policy: the port is freed (and can be taken again).
        let mut cluster = upd.clone();
        cluster["spec"]["externalTrafficPolicy"] = "Cluster".into();
        cluster["spec"]
            .as_object_mut()
            .unwrap()
            .remove("healthCheckNodePort");
        let t = a
            .allocate_update(r, &mut cluster, &upd, false)
            .await
            .unwrap();
        a.commit(t).await;
        assert!(a.ports().allocate(hc as u16).is_ok());
    }

    #[tokio::test]
    async fn service_gets_ip_and_node_port_and_gives_them_back() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("NodePort", "", 0);
        let alloc = a.allocate_create(r, &mut s, false).await.unwrap();
        a.commit(alloc).await;
        let ip = s["spec"]["clusterIP"].as_str().unwrap().to_string();
        assert!(ip.starts_with("10.96.0."));
        assert_eq!(s["spec"]["clusterIPs"][0], ip.as_str());
        let np = s["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        // the same IP or port again is refused
        let mut again = svc("NodePort", &ip, np);
        let e = a.allocate_create(r, &mut again, false).await.unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("already allocated"), "{}", e.message);
        // an update that omits them keeps them
        let mut upd = svc("NodePort", "", 0);
        a.commit(a.allocate_update(r, &mut upd, &s, false).await.unwrap())
            .await;
        assert_eq!(upd["spec"]["clusterIP"], ip.as_str());
        assert_eq!(upd["spec"]["ports"][0]["nodePort"], np);
        a.deleted(r, &upd).await;
        let mut again = svc("NodePort", &ip, np);
        a.commit(a.allocate_create(r, &mut again, false).await.unwrap())
            .await;
    }

    #[tokio::test]
    async fn failed_writes_roll_back_and_dry_runs_take_nothing() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        a.commit(a.allocate_create(r, &mut s, true).await.unwrap())
            .await;
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        let alloc = a.allocate_create(r, &mut s, false).await.unwrap();
        a.rollback(alloc).await;
        let mut s = svc("ClusterIP", "10.96.0.2", 0);
        a.commit(a.allocate_create(r, &mut s, false).await.unwrap())
            .await;
        let mut out = svc("ClusterIP", "10.97.0.2", 0);
        let e = a.allocate_create(r, &mut out, false).await.unwrap_err();
        assert!(e.message.contains("valid range"), "{}", e.message);
        let mut headless = svc("ClusterIP", "None", 0);
        a.commit(a.allocate_create(r, &mut headless, false).await.unwrap())
            .await;
        assert_eq!(headless["spec"]["clusterIP"], "None");
    }

    #[tokio::test]
    async fn dry_runs_show_allocations_without_keeping_them() {
        let a = allocator_with("10.96.0.0/29", 30000..=30003);
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("NodePort", "", 0);
        s["spec"]["ports"]
            .as_array_mut()
            .unwrap()
            .push(json!({"port": 81, "protocol": "TCP"}));
        a.commit(a.allocate_create(r, &mut s, true).await.unwrap())
            .await;
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
            a.commit(a.allocate_create(r, &mut s, false).await.unwrap())
                .await;
        }
    }

    #[tokio::test]
    async fn ip_families_must_be_configured() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilies"] = json!(["IPv6"]);
        let e = a.allocate_create(r, &mut s, false).await.unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Service \"s\" is invalid: spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"
        );
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        let e = a.allocate_create(r, &mut s, false).await.unwrap_err();
        assert!(
            e.message
                .contains("this cluster is not configured for dual-stack services"),
            "{}",
            e.message
        );
        let mut s = svc("ClusterIP", "", 0);
        s["spec"]["ipFamilies"] = json!(["IPv4"]);
        s["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
        a.commit(a.allocate_create(r, &mut s, false).await.unwrap())
            .await;
    }

    fn named(ns: &str, name: &str, mut s: Value) -> Value {
        s["metadata"] = json!({"namespace": ns, "name": name});
        s
    }

    #[tokio::test]
    async fn two_allocators_on_one_store_never_hand_out_the_same_address() {
        let one = allocator();
        // A second API server on the same store, its bitmap knowing nothing of the first's.
        let two = Allocator::new(
            Arc::new(one.store.clone()),
            "10.96.0.0/29".parse().unwrap(),
            30000..=30001,
        );
        let r = find("", "v1", "services").unwrap();
        let mut got = Vec::new();
        // /29: 8 addresses, the network, first and broadcast ones reserved: 5 to hand out.
        for i in 0..5 {
            let a: &Allocator = if i % 2 == 0 { &one } else { &two };
            let mut s = named("d", &format!("s{i}"), svc("ClusterIP", "", 0));
            a.commit(a.allocate_create(r, &mut s, false).await.unwrap())
                .await;
            got.push(s["spec"]["clusterIP"].as_str().unwrap().to_string());
        }
        let mut unique = got.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 5, "{got:?}");
        for a in [&one.a, &two] {
            let mut s = named("d", "late", svc("ClusterIP", "", 0));
            let e = a.allocate_create(r, &mut s, false).await.unwrap_err();
            assert_eq!(e.code, 500, "{}", e.message);
        }
        // A requested address another server holds is refused by the store's word.
        let mut s = named("d", "dup", svc("ClusterIP", &got[0], 0));
        let e = two.allocate_create(r, &mut s, false).await.unwrap_err();
        assert!(e.message.contains("already allocated"), "{}", e.message);
        // Freed by one server, it can be had through the other.
        one.deleted(r, &named("d", "s0", svc("ClusterIP", &got[0], 0)))
            .await;
        let mut s = named("d", "again", svc("ClusterIP", &got[0], 0));
        two.commit(two.allocate_create(r, &mut s, false).await.unwrap())
            .await;
    }

    #[tokio::test]
    async fn repair_writes_missing_claims_and_frees_leaks_after_two_passes() {
        let a = allocator();
        let r = find("", "v1", "services").unwrap();
        // A crash after claiming for "gone", before writing it: a leak.
        let mut gone = named("d", "gone", svc("ClusterIP", "", 0));
        let leak = a.allocate_create(r, &mut gone, false).await.unwrap();
        std::mem::forget(leak);
        let leaked: Ipv4Addr = gone["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        // A Service stored before claims existed holds an address and a port;
        // its address is not the leaked one (the allocator picks at random).
        let held = if leaked == Ipv4Addr::new(10, 96, 0, 3) {
            "10.96.0.4"
        } else {
            "10.96.0.3"
        };
        let old = named("d", "old", svc("NodePort", held, 30001));
        let services = || async { Ok(vec![old.clone()]) };
        let first = a.repair(services).await.unwrap();
        assert_eq!(
            first,
            Repaired {
                created: 2,
                freed: 0,
                suspects: 1
            }
        );
        // The old Service's address is the store's now: nobody else gets it.
        let mut s = named("d", "other", svc("ClusterIP", held, 0));
        let e = a.allocate_create(r, &mut s, false).await.unwrap_err();
        assert!(e.message.contains("already allocated"), "{}", e.message);
        let second = a.repair(services).await.unwrap();
        assert_eq!(
            second,
            Repaired {
                created: 0,
                freed: 1,
                suspects: 0
            }
        );
        let mut s = named("d", "reuse", svc("ClusterIP", &leaked.to_string(), 0));
        a.commit(a.allocate_create(r, &mut s, false).await.unwrap())
            .await;
    }
}
