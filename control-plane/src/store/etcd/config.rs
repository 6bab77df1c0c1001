//! Where the etcd cluster is and how to reach it: `--store etcd://host:port[,host:port...]`,
//! the client TLS files (kube-apiserver's `--etcd-cafile`, `--etcd-certfile`,
//! `--etcd-keyfile`), the key prefix and the compaction interval.

use std::path::PathBuf;
use std::time::Duration;

/// The client's TLS material: the CA that signed the members' serving certificates, and the
/// client certificate and key the members require.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    /// Certificate and key, both or neither (a cluster that does not check clients).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// How the API server uses an etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member (the client balances over them).
    pub endpoints: Vec<String>,
    /// None: plain gRPC (only sensible on loopback).
    pub tls: Option<EtcdTls>,
    /// Prepended to every key (kube-apiserver's `--etcd-prefix` sits in the keys already:
    /// `/registry/...`); lets several clusters, or tests, share one etcd.
    pub prefix: String,
    /// How often the store's history is compacted to where it was one interval earlier
    /// (kube-apiserver's `--etcd-compaction-interval`, 5 minutes); zero: never.
    pub compaction_interval: Duration,
}

impl EtcdConfig {
    /// Defaults for the given members: no TLS, no prefix, compaction every 5 minutes.
    pub fn new(endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            tls: None,
            prefix: String::new(),
            compaction_interval: Duration::from_secs(300),
        }
    }

    /// The client URLs of the members (`https://` with TLS).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

/// Which store the API server keeps its state in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// The embedded store in the data directory.
    Embedded,
    /// An etcd cluster.
    Etcd(Vec<String>),
}

impl std::str::FromStr for StoreLocation {
    type Err = String;

    /// `embedded`, or `etcd://host:port[,host:port...]`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "embedded" {
            return Ok(StoreLocation::Embedded);
        }
        let Some(hosts) = s.strip_prefix("etcd://") else {
            return Err(format!(
                "{s:?}: expected `embedded` or `etcd://host:port[,host:port...]`"
            ));
        };
        let endpoints: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .map(str::to_string)
            .collect();
        for e in &endpoints {
            let valid = e.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p != 0)
            });
            if !valid {
                return Err(format!("{s:?}: {e:?} is not host:port"));
            }
        }
        Ok(StoreLocation::Etcd(endpoints))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_locations_parse() {
        assert_eq!(
            "etcd://127.0.0.1:2379,10.0.0.2:2379".parse(),
            Ok(StoreLocation::Etcd(vec![
                "127.0.0.1:2379".into(),
                "10.0.0.2:2379".into()
            ]))
        );
        assert_eq!("embedded".parse(), Ok(StoreLocation::Embedded));
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://:2379",
            "etcd://a:1,",
            "http://a:1",
            "etcd://a/b:1",
        ] {
            assert!(bad.parse::<StoreLocation>().is_err(), "{bad}");
        }
        let mut c = EtcdConfig::new(vec!["a:1".into()]);
        assert_eq!(c.urls(), ["http://a:1"]);
        c.tls = Some(EtcdTls {
            ca: "ca.crt".into(),
            identity: None,
        });
        assert_eq!(c.urls(), ["https://a:1"]);
    }
}
