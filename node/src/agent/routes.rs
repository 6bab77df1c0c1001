//! Routes to other nodes' pod CIDRs, learned by watching Nodes: `<podCIDR> via <InternalIP>`
//! in the agent's network namespace, so pods on different nodes reach each other directly
//! (no encapsulation, no NAT). Nodes that share this network namespace need no route.
//!
//! Every (re)list of the Nodes ends in [`Routes::resync`]: entries for nodes the list no
//! longer has are dropped (a deletion missed while the watch was down), and any route marked
//! with skiff's protocol that no node asks for is deleted (one an earlier run of the agent
//! installed for a node deleted while it was stopped). Between lists the work per event is
//! one node's route.

use crate::cni::Cidr;
use crate::names::NodeName;
use crate::netlink::Netlink;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use tracing::{info, warn};

/// A route this agent installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    cidr: Cidr,
    via: Ipv4Addr,
}

/// The pod CIDR and InternalIP of a node, if it has both.
pub fn node_route(node: &Node) -> Option<(Cidr, Ipv4Addr)> {
    let cidr = node.spec.as_ref()?.pod_cidr.as_ref()?.parse().ok()?;
    let ip = node
        .status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .parse()
        .ok()?;
    Some((cidr, ip))
}

/// Keeps the routes to other nodes in step with the Node objects.
pub struct Routes {
    me: NodeName,
    my_ip: Option<Ipv4Addr>,
    installed: HashMap<String, Route>,
    /// Opened at the first change and kept.
    netlink: Option<Netlink>,
}

impl Routes {
    pub fn new(me: NodeName, my_ip: Option<Ipv4Addr>) -> Routes {
        Routes {
            me,
            my_ip,
            installed: HashMap::new(),
            netlink: None,
        }
    }

    /// A node was added or changed.
    pub fn apply(&mut self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        if name == self.me.as_str() {
            return;
        }
        let wanted = node_route(node)
            .filter(|(_, ip)| !ip.is_loopback() && Some(*ip) != self.my_ip)
            .map(|(cidr, via)| Route { cidr, via });
        if self.installed.get(&name).copied() == wanted {
            return;
        }
        if let Some(old) = self.installed.remove(&name) {
            self.delete(old.cidr);
        }
        if let Some(r) = wanted {
            if self.replace(r) {
                info!(node = %name, cidr = %r.cidr, via = %r.via, "route to a node's pods");
                self.installed.insert(name, r);
            }
        }
    }

    /// A node was deleted.
    pub fn remove(&mut self, name: &str) {
        if let Some(old) = self.installed.remove(name) {
            self.delete(old.cidr);
        }
    }

    /// After a (re)list of all Nodes (`listed`: their names): forgets nodes that are gone
    /// and deletes every skiff-marked route in the namespace that no listed node wants.
    pub fn resync(&mut self, listed: &HashSet<String>) {
        let gone: Vec<String> = self
            .installed
            .keys()
            .filter(|n| !listed.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            info!(node = %name, "node gone while the watch relisted: removing its route");
            self.remove(&name);
        }
        let wanted: HashSet<Ipv4Net> = self.installed.values().map(|r| r.cidr.net()).collect();
        let Some(nl) = self.netlink() else { return };
        let stale = match nl.skiff_routes() {
            Ok(found) => found.into_iter().filter(|d| !wanted.contains(d)),
            Err(e) => {
                warn!(error = %e, "listing the routes to nodes' pods");
                return;
            }
        };
        for dst in stale.collect::<Vec<_>>() {
            info!(cidr = %dst, "removing a route to pods of a node that no longer exists");
            if let Err(e) = nl.delete_route(dst) {
                warn!(error = %e, "removing a stale route to a node's pods");
            }
        }
    }

    /// Removes every route this agent installed (on shutdown).
    pub fn clear(&mut self) {
        for (_, r) in std::mem::take(&mut self.installed) {
            self.delete(r.cidr);
        }
    }

    /// The netlink socket, opened on first use (a failure is logged; the next change retries).
    fn netlink(&mut self) -> Option<&mut Netlink> {
        if self.netlink.is_none() {
            match Netlink::open() {
                Ok(nl) => self.netlink = Some(nl),
                Err(e) => warn!(error = %e, "opening a netlink socket for routes"),
            }
        }
        self.netlink.as_mut()
    }

    /// Installs (or replaces) a route; returns whether the kernel took it.
    fn replace(&mut self, r: Route) -> bool {
        let Some(nl) = self.netlink() else {
            return false;
        };
        match nl.replace_route(r.cidr.net(), r.via) {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, "route to a node's pods");
                false
            }
        }
    }

    fn delete(&mut self, cidr: Cidr) {
        if let Some(nl) = self.netlink() {
            if let Err(e) = nl.delete_route(cidr.net()) {
                warn!(error = %e, "removing a route to a node's pods");
            }
        }
    }
}
