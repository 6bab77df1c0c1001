//! One query: answered from the cluster zone when the name is in the cluster domain (or is
//! the reverse name of a cluster address), else forwarded to the upstream resolvers through
//! hickory-resolver. Every query is counted by type, response code and source, and timed.

use crate::metrics::{Metrics, QueryLabels, Source};
use crate::records::{Answer, Records};
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::TokioResolver;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::{LowerName, Name, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use std::sync::Arc;
use std::time::Instant;

/// The records of a response and how it is marked.
struct Reply {
    code: ResponseCode,
    answers: Vec<Record>,
    authority: Vec<Record>,
    authoritative: bool,
    source: Source,
}

impl Reply {
    fn error(code: ResponseCode) -> Reply {
        Reply {
            code,
            answers: Vec::new(),
            authority: Vec::new(),
            authoritative: false,
            source: Source::None,
        }
    }
}

/// The server's request handler.
pub struct Handler {
    records: Arc<Records>,
    upstream: Option<TokioResolver>,
    metrics: Arc<Metrics>,
}

impl Handler {
    pub fn new(
        records: Arc<Records>,
        upstream: Option<TokioResolver>,
        metrics: Arc<Metrics>,
    ) -> Handler {
        Handler {
            records,
            upstream,
            metrics,
        }
    }

    async fn reply(&self, qname: &LowerName, qtype: RecordType) -> Reply {
        match self.records.lookup(qname, qtype) {
            Answer::Records(answers) => {
                let authority = match answers.is_empty() {
                    true => vec![self.records.zone().soa().clone()],
                    false => Vec::new(),
                };
                Reply {
                    code: ResponseCode::NoError,
                    answers,
                    authority,
                    authoritative: true,
                    source: Source::Cluster,
                }
            }
            Answer::NxDomain => Reply {
                code: ResponseCode::NXDomain,
                answers: Vec::new(),
                authority: vec![self.records.zone().soa().clone()],
                authoritative: true,
                source: Source::Cluster,
            },
            Answer::Forward => self.forward(qname, qtype).await,
        }
    }

    async fn forward(&self, qname: &LowerName, qtype: RecordType) -> Reply {
        let Some(resolver) = &self.upstream else {
            return Reply::error(ResponseCode::Refused);
        };
        let mut name: Name = qname.into();
        name.set_fqdn(true);
        let mut reply = Reply {
            code: ResponseCode::NoError,
            answers: Vec::new(),
            authority: Vec::new(),
            authoritative: false,
            source: Source::Upstream,
        };
        match resolver.lookup(name, qtype).await {
            Ok(lookup) => reply.answers = lookup.answers().to_vec(),
            Err(NetError::Dns(DnsError::NoRecordsFound(no))) => {
                reply.code = no.response_code;
                if let Some(soa) = no.soa {
                    reply.authority.push(soa.into_record_of_rdata());
                }
            }
            Err(NetError::Dns(DnsError::ResponseCode(code))) => reply.code = code,
            Err(error) => {
                tracing::debug!(%qname, %qtype, %error, "upstream lookup failed");
                reply.code = ResponseCode::ServFail;
            }
        }
        reply
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let start = Instant::now();
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = self.upstream.is_some();
        let response_edns = request.edns.as_ref().map(|req| {
            let mut e = Edns::new();
            e.set_max_payload(req.max_payload().max(512));
            e.set_version(0);
            e
        });
        let mut qtype_label = "none".to_string();
        let reply = if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
        {
            Reply::error(ResponseCode::NotImp)
        } else {
            match request.request_info() {
                Err(_) => Reply::error(ResponseCode::FormErr),
                Ok(info) => {
                    let qtype = info.query.query_type();
                    qtype_label = qtype.to_string();
                    self.reply(info.query.name(), qtype).await
                }
            }
        };
        metadata.response_code = reply.code;
        metadata.authoritative = reply.authoritative;
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(e) = &response_edns {
            builder.edns(e);
        }
        let response = builder.build(
            metadata,
            reply.answers.iter(),
            reply.authority.iter(),
            std::iter::empty(),
            std::iter::empty(),
        );
        let info = match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => {
                tracing::debug!(%error, "sending a response failed");
                let mut failed = Metadata::response_from_request(&request.metadata);
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata: failed,
                    counts: HeaderCounts::default(),
                })
            }
        };
        self.metrics.observe(
            QueryLabels {
                qtype: qtype_label,
                rcode: format!("{:?}", reply.code).to_ascii_uppercase(),
                source: reply.source,
            },
            start.elapsed(),
        );
        info
    }
}
