//! Impersonation (`kubectl --as`, `--as-group`): the `Impersonate-User`, `Impersonate-Uid`,
//! `Impersonate-Group` and `Impersonate-Extra-<key>` headers turn the caller into the named
//! user, once the caller is allowed the `impersonate` verb on each thing it asks for (users,
//! groups, service accounts, uids, userextras), checked in that order as Kubernetes does.

use std::collections::BTreeMap;

use http::HeaderMap;

use super::attributes::{Attributes, ResourceAttributes};
use super::rbac::service_account_of;
use super::{allowed, forbidden};
use crate::apiserver::auth::{UserInfo, AUTHENTICATED};
use crate::apiserver::handlers::Ctx;
use crate::machinery::ApiError;

pub const USER: &str = "impersonate-user";
pub const UID: &str = "impersonate-uid";
pub const GROUP: &str = "impersonate-group";
pub const EXTRA_PREFIX: &str = "impersonate-extra-";

/// The anonymous user and the group of unauthenticated requests.
pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// One thing a request asks to act as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Request {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Request {
    /// What the caller must be allowed to `impersonate`.
    fn attributes(&self) -> Attributes {
        let (group, resource, subresource, namespace, name) = match self {
            Request::User(n) => ("", "users", "", "", n.as_str()),
            Request::ServiceAccount { namespace, name } => {
                ("", "serviceaccounts", "", namespace.as_str(), name.as_str())
            }
            Request::Group(n) => ("", "groups", "", "", n.as_str()),
            Request::Extra { key, value } => (
                "authentication.k8s.io",
                "userextras",
                key.as_str(),
                "",
                value.as_str(),
            ),
            Request::Uid(u) => ("authentication.k8s.io", "uids", "", "", u.as_str()),
        };
        Attributes::resource(
            "impersonate",
            ResourceAttributes {
                group: group.into(),
                version: "v1".into(),
                namespace: namespace.into(),
                resource: resource.into(),
                subresource: subresource.into(),
                name: name.into(),
                field_selector: None,
            },
        )
    }
}

fn header_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

/// Kubernetes escapes extra keys in header names (`Impersonate-Extra-Foo%2Fbar`).
fn unescape(key: &str) -> String {
    let mut out = Vec::new();
    let b = key.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The impersonation a request asks for, in Kubernetes' order (user, groups, extras, uid).
fn requests(headers: &HeaderMap) -> Result<Vec<Request>, ApiError> {
    let mut out = vec![];
    let user = headers
        .get(USER)
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty());
    if let Some(u) = user {
        out.push(match service_account_of(u) {
            Some((namespace, name)) => Request::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
            },
            None => Request::User(u.into()),
        });
    }
    for g in header_values(headers, GROUP) {
        out.push(Request::Group(g.into()));
    }
    let mut extra_names: Vec<&str> = headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with(EXTRA_PREFIX))
        .collect();
    extra_names.sort();
    extra_names.dedup();
    for name in extra_names {
        let key = unescape(&name[EXTRA_PREFIX.len()..]);
        for value in header_values(headers, name) {
            out.push(Request::Extra {
                key: key.clone(),
                value: value.into(),
            });
        }
    }
    if let Some(uid) = headers
        .get(UID)
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    {
        out.push(Request::Uid(uid.into()));
    }
    if user.is_none() && !out.is_empty() {
        let asked: Vec<String> = out.iter().map(|r| format!("{r:?}")).collect();
        return Err(ApiError::internal(format!(
            "requested [{}] without impersonating a user",
            asked.join(" ")
        )));
    }
    Ok(out)
}

/// The user a request acts as: `caller` itself without impersonation headers, else the
/// impersonated user once the caller may impersonate each part of it.
pub async fn impersonate(
    ctx: &Ctx,
    caller: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    let asked = requests(headers)?;
    if asked.is_empty() {
        return Ok(caller);
    }
    let groups_given = asked.iter().any(|r| matches!(r, Request::Group(_)));
    let mut user = UserInfo::default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &asked {
        let a = r.attributes();
        if let Some(reason) = allowed(ctx, &caller, &a).await? {
            return Err(forbidden(&caller, &a, &reason));
        }
        match r {
            Request::User(n) => user.name = n.clone(),
            Request::ServiceAccount { namespace, name } => {
                user.name = format!("{}{namespace}:{name}", super::rbac::SERVICE_ACCOUNT_PREFIX);
                if !groups_given {
                    user.groups = vec![
                        "system:serviceaccounts".to_string(),
                        format!("system:serviceaccounts:{namespace}"),
                    ];
                }
            }
            Request::Group(g) => user.groups.push(g.clone()),
            Request::Extra { key, value } => {
                extra.entry(key.clone()).or_default().push(value.clone())
            }
            Request::Uid(u) => user.uid = u.clone(),
        }
    }
    let (wanted, excluded) = if user.name == ANONYMOUS {
        (UNAUTHENTICATED, UNAUTHENTICATED)
    } else {
        (AUTHENTICATED, UNAUTHENTICATED)
    };
    if !user.groups.iter().any(|g| g == wanted || g == excluded) {
        user.groups.push(wanted.to_string());
    }
    user.extra = extra;
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_become_requests_in_kubernetes_order() {
        let h = headers(&[
            ("Impersonate-Uid", "u-1"),
            ("Impersonate-Group", "devs"),
            ("Impersonate-User", "system:serviceaccount:ns:bot"),
            ("Impersonate-Extra-Scopes%2Fv1", "a"),
            ("Impersonate-Group", "ops"),
        ]);
        assert_eq!(
            requests(&h).unwrap(),
            vec![
                Request::ServiceAccount {
                    namespace: "ns".into(),
                    name: "bot".into()
                },
                Request::Group("devs".into()),
                Request::Group("ops".into()),
                Request::Extra {
                    key: "scopes/v1".into(),
                    value: "a".into()
                },
                Request::Uid("u-1".into()),
            ]
        );
        assert!(requests(&headers(&[])).unwrap().is_empty());
        assert_eq!(
            requests(&headers(&[("Impersonate-Group", "system:masters")]))
                .unwrap_err()
                .code,
            500
        );
    }

    #[test]
    fn each_request_is_an_impersonate_check() {
        let a = Request::ServiceAccount {
            namespace: "ns".into(),
            name: "bot".into(),
        }
        .attributes();
        assert_eq!(
            a.describe(),
            r#"impersonate resource "serviceaccounts" in API group "" in the namespace "ns""#
        );
        let a = Request::Extra {
            key: "scopes".into(),
            value: "x".into(),
        }
        .attributes();
        assert_eq!(
            a.describe(),
            r#"impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope"#
        );
    }
}
