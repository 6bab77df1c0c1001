//! Who answers: the echo server's identity line, `pod=<name> namespace=<ns> ip=<ip>
//! node=<node> client=<ip:port>`. The downward API env (POD_NAME, POD_NAMESPACE, POD_IP,
//! NODE_NAME) wins; without it (`kubectl create deployment` and `kubectl run` set none) the
//! pod is still identified by what every container has: its host name (the runtime sets the
//! pod's name), the namespace file of its service account, and the address of its interface.
//! `client=` is the remote address of the connection as this pod sees it, so a user can tell
//! whether a proxy kept the client's address or translated it.

use crate::incluster::SERVICE_ACCOUNT_DIR;
use std::net::{IpAddr, SocketAddr};

/// The parts of the identity that do not change while the process runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub pod: String,
    pub namespace: String,
    pub ip: String,
    pub node: String,
}

impl Identity {
    /// From the environment (downward API), each missing value from its fallback.
    pub fn discover() -> Identity {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Identity {
            pod: var("POD_NAME").or_else(hostname).unwrap_or_default(),
            namespace: var("POD_NAMESPACE")
                .or_else(|| {
                    std::fs::read_to_string(format!("{SERVICE_ACCOUNT_DIR}/namespace"))
                        .ok()
                        .map(|n| n.trim().to_string())
                })
                .unwrap_or_default(),
            ip: var("POD_IP")
                .or_else(|| interface_addr().map(|a| a.to_string()))
                .unwrap_or_default(),
            node: var("NODE_NAME").unwrap_or_default(),
        }
    }

    /// The answer to `GET /` on a connection from `client` (None: the peer address was
    /// not available, the field is then empty).
    pub fn line(&self, client: Option<SocketAddr>) -> String {
        format!(
            "pod={} namespace={} ip={} node={} client={}\n",
            self.pod,
            self.namespace,
            self.ip,
            self.node,
            client.map(|c| c.to_string()).unwrap_or_default()
        )
    }
}

/// The kernel's host name (in a pod's UTS namespace: the pod's name).
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it
    // when the name fits, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The first address of an interface that is up and not loopback, IPv4 before IPv6 (a
/// pod has one such interface, eth0).
pub fn interface_addr() -> Option<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we only read and free once.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags as libc::c_int;
        if ifa.ifa_addr.is_null() || flags & libc::IFF_UP == 0 || flags & libc::IFF_LOOPBACK != 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        match family {
            libc::AF_INET => {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found.push(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()));
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 addresses are sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // Link-local addresses (fe80::/10) are not how anyone reaches the pod.
                if ip.segments()[0] & 0xffc0 != 0xfe80 {
                    found.push(IpAddr::V6(ip));
                }
            }
            _ => {}
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no reference outlives this.
    unsafe { libc::freeifaddrs(list) };
    found.sort_by_key(|a| a.is_ipv6());
    found.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_every_field_and_the_client() {
        let id = Identity {
            pod: "web-1".into(),
            namespace: "default".into(),
            ip: "10.244.1.5".into(),
            node: "n1".into(),
        };
        assert_eq!(
            id.line(Some("10.244.2.7:41234".parse().unwrap())),
            "pod=web-1 namespace=default ip=10.244.1.5 node=n1 client=10.244.2.7:41234\n"
        );
        assert_eq!(
            id.line(None),
            "pod=web-1 namespace=default ip=10.244.1.5 node=n1 client=\n"
        );
    }

    #[test]
    fn fallbacks_name_this_host() {
        let name = hostname().expect("a host name");
        let uname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(name, uname.trim());
        // Any address found is a usable one: not loopback, not link-local.
        if let Some(ip) = interface_addr() {
            assert!(!ip.is_loopback(), "{ip}");
        }
    }
}
