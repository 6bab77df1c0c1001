//! Waiting on a condition with a deadline: the only synchronisation tests use (never a sleep).

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(20);

/// Polls `probe` until it returns `Some`, or panics with `what` and the last observation
/// after `timeout`.
pub fn wait_until<T, O: Debug>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, O>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last:?}")
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
