//! Service account tokens for projected volumes: the TokenRequest the node makes for a pod
//! (bound to the pod, so the token dies with it) and when a token is renewed (the kubelet's
//! rule: once 80% of its life has passed, or when it is 24 hours old).

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccountTokenProjection};
use std::time::{Duration, SystemTime};

/// The projection's default life (the API's default for `expirationSeconds`).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The longest a token is kept before it is renewed, whatever its expiry.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A token the API issued, and when it stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    pub expires: SystemTime,
}

/// The pod's service account (`default` when the spec names none).
pub fn service_account(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

/// The TokenRequest for one projection of `pod`: its audience (none: the API server's own),
/// its life, bound to the pod by name and uid.
pub fn request(pod: &Pod, projection: &ServiceAccountTokenProjection) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: projection
                .audience
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            expiration_seconds: Some(
                projection
                    .expiration_seconds
                    .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
            ),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    }
}

/// When a token issued at `issued` and valid until `expires` is renewed: after 80% of its
/// life, and no later than 24 hours after it was issued.
pub fn refresh_at(issued: SystemTime, expires: SystemTime) -> SystemTime {
    let life = expires.duration_since(issued).unwrap_or_default();
    issued + (life.mul_f64(0.8)).min(MAX_AGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn renewed_at_eighty_percent_of_its_life() {
        assert_eq!(refresh_at(T0, T0 + secs(600)), T0 + secs(480));
        assert_eq!(
            refresh_at(T0, T0 + secs(3607)),
            T0 + secs(3607).mul_f64(0.8)
        );
    }

    #[test]
    fn long_lived_tokens_are_renewed_daily() {
        assert_eq!(
            refresh_at(T0, T0 + secs(7 * 24 * 3600)),
            T0 + secs(24 * 3600)
        );
    }

    #[test]
    fn an_expired_token_is_renewed_at_once() {
        assert_eq!(refresh_at(T0 + secs(10), T0), T0 + secs(10));
    }

    #[test]
    fn the_request_binds_the_pod() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = request(
            &pod,
            &ServiceAccountTokenProjection {
                path: "token".into(),
                expiration_seconds: Some(600),
                audience: Some("vault".into()),
            },
        );
        assert_eq!(r.spec.audiences, vec!["vault".to_string()]);
        assert_eq!(r.spec.expiration_seconds, Some(600));
        let bound = r.spec.bound_object_ref.unwrap();
        assert_eq!(
            (
                bound.kind.as_deref(),
                bound.name.as_deref(),
                bound.uid.as_deref()
            ),
            (Some("Pod"), Some("p"), Some("u-1"))
        );
        let defaulted = request(
            &pod,
            &ServiceAccountTokenProjection {
                path: "token".into(),
                ..Default::default()
            },
        );
        assert!(defaulted.spec.audiences.is_empty());
        assert_eq!(defaulted.spec.expiration_seconds, Some(3600));
        assert_eq!(service_account(&pod), "default");
    }
}
