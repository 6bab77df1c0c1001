//! Streaming a node agent's HTTP answer back to the client (pods/log): the kubelet API is
//! plain HTTP inside the cluster's own network; its body is relayed frame by frame.

use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::apiserver::output::Resp;
use crate::machinery::ApiError;

/// GETs `url` and relays status, content type and body as they come.
pub async fn stream_get(url: &str) -> Result<Resp, ApiError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let req = Request::get(url)
        .body(Empty::new())
        .map_err(|e| ApiError::internal(format!("kubelet request: {e}")))?;
    let resp = client.request(req).await.map_err(|e| {
        ApiError::unavailable(format!("the node agent did not answer ({url}): {e}"))
    })?;
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut body = resp.into_body();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            if let Ok(data) = frame.into_data() {
                if tx.send(data).await.is_err() {
                    break;
                }
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut out = Response::new(StreamBody::new(stream).boxed_unsync());
    *out.status_mut() = if status.is_success() {
        StatusCode::OK
    } else {
        status
    };
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(out)
}
