//! Pod networking through CNI: the agent writes one network configuration per node (Debian's
//! `bridge` plugin with `host-local` IPAM over the node's pod CIDR, each on names derived from
//! the node name) into its own conf dir; containerd's CRI runs the plugins for every sandbox.

use crate::layout::Layout;
use crate::names::NodeName;
use ipnet::Ipv4Net;
use serde_json::json;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;

/// A node's pod network (`spec.podCIDR`, such as `10.244.1.0/24`): an IPv4 CIDR with room
/// for a gateway and a pod (a prefix of at most 30).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr(Ipv4Net);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid IPv4 CIDR {0:?}")]
pub struct BadCidr(pub String);

impl FromStr for Cidr {
    type Err = BadCidr;
    fn from_str(s: &str) -> Result<Cidr, BadCidr> {
        control_plane::cidr::parse_ipv4(s, 0..=30)
            .map(Cidr)
            .map_err(|_| BadCidr(s.to_string()))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Cidr {
    pub fn net(&self) -> Ipv4Net {
        self.0
    }

    /// The first host address: the bridge's own address and the pods' gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        // A prefix of at most 30 always has hosts.
        self.0.hosts().next().unwrap_or(self.0.network())
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.contains(&ip)
    }
}

const CONF_FILE: &str = "10-skiff.conflist";

/// The CNI network configuration list for `node` with pods in `cidr`.
pub fn conflist(layout: &Layout, node: &NodeName, cidr: Cidr) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": node.cni_network(),
        "plugins": [{
            "type": "bridge",
            "bridge": node.bridge(),
            "isGateway": true,
            // No masquerade: pod traffic keeps its source address across nodes (routes to
            // other nodes' pod CIDRs carry it), and nothing leaves the machine.
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": cidr.to_string(), "gateway": cidr.gateway().to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": layout.cni_ipam_dir(),
            },
        }, {
            // hostPort: the runtime passes the sandbox's port mappings; DNAT from the node's
            // addresses (and SNAT for the node's own connections to them).
            "type": "portmap",
            "capabilities": {"portMappings": true},
            "snat": true,
        }],
    })
}

/// Writes the node's CNI configuration; returns whether it changed. containerd watches the
/// directory and picks the new network up for the next sandbox.
pub fn write_config(layout: &Layout, node: &NodeName, cidr: Cidr) -> std::io::Result<bool> {
    let dir = layout.cni_conf_dir();
    std::fs::create_dir_all(&dir)?;
    let path: PathBuf = dir.join(CONF_FILE);
    let text = serde_json::to_string_pretty(&conflist(layout, node, cidr))
        .map_err(std::io::Error::other)?;
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    // Write then rename: containerd must never read a half-written file.
    let tmp = dir.join(format!(".{CONF_FILE}.tmp"));
    std::fs::write(&tmp, &text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(true)
}

/// Deletes the node's bridge (when the node goes away for good, e.g. in tests).
pub fn remove_bridge(node: &NodeName) {
    let deleted = crate::netlink::Netlink::open().map(|mut nl| nl.delete_link(&node.bridge()));
    match deleted {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "removing the node's bridge"),
        Err(e) => tracing::warn!(error = %e, "opening a netlink socket"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let c: Cidr = "10.244.3.7/24".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.3.0/24");
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 244, 3, 1));
        assert!(c.contains(Ipv4Addr::new(10, 244, 3, 200)));
        assert!(!c.contains(Ipv4Addr::new(10, 244, 4, 1)));
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "x/24",
            "10.0.0.0/31",
            "10.0.0/8",
            "",
        ] {
            assert_eq!(bad.parse::<Cidr>(), Err(BadCidr(bad.to_string())), "{bad}");
        }
    }

    #[test]
    fn conflist_uses_node_derived_names() {
        let layout = Layout::new("/d");
        let node = NodeName::new("n1");
        let c = conflist(&layout, &node, "10.244.1.0/24".parse().unwrap());
        assert_eq!(c["name"], "skiff-n1");
        assert_eq!(c["plugins"][0]["bridge"], node.bridge());
        assert_eq!(c["plugins"][0]["ipam"]["dataDir"], "/d/cni/ipam");
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.1.0/24"
        );
    }
}
