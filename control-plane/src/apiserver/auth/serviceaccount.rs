//! ServiceAccount tokens: bound JWTs as Kubernetes issues them through TokenRequest
//! (`serviceaccounts/<name>/token`), signed ES256 with a key kept in the data directory
//! (`pki/sa.key`), with an issuer, audiences, an expiry and the objects they are bound to
//! (the service account, and a pod or secret or node). No legacy (secret-based, unbound)
//! tokens. A token is valid while its signature, issuer, audience and times hold and every
//! object it names still exists with the same uid (looked up by key in the watch cache:
//! O(1) per request).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::UserInfo;
use crate::pki::files::{read_optional, write_private};
use crate::pki::PkiError;

/// Kubernetes' default issuer, also the default API audience.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// TokenRequest's default lifetime (`expirationSeconds` unset).
pub const DEFAULT_EXPIRATION: Duration = Duration::from_secs(3600);
/// The shortest lifetime a TokenRequest may ask for (Kubernetes' validation).
pub const MIN_EXPIRATION: Duration = Duration::from_secs(600);
/// How long after a bound object's deletion started its tokens stay valid (Kubernetes
/// lets a terminating pod's containers keep calling the API for a minute).
const DELETION_GRACE: Duration = Duration::from_secs(60);

/// The group of every service account, and the per-namespace group prefix.
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// `name`/`uid` of an object a token is bound to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` claims of a bound token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
}

/// A token's claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: u64,
    pub iat: u64,
    pub nbf: u64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

impl Claims {
    /// The user the token stands for, with the extras Kubernetes sets.
    pub fn user(&self) -> UserInfo {
        let k = &self.kubernetes;
        let ns_group = format!("{SERVICE_ACCOUNTS_GROUP}:{}", k.namespace);
        let mut user = UserInfo::new(
            service_account_user(&k.namespace, &k.serviceaccount.name),
            &[SERVICE_ACCOUNTS_GROUP, &ns_group],
        );
        user.uid = k.serviceaccount.uid.clone();
        let mut extra = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            extra.insert(
                format!("authentication.kubernetes.io/{k}"),
                vec![v.to_string()],
            );
        };
        if let Some(p) = &k.pod {
            put("pod-name", &p.name);
            put("pod-uid", &p.uid);
        }
        if let Some(n) = &k.node {
            put("node-name", &n.name);
            put("node-uid", &n.uid);
        }
        put("credential-id", &format!("JTI={}", self.jti));
        user.extra = extra;
        user
    }
}

/// `system:serviceaccount:<namespace>:<name>`
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// What a token is bound to besides its service account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundObject {
    /// A pod, and the node it is bound to (if scheduled): the token dies with the pod.
    Pod {
        pod: ObjectRef,
        node: Option<ObjectRef>,
    },
    Secret(ObjectRef),
    Node(ObjectRef),
}

/// A token to issue.
#[derive(Clone, Debug)]
pub struct TokenSpec {
    pub namespace: String,
    pub service_account: ObjectRef,
    pub bound: Option<BoundObject>,
    /// Empty: the API audiences.
    pub audiences: Vec<String>,
    pub expiration: Duration,
}

/// An issued token and when it expires.
#[derive(Clone, Debug)]
pub struct IssuedToken {
    pub token: String,
    pub expires: SystemTime,
}

/// Why a token is not a valid service account token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("not a service account token: {0}")]
    Malformed(String),
    #[error("token signature or claims are invalid: {0}")]
    Invalid(String),
    #[error("token audiences {token:?} do not include {wanted:?}")]
    Audience {
        token: Vec<String>,
        wanted: Vec<String>,
    },
    #[error("{0}")]
    Bound(String),
}

/// Issues and verifies service account tokens with one ES256 key.
pub struct ServiceAccountTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    key_id: String,
    issuer: String,
    audiences: Vec<String>,
    max_expiration: Option<Duration>,
    validation: Validation,
}

impl std::fmt::Debug for ServiceAccountTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountTokens")
            .field("key_id", &self.key_id)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountTokens {
    /// The signing key in `dir/sa.key` (created on first start, 0600); tokens for `issuer`,
    /// accepted by the API for `audiences` (empty: the issuer).
    pub fn load_or_create(
        dir: &Path,
        issuer: &str,
        audiences: Vec<String>,
        max_expiration: Option<Duration>,
    ) -> Result<ServiceAccountTokens, PkiError> {
        let path = dir.join("sa.key");
        let pem = match read_optional(&path)? {
            Some(pem) => pem,
            None => {
                let key = rcgen::KeyPair::generate()
                    .map_err(PkiError::cert("generating the service account key"))?;
                let pem = key.serialize_pem();
                write_private(&path, pem.as_bytes())
                    .map_err(PkiError::io(format!("writing {}", path.display())))?;
                pem
            }
        };
        ServiceAccountTokens::from_pem(&pem, issuer, audiences, max_expiration)
    }

    /// From a PKCS#8 PEM P-256 key.
    pub fn from_pem(
        pem: &str,
        issuer: &str,
        audiences: Vec<String>,
        max_expiration: Option<Duration>,
    ) -> Result<ServiceAccountTokens, PkiError> {
        let key =
            rcgen::KeyPair::from_pem(pem).map_err(PkiError::cert("the service account key"))?;
        let bad = |e: jsonwebtoken::errors::Error| {
            PkiError::Invalid(format!("the service account key: {e}"))
        };
        let encoding = EncodingKey::from_ec_pem(pem.as_bytes()).map_err(bad)?;
        let decoding = DecodingKey::from_ec_pem(key.public_key_pem().as_bytes()).map_err(bad)?;
        // Kubernetes' key id: the unpadded base64url SHA-256 of the public key (SPKI DER).
        use sha2::Digest;
        let key_id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(
            rcgen::PublicKeyData::subject_public_key_info(&key),
        ));
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[issuer]);
        validation.validate_nbf = true;
        validation.leeway = 0;
        // Audiences are checked by `verify`, which reports the ones that matched.
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iss", "sub", "nbf"]);
        let audiences = if audiences.is_empty() {
            vec![issuer.to_string()]
        } else {
            audiences
        };
        Ok(ServiceAccountTokens {
            encoding,
            decoding,
            key_id,
            issuer: issuer.to_string(),
            audiences,
            max_expiration,
            validation,
        })
    }

    /// The audiences the API itself accepts.
    pub fn api_audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The longest lifetime a request may be given (`--service-account-max-token-expiration`).
    pub fn max_expiration(&self) -> Option<Duration> {
        self.max_expiration
    }

    /// Signs a token for `spec`.
    pub fn issue(&self, spec: &TokenSpec) -> Result<IssuedToken, TokenError> {
        let now = SystemTime::now();
        let expires = now + spec.expiration;
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let (pod, secret, node) = match &spec.bound {
            None => (None, None, None),
            Some(BoundObject::Pod { pod, node }) => (Some(pod.clone()), None, node.clone()),
            Some(BoundObject::Secret(s)) => (None, Some(s.clone()), None),
            Some(BoundObject::Node(n)) => (None, None, Some(n.clone())),
        };
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: service_account_user(&spec.namespace, &spec.service_account.name),
            aud: if spec.audiences.is_empty() {
                self.audiences.clone()
            } else {
                spec.audiences.clone()
            },
            exp: secs(expires),
            iat: secs(now),
            nbf: secs(now),
            jti: crate::apiserver::meta::new_uid(),
            kubernetes: KubernetesClaims {
                namespace: spec.namespace.clone(),
                serviceaccount: spec.service_account.clone(),
                pod,
                secret,
                node,
            },
        };
        let header = Header {
            kid: Some(self.key_id.clone()),
            ..Header::new(Algorithm::ES256)
        };
        let token = jsonwebtoken::encode(&header, &claims, &self.encoding)
            .map_err(|e| TokenError::Invalid(format!("signing: {e}")))?;
        Ok(IssuedToken { token, expires })
    }

    /// The claims of `token` if its signature, issuer and times are valid and its audiences
    /// include one of `audiences` (empty: the API audiences); with the audiences that matched.
    /// Whether its objects still exist is [`check_bound`]'s.
    pub fn verify(
        &self,
        token: &str,
        audiences: &[String],
    ) -> Result<(Claims, Vec<String>), TokenError> {
        if token.split('.').count() != 3 {
            return Err(TokenError::Malformed("not a JWT".into()));
        }
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if header.alg != Algorithm::ES256 {
            return Err(TokenError::Malformed(format!(
                "algorithm {:?} is not this issuer's",
                header.alg
            )));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
        let wanted = if audiences.is_empty() {
            &self.audiences[..]
        } else {
            audiences
        };
        let matched: Vec<String> = wanted
            .iter()
            .filter(|a| data.claims.aud.contains(a))
            .cloned()
            .collect();
        if matched.is_empty() {
            return Err(TokenError::Audience {
                token: data.claims.aud,
                wanted: wanted.to_vec(),
            });
        }
        Ok((data.claims, matched))
    }
}

/// The uid and deletion time of a stored object (all a binding check reads of it).
#[derive(Deserialize)]
struct Meta {
    metadata: MetaFields,
}

#[derive(Deserialize)]
struct MetaFields {
    #[serde(default)]
    uid: String,
    #[serde(rename = "deletionTimestamp", default)]
    deletion_timestamp: Option<String>,
}

/// Where to find a token's objects: the uid and deletion time of the object stored at a key
/// (None: no such object). The API server answers from its watch cache.
pub trait ObjectLookup {
    fn lookup(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<bytes::Bytes>;
}

/// Checks that every object the token is bound to exists with the uid it names and is not
/// being deleted for longer than a grace period.
pub fn check_bound(claims: &Claims, objects: &dyn ObjectLookup) -> Result<(), TokenError> {
    let k = &claims.kubernetes;
    let ns = Some(k.namespace.as_str());
    let mut bound: Vec<(&str, &str, Option<&str>, &ObjectRef)> =
        vec![("", "serviceaccounts", ns, &k.serviceaccount)];
    if let Some(p) = &k.pod {
        bound.push(("", "pods", ns, p));
    }
    if let Some(s) = &k.secret {
        bound.push(("", "secrets", ns, s));
    }
    if k.pod.is_none() {
        // A node a pod-bound token names is informational (the pod binds it); a token bound
        // to the node itself dies with it.
        if let Some(n) = &k.node {
            bound.push(("", "nodes", None, n));
        }
    }
    for (group, plural, namespace, want) in bound {
        let what = plural.trim_end_matches('s');
        let gone = || {
            TokenError::Bound(format!(
                "{what} \"{}\" bound to the token no longer exists",
                want.name
            ))
        };
        let raw = objects
            .lookup(group, plural, namespace, &want.name)
            .ok_or_else(gone)?;
        let meta: Meta = serde_json::from_slice(&raw)
            .map_err(|e| TokenError::Bound(format!("reading the {what}: {e}")))?;
        if meta.metadata.uid != want.uid {
            return Err(TokenError::Bound(format!(
                "the {what} \"{}\" bound to the token has uid {}, not {}",
                want.name, meta.metadata.uid, want.uid
            )));
        }
        if let Some(ts) = meta.metadata.deletion_timestamp {
            let since = ts
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
                .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t))
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default();
            if since > DELETION_GRACE {
                return Err(TokenError::Bound(format!(
                    "the {what} \"{}\" bound to the token is being deleted",
                    want.name
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Objects(HashMap<(String, String), Vec<u8>>);

    impl ObjectLookup for Objects {
        fn lookup(
            &self,
            _: &str,
            plural: &str,
            _: Option<&str>,
            name: &str,
        ) -> Option<bytes::Bytes> {
            self.0
                .get(&(plural.to_string(), name.to_string()))
                .map(|v| bytes::Bytes::from(v.clone()))
        }
    }

    fn issuer() -> ServiceAccountTokens {
        let key = rcgen::KeyPair::generate().unwrap();
        ServiceAccountTokens::from_pem(&key.serialize_pem(), DEFAULT_ISSUER, vec![], None).unwrap()
    }

    fn spec() -> TokenSpec {
        TokenSpec {
            namespace: "default".into(),
            service_account: ObjectRef {
                name: "builder".into(),
                uid: "sa-uid".into(),
            },
            bound: Some(BoundObject::Pod {
                pod: ObjectRef {
                    name: "web".into(),
                    uid: "pod-uid".into(),
                },
                node: Some(ObjectRef {
                    name: "n1".into(),
                    uid: "node-uid".into(),
                }),
            }),
            audiences: vec![],
            expiration: DEFAULT_EXPIRATION,
        }
    }

    #[test]
    fn a_token_round_trips_into_its_user() {
        let t = issuer();
        let issued = t.issue(&spec()).unwrap();
        let (claims, aud) = t.verify(&issued.token, &[]).unwrap();
        assert_eq!(aud, [DEFAULT_ISSUER]);
        let user = claims.user();
        assert_eq!(user.name, "system:serviceaccount:default:builder");
        assert_eq!(user.uid, "sa-uid");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ]
        );
        assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], ["web"]);
        assert_eq!(user.extra["authentication.kubernetes.io/node-name"], ["n1"]);
    }

    #[test]
    fn audiences_other_issuers_and_tampering_are_refused() {
        let t = issuer();
        let mut s = spec();
        s.audiences = vec!["vault".into()];
        let token = t.issue(&s).unwrap().token;
        assert!(matches!(
            t.verify(&token, &[]),
            Err(TokenError::Audience { .. })
        ));
        assert_eq!(t.verify(&token, &["vault".into()]).unwrap().1, ["vault"]);

        let other = issuer();
        let foreign = other.issue(&spec()).unwrap().token;
        assert!(matches!(
            t.verify(&foreign, &[]),
            Err(TokenError::Invalid(_))
        ));
        let mut parts: Vec<String> = t
            .issue(&spec())
            .unwrap()
            .token
            .split('.')
            .map(str::to_string)
            .collect();
        parts[1] = parts[1].chars().rev().collect();
        assert!(t.verify(&parts.join("."), &[]).is_err());
        assert!(matches!(
            t.verify("abc", &[]),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn tokens_die_with_their_objects() {
        let t = issuer();
        let (claims, _) = t.verify(&t.issue(&spec()).unwrap().token, &[]).unwrap();
        let obj =
            |uid: &str| serde_json::to_vec(&serde_json::json!({"metadata": {"uid": uid}})).unwrap();
        let mut objects = Objects(HashMap::from([
            (("serviceaccounts".into(), "builder".into()), obj("sa-uid")),
            (("pods".into(), "web".into()), obj("pod-uid")),
        ]));
        check_bound(&claims, &objects).unwrap();
        objects
            .0
            .insert(("pods".into(), "web".into()), obj("another-uid"));
        assert!(check_bound(&claims, &objects).is_err(), "pod replaced");
        objects.0.remove(&("pods".to_string(), "web".to_string()));
        assert!(check_bound(&claims, &objects).is_err(), "pod gone");
        objects.0.insert(
            ("pods".into(), "web".into()),
            serde_json::to_vec(&serde_json::json!({"metadata": {
                "uid": "pod-uid", "deletionTimestamp": "2020-01-01T00:00:00Z"}}))
            .unwrap(),
        );
        assert!(check_bound(&claims, &objects).is_err(), "long deleting");
        objects
            .0
            .insert(("pods".into(), "web".into()), obj("pod-uid"));
        objects
            .0
            .remove(&("serviceaccounts".to_string(), "builder".to_string()));
        assert!(check_bound(&claims, &objects).is_err(), "account gone");
    }
}
