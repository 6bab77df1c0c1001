//! metrics.k8s.io/v1beta1 served natively (`kubectl top`, the HorizontalPodAutoscaler):
//! every API server scrapes the node agents' `/stats/summary` on a timer ([`run`], every
//! `--metric-resolution`, 15 s as metrics-server) into a snapshot that requests read; a
//! request never reaches a node. A scrape round costs O(nodes) requests, spread over
//! [`CONCURRENCY`] connections, each bounded by [`SCRAPE_TIMEOUT`]; the snapshot is rebuilt
//! once per round, so a request costs what it returns.
//!
//! Only Ready nodes are scraped (an agent that stopped renewing its Lease would not answer).
//! A node that does not answer is logged and counted; what it said last stays served until
//! it is [`MAX_AGE_ROUNDS`] rounds old, then it ages out. Pods carry their labels as the
//! watch cache had them at the scrape (label selectors filter on them), and a pod is only
//! served while the cache still has it with the same uid.
//!
//! Several API servers each keep their own snapshot from the same node agents: no
//! coordination is needed and any of them answers alike (up to one round apart).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{Call, Ctx};
use crate::apiserver::output::{self, Resp};
use crate::apiserver::registry;
use crate::apiserver::request::ListOptions;
use crate::machinery::selectors::LabelSelector;
use crate::machinery::ApiError;
use crate::resource_metrics::api::{self as metrics, NodeMetrics, PodMetrics};
use crate::resource_metrics::summary::Summary;

/// Node agents scraped at once.
pub const CONCURRENCY: usize = 32;
/// How long one node agent has to answer.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Rounds a node's last answer is served after it stopped answering.
pub const MAX_AGE_ROUNDS: u32 = 3;
/// The largest summary read from a node agent.
const SUMMARY_LIMIT: usize = 16 << 20;

/// What requests read: the last round's metrics.
#[derive(Default)]
struct Snapshot {
    nodes: BTreeMap<String, Arc<NodeMetrics>>,
    /// namespace -> name -> metrics.
    pods: BTreeMap<String, BTreeMap<String, Arc<PodMetrics>>>,
}

/// The served metrics, shared by the scraper and the handlers.
#[derive(Default)]
pub struct MetricsStore {
    snapshot: RwLock<Arc<Snapshot>>,
}

impl MetricsStore {
    fn current(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A node's last good answer.
struct Scraped {
    at: Instant,
    node: Option<Arc<NodeMetrics>>,
    pods: Vec<Arc<PodMetrics>>,
}

/// A node to scrape: name, labels, kubelet URL.
struct Target {
    name: String,
    labels: Option<BTreeMap<String, String>>,
    kubelet: String,
}

fn ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn labels_of(obj: &Value) -> Option<BTreeMap<String, String>> {
    obj.pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
}

/// Every node in the cache, and the Ready ones to scrape.
fn targets(ctx: &Ctx) -> Result<(Vec<String>, Vec<Target>), ApiError> {
    let nodes = registry::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("nodes"))?;
    let everything: crate::store::cache::Filter = Arc::new(|_| true);
    let page = ctx
        .resource_cache(nodes)?
        .list(&nodes.prefix(), &everything, None, None);
    let mut names = Vec::with_capacity(page.items.len());
    let mut targets = Vec::new();
    for node in page.items.iter().filter_map(|o| o.value().ok()) {
        let Some(name) = node.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        names.push(name.to_string());
        if !ready(&node) {
            continue;
        }
        if let Some(kubelet) = super::kubelet::kubelet_of(&node) {
            targets.push(Target {
                name: name.to_string(),
                labels: labels_of(&node),
                kubelet,
            });
        }
    }
    Ok((names, targets))
}

async fn scrape(ctx: &Ctx, target: &Target) -> Result<Summary, String> {
    let url = format!("{}/stats/summary?only_cpu_and_memory=true", target.kubelet);
    let body = tokio::time::timeout(
        SCRAPE_TIMEOUT,
        super::proxy::get_body(&ctx.kubelet_tls, &url, SUMMARY_LIMIT),
    )
    .await
    .map_err(|_| format!("no answer within {SCRAPE_TIMEOUT:?}"))?
    .map_err(|e| e.message)?;
    serde_json::from_slice(&body).map_err(|e| format!("the summary does not parse: {e}"))
}

/// A node's summary as metrics, each pod with the labels the cache has for it (pods the
/// cache no longer has, or has with another uid, are left out).
fn convert(ctx: &Ctx, target: &Target, summary: &Summary, window: &str) -> Scraped {
    let pods_resource = registry::find("", "v1", "pods");
    let cache = pods_resource.and_then(|r| ctx.resource_cache(r).ok().map(|c| (r, c)));
    let pods = summary
        .pods
        .iter()
        .filter_map(|p| {
            let (r, cache) = cache.as_ref()?;
            let key = r.key(Some(&p.pod_ref.namespace), &p.pod_ref.name);
            let pod = cache.get(&key).ok()??.value().ok()?;
            if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(&p.pod_ref.uid) {
                return None;
            }
            metrics::pod_metrics(p, labels_of(&pod), window).map(Arc::new)
        })
        .collect();
    Scraped {
        at: Instant::now(),
        node: metrics::node_metrics(summary, target.labels.clone(), window).map(Arc::new),
        pods,
    }
}

/// Scrapes every Ready node every `every` until `stop`, into `store`.
pub async fn run(
    ctx: Arc<Ctx>,
    store: Arc<MetricsStore>,
    every: Duration,
    stop: CancellationToken,
) {
    let window = format!("{}s", every.as_secs().max(1));
    let mut known: HashMap<String, Scraped> = HashMap::new();
    loop {
        let started = Instant::now();
        tokio::select! {
            _ = round(&ctx, &store, &mut known, every, &window) => {}
            _ = stop.cancelled() => return,
        }
        ctx.metrics
            .metrics_scrape_round(started.elapsed().as_secs_f64());
        tokio::select! {
            _ = tokio::time::sleep(every.saturating_sub(started.elapsed())) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// One scrape of every Ready node; then what is known (answers younger than
/// [`MAX_AGE_ROUNDS`] periods, of nodes that still exist) becomes the served snapshot.
async fn round(
    ctx: &Arc<Ctx>,
    store: &MetricsStore,
    known: &mut HashMap<String, Scraped>,
    every: Duration,
    window: &str,
) {
    let (names, targets) = match targets(ctx) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e.message, "listing nodes to scrape failed");
            return;
        }
    };
    let answers: Vec<(Target, Result<Summary, String>)> = futures::stream::iter(targets)
        .map(|t| async move {
            let answer = scrape(ctx, &t).await;
            (t, answer)
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for (target, answer) in answers {
        match answer {
            Ok(summary) => {
                ctx.metrics.metrics_scrape("ok");
                let scraped = convert(ctx, &target, &summary, window);
                known.insert(target.name, scraped);
            }
            Err(e) => {
                ctx.metrics.metrics_scrape("error");
                tracing::warn!(node = %target.name, error = %e, "scraping the node's resource metrics failed");
            }
        }
    }
    let names: HashSet<String> = names.into_iter().collect();
    let max_age = every * MAX_AGE_ROUNDS;
    known.retain(|name, s| names.contains(name) && s.at.elapsed() < max_age);
    let mut snapshot = Snapshot::default();
    for (name, s) in known.iter() {
        if let Some(n) = &s.node {
            snapshot.nodes.insert(name.clone(), n.clone());
        }
        for p in &s.pods {
            let (Some(ns), Some(pod)) = (&p.metadata.namespace, &p.metadata.name) else {
                continue;
            };
            snapshot
                .pods
                .entry(ns.clone())
                .or_default()
                .insert(pod.clone(), p.clone());
        }
    }
    ctx.metrics.metrics_nodes(snapshot.nodes.len() as i64);
    *store.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
}

fn selected(selector: &LabelSelector, meta: &ObjectMeta) -> bool {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    selector.matches(meta.labels.as_ref().unwrap_or(&NONE))
}

fn list<T: serde::Serialize>(kind: &str, items: Vec<&T>) -> Resp {
    output::ok(&json!({
        "kind": kind,
        "apiVersion": metrics::API_VERSION,
        "metadata": {},
        "items": items,
    }))
}

fn object<T: serde::Serialize>(item: &T) -> Result<Resp, ApiError> {
    serde_json::to_value(item)
        .map(|v| output::ok(&v))
        .map_err(ApiError::internal)
}

/// `GET` of nodes and pods of metrics.k8s.io: get by name, or list (label selector); watch
/// is not supported, as with metrics-server.
pub async fn serve(ctx: &Arc<Ctx>, call: &Call<'_>) -> Result<Resp, ApiError> {
    if *call.method != Method::GET || call.path.subresource.is_some() {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            call.method
        )));
    }
    let opts = ListOptions::from_query(call.query)?;
    if opts.watch {
        return Err(ApiError::method_not_allowed(
            "watch is not supported on metrics.k8s.io",
        ));
    }
    let selector = LabelSelector::parse(opts.label_selector.as_deref().unwrap_or(""))?;
    let snapshot = ctx.metrics_api.current();
    let nodes = call.resource.kind == "NodeMetrics";
    match (&call.path.name, nodes) {
        (Some(name), true) => snapshot
            .nodes
            .get(name)
            .ok_or_else(|| call.not_found(name))
            .and_then(|n| object(n.as_ref())),
        (Some(name), false) => snapshot
            .pods
            .get(call.namespace().unwrap_or_default())
            .and_then(|ns| ns.get(name))
            .ok_or_else(|| call.not_found(name))
            .and_then(|p| object(p.as_ref())),
        (None, true) => Ok(list(
            "NodeMetricsList",
            snapshot
                .nodes
                .values()
                .filter(|n| selected(&selector, &n.metadata))
                .map(Arc::as_ref)
                .collect(),
        )),
        (None, false) => {
            let in_scope: Vec<&BTreeMap<String, Arc<PodMetrics>>> = match call.namespace() {
                Some(ns) => snapshot.pods.get(ns).into_iter().collect(),
                None => snapshot.pods.values().collect(),
            };
            Ok(list(
                "PodMetricsList",
                in_scope
                    .into_iter()
                    .flat_map(|m| m.values())
                    .filter(|p| selected(&selector, &p.metadata))
                    .map(Arc::as_ref)
                    .collect(),
            ))
        }
    }
}
