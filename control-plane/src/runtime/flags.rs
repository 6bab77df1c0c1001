//! Command-line pieces shared by the controller-manager and the scheduler: Go-style
//! durations (`15s`, `1m30s`, `500ms`) and kube-controller-manager's leader-election flags.

use std::time::Duration;

use clap::Args;

use super::leader::LeaderElectionConfig;

/// Parses a Go duration: a sequence of number+unit (`h`, `m`, `s`, `ms`, `us`, `ns`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("invalid duration {s:?}"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            other => return Err(format!("invalid unit {other:?} in duration {s:?}")),
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(value * seconds);
    }
    Ok(total)
}

/// `--leader-elect*` as kube-controller-manager and kube-scheduler take them.
#[derive(Args, Clone, Debug)]
pub struct LeaderElectionArgs {
    /// Campaign for a Lease and act only while holding it (false: act at once).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a standby waits after the last renewal before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops acting.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often to try to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The Lease's name (default: the component's name).
    #[arg(long)]
    pub leader_elect_resource_name: Option<String>,
    /// The Lease's namespace.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

impl LeaderElectionArgs {
    /// The election for `component` (its default Lease name), None when disabled.
    pub fn config(&self, component: &str) -> Option<LeaderElectionConfig> {
        if !self.leader_elect {
            return None;
        }
        let mut c = LeaderElectionConfig::new(
            self.leader_elect_resource_name
                .clone()
                .unwrap_or_else(|| component.to_string()),
        );
        c.namespace = self.leader_elect_resource_namespace.clone();
        c.lease_duration = self.leader_elect_lease_duration;
        c.renew_deadline = self.leader_elect_renew_deadline;
        c.retry_period = self.leader_elect_retry_period;
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("40s").unwrap(), Duration::from_secs(40));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }
}
