//! The request authenticator: Kubernetes' union of authenticators, in its order. A client
//! certificate the cluster CA issued (checked once per connection, its expiry per request),
//! then a bearer token: the static token file, a bootstrap token, a service account token.
//! The first that accepts the credentials names the user; none: 401. There is no anonymous
//! user and no exception for any address: only the health and version paths skip this
//! (`http.rs`).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap};

use super::bootstrap;
use super::serviceaccount::{self, ObjectLookup, ServiceAccountTokens};
use super::token_file::TokenFile;
use super::UserInfo;
use crate::apiserver::registry;
use crate::pki::PeerCertificate;
use crate::store::cache::Cache;

/// What a connection's TLS handshake proved about the client.
#[derive(Clone, Debug, Default)]
pub enum ClientCert {
    /// No certificate (or plain HTTP).
    #[default]
    None,
    /// A certificate the cluster CA issued, valid at the handshake.
    Verified(PeerCertificate),
    /// A certificate that is not (another CA's, expired, not for client auth): why.
    Rejected(String),
}

/// Why a request is not authenticated (always a 401; the reasons go to the log only, as
/// Kubernetes keeps them from the client).
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    #[error("no credentials")]
    NoCredentials,
    #[error("credentials rejected: {}", .0.join("; "))]
    Rejected(Vec<String>),
}

/// The authenticators of one API server.
pub struct Authenticator {
    token_file: TokenFile,
    service_accounts: Arc<ServiceAccountTokens>,
    cache: Arc<Cache>,
}

impl Authenticator {
    pub fn new(
        token_file: TokenFile,
        service_accounts: Arc<ServiceAccountTokens>,
        cache: Arc<Cache>,
    ) -> Authenticator {
        Authenticator {
            token_file,
            service_accounts,
            cache,
        }
    }

    /// The user a request's credentials name.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        cert: &ClientCert,
    ) -> Result<UserInfo, AuthnError> {
        let mut reasons = Vec::new();
        match cert {
            ClientCert::Verified(peer) if peer.expired() => {
                reasons.push("x509: the client certificate has expired".to_string())
            }
            ClientCert::Verified(peer) if peer.subject.common_name.is_empty() => {
                reasons.push("x509: the client certificate has no common name".to_string())
            }
            ClientCert::Verified(peer) => {
                let groups: Vec<&str> = peer
                    .subject
                    .organization
                    .iter()
                    .map(String::as_str)
                    .collect();
                return Ok(UserInfo::new(peer.subject.common_name.clone(), &groups));
            }
            ClientCert::Rejected(why) => reasons.push(format!("x509: {why}")),
            ClientCert::None => {}
        }
        match bearer(headers) {
            Some(token) => match self.authenticate_token(token, &[]) {
                Ok((user, _)) => return Ok(user),
                Err(why) => reasons.push(why),
            },
            None if reasons.is_empty() => return Err(AuthnError::NoCredentials),
            None => {}
        }
        Err(AuthnError::Rejected(reasons))
    }

    /// The user of a bearer token, and the audiences it was accepted for (TokenReview's
    /// answer; `audiences` empty: the API's own).
    pub fn authenticate_token(
        &self,
        token: &str,
        audiences: &[String],
    ) -> Result<(UserInfo, Vec<String>), String> {
        let api = || self.service_accounts.api_audiences().to_vec();
        if let Some(user) = self.token_file.authenticate(token) {
            return accepted_for_api(user.clone(), audiences, api());
        }
        if let Some((id, secret)) = bootstrap::parse(token) {
            let obj = self
                .lookup(
                    "",
                    "secrets",
                    Some(bootstrap::NAMESPACE),
                    &bootstrap::secret_name(id),
                )
                .and_then(|b| serde_json::from_slice(&b).ok());
            let user = bootstrap::authenticate(id, secret, obj.as_ref())
                .map_err(|e| format!("bootstrap token: {e}"))?;
            return accepted_for_api(user, audiences, api());
        }
        let (claims, matched) = self
            .service_accounts
            .verify(token, audiences)
            .map_err(|e| format!("service account token: {e}"))?;
        serviceaccount::check_bound(&claims, self)
            .map_err(|e| format!("service account token: {e}"))?;
        Ok((claims.user(), matched))
    }

    pub fn service_accounts(&self) -> &Arc<ServiceAccountTokens> {
        &self.service_accounts
    }
}

/// Tokens that carry no audience (static and bootstrap tokens) are for the API only:
/// accepted when the request asks for the API's audiences (Kubernetes' rule).
fn accepted_for_api(
    user: UserInfo,
    wanted: &[String],
    api: Vec<String>,
) -> Result<(UserInfo, Vec<String>), String> {
    if wanted.is_empty() {
        return Ok((user, api));
    }
    let matched: Vec<String> = wanted.iter().filter(|a| api.contains(a)).cloned().collect();
    if matched.is_empty() {
        return Err(format!("token audiences {api:?} do not include {wanted:?}"));
    }
    Ok((user, matched))
}

impl ObjectLookup for Authenticator {
    fn lookup(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Bytes> {
        let r = registry::RESOURCES
            .iter()
            .find(|r| r.group == group && r.plural == plural && r.cached())?;
        let rc = self.cache.resource(&r.prefix()).ok()?;
        // A value the store holds but cannot decode proves nothing: the token is refused.
        rc.get(&r.key(namespace, name))
            .ok()
            .flatten()
            .map(|o| o.json.clone())
    }
}

/// The bearer token of a request (`Authorization: Bearer <token>`, the scheme in any case).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
