//! What a request asks to do, as authorizers see it (Kubernetes' `authorizer.Attributes`,
//! without the user): the verb and either a resource (group, version, namespace, resource,
//! subresource, name) or a non-resource path. Derived from the method, path and query exactly
//! as Kubernetes' `RequestInfoFactory` does, so rules written for Kubernetes mean the same here.
//! Pure.

use std::collections::HashMap;

use crate::machinery::FieldSelector;

/// A request's target and verb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// and the special verbs (`impersonate`, `bind`, `escalate`, ...); for non-resource
    /// paths the lowercase HTTP method.
    pub verb: String,
    pub target: Target,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Resource(ResourceAttributes),
    NonResource { path: String },
}

/// A resource request. Empty strings stand for "none" as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub group: String,
    pub version: String,
    /// "" for cluster-scoped requests (and cluster-wide lists).
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    /// "" for collections; a list or watch pinned to one `metadata.name` carries that name.
    pub name: String,
    /// The field selector of a list or watch, when it has one (the Node authorizer allows a
    /// node's pod watch only with `spec.nodeName=<node>`).
    pub field_selector: Option<String>,
}

impl Attributes {
    /// A resource request.
    pub fn resource(verb: &str, r: ResourceAttributes) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            target: Target::Resource(r),
        }
    }

    /// The attributes of an HTTP request (Kubernetes' `NewRequestInfo`).
    pub fn of_request(
        method: &http::Method,
        path: &str,
        query: &HashMap<String, String>,
    ) -> Attributes {
        let verb_of_method = || method.as_str().to_ascii_lowercase();
        let non_resource = || Attributes {
            verb: verb_of_method(),
            target: Target::NonResource {
                path: path.to_string(),
            },
        };
        let parts: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        let (group, rest) = match parts.as_slice() {
            ["api", rest @ ..] if parts.len() >= 3 => ("", rest),
            ["apis", group, rest @ ..] if parts.len() >= 4 => (*group, rest),
            _ => return non_resource(),
        };
        let (version, mut rest) = (rest[0], &rest[1..]);
        let mut verb = match *method {
            http::Method::POST => "create",
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
        let mut namespace = "";
        if rest.first() == Some(&"namespaces") {
            if let Some(ns) = rest.get(1) {
                namespace = ns;
                // `/namespaces/<ns>/<resource>...`, unless <resource> is a namespace's own
                // subresource (`/namespaces/<ns>/status`).
                if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                    rest = &rest[2..];
                }
            }
        }
        let mut r = ResourceAttributes {
            group: group.to_string(),
            version: version.to_string(),
            namespace: namespace.to_string(),
            resource: rest.first().map(|s| s.to_string()).unwrap_or_default(),
            name: rest.get(1).map(|s| s.to_string()).unwrap_or_default(),
            subresource: rest.get(2).map(|s| s.to_string()).unwrap_or_default(),
            field_selector: None,
        };
        if r.name.is_empty() && verb == "get" {
            verb = match query.get("watch").map(|w| w.to_ascii_lowercase()) {
                None => "list",
                Some(w) if w == "false" || w == "0" => "list",
                Some(_) => "watch",
            }
            .to_string();
            if let Some(fs) = query.get("fieldSelector").filter(|s| !s.is_empty()) {
                // A list or watch of one object by name is authorized as that object.
                if let Some(name) = FieldSelector::parse(fs)
                    .ok()
                    .and_then(|s| s.required_value("metadata.name").map(str::to_string))
                    .filter(|n| is_path_segment(n))
                {
                    r.name = name;
                }
                r.field_selector = Some(fs.clone());
            }
        }
        if r.name.is_empty() && verb == "delete" {
            verb = "deletecollection".to_string();
        }
        Attributes {
            verb,
            target: Target::Resource(r),
        }
    }

    /// The resource attributes, if this is a resource request.
    pub fn resource_attributes(&self) -> Option<&ResourceAttributes> {
        match &self.target {
            Target::Resource(r) => Some(r),
            Target::NonResource { .. } => None,
        }
    }

    /// The namespace of the request ("" for cluster scope and non-resource paths).
    pub fn namespace(&self) -> &str {
        self.resource_attributes()
            .map_or("", |r| r.namespace.as_str())
    }

    /// Kubernetes' description of a refused request, after `User "<name>" cannot `:
    /// `list resource "secrets" in API group "" in the namespace "default"`,
    /// `get path "/metrics"`.
    pub fn describe(&self) -> String {
        match &self.target {
            Target::NonResource { path } => format!("{} path {path:?}", self.verb),
            Target::Resource(r) => {
                let resource = if r.subresource.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{}/{}", r.resource, r.subresource)
                };
                let scope = if r.namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {:?}", r.namespace)
                };
                format!(
                    "{} resource {resource:?} in API group {:?} {scope}",
                    self.verb, r.group
                )
            }
        }
    }
}

/// Kubernetes' `IsValidPathSegmentName`.
fn is_path_segment(s: &str) -> bool {
    s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::request::parse_query;
    use http::Method;

    fn of(method: Method, path_and_query: &str) -> Attributes {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        Attributes::of_request(&method, path, &parse_query(Some(query)))
    }

    fn res(a: &Attributes) -> (&str, &str, &str, &str, &str, &str) {
        let r = a.resource_attributes().expect("a resource request");
        (
            a.verb.as_str(),
            r.group.as_str(),
            r.namespace.as_str(),
            r.resource.as_str(),
            r.subresource.as_str(),
            r.name.as_str(),
        )
    }

    #[test]
    fn verbs_come_from_the_method_the_name_and_the_query() {
        assert_eq!(
            res(&of(Method::GET, "/api/v1/namespaces/default/pods")),
            ("list", "", "default", "pods", "", "")
        );
        assert_eq!(
            res(&of(
                Method::GET,
                "/api/v1/namespaces/default/pods?watch=true"
            )),
            ("watch", "", "default", "pods", "", "")
        );
        assert_eq!(
            res(&of(Method::GET, "/api/v1/pods?watch=0")),
            ("list", "", "", "pods", "", "")
        );
        assert_eq!(
            res(&of(
                Method::GET,
                "/apis/apps/v1/namespaces/a/deployments/web/scale"
            )),
            ("get", "apps", "a", "deployments", "scale", "web")
        );
        assert_eq!(
            res(&of(Method::DELETE, "/api/v1/namespaces/a/secrets")),
            ("deletecollection", "", "a", "secrets", "", "")
        );
        assert_eq!(
            res(&of(Method::DELETE, "/api/v1/namespaces/a/secrets/s")),
            ("delete", "", "a", "secrets", "", "s")
        );
        assert_eq!(
            res(&of(
                Method::POST,
                "/api/v1/namespaces/a/pods/p/exec?command=ls"
            )),
            ("create", "", "a", "pods", "exec", "p")
        );
        assert_eq!(
            res(&of(Method::PATCH, "/api/v1/nodes/n1/status")),
            ("patch", "", "", "nodes", "status", "n1")
        );
        // Proxy subresources: the verb of the method, the name as written, any path after.
        assert_eq!(
            res(&of(
                Method::GET,
                "/api/v1/namespaces/a/pods/https:p:8443/proxy/x/y"
            )),
            ("get", "", "a", "pods", "proxy", "https:p:8443")
        );
        assert_eq!(
            res(&of(Method::POST, "/api/v1/nodes/n1/proxy/")),
            ("create", "", "", "nodes", "proxy", "n1")
        );
    }

    #[test]
    fn namespaces_are_their_own_namespace() {
        assert_eq!(
            res(&of(Method::GET, "/api/v1/namespaces/kube-system")),
            ("get", "", "kube-system", "namespaces", "", "kube-system")
        );
        assert_eq!(
            res(&of(Method::PUT, "/api/v1/namespaces/x/finalize")),
            ("update", "", "x", "namespaces", "finalize", "x")
        );
        assert_eq!(
            res(&of(Method::GET, "/api/v1/namespaces")),
            ("list", "", "", "namespaces", "", "")
        );
    }

    #[test]
    fn a_list_of_one_name_is_authorized_as_that_object() {
        let a = of(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?fieldSelector=metadata.name%3Dkube-scheduler&watch=true",
        );
        assert_eq!(
            res(&a),
            (
                "watch",
                "coordination.k8s.io",
                "kube-system",
                "leases",
                "",
                "kube-scheduler"
            )
        );
        let a = of(Method::GET, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
        assert_eq!(res(&a).5, "");
        assert_eq!(
            a.resource_attributes().unwrap().field_selector.as_deref(),
            Some("spec.nodeName=n1")
        );
    }

    #[test]
    fn short_and_unknown_paths_are_non_resource() {
        for p in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/healthz",
            "/openapi/v3",
            "/",
        ] {
            let a = of(Method::GET, p);
            assert_eq!(
                a.target,
                Target::NonResource {
                    path: p.to_string()
                },
                "{p}"
            );
            assert_eq!(a.verb, "get");
        }
        assert_eq!(of(Method::POST, "/metrics").verb, "post");
    }

    #[test]
    fn descriptions_match_kubernetes() {
        let a = of(Method::GET, "/api/v1/namespaces/default/secrets");
        assert_eq!(
            a.describe(),
            r#"list resource "secrets" in API group "" in the namespace "default""#
        );
        let a = of(Method::POST, "/api/v1/namespaces/default/pods/p/exec");
        assert_eq!(
            a.describe(),
            r#"create resource "pods/exec" in API group "" in the namespace "default""#
        );
        let a = of(
            Method::GET,
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        );
        assert_eq!(
            a.describe(),
            r#"list resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope"#
        );
        assert_eq!(
            of(Method::GET, "/metrics").describe(),
            r#"get path "/metrics""#
        );
    }
}
