//! What the provisioner and resizer tests share: waiting on a condition, and the Events
//! about an object.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::Client;

/// Generous for a loaded 2-core machine: each step is a few watch events and calls.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// Polls `probe` until it is Ok or [`CONVERGE`] passes (then panics with the last result).
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    skiff_launcher::wait_until_async(what, CONVERGE, probe).await
}

/// The Events in `default` about the object with `uid`: (type, reason, message).
pub async fn events(client: &Client, uid: &str) -> Vec<(String, String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for an Event `reason` about `uid` and returns its (type, message).
pub async fn wait_event(client: &Client, uid: &str, reason: &str) -> (String, String) {
    eventually(&format!("event {reason}"), || async {
        let events = events(client, uid).await;
        events
            .iter()
            .find(|e| e.1 == reason)
            .map(|e| (e.0.clone(), e.2.clone()))
            .ok_or_else(|| format!("events so far: {events:?}"))
    })
    .await
}

/// The value of the series `series` (name and labels, as rendered) in the text exposition
/// `text`; 0 when it is not there.
pub fn series_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
