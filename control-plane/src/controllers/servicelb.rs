//! The built-in LoadBalancer: Services of `type: LoadBalancer` get an address from a pool
//! (`--service-lb-pool`, e.g. a range of the nodes' own LAN, as MetalLB's layer-2 mode and
//! k3s' ServiceLB hand them out) written to `status.loadBalancer.ingress`. How the address
//! reaches the nodes is the service proxy's part: the node chosen to announce it answers
//! ARP for it, and its eBPF programs translate the traffic (see ARCHITECTURE.md).
//!
//! A requested `spec.loadBalancerIP` inside the pool is honoured when free. Services with a
//! `spec.loadBalancerClass` belong to another implementation and are left alone. Which
//! addresses are taken is derived from the Services' status on the first reconcile (a
//! restarted controller never hands one out twice) and released when a Service stops being
//! a LoadBalancer or goes. One worker, so two Services never race for an address.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::Context;
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "servicelb";

/// An inclusive range of IPv4 addresses: `A.B.C.D-E.F.G.H` or a CIDR (network and
/// broadcast addresses excluded for prefixes up to /30).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbPool {
    first: u32,
    last: u32,
}

impl FromStr for LbPool {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let ip = |t: &str| -> Result<u32, String> {
            t.trim()
                .parse::<Ipv4Addr>()
                .map(u32::from)
                .map_err(|e| format!("{t:?}: {e}"))
        };
        let (first, last) = if let Some((a, b)) = s.split_once('-') {
            (ip(a)?, ip(b)?)
        } else if let Some((a, p)) = s.split_once('/') {
            let p: u32 = p.parse().map_err(|e| format!("{s:?}: {e}"))?;
            if !(16..=32).contains(&p) {
                return Err(format!("{s:?}: a pool CIDR must be /16 to /32"));
            }
            let mask = if p == 32 {
                u32::MAX
            } else {
                u32::MAX << (32 - p)
            };
            let base = ip(a)? & mask;
            let end = base | !mask;
            if p <= 30 {
                (base + 1, end - 1)
            } else {
                (base, end)
            }
        } else {
            let one = ip(s)?;
            (one, one)
        };
        if first > last || last - first > 65_535 {
            return Err(format!(
                "{s:?}: a pool holds 1 to 65,536 addresses, first to last"
            ));
        }
        Ok(LbPool { first, last })
    }
}

impl fmt::Display for LbPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}",
            Ipv4Addr::from(self.first),
            Ipv4Addr::from(self.last)
        )
    }
}

/// Which pool addresses are taken, and by whom.
#[derive(Debug)]
struct Pool {
    range: LbPool,
    owner: HashMap<Ipv4Addr, ObjectKey>,
    next: u32,
}

impl Pool {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.range.first..=self.range.last).contains(&u32::from(ip))
    }

    fn size(&self) -> u32 {
        self.range.last - self.range.first + 1
    }

    /// `wanted` if it is in the pool and free (or already this Service's), else the next
    /// free address round-robin; None when the pool is exhausted or `wanted` is taken.
    fn assign(&mut self, key: &ObjectKey, wanted: Option<Ipv4Addr>) -> Result<Ipv4Addr, String> {
        if let Some(ip) = wanted {
            if !self.contains(ip) {
                return Err(format!("{ip} is outside the pool {}", self.range));
            }
            return match self.owner.get(&ip) {
                Some(o) if o != key => Err(format!(
                    "{ip} is taken by {}/{}",
                    o.namespace.as_deref().unwrap_or(""),
                    o.name
                )),
                _ => {
                    self.owner.insert(ip, key.clone());
                    Ok(ip)
                }
            };
        }
        let n = self.size();
        for k in 0..n {
            let i = (self.next + k) % n;
            let ip = Ipv4Addr::from(self.range.first + i);
            if let std::collections::hash_map::Entry::Vacant(e) = self.owner.entry(ip) {
                e.insert(key.clone());
                self.next = (i + 1) % n;
                return Ok(ip);
            }
        }
        Err(format!("the pool {} is exhausted", self.range))
    }

    fn release_all_of(&mut self, key: &ObjectKey) {
        self.owner.retain(|_, o| o != key);
    }
}

pub struct ServiceLbController {
    client: Client,
    services: Informer<Service>,
    pool: Mutex<Pool>,
    loaded: Mutex<bool>,
    recorder: Recorder,
}

/// Whether this controller implements the Service's load balancer.
fn is_ours(svc: &Service) -> bool {
    let spec = svc.spec.as_ref();
    spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec
            .and_then(|s| s.load_balancer_class.as_deref())
            .is_none()
}

fn ingress_ips(svc: &Service) -> BTreeSet<Ipv4Addr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// None when no pool is configured: LoadBalancer Services then stay pending, as on a
/// cluster without a load-balancer implementation.
pub fn build(ctx: &Context) -> Option<Controller<ServiceLbController>> {
    let range = ctx.settings.service_lb_pool?;
    let services = ctx.informers.get::<Service>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let me = Arc::new(ServiceLbController {
        client: ctx.client.clone(),
        services: services.clone(),
        pool: Mutex::new(Pool {
            range,
            owner: HashMap::new(),
            next: 0,
        }),
        loaded: Mutex::new(false),
        recorder: ctx.events.recorder("service-lb-controller"),
    });
    let (q, c) = (queue.clone(), me.clone());
    services.on_change(move |ch| match ch {
        Change::Added(s) => {
            if is_ours(s) || !ingress_ips(s).is_empty() {
                q.add(ObjectKey::of(s.as_ref()));
            }
        }
        Change::Updated { old, new } => {
            if is_ours(new) || is_ours(old) {
                q.add(ObjectKey::of(new.as_ref()));
            }
        }
        Change::Deleted(s) => c.pool().release_all_of(&ObjectKey::of(s.as_ref())),
    });
    tracing::info!(pool = %range, "service load balancer");
    Some(Controller::new(NAME, me, queue, 1, ctx.metrics.clone()))
}

impl ServiceLbController {
    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the addresses the Services already show (first reconcile, cache synced).
    fn load(&self) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if *loaded {
            return;
        }
        let mut pool = self.pool();
        for s in self.services.list().iter().filter(|s| is_ours(s)) {
            let key = ObjectKey::of(s.as_ref());
            for ip in ingress_ips(s) {
                if pool.contains(ip) {
                    pool.owner.entry(ip).or_insert_with(|| key.clone());
                }
            }
        }
        *loaded = true;
    }

    async fn write_status(&self, key: &ObjectKey, ips: &[Ipv4Addr]) -> Result<(), kube::Error> {
        let ns = key.namespace.clone().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        let ingress: Vec<serde_json::Value> = ips
            .iter()
            .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
            .collect();
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

impl Reconciler for ServiceLbController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.load();
        let Some(svc) = self.services.get(key) else {
            self.pool().release_all_of(key);
            return Ok(Action::AwaitChange);
        };
        let shown = ingress_ips(&svc);
        if !is_ours(&svc) {
            // No longer a LoadBalancer (or now another implementation's): give it back.
            self.pool().release_all_of(key);
            if !shown.is_empty() {
                match self.write_status(key, &[]).await {
                    Err(e) if api_code(&e) != Some(404) => return Err(e.into()),
                    _ => {}
                }
            }
            return Ok(Action::AwaitChange);
        }
        let wanted: Option<Ipv4Addr> = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            .filter(|s| !s.is_empty())
            .and_then(|s| s.parse().ok());
        // Already assigned and still right: nothing to do.
        let current = {
            let pool = self.pool();
            shown
                .iter()
                .copied()
                .find(|ip| pool.owner.get(ip) == Some(key) && wanted.is_none_or(|w| w == *ip))
        };
        if let Some(ip) = current {
            if shown.len() == 1 {
                return Ok(Action::AwaitChange);
            }
            self.write_status(key, &[ip]).await?;
            return Ok(Action::AwaitChange);
        }
        let assigned = {
            let mut pool = self.pool();
            pool.release_all_of(key);
            pool.assign(key, wanted)
        };
        let ip = match assigned {
            Ok(ip) => ip,
            Err(reason) => {
                self.recorder.event(
                    svc.as_ref(),
                    EventType::Warning,
                    "AllocationFailed",
                    format!("Failed to allocate an IP for the load balancer: {reason}"),
                );
                return Err(ReconcileError::Retry(reason));
            }
        };
        match self.write_status(key, &[ip]).await {
            Ok(()) => {
                self.recorder.event(
                    svc.as_ref(),
                    EventType::Normal,
                    "EnsuredLoadBalancer",
                    format!("Ensured load balancer: assigned {ip}"),
                );
                tracing::info!(service = %key.name, %ip, "load balancer address assigned");
                Ok(Action::AwaitChange)
            }
            Err(e) => {
                self.pool().release_all_of(key);
                if api_code(&e) == Some(404) {
                    return Ok(Action::AwaitChange);
                }
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("default".into()),
            name: name.into(),
        }
    }

    #[test]
    fn pools_parse_as_ranges_and_cidrs() {
        let r: LbPool = "10.249.0.200-10.249.0.210".parse().unwrap();
        assert_eq!(r.to_string(), "10.249.0.200-10.249.0.210");
        let c: LbPool = "10.249.1.0/30".parse().unwrap();
        assert_eq!(c.to_string(), "10.249.1.1-10.249.1.2");
        assert!("10.249.0.9-10.249.0.1".parse::<LbPool>().is_err());
        assert!("10.0.0.0/8".parse::<LbPool>().is_err());
    }

    #[test]
    fn addresses_are_handed_out_once_and_requests_are_honoured() {
        let mut p = Pool {
            range: "10.0.0.1-10.0.0.3".parse().unwrap(),
            owner: HashMap::new(),
            next: 0,
        };
        let wanted: Ipv4Addr = "10.0.0.2".parse().unwrap();
        assert_eq!(p.assign(&key("a"), Some(wanted)), Ok(wanted));
        assert!(p.assign(&key("b"), Some(wanted)).is_err());
        assert!(p
            .assign(&key("b"), Some("10.9.9.9".parse().unwrap()))
            .is_err());
        let b = p.assign(&key("b"), None).unwrap();
        let c = p.assign(&key("c"), None).unwrap();
        assert!(b != wanted && c != wanted && b != c);
        assert!(p.assign(&key("d"), None).is_err(), "exhausted");
        p.release_all_of(&key("b"));
        assert_eq!(p.assign(&key("d"), None), Ok(b));
    }
}
