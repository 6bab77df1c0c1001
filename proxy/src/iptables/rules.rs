//! kube-proxy's iptables layout, rendered as iptables-restore input: in nat, KUBE-SERVICES
//! jumps per cluster IP to KUBE-SVC-<hash>, which picks a KUBE-SEP-<hash> per endpoint with
//! `statistic --mode random` probabilities 1/n, 1/(n-1), ... and DNATs; sessionAffinity
//! ClientIP uses the `recent` module; hairpin traffic is marked for masquerade. From
//! outside: external IPs and LoadBalancer addresses in KUBE-SERVICES, node ports in
//! KUBE-NODEPORTS (the last rule of KUBE-SERVICES, for local destinations), each to a
//! KUBE-EXT-<hash> chain that masquerades (externalTrafficPolicy Cluster) or keeps the
//! client address (Local: the node's own clients go to the cluster endpoints, others to
//! the local ones), behind a KUBE-FW-<hash> chain where loadBalancerSourceRanges apply.
//! In filter, frontends without endpoints are rejected (ECONNREFUSED at once, as
//! kube-proxy does), and packets marked for dropping are dropped. Pure functions: the
//! writer in the parent module decides what to send when.

use crate::desired::{DesiredFrontend, Endpoint, FrontendKey, FrontendKind, Scope};
use crate::model::Affinity;
use std::fmt::Write as _;

pub const SERVICES_CHAIN: &str = "KUBE-SERVICES";
pub const NODEPORTS_CHAIN: &str = "KUBE-NODEPORTS";
pub const EXTERNAL_SERVICES_CHAIN: &str = "KUBE-EXTERNAL-SERVICES";
pub const MARK_MASQ_CHAIN: &str = "KUBE-MARK-MASQ";
pub const MARK_DROP_CHAIN: &str = "KUBE-MARK-DROP";
pub const FIREWALL_CHAIN: &str = "KUBE-FIREWALL";
pub const POSTROUTING_CHAIN: &str = "KUBE-POSTROUTING";
const MASQ_MARK: &str = "0x4000";
const DROP_MARK: &str = "0x8000";

/// The rule in nat KUBE-SERVICES that sends what is left for a local address to the node
/// ports (kube-proxy: "this must be the last rule in this chain").
pub fn nodeports_jump() -> String {
    format!(
        "-A {SERVICES_CHAIN} -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j {NODEPORTS_CHAIN}"
    )
}

/// 80 bits of a stable hash as 16 base32 characters (kube-proxy uses sha256 the same way).
fn hash16(s: &str) -> String {
    fn fnv(seed: u64, s: &str) -> u64 {
        s.bytes()
            .fold(seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    }
    let a = fnv(0xcbf2_9ce4_8422_2325, s);
    let b = fnv(0x6c62_272e_07bb_0142, s);
    let bits = ((a as u128) << 64) | b as u128;
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..16)
        .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

pub fn svc_chain(key: &FrontendKey) -> String {
    format!("KUBE-SVC-{}", hash16(&key.to_string()))
}

fn ext_chain(key: &FrontendKey) -> String {
    format!("KUBE-EXT-{}", hash16(&key.to_string()))
}

fn fw_chain(key: &FrontendKey) -> String {
    format!("KUBE-FW-{}", hash16(&key.to_string()))
}

pub fn sep_chain(key: &FrontendKey, ep: &Endpoint) -> String {
    format!("KUBE-SEP-{}", hash16(&format!("{key}>{ep}")))
}

fn host(ip: &std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => format!("{v4}/32"),
        std::net::IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// Which dispatch chain a frontend's rule goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dispatch {
    /// nat KUBE-SERVICES: cluster IPs, external IPs, LoadBalancer addresses.
    NatServices,
    /// nat KUBE-NODEPORTS.
    NatNodePorts,
    /// filter KUBE-SERVICES: cluster IPs without endpoints (rejected).
    FilterServices,
    /// filter KUBE-EXTERNAL-SERVICES: external frontends without endpoints (rejected).
    FilterExternal,
}

/// The rules of one frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendRules {
    /// The dispatch rule and where it goes (None: the frontend has no rules of its own).
    pub dispatch: Option<(Dispatch, String)>,
    /// Chains this frontend owns in nat, with their rules (the entry chain first).
    pub chains: Vec<(String, Vec<String>)>,
}

/// The rules of one frontend. Socket-level-only frontends (node ports at the node's
/// addresses, cluster-scope entries of external addresses) have none: the external
/// frontends' KUBE-EXT chains serve every client of those addresses, as in kube-proxy.
pub fn render(comment: &str, key: &FrontendKey, f: &DesiredFrontend) -> FrontendRules {
    match (key.scope, f.kind) {
        (Scope::Cluster, FrontendKind::ClusterIp) => render_cluster(comment, key, f),
        (Scope::External, _) => render_external(comment, key, f),
        _ => FrontendRules {
            dispatch: None,
            chains: Vec::new(),
        },
    }
}

fn describe(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::ClusterIp => "cluster IP",
        FrontendKind::ExternalIp => "external IP",
        FrontendKind::LoadBalancerIp => "loadbalancer IP",
        FrontendKind::NodePort => "node port",
    }
}

fn render_external(comment: &str, key: &FrontendKey, f: &DesiredFrontend) -> FrontendRules {
    let proto = key.protocol.as_str();
    let what = describe(f.kind);
    let matches = if f.kind == FrontendKind::NodePort {
        format!(
            "-m comment --comment \"{comment}\" -m {proto} -p {proto} --dport {}",
            key.port
        )
    } else {
        format!(
            "-m comment --comment \"{comment} {what}\" -m {proto} -p {proto} -d {} --dport {}",
            host(&key.ip),
            key.port
        )
    };
    if f.backends.is_empty() {
        // Nothing serves it here: refused (or, with the Local policy on a node without an
        // endpoint, refused too rather than kube-proxy's silent drop: the client learns at
        // once).
        return FrontendRules {
            dispatch: Some((
                Dispatch::FilterExternal,
                format!(
                    "-A {EXTERNAL_SERVICES_CHAIN} -m addrtype --dst-type LOCAL {matches} -j REJECT"
                ),
            )),
            chains: Vec::new(),
        };
    }
    let ext = ext_chain(key);
    let endpoints = endpoint_chains(comment, key, f);
    let mut ext_rules = Vec::new();
    if f.snat_remote {
        ext_rules.push(format!(
            "-A {ext} -m comment --comment \"masquerade traffic for {comment} external destinations\" -j {MARK_MASQ_CHAIN}"
        ));
    } else if let Some(internal) = &f.internal {
        // Local policy: the node's own clients are served like in-cluster ones.
        let svc = svc_chain(internal);
        ext_rules.push(format!(
            "-A {ext} -m comment --comment \"masquerade LOCAL traffic for {comment} external destinations\" -m addrtype --src-type LOCAL -j {MARK_MASQ_CHAIN}"
        ));
        ext_rules.push(format!(
            "-A {ext} -m comment --comment \"route LOCAL traffic for {comment} external destinations\" -m addrtype --src-type LOCAL -j {svc}"
        ));
    }
    ext_rules.push(format!("-A {ext} -j {}", endpoints[0].0));
    let mut chains = vec![(ext.clone(), ext_rules)];
    let mut entry = ext.clone();
    if !f.source_ranges.is_empty() {
        let fw = fw_chain(key);
        let mut fw_rules: Vec<String> = f
            .source_ranges
            .iter()
            .filter(|r| r.addr().is_ipv4() == key.ip.is_ipv4())
            .map(|r| {
                format!(
                    "-A {fw} -m comment --comment \"{comment} loadbalancer IP\" -s {r} -j {ext}"
                )
            })
            .collect();
        fw_rules.push(format!(
            "-A {fw} -m comment --comment \"{comment} loadbalancer IP\" -j {MARK_DROP_CHAIN}"
        ));
        chains.insert(0, (fw.clone(), fw_rules));
        entry = fw;
    }
    chains.extend(endpoints);
    let dispatch = if f.kind == FrontendKind::NodePort {
        (
            Dispatch::NatNodePorts,
            format!("-A {NODEPORTS_CHAIN} {matches} -j {entry}"),
        )
    } else {
        (
            Dispatch::NatServices,
            format!("-A {SERVICES_CHAIN} {matches} -j {entry}"),
        )
    };
    FrontendRules {
        dispatch: Some(dispatch),
        chains,
    }
}

fn render_cluster(comment: &str, key: &FrontendKey, f: &DesiredFrontend) -> FrontendRules {
    let proto = key.protocol.as_str();
    let match_frontend = format!(
        "-m comment --comment \"{comment} cluster IP\" -m {proto} -p {proto} -d {} --dport {}",
        host(&key.ip),
        key.port
    );
    if f.backends.is_empty() {
        return FrontendRules {
            dispatch: Some((
                Dispatch::FilterServices,
                format!("-A {SERVICES_CHAIN} {match_frontend} -j REJECT"),
            )),
            chains: Vec::new(),
        };
    }
    let chains = endpoint_chains(comment, key, f);
    FrontendRules {
        dispatch: Some((
            Dispatch::NatServices,
            format!("-A {SERVICES_CHAIN} {match_frontend} -j {}", chains[0].0),
        )),
        chains,
    }
}

/// The endpoint-choosing chain of a frontend (KUBE-SVC-<hash>) and its KUBE-SEP chains.
fn endpoint_chains(
    comment: &str,
    key: &FrontendKey,
    f: &DesiredFrontend,
) -> Vec<(String, Vec<String>)> {
    let proto = key.protocol.as_str();
    let svc = svc_chain(key);
    let mut svc_rules = Vec::new();
    let mut chains = Vec::new();
    let eps: Vec<&Endpoint> = f.backends.iter().collect();
    if let Affinity::ClientIp { timeout_s } = f.affinity {
        for ep in &eps {
            let sep = sep_chain(key, ep);
            svc_rules.push(format!(
                "-A {svc} -m comment --comment \"{comment} -> {ep}\" -m recent --name {sep} --mask {} --rsource --rcheck --seconds {timeout_s} --reap -j {sep}",
                full_mask(&key.ip)
            ));
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let sep = sep_chain(key, ep);
        let mut rule = format!("-A {svc} -m comment --comment \"{comment} -> {ep}\"");
        if i + 1 < n {
            let _ = write!(
                rule,
                " -m statistic --mode random --probability {:.10}",
                1.0 / (n - i) as f64
            );
        }
        let _ = write!(rule, " -j {sep}");
        svc_rules.push(rule);
        let mut sep_rules = vec![format!(
            "-A {sep} -m comment --comment \"{comment}\" -s {} -j {MARK_MASQ_CHAIN}",
            host(&ep.ip)
        )];
        let recent = match f.affinity {
            Affinity::ClientIp { .. } => format!(
                " -m recent --name {sep} --mask {} --rsource --set",
                full_mask(&key.ip)
            ),
            Affinity::None => String::new(),
        };
        let dest = match ep.ip {
            std::net::IpAddr::V4(v4) => format!("{v4}:{}", ep.port),
            std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", ep.port),
        };
        sep_rules.push(format!(
            "-A {sep} -m comment --comment \"{comment}\"{recent} -m {proto} -p {proto} -j DNAT --to-destination {dest}"
        ));
        chains.push((sep, sep_rules));
    }
    chains.insert(0, (svc, svc_rules));
    chains
}

fn full_mask(ip: &std::net::IpAddr) -> &'static str {
    match ip {
        std::net::IpAddr::V4(_) => "255.255.255.255",
        std::net::IpAddr::V6(_) => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
}

/// The fixed chains kube-proxy keeps in filter beside the dispatch chains.
pub fn filter_fixed_rules() -> Vec<(String, Vec<String>)> {
    vec![(
        FIREWALL_CHAIN.to_string(),
        vec![format!(
            "-A {FIREWALL_CHAIN} -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark {DROP_MARK}/{DROP_MARK} -j DROP"
        )],
    )]
}

/// The fixed chains kube-proxy keeps in nat beside the per-service ones.
pub fn nat_fixed_rules() -> Vec<(String, Vec<String>)> {
    vec![
        (
            MARK_MASQ_CHAIN.to_string(),
            vec![format!("-A {MARK_MASQ_CHAIN} -j MARK --or-mark {MASQ_MARK}")],
        ),
        (
            MARK_DROP_CHAIN.to_string(),
            vec![format!("-A {MARK_DROP_CHAIN} -j MARK --or-mark {DROP_MARK}")],
        ),
        (
            POSTROUTING_CHAIN.to_string(),
            vec![
                format!("-A {POSTROUTING_CHAIN} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
                format!("-A {POSTROUTING_CHAIN} -j MARK --xor-mark {MASQ_MARK}"),
                format!("-A {POSTROUTING_CHAIN} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"),
            ],
        ),
    ]
}

/// (table, built-in chain, our chain, extra match) jumps installed once with -C/-I.
pub const JUMPS: &[(&str, &str, &str, &str)] = &[
    ("nat", "OUTPUT", SERVICES_CHAIN, ""),
    ("nat", "PREROUTING", SERVICES_CHAIN, ""),
    ("nat", "POSTROUTING", POSTROUTING_CHAIN, ""),
    (
        "filter",
        "OUTPUT",
        SERVICES_CHAIN,
        "-m conntrack --ctstate NEW",
    ),
    (
        "filter",
        "FORWARD",
        SERVICES_CHAIN,
        "-m conntrack --ctstate NEW",
    ),
    (
        "filter",
        "INPUT",
        EXTERNAL_SERVICES_CHAIN,
        "-m conntrack --ctstate NEW",
    ),
    (
        "filter",
        "FORWARD",
        EXTERNAL_SERVICES_CHAIN,
        "-m conntrack --ctstate NEW",
    ),
    ("filter", "INPUT", FIREWALL_CHAIN, ""),
    ("filter", "OUTPUT", FIREWALL_CHAIN, ""),
    ("filter", "FORWARD", FIREWALL_CHAIN, ""),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Port, Protocol};
    use std::collections::BTreeSet;

    fn key() -> FrontendKey {
        FrontendKey::cluster(
            "10.96.0.10".parse().unwrap(),
            Port::new(80).unwrap(),
            Protocol::Tcp,
        )
    }

    fn frontend(n: u8, affinity: Affinity) -> DesiredFrontend {
        DesiredFrontend {
            backends: (1..=n)
                .map(|i| Endpoint {
                    ip: format!("10.244.0.{i}").parse().unwrap(),
                    port: Port::new(8080).unwrap(),
                    local: false,
                })
                .collect::<BTreeSet<_>>(),
            affinity,
            port_name: "http".into(),
            kind: FrontendKind::ClusterIp,
            snat_remote: false,
            source_ranges: Vec::new(),
            internal: None,
        }
    }

    #[test]
    fn node_ports_go_through_ext_and_firewall_chains() {
        let np = FrontendKey {
            ip: "0.0.0.0".parse().unwrap(),
            port: Port::new(30080).unwrap(),
            protocol: Protocol::Tcp,
            scope: Scope::External,
        };
        let mut f = frontend(2, Affinity::None);
        f.kind = FrontendKind::NodePort;
        f.snat_remote = true;
        f.internal = Some(key());
        let r = render("default/web:http", &np, &f);
        let (d, rule) = r.dispatch.clone().unwrap();
        assert_eq!(d, Dispatch::NatNodePorts);
        assert!(
            rule.starts_with("-A KUBE-NODEPORTS") && rule.contains("--dport 30080 -j KUBE-EXT-"),
            "{rule}"
        );
        assert!(r.chains[0].1[0].contains("-j KUBE-MARK-MASQ"));
        // Local policy: local clients short-circuit to the cluster IP's chain.
        f.snat_remote = false;
        let r = render("default/web:http", &np, &f);
        assert!(r.chains[0].1[1].contains(&format!("--src-type LOCAL -j {}", svc_chain(&key()))));
        // A LoadBalancer address with source ranges: KUBE-FW first.
        let lb = FrontendKey {
            ip: "10.249.0.200".parse().unwrap(),
            port: Port::new(80).unwrap(),
            ..np
        };
        f.kind = FrontendKind::LoadBalancerIp;
        f.source_ranges = vec!["10.1.0.0/16".parse().unwrap()];
        let r = render("default/web:http", &lb, &f);
        assert!(r
            .dispatch
            .unwrap()
            .1
            .contains("-d 10.249.0.200/32 --dport 80 -j KUBE-FW-"));
        assert!(r.chains[0].1[0].contains("-s 10.1.0.0/16 -j KUBE-EXT-"));
        assert!(r.chains[0].1[1].ends_with("-j KUBE-MARK-DROP"));
        // No endpoints: rejected in filter.
        let r = render("default/web:http", &np, &frontend(0, Affinity::None));
        assert_eq!(r.dispatch.map(|d| d.0), Some(Dispatch::FilterExternal));
    }

    #[test]
    fn probabilities_make_a_uniform_choice() {
        let r = render("default/web:http", &key(), &frontend(3, Affinity::None));
        let svc = &r.chains[0].1;
        assert!(svc[0].contains("--probability 0.3333333333"));
        assert!(svc[1].contains("--probability 0.5000000000"));
        assert!(!svc[2].contains("statistic"));
        assert_eq!(r.chains.len(), 4);
        assert!(r.chains[1].1[1].contains("DNAT --to-destination 10.244.0.1:8080"));
        let (d, rule) = r.dispatch.unwrap();
        assert_eq!(d, Dispatch::NatServices);
        assert!(rule.contains("-d 10.96.0.10/32 --dport 80 -j KUBE-SVC-"));
    }

    #[test]
    fn no_endpoints_rejects() {
        let r = render("default/web:http", &key(), &frontend(0, Affinity::None));
        let (d, rule) = r.dispatch.unwrap();
        assert_eq!(d, Dispatch::FilterServices);
        assert!(rule.ends_with("-j REJECT"));
    }

    #[test]
    fn affinity_checks_recent_first() {
        let r = render(
            "default/web:http",
            &key(),
            &frontend(2, Affinity::ClientIp { timeout_s: 60 }),
        );
        assert!(r.chains[0].1[0].contains("--rcheck --seconds 60 --reap"));
        assert!(r.chains[1].1[1].contains("--set"));
    }

    #[test]
    fn chain_names_are_stable_and_short() {
        let a = svc_chain(&key());
        assert_eq!(a, svc_chain(&key()));
        assert_eq!(a.len(), "KUBE-SVC-".len() + 16);
    }
}
