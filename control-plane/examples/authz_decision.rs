//! The cost of one RBAC authorization decision, in-process over the real index
//! (`apiserver::authz::rbac::Policy`) holding Kubernetes' bootstrap ClusterRoles: first with
//! only the bindings the measured users need (the baseline), then with `--bindings` more
//! RoleBindings spread over `--namespaces` namespaces, each to a user of its own. Per case:
//! an allowed request (a RoleBinding of the user's in the namespace) and a refused one (the
//! full walk of the user's subjects). Prints one JSON document; `cargo xtask bench api` runs
//! it and puts the figures in its table.

use std::time::{Duration, Instant};

use control_plane::apiserver::auth::UserInfo;
use control_plane::apiserver::authz::attributes::{Attributes, ResourceAttributes};
use control_plane::apiserver::authz::bootstrap;
use control_plane::apiserver::authz::rbac::{Policy, RoleKey};
use control_plane::apiserver::authz::rules::Rule;
use k8s_openapi::api::rbac::v1::Subject;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn user_subject(name: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        namespace: None,
    }
}

fn pods(verb: &str, namespace: &str) -> Attributes {
    Attributes::resource(
        verb,
        ResourceAttributes {
            version: "v1".into(),
            namespace: namespace.into(),
            resource: "pods".into(),
            ..Default::default()
        },
    )
}

/// A policy with the bootstrap roles, the measured user's binding, and `extra` RoleBindings.
fn policy(extra: usize, namespaces: usize) -> Policy {
    let mut p = Policy::default();
    for role in bootstrap::cluster_roles() {
        let name = role.metadata.name.clone().unwrap_or_default();
        let rules = role.rules.iter().flatten().map(Rule::from).collect();
        p.set_role(&format!("/cr/{name}"), RoleKey::ClusterRole(name), rules);
    }
    // `view` as the aggregation controller fills it.
    let view = bootstrap::cluster_roles()
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some("system:aggregate-to-view"))
        .and_then(|r| r.rules)
        .unwrap_or_default();
    p.set_role(
        "/cr/view",
        RoleKey::ClusterRole("view".into()),
        view.iter().map(Rule::from).collect(),
    );
    for b in bootstrap::cluster_role_bindings() {
        let name = b.metadata.name.clone().unwrap_or_default();
        p.bind(
            &format!("/crb/{name}"),
            None,
            RoleKey::ClusterRole(b.role_ref.name),
            b.subjects.as_deref().unwrap_or_default(),
        );
    }
    p.bind(
        "/rb/ns-0/measured",
        Some("ns-0"),
        RoleKey::ClusterRole("view".into()),
        &[user_subject("measured")],
    );
    for i in 0..extra {
        let ns = format!("ns-{}", i % namespaces.max(1));
        p.bind(
            &format!("/rb/{ns}/b-{i}"),
            Some(&ns),
            RoleKey::ClusterRole("view".into()),
            &[user_subject(&format!("user-{i}"))],
        );
    }
    p
}

fn measure(
    p: &Policy,
    user: &UserInfo,
    a: &Attributes,
    want: bool,
    n: usize,
) -> (Duration, Duration) {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let allowed = std::hint::black_box(p.allows(user, a));
        lat.push(t0.elapsed());
        assert_eq!(allowed, want, "{a:?}");
    }
    lat.sort();
    (lat[n / 2], lat[(n - 1) * 99 / 100])
}

fn main() {
    let bindings = arg("--bindings", 10_000);
    let namespaces = arg("--namespaces", 100);
    let decisions = arg("--decisions", 200_000).max(100);
    let user = UserInfo::new("measured", &[]);
    let mut cases = vec![];
    for (label, extra) in [("baseline", 0), ("loaded", bindings)] {
        let p = policy(extra, namespaces);
        for (outcome, a, want) in [
            ("allowed", pods("list", "ns-0"), true),
            ("refused", pods("delete", "ns-0"), false),
        ] {
            // Warm up caches and the branch predictor before the timed run.
            measure(&p, &user, &a, want, decisions / 10);
            let (p50, p99) = measure(&p, &user, &a, want, decisions);
            cases.push(serde_json::json!({
                "case": label, "bindings": p.bindings(), "outcome": outcome, "decisions": decisions,
                "p50_us": p50.as_secs_f64() * 1e6, "p99_us": p99.as_secs_f64() * 1e6,
            }));
        }
    }
    println!("{}", serde_json::json!({ "decisions": cases }));
}
