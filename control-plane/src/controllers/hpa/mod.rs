//! The horizontal-pod-autoscaler controller (kube-controller-manager's): every sync period
//! (--horizontal-pod-autoscaler-sync-period, 15 s) per HorizontalPodAutoscaler, it reads the
//! target's scale subresource (replicas and selector), the PodMetrics of the selected pods
//! from metrics.k8s.io through the API (as the real controller does) and the pods from the
//! shared informer, computes each Resource metric's proposal ([`replicas`]), takes the
//! largest, normalizes it ([`behavior`]: stabilization windows, scaling policies, [min, max]),
//! writes the new scale, and reports status (currentReplicas, desiredReplicas,
//! currentMetrics, lastScaleTime, conditions AbleToScale / ScalingActive / ScalingLimited)
//! and Events (SuccessfulRescale, FailedGetResourceMetric, FailedGetScale, FailedRescale).
//! Each HPA's recommendations and scale events live in memory ([`behavior::History`]), keyed
//! by HPA: a sync reads one HPA's pods through the label index, never a relist.

pub mod behavior;
pub mod replicas;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::{
    HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus,
    MetricSpec, MetricStatus, MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Client, ResourceExt};
use serde::Deserialize;

use super::{pods, Context};
use crate::machinery::kinds::hpa::{AVERAGE_VALUE, UTILIZATION};
use crate::machinery::quantity::{Format, Quantity};
use crate::machinery::LabelSelector;
use crate::resource_metrics::api::PodMetrics;
use crate::runtime::controller::api_code;
use crate::runtime::flags::parse_duration;
use crate::runtime::{
    Action, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler, Recorder,
    WorkQueue,
};
use behavior::{History, Normalized};
use replicas::{Sample, Target};

pub const NAME: &str = "horizontal-pod-autoscaler";

/// kube-controller-manager's --horizontal-pod-autoscaler-sync-period default.
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(15);

/// How many HPAs are synced at once (--concurrent-horizontal-pod-autoscaler-syncs).
const WORKERS: usize = 5;

pub struct HpaController {
    client: Client,
    hpas: Informer<HorizontalPodAutoscaler>,
    pods: Informer<Pod>,
    recorder: Recorder,
    sync_period: Duration,
    history: Mutex<HashMap<ObjectKey, History>>,
}

pub fn build(ctx: &Context) -> Controller<HpaController> {
    let hpas = ctx.informers.get::<HorizontalPodAutoscaler>();
    let pods = ctx.informers.get::<Pod>();
    super::index_pods(&pods);
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let q = queue.clone();
    // A new HPA or a new spec is synced at once; the controller's own status writes are
    // not (the periodic sync follows every HPA).
    hpas.on_change(move |c| {
        let spec_changed = match c {
            crate::runtime::Change::Added(_) => true,
            crate::runtime::Change::Updated { old, new } => {
                old.metadata.generation != new.metadata.generation
            }
            crate::runtime::Change::Deleted(_) => true,
        };
        if spec_changed {
            q.add(ObjectKey::of(c.object().as_ref()));
        }
    });
    Controller::new(
        NAME,
        Arc::new(HpaController {
            client: ctx.client.clone(),
            hpas,
            pods,
            recorder: ctx.events.recorder("horizontal-pod-autoscaler"),
            sync_period: ctx.settings.hpa_sync_period,
            history: Mutex::new(HashMap::new()),
        }),
        queue,
        WORKERS,
        ctx.metrics.clone(),
    )
}

/// The resource behind a scale target reference (Kubernetes asks its REST mapper; the
/// scalable kinds skiff serves are these).
fn scale_resource(api_version: &str, kind: &str) -> Option<ApiResource> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match (group, kind) {
        ("apps", "Deployment") => "deployments",
        ("apps", "ReplicaSet") => "replicasets",
        ("apps", "StatefulSet") => "statefulsets",
        ("", "ReplicationController") => "replicationcontrollers",
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

#[derive(Deserialize)]
struct PodMetricsList {
    items: Vec<PodMetrics>,
}

/// What the metrics of one sync found.
struct Computed {
    replicas: i32,
    /// The metric that proposed the count (`cpu resource utilization (percentage of
    /// request)`).
    metric: String,
    statuses: Vec<MetricStatus>,
}

/// A metric the controller could not compute: the Event reason and its message.
struct MetricFailure {
    reason: &'static str,
    message: String,
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
) -> (String, String, String, String) {
    (
        type_.to_string(),
        if status { "True" } else { "False" }.to_string(),
        reason.to_string(),
        message.into(),
    )
}

type Cond = (String, String, String, String);

/// Sets conditions, keeping a condition's lastTransitionTime while its status holds.
fn set_conditions(
    existing: Option<Vec<HorizontalPodAutoscalerCondition>>,
    updates: &[Cond],
    now: Timestamp,
) -> Vec<HorizontalPodAutoscalerCondition> {
    let mut out = existing.unwrap_or_default();
    for (type_, status, reason, message) in updates {
        let new = HorizontalPodAutoscalerCondition {
            type_: type_.clone(),
            status: status.clone(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            last_transition_time: Some(Time(now)),
        };
        match out.iter_mut().find(|c| &c.type_ == type_) {
            Some(c) => {
                let since = if &c.status == status {
                    c.last_transition_time.clone()
                } else {
                    new.last_transition_time.clone()
                };
                *c = HorizontalPodAutoscalerCondition {
                    last_transition_time: since,
                    ..new
                };
            }
            None => out.push(new),
        }
    }
    out
}

fn milli_quantity(milli: i64) -> KQuantity {
    KQuantity(Quantity::from_milli(milli, Format::DecimalSI).to_string())
}

impl HpaController {
    async fn get_scale(
        &self,
        hpa: &HorizontalPodAutoscaler,
        ns: &str,
    ) -> Result<(Api<DynamicObject>, Scale), String> {
        let target = &hpa
            .spec
            .as_ref()
            .map(|s| s.scale_target_ref.clone())
            .unwrap_or_default();
        let api_version = target.api_version.clone().unwrap_or_default();
        let Some(ar) = scale_resource(&api_version, &target.kind) else {
            let group = api_version.split_once('/').map_or("", |(g, _)| g);
            return Err(format!(
                "unable to determine resource for scale target reference: no matches for kind \"{}\" in group \"{group}\"",
                target.kind
            ));
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &ar);
        match api.get_scale(&target.name).await {
            Ok(s) => Ok((api, s)),
            Err(e) => Err(format!(
                "the HPA controller was unable to get the target's current scale: {}",
                pods::error_message(&e)
            )),
        }
    }

    async fn pod_metrics(
        &self,
        ns: &str,
        selector: &str,
        resource: &str,
    ) -> Result<BTreeMap<String, Sample>, String> {
        let req = kube::core::Request::new(format!(
            "/apis/{}/namespaces/{ns}/pods",
            crate::resource_metrics::api::API_VERSION
        ))
        .list(&ListParams::default().labels(selector))
        .map_err(|e| e.to_string())?;
        let list: PodMetricsList = self
            .client
            .request(req)
            .await
            .map_err(|e| pods::error_message(&e))?;
        if list.items.is_empty() {
            return Err("no metrics returned from resource metrics API".into());
        }
        let mut out = BTreeMap::new();
        'pods: for m in list.items {
            let mut sum = 0i64;
            for c in &m.containers {
                let Some(q) = c
                    .usage
                    .get(resource)
                    .and_then(|q| Quantity::try_from(q).ok())
                else {
                    continue 'pods;
                };
                sum = sum.saturating_add(q.milli_value());
            }
            let window = parse_duration(&m.window).unwrap_or(Duration::from_secs(15));
            out.insert(
                m.metadata.name.clone().unwrap_or_default(),
                Sample {
                    milli: sum,
                    timestamp: m.timestamp.0,
                    window,
                },
            );
        }
        Ok(out)
    }

    /// The pods the selector picks, through the smallest label bucket of the informer.
    fn selected_pods(&self, ns: &str, selector: &LabelSelector) -> Vec<Arc<Pod>> {
        let bucket = selector
            .requirements()
            .iter()
            .filter_map(|r| {
                let value = selector.required_value(r.key())?;
                Some(pods::label_index_value(ns, r.key(), value))
            })
            .min_by_key(|b| self.pods.count_by_index(pods::BY_LABEL, b));
        let candidates = match bucket {
            Some(b) => self.pods.by_index(pods::BY_LABEL, &b),
            None => self.pods.in_namespace(ns),
        };
        candidates
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(ns) && selector.matches(p.labels()))
            .collect()
    }

    /// Each metric's proposal, the largest kept (computeReplicasForMetrics).
    async fn compute(
        &self,
        ns: &str,
        metrics: &[MetricSpec],
        selector: &str,
        current: i32,
        now: Timestamp,
    ) -> Result<Computed, MetricFailure> {
        let parsed = LabelSelector::parse(selector).map_err(|e| MetricFailure {
            reason: "InvalidSelector",
            message: format!(
                "couldn't convert selector into a corresponding internal selector object: {}",
                e.message
            ),
        })?;
        let pods = self.selected_pods(ns, &parsed);
        let refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let mut best: Option<(i32, String)> = None;
        let mut statuses = Vec::new();
        let mut failure = None;
        for spec in metrics {
            let Some(r) = spec.resource.as_ref().filter(|_| spec.type_ == "Resource") else {
                failure.get_or_insert(MetricFailure {
                    reason: "InvalidMetricSourceType",
                    message: format!(
                        "the HPA does not support metric source type {:?} yet",
                        spec.type_
                    ),
                });
                continue;
            };
            let (target, what, name) = match r.target.type_.as_str() {
                UTILIZATION => (
                    Target::Utilization(r.target.average_utilization.unwrap_or(0)),
                    "utilization",
                    format!("{} resource utilization (percentage of request)", r.name),
                ),
                AVERAGE_VALUE => (
                    Target::AverageValue(
                        r.target
                            .average_value
                            .as_ref()
                            .and_then(|q| Quantity::try_from(q).ok())
                            .map_or(0, |q| q.milli_value()),
                    ),
                    "usage",
                    format!("{} resource", r.name),
                ),
                other => {
                    failure.get_or_insert(MetricFailure {
                        reason: "FailedGetResourceMetric",
                        message: format!(
                            "invalid resource metric source: unsupported target type {other:?}"
                        ),
                    });
                    continue;
                }
            };
            let samples = match self.pod_metrics(ns, selector, &r.name).await {
                Ok(s) => Ok(s),
                Err(e) => Err(format!(
                    "unable to get metrics for resource {}: {e}",
                    r.name
                )),
            };
            let proposal = samples.and_then(|s| {
                replicas::propose(current, target, &r.name, &refs, &s, now)
                    .map_err(|e| e.to_string())
            });
            match proposal {
                Ok(p) => {
                    statuses.push(MetricStatus {
                        type_: "Resource".into(),
                        resource: Some(ResourceMetricStatus {
                            name: r.name.clone(),
                            current: MetricValueStatus {
                                average_utilization: p.utilization,
                                average_value: Some(milli_quantity(p.average_milli)),
                                value: None,
                            },
                        }),
                        ..Default::default()
                    });
                    if best.as_ref().is_none_or(|(n, _)| p.replicas > *n) {
                        best = Some((p.replicas, name));
                    }
                }
                Err(e) => {
                    failure.get_or_insert(MetricFailure {
                        reason: "FailedGetResourceMetric",
                        message: format!("failed to get {} {what}: {e}", r.name),
                    });
                }
            }
        }
        match (best, failure) {
            // Kubernetes scales on the valid metrics unless an invalid one could only have
            // asked for fewer replicas; it never scales down with a metric missing.
            (Some((replicas, metric)), None) => Ok(Computed {
                replicas,
                metric,
                statuses,
            }),
            (Some((replicas, metric)), Some(_)) if replicas > current => Ok(Computed {
                replicas,
                metric,
                statuses,
            }),
            (_, Some(f)) => Err(f),
            (None, None) => Err(MetricFailure {
                reason: "FailedComputeMetricsReplicas",
                message: "no metrics to compute a replica count from".into(),
            }),
        }
    }

    async fn write_status(
        &self,
        hpa: &HorizontalPodAutoscaler,
        status: HorizontalPodAutoscalerStatus,
    ) -> Result<(), ReconcileError> {
        if hpa.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let api: Api<HorizontalPodAutoscaler> =
            Api::namespaced(self.client.clone(), &hpa.namespace().unwrap_or_default());
        let patch = serde_json::json!({"status": status});
        match api
            .patch_status(
                &hpa.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Reconciler for HpaController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(hpa) = self.hpas.get(key) else {
            self.history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
            return Ok(Action::AwaitChange);
        };
        if hpa.metadata.deletion_timestamp.is_some() {
            return Ok(Action::AwaitChange);
        }
        let next = Action::RequeueAfter(self.sync_period);
        let ns = key.namespace_or_empty().to_string();
        let now = Timestamp::now();
        let spec = hpa.spec.clone().unwrap_or_default();
        let old = hpa.status.clone().unwrap_or_default();
        let mut status = HorizontalPodAutoscalerStatus {
            current_replicas: old.current_replicas,
            desired_replicas: old.desired_replicas,
            current_metrics: old.current_metrics.clone(),
            last_scale_time: old.last_scale_time.clone(),
            observed_generation: hpa.metadata.generation,
            conditions: old.conditions.clone(),
        };
        let (scale_api, scale) = match self.get_scale(&hpa, &ns).await {
            Ok(s) => s,
            Err(message) => {
                self.recorder
                    .event(hpa.as_ref(), EventType::Warning, "FailedGetScale", &message);
                status.conditions = Some(set_conditions(
                    status.conditions.take(),
                    &[condition("AbleToScale", false, "FailedGetScale", &message)],
                    now,
                ));
                self.write_status(&hpa, status).await?;
                return Ok(next);
            }
        };
        let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let selector = scale
            .status
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        status.current_replicas = Some(current);
        let mut conds: Vec<Cond> = vec![condition(
            "AbleToScale",
            true,
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale",
        )];
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        let mut desired;
        let reason: String;
        let mut metric_statuses = None;
        if current == 0 && min != 0 {
            desired = 0;
            reason = String::new();
            conds.push(condition(
                "ScalingActive",
                false,
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero",
            ));
        } else if current > max {
            desired = max;
            reason = "Current number of replicas above Spec.MaxReplicas".into();
        } else if current < min {
            desired = min;
            reason = "Current number of replicas below Spec.MinReplicas".into();
        } else {
            if selector.is_empty() {
                let message = "selector is required";
                self.recorder.event(
                    hpa.as_ref(),
                    EventType::Warning,
                    "SelectorRequired",
                    message,
                );
                conds.push(condition(
                    "ScalingActive",
                    false,
                    "InvalidSelector",
                    "the HPA target's scale is missing a selector",
                ));
                status.conditions = Some(set_conditions(status.conditions.take(), &conds, now));
                self.write_status(&hpa, status).await?;
                return Ok(next);
            }
            let metrics = spec.metrics.clone().unwrap_or_default();
            let computed = match self.compute(&ns, &metrics, &selector, current, now).await {
                Ok(c) => c,
                Err(f) => {
                    self.recorder
                        .event(hpa.as_ref(), EventType::Warning, f.reason, &f.message);
                    conds.push(condition(
                        "ScalingActive",
                        false,
                        f.reason,
                        format!(
                            "the HPA was unable to compute the replica count: {}",
                            f.message
                        ),
                    ));
                    status.conditions = Some(set_conditions(status.conditions.take(), &conds, now));
                    status.desired_replicas = current;
                    self.write_status(&hpa, status).await?;
                    return Ok(next);
                }
            };
            conds.push(condition(
                "ScalingActive",
                true,
                "ValidMetricFound",
                format!(
                    "the HPA was able to successfully calculate a replica count from {}",
                    computed.metric
                ),
            ));
            metric_statuses = Some(computed.statuses);
            let normalized: Normalized = {
                let mut all = self.history.lock().unwrap_or_else(|e| e.into_inner());
                let h = all.entry(key.clone()).or_default();
                h.init(current, now);
                match spec.behavior.as_ref() {
                    Some(b) => {
                        h.normalize_with_behavior(b, current, computed.replicas, min, max, now)
                    }
                    None => h.normalize(current, computed.replicas, min, max, now),
                }
            };
            conds[0] = condition(
                "AbleToScale",
                true,
                normalized.able.reason,
                normalized.able.message,
            );
            conds.push(condition(
                "ScalingLimited",
                normalized.limited.0,
                normalized.limited.1.reason,
                normalized.limited.1.message,
            ));
            desired = normalized.replicas;
            reason = if desired > current {
                format!("{} above target", computed.metric)
            } else {
                "All metrics below target".into()
            };
        }
        if desired != current {
            let patch = serde_json::json!({"spec": {"replicas": desired}});
            let name = &spec.scale_target_ref.name;
            match scale_api
                .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.recorder.event(
                        hpa.as_ref(),
                        EventType::Normal,
                        "SuccessfulRescale",
                        format!("New size: {desired}; reason: {reason}"),
                    );
                    tracing::info!(hpa = %key, from = current, to = desired, %reason, "rescaled");
                    self.history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(key.clone())
                        .or_default()
                        .record_scale(spec.behavior.as_ref(), current, desired, now);
                    conds[0] = condition(
                        "AbleToScale",
                        true,
                        "SucceededRescale",
                        format!(
                            "the HPA controller was able to update the target scale to {desired}"
                        ),
                    );
                    status.last_scale_time = Some(Time(now));
                }
                Err(e) => {
                    let message = pods::error_message(&e);
                    self.recorder.event(
                        hpa.as_ref(),
                        EventType::Warning,
                        "FailedRescale",
                        format!("New size: {desired}; reason: {reason}; error: {message}"),
                    );
                    conds[0] = condition(
                        "AbleToScale",
                        false,
                        "FailedUpdateScale",
                        format!(
                            "the HPA controller was unable to update the target scale: {message}"
                        ),
                    );
                    desired = current;
                }
            }
        }
        status.desired_replicas = desired;
        if metric_statuses.is_some() {
            status.current_metrics = metric_statuses.filter(|m| !m.is_empty());
        }
        status.conditions = Some(set_conditions(status.conditions.take(), &conds, now));
        self.write_status(&hpa, status).await?;
        Ok(next)
    }
}
