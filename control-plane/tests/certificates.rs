//! certificates.k8s.io/v1 CertificateSigningRequests end to end: a real API server over TLS,
//! the real controllers (csrapproving, csrsigning with the cluster CA), kubectl and kube-rs.
//! Bad requests are 422 naming the field; the requester comes from the caller; `kubectl get
//! csr` prints Kubernetes' columns; `kubectl certificate approve` gets a request signed and
//! the certificate works against the API; `deny` keeps it unsigned; approving needs the
//! `approve` verb on the signer; a node-shaped request from someone without the
//! `nodeclient` permission is not approved automatically; nobody gets `system:masters`
//! through the kube-apiserver-client signer.

mod controllers_support;

use std::path::Path;
use std::time::Duration;

use control_plane::apiserver::kubeconfig::{self, Credentials};
use control_plane::controllers::csrsigning::Signing;
use control_plane::pki::{new_request, Issued, Subject};
use controllers_support::{fast_settings, Cluster};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;

const WAIT: Duration = Duration::from_secs(60);

fn b64(pem: &str) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(pem.as_bytes().to_vec())).unwrap()
}

fn csr(name: &str, request_pem: &str, signer: &str, usages: &[&str]) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"request": b64(request_pem), "signerName": signer, "usages": usages,
            "expirationSeconds": 3600}
    }))
    .unwrap()
}

/// The status code and the fields of the causes of a refused request.
fn refusal(e: kube::Error) -> (u16, Vec<String>) {
    match e {
        kube::Error::Api(s) => {
            let fields = s
                .details
                .map(|d| d.causes.into_iter().map(|c| c.field).collect())
                .unwrap_or_default();
            (s.code, fields)
        }
        other => panic!("not an API error: {other}"),
    }
}

async fn started() -> Cluster {
    let mut c = Cluster::api_only().await;
    let pki = control_plane::apiserver::certs::pki_dir(c.server().data_dir());
    let signing = Signing::load(
        &pki.join("ca.crt"),
        &pki.join("ca.key"),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    c.start_controllers(control_plane::controllers::Settings {
        cluster_signing: Some(std::sync::Arc::new(signing)),
        ..fast_settings()
    })
    .await;
    c
}

async fn issued(api: &Api<CertificateSigningRequest>, name: &str) -> String {
    wait_until_async(&format!("a certificate for {name}"), WAIT, || async {
        let c = api.get(name).await.map_err(|e| e.to_string())?;
        match c.status.and_then(|s| s.certificate) {
            Some(cert) if !cert.0.is_empty() => Ok(String::from_utf8(cert.0).unwrap()),
            _ => Err("no certificate yet".to_string()),
        }
    })
    .await
}

fn kubeconfig_with(
    c: &Cluster,
    name: &str,
    cert_pem: String,
    key_pem: String,
) -> std::path::PathBuf {
    let server = c.server();
    let ca = std::fs::read_to_string(
        control_plane::apiserver::certs::pki_dir(server.data_dir()).join("ca.crt"),
    )
    .unwrap();
    let path = c.dir.path().join(format!("{name}.kubeconfig"));
    kubeconfig::write(
        &path,
        &server.url(),
        &ca,
        name,
        &Credentials::Certificate(Issued { cert_pem, key_pem }),
    )
    .unwrap();
    path
}

fn whoami(kubeconfig: &Path, scratch: &Path) -> Value {
    let out = Kubectl::new(kubeconfig, scratch).ok(&["auth", "whoami", "-o", "json"]);
    serde_json::from_str::<Value>(&out).unwrap()["status"]["userInfo"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_422_with_the_field_and_the_spec_is_immutable() {
    let c = Cluster::api_only().await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client.clone());
    let (request, _) = new_request(&Subject::new("jane", Some("dev")), &[]).unwrap();
    let client_signer = "kubernetes.io/kube-apiserver-client";
    let cases: Vec<(&str, CertificateSigningRequest)> = vec![
        (
            "spec.request",
            csr("bad-pem", "not a request", client_signer, &["client auth"]),
        ),
        (
            "spec.signerName",
            csr("bad-signer", &request, "no-domain", &["client auth"]),
        ),
        (
            "spec.usages[0]",
            csr("bad-usage", &request, client_signer, &["flying"]),
        ),
        ("spec.usages", csr("no-usage", &request, client_signer, &[])),
        ("spec.expirationSeconds", {
            let mut short = csr("short", &request, client_signer, &["client auth"]);
            short.spec.expiration_seconds = Some(599);
            short
        }),
    ];
    for (field, bad) in cases {
        let e = api.create(&PostParams::default(), &bad).await.unwrap_err();
        let (code, fields) = refusal(e);
        assert_eq!(code, 422, "{field}");
        assert_eq!(fields, vec![field.to_string()], "{field}");
        assert!(api
            .get_opt(bad.metadata.name.as_deref().unwrap())
            .await
            .unwrap()
            .is_none());
    }

    // The requester is the caller, whatever the body says.
    let mut good = csr("good", &request, client_signer, &["client auth"]);
    good.spec.username = Some("mallory".into());
    good.spec.groups = Some(vec!["system:masters".into()]);
    let stored = api.create(&PostParams::default(), &good).await.unwrap();
    assert_eq!(stored.spec.username.as_deref(), Some("kubernetes-admin"));
    assert!(stored
        .spec
        .groups
        .unwrap()
        .contains(&"system:authenticated".to_string()));

    let patch = json!({"spec": {"usages": ["server auth"]}});
    let e = api
        .patch("good", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert_eq!(refusal(e), (422, vec!["spec".to_string()]));

    // A system:masters certificate through the client signer: forbidden, nothing stored.
    let (masters, _) = new_request(&Subject::new("eve", Some("system:masters")), &[]).unwrap();
    let e = api
        .create(
            &PostParams::default(),
            &csr("masters", &masters, client_signer, &["client auth"]),
        )
        .await
        .unwrap_err();
    assert_eq!(refusal(e).0, 403);
    assert!(api.get_opt("masters").await.unwrap().is_none());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_approves_and_denies_and_only_approved_requests_are_signed() {
    let c = started().await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client.clone());
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    let signer = "kubernetes.io/kube-apiserver-client";
    let (jane_req, jane_key) = new_request(&Subject::new("jane", Some("dev")), &[]).unwrap();
    let (joe_req, _) = new_request(&Subject::new("joe", None), &[]).unwrap();
    for (name, req) in [("jane", &jane_req), ("joe", &joe_req)] {
        api.create(
            &PostParams::default(),
            &csr(name, req, signer, &["client auth"]),
        )
        .await
        .unwrap();
    }
    let table = k.ok(&["get", "csr"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ]
    );
    assert!(
        table.lines().any(|l| l.starts_with("jane ")
            && l.contains(signer)
            && l.contains("kubernetes-admin")
            && l.contains("60m")
            && l.trim_end().ends_with("Pending")),
        "{table}"
    );

    // Approving needs `approve` on the signer, not just update on the subresource.
    k.ok(&[
        "create",
        "clusterrole",
        "csr-updater",
        "--verb=get,update",
        "--resource=certificatesigningrequests,certificatesigningrequests/approval",
    ]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "csr-updater",
        "--clusterrole=csr-updater",
        "--user=bob",
    ]);
    let err = k.fails(&["certificate", "approve", "jane", "--as", "bob"]);
    assert!(
        err.contains("user not permitted to approve requests with signerName"),
        "{err}"
    );
    let still = api.get("jane").await.unwrap();
    assert!(still
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .is_empty());

    k.ok(&["certificate", "deny", "joe"]);
    k.ok(&["certificate", "approve", "jane"]);
    let cert = issued(&api, "jane").await;
    let table = k.ok(&["get", "csr"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("jane ") && l.trim_end().ends_with("Approved,Issued")),
        "{table}"
    );
    // The certificate is jane's: the API server knows her by it.
    let kc = kubeconfig_with(&c, "jane", cert, jane_key);
    let me = whoami(&kc, c.dir.path());
    assert_eq!(me["username"], "jane");
    assert_eq!(me["groups"], json!(["dev", "system:authenticated"]));

    // jane was approved after joe was denied and is signed: joe never will be.
    let joe = api.get("joe").await.unwrap();
    let joe_status = joe.status.unwrap();
    assert!(joe_status.certificate.is_none());
    assert!(k.ok(&["get", "csr", "joe"]).contains("Denied"));
    // Approval is final.
    let err = k.fails(&["certificate", "approve", "joe"]);
    let lower = err.to_lowercase();
    assert!(
        lower.contains("mutually exclusive") || lower.contains("denied"),
        "{err}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn node_shaped_requests_are_approved_only_for_requesters_with_the_nodeclient_permission() {
    let c = started().await;
    let api: Api<CertificateSigningRequest> = Api::all(c.client.clone());
    let k = Kubectl::new(c.server().kubeconfig_path(), c.dir.path());
    let signer = "kubernetes.io/kube-apiserver-client-kubelet";
    let subject = Subject::new("system:node:n1", Some("system:nodes"));
    // mallory may create requests (the bootstrapper role) but not node client ones.
    k.ok(&[
        "create",
        "clusterrolebinding",
        "mallory-requests",
        "--clusterrole=system:node-bootstrapper",
        "--user=mallory",
    ]);
    let (req, _) = new_request(&subject, &[]).unwrap();
    let mallory = {
        let pki = control_plane::apiserver::certs::pki_dir(c.server().data_dir());
        let ca = control_plane::pki::Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).unwrap();
        let id = ca
            .issue(&control_plane::pki::CertSpec::client(
                "mallory",
                None,
                Duration::from_secs(3600),
            ))
            .unwrap();
        kubeconfig_with(&c, "mallory", id.cert_pem, id.key_pem)
    };
    let mallory_client = control_plane::runtime::client::from_kubeconfig(&mallory)
        .await
        .unwrap();
    Api::<CertificateSigningRequest>::all(mallory_client)
        .create(
            &PostParams::default(),
            &csr(
                "from-mallory",
                &req,
                signer,
                &["digital signature", "client auth"],
            ),
        )
        .await
        .unwrap();

    // A bootstrap token of kubeadm's node group may: its request is approved and signed.
    let token = control_plane::apiserver::auth::bootstrap::create(
        &c.client,
        Some(Duration::from_secs(600)),
        &[control_plane::apiserver::auth::bootstrap::NODE_GROUP],
    )
    .await
    .unwrap();
    let joining = c.dir.path().join("bootstrap.kubeconfig");
    let ca = std::fs::read_to_string(
        control_plane::apiserver::certs::pki_dir(c.server().data_dir()).join("ca.crt"),
    )
    .unwrap();
    kubeconfig::write(
        &joining,
        &c.server().url(),
        &ca,
        "bootstrap",
        &Credentials::Token(token),
    )
    .unwrap();
    let joining_client = control_plane::runtime::client::from_kubeconfig(&joining)
        .await
        .unwrap();
    let (node_req, node_key) = new_request(&subject, &[]).unwrap();
    Api::<CertificateSigningRequest>::all(joining_client)
        .create(
            &PostParams::default(),
            &csr(
                "from-token",
                &node_req,
                signer,
                &["digital signature", "client auth"],
            ),
        )
        .await
        .unwrap();
    let cert = issued(&api, "from-token").await;
    let approved = api.get("from-token").await.unwrap();
    let reason = approved.status.unwrap().conditions.unwrap()[0]
        .reason
        .clone();
    assert_eq!(reason.as_deref(), Some("AutoApproved"));
    let me = whoami(&kubeconfig_with(&c, "n1", cert, node_key), c.dir.path());
    assert_eq!(me["username"], "system:node:n1");

    // mallory's was submitted first and is still pending.
    let pending = api.get("from-mallory").await.unwrap();
    let status = pending.status.unwrap_or_default();
    assert!(status.conditions.unwrap_or_default().is_empty());
    assert!(status.certificate.is_none());
    assert!(k.ok(&["get", "csr", "from-mallory"]).contains("Pending"));
    c.shutdown().await;
}
