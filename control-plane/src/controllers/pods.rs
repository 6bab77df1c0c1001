//! What controllers ask of a pod (Kubernetes' podutil): is it active, ready, available for
//! minReadySeconds; and making pods from a template with a controller reference, with the
//! SuccessfulCreate / FailedCreate / SuccessfulDelete Events every workload controller emits.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use crate::runtime::controller::api_code;
use crate::runtime::{EventType, ObjectKey, ReconcileError, Recorder};

/// Index of pods by `spec.nodeName`.
pub const BY_NODE: &str = "node";

/// Index of pods by `<namespace>/<label>=<value>` for each label (services' selectors).
pub const BY_LABEL: &str = "label";

pub fn index_by_node(p: &Pod) -> Vec<String> {
    node_name(p).map(str::to_string).into_iter().collect()
}

pub fn index_by_label(p: &Pod) -> Vec<String> {
    let ns = p.namespace().unwrap_or_default();
    p.labels()
        .iter()
        .map(|(k, v)| label_index_value(&ns, k, v))
        .collect()
}

pub fn label_index_value(namespace: &str, key: &str, value: &str) -> String {
    format!("{namespace}/{key}={value}")
}

pub fn node_name(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

pub fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// Not finished and not being deleted (podutil's IsPodActive).
pub fn is_active(p: &Pod) -> bool {
    !matches!(phase(p), "Succeeded" | "Failed") && !is_terminating(p)
}

pub fn condition<'a>(p: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn is_ready(p: &Pod) -> bool {
    condition(p, "Ready").is_some_and(|c| c.status == "True")
}

/// When the pod last became ready (None unless ready now).
pub fn ready_since(p: &Pod) -> Option<Timestamp> {
    condition(p, "Ready")
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// Ready for at least `min_ready` by `now` (podutil's IsPodAvailable).
pub fn is_available(p: &Pod, min_ready: Duration, now: Timestamp) -> bool {
    if !is_ready(p) {
        return false;
    }
    if min_ready.is_zero() {
        return true;
    }
    ready_since(p).is_some_and(|t| elapsed(t, now) > min_ready)
}

/// `now - then`, zero if `then` is later.
pub fn elapsed(then: Timestamp, now: Timestamp) -> Duration {
    let nanos = now.as_nanosecond() - then.as_nanosecond();
    Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX))
}

/// The most restarts of any of the pod's containers.
pub fn max_restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
        .unwrap_or(0)
}

/// A pod for `template`, named `<prefix>-<random>` by the server, controlled by `owner`.
pub fn from_template(
    template: &PodTemplateSpec,
    namespace: &str,
    prefix: &str,
    owner: OwnerReference,
    extra_labels: &BTreeMap<String, String>,
) -> Pod {
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.extend(extra_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            namespace: Some(namespace.to_string()),
            labels: Some(labels).filter(|l| !l.is_empty()),
            annotations: meta.annotations,
            finalizers: meta.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Creates `pod`, recording SuccessfulCreate or FailedCreate on the owner.
pub async fn create(
    client: &Client,
    recorder: &Recorder,
    owner: &k8s_openapi::api::core::v1::ObjectReference,
    pod: &Pod,
) -> Result<Pod, ReconcileError> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), pod).await {
        Ok(created) => {
            recorder.event_ref(
                owner.clone(),
                EventType::Normal,
                "SuccessfulCreate",
                format!("Created pod: {}", created.name_any()),
            );
            Ok(created)
        }
        Err(e) => {
            // A terminating namespace refuses new pods; that is not the controller's failure.
            if api_code(&e) != Some(403) {
                recorder.event_ref(
                    owner.clone(),
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error creating: {}", error_message(&e)),
                );
            }
            Err(e.into())
        }
    }
}

/// Deletes a pod, recording SuccessfulDelete or FailedDelete on the owner. A pod already
/// gone counts as deleted.
pub async fn delete(
    client: &Client,
    recorder: &Recorder,
    owner: &k8s_openapi::api::core::v1::ObjectReference,
    pod: &ObjectKey,
    uid: Option<String>,
) -> Result<(), ReconcileError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), pod.namespace_or_empty());
    let dp = DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name, &dp).await {
        Ok(_) => {
            recorder.event_ref(
                owner.clone(),
                EventType::Normal,
                "SuccessfulDelete",
                format!("Deleted pod: {}", pod.name),
            );
            Ok(())
        }
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        Err(e) => {
            recorder.event_ref(
                owner.clone(),
                EventType::Warning,
                "FailedDelete",
                format!("Error deleting: {}", error_message(&e)),
            );
            Err(e.into())
        }
    }
}

/// The server's message for an API error, the error itself otherwise.
pub fn error_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Runs `n` operations in batches of 1, 2, 4, ... (client-go's slowStartBatch), stopping
/// after the first batch with a failure, so a systematic error (quota, a bad template) costs
/// one request instead of `n`. Returns how many succeeded and the first error.
pub async fn slow_start_batch<F, Fut>(n: usize, mut op: F) -> (usize, Option<ReconcileError>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ReconcileError>>,
{
    let mut remaining = n;
    let mut batch = remaining.min(1);
    let mut successes = 0;
    while batch > 0 {
        let results = futures::future::join_all((0..batch).map(|_| op())).await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(()) => successes += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if first_error.is_some() {
            return (successes, first_error);
        }
        remaining -= batch;
        batch = (2 * batch).min(remaining);
    }
    (successes, None)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn ready_pod(since: i64) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(Timestamp::from_second(since).unwrap())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn available_after_min_ready_seconds() {
        let p = ready_pod(1000);
        let now = Timestamp::from_second(1010).unwrap();
        assert!(is_available(&p, Duration::ZERO, now));
        assert!(is_available(&p, Duration::from_secs(5), now));
        assert!(!is_available(&p, Duration::from_secs(10), now));
        assert!(!is_available(&Pod::default(), Duration::ZERO, now));
        assert!(is_active(&p));
        let mut done = p.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(!is_active(&done));
    }

    #[tokio::test]
    async fn slow_start_stops_after_the_first_failing_batch() {
        let calls = AtomicUsize::new(0);
        let (ok, err) = slow_start_batch(10, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                // Batches 1, 2, 4: the 5th call (in the third batch) fails.
                if n == 4 {
                    Err(ReconcileError::Retry("quota".into()))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 7);
        assert_eq!(ok, 6);
        assert!(err.is_some());
        let (ok, err) = slow_start_batch(5, || async { Ok(()) }).await;
        assert_eq!((ok, err.is_none()), (5, true));
    }
}
