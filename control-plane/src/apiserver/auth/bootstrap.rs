//! Bootstrap tokens (`<id>.<secret>`, 6 and 16 characters of [a-z0-9]) as Kubernetes has
//! them: a Secret `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`
//! holds `token-id`, `token-secret`, `expiration` (RFC 3339), `usage-bootstrap-authentication`
//! and `auth-extra-groups`. The token authenticates as `system:bootstrap:<id>` in
//! `system:bootstrappers` (plus its extra groups); a node agent joins with one and then
//! asks for its own certificate. Looked up by key (O(1)); an expired or deleted token is
//! refused at once.

use base64::Engine;
use serde_json::Value;

use super::UserInfo;

/// The namespace of bootstrap token Secrets.
pub const NAMESPACE: &str = "kube-system";
/// The Secret name prefix.
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// The Secret type.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group of every bootstrap token's user.
pub const GROUP: &str = "system:bootstrappers";
/// The group a node agent joining with a bootstrap token is in (kubeadm's default extra
/// group); its node client CSRs are approved automatically.
pub const NODE_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// A token's id and secret, if `token` has the bootstrap shape.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// The Secret name of token `id`.
pub fn secret_name(id: &str) -> String {
    format!("{SECRET_PREFIX}{id}")
}

/// A new random token `<id>.<secret>`.
pub fn generate() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let pick = |n: usize| -> String {
        (0..n)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect()
    };
    format!("{}.{}", pick(6), pick(16))
}

/// Why a bootstrap token is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("no bootstrap token with id {0}")]
    Unknown(String),
    #[error("bootstrap token {0} is invalid")]
    Invalid(String),
    #[error("bootstrap token {0} has expired")]
    Expired(String),
}

/// The user of the bootstrap token (`id`, `secret`) whose Secret is `secret_obj`
/// (None: no such Secret).
pub fn authenticate(
    id: &str,
    secret: &str,
    secret_obj: Option<&Value>,
) -> Result<UserInfo, BootstrapError> {
    let obj = secret_obj.ok_or_else(|| BootstrapError::Unknown(id.to_string()))?;
    let invalid = || BootstrapError::Invalid(id.to_string());
    if obj["type"] != SECRET_TYPE || obj.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(invalid());
    }
    let data = |key: &str| -> Option<String> {
        let b64 = obj.pointer(&format!("/data/{key}"))?.as_str()?;
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        String::from_utf8(raw).ok()
    };
    if data("token-id").as_deref() != Some(id) {
        return Err(invalid());
    }
    let stored = data("token-secret").unwrap_or_default();
    if !constant_time_eq(stored.as_bytes(), secret.as_bytes()) {
        return Err(invalid());
    }
    if data("usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err(invalid());
    }
    if let Some(exp) = data("expiration") {
        let at: k8s_openapi::jiff::Timestamp = exp.trim().parse().map_err(|_| invalid())?;
        if at <= k8s_openapi::jiff::Timestamp::now() {
            return Err(BootstrapError::Expired(id.to_string()));
        }
    }
    let extra = data("auth-extra-groups").unwrap_or_default();
    let mut groups = vec![GROUP];
    for g in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
        // Kubernetes only lets a bootstrap token add groups of its own kind.
        if !g.starts_with("system:bootstrappers:") {
            return Err(invalid());
        }
        groups.push(g);
    }
    Ok(UserInfo::new(format!("system:bootstrap:{id}"), &groups))
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The Secret for a new token (`kubeadm token create`'s), valid until `expiration` (RFC 3339),
/// in `extra_groups`.
pub fn secret(token: &str, expiration: Option<&str>, extra_groups: &[&str]) -> Option<Value> {
    let (id, secret) = parse(token)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut data = serde_json::json!({
        "token-id": b64(id),
        "token-secret": b64(secret),
        "usage-bootstrap-authentication": b64("true"),
        "usage-bootstrap-signing": b64("true"),
    });
    if let Some(e) = expiration {
        data["expiration"] = b64(e).into();
    }
    if !extra_groups.is_empty() {
        data["auth-extra-groups"] = b64(&extra_groups.join(",")).into();
    }
    Some(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name(id), "namespace": NAMESPACE},
        "type": SECRET_TYPE,
        "data": data,
    }))
}

/// Makes a new token valid for `ttl` (None: forever) in `extra_groups` through the API
/// (`control-plane token create`, kubeadm's `token create`); returns `<id>.<secret>`.
pub async fn create(
    client: &kube::Client,
    ttl: Option<std::time::Duration>,
    extra_groups: &[&str],
) -> Result<String, CreateError> {
    use k8s_openapi::api::core::v1::Secret;
    let token = generate();
    let expiration = match ttl {
        None => None,
        Some(ttl) => {
            let ttl = k8s_openapi::jiff::SignedDuration::try_from(ttl)
                .map_err(|e| CreateError::Ttl(e.to_string()))?;
            let at = k8s_openapi::jiff::Timestamp::now()
                .checked_add(ttl)
                .map_err(|e| CreateError::Ttl(e.to_string()))?;
            Some(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        }
    };
    let obj = secret(&token, expiration.as_deref(), extra_groups)
        .ok_or_else(|| CreateError::Ttl("a generated token has the bootstrap shape".into()))?;
    let obj: Secret = serde_json::from_value(obj).map_err(|e| CreateError::Ttl(e.to_string()))?;
    kube::Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&kube::api::PostParams::default(), &obj)
        .await?;
    Ok(token)
}

/// Why a token could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("the token's lifetime: {0}")]
    Ttl(String),
    #[error("creating the bootstrap token Secret: {0}")]
    Api(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_bootstrap_shape() {
        let t = generate();
        let (id, secret) = parse(&t).unwrap();
        assert_eq!((id.len(), secret.len()), (6, 16));
        assert!(parse("abcdef.0123456789abcdef").is_some());
        assert!(parse("ABCDEF.0123456789abcdef").is_none());
        assert!(parse("abcdef0123456789abcdef").is_none());
        assert!(parse("abcde.0123456789abcdef").is_none());
    }

    #[test]
    fn a_valid_secret_authenticates_and_others_do_not() {
        let token = "abcdef.0123456789abcdef";
        let future = "2999-01-01T00:00:00Z";
        let s = secret(token, Some(future), &[NODE_GROUP]).unwrap();
        let user = authenticate("abcdef", "0123456789abcdef", Some(&s)).unwrap();
        assert_eq!(user.name, "system:bootstrap:abcdef");
        assert_eq!(user.groups, [GROUP, NODE_GROUP, "system:authenticated"]);
        assert_eq!(
            authenticate("abcdef", "0123456789abcdeX", Some(&s)),
            Err(BootstrapError::Invalid("abcdef".into()))
        );
        assert_eq!(
            authenticate("abcdef", "0123456789abcdef", None),
            Err(BootstrapError::Unknown("abcdef".into()))
        );
        let old = secret(token, Some("2000-01-01T00:00:00Z"), &[]).unwrap();
        assert_eq!(
            authenticate("abcdef", "0123456789abcdef", Some(&old)),
            Err(BootstrapError::Expired("abcdef".into()))
        );
        let mut wrong_group = s.clone();
        wrong_group["data"]["auth-extra-groups"] = base64::engine::general_purpose::STANDARD
            .encode("system:masters")
            .into();
        assert!(authenticate("abcdef", "0123456789abcdef", Some(&wrong_group)).is_err());
        let mut no_auth = s;
        no_auth["data"]
            .as_object_mut()
            .unwrap()
            .remove("usage-bootstrap-authentication");
        assert!(authenticate("abcdef", "0123456789abcdef", Some(&no_auth)).is_err());
    }
}
