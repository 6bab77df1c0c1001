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
    HorizontalPodAutoscaler, HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricValueStatus,
    ResourceMetricStatus,
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

/// What one sync decided, before anything is written: from the target's scale, the spec and
/// what the metrics gave, without the API.
#[derive(Debug, PartialEq)]
struct Decision {
    /// status.desiredReplicas (None: kept as it was); the target is rescaled to it when it
    /// differs from the current count.
    desired: Option<i32>,
    /// Why that count (the SuccessfulRescale message's reason).
    reason: String,
    /// AbleToScale first, then ScalingActive and ScalingLimited as the sync found them.
    conds: Vec<Cond>,
    /// status.currentMetrics, when the metrics were read.
    metrics: Option<Vec<MetricStatus>>,
    /// A Warning Event: its reason and message.
    warning: Option<(&'static str, String)>,
}

fn got_scale() -> Cond {
    condition(
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
    )
}

/// The decision made before any metric is read (Kubernetes' reconcileAutoscaler): a target
/// scaled to zero is left alone, a count outside [min, max] is brought inside, a scale
/// without a selector stops the sync; None when the metrics decide.
fn decide_without_metrics(current: i32, min: i32, max: i32, selector: &str) -> Option<Decision> {
    let bounded = |desired: i32, reason: &str, conds: Vec<Cond>| Decision {
        desired: Some(desired),
        reason: reason.to_string(),
        conds,
        metrics: None,
        warning: None,
    };
    Some(if current == 0 && min != 0 {
        bounded(
            0,
            "",
            vec![
                got_scale(),
                condition(
                    "ScalingActive",
                    false,
                    "ScalingDisabled",
                    "scaling is disabled since the replica count of the target is zero",
                ),
            ],
        )
    } else if current > max {
        bounded(
            max,
            "Current number of replicas above Spec.MaxReplicas",
            vec![got_scale()],
        )
    } else if current < min {
        bounded(
            min,
            "Current number of replicas below Spec.MinReplicas",
            vec![got_scale()],
        )
    } else if selector.is_empty() {
        Decision {
            desired: None,
            reason: String::new(),
            conds: vec![
                got_scale(),
                condition(
                    "ScalingActive",
                    false,
                    "InvalidSelector",
                    "the HPA target's scale is missing a selector",
                ),
            ],
            metrics: None,
            warning: Some(("SelectorRequired", "selector is required".into())),
        }
    } else {
        return None;
    })
}

/// The decision from the metrics: their proposal normalized with this HPA's history
/// (stabilization windows, scaling policies, [min, max]); a metric failure keeps the count.
fn decide_from_metrics(
    current: i32,
    min: i32,
    max: i32,
    behavior: Option<&HorizontalPodAutoscalerBehavior>,
    computed: Result<Computed, MetricFailure>,
    history: &mut History,
    now: Timestamp,
) -> Decision {
    let computed = match computed {
        Ok(c) => c,
        Err(f) => {
            return Decision {
                desired: Some(current),
                reason: String::new(),
                conds: vec![
                    got_scale(),
                    condition(
                        "ScalingActive",
                        false,
                        f.reason,
                        format!(
                            "the HPA was unable to compute the replica count: {}",
                            f.message
                        ),
                    ),
                ],
                metrics: None,
                warning: Some((f.reason, f.message)),
            }
        }
    };
    history.init(current, now);
    let normalized: Normalized = match behavior {
        Some(b) => history.normalize_with_behavior(b, current, computed.replicas, min, max, now),
        None => history.normalize(current, computed.replicas, min, max, now),
    };
    let desired = normalized.replicas;
    Decision {
        desired: Some(desired),
        reason: if desired > current {
            format!("{} above target", computed.metric)
        } else {
            "All metrics below target".into()
        },
        conds: vec![
            condition(
                "AbleToScale",
                true,
                normalized.able.reason,
                normalized.able.message,
            ),
            condition(
                "ScalingActive",
                true,
                "ValidMetricFound",
                format!(
                    "the HPA was able to successfully calculate a replica count from {}",
                    computed.metric
                ),
            ),
            condition(
                "ScalingLimited",
                normalized.limited.0,
                normalized.limited.1.reason,
                normalized.limited.1.message,
            ),
        ],
        metrics: Some(computed.statuses),
        warning: None,
    }
}

/// The outcome of writing the decided scale: AbleToScale, the count status reports (the
/// current one if the write failed) and the Event to record.
fn rescaled(
    d: &mut Decision,
    current: i32,
    written: Result<(), String>,
) -> (EventType, &'static str, String) {
    let desired = d.desired.unwrap_or(current);
    match written {
        Ok(()) => {
            d.conds[0] = condition(
                "AbleToScale",
                true,
                "SucceededRescale",
                format!("the HPA controller was able to update the target scale to {desired}"),
            );
            (
                EventType::Normal,
                "SuccessfulRescale",
                format!("New size: {desired}; reason: {}", d.reason),
            )
        }
        Err(message) => {
            d.conds[0] = condition(
                "AbleToScale",
                false,
                "FailedUpdateScale",
                format!("the HPA controller was unable to update the target scale: {message}"),
            );
            d.desired = Some(current);
            (
                EventType::Warning,
                "FailedRescale",
                format!(
                    "New size: {desired}; reason: {}; error: {message}",
                    d.reason
                ),
            )
        }
    }
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
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        let mut decision = match decide_without_metrics(current, min, max, &selector) {
            Some(d) => d,
            None => {
                let metrics = spec.metrics.clone().unwrap_or_default();
                let computed = self.compute(&ns, &metrics, &selector, current, now).await;
                let mut all = self.history.lock().unwrap_or_else(|e| e.into_inner());
                let h = all.entry(key.clone()).or_default();
                decide_from_metrics(current, min, max, spec.behavior.as_ref(), computed, h, now)
            }
        };
        if let Some((reason, message)) = &decision.warning {
            self.recorder
                .event(hpa.as_ref(), EventType::Warning, reason, message);
        }
        if let Some(desired) = decision.desired.filter(|d| *d != current) {
            let patch = serde_json::json!({"spec": {"replicas": desired}});
            let name = &spec.scale_target_ref.name;
            let written = scale_api
                .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| pods::error_message(&e));
            let ok = written.is_ok();
            let (type_, reason, message) = rescaled(&mut decision, current, written);
            self.recorder.event(hpa.as_ref(), type_, reason, message);
            if ok {
                tracing::info!(hpa = %key, from = current, to = desired, reason = %decision.reason, "rescaled");
                self.history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(key.clone())
                    .or_default()
                    .record_scale(spec.behavior.as_ref(), current, desired, now);
                status.last_scale_time = Some(Time(now));
            }
        }
        if let Some(desired) = decision.desired {
            status.desired_replicas = desired;
        }
        if decision.metrics.is_some() {
            status.current_metrics = decision.metrics.filter(|m| !m.is_empty());
        }
        status.conditions = Some(set_conditions(
            status.conditions.take(),
            &decision.conds,
            now,
        ));
        self.write_status(&hpa, status).await?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::autoscaling::v2::HPAScalingRules;

    const CPU: &str = "cpu resource utilization (percentage of request)";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// One CPU metric at `utilization` percent, proposing `replicas`.
    fn cpu(replicas: i32, utilization: i32) -> Result<Computed, MetricFailure> {
        Ok(Computed {
            replicas,
            metric: CPU.into(),
            statuses: vec![MetricStatus {
                type_: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: "cpu".into(),
                    current: MetricValueStatus {
                        average_utilization: Some(utilization),
                        average_value: Some(milli_quantity(i64::from(utilization) / 2)),
                        value: None,
                    },
                }),
                ..Default::default()
            }],
        })
    }

    /// Type, status and reason of each condition, in order.
    fn conds(d: &Decision) -> Vec<(&str, &str, &str)> {
        d.conds
            .iter()
            .map(|(t, s, r, _)| (t.as_str(), s.as_str(), r.as_str()))
            .collect()
    }

    fn scale_down_window(seconds: i32) -> HorizontalPodAutoscalerBehavior {
        HorizontalPodAutoscalerBehavior {
            scale_down: Some(HPAScalingRules {
                stabilization_window_seconds: Some(seconds),
                ..Default::default()
            }),
            scale_up: None,
        }
    }

    #[test]
    fn bounds_and_selector_decide_before_any_metric() {
        let zero = decide_without_metrics(0, 1, 3, "app=web").unwrap();
        assert_eq!(zero.desired, Some(0));
        assert_eq!(
            conds(&zero),
            [
                ("AbleToScale", "True", "SucceededGetScale"),
                ("ScalingActive", "False", "ScalingDisabled")
            ]
        );

        let above = decide_without_metrics(5, 1, 3, "app=web").unwrap();
        assert_eq!(above.desired, Some(3));
        assert_eq!(
            above.reason,
            "Current number of replicas above Spec.MaxReplicas"
        );
        assert_eq!(above.warning, None);
        let below = decide_without_metrics(1, 2, 3, "app=web").unwrap();
        assert_eq!(below.desired, Some(2));
        assert_eq!(
            below.reason,
            "Current number of replicas below Spec.MinReplicas"
        );
        // Bounds come first: a scale without a selector is still brought inside them.
        assert_eq!(
            decide_without_metrics(5, 1, 3, "").unwrap().desired,
            Some(3)
        );

        let no_selector = decide_without_metrics(2, 1, 3, "").unwrap();
        assert_eq!(no_selector.desired, None, "desiredReplicas is kept");
        assert_eq!(
            no_selector.warning,
            Some(("SelectorRequired", "selector is required".to_string()))
        );
        assert_eq!(
            conds(&no_selector),
            [
                ("AbleToScale", "True", "SucceededGetScale"),
                ("ScalingActive", "False", "InvalidSelector")
            ]
        );

        // Inside the bounds with a selector, and minReplicas 0 at zero: the metrics decide.
        assert_eq!(decide_without_metrics(2, 1, 3, "app=web"), None);
        assert_eq!(decide_without_metrics(0, 0, 3, "app=web"), None);
    }

    #[test]
    fn a_metric_above_target_scales_up_to_max_and_says_so() {
        let mut h = History::default();
        let d = decide_from_metrics(1, 1, 3, None, cpu(6, 600), &mut h, t(0));
        assert_eq!(d.desired, Some(3));
        assert_eq!(d.reason, format!("{CPU} above target"));
        assert_eq!(
            conds(&d),
            [
                ("AbleToScale", "True", "ReadyForNewScale"),
                ("ScalingActive", "True", "ValidMetricFound"),
                ("ScalingLimited", "True", "TooManyReplicas")
            ]
        );
        assert_eq!(
            d.conds[1].3,
            format!("the HPA was able to successfully calculate a replica count from {CPU}")
        );
        let metrics = d.metrics.as_ref().unwrap();
        assert_eq!(
            metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .current
                .average_utilization,
            Some(600)
        );
        assert_eq!(d.warning, None);

        // Inside the range: not limited.
        let mut h = History::default();
        let d = decide_from_metrics(1, 1, 5, None, cpu(2, 120), &mut h, t(0));
        assert_eq!(d.desired, Some(2));
        assert_eq!(d.conds[2].1, "False");
        assert_eq!(d.conds[2].2, "DesiredWithinRange");
    }

    #[test]
    fn scale_down_waits_out_the_default_window_but_not_a_zero_one() {
        // No behavior: the recommendations of the last 5 minutes hold the count up.
        let mut h = History::default();
        let d = decide_from_metrics(3, 1, 3, None, cpu(1, 2), &mut h, t(0));
        assert_eq!(d.desired, Some(3));
        assert_eq!(d.conds[0].2, "ScaleDownStabilized");
        let d = decide_from_metrics(3, 1, 3, None, cpu(1, 2), &mut h, t(301));
        assert_eq!(d.desired, Some(1));

        // The same with a behavior whose scale-down window is 5 minutes (the default)...
        let mut h = History::default();
        let b = scale_down_window(300);
        let d = decide_from_metrics(3, 1, 3, Some(&b), cpu(1, 2), &mut h, t(0));
        assert_eq!(d.desired, Some(3));
        assert_eq!(d.conds[0].2, "ScaleDownStabilized");

        // ...and at once with a window of 0 (100% of the pods may go in 15 s by default).
        let mut h = History::default();
        let b = scale_down_window(0);
        let d = decide_from_metrics(3, 1, 3, Some(&b), cpu(1, 2), &mut h, t(0));
        assert_eq!(d.desired, Some(1));
        assert_eq!(d.reason, "All metrics below target");
        assert_eq!(
            conds(&d),
            [
                ("AbleToScale", "True", "ReadyForNewScale"),
                ("ScalingActive", "True", "ValidMetricFound"),
                ("ScalingLimited", "False", "DesiredWithinRange")
            ]
        );
    }

    #[test]
    fn a_metric_failure_keeps_the_count_and_warns() {
        let mut h = History::default();
        let failure = MetricFailure {
            reason: "FailedGetResourceMetric",
            message: "failed to get cpu utilization: no metrics returned from resource metrics API"
                .into(),
        };
        let d = decide_from_metrics(2, 1, 3, None, Err(failure), &mut h, t(0));
        assert_eq!(d.desired, Some(2));
        assert_eq!(d.metrics, None, "currentMetrics is kept");
        assert_eq!(
            d.warning,
            Some((
                "FailedGetResourceMetric",
                "failed to get cpu utilization: no metrics returned from resource metrics API"
                    .to_string()
            ))
        );
        assert_eq!(
            conds(&d),
            [
                ("AbleToScale", "True", "SucceededGetScale"),
                ("ScalingActive", "False", "FailedGetResourceMetric")
            ]
        );
        assert!(d.conds[1]
            .3
            .starts_with("the HPA was unable to compute the replica count: failed to get cpu"));
    }

    #[test]
    fn the_rescale_outcome_sets_able_to_scale_and_the_event() {
        let mut h = History::default();
        let mut d = decide_from_metrics(1, 1, 3, None, cpu(3, 300), &mut h, t(0));
        let (type_, reason, message) = rescaled(&mut d, 1, Ok(()));
        assert_eq!((type_, reason), (EventType::Normal, "SuccessfulRescale"));
        assert_eq!(message, format!("New size: 3; reason: {CPU} above target"));
        assert_eq!(d.desired, Some(3));
        assert_eq!(
            d.conds[0],
            condition(
                "AbleToScale",
                true,
                "SucceededRescale",
                "the HPA controller was able to update the target scale to 3"
            )
        );

        let mut h = History::default();
        let mut d = decide_from_metrics(1, 1, 3, None, cpu(3, 300), &mut h, t(0));
        let (type_, reason, message) = rescaled(&mut d, 1, Err("conflict".into()));
        assert_eq!((type_, reason), (EventType::Warning, "FailedRescale"));
        assert_eq!(
            message,
            format!("New size: 3; reason: {CPU} above target; error: conflict")
        );
        assert_eq!(
            d.desired,
            Some(1),
            "status reports the count it could not change"
        );
        assert_eq!(conds(&d)[0], ("AbleToScale", "False", "FailedUpdateScale"));
    }

    #[test]
    fn conditions_keep_their_transition_time_while_their_status_holds() {
        let first = set_conditions(
            None,
            &[
                condition("AbleToScale", true, "SucceededGetScale", "a"),
                condition("ScalingActive", true, "ValidMetricFound", "b"),
            ],
            t(0),
        );
        let next = set_conditions(
            Some(first),
            &[
                condition("AbleToScale", true, "SucceededRescale", "c"),
                condition("ScalingActive", false, "FailedGetResourceMetric", "d"),
                condition("ScalingLimited", false, "DesiredWithinRange", "e"),
            ],
            t(15),
        );
        let at = |type_: &str| {
            let c = next.iter().find(|c| c.type_ == type_).unwrap();
            (
                c.reason.clone().unwrap(),
                c.last_transition_time.as_ref().unwrap().0,
            )
        };
        assert_eq!(next.len(), 3);
        assert_eq!(at("AbleToScale"), ("SucceededRescale".into(), t(0)));
        assert_eq!(
            at("ScalingActive"),
            ("FailedGetResourceMetric".into(), t(15))
        );
        assert_eq!(at("ScalingLimited"), ("DesiredWithinRange".into(), t(15)));
    }
}
