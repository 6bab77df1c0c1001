//! Authentication over TLS, end to end with the real kubectl and kube-rs: every kind of
//! credential the API server accepts, and every way one is refused (401, nothing stored):
//! none at all, a certificate of another CA, an expired certificate, a wrong or expired
//! token, the token of a deleted pod or service account, an expired or deleted bootstrap
//! token. Also TokenRequest (`kubectl create token`), TokenReview and SelfSubjectReview
//! (`kubectl auth whoami`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use control_plane::apiserver::auth::bootstrap;
use control_plane::apiserver::auth::serviceaccount::{Claims, KubernetesClaims, ObjectRef};
use control_plane::apiserver::kubeconfig::{self, Credentials};
use control_plane::apiserver::{Config, RunningServer, Server};
use control_plane::pki::{Ca, CertSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use skiff_tests::kubeconfig::KubeconfigAccess;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until;

struct Fixture {
    server: RunningServer,
    admin: Client,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn start(tokens: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("tokens.csv");
        std::fs::write(&token_file, tokens).unwrap();
        let mut config = Config::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
        config.token_auth_file = Some(token_file);
        let server = Server::start(config).await.unwrap();
        let admin = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
            .await
            .unwrap();
        Fixture { server, admin, dir }
    }

    fn pki(&self) -> PathBuf {
        self.server.data_dir().join("pki")
    }

    fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.pki().join("ca.crt")).unwrap()
    }

    /// A kubeconfig for this server with `credentials`.
    fn kubeconfig(&self, name: &str, credentials: Credentials) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        kubeconfig::write(
            &path,
            &self.server.url(),
            &self.ca_pem(),
            name,
            &credentials,
        )
        .unwrap();
        path
    }

    fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        self.kubeconfig(name, Credentials::Token(token.to_string()))
    }

    fn kubectl(&self, kubeconfig: &Path) -> Kubectl {
        Kubectl::new(kubeconfig, &self.dir.path().join("kubectl"))
    }

    fn admin_kubectl(&self) -> Kubectl {
        self.kubectl(self.server.kubeconfig_path())
    }

    /// The status of a raw request with the credentials of `kubeconfig`.
    fn status(&self, kubeconfig: &Path, method: &str, path: &str, body: Option<&Value>) -> u16 {
        let access = KubeconfigAccess::read(kubeconfig).unwrap();
        let agent = access.agent(Duration::from_secs(10)).unwrap();
        let url = format!("{}{path}", access.server);
        let bearer = access
            .token
            .map(|t| format!("Bearer {t}"))
            .unwrap_or_default();
        let resp = match (method, body) {
            ("GET", _) => agent.get(&url).header("Authorization", &bearer).call(),
            (_, Some(b)) => agent
                .post(&url)
                .header("Authorization", &bearer)
                .header("Content-Type", "application/json")
                .send(serde_json::to_vec(b).unwrap()),
            _ => panic!("{method} without a body"),
        };
        resp.map(|r| r.status().as_u16())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A denied write must change nothing: the ConfigMap it tried to make does not exist.
    async fn assert_refused_and_nothing_stored(&self, kubeconfig: &Path, what: &str) {
        let name = format!("denied-{}", what.replace(' ', "-"));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
        assert_eq!(
            self.status(
                kubeconfig,
                "GET",
                "/api/v1/namespaces/default/configmaps",
                None
            ),
            401,
            "{what}: list"
        );
        assert_eq!(
            self.status(
                kubeconfig,
                "POST",
                "/api/v1/namespaces/default/configmaps",
                Some(&cm)
            ),
            401,
            "{what}: create"
        );
        let stored = Api::<ConfigMap>::namespaced(self.admin.clone(), "default")
            .get_opt(&name)
            .await
            .unwrap();
        assert!(stored.is_none(), "{what}: a refused create stored {name}");
    }

    async fn service_account(&self, name: &str) -> ServiceAccount {
        Api::<ServiceAccount>::namespaced(self.admin.clone(), "default")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap()
    }
}

/// `kubectl auth whoami -o json`'s user name.
fn whoami(k: &Kubectl) -> Value {
    let out = k.ok(&["auth", "whoami", "-o", "json"]);
    serde_json::from_str::<Value>(&out).unwrap()["status"]["userInfo"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_requests_get_401_except_health_and_version() {
    let f = Fixture::start("").await;
    let anonymous = f.kubeconfig(
        "anonymous",
        Credentials::Token(String::new()), // an empty token is no credential at all
    );
    for path in ["/healthz", "/livez", "/readyz", "/version"] {
        assert_eq!(f.status(&anonymous, "GET", path, None), 200, "{path}");
    }
    for path in [
        "/api",
        "/apis",
        "/api/v1/namespaces",
        "/metrics",
        "/openapi/v3",
    ] {
        assert_eq!(f.status(&anonymous, "GET", path, None), 401, "{path}");
    }
    f.assert_refused_and_nothing_stored(&anonymous, "anonymous")
        .await;
    // kubectl, refused and holding no credentials, asks for a user name (and stdin is empty).
    f.kubectl(&anonymous).fails(&["get", "pods"]);
    // The admin kubeconfig the server wrote: a client certificate in system:masters.
    let me = whoami(&f.admin_kubectl());
    assert_eq!(me["username"], "kubernetes-admin");
    assert!(me["groups"]
        .as_array()
        .unwrap()
        .contains(&json!("system:masters")));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificates_of_another_ca_or_expired_are_refused() {
    let f = Fixture::start("").await;
    let elsewhere = tempfile::tempdir().unwrap();
    let stranger = Ca::load_or_create(elsewhere.path())
        .unwrap()
        .issue(&CertSpec::client(
            "kubernetes-admin",
            Some("system:masters"),
            Duration::from_secs(3600),
        ))
        .unwrap();
    let foreign = f.kubeconfig("foreign", Credentials::Certificate(stranger));
    f.assert_refused_and_nothing_stored(&foreign, "another CA")
        .await;
    let err = f.kubectl(&foreign).fails(&["get", "pods"]);
    assert!(err.contains("provide credentials"), "{err}");

    // Our CA, valid for one second: refused once it has expired.
    let ca = Ca::load(&f.pki().join("ca.crt"), &f.pki().join("ca.key")).unwrap();
    let short = ca
        .issue(&CertSpec::client(
            "short-lived",
            Some("system:masters"),
            Duration::from_secs(1),
        ))
        .unwrap();
    let expiring = f.kubeconfig("expiring", Credentials::Certificate(short));
    wait_until(
        "the certificate expires",
        Duration::from_secs(30),
        || match f.status(&expiring, "GET", "/api/v1/namespaces", None) {
            401 => Ok(()),
            code => Err(code.to_string()),
        },
    );
    f.assert_refused_and_nothing_stored(&expiring, "expired certificate")
        .await;

    // A valid certificate of our CA names its user and group.
    let dev = ca
        .issue(&CertSpec::client(
            "jane",
            Some("dev"),
            Duration::from_secs(3600),
        ))
        .unwrap();
    let jane = f.kubeconfig("jane", Credentials::Certificate(dev));
    let me = whoami(&f.kubectl(&jane));
    assert_eq!(me["username"], "jane");
    assert_eq!(me["groups"], json!(["dev", "system:authenticated"]));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn static_tokens_from_the_token_file() {
    let f = Fixture::start("s3cr3t-token,ops-bot,42,\"ops,system:masters\"\n").await;
    let good = f.token_kubeconfig("ops-bot", "s3cr3t-token");
    let me = whoami(&f.kubectl(&good));
    assert_eq!(me["username"], "ops-bot");
    assert_eq!(me["uid"], "42");
    assert_eq!(
        me["groups"],
        json!(["ops", "system:masters", "system:authenticated"])
    );
    f.kubectl(&good).ok(&["create", "configmap", "by-token"]);
    let wrong = f.token_kubeconfig("wrong", "s3cr3t-tokem");
    f.assert_refused_and_nothing_stored(&wrong, "wrong token")
        .await;
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_from_kubectl_create_token_live_and_die_with_their_objects() {
    let f = Fixture::start("").await;
    let admin = f.admin_kubectl();
    let account = f.service_account("builder").await;

    // kubectl create token: a token for the account, accepted by the API.
    let token = admin.ok(&["create", "token", "builder", "--duration", "15m"]);
    let sa = f.token_kubeconfig("builder", token.trim());
    let me = whoami(&f.kubectl(&sa));
    assert_eq!(me["username"], "system:serviceaccount:default:builder");
    assert_eq!(me["uid"], json!(account.metadata.uid.clone().unwrap()));
    assert_eq!(
        me["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    // Authenticated but granted nothing: 403, not 401; granted the list, the same request is
    // 200.
    assert_eq!(
        f.status(&sa, "GET", "/api/v1/namespaces/default/configmaps", None),
        403
    );
    admin.ok(&[
        "create",
        "role",
        "configmap-reader",
        "--verb=list",
        "--resource=configmaps",
    ]);
    admin.ok(&[
        "create",
        "rolebinding",
        "builder-reads",
        "--role=configmap-reader",
        "--serviceaccount=default:builder",
    ]);
    assert_eq!(
        f.status(&sa, "GET", "/api/v1/namespaces/default/configmaps", None),
        200
    );
    // Shorter than 10 minutes is refused; another audience is not the API's.
    let err = admin.fails(&["create", "token", "builder", "--duration", "5m"]);
    assert!(err.contains("10 minutes"), "{err}");
    let other = admin.ok(&["create", "token", "builder", "--audience", "vault"]);
    let vault = f.token_kubeconfig("vault", other.trim());
    f.assert_refused_and_nothing_stored(&vault, "other audience")
        .await;

    // Bound to a pod: valid while the pod lives.
    let pods: Api<Pod> = Api::namespaced(f.admin.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "job"},
            "spec": {"serviceAccountName": "builder",
                     "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let bound = admin.ok(&[
        "create",
        "token",
        "builder",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "job",
    ]);
    let bound_kc = f.token_kubeconfig("bound", bound.trim());
    let me = whoami(&f.kubectl(&bound_kc));
    assert_eq!(
        me["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["job"])
    );
    // A pod of another account cannot carry this account's token.
    f.service_account("other").await;
    let err = admin.fails(&[
        "create",
        "token",
        "other",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "job",
    ]);
    assert!(err.contains("different serviceaccount"), "{err}");
    pods.delete("job", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_until("the pod is gone", Duration::from_secs(30), || {
        match f.status(&bound_kc, "GET", "/api/v1/namespaces", None) {
            401 => Ok(()),
            code => Err(code.to_string()),
        }
    });
    f.assert_refused_and_nothing_stored(&bound_kc, "deleted pod")
        .await;

    // The account's own token dies with the account.
    Api::<ServiceAccount>::namespaced(f.admin.clone(), "default")
        .delete("builder", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the account is gone", Duration::from_secs(30), || {
        match f.status(&sa, "GET", "/api/v1/namespaces", None) {
            401 => Ok(()),
            code => Err(code.to_string()),
        }
    });
    f.assert_refused_and_nothing_stored(&sa, "deleted service account")
        .await;
    // And a new account of the same name does not revive it (another uid).
    f.service_account("builder").await;
    f.assert_refused_and_nothing_stored(&sa, "recreated service account")
        .await;
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_service_account_token_is_refused() {
    let f = Fixture::start("").await;
    let account = f.service_account("late").await;
    // Signed with the server's own key, expired a minute ago.
    let key = std::fs::read(f.pki().join("sa.key")).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = Claims {
        iss: "https://kubernetes.default.svc.cluster.local".into(),
        sub: "system:serviceaccount:default:late".into(),
        aud: vec!["https://kubernetes.default.svc.cluster.local".into()],
        exp: now - 60,
        iat: now - 3600,
        nbf: now - 3600,
        jti: "expired".into(),
        kubernetes: KubernetesClaims {
            namespace: "default".into(),
            serviceaccount: ObjectRef {
                name: "late".into(),
                uid: account.metadata.uid.clone().unwrap(),
            },
            ..Default::default()
        },
    };
    let sign = |claims: &Claims| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            claims,
            &jsonwebtoken::EncodingKey::from_ec_pem(&key).unwrap(),
        )
        .unwrap()
    };
    let expired = f.token_kubeconfig("expired", &sign(&claims));
    f.assert_refused_and_nothing_stored(&expired, "expired token")
        .await;
    // The same claims unexpired are accepted: the expiry is what was refused.
    let fresh = f.token_kubeconfig(
        "fresh",
        &sign(&Claims {
            exp: now + 600,
            ..claims
        }),
    );
    // (Discovery: what every authenticated user may read.)
    assert_eq!(f.status(&fresh, "GET", "/api/v1", None), 200);
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_tokens_authenticate_until_expired_or_deleted() {
    let f = Fixture::start("").await;
    let secrets: Api<Secret> = Api::namespaced(f.admin.clone(), "kube-system");
    let put = |token: &str, expiration: &str| {
        let obj = bootstrap::secret(token, Some(expiration), &[bootstrap::NODE_GROUP]).unwrap();
        let secrets = secrets.clone();
        async move {
            secrets
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(obj).unwrap(),
                )
                .await
                .unwrap();
        }
    };
    let token = bootstrap::generate();
    put(&token, "2999-01-01T00:00:00Z").await;
    let joining = f.token_kubeconfig("joining", &token);
    let me = whoami(&f.kubectl(&joining));
    let id = &token[..6];
    assert_eq!(me["username"], format!("system:bootstrap:{id}"));
    assert_eq!(
        me["groups"],
        json!([
            bootstrap::GROUP,
            bootstrap::NODE_GROUP,
            "system:authenticated"
        ])
    );
    // The right id with a wrong secret.
    let wrong = f.token_kubeconfig("wrong", &format!("{id}.0000000000000000"));
    f.assert_refused_and_nothing_stored(&wrong, "wrong bootstrap secret")
        .await;
    // Deleted: refused at once.
    secrets
        .delete(&bootstrap::secret_name(id), &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the token is gone", Duration::from_secs(30), || {
        match f.status(&joining, "GET", "/api/v1/namespaces", None) {
            401 => Ok(()),
            code => Err(code.to_string()),
        }
    });
    f.assert_refused_and_nothing_stored(&joining, "deleted bootstrap token")
        .await;
    // Expired.
    let old = bootstrap::generate();
    put(&old, "2020-01-01T00:00:00Z").await;
    let expired = f.token_kubeconfig("expired", &old);
    f.assert_refused_and_nothing_stored(&expired, "expired bootstrap token")
        .await;
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn token_review_says_who_a_token_stands_for() {
    let f = Fixture::start("").await;
    f.service_account("reviewed").await;
    let token = f
        .admin_kubectl()
        .ok(&["create", "token", "reviewed"])
        .trim()
        .to_string();
    let reviews: Api<k8s_openapi::api::authentication::v1::TokenReview> = Api::all(f.admin.clone());
    let review = |token: &str, audiences: Vec<&str>| {
        let body = serde_json::from_value(json!({
            "spec": {"token": token, "audiences": audiences}
        }))
        .unwrap();
        let reviews = reviews.clone();
        async move {
            reviews
                .create(&PostParams::default(), &body)
                .await
                .unwrap()
                .status
                .unwrap()
        }
    };
    let ok = review(&token, vec![]).await;
    assert_eq!(ok.authenticated, Some(true));
    assert_eq!(
        ok.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:default:reviewed")
    );
    let other_audience = review(&token, vec!["vault"]).await;
    assert_ne!(other_audience.authenticated, Some(true));
    assert!(other_audience.error.is_some());
    let garbage = review("not-a-token", vec![]).await;
    assert_ne!(garbage.authenticated, Some(true));
    // A review needs a token.
    let empty = reviews
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {}})).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(empty, kube::Error::Api(ref s) if s.code == 422),
        "{empty:?}"
    );
    f.server.shutdown().await;
}
