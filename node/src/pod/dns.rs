//! The pod's resolv.conf as the kubelet builds it (CRI `PodSandboxConfig.dns_config`;
//! containerd writes it and mounts it at /etc/resolv.conf in every container):
//!
//! - `ClusterFirst` (the default): the cluster DNS servers, searches `<ns>.svc.<domain>
//!   svc.<domain> <domain>` then the host's, `ndots:5`; a hostNetwork pod gets the host's
//!   (as the kubelet), and so does every pod when no cluster DNS is configured.
//! - `ClusterFirstWithHostNet`: the cluster's, also for hostNetwork pods.
//! - `Default`: the host's resolv.conf (the agent's `--resolv-conf`).
//! - `None`: nothing but the pod's `dnsConfig`.
//!
//! The pod's `dnsConfig` is merged in (nameservers and searches appended without duplicates,
//! options replaced by name), then the kubelet's limits apply: at most 3 nameservers, 32
//! search domains and 2048 characters of search line (the last domains dropped), no search
//! domain longer than 253 characters.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use std::net::IpAddr;
use std::path::Path;

/// The kubelet's limits (k8s.io/kubernetes/pkg/apis/core/validation).
pub const MAX_NAMESERVERS: usize = 3;
pub const MAX_SEARCH_PATHS: usize = 32;
pub const MAX_SEARCH_LINE_CHARS: usize = 2048;
/// glibc aborts on a search domain longer than a DNS name.
const MAX_SEARCH_DOMAIN_CHARS: usize = 253;
/// The kubelet's default options for cluster DNS.
const CLUSTER_OPTIONS: &[&str] = &["ndots:5"];

/// What a resolv.conf says (the parts the kubelet reads: nameserver, search, options).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses resolv.conf text; unknown lines and comments are ignored, the last `search`
    /// line wins (as in glibc).
    pub fn parse(text: &str) -> ResolvConf {
        let mut out = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => out.nameservers.extend(words.next().map(str::to_string)),
                Some("search") => {
                    out.searches = words
                        .map(|w| w.trim_end_matches('.').to_string())
                        .filter(|w| !w.is_empty())
                        .collect()
                }
                Some("options") => out.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        out
    }

    /// The file at `path`; a missing file is an empty configuration (the kubelet's
    /// `--resolv-conf=""`).
    pub fn read(path: &Path) -> std::io::Result<ResolvConf> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(ResolvConf::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ResolvConf::default()),
            Err(e) => Err(e),
        }
    }
}

/// The node's DNS settings (`--cluster-dns`, `--cluster-domain`, `--resolv-conf`).
#[derive(Clone, Debug, Default)]
pub struct DnsSettings {
    /// The cluster DNS servers (empty: ClusterFirst pods get the host's configuration).
    pub cluster_dns: Vec<IpAddr>,
    /// `cluster.local`
    pub cluster_domain: String,
    /// The host's resolv.conf, read at start.
    pub host: ResolvConf,
}

/// A pod's `spec.dnsPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsPolicy {
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
    None,
}

impl DnsPolicy {
    /// The pod's policy; unset or unknown is ClusterFirst (the API server's default).
    pub fn of(pod: &Pod) -> DnsPolicy {
        match pod.spec.as_ref().and_then(|s| s.dns_policy.as_deref()) {
            Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
            Some("Default") => DnsPolicy::Default,
            Some("None") => DnsPolicy::None,
            _ => DnsPolicy::ClusterFirst,
        }
    }
}

/// Appends `more` to `list`, skipping what is already there.
fn append_unique(list: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for item in more {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

/// `name` or `name:value`, by name.
fn option_name(option: &str) -> &str {
    option.split_once(':').map_or(option, |(n, _)| n)
}

/// The kubelet's search limits: 32 domains, none longer than a DNS name, 2048 characters in
/// all (the last domains dropped until the line fits).
fn fit_searches(mut searches: Vec<String>) -> Vec<String> {
    searches.truncate(MAX_SEARCH_PATHS);
    searches.retain(|s| s.len() <= MAX_SEARCH_DOMAIN_CHARS);
    let line_len =
        |s: &[String]| s.iter().map(String::len).sum::<usize>() + s.len().saturating_sub(1);
    while line_len(&searches) > MAX_SEARCH_LINE_CHARS {
        searches.pop();
    }
    searches
}

/// The sandbox's DNS configuration for `pod` on a node with `settings`.
pub fn dns_config(pod: &Pod, settings: &DnsSettings) -> cri::DnsConfig {
    let host_network = super::spec::host_network(pod);
    let cluster = match DnsPolicy::of(pod) {
        DnsPolicy::ClusterFirstWithHostNet => true,
        DnsPolicy::ClusterFirst => !host_network,
        DnsPolicy::Default | DnsPolicy::None => false,
    };
    let mut config = match DnsPolicy::of(pod) {
        DnsPolicy::None => ResolvConf::default(),
        _ if cluster && !settings.cluster_dns.is_empty() => {
            let ns = pod
                .metadata
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or("default");
            let domain = settings.cluster_domain.trim_end_matches('.');
            let mut searches = Vec::new();
            if !domain.is_empty() {
                searches = vec![
                    format!("{ns}.svc.{domain}"),
                    format!("svc.{domain}"),
                    domain.to_string(),
                ];
            }
            append_unique(&mut searches, settings.host.searches.iter().cloned());
            ResolvConf {
                nameservers: settings.cluster_dns.iter().map(IpAddr::to_string).collect(),
                searches,
                options: CLUSTER_OPTIONS.iter().map(|s| s.to_string()).collect(),
            }
        }
        // Default, hostNetwork ClusterFirst, and ClusterFirst without a cluster DNS (the
        // kubelet's fallback).
        _ => settings.host.clone(),
    };
    if let Some(extra) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        append_unique(
            &mut config.nameservers,
            extra.nameservers.iter().flatten().cloned(),
        );
        append_unique(
            &mut config.searches,
            extra
                .searches
                .iter()
                .flatten()
                .map(|s| s.trim_end_matches('.').to_string()),
        );
        for opt in extra.options.iter().flatten() {
            let Some(name) = opt.name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let text = match opt.value.as_deref() {
                Some(v) if !v.is_empty() => format!("{name}:{v}"),
                _ => name.to_string(),
            };
            match config.options.iter_mut().find(|o| option_name(o) == name) {
                Some(existing) => *existing = text,
                None => config.options.push(text),
            }
        }
    }
    config.nameservers.truncate(MAX_NAMESERVERS);
    cri::DnsConfig {
        servers: config.nameservers,
        searches: fit_searches(config.searches),
        options: config.options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            host: ResolvConf::parse(
                "# host\nnameserver 192.168.1.1\nnameserver 192.168.1.2 ; two\nsearch lan. corp\noptions edns0\n",
            ),
        }
    }

    fn view(c: &cri::DnsConfig) -> (Vec<&str>, Vec<&str>, Vec<&str>) {
        (
            c.servers.iter().map(String::as_str).collect(),
            c.searches.iter().map(String::as_str).collect(),
            c.options.iter().map(String::as_str).collect(),
        )
    }

    const CONTAINERS: &str = r#"[{"name": "c", "image": "x"}]"#;

    fn spec(extra: serde_json::Value) -> serde_json::Value {
        let mut s =
            json!({"containers": serde_json::from_str::<serde_json::Value>(CONTAINERS).unwrap()});
        s.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        s
    }

    #[test]
    fn host_resolv_conf_is_parsed_as_the_kubelet_reads_it() {
        assert_eq!(
            settings().host,
            ResolvConf {
                nameservers: vec!["192.168.1.1".into(), "192.168.1.2".into()],
                searches: vec!["lan".into(), "corp".into()],
                options: vec!["edns0".into()],
            }
        );
    }

    #[test]
    fn cluster_first_uses_the_cluster_dns_and_the_namespace_search_path() {
        let c = dns_config(&pod(spec(json!({}))), &settings());
        assert_eq!(
            view(&c),
            (
                vec!["10.96.0.10"],
                vec![
                    "shop.svc.cluster.local",
                    "svc.cluster.local",
                    "cluster.local",
                    "lan",
                    "corp"
                ],
                vec!["ndots:5"]
            )
        );
        // hostNetwork: the host's, as the kubelet does for ClusterFirst.
        let host = dns_config(&pod(spec(json!({"hostNetwork": true}))), &settings());
        assert_eq!(
            view(&host),
            (
                vec!["192.168.1.1", "192.168.1.2"],
                vec!["lan", "corp"],
                vec!["edns0"]
            )
        );
        // No cluster DNS configured: the host's.
        let none = DnsSettings {
            cluster_dns: vec![],
            ..settings()
        };
        assert_eq!(
            dns_config(&pod(spec(json!({}))), &none),
            dns_config(&pod(spec(json!({"dnsPolicy": "Default"}))), &settings())
        );
    }

    #[test]
    fn cluster_first_with_host_net_and_default() {
        let c = dns_config(
            &pod(spec(
                json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
            )),
            &settings(),
        );
        assert_eq!(view(&c).0, ["10.96.0.10"]);
        assert_eq!(view(&c).2, ["ndots:5"]);
        let d = dns_config(&pod(spec(json!({"dnsPolicy": "Default"}))), &settings());
        assert_eq!(
            view(&d),
            (
                vec!["192.168.1.1", "192.168.1.2"],
                vec!["lan", "corp"],
                vec!["edns0"]
            )
        );
    }

    #[test]
    fn none_takes_only_the_pods_dns_config_and_options_merge_by_name() {
        let c = dns_config(
            &pod(spec(json!({"dnsPolicy": "None", "dnsConfig": {
                "nameservers": ["1.2.3.4", "1.2.3.4", "5.6.7.8"],
                "searches": ["a.example.", "b.example"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]
            }}))),
            &settings(),
        );
        assert_eq!(
            view(&c),
            (
                vec!["1.2.3.4", "5.6.7.8"],
                vec!["a.example", "b.example"],
                vec!["ndots:2", "edns0"]
            )
        );
        // Merged into ClusterFirst: ndots replaced, the rest appended.
        let m = dns_config(
            &pod(spec(json!({"dnsConfig": {
                "nameservers": ["9.9.9.9"],
                "searches": ["svc.cluster.local", "extra"],
                "options": [{"name": "ndots", "value": "1"}, {"name": "timeout", "value": "3"}]
            }}))),
            &settings(),
        );
        assert_eq!(
            view(&m),
            (
                vec!["10.96.0.10", "9.9.9.9"],
                vec![
                    "shop.svc.cluster.local",
                    "svc.cluster.local",
                    "cluster.local",
                    "lan",
                    "corp",
                    "extra"
                ],
                vec!["ndots:1", "timeout:3"]
            )
        );
    }

    #[test]
    fn the_kubelets_limits_apply() {
        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let servers: Vec<String> = (1..=5).map(|i| format!("10.0.0.{i}")).collect();
        let c = dns_config(
            &pod(spec(json!({"dnsPolicy": "None", "dnsConfig": {
                "nameservers": servers, "searches": many}}))),
            &settings(),
        );
        assert_eq!(c.servers, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(c.searches.len(), MAX_SEARCH_PATHS);
        assert_eq!(c.searches[31], "d31.example");
        // 2048 characters: 20 domains of 120 characters are 2419 with spaces; 16 fit.
        let long: Vec<String> = (0..20).map(long_name).collect();
        let c = dns_config(
            &pod(spec(
                json!({"dnsPolicy": "None", "dnsConfig": {"searches": long}}),
            )),
            &settings(),
        );
        assert_eq!(c.searches.len(), 16);
        assert!(c.searches.join(" ").len() <= MAX_SEARCH_LINE_CHARS);
        assert_eq!(c.searches[15], long_name(15));
        // A domain longer than a DNS name is dropped.
        let c = dns_config(
            &pod(spec(
                json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["ok", "y".repeat(254)]}}),
            )),
            &settings(),
        );
        assert_eq!(c.searches, ["ok"]);
    }

    fn long_name(i: usize) -> String {
        format!("{i:0>3}{}", "x".repeat(117))
    }
}
