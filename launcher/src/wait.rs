//! Waiting on a condition with a deadline: the only synchronisation tests use (never a sleep).

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(20);

/// Polls `probe` until it returns `Ok`, or panics with `what` and the last observation
/// after `timeout`.
pub fn wait_until<T, O: Debug>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<T, O>,
) -> T {
    try_wait_until(what, timeout, probe).unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_until`] for library code (the cluster fixture, `cargo xtask up`): the timeout is an
/// error saying what was awaited and the last observation, not a panic.
pub fn try_wait_until<T, O: Debug>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, O>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!(
                    "timed out after {timeout:?} waiting for {what}; last: {last:?}"
                ))
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Async form of [`wait_until`] for tokio tests.
pub async fn wait_until_async<T, O: Debug, F: Future<Output = Result<T, O>>>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last:?}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}
