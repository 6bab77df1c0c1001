//! The webhooks of the stored MutatingWebhookConfigurations and
//! ValidatingWebhookConfigurations, parsed once per change of those objects: which requests
//! each one wants (rules, selectors, match policy), where it is (a URL, or a Service in the
//! cluster), how it is trusted (its caBundle), and what happens when it cannot be called.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::machinery::{ApiError, LabelSelector};

/// Mutating or validating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mutating,
    Validating,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Mutating => "mutatingwebhookconfigurations",
            Kind::Validating => "validatingwebhookconfigurations",
        }
    }
}

/// What happens when the webhook cannot be called or answers nonsense.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchPolicy {
    /// Only the group/version/resource named in a rule.
    Exact,
    /// Also the same resource served at another version.
    Equivalent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideEffects {
    None,
    NoneOnDryRun,
    /// v1beta1's Unknown and Some: not called on a dry run (the request fails instead).
    Some,
}

/// Where a webhook is called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `https://host:port/path`
    Url {
        url: String,
        host: String,
        port: u16,
        path: String,
    },
    /// A Service: dialled at one of its ready endpoints, verified as `<name>.<ns>.svc`.
    Service {
        namespace: String,
        name: String,
        port: u16,
        path: String,
    },
}

impl Target {
    /// The name the serving certificate must carry.
    pub fn server_name(&self) -> String {
        match self {
            Target::Url { host, .. } => host.clone(),
            Target::Service {
                namespace, name, ..
            } => format!("{name}.{namespace}.svc"),
        }
    }

    /// The URL as Kubernetes prints it in errors.
    pub fn display_url(&self, timeout: Duration) -> String {
        let (base, path) = match self {
            Target::Url {
                host, port, path, ..
            } => (format!("https://{host}:{port}"), path),
            Target::Service {
                namespace,
                name,
                port,
                path,
            } => (format!("https://{name}.{namespace}.svc:{port}"), path),
        };
        format!("{base}{path}?timeout={}s", timeout.as_secs())
    }

    pub fn path(&self) -> &str {
        match self {
            Target::Url { path, .. } | Target::Service { path, .. } => path,
        }
    }
}

/// One webhook of one configuration.
pub struct Hook {
    /// `<configuration>/<index>`: stable while the configuration is unchanged.
    pub id: String,
    pub name: String,
    pub rules: Vec<RuleWithOperations>,
    pub failure_policy: FailurePolicy,
    pub match_policy: MatchPolicy,
    pub namespace_selector: LabelSelector,
    pub object_selector: LabelSelector,
    pub side_effects: SideEffects,
    pub timeout: Duration,
    /// Mutating only: called again when a later webhook changed the object.
    pub reinvoke_if_needed: bool,
    pub target: Target,
    /// Verifies the webhook's serving certificate (its caBundle, else the system's roots).
    pub tls: Result<Arc<rustls::ClientConfig>, String>,
}

fn selector(s: Option<&metav1::LabelSelector>) -> Result<LabelSelector, ApiError> {
    match s {
        None => Ok(LabelSelector::everything()),
        Some(s) => LabelSelector::from_meta(s),
    }
}

/// `https://host[:port][/path]` (validation refused anything else).
fn parse_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, String::new()),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (h, p.parse().ok()?),
        _ => (authority, 443),
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Some((host, port, path))
}

fn target(c: &WebhookClientConfig) -> Result<Target, String> {
    match (&c.url, &c.service) {
        (Some(url), None) => {
            let (host, port, path) =
                parse_url(url).ok_or_else(|| format!("invalid webhook URL {url:?}"))?;
            Ok(Target::Url {
                url: url.clone(),
                host,
                port,
                path,
            })
        }
        (None, Some(s)) => Ok(Target::Service {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            port: s.port.and_then(|p| u16::try_from(p).ok()).unwrap_or(443),
            path: s.path.clone().unwrap_or_default(),
        }),
        _ => Err("exactly one of url or service is required".into()),
    }
}

/// The TLS client configuration for a webhook: its caBundle's certificates, or the
/// system's roots without one.
fn tls(c: &WebhookClientConfig) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match c.ca_bundle.as_ref().filter(|b| !b.0.is_empty()) {
        Some(bundle) => {
            for cert in CertificateDer::pem_slice_iter(&bundle.0) {
                let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
                roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
            }
            if roots.is_empty() {
                return Err("caBundle holds no certificate".into());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The fields both kinds of webhook share.
struct Common<'a> {
    name: &'a str,
    rules: Option<&'a Vec<RuleWithOperations>>,
    failure_policy: Option<&'a str>,
    match_policy: Option<&'a str>,
    namespace_selector: Option<&'a metav1::LabelSelector>,
    object_selector: Option<&'a metav1::LabelSelector>,
    side_effects: &'a str,
    timeout_seconds: Option<i32>,
    client_config: &'a WebhookClientConfig,
}

fn hook(config: &str, index: usize, c: Common<'_>, reinvoke_if_needed: bool) -> Option<Hook> {
    let target = match target(c.client_config) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(configuration = config, webhook = c.name, error = %e, "webhook skipped");
            return None;
        }
    };
    // Selectors were validated on write; one that does not parse now matches nothing.
    let sel = |s| selector(s).unwrap_or_else(|_| LabelSelector::nothing());
    Some(Hook {
        id: format!("{config}/{index}"),
        name: c.name.to_string(),
        rules: c.rules.cloned().unwrap_or_default(),
        failure_policy: match c.failure_policy {
            Some("Ignore") => FailurePolicy::Ignore,
            _ => FailurePolicy::Fail,
        },
        match_policy: match c.match_policy {
            Some("Exact") => MatchPolicy::Exact,
            _ => MatchPolicy::Equivalent,
        },
        namespace_selector: sel(c.namespace_selector),
        object_selector: sel(c.object_selector),
        side_effects: match c.side_effects {
            "None" => SideEffects::None,
            "NoneOnDryRun" => SideEffects::NoneOnDryRun,
            _ => SideEffects::Some,
        },
        timeout: Duration::from_secs(c.timeout_seconds.unwrap_or(10).clamp(1, 30) as u64),
        reinvoke_if_needed,
        tls: tls(c.client_config),
        target,
    })
}

/// The webhooks of the mutating configurations, sorted by configuration name (Kubernetes'
/// calling order), each configuration's in its order.
pub fn mutating(mut configs: Vec<MutatingWebhookConfiguration>) -> Vec<Hook> {
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for c in &configs {
        let config = c.metadata.name.clone().unwrap_or_default();
        for (i, w) in c.webhooks.iter().flatten().enumerate() {
            let w: &MutatingWebhook = w;
            let common = Common {
                name: &w.name,
                rules: w.rules.as_ref(),
                failure_policy: w.failure_policy.as_deref(),
                match_policy: w.match_policy.as_deref(),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds,
                client_config: &w.client_config,
            };
            let again = w.reinvocation_policy.as_deref() == Some("IfNeeded");
            out.extend(hook(&config, i, common, again));
        }
    }
    out
}

/// The webhooks of the validating configurations, in the same order.
pub fn validating(mut configs: Vec<ValidatingWebhookConfiguration>) -> Vec<Hook> {
    configs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for c in &configs {
        let config = c.metadata.name.clone().unwrap_or_default();
        for (i, w) in c.webhooks.iter().flatten().enumerate() {
            let w: &ValidatingWebhook = w;
            let common = Common {
                name: &w.name,
                rules: w.rules.as_ref(),
                failure_policy: w.failure_policy.as_deref(),
                match_policy: w.match_policy.as_deref(),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds,
                client_config: &w.client_config,
            };
            out.extend(hook(&config, i, common, false));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("https://hooks.example:8443/mutate"),
            Some(("hooks.example".into(), 8443, "/mutate".into()))
        );
        assert_eq!(
            parse_url("https://127.0.0.1"),
            Some(("127.0.0.1".into(), 443, "".into()))
        );
        assert_eq!(
            parse_url("https://[::1]:9443/x"),
            Some(("::1".into(), 9443, "/x".into()))
        );
        assert_eq!(parse_url("http://plain/x"), None);
    }

    #[test]
    fn ordering_and_defaults() {
        let cfg = |name: &str, hooks: serde_json::Value| -> MutatingWebhookConfiguration {
            serde_json::from_value(serde_json::json!({"metadata":{"name":name},"webhooks":hooks}))
                .unwrap()
        };
        let w = |n: &str| {
            serde_json::json!({"name":n,"sideEffects":"None","admissionReviewVersions":["v1"],
            "clientConfig":{"service":{"namespace":"ns","name":"svc","path":"/m"}}})
        };
        let hooks = mutating(vec![
            cfg("b", serde_json::json!([w("b1.x.io")])),
            cfg("a", serde_json::json!([w("a1.x.io"), w("a2.x.io")])),
        ]);
        let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a1.x.io", "a2.x.io", "b1.x.io"]);
        let h = &hooks[0];
        assert_eq!(h.failure_policy, FailurePolicy::Fail);
        assert_eq!(h.match_policy, MatchPolicy::Equivalent);
        assert_eq!(h.timeout, Duration::from_secs(10));
        assert_eq!(h.target.server_name(), "svc.ns.svc");
        assert_eq!(
            h.target.display_url(h.timeout),
            "https://svc.ns.svc:443/m?timeout=10s"
        );
    }
}
