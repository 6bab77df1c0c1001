//! The bad-input matrix: each malformed or refused request gets the Status Kubernetes gives
//! (code and reason), and the server keeps serving every other client meanwhile (a watch
//! opened before the barrage still delivers, reads still answer).

mod api_support;

use std::time::Duration;

use control_plane::apiserver::{Config, Server};
use futures::{StreamExt, TryStreamExt};
use http::{Method, Request};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::{json, Value};

async fn send(c: &Client, method: Method, path: &str, ct: &str, body: Vec<u8>) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(kube::client::Body::from(body))
        .unwrap();
    let resp = c.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

const JSON: &str = "application/json";

async fn every_bad_request_gets_its_status_and_others_keep_being_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("d"), "127.0.0.1:0".parse().unwrap());
    api_support::configure(&mut config);
    let server = Server::start(config).await.unwrap();
    let kc = Kubeconfig::read_from(server.kubeconfig_path()).unwrap();
    let c = Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap(),
    )
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut watch = cms
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    let cm_path = "/api/v1/namespaces/default/configmaps";
    let good =
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ok"},"data":{"a":"b"}});
    let created = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(good.clone()).unwrap(),
        )
        .await
        .unwrap();
    let deploy = json!({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},
        "spec":{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},
        "spec":{"containers":[{"name":"c","image":"i"}]}}}});
    let (code, _) = send(
        &c,
        Method::POST,
        "/apis/apps/v1/namespaces/default/deployments",
        JSON,
        deploy.to_string().into(),
    )
    .await;
    assert_eq!(code, 201);

    let big = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},
        "data":{"a": "x".repeat(3 * 1024 * 1024 + 10)}});
    let mut stale = serde_json::to_value(&created).unwrap();
    stale["data"]["a"] = json!("c");
    cms.replace(
        "ok",
        &PostParams::default(),
        &serde_json::from_value(json!({
        "apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ok"},"data":{"a":"new"}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let immutable = json!({"spec":{"selector":{"matchLabels":{"a":"z"}},"template":{"metadata":{"labels":{"a":"z"}}}}});

    // (what, method, path, content type, body, code, reason)
    type Case<'a> = (&'a str, Method, &'a str, &'a str, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("malformed JSON", Method::POST, cm_path, JSON, b"{\"kind\":".to_vec(), 400, "BadRequest"),
        ("malformed YAML", Method::POST, cm_path, "application/yaml", b"kind: [unclosed".to_vec(), 400, "BadRequest"),
        ("malformed protobuf", Method::POST, cm_path, "application/vnd.kubernetes.protobuf", b"k8s\0\xff\xff\x01".to_vec(), 400, "BadRequest"),
        ("protobuf without magic", Method::POST, cm_path, "application/vnd.kubernetes.protobuf", b"\x0a\x00".to_vec(), 400, "BadRequest"),
        ("not an object", Method::POST, cm_path, JSON, b"[1,2]".to_vec(), 400, "BadRequest"),
        ("kind of another resource", Method::POST, cm_path, JSON,
            json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}).to_string().into(), 400, "BadRequest"),
        ("unknown resource", Method::GET, "/api/v1/namespaces/default/widgets", JSON, vec![], 404, "NotFound"),
        ("unknown version", Method::GET, "/apis/apps/v2/deployments", JSON, vec![], 404, "NotFound"),
        ("unknown group", Method::GET, "/apis/nope.io/v1/things", JSON, vec![], 404, "NotFound"),
        ("wrong namespace in body", Method::POST, cm_path, JSON,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"kube-system"}}).to_string().into(), 400, "BadRequest"),
        ("namespace that does not exist", Method::POST, "/api/v1/namespaces/nope/configmaps", JSON,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}).to_string().into(), 404, "NotFound"),
        ("body over 3 MiB", Method::POST, cm_path, JSON, big.to_string().into(), 413, "RequestEntityTooLarge"),
        ("invalid name", Method::POST, cm_path, JSON,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}).to_string().into(), 422, "Invalid"),
        ("missing name", Method::POST, cm_path, JSON,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{}}).to_string().into(), 422, "Invalid"),
        ("stale resourceVersion", Method::PUT, "/api/v1/namespaces/default/configmaps/ok", JSON, stale.to_string().into(), 409, "Conflict"),
        ("already exists", Method::POST, cm_path, JSON, good.to_string().into(), 409, "AlreadyExists"),
        ("immutable selector", Method::PATCH, "/apis/apps/v1/namespaces/default/deployments/d",
            "application/merge-patch+json", immutable.to_string().into(), 422, "Invalid"),
        ("patch of an unknown type", Method::PATCH, "/api/v1/namespaces/default/configmaps/ok", "text/plain", b"{}".to_vec(), 415, "UnsupportedMediaType"),
        ("JSON patch body sent as merge patch", Method::PATCH, "/api/v1/namespaces/default/configmaps/ok",
            "application/merge-patch+json", b"[{\"op\":\"add\"}]".to_vec(), 400, "BadRequest"),
        ("JSON patch on a missing path", Method::PATCH, "/api/v1/namespaces/default/configmaps/ok",
            "application/json-patch+json", b"[{\"op\":\"replace\",\"path\":\"/nope/x\",\"value\":1}]".to_vec(), 422, "Invalid"),
        ("unsupported body type", Method::POST, cm_path, "text/plain", b"hello".to_vec(), 415, "UnsupportedMediaType"),
        ("strict unknown field", Method::POST, "/api/v1/namespaces/default/configmaps?fieldValidation=Strict", JSON,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"s"},"dta":{}}).to_string().into(), 400, "BadRequest"),
        ("bad label selector", Method::GET, "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b", JSON, vec![], 400, "BadRequest"),
        ("unsupported field selector", Method::GET, "/api/v1/namespaces/default/configmaps?fieldSelector=spec.x%3Dy", JSON, vec![], 400, "BadRequest"),
        ("bad resourceVersion", Method::GET, "/api/v1/namespaces/default/configmaps?resourceVersion=abc", JSON, vec![], 400, "BadRequest"),
        ("bad continue token", Method::GET, "/api/v1/namespaces/default/configmaps?limit=1&continue=zz", JSON, vec![], 400, "BadRequest"),
        ("delete a system namespace", Method::DELETE, "/api/v1/namespaces/default", JSON, vec![], 403, "Forbidden"),
        ("method not allowed", Method::PUT, cm_path, JSON, b"{}".to_vec(), 405, "MethodNotAllowed"),
        ("get a missing object", Method::GET, "/api/v1/namespaces/default/configmaps/none", JSON, vec![], 404, "NotFound"),
    ];
    for (what, method, path, ct, body, code, reason) in cases {
        let (got, status) = send(&c, method, path, ct, body).await;
        assert_eq!(
            (got, status["reason"].as_str()),
            (code, Some(reason)),
            "{what}: {status}"
        );
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["code"], code, "{what}");
    }

    // The watch opened before all of that is still live, and reads still work.
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
        "apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"after"}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(e) = watch.try_next().await.unwrap() {
            if let WatchEvent::Added(cm) = e {
                if cm.metadata.name.as_deref() == Some("after") {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true));
    assert_eq!(cms.get("ok").await.unwrap().data.unwrap()["a"], "new");
    server.shutdown().await;
}

on_both_stores!(async: every_bad_request_gets_its_status_and_others_keep_being_served);
