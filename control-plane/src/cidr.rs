//! IPv4 CIDRs as flags and objects name them (`--cluster-cidr`, `--service-cluster-ip-range`,
//! a Node's `spec.podCIDR`): parsed by ipnet, with the prefix bounds each use needs and the
//! messages users see. Every CIDR in skiff is an `ipnet::Ipv4Net`; the wrappers of the
//! controllers, the ClusterIP allocator and the node agent only add their bounds.

use ipnet::Ipv4Net;
use std::ops::RangeInclusive;

/// Parses `a.b.c.d/n` with `n` in `prefixes`; host bits are cleared (`10.244.3.7/16` is
/// `10.244.0.0/16`).
pub fn parse_ipv4(s: &str, prefixes: RangeInclusive<u8>) -> Result<Ipv4Net, String> {
    if !s.contains('/') {
        return Err(format!("{s:?} is not a CIDR (a.b.c.d/n)"));
    }
    let net: Ipv4Net = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !prefixes.contains(&net.prefix_len()) {
        return Err(format!(
            "{s:?}: the prefix length must be {} to {}",
            prefixes.start(),
            prefixes.end()
        ));
    }
    Ok(net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_clears_host_bits() {
        let n = parse_ipv4("10.244.3.7/16", 1..=30).unwrap();
        assert_eq!(n.to_string(), "10.244.0.0/16");
    }

    #[test]
    fn bad_input_names_the_value_and_the_problem() {
        for (bad, why) in [
            ("10.0.0.0", "is not a CIDR"),
            ("10.0.0/8", "invalid IP address syntax"),
            ("x/24", "invalid IP address syntax"),
            ("10.0.0.0/x", "invalid IP address syntax"),
            ("10.0.0.0/33", "invalid IP address syntax"),
            ("10.0.0.0/31", "the prefix length must be 8 to 30"),
            ("10.0.0.0/4", "the prefix length must be 8 to 30"),
            ("", "is not a CIDR"),
        ] {
            let e = parse_ipv4(bad, 8..=30).unwrap_err();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains(why),
                "{bad}: {e}"
            );
        }
    }
}
