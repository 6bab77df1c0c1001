//! batch/v1 Jobs end to end against a real in-process API server, the controllers and the
//! scheduler, with nodes played through the API (their pods exit with the code a test asks
//! for): completions and parallelism, the backoff limit (failures and, under OnFailure, the
//! kubelet's restart counts), Indexed Jobs, podFailurePolicy, the active deadline,
//! suspension, finalizer-based counting across a controller restart, the TTL after finishing,
//! and the real kubectl (`create job`, `wait --for=condition=complete`, `get jobs`).

mod controllers_support;

use std::collections::BTreeSet;
use std::time::Duration;

use controllers_support::{fast_settings, Cluster, EXIT_CODE};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(180);
const TRACKING: &str = "batch.kubernetes.io/job-tracking";

/// A Job whose pods exit with `code` under `restart`.
fn job(name: &str, spec: serde_json::Value, code: i32, restart: &str) -> Job {
    let mut spec = spec;
    spec["template"] = json!({
        "metadata": {"annotations": {EXIT_CODE: code.to_string()}},
        "spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}]},
    });
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn condition(j: &Job, type_: &str) -> Option<(String, String)> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// Waits for the Job's terminal condition of `type_`; returns the Job.
async fn wait_for(jobs: &Api<Job>, name: &str, type_: &str) -> Job {
    wait_until_async(&format!("job {name} {type_}"), WAIT, || async {
        let j = jobs.get(name).await.unwrap();
        match condition(&j, type_) {
            Some(_) => Ok(j),
            None => Err(j.status),
        }
    })
    .await
}

async fn job_pods(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .unwrap()
        .items
}

async fn reasons(c: &Cluster, name: &str) -> BTreeSet<String> {
    let events: Api<Event> = c.api("default");
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

/// Waits until the object's Events include every reason in `want` (Events are written in the
/// background, after the change they report).
async fn wait_reasons(c: &Cluster, name: &str, want: &[&str]) {
    wait_until_async(&format!("{want:?} events on {name}"), WAIT, || async {
        let got = reasons(c, name).await;
        want.iter()
            .all(|w| got.contains(*w))
            .then_some(())
            .ok_or(got)
    })
    .await
}

#[tokio::test]
async fn five_completions_two_at_a_time() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let jobs: Api<Job> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    // Count the Job's live pods at every change: never more than parallelism.
    let watch_pods = pods.clone();
    let most = tokio::spawn(async move {
        let mut live = std::collections::HashMap::new();
        let mut most = 0;
        let stream = watcher(
            watch_pods,
            watcher::Config::default().labels("batch.kubernetes.io/job-name=five"),
        )
        .default_backoff()
        .applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(Ok(p))) = tokio::time::timeout(
            Duration::from_secs(5),
            futures::StreamExt::next(&mut stream),
        )
        .await
        {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let running = p.metadata.deletion_timestamp.is_none()
                && phase != "Succeeded"
                && phase != "Failed";
            live.insert(p.name_any(), running);
            most = most.max(live.values().filter(|r| **r).count());
        }
        most
    });
    jobs.create(
        &PostParams::default(),
        &job(
            "five",
            json!({"completions": 5, "parallelism": 2}),
            0,
            "Never",
        ),
    )
    .await
    .unwrap();
    let done = wait_for(&jobs, "five", "Complete").await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.succeeded, Some(5));
    assert_eq!(status.failed.unwrap_or(0), 0);
    assert_eq!(status.active.unwrap_or(0), 0);
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert_eq!(
        condition(&done, "Complete").unwrap().0,
        "CompletionsReached"
    );
    assert!(condition(&done, "SuccessCriteriaMet").is_some());
    let ps = job_pods(&pods, "five").await;
    assert_eq!(ps.len(), 5, "one pod per completion");
    assert!(
        ps.iter()
            .all(|p| !p.finalizers().iter().any(|f| f == TRACKING)),
        "every counted pod is released"
    );
    assert!(most.await.unwrap() <= 2, "parallelism 2 held");
    wait_reasons(&c, "five", &["SuccessfulCreate", "Completed"]).await;
    c.shutdown().await;
}

#[tokio::test]
async fn failing_pods_stop_at_the_backoff_limit() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let jobs: Api<Job> = c.api("default");
    jobs.create(
        &PostParams::default(),
        &job("fails", json!({"backoffLimit": 1}), 3, "Never"),
    )
    .await
    .unwrap();
    let failed = wait_for(&jobs, "fails", "Failed").await;
    let (reason, message) = condition(&failed, "Failed").unwrap();
    assert_eq!(reason, "BackoffLimitExceeded");
    assert_eq!(message, "Job has reached the specified backoff limit");
    let status = failed.status.unwrap();
    assert_eq!(
        status.failed,
        Some(2),
        "backoffLimit 1: the second failure ends it"
    );
    assert_eq!(status.succeeded.unwrap_or(0), 0);
    wait_reasons(&c, "fails", &["BackoffLimitExceeded"]).await;

    // Under OnFailure the kubelet restarts the container; its restart count is what counts.
    jobs.create(
        &PostParams::default(),
        &job("restarts", json!({"backoffLimit": 2}), 1, "OnFailure"),
    )
    .await
    .unwrap();
    let failed = wait_for(&jobs, "restarts", "Failed").await;
    assert_eq!(
        condition(&failed, "Failed").unwrap().0,
        "BackoffLimitExceeded"
    );
    let pods: Api<Pod> = c.api("default");
    wait_until_async("the restarting pod deleted", WAIT, || async {
        let n = job_pods(&pods, "restarts").await.len();
        (n == 0).then_some(()).ok_or(n)
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn indexed_job_runs_each_index_once() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let jobs: Api<Job> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    let mut j = job(
        "idx",
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
        0,
        "Never",
    );
    j.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .subdomain = Some("workers".into());
    jobs.create(&PostParams::default(), &j).await.unwrap();
    let done = wait_for(&jobs, "idx", "Complete").await;
    let status = done.status.unwrap();
    assert_eq!(status.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!(status.succeeded, Some(3));
    let ps = job_pods(&pods, "idx").await;
    let mut seen: Vec<(String, String)> = ps
        .iter()
        .map(|p| {
            let index = p.annotations()["batch.kubernetes.io/job-completion-index"].clone();
            let spec = p.spec.as_ref().unwrap();
            assert_eq!(
                p.labels()["batch.kubernetes.io/job-completion-index"],
                index
            );
            assert!(p.name_any().starts_with(&format!("idx-{index}-")));
            assert_eq!(spec.subdomain.as_deref(), Some("workers"));
            let env = spec.containers[0].env.as_ref().unwrap();
            assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"));
            (index, spec.hostname.clone().unwrap_or_default())
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [("0", "idx-0"), ("1", "idx-1"), ("2", "idx-2")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    c.shutdown().await;
}

#[tokio::test]
async fn pod_failure_policy_fails_the_job_on_an_exit_code() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let jobs: Api<Job> = c.api("default");
    jobs.create(
        &PostParams::default(),
        &job(
            "pfp",
            json!({"completions": 2, "parallelism": 1, "backoffLimit": 6, "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]}}),
            42,
            "Never",
        ),
    )
    .await
    .unwrap();
    let failed = wait_for(&jobs, "pfp", "Failed").await;
    let (reason, message) = condition(&failed, "Failed").unwrap();
    assert_eq!(reason, "PodFailurePolicy");
    assert!(
        message.contains("failed with exit code 42 matching FailJob rule at index 0"),
        "{message}"
    );
    assert_eq!(
        failed.status.unwrap().failed,
        Some(1),
        "one failure was enough"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn active_deadline_and_suspension() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let jobs: Api<Job> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    // Pods that never finish (no exit code): the deadline fails the Job and removes them.
    let mut slow = job(
        "slow",
        json!({"completions": 1, "activeDeadlineSeconds": 2}),
        0,
        "Never",
    );
    slow.spec.as_mut().unwrap().template.metadata = None;
    jobs.create(&PostParams::default(), &slow).await.unwrap();
    let failed = wait_for(&jobs, "slow", "Failed").await;
    assert_eq!(condition(&failed, "Failed").unwrap().0, "DeadlineExceeded");
    assert!(job_pods(&pods, "slow")
        .await
        .iter()
        .all(|p| p.metadata.deletion_timestamp.is_some()
            || p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")));

    // Created suspended: no pods, condition Suspended; resumed: it runs and completes.
    let mut s = job(
        "later",
        json!({"completions": 2, "parallelism": 2, "suspend": true}),
        0,
        "Never",
    );
    s.spec.as_mut().unwrap().suspend = Some(true);
    jobs.create(&PostParams::default(), &s).await.unwrap();
    let suspended = wait_for(&jobs, "later", "Suspended").await;
    assert_eq!(
        condition(&suspended, "Suspended").unwrap().0,
        "JobSuspended"
    );
    assert!(suspended.status.unwrap().start_time.is_none());
    assert!(job_pods(&pods, "later").await.is_empty());
    jobs.patch(
        "later",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    let done = wait_for(&jobs, "later", "Complete").await;
    assert!(condition(&done, "Suspended").is_none());
    assert_eq!(done.status.unwrap().succeeded, Some(2));
    wait_reasons(&c, "later", &["Suspended", "Resumed"]).await;
    c.shutdown().await;
}

#[tokio::test]
async fn finished_pods_are_counted_once_across_a_controller_restart() {
    let mut c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let jobs: Api<Job> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    // Pods that run until the test lets them exit.
    let mut j = job(
        "keep",
        json!({"completions": 4, "parallelism": 4}),
        0,
        "Never",
    );
    j.spec.as_mut().unwrap().template.metadata = None;
    jobs.create(&PostParams::default(), &j).await.unwrap();
    wait_until_async("4 running pods", WAIT, || async {
        let running = job_pods(&pods, "keep")
            .await
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        (running == 4).then_some(()).ok_or(running)
    })
    .await;
    // The controller is away while the pods finish: they keep their finalizers.
    c.stop_controllers().await;
    for p in job_pods(&pods, "keep").await {
        let patch = json!({"status": {"phase": "Succeeded"}});
        pods.patch_status(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    }
    assert!(job_pods(&pods, "keep")
        .await
        .iter()
        .all(|p| p.finalizers().iter().any(|f| f == TRACKING)));
    c.start_controllers(fast_settings()).await;
    let done = wait_for(&jobs, "keep", "Complete").await;
    assert_eq!(
        done.status.unwrap().succeeded,
        Some(4),
        "each pod counted exactly once"
    );
    assert_eq!(
        job_pods(&pods, "keep").await.len(),
        4,
        "and none created anew"
    );
    c.shutdown().await;
}

#[tokio::test]
async fn finished_jobs_go_after_their_ttl_with_their_pods() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let jobs: Api<Job> = c.api("default");
    let pods: Api<Pod> = c.api("default");
    jobs.create(
        &PostParams::default(),
        &job("brief", json!({"ttlSecondsAfterFinished": 1}), 0, "Never"),
    )
    .await
    .unwrap();
    wait_for(&jobs, "brief", "Complete").await;
    wait_until_async("the Job and its pod gone", WAIT, || async {
        let job = jobs.get_opt("brief").await.unwrap();
        let left = job_pods(&pods, "brief").await.len();
        (job.is_none() && left == 0).then_some(()).ok_or(left)
    })
    .await;
    c.shutdown().await;
}

// kubectl runs synchronously: other workers keep the played nodes going meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_waits_for_and_lists_jobs() {
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(Duration::from_secs(180));
    k.ok(&[
        "create",
        "job",
        "hello",
        "--image=busybox",
        "--",
        "echo",
        "hi",
    ]);
    // The played node lets a pod exit when annotated; kubectl made a plain one, so exit it
    // by hand once it runs.
    let pods: Api<Pod> = c.api("default");
    let pod = wait_until_async("the Job's pod running", WAIT, || async {
        job_pods(&pods, "hello")
            .await
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .ok_or("not yet")
    })
    .await;
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    let out = k.ok(&[
        "wait",
        "--for=condition=complete",
        "job/hello",
        "--timeout=180s",
    ]);
    assert!(out.contains("job.batch/hello condition met"), "{out}");
    let table = k.ok(&["get", "jobs"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["hello", "Complete", "1/1"]);
    let wide = k.ok(&["get", "job", "hello", "-o", "wide"]);
    assert!(
        wide.contains("batch.kubernetes.io/controller-uid="),
        "{wide}"
    );
    let bad = k.run(&["create", "job", "Bad_Name", "--image=busybox"]);
    assert!(!bad.success);
    c.shutdown().await;
}

// A CronJob every minute: Jobs named by their minute, history kept to its limit, the
// active list and last schedule time in its status; and kubectl's `create job --from`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_job_every_minute_creates_jobs_and_keeps_history() {
    use k8s_openapi::api::batch::v1::CronJob;
    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let cron_jobs: Api<CronJob> = c.api("default");
    let jobs: Api<Job> = c.api("default");
    let cj: CronJob = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "tick"},
        "spec": {"schedule": "*/1 * * * *", "timeZone": "Europe/Berlin", "successfulJobsHistoryLimit": 1,
            "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {EXIT_CODE: "0"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
    }))
    .unwrap();
    cron_jobs.create(&PostParams::default(), &cj).await.unwrap();
    let owned = |jobs: Vec<Job>| -> Vec<Job> {
        jobs.into_iter()
            .filter(|j| {
                j.owner_references()
                    .iter()
                    .any(|r| r.name == "tick" && r.controller == Some(true))
            })
            .collect()
    };
    // Two scheduled runs (at most two minutes), each completing.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let first_two = wait_until_async(
        "two scheduled Jobs completed",
        Duration::from_secs(150),
        || {
            let (jobs, seen) = (jobs.clone(), seen.clone());
            async move {
                let listed = owned(jobs.list(&ListParams::default()).await.unwrap().items);
                let mut seen = seen.lock().unwrap();
                for j in listed {
                    if condition(&j, "Complete").is_some() {
                        seen.insert(j.name_any());
                    }
                }
                (seen.len() >= 2).then(|| seen.clone()).ok_or(seen.len())
            }
        },
    )
    .await;
    for name in &first_two {
        let minutes: i64 = name.strip_prefix("tick-").unwrap().parse().unwrap();
        assert!(
            minutes > 28_000_000,
            "named by minutes since the epoch: {name}"
        );
    }
    // History: only the newest successful Job stays.
    wait_until_async("history trimmed to 1", WAIT, || async {
        let left: Vec<String> = owned(jobs.list(&ListParams::default()).await.unwrap().items)
            .iter()
            .filter(|j| condition(j, "Complete").is_some())
            .map(|j| j.name_any())
            .collect();
        (left.len() == 1).then_some(()).ok_or(left)
    })
    .await;
    let status = cron_jobs.get("tick").await.unwrap().status.unwrap();
    assert!(status.last_schedule_time.is_some());
    assert!(status.last_successful_time.is_some());
    wait_reasons(
        &c,
        "tick",
        &["SuccessfulCreate", "SawCompletedJob", "SuccessfulDelete"],
    )
    .await;
    let one = owned(jobs.list(&ListParams::default()).await.unwrap().items).remove(0);
    assert!(
        one.annotations()["batch.kubernetes.io/cronjob-scheduled-timestamp"].ends_with("+01:00")
            || one.annotations()["batch.kubernetes.io/cronjob-scheduled-timestamp"]
                .ends_with("+02:00")
    );

    // kubectl: the CronJob's columns, and a Job made from it by hand.
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(Duration::from_secs(180));
    let table = k.ok(&["get", "cronjobs"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]
    );
    assert!(table.contains("Europe/Berlin"), "{table}");
    k.ok(&["create", "job", "manual", "--from=cronjob/tick"]);
    let manual = jobs.get("manual").await.unwrap();
    assert_eq!(
        manual.annotations()["cronjob.kubernetes.io/instantiate"],
        "manual"
    );
    wait_for(&jobs, "manual", "Complete").await;
    // Suspended: no more Jobs are created.
    cron_jobs
        .patch(
            "tick",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let out = k.ok(&["get", "cronjob", "tick", "-o", "jsonpath={.spec.suspend}"]);
    assert_eq!(out, "true");
    c.shutdown().await;
}

/// The Jobs CronJob `cj` controls now, oldest minute first.
async fn owned_by(jobs: &Api<Job>, cj: &str) -> Vec<Job> {
    let mut owned: Vec<Job> = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|j| {
            j.owner_references()
                .iter()
                .any(|r| r.kind == "CronJob" && r.name == cj && r.controller == Some(true))
        })
        .collect();
    owned.sort_by_key(minute_of);
    owned
}

/// The scheduled minute (since the epoch) a CronJob's Job is named by.
fn minute_of(j: &Job) -> i64 {
    let name = j.name_any();
    name.rsplit_once('-')
        .and_then(|(_, m)| m.parse().ok())
        .unwrap_or_else(|| panic!("not a scheduled Job's name: {name}"))
}

// concurrencyPolicy Forbid and Replace, suspend, failedJobsHistoryLimit and
// startingDeadlineSeconds, all seen at the same minute boundary, CronJobs side by side. Each
// is told (through its status, the controller's own record) that it last ran two minutes
// ago, so a missed time is due at once and the first Jobs start without waiting for a
// boundary; the next minute boundary is then the one every policy is seen at, so the test
// costs at most about a minute. Pods without an exit code run until deleted (the played
// node never ends them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_job_policies_suspend_history_and_deadline_at_the_next_minute() {
    use k8s_openapi::api::batch::v1::CronJob;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    let c = Cluster::start(fast_settings(), &["node-1"]).await;
    let cron_jobs: Api<CronJob> = c.api("default");
    let jobs: Api<Job> = c.api("default");

    // Every Job any CronJob made, with the last state it was seen in, from a watch: a Job
    // that came and went between two lists is still seen.
    type Seen = Arc<Mutex<BTreeMap<String, BTreeMap<String, &'static str>>>>;
    let seen: Seen = Default::default();
    let watching = {
        let (jobs, seen) = (jobs.clone(), seen.clone());
        tokio::spawn(async move {
            let stream = watcher(jobs, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(j) = futures::StreamExt::next(&mut stream).await {
                let Ok(j) = j else { continue };
                let Some(owner) = j
                    .owner_references()
                    .iter()
                    .find(|r| r.kind == "CronJob" && r.controller == Some(true))
                    .map(|r| r.name.clone())
                else {
                    continue;
                };
                let state = if condition(&j, "Failed").is_some() {
                    "Failed"
                } else if condition(&j, "Complete").is_some() {
                    "Complete"
                } else {
                    "Running"
                };
                seen.lock()
                    .unwrap()
                    .entry(owner)
                    .or_default()
                    .insert(j.name_any(), state);
            }
        })
    };
    let made = |cj: &str| -> BTreeMap<String, &'static str> {
        seen.lock().unwrap().get(cj).cloned().unwrap_or_default()
    };

    let cron_job = |name: &str, extra: serde_json::Value, exit: Option<i32>| -> CronJob {
        let annotations = match exit {
            Some(code) => json!({EXIT_CODE: code.to_string()}),
            None => json!({}),
        };
        let mut v = json!({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": name},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}},
        });
        v["spec"]
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    };
    let now = Timestamp::now();
    let m = now.as_second().div_euclid(60);
    // Two that run only at the minutes either side of this one: the one before is due at
    // once, more than a minute late, which startingDeadlineSeconds 30 forbids.
    let around = format!(
        "{},{} * * * *",
        (m - 1).rem_euclid(60),
        (m + 1).rem_euclid(60)
    );
    for cj in [
        cron_job(
            "deadline",
            json!({"schedule": around, "startingDeadlineSeconds": 30}),
            None,
        ),
        cron_job("nodeadline", json!({"schedule": around}), None),
        cron_job("forbid", json!({"concurrencyPolicy": "Forbid"}), None),
        cron_job("replace", json!({"concurrencyPolicy": "Replace"}), None),
        cron_job("paused", json!({"suspend": true}), None),
        cron_job("failing", json!({"failedJobsHistoryLimit": 1}), Some(1)),
    ] {
        cron_jobs.create(&PostParams::default(), &cj).await.unwrap();
    }
    let two_minutes_ago = Timestamp::from_second(m * 60 - 120).unwrap();
    let last_run = json!({"status": {"lastScheduleTime": two_minutes_ago.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}});
    for name in [
        "deadline",
        "nodeadline",
        "forbid",
        "replace",
        "paused",
        "failing",
    ] {
        cron_jobs
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&last_run))
            .await
            .unwrap();
    }

    // The first Job of each running CronJob, for the minute that was due at once.
    let first = |cj: &'static str| {
        let made = &made;
        async move {
            wait_until_async(&format!("{cj}'s first Job"), WAIT, || async {
                made(cj).into_keys().next().ok_or("none yet")
            })
            .await
        }
    };
    let (forbid_1, replace_1, failing_1, late) = tokio::join!(
        first("forbid"),
        first("replace"),
        first("failing"),
        first("nodeadline")
    );
    let minute = |name: &str| -> i64 { name.rsplit_once('-').unwrap().1.parse().unwrap() };
    // Without a deadline the minute before runs, late as it is.
    assert_eq!(minute(&late), m - 1, "{late}");

    let deadline = async {
        // With one, it is left out; the next scheduled minute runs on time.
        let on_time = wait_until_async("the deadline CronJob's Job", WAIT, || async {
            owned_by(&jobs, "deadline")
                .await
                .into_iter()
                .next()
                .ok_or("none yet")
        })
        .await;
        assert_eq!(minute_of(&on_time), m + 1, "{}", on_time.name_any());
        assert_eq!(
            made("deadline").into_keys().collect::<Vec<_>>(),
            [on_time.name_any()],
            "the late minute never ran"
        );
        let created = on_time.metadata.creation_timestamp.clone().unwrap().0;
        assert!(
            created.as_second() - (m + 1) * 60 <= 30,
            "within the deadline"
        );
    };

    let forbid = async {
        // Forbid: at the next minute the first Job still runs, so none is started; the
        // controller says why with Kubernetes' event, and the time stays unrun.
        wait_reasons(&c, "forbid", &["JobAlreadyActive"]).await;
        assert!(
            Timestamp::now().as_second() >= (minute(&forbid_1) + 1) * 60,
            "skipped at the next minute"
        );
        let owned = owned_by(&jobs, "forbid").await;
        let names: Vec<String> = owned.iter().map(|j| j.name_any()).collect();
        assert_eq!(names, std::slice::from_ref(&forbid_1), "still the one Job");
        assert_eq!(
            made("forbid").into_keys().collect::<Vec<_>>(),
            std::slice::from_ref(&forbid_1),
            "no second Job ever existed"
        );
        let status = cron_jobs.get("forbid").await.unwrap().status.unwrap();
        assert_eq!(
            status.last_schedule_time.unwrap().0.as_second(),
            minute(&forbid_1) * 60,
            "the skipped time is not recorded as run"
        );
        let active: Vec<String> = status
            .active
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| r.name)
            .collect();
        assert_eq!(active, std::slice::from_ref(&forbid_1));
        let events: Api<Event> = c.api("default");
        let skipped = events
            .list(&ListParams::default().fields("involvedObject.name=forbid"))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("JobAlreadyActive"))
            .unwrap();
        assert_eq!(skipped.type_.as_deref(), Some("Normal"));
        assert_eq!(
            skipped.message.as_deref(),
            Some("Not starting job because prior execution is running and concurrency policy is Forbid")
        );
    };

    let replace = async {
        // Replace: at the next minute the running Job is deleted and the new one created.
        let second = wait_until_async("the replacing Job alone", WAIT, || async {
            let owned = owned_by(&jobs, "replace").await;
            match &owned[..] {
                [j] if j.name_any() != replace_1 => Ok(j.clone()),
                _ => Err(owned.iter().map(|j| j.name_any()).collect::<Vec<_>>()),
            }
        })
        .await;
        assert_eq!(minute_of(&second), minute(&replace_1) + 1);
        assert!(
            jobs.get_opt(&replace_1).await.unwrap().is_none(),
            "the replaced Job is deleted"
        );
        assert_eq!(
            made("replace").get(&replace_1),
            Some(&"Running"),
            "it was running when replaced"
        );
        wait_reasons(&c, "replace", &["SuccessfulDelete", "SuccessfulCreate"]).await;
        let active: Vec<String> = cron_jobs
            .get("replace")
            .await
            .unwrap()
            .status
            .unwrap()
            .active
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| r.name)
            .collect();
        assert_eq!(active, [second.name_any()]);
        second
    };

    let failing = async {
        // failedJobsHistoryLimit 1: the first failed Job stays alone until the second
        // fails, then goes.
        let kept = wait_until_async("one failed Job kept, the older deleted", WAIT, || async {
            let owned = owned_by(&jobs, "failing").await;
            match &owned[..] {
                [j] if j.name_any() != failing_1 && condition(j, "Failed").is_some() => {
                    Ok(j.clone())
                }
                _ => Err(owned.iter().map(|j| j.name_any()).collect::<Vec<_>>()),
            }
        })
        .await;
        assert_eq!(minute_of(&kept), minute(&failing_1) + 1);
        assert_eq!(made("failing").get(&failing_1), Some(&"Failed"));
        wait_reasons(&c, "failing", &["SawCompletedJob", "SuccessfulDelete"]).await;
        assert_eq!(
            owned_by(&jobs, "failing").await.len(),
            1,
            "the limit's one is kept"
        );
    };
    let ((), replacing, (), ()) = tokio::join!(forbid, replace, failing, deadline);

    // Suspended: its due time was there from the start and the next minute has passed
    // (the others' Jobs for it exist), yet it never made a Job nor recorded a run.
    assert!(made("paused").is_empty(), "{:?}", made("paused"));
    assert!(owned_by(&jobs, "paused").await.is_empty());
    let status = cron_jobs.get("paused").await.unwrap().status.unwrap();
    assert_eq!(
        status.last_schedule_time.unwrap().0,
        two_minutes_ago,
        "no run recorded while suspended"
    );
    // Resumed: the most recent missed time runs at once.
    cron_jobs
        .patch(
            "paused",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap();
    let resumed = wait_until_async("the resumed CronJob's Job", WAIT, || async {
        owned_by(&jobs, "paused")
            .await
            .into_iter()
            .next()
            .ok_or("none yet")
    })
    .await;
    assert!(minute_of(&resumed) >= minute_of(&replacing));
    watching.abort();
    c.shutdown().await;
}
