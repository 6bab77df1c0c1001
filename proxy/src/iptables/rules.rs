//! kube-proxy's iptables layout, rendered as iptables-restore input: in nat, KUBE-SERVICES
//! jumps per frontend to KUBE-SVC-<hash>, which picks a KUBE-SEP-<hash> per endpoint with
//! `statistic --mode random` probabilities 1/n, 1/(n-1), ... and DNATs; sessionAffinity
//! ClientIP uses the `recent` module; hairpin traffic is marked for masquerade; in filter,
//! frontends without endpoints are rejected (ECONNREFUSED at once, as kube-proxy does).
//! Pure functions: the writer in the parent module decides what to send when.

use crate::desired::{DesiredFrontend, Endpoint, FrontendKey};
use crate::model::Affinity;
use std::fmt::Write as _;

pub const SERVICES_CHAIN: &str = "KUBE-SERVICES";
pub const MARK_MASQ_CHAIN: &str = "KUBE-MARK-MASQ";
pub const POSTROUTING_CHAIN: &str = "KUBE-POSTROUTING";
const MASQ_MARK: &str = "0x4000";

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

pub fn sep_chain(key: &FrontendKey, ep: &Endpoint) -> String {
    format!("KUBE-SEP-{}", hash16(&format!("{key}>{ep}")))
}

fn host(ip: &std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => format!("{v4}/32"),
        std::net::IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// The rules of one frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendRules {
    /// `-A KUBE-SERVICES ...` in nat (frontend with endpoints) or filter (without).
    pub services_rule: String,
    pub has_endpoints: bool,
    /// Chains this frontend owns in nat, with their rules (SVC first).
    pub chains: Vec<(String, Vec<String>)>,
}

pub fn render(comment: &str, key: &FrontendKey, f: &DesiredFrontend) -> FrontendRules {
    let proto = key.protocol.as_str();
    let match_frontend = format!(
        "-m comment --comment \"{comment} cluster IP\" -m {proto} -p {proto} -d {} --dport {}",
        host(&key.ip),
        key.port
    );
    if f.backends.is_empty() {
        return FrontendRules {
            services_rule: format!("-A {SERVICES_CHAIN} {match_frontend} -j REJECT"),
            has_endpoints: false,
            chains: Vec::new(),
        };
    }
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
    chains.insert(0, (svc.clone(), svc_rules));
    FrontendRules {
        services_rule: format!("-A {SERVICES_CHAIN} {match_frontend} -j {svc}"),
        has_endpoints: true,
        chains,
    }
}

fn full_mask(ip: &std::net::IpAddr) -> &'static str {
    match ip {
        std::net::IpAddr::V4(_) => "255.255.255.255",
        std::net::IpAddr::V6(_) => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
}

/// The fixed chains kube-proxy keeps in nat beside the per-service ones.
pub fn nat_fixed_rules() -> Vec<(String, Vec<String>)> {
    vec![
        (
            MARK_MASQ_CHAIN.to_string(),
            vec![format!("-A {MARK_MASQ_CHAIN} -j MARK --or-mark {MASQ_MARK}")],
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
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Port, Protocol};
    use std::collections::BTreeSet;

    fn key() -> FrontendKey {
        FrontendKey {
            ip: "10.96.0.10".parse().unwrap(),
            port: Port::new(80).unwrap(),
            protocol: Protocol::Tcp,
        }
    }

    fn frontend(n: u8, affinity: Affinity) -> DesiredFrontend {
        DesiredFrontend {
            backends: (1..=n)
                .map(|i| Endpoint {
                    ip: format!("10.244.0.{i}").parse().unwrap(),
                    port: Port::new(8080).unwrap(),
                })
                .collect::<BTreeSet<_>>(),
            affinity,
            port_name: "http".into(),
        }
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
        assert!(r
            .services_rule
            .contains("-d 10.96.0.10/32 --dport 80 -j KUBE-SVC-"));
    }

    #[test]
    fn no_endpoints_rejects() {
        let r = render("default/web:http", &key(), &frontend(0, Affinity::None));
        assert!(!r.has_endpoints);
        assert!(r.services_rule.ends_with("-j REJECT"));
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
