//! The benchmark's baseline (`skiff-dns --static-zone FILE`, used by `cargo xtask bench
//! dns`): the same hickory-server listeners answering A queries from a fixed table of
//! `name address` lines, with nothing of skiff-dns's own (no API watch, no per-Service
//! zone, no metrics, no forwarding). Measured next to skiff-dns on the same names, the ratio
//! is skiff-dns's own cost per query.

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Header, HeaderCounts, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::A;
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use tokio_util::sync::CancellationToken;

/// A line of the table that is not `name ipv4`.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: {reason}")]
pub struct TableError {
    path: String,
    line: usize,
    reason: String,
}

/// Name -> its one A record.
pub struct StaticZone {
    records: HashMap<LowerName, Record>,
}

impl StaticZone {
    /// Reads `name address` lines (absolute names or not; blank lines and `#` skipped).
    pub fn load(path: &Path) -> Result<StaticZone, TableError> {
        let err = |line: usize, reason: String| TableError {
            path: path.display().to_string(),
            line,
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(0, e.to_string()))?;
        let mut records = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(addr), None) = (words.next(), words.next(), words.next()) else {
                return Err(err(i + 1, "want `name address`".into()));
            };
            let mut name = Name::from_ascii(name).map_err(|e| err(i + 1, e.to_string()))?;
            name.set_fqdn(true);
            let addr: Ipv4Addr = addr.parse().map_err(|e| err(i + 1, format!("{e}")))?;
            let record = Record::from_rdata(name.clone(), crate::records::TTL, RData::A(A(addr)));
            records.insert(LowerName::from(&name), record);
        }
        Ok(StaticZone { records })
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[async_trait::async_trait]
impl RequestHandler for StaticZone {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        let answer = match request.request_info() {
            Ok(info) if info.query.query_type() == RecordType::A => {
                self.records.get(info.query.name())
            }
            _ => None,
        };
        metadata.authoritative = true;
        metadata.response_code = match answer {
            Some(_) => ResponseCode::NoError,
            None => ResponseCode::NXDomain,
        };
        let response = MessageResponseBuilder::from_message_request(request).build(
            metadata,
            answer,
            std::iter::empty(),
            std::iter::empty(),
            std::iter::empty(),
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(_) => ResponseInfo::from(Header {
                metadata: Metadata::response_from_request(&request.metadata),
                counts: HeaderCounts::default(),
            }),
        }
    }
}

/// Serves `zone` on UDP `listen` until `token` is cancelled.
pub async fn serve(
    zone: StaticZone,
    listen: SocketAddr,
    token: CancellationToken,
) -> std::io::Result<()> {
    let udp = tokio::net::UdpSocket::bind(listen).await?;
    tracing::info!(addr = %udp.local_addr()?, names = zone.len(), "serving the static zone (benchmark baseline)");
    let mut server = hickory_server::Server::new(zone);
    server.register_socket(udp);
    token.cancelled().await;
    let _ = server.shutdown_gracefully().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_loads_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zone");
        std::fs::write(
            &path,
            "# bench\nsvc-0.bench.svc.cluster.local. 10.96.0.20\nSVC-1.bench.svc.cluster.local 10.96.0.21\n\n",
        )
        .unwrap();
        let zone = StaticZone::load(&path).unwrap();
        assert_eq!(zone.len(), 2);
        let lower = LowerName::from(Name::from_ascii("svc-1.bench.svc.cluster.local.").unwrap());
        assert!(zone.records.contains_key(&lower));
        std::fs::write(&path, "a.example. 10.0.0.1\nb.example. not-an-ip\n").unwrap();
        let e = StaticZone::load(&path).err().unwrap().to_string();
        assert!(e.ends_with(":2: invalid IPv4 address syntax"), "{e}");
    }
}
