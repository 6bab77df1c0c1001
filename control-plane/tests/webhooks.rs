//! Dynamic admission webhooks against a real `control-plane apiserver` process and the real
//! kubectl: a webhook server of the test's own (HTTPS with a certificate from a CA the test
//! makes, handed to the API server as caBundle) that records every AdmissionReview and
//! answers by path: refuse, patch, wait too long. Every refusal reaches kubectl with the
//! webhook's message and stores nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use skiff_tests::kubectl::{Kubectl, ServerFixture};
use skiff_tests::tls::TestCa;

/// The reviews the server received, by path.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

struct Hooks {
    addr: SocketAddr,
    seen: Seen,
    ca: TestCa,
    _runtime: tokio::runtime::Runtime,
}

impl Hooks {
    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    fn reviews(&self, path: &str) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn labels(obj: &Value) -> serde_json::Map<String, Value> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// What the test webhook answers to `request` on `path`.
async fn answer(path: &str, request: &Value) -> Value {
    let uid = request["uid"].clone();
    let obj = &request["object"];
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut response = json!({"uid": uid, "allowed": true});
    match path {
        "/deny-bad" => {
            response["warnings"] = json!(["checked by deny-bad"]);
            if name.starts_with("bad") {
                response["allowed"] = json!(false);
                response["status"] =
                    json!({"code": 403, "message": format!("name \"{name}\" is not allowed")});
            }
        }
        // Adds the label mutated=yes.
        "/add-label" => {
            let op = if labels(obj).is_empty() {
                json!({"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}})
            } else {
                json!({"op": "add", "path": "/metadata/labels/mutated", "value": "yes"})
            };
            let patch = serde_json::to_vec(&json!([op])).unwrap();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = serde_json::to_value(ByteString(patch)).unwrap();
        }
        // Records whether it saw the label another webhook adds (reinvocation).
        "/note-label" => {
            let saw = labels(obj).contains_key("mutated");
            let has = obj.pointer("/metadata/annotations").is_some();
            let op = if has {
                json!({"op": "add", "path": "/metadata/annotations/saw-label", "value": saw.to_string()})
            } else {
                json!({"op": "add", "path": "/metadata/annotations", "value": {"saw-label": saw.to_string()}})
            };
            let patch = serde_json::to_vec(&json!([op])).unwrap();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = serde_json::to_value(ByteString(patch)).unwrap();
        }
        "/slow" => tokio::time::sleep(Duration::from_secs(5)).await,
        _ => {}
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// Starts the webhook server with a certificate for 127.0.0.1 from a fresh CA.
fn start_hooks() -> Hooks {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ca = TestCa::new("webhook test CA");
    let issued = ca.issue(&["127.0.0.1"]);
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .map(|c| c.unwrap())
            .collect();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Default::default();
    let s = seen.clone();
    runtime.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, seen) = (acceptor.clone(), s.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap();
                        let request = review["request"].clone();
                        seen.lock().unwrap().push((path.clone(), request.clone()));
                        let out = answer(&path, &request).await;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            serde_json::to_vec(&out).unwrap(),
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Hooks {
        addr,
        seen,
        ca,
        _runtime: runtime,
    }
}

struct Fixture {
    hooks: Hooks,
    server: ServerFixture,
}

impl std::ops::Deref for Fixture {
    type Target = ServerFixture;
    fn deref(&self) -> &ServerFixture {
        &self.server
    }
}

fn start() -> Fixture {
    Fixture {
        hooks: start_hooks(),
        server: ServerFixture::start(env!("CARGO_BIN_EXE_control-plane").as_ref(), &[]),
    }
}

/// A webhook configuration object (JSON) with one webhook on pod CREATEs.
fn configuration(kind: &str, config: &str, hook: Value) -> String {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": config},
        "webhooks": [hook],
    })
    .to_string()
}

fn hook(name: &str, url: &str, ca_pem: &str) -> Value {
    json!({
        "name": name,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": url, "caBundle": ByteString(ca_pem.as_bytes().to_vec())},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
    })
}

fn apply(k: &Kubectl, manifest: &str) {
    let r = k.run_with_stdin(&["apply", "-f", "-"], manifest);
    assert!(r.success, "{}", r.stderr);
}

fn pod(name: &str, ns: &str, labels: Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}})
    .to_string()
}

fn absent(k: &Kubectl, name: &str, ns: &str) {
    let err = k.fails(&["get", "pod", name, "-n", ns]);
    assert!(err.contains("NotFound"), "{err}");
}

#[test]
fn a_validating_webhook_refuses_with_its_message_and_warns() {
    let f = start();
    let ca = f.hooks.ca.cert_pem();
    let mut h = hook("deny.skiff.test", &f.hooks.url("/deny-bad"), &ca);
    h["namespaceSelector"] = json!({"matchLabels": {"hooked": "yes"}});
    apply(
        &f.k,
        &configuration("ValidatingWebhookConfiguration", "deny", h),
    );
    let listed = f.k.ok(&["get", "validatingwebhookconfigurations"]);
    assert!(
        listed.contains("deny") && listed.contains("WEBHOOKS"),
        "{listed}"
    );
    f.k.ok(&["create", "namespace", "guarded"]);
    f.k.ok(&["label", "namespace", "guarded", "hooked=yes"]);

    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("bad-1", "guarded", json!({})));
    assert!(!run.success);
    assert!(
        run.stderr.contains("Error from server (Forbidden): error when creating \"STDIN\": admission webhook \"deny.skiff.test\" denied the request: name \"bad-1\" is not allowed"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Warning: checked by deny-bad"),
        "{}",
        run.stderr
    );
    absent(&f.k, "bad-1", "guarded");
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("good", "guarded", json!({})));
    assert!(run.success, "{}", run.stderr);
    assert!(
        run.stderr.contains("Warning: checked by deny-bad"),
        "{}",
        run.stderr
    );
    // What the webhook was sent.
    let reviews = f.hooks.reviews("/deny-bad");
    let r = reviews
        .iter()
        .find(|r| r["name"] == "good")
        .expect("the review of good");
    assert_eq!(r["operation"], "CREATE");
    assert_eq!(r["namespace"], "guarded");
    assert_eq!(
        r["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(r["resource"]["resource"], "pods");
    // The caller as authenticated: the admin kubeconfig's client certificate.
    assert_eq!(
        r["userInfo"]["username"],
        control_plane::apiserver::certs::ADMIN_USER
    );
    let groups = r["userInfo"]["groups"].as_array().expect("groups");
    for g in ["system:masters", "system:authenticated"] {
        assert!(groups.iter().any(|x| x == g), "{g} not in {groups:?}");
    }
    assert_eq!(r["dryRun"], false);
    assert_eq!(r["options"]["kind"], "CreateOptions");

    // Outside the namespace selector the webhook is not asked.
    f.k.ok(&["create", "namespace", "open"]);
    let before = f.hooks.reviews("/deny-bad").len();
    let run =
        f.k.run_with_stdin(&["create", "-f", "-"], &pod("bad-2", "open", json!({})));
    assert!(run.success, "{}", run.stderr);
    assert_eq!(f.hooks.reviews("/deny-bad").len(), before);

    // A dry run reaches a webhook without side effects, flagged, and stores nothing.
    let run = f.k.run_with_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &pod("dry", "guarded", json!({})),
    );
    assert!(run.success, "{}", run.stderr);
    let reviews = f.hooks.reviews("/deny-bad");
    let dry = reviews
        .iter()
        .find(|r| r["name"] == "dry")
        .expect("dry review");
    assert_eq!(dry["dryRun"], true);
    absent(&f.k, "dry", "guarded");

    // An invalid configuration is refused.
    let mut bad = hook("short", "http://x/y", &ca);
    bad["sideEffects"] = json!("Some");
    let run = f.k.run_with_stdin(
        &["apply", "-f", "-"],
        &configuration("ValidatingWebhookConfiguration", "bad", bad),
    );
    assert!(!run.success);
    assert!(
        run.stderr
            .contains("should be a domain with at least three segments separated by dots")
            && run
                .stderr
                .contains("'https' is the only allowed URL scheme"),
        "{}",
        run.stderr
    );
}

#[test]
fn mutating_webhooks_patch_and_are_reinvoked_if_needed() {
    let f = start();
    let ca = f.hooks.ca.cert_pem();
    // Called first (configurations go in name order), and again after the second changed
    // the object: it then sees the label the second added.
    let mut first = hook("note.skiff.test", &f.hooks.url("/note-label"), &ca);
    first["reinvocationPolicy"] = json!("IfNeeded");
    first["objectSelector"] = json!({"matchLabels": {"inject": "yes"}});
    let mut second = hook("label.skiff.test", &f.hooks.url("/add-label"), &ca);
    second["objectSelector"] = json!({"matchLabels": {"inject": "yes"}});
    apply(
        &f.k,
        &configuration("MutatingWebhookConfiguration", "a-note", first),
    );
    apply(
        &f.k,
        &configuration("MutatingWebhookConfiguration", "b-label", second),
    );
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("patched", "default", json!({"inject": "yes"})),
    );
    assert!(run.success, "{}", run.stderr);
    let p: Value = serde_json::from_str(&f.k.ok(&["get", "pod", "patched", "-o", "json"])).unwrap();
    assert_eq!(p["metadata"]["labels"]["mutated"], "yes");
    assert_eq!(p["metadata"]["annotations"]["saw-label"], "true");
    assert_eq!(f.hooks.reviews("/note-label").len(), 2, "called twice");
    assert_eq!(f.hooks.reviews("/add-label").len(), 1, "called once");
    // The object selector leaves other pods alone.
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("plain", "default", json!({"app": "x"})),
    );
    assert!(run.success, "{}", run.stderr);
    let p: Value = serde_json::from_str(&f.k.ok(&["get", "pod", "plain", "-o", "json"])).unwrap();
    assert!(p["metadata"]["labels"].get("mutated").is_none());
}

#[test]
fn failure_policies_and_timeouts() {
    let f = start();
    let ca = f.hooks.ca.cert_pem();
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("https://{}/down", closed.local_addr().unwrap());
    drop(closed);
    let mut h = hook("down.skiff.test", &down, &ca);
    h["objectSelector"] = json!({"matchLabels": {"case": "fail"}});
    apply(
        &f.k,
        &configuration("ValidatingWebhookConfiguration", "down-fail", h),
    );
    let mut h = hook("down-ignored.skiff.test", &down, &ca);
    h["failurePolicy"] = json!("Ignore");
    h["objectSelector"] = json!({"matchLabels": {"case": "ignore"}});
    apply(
        &f.k,
        &configuration("ValidatingWebhookConfiguration", "down-ignore", h),
    );
    let mut h = hook("slow.skiff.test", &f.hooks.url("/slow"), &ca);
    h["timeoutSeconds"] = json!(1);
    h["objectSelector"] = json!({"matchLabels": {"case": "slow"}});
    apply(
        &f.k,
        &configuration("ValidatingWebhookConfiguration", "slow", h),
    );
    let other = TestCa::new("another CA");
    let mut h = hook(
        "untrusted.skiff.test",
        &f.hooks.url("/allow"),
        &other.cert_pem(),
    );
    h["objectSelector"] = json!({"matchLabels": {"case": "untrusted"}});
    apply(
        &f.k,
        &configuration("ValidatingWebhookConfiguration", "untrusted", h),
    );

    // Down, failurePolicy Fail: 500 naming the webhook and the URL, nothing stored.
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("p-fail", "default", json!({"case": "fail"})),
    );
    assert!(!run.success);
    assert!(
        run.stderr.contains(&format!(
            "Internal error occurred: failed calling webhook \"down.skiff.test\": failed to call webhook: Post \"{down}?timeout=10s\": dial tcp"
        )) && run.stderr.contains("refused"),
        "{}",
        run.stderr
    );
    absent(&f.k, "p-fail", "default");
    // Down, Ignore: admitted.
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("p-ignore", "default", json!({"case": "ignore"})),
    );
    assert!(run.success, "{}", run.stderr);
    // Slower than its timeout (it answers after 5 s): refused when the 1 s timeout passes.
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("p-slow", "default", json!({"case": "slow"})),
    );
    assert!(!run.success);
    assert!(
        run.stderr
            .contains("failed calling webhook \"slow.skiff.test\"")
            && run
                .stderr
                .contains("?timeout=1s\": context deadline exceeded"),
        "{}",
        run.stderr
    );
    absent(&f.k, "p-slow", "default");
    // A serving certificate the caBundle does not vouch for.
    let run = f.k.run_with_stdin(
        &["create", "-f", "-"],
        &pod("p-untrusted", "default", json!({"case": "untrusted"})),
    );
    assert!(!run.success);
    assert!(
        run.stderr
            .contains("failed calling webhook \"untrusted.skiff.test\"")
            && run.stderr.contains("UnknownIssuer"),
        "{}",
        run.stderr
    );
    absent(&f.k, "p-untrusted", "default");
}
