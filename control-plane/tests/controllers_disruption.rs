//! PodDisruptionBudgets against a real in-process API server, the disruption controller
//! in-process and nodes played through the API (see controllers_support): the status the
//! controller keeps (expectedPods from the Deployment's scale, percentages rounded up), the
//! eviction subresource answering 429 with Kubernetes' Status while a budget would break,
//! spending one disruption per eviction otherwise, dry runs changing nothing, two budgets
//! refused with 500; and the real kubectl 1.33 draining a node one pod at a time under a
//! budget, or reporting the refusal when the budget allows nothing.

mod controllers_support;

use std::time::Duration;

use controllers_support::{deployment, fast_settings, Cluster};
use http::{Method, Request};
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(90);

fn budget(name: &str, app: &str, spec: Value) -> PodDisruptionBudget {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": app}});
    serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// The pods of `app` not being deleted.
async fn live_pods(c: &Cluster, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = c.api("default");
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until `n` pods of `app` are Ready and not terminating.
async fn ready_pods(c: &Cluster, app: &str, n: usize) -> Vec<Pod> {
    wait_until_async(&format!("{n} ready pods of {app}"), WAIT, || async {
        let pods = live_pods(c, app).await;
        let ready: Vec<Pod> = pods.iter().filter(|p| ready(p)).cloned().collect();
        (ready.len() == n && pods.len() == n)
            .then_some(ready)
            .ok_or(pods.len())
    })
    .await
}

/// Waits until the budget's status (as JSON) satisfies `want`.
async fn status_where(c: &Cluster, name: &str, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let api: Api<PodDisruptionBudget> = c.api("default");
    wait_until_async(what, WAIT, || async {
        let b = api.get(name).await.map_err(|e| e.to_string())?;
        let s = serde_json::to_value(b.status).unwrap();
        if want(&s) {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .await
}

/// The admin's client without kube's retries of 429 (which would hide the refusal behind
/// minutes of back-off): the test sees each answer as it is.
async fn without_retries(c: &Cluster) -> Client {
    let kc = kube::config::Kubeconfig::read_from(c.server().kubeconfig_path()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

/// POSTs an Eviction for `pod` (with `query`), answers (HTTP code, body).
async fn evict(client: &Client, pod: &str, query: &str) -> (u16, Value) {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "default"}});
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!(
            "/api/v1/namespaces/default/pods/{pod}/eviction{query}"
        ))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Whether the pod is gone or going.
async fn terminating(c: &Cluster, pod: &str) -> bool {
    let api: Api<Pod> = c.api("default");
    api.get_opt(pod)
        .await
        .unwrap()
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_keep_status_and_evictions_spend_it() {
    let mut c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &deployment("web", 3))
        .await
        .unwrap();
    let pods = ready_pods(&c, "web", 3).await;
    let client = without_retries(&c).await;

    // Created with kubectl (protobuf), listed with kubectl's columns.
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(WAIT);
    k.ok(&[
        "create",
        "poddisruptionbudget",
        "web",
        "--selector=app=web",
        "--min-available=2",
    ]);
    let s = status_where(&c, "web", "the budget's status", |s| {
        s["disruptionsAllowed"] == 1 && s["currentHealthy"] == 3
    })
    .await;
    assert_eq!(s["desiredHealthy"], 2, "{s}");
    assert_eq!(s["expectedPods"], 3, "{s}");
    assert_eq!(s["observedGeneration"], 1, "{s}");
    assert_eq!(s["conditions"][0]["type"], "DisruptionAllowed", "{s}");
    assert_eq!(s["conditions"][0]["status"], "True", "{s}");
    assert_eq!(s["conditions"][0]["reason"], "SufficientPods", "{s}");
    let table = k.ok(&["get", "pdb", "web"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "MIN AVAILABLE",
            "MAX UNAVAILABLE",
            "ALLOWED DISRUPTIONS",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["web", "2", "N/A", "1"], "{table}");

    // A dry-run eviction answers Success and changes nothing.
    let (code, body) = evict(&client, &pods[0].name_any(), "?dryRun=All").await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"], "Success", "{body}");
    assert!(!terminating(&c, &pods[0].name_any()).await);
    let api: Api<PodDisruptionBudget> = c.api("default");
    let after = serde_json::to_value(api.get("web").await.unwrap().status).unwrap();
    assert_eq!(after["disruptionsAllowed"], 1, "{after}");
    assert!(after.get("disruptedPods").is_none(), "{after}");

    // With the controller stopped the status stays as the evictions write it: the first
    // spends the one disruption and records the pod, the second is refused with 429.
    c.stop_controllers().await;
    let (code, body) = evict(&client, &pods[0].name_any(), "").await;
    assert_eq!(code, 201, "{body}");
    assert!(terminating(&c, &pods[0].name_any()).await);
    let written = serde_json::to_value(api.get("web").await.unwrap().status).unwrap();
    assert_eq!(written["disruptionsAllowed"], 0, "{written}");
    assert!(
        written["disruptedPods"].get(pods[0].name_any()).is_some(),
        "{written}"
    );
    assert_eq!(written["conditions"][0]["reason"], "InsufficientPods");
    let (code, body) = evict(&client, &pods[1].name_any(), "").await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    assert_eq!(
        body["message"], "Cannot evict pod as it would violate the pod's disruption budget.",
        "{body}"
    );
    assert_eq!(
        body["details"]["causes"],
        json!([{"reason": "DisruptionBudget",
            "message": "The disruption budget web needs 2 healthy pods and has 3 currently"}]),
        "{body}"
    );
    assert!(!terminating(&c, &pods[1].name_any()).await);

    // The controller back: the replacement Ready, one disruption allowed again, and the
    // next eviction goes through.
    c.start_controllers(fast_settings()).await;
    ready_pods(&c, "web", 3).await;
    status_where(&c, "web", "a disruption allowed again", |s| {
        s["disruptionsAllowed"] == 1 && s.get("disruptedPods").is_none()
    })
    .await;
    let (code, body) = evict(&client, &pods[1].name_any(), "").await;
    assert_eq!(code, 201, "{body}");

    // maxUnavailable as a percentage counts against the Deployment's scale: 34% of 3 is 2
    // rounded up, so one pod must stay healthy.
    let b = budget("web-pct", "web", json!({"maxUnavailable": "34%"}));
    api.create(&PostParams::default(), &b).await.unwrap();
    let s = status_where(&c, "web-pct", "the percentage budget", |s| {
        s["expectedPods"] == 3 && s["desiredHealthy"] == 1
    })
    .await;
    assert_eq!(s["observedGeneration"], 1, "{s}");

    // Two budgets over one pod: the eviction subresource refuses, nothing is deleted.
    let pods = ready_pods(&c, "web", 3).await;
    let (code, body) = evict(&client, &pods[0].name_any(), "").await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(
        body["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        "{body}"
    );
    assert!(!terminating(&c, &pods[0].name_any()).await);

    // Bad budgets get Kubernetes' field errors.
    let both = budget(
        "both",
        "web",
        json!({"minAvailable": 1, "maxUnavailable": 1}),
    );
    let e = api.create(&PostParams::default(), &both).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("minAvailable and maxUnavailable cannot be both set"),
        "{e}"
    );
    let over = budget("over", "web", json!({"minAvailable": "150%"}));
    let e = api.create(&PostParams::default(), &over).await.unwrap_err();
    assert!(e.to_string().contains("spec.minAvailable"), "{e}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drain_waits_for_the_budget_and_reports_its_refusal() {
    let c = Cluster::start(fast_settings(), &["node-1", "node-2"]).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::new(c.server().kubeconfig_path(), dir.path()).within(Duration::from_secs(180));
    let deployments: Api<Deployment> = c.api("default");
    deployments
        .create(&PostParams::default(), &deployment("drained", 3))
        .await
        .unwrap();
    ready_pods(&c, "drained", 3).await;
    let api: Api<PodDisruptionBudget> = c.api("default");
    api.create(
        &PostParams::default(),
        &budget("drained", "drained", json!({"minAvailable": 2})),
    )
    .await
    .unwrap();
    status_where(&c, "drained", "one disruption allowed", |s| {
        s["disruptionsAllowed"] == 1
    })
    .await;

    // minAvailable 2 of 3: drain evicts node-1's pods one at a time (each waits for the
    // replacement on node-2 to be Ready) and completes.
    let on = |pods: &[Pod], node: &str| {
        pods.iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .count()
    };
    let before = ready_pods(&c, "drained", 3).await;
    let out = k.ok(&["drain", "node-1", "--timeout=150s"]);
    assert!(out.contains("node/node-1 drained"), "{out}");
    for p in before
        .iter()
        .filter(|p| on(std::slice::from_ref(p), "node-1") == 1)
    {
        assert!(
            out.contains(&format!("pod/{} evicted", p.name_any())),
            "{out}"
        );
    }
    let after = ready_pods(&c, "drained", 3).await;
    assert_eq!(on(&after, "node-2"), 3, "{after:?}");

    // minAvailable 3: nothing may go; drain reports the 429 refusal until its timeout and
    // no pod was deleted.
    // The disruption controller may write the status between the read and the replace (the
    // evictions' DisruptionTarget conditions are pod updates it recounts for): a conflict is
    // retried with the newer object, as any client does.
    wait_until_async("minAvailable raised to 3", WAIT, || async {
        let mut b = api.get("drained").await.map_err(|e| e.to_string())?;
        b.spec.as_mut().unwrap().min_available =
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(3));
        api.replace("drained", &PostParams::default(), &b)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    status_where(&c, "drained", "no disruption allowed", |s| {
        s["disruptionsAllowed"] == 0 && s["observedGeneration"] == 2
    })
    .await;
    k.ok(&["uncordon", "node-1"]);
    let r = k.run(&["drain", "node-2", "--timeout=15s"]);
    assert!(!r.success, "{}", r.stdout);
    assert!(
        r.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        r.stderr
    );
    let still = live_pods(&c, "drained").await;
    let mut names: Vec<String> = still.iter().map(ResourceExt::name_any).collect();
    let mut want: Vec<String> = after.iter().map(ResourceExt::name_any).collect();
    names.sort();
    want.sort();
    assert_eq!(names, want, "a pod was deleted under the budget");
    c.shutdown().await;
}
