//! Authorization against a real in-process API server (with the clusterrole-aggregation
//! controller, as the all-in-one server runs it), with the real kubectl (`--as` impersonation)
//! and kube-rs clients that impersonate: the `kubectl auth can-i` matrix of the default roles,
//! Kubernetes' 403 messages and that a refused write stores nothing, escalation prevention,
//! the Node authorizer, impersonation, aggregation and the bootstrap policy's reconciliation.

use std::collections::BTreeSet;
use std::time::Duration;

use control_plane::apiserver::{Config, RunningServer, Server};
use control_plane::controllers::manager::{ControllerManager, ManagerConfig};
use control_plane::controllers::{ControllerName, Settings};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::json;
use skiff_tests::kubectl::Kubectl;
use skiff_tests::wait_until_async;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    server: Option<RunningServer>,
    admin: Client,
    k: Kubectl,
    controllers: Option<(ControllerManager, CancellationToken)>,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(Config::new(
            dir.path().join("data"),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .await
        .unwrap();
        let admin = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
            .await
            .unwrap();
        let k = Kubectl::new(server.kubeconfig_path(), dir.path());
        let mut f = Fixture {
            server: Some(server),
            admin,
            k,
            controllers: None,
            dir,
        };
        f.start_aggregation().await;
        f.wait_aggregated("view", "pods").await;
        f
    }

    async fn start_aggregation(&mut self) {
        let token = CancellationToken::new();
        let settings = Settings {
            enabled: [ControllerName::ClusterRoleAggregation].into(),
            ..Settings::default()
        };
        let config = ManagerConfig {
            settings,
            leader_election: None,
            ops_listen: None,
        };
        // As the controller manager, not the admin: aggregation needs its own rights.
        let server = self.server.as_ref().expect("the server runs");
        let client = control_plane::runtime::client::from_kubeconfig(
            &server.component_kubeconfig(control_plane::apiserver::CONTROLLER_MANAGER_KUBECONFIG),
        )
        .await
        .unwrap();
        let m = ControllerManager::start(client, config, token.clone())
            .await
            .unwrap();
        self.controllers = Some((m, token));
    }

    fn server(&self) -> &RunningServer {
        self.server.as_ref().unwrap()
    }

    /// A client that impersonates `user` in `groups`.
    async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        let kc = Kubeconfig::read_from(self.server().kubeconfig_path()).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups =
            (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect());
        Client::try_from(config).unwrap()
    }

    /// Waits until the ClusterRole `role` grants something on `resource`.
    async fn wait_aggregated(&self, role: &str, resource: &str) {
        let api: Api<ClusterRole> = Api::all(self.admin.clone());
        wait_until_async(&format!("{role} aggregates {resource}"), WAIT, || {
            let api = api.clone();
            async move {
                let r = api.get(role).await.map_err(|e| e.to_string())?;
                let has = r
                    .rules
                    .iter()
                    .flatten()
                    .any(|rule| rule.resources.iter().flatten().any(|x| x == resource));
                has.then_some(()).ok_or_else(|| "not yet".to_string())
            }
        })
        .await;
    }

    async fn stop(mut self) {
        if let Some((m, token)) = self.controllers.take() {
            token.cancel();
            m.stopped().await;
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }
}

/// `kubectl auth can-i` answers yes (exit 0) or no (exit 1).
fn can_i(k: &Kubectl, user: &[&str], args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    all.extend_from_slice(user);
    let r = k.run(&all);
    // A refusal may carry the authorizer's reason: `no - No Object name found`.
    match (r.code, r.stdout.trim()) {
        (Some(0), "yes") => true,
        (Some(1), out) if out == "no" || out.starts_with("no - ") => false,
        _ => panic!("kubectl {all:?}: unexpected answer {r:?}"),
    }
}

fn status_of(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("not an API error: {other}"),
    }
}

async fn set_up_team(f: &Fixture) {
    let k = &f.k;
    k.ok(&["create", "namespace", "team"]);
    k.ok(&[
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        "--user=viewer",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "editor",
        "--clusterrole=edit",
        "--user=editor",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "nsadmin",
        "--clusterrole=admin",
        "--user=nsadmin",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "root",
        "--clusterrole=cluster-admin",
        "--user=root",
    ]);
    k.ok(&["create", "serviceaccount", "bot", "-n", "team"]);
    k.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "bot",
        "--role=pod-reader",
        "--serviceaccount=team:bot",
        "-n",
        "team",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_matrix_for_the_default_roles() {
    let f = Fixture::start().await;
    set_up_team(&f).await;
    let k = &f.k;
    let viewer: &[&str] = &["--as", "viewer"];
    let editor: &[&str] = &["--as", "editor"];
    let nsadmin: &[&str] = &["--as", "nsadmin"];
    let root: &[&str] = &["--as", "root"];
    let bot: &[&str] = &["--as", "system:serviceaccount:team:bot"];
    let node: &[&str] = &["--as", "system:node:n1", "--as-group", "system:nodes"];
    let matrix: &[(&[&str], &[&str], bool)] = &[
        (viewer, &["get", "pods", "-n", "team"], true),
        (viewer, &["watch", "deployments.apps", "-n", "team"], true),
        (viewer, &["get", "pods/log", "-n", "team"], true),
        (viewer, &["create", "pods", "-n", "team"], false),
        (viewer, &["get", "secrets", "-n", "team"], false),
        (viewer, &["create", "pods/exec", "-n", "team"], false),
        (viewer, &["list", "pods", "-n", "default"], false),
        (viewer, &["list", "nodes"], false),
        (editor, &["create", "deployments.apps", "-n", "team"], true),
        (editor, &["get", "secrets", "-n", "team"], true),
        (editor, &["create", "pods/exec", "-n", "team"], true),
        (
            editor,
            &["impersonate", "serviceaccounts", "-n", "team"],
            true,
        ),
        (
            editor,
            &["create", "roles.rbac.authorization.k8s.io", "-n", "team"],
            false,
        ),
        (editor, &["delete", "pods", "-n", "default"], false),
        (
            nsadmin,
            &[
                "create",
                "rolebindings.rbac.authorization.k8s.io",
                "-n",
                "team",
            ],
            true,
        ),
        (nsadmin, &["delete", "deployments.apps", "-n", "team"], true),
        (nsadmin, &["create", "namespaces"], false),
        (
            nsadmin,
            &["list", "clusterroles.rbac.authorization.k8s.io"],
            false,
        ),
        (root, &["create", "namespaces"], true),
        (root, &["delete", "nodes"], true),
        (root, &["get", "/metrics"], true),
        (bot, &["get", "pods", "-n", "team"], true),
        (bot, &["delete", "pods", "-n", "team"], false),
        (bot, &["list", "secrets", "-n", "team"], false),
        (node, &["get", "nodes"], true),
        (node, &["update", "nodes/status"], true),
        (node, &["create", "events", "-n", "team"], true),
        (node, &["list", "secrets", "-n", "team"], false),
        (node, &["get", "configmaps/x", "-n", "team"], false),
        (node, &["delete", "nodes"], false),
    ];
    let mut wrong = vec![];
    for (user, args, want) in matrix {
        if can_i(k, user, args) != *want {
            wrong.push(format!("{user:?} {args:?}: expected {want}"));
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
    // Every authenticated user may discover the API and ask what it may do.
    assert!(can_i(k, &["--as", "nobody"], &["get", "/api"]));
    assert!(can_i(
        k,
        &["--as", "nobody"],
        &["create", "selfsubjectaccessreviews.authorization.k8s.io"]
    ));
    assert!(!can_i(k, &["--as", "nobody"], &["get", "/metrics"]));
    // --list: the rules of view in the namespace, and the discovery rules.
    let list = k.ok(&["auth", "can-i", "--list", "-n", "team", "--as", "viewer"]);
    let line = |resource: &str| {
        list.lines()
            .find(|l| l.split_whitespace().next() == Some(resource))
            .unwrap_or_else(|| panic!("no {resource} in\n{list}"))
            .to_string()
    };
    assert!(line("pods").contains("[get list watch]"), "{list}");
    assert!(
        line("selfsubjectaccessreviews.authorization.k8s.io").contains("[create]"),
        "{list}"
    );
    assert!(list.contains("[/api/*]"), "{list}");
    let root_list = k.ok(&["auth", "can-i", "--list", "--as", "root"]);
    assert!(
        root_list.lines().any(|l| l.starts_with("*.*")),
        "{root_list}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_is_403_with_kubernetes_message_and_stores_nothing() {
    let f = Fixture::start().await;
    set_up_team(&f).await;
    let k = &f.k;
    let err = k.fails(&[
        "get",
        "secrets",
        "-n",
        "default",
        "--as",
        "system:serviceaccount:default:x",
    ]);
    assert!(
        err.contains(r#"Error from server (Forbidden): secrets is forbidden: User "system:serviceaccount:default:x" cannot list resource "secrets" in API group "" in the namespace "default""#),
        "{err}"
    );
    let err = k.fails(&[
        "create",
        "configmap",
        "c",
        "--from-literal=a=b",
        "-n",
        "team",
        "--as",
        "viewer",
    ]);
    assert!(
        err.contains(r#"configmaps is forbidden: User "viewer" cannot create resource "configmaps" in API group "" in the namespace "team""#),
        "{err}"
    );
    let err = k.fails(&[
        "delete",
        "rolebinding",
        "editor",
        "-n",
        "team",
        "--as",
        "viewer",
    ]);
    assert!(
        err.contains(r#"rolebindings.rbac.authorization.k8s.io "editor" is forbidden: User "viewer" cannot delete resource "rolebindings" in API group "rbac.authorization.k8s.io" in the namespace "team""#),
        "{err}"
    );
    // Nothing changed.
    let cms: Api<ConfigMap> = Api::namespaced(f.admin.clone(), "team");
    assert!(cms.get_opt("c").await.unwrap().is_none());
    k.ok(&["get", "rolebinding", "editor", "-n", "team"]);
    // The Status a client sees.
    let x = f.client_as("system:serviceaccount:default:x", &[]).await;
    let s = status_of(
        Api::<Secret>::namespaced(x, "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    let d = s.details.unwrap();
    assert_eq!((d.group.as_str(), d.kind.as_str()), ("", "secrets"));
    // Non-resource paths are authorized too.
    let err = k.fails(&["get", "--raw", "/metrics", "--as", "viewer"]);
    assert!(
        err.contains(r#"forbidden: User "viewer" cannot get path "/metrics""#),
        "{err}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_needs_the_rules_or_escalate_and_bind() {
    let f = Fixture::start().await;
    let k = &f.k;
    k.ok(&["create", "namespace", "team"]);
    // dev may write roles and bindings in team and read pods, nothing else.
    k.ok(&[
        "create",
        "role",
        "rbac-writer",
        "--verb=create,update,get",
        "--resource=roles,rolebindings",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "dev-rbac",
        "--role=rbac-writer",
        "--user=dev",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "dev-pods",
        "--role=pod-reader",
        "--user=dev",
        "-n",
        "team",
    ]);
    let dev = ["--as", "dev", "-n", "team"];
    let as_dev = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(dev.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |args: Vec<String>| k.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // What dev holds, dev may grant.
    let r = run(as_dev(&[
        "create",
        "role",
        "my-pods",
        "--verb=get",
        "--resource=pods",
    ]));
    assert!(r.success, "{r:?}");
    // What it does not hold, it may not.
    let r = run(as_dev(&[
        "create",
        "role",
        "secrets",
        "--verb=get,delete",
        "--resource=secrets",
    ]));
    assert!(!r.success);
    assert!(
        r.stderr.contains(r#"roles.rbac.authorization.k8s.io "secrets" is forbidden: user "dev" (groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:"#),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete"]}"#),
        "{}",
        r.stderr
    );
    k.fails(&["get", "role", "secrets", "-n", "team"]);
    // Nor bind a role that grants more than it holds.
    let r = run(as_dev(&[
        "create",
        "rolebinding",
        "dev-admin",
        "--clusterrole=admin",
        "--user=dev",
    ]));
    assert!(!r.success);
    assert!(
        r.stderr.contains(
            r#"rolebindings.rbac.authorization.k8s.io "dev-admin" is forbidden: user "dev""#
        ),
        "{}",
        r.stderr
    );
    // Binding a role it holds the rules of is fine.
    let r = run(as_dev(&[
        "create",
        "rolebinding",
        "bob-pods",
        "--role=pod-reader",
        "--user=bob",
    ]));
    assert!(r.success, "{r:?}");
    // `escalate` on roles lets dev write any role; `bind` on the admin ClusterRole lets it
    // bind admin.
    k.ok(&[
        "create",
        "role",
        "escalator",
        "--verb=escalate",
        "--resource=roles",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "dev-escalator",
        "--role=escalator",
        "--user=dev",
        "-n",
        "team",
    ]);
    let r = run(as_dev(&[
        "create",
        "role",
        "secrets",
        "--verb=get,delete",
        "--resource=secrets",
    ]));
    assert!(r.success, "{r:?}");
    k.fails(&[
        "create",
        "rolebinding",
        "dev-admin",
        "--clusterrole=admin",
        "--user=dev",
        "-n",
        "team",
        "--as",
        "dev",
    ]);
    k.ok(&[
        "create",
        "role",
        "binder",
        "--verb=bind",
        "--resource=clusterroles",
        "--resource-name=admin",
        "-n",
        "team",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "dev-binder",
        "--role=binder",
        "--user=dev",
        "-n",
        "team",
    ]);
    let r = run(as_dev(&[
        "create",
        "rolebinding",
        "dev-admin",
        "--clusterrole=admin",
        "--user=dev",
    ]));
    assert!(r.success, "{r:?}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reads_only_the_objects_of_its_own_pods() {
    let f = Fixture::start().await;
    let secrets: Api<Secret> = Api::namespaced(f.admin.clone(), "default");
    for name in ["s1", "s2"] {
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))
                .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(f.admin.clone(), "default");
    for (pod, node, secret) in [("on-a", "node-a", "s1"), ("on-b", "node-b", "s2")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": pod},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "v", "secret": {"secretName": secret}}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let node_a = f.client_as("system:node:node-a", &["system:nodes"]).await;
    let as_a: Api<Secret> = Api::namespaced(node_a.clone(), "default");
    assert!(as_a.get("s1").await.is_ok(), "its own pod's secret");
    let s = status_of(as_a.get("s2").await.unwrap_err());
    assert_eq!(s.code, 403);
    assert_eq!(
        s.message,
        r#"secrets "s2" is forbidden: User "system:node:node-a" cannot get resource "secrets" in API group "" in the namespace "default": no relationship found between node 'node-a' and this object"#
    );
    let s = status_of(as_a.list(&ListParams::default()).await.unwrap_err());
    assert!(s.message.ends_with("No Object name found"), "{}", s.message);
    // Its pods by field selector, and no one else's.
    let pods_a: Api<Pod> = Api::all(node_a.clone());
    let mine = pods_a
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(mine.items.len(), 1);
    assert!(pods_a.list(&ListParams::default()).await.is_err());
    assert!(pods_a
        .list(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .is_err());
    // Its own Lease only.
    let leases: Api<Lease> = Api::namespaced(node_a.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "node-a"}, "spec": {"holderIdentity": "node-a"}}),
    )
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    assert!(leases.get("node-a").await.is_ok());
    assert_eq!(status_of(leases.get("node-b").await.unwrap_err()).code, 403);
    // Once its pod is gone, so is its access (the graph follows pod events).
    pods.delete("on-a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_until_async("node-a loses s1", WAIT, || {
        let as_a = as_a.clone();
        async move {
            match as_a.get("s1").await {
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_acts_as_the_named_user_and_groups() {
    let f = Fixture::start().await;
    let k = &f.k;
    k.ok(&["create", "namespace", "team"]);
    let err = k.fails(&["get", "pods", "-n", "team", "--as", "jane"]);
    assert!(
        err.contains(r#"User "jane" cannot list resource "pods""#),
        "{err}"
    );
    k.ok(&[
        "create",
        "rolebinding",
        "devs",
        "--clusterrole=view",
        "--group=devs",
        "-n",
        "team",
    ]);
    k.ok(&[
        "get",
        "pods",
        "-n",
        "team",
        "--as",
        "jane",
        "--as-group",
        "devs",
    ]);
    k.fails(&["get", "pods", "-n", "team", "--as", "jane"]);
    // A service account impersonated gets its groups.
    k.ok(&[
        "create",
        "rolebinding",
        "all-sas",
        "--clusterrole=view",
        "--group=system:serviceaccounts:team",
        "-n",
        "team",
    ]);
    k.ok(&[
        "get",
        "pods",
        "-n",
        "team",
        "--as",
        "system:serviceaccount:team:any",
    ]);
    // Who may impersonate whom is a rule like any other.
    assert!(!can_i(k, &["--as", "jane"], &["impersonate", "users"]));
    k.ok(&[
        "create",
        "clusterrole",
        "impersonator",
        "--verb=impersonate",
        "--resource=users",
        "--resource-name=bob",
    ]);
    k.ok(&[
        "create",
        "clusterrolebinding",
        "jane-impersonates",
        "--clusterrole=impersonator",
        "--user=jane",
    ]);
    assert!(can_i(k, &["--as", "jane"], &["impersonate", "users/bob"]));
    assert!(!can_i(
        k,
        &["--as", "jane"],
        &["impersonate", "users/carol"]
    ));
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_cluster_roles_pick_up_a_new_labelled_role() {
    let f = Fixture::start().await;
    f.k.ok(&["create", "namespace", "team"]);
    f.k.ok(&[
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        "--user=viewer",
        "-n",
        "team",
    ]);
    let ask = |client: Client| async move {
        let api: Api<SelfSubjectAccessReview> = Api::all(client);
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some("team".into()),
                    verb: Some("list".into()),
                    group: Some("example.com".into()),
                    resource: Some("widgets".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &review)
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed
    };
    let viewer = f.client_as("viewer", &[]).await;
    assert!(!ask(viewer.clone()).await);
    f.k.run_with_stdin(
        &["apply", "-f", "-"],
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: widgets-view
  labels: {rbac.authorization.k8s.io/aggregate-to-view: \"true\"}
rules:
- apiGroups: [example.com]
  resources: [widgets]
  verbs: [get, list, watch]
",
    );
    for role in ["view", "edit", "admin"] {
        f.wait_aggregated(role, "widgets").await;
    }
    assert!(ask(viewer.clone()).await);
    // Taking the label away takes the rules away.
    f.k.ok(&[
        "label",
        "clusterrole",
        "widgets-view",
        "rbac.authorization.k8s.io/aggregate-to-view-",
    ]);
    let api: Api<ClusterRole> = Api::all(f.admin.clone());
    wait_until_async("view drops widgets", WAIT, || {
        let api = api.clone();
        async move {
            let v = api.get("view").await.map_err(|e| e.to_string())?;
            let has = v
                .rules
                .iter()
                .flatten()
                .any(|r| r.resources.iter().flatten().any(|x| x == "widgets"));
            (!has)
                .then_some(())
                .ok_or_else(|| "still there".to_string())
        }
    })
    .await;
    assert!(!ask(viewer).await);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_policy_is_reconciled_at_start_unless_opted_out() {
    let mut f = Fixture::start().await;
    let names: BTreeSet<String> =
        f.k.ok(&["get", "clusterroles", "-o", "name"])
            .lines()
            .map(str::to_string)
            .collect();
    for role in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:discovery",
        "system:basic-user",
        "system:public-info-viewer",
        "system:node-proxier",
        "system:kube-scheduler",
        "system:kube-controller-manager",
        "system:node",
        "system:node-bootstrapper",
        "system:auth-delegator",
        "system:monitoring",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
    ] {
        assert!(
            names.contains(&format!("clusterrole.rbac.authorization.k8s.io/{role}")),
            "{role}"
        );
    }
    // Rules taken away come back at the next start; an opted-out role is left alone.
    f.k.ok(&[
        "patch",
        "clusterrole",
        "system:discovery",
        "--type=merge",
        "-p",
        r#"{"rules":[]}"#,
    ]);
    f.k.ok(&["patch", "clusterrole", "system:monitoring", "--type=merge", "-p",
        r#"{"rules":[],"metadata":{"annotations":{"rbac.authorization.kubernetes.io/autoupdate":"false"}}}"#]);
    if let Some((m, token)) = f.controllers.take() {
        token.cancel();
        m.stopped().await;
    }
    f.server.take().unwrap().shutdown().await;
    let server = Server::start(Config::new(
        f.dir.path().join("data"),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    f.admin = control_plane::runtime::client::from_kubeconfig(server.kubeconfig_path())
        .await
        .unwrap();
    f.server = Some(server);
    let api: Api<ClusterRole> = Api::all(f.admin.clone());
    let discovery = api.get("system:discovery").await.unwrap();
    assert!(!discovery.rules.unwrap_or_default().is_empty());
    let monitoring = api.get("system:monitoring").await.unwrap();
    assert!(monitoring.rules.unwrap_or_default().is_empty());
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_restriction_keeps_a_node_to_its_own_node_lease_pods_and_tokens() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Node, ServiceAccount};
    use kube::api::{Patch, PatchParams};

    let f = Fixture::start().await;
    let accounts: Api<ServiceAccount> = Api::namespaced(f.admin.clone(), "default");
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    match accounts.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
    let pods: Api<Pod> = Api::namespaced(f.admin.clone(), "default");
    for (pod, node) in [("on-a", "node-a"), ("on-b", "node-b")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": pod},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let node_a = f.client_as("system:node:node-a", &["system:nodes"]).await;
    let forbidden = |e: kube::Error, why: &str| {
        let s = status_of(e);
        assert_eq!(s.code, 403, "{}", s.message);
        assert!(s.message.contains(why), "{:?} lacks {why:?}", s.message);
    };

    // Nodes: its own only, with the kubelet's labels only, taints as registered.
    let nodes: Api<Node> = Api::all(node_a.clone());
    let node = |name: &str, labels: serde_json::Value| -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}))
        .unwrap()
    };
    let pp = PostParams::default();
    let e = nodes
        .create(&pp, &node("node-b", json!({})))
        .await
        .unwrap_err();
    forbidden(e, r#"node "node-a" is not allowed to modify node "node-b""#);
    let role = json!({"node-role.kubernetes.io/control-plane": ""});
    let e = nodes.create(&pp, &node("node-a", role)).await.unwrap_err();
    forbidden(
        e,
        "is not allowed to set the following labels: node-role.kubernetes.io/control-plane",
    );
    let ok = json!({"kubernetes.io/hostname": "node-a", "example.com/pool": "x"});
    nodes.create(&pp, &node("node-a", ok)).await.unwrap();
    let merge = |v: serde_json::Value| Patch::Merge(v);
    let ps = PatchParams::default();
    let e = nodes
        .patch("node-a", &ps, &merge(json!({"spec": {"taints": null}})))
        .await
        .unwrap_err();
    forbidden(e, "is not allowed to modify taints");
    let e = nodes
        .patch(
            "node-a",
            &ps,
            &merge(json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}})),
        )
        .await
        .unwrap_err();
    forbidden(
        e,
        "is not allowed to modify labels: node-restriction.kubernetes.io/x",
    );
    nodes
        .patch(
            "node-a",
            &ps,
            &merge(json!({"metadata": {"labels": {"example.com/pool": "y"}}})),
        )
        .await
        .unwrap();
    let admin_nodes: Api<Node> = Api::all(f.admin.clone());
    assert!(
        admin_nodes.get_opt("node-b").await.unwrap().is_none(),
        "nothing stored"
    );

    // Leases: the one named after it.
    let leases: Api<Lease> = Api::namespaced(node_a.clone(), "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "node-b"}})).unwrap();
    let e = leases.create(&pp, &lease).await.unwrap_err();
    forbidden(
        e,
        "can only access node lease with the same name as the requesting node",
    );

    // Pods: mirror pods only; status and deletion of its own pods only.
    let as_a: Api<Pod> = Api::namespaced(node_a.clone(), "default");
    let plain: Pod = serde_json::from_value(json!({"metadata": {"name": "x"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]}}))
    .unwrap();
    let e = as_a.create(&pp, &plain).await.unwrap_err();
    forbidden(e, r#"node "node-a" can only create mirror pods"#);
    let status = merge(json!({"status": {"message": "mine now"}}));
    let e = as_a.patch_status("on-b", &ps, &status).await.unwrap_err();
    forbidden(
        e,
        "can only update pod status for pods with spec.nodeName set to itself",
    );
    as_a.patch_status("on-a", &ps, &status).await.unwrap();
    let e = as_a
        .delete("on-b", &DeleteParams::default())
        .await
        .unwrap_err();
    forbidden(e, "can only delete pods with spec.nodeName set to itself");
    assert!(
        pods.get_opt("on-b").await.unwrap().is_some(),
        "on-b still stored"
    );

    // Tokens: bound to its own pods only.
    let sa_a: Api<ServiceAccount> = Api::namespaced(node_a.clone(), "default");
    let request = |pod: Option<&str>| -> TokenRequest {
        let bound = pod.map(|p| json!({"kind": "Pod", "apiVersion": "v1", "name": p}));
        serde_json::from_value(json!({"spec": {"audiences": [], "boundObjectRef": bound}})).unwrap()
    };
    let e = sa_a
        .create_token_request("default", &pp, &request(Some("on-b")))
        .await
        .unwrap_err();
    forbidden(
        e,
        "requested token bound to a pod scheduled on a different node",
    );
    let e = sa_a
        .create_token_request("default", &pp, &request(None))
        .await
        .unwrap_err();
    forbidden(e, "requested token not bound to a pod");
    let token = sa_a
        .create_token_request("default", &pp, &request(Some("on-a")))
        .await
        .unwrap();
    assert!(!token.status.unwrap().token.is_empty());
    f.stop().await;
}
