//! /readyz and /livez in Kubernetes' format: `ok`, or one `[+]check ok` / `[-]check failed:
//! reason` line per check and a last line saying which endpoint failed (every check is
//! listed with `?verbose`). /readyz fails while the server shuts down or while its watch
//! cache does not follow the store; /livez fails once the cache has not followed the store
//! for longer than the liveness grace period, so a supervisor restarts a server that cannot
//! recover by itself.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Duration;

use http::StatusCode;

use super::handlers::Ctx;
use super::output::{self, Resp};

/// One named check and its outcome (Err: why it fails).
type Check = (&'static str, Result<(), String>);

fn watch_cache(ctx: &Ctx, grace: Option<Duration>) -> Check {
    let outcome = match ctx.cache.health() {
        None => Ok(()),
        Some(h) if grace.is_some_and(|g| h.since.elapsed() < g) => Ok(()),
        Some(h) => Err(format!(
            "not following the store for {:.0}s: {}",
            h.since.elapsed().as_secs_f64(),
            h.reason
        )),
    };
    ("watch-cache", outcome)
}

fn undecodable(ctx: &Ctx) -> Option<String> {
    let bad: Vec<String> = ctx
        .cache
        .resources()
        .iter()
        .flat_map(|r| r.undecodable())
        .map(|(key, u)| format!("{key} (revision {}): {}", u.revision, u.error))
        .collect();
    (!bad.is_empty()).then(|| bad.join("; "))
}

/// GET /readyz
pub fn readyz(ctx: &Ctx, query: &HashMap<String, String>) -> Resp {
    let shutdown = (
        "shutdown",
        if ctx.shutdown.is_cancelled() {
            Err("the server is shutting down".to_string())
        } else {
            Ok(())
        },
    );
    let mut body = answer(
        "readyz",
        &[("ping", Ok(())), watch_cache(ctx, None), shutdown],
        query,
    );
    // Not a failure (the rest is served), but where an operator looks first.
    if let Some(bad) = undecodable(ctx) {
        let _ = write!(body.1, "\nwarning: undecodable objects in the store: {bad}");
    }
    output::text(body.0, &body.1)
}

/// GET /livez and /healthz
pub fn livez(ctx: &Ctx, query: &HashMap<String, String>) -> Resp {
    let (code, text) = answer(
        "livez",
        &[
            ("ping", Ok(())),
            watch_cache(ctx, Some(ctx.cache_liveness_grace)),
        ],
        query,
    );
    output::text(code, &text)
}

fn answer(
    endpoint: &str,
    checks: &[Check],
    query: &HashMap<String, String>,
) -> (StatusCode, String) {
    let failed = checks.iter().any(|(_, r)| r.is_err());
    let verbose = query.contains_key("verbose");
    if !failed && !verbose {
        return (StatusCode::OK, "ok".into());
    }
    let mut text = String::new();
    for (name, r) in checks {
        match r {
            Ok(()) => {
                let _ = writeln!(text, "[+]{name} ok");
            }
            Err(why) => {
                let _ = writeln!(text, "[-]{name} failed: {why}");
            }
        }
    }
    if failed {
        let _ = write!(text, "{endpoint} check failed");
        (StatusCode::SERVICE_UNAVAILABLE, text)
    } else {
        let _ = write!(text, "{endpoint} check passed");
        (StatusCode::OK, text)
    }
}
