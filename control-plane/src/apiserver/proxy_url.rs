//! The addressing of the proxy subresources, pure: the name on the path
//! (`name`, `name:port`, `scheme:name:port`, Kubernetes' `SplitSchemeNamePort`), the headers
//! a relayed request leaves behind, and how a backend's redirect is rewritten to stay under
//! the proxy path (Kubernetes' `proxy.Transport.rewriteURL` with the API server's own
//! scheme and host left out, so the client keeps the address it used: `kubectl proxy`'s
//! localhost, or the API server's).

/// How the backend is spoken to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// The name segment of a proxy path, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyName<'a> {
    /// None: not given (plain HTTP, or the node agent's own scheme for nodes).
    pub scheme: Option<Scheme>,
    pub name: &'a str,
    /// "" when not given; a number, or a port's name (services).
    pub port: &'a str,
}

impl<'a> ProxyName<'a> {
    /// `name`, `name:port` or `scheme:name:port` with scheme `http` or `https` (or empty);
    /// None for anything else, which Kubernetes answers "invalid <kind> request".
    pub fn parse(id: &'a str) -> Option<ProxyName<'a>> {
        let parts: Vec<&str> = id.split(':').collect();
        let (scheme, name, port) = match parts.as_slice() {
            [name] => ("", *name, ""),
            [name, port] => ("", *name, *port),
            [scheme, name, port] => (*scheme, *name, *port),
            _ => return None,
        };
        let scheme = match scheme {
            "" => None,
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => return None,
        };
        (!name.is_empty()).then_some(ProxyName { scheme, name, port })
    }
}

/// Request headers that are not passed on to the backend: the hop-by-hop ones (RFC 9110
/// 7.6.1), the caller's credentials for this server (Kubernetes' authentication filter
/// removes `Authorization` before any handler runs; the backend must never see them) and
/// impersonation, which only this server interprets.
pub fn drop_request_header(name: &str) -> bool {
    const HOP_BY_HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    let name = name.to_ascii_lowercase();
    HOP_BY_HOP.contains(&name.as_str())
        || name == "authorization"
        || name == "host"
        || name.starts_with("impersonate-")
}

/// Response headers that are not passed back: the hop-by-hop ones, and the backend's CORS
/// grants, which must not widen what this server allows (Kubernetes' corsRemovingTransport).
pub fn drop_response_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    ) || name.starts_with("access-control-")
}

/// Rewrites a backend's `Location` so that a redirect within the backend stays under the
/// proxy path `prefix` (`/api/v1/namespaces/ns/pods/web:8080/proxy`). `backend` is the
/// authority the request went to and `request_host` the Host the client used: an absolute
/// URL naming either is the same host. Relative references and other hosts pass unchanged.
pub fn rewrite_location(location: &str, backend: &str, request_host: &str, prefix: &str) -> String {
    let (authority, rest) = if let Some(r) = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))
        .or_else(|| location.strip_prefix("//"))
    {
        let end = r.find(['/', '?', '#']).unwrap_or(r.len());
        (Some(&r[..end]), &r[end..])
    } else {
        (None, location)
    };
    if let Some(a) = authority {
        if !a.is_empty() && a != backend && a != request_host {
            return location.to_string();
        }
    }
    if !rest.starts_with('/') {
        // Relative to the page (or an authority with no path): the client resolves it
        // against the proxied URL it is on, which is already under the prefix.
        return if authority.is_some() && rest.is_empty() {
            format!("{prefix}/")
        } else {
            location.to_string()
        };
    }
    if rest.starts_with(&format!("{prefix}/")) || rest == prefix {
        return rest.to_string();
    }
    format!("{prefix}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_as_kubernetes_splits_them() {
        let p = |s| ProxyName::parse(s);
        assert_eq!(
            p("web").unwrap(),
            ProxyName {
                scheme: None,
                name: "web",
                port: ""
            }
        );
        assert_eq!(p("web:8080").unwrap().port, "8080");
        assert_eq!(p("web:http").unwrap().port, "http");
        let s = p("https:web:8443").unwrap();
        assert_eq!(
            (s.scheme, s.name, s.port),
            (Some(Scheme::Https), "web", "8443")
        );
        assert_eq!(p("http:web:").unwrap().scheme, Some(Scheme::Http));
        assert_eq!(p(":web:80").unwrap().scheme, None);
        assert_eq!(p("ftp:web:21"), None);
        assert_eq!(p("a:b:c:d"), None);
        assert_eq!(p(":80"), None);
    }

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_here() {
        for h in [
            "Authorization",
            "Connection",
            "Upgrade",
            "Impersonate-User",
            "impersonate-extra-scopes",
            "Transfer-Encoding",
            "Host",
        ] {
            assert!(drop_request_header(h), "{h}");
        }
        for h in ["Accept", "Cookie", "Content-Type", "X-Custom"] {
            assert!(!drop_request_header(h), "{h}");
        }
        assert!(drop_response_header("Access-Control-Allow-Origin"));
        assert!(drop_response_header("Transfer-Encoding"));
        assert!(!drop_response_header("Set-Cookie"));
        assert!(!drop_response_header("Location"));
    }

    #[test]
    fn redirects_within_the_backend_stay_under_the_proxy_path() {
        let pre = "/api/v1/namespaces/d/pods/web:8080/proxy";
        let rw = |l: &str| rewrite_location(l, "10.244.1.5:8080", "localhost:8001", pre);
        assert_eq!(rw("/login?next=%2F"), format!("{pre}/login?next=%2F"));
        assert_eq!(rw("http://10.244.1.5:8080/a/b"), format!("{pre}/a/b"));
        assert_eq!(rw("http://localhost:8001/a"), format!("{pre}/a"));
        assert_eq!(rw("http://10.244.1.5:8080"), format!("{pre}/"));
        assert_eq!(rw("//10.244.1.5:8080/x#f"), format!("{pre}/x#f"));
        // Already under the prefix, relative, or elsewhere: unchanged.
        let under = format!("{pre}/x");
        assert_eq!(rw(&under), under);
        assert_eq!(rw("next/page"), "next/page");
        assert_eq!(rw("https://example.com/x"), "https://example.com/x");
    }
}
