//! The audit log, end to end over TLS: a real server (in-process, and the binary with its
//! flags) serves requests with real client certificates and tokens, and its log is read back
//! from disk. A create, a 403 and a 401 each appear with who, what, the object and the
//! outcome; the Audit-ID response header names the event; impersonation shows both users; a
//! watch logs ResponseStarted, then ResponseComplete when it ends (also when SIGTERM ends
//! it: the log is written out before the process exits); rotation by size keeps N backups.

use std::path::{Path, PathBuf};
use std::time::Duration;

use control_plane::apiserver::audit::{self, log_file::Destination, log_file::Rotation};
use control_plane::apiserver::{Config, RunningServer, Server};
use serde_json::{json, Value};
use skiff_tests::apiserver::ApiServerProcess;
use skiff_tests::kubeconfig::KubeconfigAccess;
use skiff_tests::wait_until;

const BINARY: &str = env!("CARGO_BIN_EXE_control-plane");
const WAIT: Duration = Duration::from_secs(30);
const BOB_TOKEN: &str = "bob-token-0123456789";

struct Fixture {
    rt: tokio::runtime::Runtime,
    server: Option<RunningServer>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// A server over TLS with its audit log in a scratch directory and one static token
    /// (bob, in group devs, granted nothing).
    fn start(rotation: Rotation) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, format!("{BOB_TOKEN},bob,uid-bob,\"devs\"\n")).unwrap();
        let log = dir.path().join("audit/audit.log");
        let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
        config.token_auth_file = Some(tokens);
        config.audit = Some(audit::Config {
            destination: Destination::File(log.clone()),
            rotation,
        });
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(Server::start(config)).unwrap();
        Fixture {
            rt,
            server: Some(server),
            log,
            _dir: dir,
        }
    }

    fn admin(&self) -> KubeconfigAccess {
        let server = self.server.as_ref().unwrap();
        KubeconfigAccess::read(server.kubeconfig_path()).unwrap()
    }

    /// The admin's server and CA with a bearer token instead of the client certificate.
    fn with_token(&self, token: &str) -> KubeconfigAccess {
        let mut access = self.admin();
        access.client = None;
        access.token = Some(token.to_string());
        access
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

/// One request: (status, the Audit-ID response header, body).
fn call(
    access: &KubeconfigAccess,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let agent = access.agent(Duration::from_secs(60)).unwrap();
    let url = format!("{}{path}", access.server);
    let mut req = http::Request::builder().method(method).uri(&url);
    if let Some(t) = &access.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
    let result = match bytes {
        Some(b) => agent.run(
            req.header("Content-Type", "application/json")
                .body(b)
                .unwrap(),
        ),
        None => agent.run(req.body(()).unwrap()),
    };
    let mut resp = result.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let id = resp
        .headers()
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (resp.status().as_u16(), id, text)
}

/// Every event in the log file at `path` (each line must be one JSON object).
fn events_in(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
        .collect()
}

/// Waits for the event of `id` at `stage` in the log at `path`.
fn event(path: &Path, id: &str, stage: &str) -> Value {
    wait_until(
        &format!("the {stage} event of {id} in the audit log"),
        WAIT,
        || {
            events_in(path)
                .into_iter()
                .find(|e| e["auditID"] == id && e["stage"] == stage)
                .ok_or("not yet")
        },
    )
}

fn no_rotation() -> Rotation {
    Rotation {
        max_bytes: None,
        max_backups: 0,
    }
}

#[test]
fn a_create_a_403_and_a_401_are_audited_with_who_what_and_the_outcome() {
    let f = Fixture::start(no_rotation());
    let admin = f.admin();

    // A create by the admin (client certificate, system:masters).
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "audited"}});
    let path = "/api/v1/namespaces/default/configmaps";
    let (code, id, _) = call(&admin, "POST", path, Some(&cm), &[]);
    assert_eq!(code, 201);
    assert!(!id.is_empty(), "the response names its audit ID");
    let e = event(&f.log, &id, "ResponseComplete");
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(e["level"], "Metadata");
    assert_eq!(e["verb"], "create");
    assert_eq!(e["requestURI"], path);
    assert_eq!(e["user"]["username"], "kubernetes-admin");
    assert!(
        e["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{e}"
    );
    assert_eq!(e["sourceIPs"], json!(["127.0.0.1"]));
    assert!(
        e["userAgent"].as_str().is_some_and(|ua| !ua.is_empty()),
        "{e}"
    );
    assert_eq!(
        e["objectRef"],
        json!({"resource": "configmaps", "namespace": "default", "apiVersion": "v1"})
    );
    assert_eq!(e["responseStatus"], json!({"metadata": {}, "code": 201}));
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "allow");
    let (received, completed) = (
        e["requestReceivedTimestamp"].as_str().unwrap(),
        e["stageTimestamp"].as_str().unwrap(),
    );
    assert_eq!(received.len(), "2026-12-02T01:20:00.123456Z".len(), "{e}");
    assert!(received <= completed, "{e}");
    assert!(e.get("impersonatedUser").is_none(), "{e}");

    // A 403: bob is authenticated but granted nothing.
    let bob = f.with_token(BOB_TOKEN);
    let (code, id, _) = call(&bob, "GET", "/api/v1/namespaces/default/secrets", None, &[]);
    assert_eq!(code, 403);
    let e = event(&f.log, &id, "ResponseComplete");
    assert_eq!(e["verb"], "list");
    assert_eq!(
        e["user"],
        json!({"username": "bob", "uid": "uid-bob", "groups": ["devs", "system:authenticated"]})
    );
    assert_eq!(e["objectRef"]["resource"], "secrets");
    assert_eq!(e["responseStatus"]["code"], 403);
    assert_eq!(e["responseStatus"]["status"], "Failure");
    assert_eq!(e["responseStatus"]["reason"], "Forbidden");
    assert_eq!(
        e["responseStatus"]["message"],
        r#"secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "default""#
    );
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "forbid");

    // A 401: a token nobody issued; the caller is anonymous, no authorization happened.
    let stranger = f.with_token("not-a-token-anyone-issued");
    let (code, id, _) = call(
        &stranger,
        "GET",
        "/api/v1/namespaces/default/pods/web",
        None,
        &[],
    );
    assert_eq!(code, 401);
    let e = event(&f.log, &id, "ResponseComplete");
    assert_eq!(
        e["user"],
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );
    assert_eq!(e["verb"], "get");
    assert_eq!(e["objectRef"]["name"], "web");
    assert_eq!(e["responseStatus"]["code"], 401);
    assert_eq!(e["responseStatus"]["reason"], "Unauthorized");
    assert!(e.get("annotations").is_none(), "{e}");

    // The client's own Audit-ID is kept; impersonation shows both users.
    let (code, id, _) = call(
        &admin,
        "GET",
        "/api/v1/namespaces/default/configmaps/audited",
        None,
        &[("Audit-ID", "my-request-1"), ("Impersonate-User", "bob")],
    );
    assert_eq!((code, id.as_str()), (403, "my-request-1"));
    let e = event(&f.log, "my-request-1", "ResponseComplete");
    assert_eq!(e["user"]["username"], "kubernetes-admin");
    assert_eq!(e["impersonatedUser"]["username"], "bob");
    assert_eq!(e["objectRef"]["name"], "audited");

    // The health probes are not audited; every other request is, once.
    let (code, _, _) = call(&admin, "GET", "/healthz", None, &[("Audit-ID", "probe")]);
    assert_eq!(code, 200);
    let (_, last, _) = call(&admin, "GET", "/version", None, &[]);
    event(&f.log, &last, "ResponseComplete");
    let all = events_in(&f.log);
    assert!(
        all.iter().all(|e| e["auditID"] != "probe"),
        "a probe was audited"
    );
    let mut ids: Vec<&str> = all.iter().map(|e| e["auditID"].as_str().unwrap()).collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "one event per request");
}

#[test]
fn a_watch_logs_response_started_then_response_complete_when_it_ends() {
    let f = Fixture::start(no_rotation());
    let admin = f.admin();
    let (code, _, _) = call(
        &admin,
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=3",
        None,
        &[("Audit-ID", "the-watch")],
    );
    assert_eq!(code, 200);
    let started = event(&f.log, "the-watch", "ResponseStarted");
    let complete = event(&f.log, "the-watch", "ResponseComplete");
    for e in [&started, &complete] {
        assert_eq!(e["verb"], "watch");
        assert_eq!(e["responseStatus"]["code"], 200);
        assert_eq!(e["user"]["username"], "kubernetes-admin");
    }
    // The stream lasted its timeout: the complete event is seconds after the started one.
    let at =
        |e: &Value| -> jiff::Timestamp { e["stageTimestamp"].as_str().unwrap().parse().unwrap() };
    let lasted = at(&complete).duration_since(at(&started));
    assert!(
        lasted >= jiff::SignedDuration::from_secs(2),
        "the watch's complete event came {lasted:?} after its start"
    );
    assert_eq!(
        complete["requestReceivedTimestamp"],
        started["requestReceivedTimestamp"]
    );
}

#[test]
fn rotation_by_size_keeps_the_newest_backups_and_never_splits_a_line() {
    let max = 4096;
    let f = Fixture::start(Rotation {
        max_bytes: Some(max),
        max_backups: 2,
    });
    let admin = f.admin();
    let mut last = String::new();
    // Each event is a few hundred bytes: 60 of them fill many 4 KiB files.
    for i in 0..60 {
        let path = format!("/api/v1/namespaces/default/configmaps/c-{i}");
        let (code, id, _) = call(&admin, "GET", &path, None, &[]);
        assert_eq!(code, 404);
        last = id;
    }
    event(&f.log, &last, "ResponseComplete");
    let dir = f.log.parent().unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let backups: Vec<&PathBuf> = files.iter().filter(|p| **p != f.log).collect();
    assert_eq!(backups.len(), 2, "{files:?}");
    for b in &backups {
        let name = b.file_name().unwrap().to_string_lossy();
        assert!(
            name.starts_with("audit-") && name.ends_with(".log"),
            "{name}"
        );
    }
    let mut kept = 0;
    for file in &files {
        let size = std::fs::metadata(file).unwrap().len();
        assert!(size <= max, "{} is {size} bytes", file.display());
        kept += events_in(file).len();
    }
    assert!(
        kept > 0 && kept < 60,
        "the oldest events were rotated away: {kept} kept"
    );
    // The newest backup ends where the current file begins: the last requests are all kept.
    let newest: Vec<String> = [backups[1], &f.log]
        .iter()
        .flat_map(|p| events_in(p))
        .map(|e| e["requestURI"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        newest.last().map(String::as_str),
        Some("/api/v1/namespaces/default/configmaps/c-59")
    );
}

#[test]
fn the_binary_writes_its_audit_log_out_when_sigterm_ends_an_open_watch() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let mut server = ApiServerProcess::start(
        BINARY.as_ref(),
        &dir.path().join("data"),
        &[
            "--audit-log-path",
            log.to_str().unwrap(),
            "--audit-log-maxsize",
            "1",
            "--audit-log-maxbackup",
            "3",
        ],
    );
    let admin = server.admin();
    let watcher = std::thread::spawn(move || {
        call(
            &admin,
            "GET",
            "/api/v1/namespaces/default/pods?watch=true",
            None,
            &[("Audit-ID", "open-watch")],
        )
        .0
    });
    event(&log, "open-watch", "ResponseStarted");
    assert!(server.terminate(), "the server exits cleanly on SIGTERM");
    // No waiting: the process is gone, so whatever it wrote is all there is.
    let complete = events_in(&log)
        .into_iter()
        .find(|e| e["auditID"] == "open-watch" && e["stage"] == "ResponseComplete");
    assert!(
        complete.is_some(),
        "the watch ended by shutdown was audited before exit"
    );
    assert_eq!(watcher.join().unwrap(), 200);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the audit log is private");
}
