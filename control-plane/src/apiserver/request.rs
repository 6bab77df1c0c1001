//! What a request asks for: the API path parsed into group, version, namespace, resource,
//! name and subresource, and the query parameters of lists, watches and writes. Pure.

use std::collections::HashMap;
use std::time::Duration;

use crate::machinery::fieldmanager::Operation;
use crate::machinery::ApiError;

/// A path under `/api` or `/apis`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiPath {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1`, `/apis/<group>/<version>`
    GroupVersion { group: String, version: String },
    /// A resource, collection or subresource.
    Resource(ResourcePath),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Parses an API path (without the query). None: not an API path.
pub fn parse_path(path: &str) -> Option<ApiPath> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Some(ApiPath::CoreVersions),
        ["apis"] => return Some(ApiPath::Groups),
        ["apis", g] => return Some(ApiPath::Group(g.to_string())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    if rest.iter().any(|s| s.is_empty()) {
        return None;
    }
    let r = |namespace: Option<&str>, resource: &str, name: Option<&str>, sub: Option<&str>| {
        Some(ApiPath::Resource(ResourcePath {
            group: group.to_string(),
            version: version.to_string(),
            namespace: namespace.map(str::to_string),
            resource: resource.to_string(),
            name: name.map(str::to_string),
            subresource: sub.map(str::to_string),
        }))
    };
    match rest {
        [] => Some(ApiPath::GroupVersion {
            group: group.to_string(),
            version: version.to_string(),
        }),
        // The namespace object itself and its subresources.
        ["namespaces"] => r(None, "namespaces", None, None),
        ["namespaces", ns] => r(None, "namespaces", Some(ns), None),
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            r(None, "namespaces", Some(ns), Some(sub))
        }
        ["namespaces", ns, res] => r(Some(ns), res, None, None),
        ["namespaces", ns, res, name] => r(Some(ns), res, Some(name), None),
        ["namespaces", ns, res, name, sub] => r(Some(ns), res, Some(name), Some(sub)),
        [res] => r(None, res, None, None),
        [res, name] => r(None, res, Some(name), None),
        [res, name, sub] => r(None, res, Some(name), Some(sub)),
        _ => None,
    }
}

/// Splits the path of a proxy subresource (`/api/v1/namespaces/<ns>/<resource>/<name>/proxy`
/// or `/api/v1/<resource>/<name>/proxy`, then anything) into the subresource's own path and
/// the path relayed to the backend: `/<rest>` as the client wrote it (still escaped, empty
/// segments kept), or "" when the path ends at `proxy` (which Kubernetes redirects to
/// `proxy/`). None: not a proxy path.
pub fn split_proxy(path: &str) -> Option<(&str, &str)> {
    let segs: Vec<&str> = path.split('/').collect();
    let head = match segs.as_slice() {
        ["", "api", _, "namespaces", _, _, _, "proxy", ..] => 8,
        ["", "api", _, _, _, "proxy", ..] => 6,
        _ => return None,
    };
    if segs[..head].iter().skip(1).any(|s| s.is_empty()) {
        return None;
    }
    let len = segs[..head].iter().map(|s| s.len() + 1).sum::<usize>() - 1;
    Some(path.split_at(len))
}

/// The query string as a map (last value wins), percent-decoded.
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(percent_decode(k), percent_decode(v));
    }
    out
}

/// Every value of a parameter that repeats (exec's `command`), percent-decoded, in order.
pub fn query_values(query: &str, key: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(k, _)| percent_decode(k) == key)
        .map(|(_, v)| percent_decode(v))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// `resourceVersion` of a read, with `resourceVersionMatch` folded in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAt {
    /// "" : the latest state (consistent read).
    Latest,
    /// "0": any state the cache has.
    Any,
    /// "N": state at least as new as N.
    NotOlderThan(u64),
}

/// Options of list and watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub resource_version: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub watch: bool,
    pub allow_bookmarks: bool,
    pub timeout: Option<Duration>,
    pub send_initial_events: bool,
}

impl ListOptions {
    pub fn from_query(q: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
        let non_empty = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
        let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
        let number = |k: &str| -> Result<Option<u64>, ApiError> {
            non_empty(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| ApiError::bad_request(format!("invalid {k} {v:?}")))
                })
                .transpose()
        };
        Ok(ListOptions {
            label_selector: non_empty("labelSelector"),
            field_selector: non_empty("fieldSelector"),
            resource_version: q.get("resourceVersion").cloned(),
            limit: number("limit")?.filter(|l| *l > 0).map(|l| l as usize),
            continue_token: non_empty("continue"),
            watch: flag("watch"),
            allow_bookmarks: flag("allowWatchBookmarks"),
            timeout: number("timeoutSeconds")?.map(Duration::from_secs),
            send_initial_events: flag("sendInitialEvents"),
        })
    }

    pub fn read_at(&self) -> Result<ReadAt, ApiError> {
        match self.resource_version.as_deref() {
            None | Some("") => Ok(ReadAt::Latest),
            Some("0") => Ok(ReadAt::Any),
            Some(v) => v
                .parse()
                .map(ReadAt::NotOlderThan)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}"))),
        }
    }
}

/// `fieldValidation`
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Options of create, update, patch and delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// The `fieldManager` parameter; the handlers fill it from the User-Agent when absent.
    pub field_manager: Option<String>,
    pub force: bool,
    /// Whether the write is a server-side apply (its managed fields are computed by the
    /// apply itself) or an update of any other kind.
    pub operation: Operation,
}

impl WriteOptions {
    pub fn from_query(q: &HashMap<String, String>) -> Result<WriteOptions, ApiError> {
        let dry_run = match q.get("dryRun").map(String::as_str) {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid dryRun value {other:?}: only \"All\" is supported"
                )))
            }
        };
        let field_validation = match q.get("fieldValidation").map(String::as_str) {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation must be one of Ignore, Warn or Strict, not {other:?}"
                )))
            }
        };
        Ok(WriteOptions {
            dry_run,
            field_validation,
            field_manager: q.get("fieldManager").cloned(),
            force: q.get("force").is_some_and(|v| v == "true"),
            operation: Operation::Update,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(p: &str) -> ResourcePath {
        match parse_path(p) {
            Some(ApiPath::Resource(r)) => r,
            other => panic!("{p}: {other:?}"),
        }
    }

    #[test]
    fn parses_kubernetes_paths() {
        let r = res("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.resource, "pods");
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = res("/apis/apps/v1/deployments");
        assert_eq!((r.group.as_str(), r.namespace), ("apps", None));
        let r = res("/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        let r = res("/api/v1/namespaces/x/finalize");
        assert_eq!(r.subresource.as_deref(), Some("finalize"));
        let r = res("/api/v1/nodes/n1/status");
        assert_eq!((r.name.as_deref(), r.namespace), (Some("n1"), None));
        assert_eq!(
            parse_path("/apis/apps"),
            Some(ApiPath::Group("apps".into()))
        );
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(parse_path("/api/v1/namespaces/a/pods/b/c/d"), None);
        assert_eq!(parse_path("/api/v1//pods"), None);
    }

    #[test]
    fn proxy_paths_keep_the_relayed_path_as_written() {
        assert_eq!(
            split_proxy("/api/v1/namespaces/d/pods/web:8080/proxy/a//b%2F"),
            Some(("/api/v1/namespaces/d/pods/web:8080/proxy", "/a//b%2F"))
        );
        assert_eq!(
            split_proxy("/api/v1/nodes/n1/proxy"),
            Some(("/api/v1/nodes/n1/proxy", ""))
        );
        assert_eq!(
            split_proxy("/api/v1/nodes/n1/proxy/"),
            Some(("/api/v1/nodes/n1/proxy", "/"))
        );
        let r = res(
            split_proxy("/api/v1/namespaces/d/services/https:s:web/proxy/x")
                .unwrap()
                .0,
        );
        assert_eq!(
            (
                r.resource.as_str(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            ("services", Some("https:s:web"), Some("proxy"))
        );
        assert_eq!(split_proxy("/api/v1/namespaces/d/pods/web/log"), None);
        assert_eq!(split_proxy("/api/v1/namespaces/d/pods//proxy/x"), None);
        assert_eq!(split_proxy("/apis/apps/v1/deployments/x/proxy/"), None);
    }

    #[test]
    fn query_is_decoded() {
        let q = parse_query(Some(
            "labelSelector=app%3Dweb%2Ctier+in+(a)&limit=5&watch=1",
        ));
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        let o = ListOptions::from_query(&q).unwrap();
        assert_eq!(o.limit, Some(5));
        assert!(o.watch);
        assert!(ListOptions::from_query(&parse_query(Some("limit=x"))).is_err());
        assert_eq!(parse_query(Some("a=%zz%"))["a"], "%zz%");
    }
}
