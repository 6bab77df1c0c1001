//! Network programming latency as kube-proxy measures it: from the moment a change was
//! triggered, which the EndpointSlice controller writes into the slice's
//! `endpoints.kubernetes.io/last-change-trigger-time` annotation (a pod's Ready transition,
//! or the Service's creation), to the moment the data path holding the change is written.
//! As in kube-proxy, trigger times from before the proxy started are ignored: they would
//! measure the proxy's own (re)start, not the network.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::time::SystemTime;

pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The slice's trigger time, if it carries a well-formed one (RFC 3339).
pub fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get(TRIGGER_TIME_ANNOTATION)?;
    let ts: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(ts.into())
}

/// Trigger times of changes applied but not yet written to the data path.
pub struct Pending {
    started: SystemTime,
    times: Vec<SystemTime>,
}

impl Pending {
    pub fn new(started: SystemTime) -> Pending {
        Pending {
            started,
            times: Vec::new(),
        }
    }

    pub fn record(&mut self, trigger: SystemTime) {
        if trigger >= self.started {
            self.times.push(trigger);
        }
    }

    /// The latencies (seconds) of everything recorded, as of `written`; forgets them.
    pub fn drain(&mut self, written: SystemTime) -> Vec<f64> {
        self.times
            .drain(..)
            .map(|t| written.duration_since(t).map_or(0.0, |d| d.as_secs_f64()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn slice_with(annotation: &str) -> EndpointSlice {
        let mut s = EndpointSlice::default();
        s.metadata.annotations = Some(
            [(TRIGGER_TIME_ANNOTATION.to_string(), annotation.to_string())]
                .into_iter()
                .collect(),
        );
        s
    }

    #[test]
    fn parses_kubernetes_rfc3339_with_and_without_fractions() {
        let t = trigger_time(&slice_with("2024-05-01T10:00:00.250Z")).unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(secs.as_millis() % 1000, 250);
        assert!(trigger_time(&slice_with("2024-05-01T10:00:00Z")).is_some());
        assert!(trigger_time(&slice_with("yesterday")).is_none());
        assert!(trigger_time(&EndpointSlice::default()).is_none());
    }

    #[test]
    fn ignores_triggers_before_the_start_and_clamps_clock_skew() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut p = Pending::new(start);
        p.record(start - Duration::from_secs(5));
        p.record(start + Duration::from_secs(1));
        p.record(start + Duration::from_secs(3));
        let got = p.drain(start + Duration::from_secs(2));
        assert_eq!(got, vec![1.0, 0.0]);
        assert!(p.drain(start).is_empty(), "drained");
    }
}
