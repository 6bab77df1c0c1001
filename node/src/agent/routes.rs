//! Routes to other nodes' pod CIDRs, learned by watching Nodes: `<podCIDR> via <InternalIP>`
//! in the agent's network namespace, so pods on different nodes reach each other directly
//! (no encapsulation, no NAT). Nodes that share this network namespace need no route.

use crate::cni::Cidr;
use crate::names::NodeName;
use k8s_openapi::api::core::v1::Node;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
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
}

impl Routes {
    pub fn new(me: NodeName, my_ip: Option<Ipv4Addr>) -> Routes {
        Routes {
            me,
            my_ip,
            installed: HashMap::new(),
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
            ip_route(&["del", &old.cidr.to_string()]);
        }
        if let Some(r) = wanted {
            if ip_route(&["replace", &r.cidr.to_string(), "via", &r.via.to_string()]) {
                info!(node = %name, cidr = %r.cidr, via = %r.via, "route to a node's pods");
                self.installed.insert(name, r);
            }
        }
    }

    /// A node was deleted.
    pub fn remove(&mut self, name: &str) {
        if let Some(old) = self.installed.remove(name) {
            ip_route(&["del", &old.cidr.to_string()]);
        }
    }

    /// Removes every route this agent installed (on shutdown).
    pub fn clear(&mut self) {
        for (_, r) in self.installed.drain() {
            ip_route(&["del", &r.cidr.to_string()]);
        }
    }
}

fn ip_route(args: &[&str]) -> bool {
    let out = Command::new("ip")
        .arg("route")
        .args(args)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            warn!(args = ?args, error = %String::from_utf8_lossy(&o.stderr).trim(), "ip route failed");
            false
        }
        Err(e) => {
            warn!(error = %e, "running ip route");
            false
        }
    }
}
