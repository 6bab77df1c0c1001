//! The density scenario end to end (see `skiff_tests::density`): 200 pods on a 2-node
//! cluster whose nodes hold 110 pods each, created, rolled with `kubectl rollout restart`
//! under a client looping through the ClusterIP, then scaled down to 10. Every step must
//! complete, no request may fail, and no controller may panic on the way (a ReplicaSet
//! whose pod ranking was not a total order once panicked on every scale-down of this size
//! and hung the rollout). The measured table is printed (`--nocapture`); `cargo xtask bench
//! density` runs the same scenario as a benchmark.

use skiff_tests::cluster::{Cluster, Spec};
use skiff_tests::density::{self, Params};
use skiff_tests::netns::unique_name;
use skiff_tests::registry::require_images;
use skiff_tests::{e2e, subnet};

#[test]
fn two_hundred_pods_roll_and_scale_down_without_a_failed_request() {
    require_images();
    let lease = subnet::lease();
    let name = unique_name("dens");
    let dir = std::env::temp_dir().join(&name);
    let spec = Spec::new(
        &name,
        2,
        &dir,
        lease.cidr().parse().unwrap(),
        e2e::binaries(),
    );
    let c = Cluster::up(spec).unwrap_or_else(|e| panic!("cluster up: {e}"));
    let report = density::run(&c, &Params::default()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    assert!(
        report.failures.is_empty(),
        "requests failed through the ClusterIP:\n{}",
        report.failures
    );
    assert!(
        report.requests_ok > 100,
        "the client kept going through the rollout: {report}"
    );
    let log = std::fs::read_to_string(c.state_dir().join("logs/control-plane.log"))
        .expect("the control plane's log");
    assert!(
        !log.contains("reconcile panicked"),
        "a controller panicked:\n{}",
        log.lines()
            .filter(|l| l.contains("panicked"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
