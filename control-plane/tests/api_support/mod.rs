//! The API test suites run on both stores: every test listed in [`on_both_stores!`] runs once
//! on the embedded store and once on a real etcd (one member per test binary, started by the
//! first test that needs it; each test keys under a prefix of its own). The tests' fixtures
//! call [`configure`] (in-process servers) or [`server_args`] (server processes), which read
//! the store of the test being run.

#![allow(dead_code)]

use std::cell::Cell;
use std::time::Duration;

use control_plane::apiserver::Config;
use control_plane::store::etcd::EtcdConfig;
use control_plane::store::Backend;

/// The store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Embedded,
    Etcd,
}

tokio::task_local! {
    static STORE: StoreKind;
}

thread_local! {
    static SYNC_STORE: Cell<StoreKind> = const { Cell::new(StoreKind::Embedded) };
}

/// The store of the test running on this task (or thread).
pub fn current() -> StoreKind {
    STORE
        .try_with(|s| *s)
        .unwrap_or_else(|_| SYNC_STORE.with(Cell::get))
}

/// Runs an async test body on `store`.
pub async fn run_async<F: std::future::Future<Output = ()>>(store: StoreKind, test: F) {
    STORE.scope(store, test).await
}

/// Runs a blocking test body on `store`.
pub fn run_sync(store: StoreKind, test: impl FnOnce()) {
    SYNC_STORE.with(|s| s.set(store));
    test()
}

/// An etcd store for one server of one test: the binary's shared member, a prefix of the
/// test's own (the same for every server that asks with the same `prefix`).
fn etcd_config(prefix: &str) -> EtcdConfig {
    let mut c = EtcdConfig::new(skiff_tests::etcd::shared().endpoints());
    c.prefix = prefix.to_string();
    c.compaction_interval = Duration::ZERO;
    c
}

/// Points an in-process server's config at the current test's store (on etcd, under a
/// prefix of its own, which a clone of the config keeps: a restarted server finds its data).
pub fn configure(config: &mut Config) {
    if current() == StoreKind::Etcd {
        config.store = Backend::Etcd(etcd_config(&skiff_tests::etcd::unique_prefix()));
    }
}

/// The flags that put a server process on the current test's store (a process restarted
/// with the same flags finds its data).
pub fn server_args() -> Vec<String> {
    match current() {
        StoreKind::Embedded => vec![],
        StoreKind::Etcd => vec![
            "--store".into(),
            skiff_tests::etcd::shared().url(),
            "--etcd-prefix".into(),
            skiff_tests::etcd::unique_prefix(),
            "--etcd-compaction-interval".into(),
            "0".into(),
        ],
    }
}

/// Declares each listed test twice, as `embedded::<name>` and `etcd::<name>`: `async` tests
/// (`async fn name()` in the file) run on a 2-thread runtime, `sync` ones as plain tests.
#[macro_export]
macro_rules! on_both_stores {
    (async: $($name:ident),* $(,)?) => {
        $crate::on_both_stores!(@async embedded, Embedded, $($name),*);
        $crate::on_both_stores!(@async etcd, Etcd, $($name),*);
    };
    (sync: $($name:ident),* $(,)?) => {
        $crate::on_both_stores!(@sync embedded, Embedded, $($name),*);
        $crate::on_both_stores!(@sync etcd, Etcd, $($name),*);
    };
    (@async $module:ident, $kind:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::api_support::run_async(
                        $crate::api_support::StoreKind::$kind,
                        super::$name(),
                    )
                    .await
                }
            )*
        }
    };
    (@sync $module:ident, $kind:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    $crate::api_support::run_sync($crate::api_support::StoreKind::$kind, super::$name)
                }
            )*
        }
    };
}
