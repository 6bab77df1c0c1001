//! The pod subresources a node agent serves through its kubelet API, at
//! `https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port, default 10250>`, as
//! `kube-apiserver-kubelet-client` (see `proxy::dial`):
//!
//! - `pods/<name>/log` -> `GET /containerLogs/<ns>/<pod>/<container>?follow=&previous=&tailLines=..`,
//!   streamed back.
//! - `pods/<name>/exec` -> `/exec/<ns>/<pod>/<container>?command=..&stdin=&stdout=&stderr=&tty=`,
//!   an HTTP upgrade relayed byte for byte to the runtime's streaming server the agent
//!   redirects to (see `proxy::upgrade`).
//! - `pods/<name>/attach` -> `/attach/<ns>/<pod>/<container>?stdin=&stdout=&stderr=&tty=`
//!   and `pods/<name>/portforward` -> `/portForward/<ns>/<pod>?port=..`, relayed the same way.

use std::sync::Arc;

use hyper::upgrade::OnUpgrade;
use serde_json::Value;

use super::{Call, Ctx};
use crate::apiserver::admission::{Operation, Request};
use crate::apiserver::output::Resp;
use crate::machinery::ApiError;

/// The kubelet port when the Node does not report one (Kubernetes' default).
const KUBELET_PORT: i64 = 10250;

/// The log options the kubelet understands (Kubernetes' PodLogOptions as query parameters).
const LOG_OPTIONS: &[&str] = &[
    "follow",
    "previous",
    "tailLines",
    "timestamps",
    "sinceSeconds",
    "limitBytes",
];

/// A pod, its container named by the request, and its node agent's kubelet API.
struct Target {
    pod: Value,
    container: String,
    /// `https://<host>:<port>`
    kubelet: String,
}

impl Target {
    /// `<kubelet>/<endpoint>/<ns>/<pod>/<container>`
    fn url(&self, call: &Call<'_>, endpoint: &str, name: &str) -> String {
        let ns = call.namespace().unwrap_or_default();
        format!("{}/{endpoint}/{ns}/{name}/{}", self.kubelet, self.container)
    }
}

/// Finds the pod, the container (`?container=`, or the only one) and the pod's node agent.
async fn locate(ctx: &Ctx, call: &Call<'_>, name: &str) -> Result<Target, ApiError> {
    let (pod, kubelet) = locate_pod(ctx, call, name).await?;
    let containers: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let container = match call.query.get("container").filter(|c| !c.is_empty()) {
        Some(c) => c.clone(),
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )))
        }
    };
    Ok(Target {
        pod,
        container,
        kubelet,
    })
}

/// The pod and its node agent's kubelet API (`https://<host>:<port>`).
async fn locate_pod(ctx: &Ctx, call: &Call<'_>, name: &str) -> Result<(Value, String), ApiError> {
    let pod = ctx
        .cached(call.resource, &call.key(name))
        .await?
        .ok_or_else(|| call.not_found(name))?
        .value()
        .map_err(ApiError::internal)?;
    let kubelet = kubelet_of_pod(ctx, &pod, name).await?;
    Ok((pod, kubelet))
}

/// The kubelet API of the node a pod is scheduled to.
pub(super) async fn kubelet_of_pod(ctx: &Ctx, pod: &Value, name: &str) -> Result<String, ApiError> {
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!("pod {name} is not scheduled to a node yet"))
        })?;
    let nodes = crate::apiserver::registry::find("", "v1", "nodes")
        .ok_or_else(|| ApiError::internal("nodes not registered"))?;
    let node_obj = ctx
        .cached(nodes, &nodes.key(None, node))
        .await?
        .ok_or_else(|| ApiError::not_found("", "nodes", node))?
        .value()
        .map_err(ApiError::internal)?;
    kubelet_of(&node_obj)
        .ok_or_else(|| ApiError::bad_request(format!("node {node} reports no address")))
}

/// `https://<address>:<port>` of a Node's kubelet API: its InternalIP (else ExternalIP, else
/// Hostname) and the port it publishes in status.daemonEndpoints.
pub(crate) fn kubelet_of(node: &Value) -> Option<String> {
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)?;
    let address = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a["type"] == *t)
                .and_then(|a| a["address"].as_str())
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .filter(|p| *p > 0)
        .unwrap_or(KUBELET_PORT);
    let host = if address.contains(':') {
        format!("[{address}]")
    } else {
        address.to_string()
    };
    Some(format!("https://{host}:{port}"))
}

/// `GET pods/<name>/log`: the container's log, streamed from its node's agent.
pub async fn logs(ctx: &Arc<Ctx>, call: &Call<'_>, name: &str) -> Result<Resp, ApiError> {
    let target = locate(ctx, call, name).await?;
    let query: Vec<String> = LOG_OPTIONS
        .iter()
        .filter_map(|k| call.query.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    let url = format!(
        "{}?{}",
        target.url(call, "containerLogs", name),
        query.join("&")
    );
    super::proxy::stream_get(&ctx.kubelet_tls, &url).await
}

/// `pods/<name>/exec` (GET for WebSocket, POST for SPDY): the command runs in the container
/// for as long as the upgraded connection lives.
pub async fn exec(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    name: &str,
    upgrade: Option<OnUpgrade>,
) -> Result<Resp, ApiError> {
    let upgrade = require_upgrade(call, upgrade)?;
    if !call.query.contains_key("command") {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let target = running_container(ctx, call, name, "exec into").await?;
    // The query goes on as the client wrote it: `command` repeats, one per argument.
    let url = format!("{}?{}", target.url(call, "exec", name), call.query_string);
    relay(ctx, call, &url, upgrade).await
}

/// `pods/<name>/attach` (GET for WebSocket, POST for SPDY): the container's own stdin,
/// stdout and stderr for as long as the upgraded connection lives.
pub async fn attach(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    name: &str,
    upgrade: Option<OnUpgrade>,
) -> Result<Resp, ApiError> {
    let upgrade = require_upgrade(call, upgrade)?;
    let target = running_container(ctx, call, name, "attach to").await?;
    let url = format!("{}?{}", target.url(call, "attach", name), call.query_string);
    relay(ctx, call, &url, upgrade).await
}

/// The target of exec or attach: a container the pod has (init and ephemeral containers
/// included: `kubectl debug` attaches to the ephemeral one it added), in a pod that has not
/// completed.
async fn running_container(
    ctx: &Ctx,
    call: &Call<'_>,
    name: &str,
    verb: &str,
) -> Result<Target, ApiError> {
    let target = locate(ctx, call, name).await?;
    let containers = [
        "/spec/containers",
        "/spec/initContainers",
        "/spec/ephemeralContainers",
    ]
    .into_iter()
    .flat_map(|list| {
        target
            .pod
            .pointer(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    });
    if !containers
        .filter_map(|c| c["name"].as_str())
        .any(|c| c == target.container)
    {
        return Err(ApiError::bad_request(format!(
            "container {} is not valid for pod {name}",
            target.container
        )));
    }
    if let Some(phase @ ("Succeeded" | "Failed")) =
        target.pod.pointer("/status/phase").and_then(Value::as_str)
    {
        return Err(ApiError::bad_request(format!(
            "cannot {verb} a container in a completed pod; current phase is {phase}"
        )));
    }
    Ok(target)
}

/// `pods/<name>/portforward` (GET for WebSocket, POST for SPDY): streams to the pod's ports
/// for as long as the upgraded connection lives.
pub async fn port_forward(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    name: &str,
    upgrade: Option<OnUpgrade>,
) -> Result<Resp, ApiError> {
    let upgrade = require_upgrade(call, upgrade)?;
    let (pod, kubelet) = locate_pod(ctx, call, name).await?;
    if pod.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        return Err(ApiError::bad_request(format!(
            "pod {name} is not running and cannot be port-forwarded"
        )));
    }
    let ns = call.namespace().unwrap_or_default();
    let url = format!("{kubelet}/portForward/{ns}/{name}?{}", call.query_string);
    relay(ctx, call, &url, upgrade).await
}

/// The client's upgrade (SPDY or WebSocket), which streaming subresources require.
fn require_upgrade(call: &Call<'_>, upgrade: Option<OnUpgrade>) -> Result<OnUpgrade, ApiError> {
    upgrade
        .filter(|_| super::proxy::is_upgrade(call.headers))
        .ok_or_else(|| ApiError::bad_request("Upgrade request required"))
}

/// Relays the upgraded connection to `url` on the node agent (and where it redirects),
/// once admission has let the CONNECT through.
async fn relay(
    ctx: &Arc<Ctx>,
    call: &Call<'_>,
    url: &str,
    upgrade: OnUpgrade,
) -> Result<Resp, ApiError> {
    let sub = call.path.subresource.as_deref();
    let req = Request::new(
        Operation::Connect,
        call.resource,
        call.namespace(),
        call.path.name.as_deref().unwrap_or_default(),
        call.user,
    )
    .subresource(sub)
    .options(connect_options(call, sub.unwrap_or_default()));
    ctx.admission.admit_without_object(&req).await?;
    super::proxy::upgrade(
        &ctx.kubelet_tls,
        call.method,
        url,
        call.headers,
        upgrade,
        ctx.shutdown.clone(),
    )
    .await
}

/// PodExecOptions, PodAttachOptions or PodPortForwardOptions from the query, as webhooks
/// that admit CONNECT see them.
fn connect_options(call: &Call<'_>, sub: &str) -> Value {
    let kind = match sub {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        _ => "PodPortForwardOptions",
    };
    let mut o = serde_json::json!({"kind": kind, "apiVersion": "v1"});
    for flag in ["stdin", "stdout", "stderr", "tty"] {
        if let Some(v) = call.query.get(flag) {
            o[flag] = Value::Bool(v == "true" || v == "1");
        }
    }
    if let Some(c) = call.query.get("container") {
        o["container"] = Value::from(c.as_str());
    }
    let repeated = |key: &str| crate::apiserver::request::query_values(call.query_string, key);
    match sub {
        "exec" => o["command"] = serde_json::json!(repeated("command")),
        "portforward" => {
            let ports: Vec<u64> = repeated("ports")
                .iter()
                .flat_map(|p| {
                    p.split(',')
                        .filter_map(|x| x.trim().parse().ok())
                        .collect::<Vec<_>>()
                })
                .collect();
            if !ports.is_empty() {
                o["ports"] = serde_json::json!(ports);
            }
        }
        _ => {}
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_address_and_port_come_from_the_node() {
        let node = json!({"status": {"addresses": [
            {"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10255}}}});
        assert_eq!(kubelet_of(&node).unwrap(), "https://10.0.0.5:10255");
        let v6 = json!({"status": {"addresses": [{"type": "InternalIP", "address": "fd00::5"}]}});
        assert_eq!(kubelet_of(&v6).unwrap(), "https://[fd00::5]:10250");
        assert_eq!(kubelet_of(&json!({"status": {}})), None);
    }
}
