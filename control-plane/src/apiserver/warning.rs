//! Warnings for the client: anything on the request path (admission plugins, webhooks) adds a
//! warning to the request it serves, and the response carries each as an RFC 7234 `Warning`
//! header (`299 - "message"`), which kubectl prints as `Warning: message`. As Kubernetes'
//! `warning.AddWarning`, the recorder lives in the request's task (a task-local), so nothing
//! between the HTTP front and the plugin has to pass it along.

use std::sync::{Arc, Mutex};

use http::HeaderValue;

use super::output::Resp;

/// Kubernetes caps the warnings of one response (count and total size) so that a misbehaving
/// webhook cannot blow up the response headers.
const MAX_WARNINGS: usize = 50;
const MAX_TOTAL_BYTES: usize = 4096;

/// The warnings of one request.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<String>>>);

tokio::task_local! {
    static CURRENT: Recorder;
}

impl Recorder {
    /// Runs `fut` with this recorder as the request's.
    pub async fn scope<F: std::future::Future>(&self, fut: F) -> F::Output {
        CURRENT.scope(self.clone(), fut).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds every warning as a `Warning` header of `resp`.
    pub fn apply(&self, resp: &mut Resp) {
        let mut total = 0;
        for w in self.lock().iter().take(MAX_WARNINGS) {
            total += w.len();
            if total > MAX_TOTAL_BYTES {
                break;
            }
            if let Ok(v) = HeaderValue::from_str(&header_value(w)) {
                resp.headers_mut().append(http::header::WARNING, v);
            }
        }
    }
}

/// Adds a warning to the current request's response (nothing outside a request).
pub fn add(message: impl Into<String>) {
    let message = sanitize(&message.into());
    if message.is_empty() {
        return;
    }
    let _ = CURRENT.try_with(|r| {
        let mut w = r.lock();
        if !w.contains(&message) {
            w.push(message);
        }
    });
}

/// `299 - "message"`, with `"` and `\` escaped as RFC 7230 quoted-strings want.
fn header_value(message: &str) -> String {
    let escaped = message.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

/// Printable ASCII and spaces only (a header value cannot carry control characters; what a
/// webhook sends is not trusted).
fn sanitize(message: &str) -> String {
    message
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .collect::<String>()
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn warnings_reach_the_response_once_each() {
        let r = Recorder::default();
        r.scope(async {
            add("would violate PodSecurity \"restricted:latest\"");
            add("would violate PodSecurity \"restricted:latest\"");
            add("line\nbreak");
            add("   ");
        })
        .await;
        add("outside any request: dropped");
        let mut resp = super::super::output::text(http::StatusCode::OK, "");
        r.apply(&mut resp);
        let got: Vec<&str> = resp
            .headers()
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                r#"299 - "would violate PodSecurity \"restricted:latest\"""#,
                r#"299 - "line break""#
            ]
        );
    }
}
