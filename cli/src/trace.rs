//! The path of a Deployment, Service or Pod from the API server's acceptance to every node's
//! data path, as steps with times: what `kubectl skiff trace` prints.
//!
//! Times from API objects are Kubernetes `metav1.Time`: whole seconds (truncated), so two
//! API steps within one second show the same time. The proxies' times (`Programmed`) have
//! the clock's resolution. Steps are listed in the path's order (per pod), not sorted by
//! time: a step missing its time is shown as pending where it belongs.

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use std::fmt::Write as _;

/// One step of the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    /// The traced object was stored by the API server.
    Accepted,
    ReplicaSetCreated,
    PodCreated,
    Scheduled,
    /// The pod's sandbox (network namespace and address) is up: PodReadyToStartContainers.
    SandboxReady,
    ImagePulled,
    Started,
    Ready,
    /// An EndpointSlice of a Service selecting the pod lists it ready.
    InEndpointSlice,
    /// A node's service proxy wrote the pod's address into its maps.
    Programmed,
    /// A cluster DNS server answers the Service's name: with the pod's address (headless
    /// Service), or with the cluster IP (then a step of the Service, not of one pod).
    Resolvable,
}

impl StepKind {
    pub fn label(self) -> &'static str {
        match self {
            StepKind::Accepted => "accepted",
            StepKind::ReplicaSetCreated => "ReplicaSet created",
            StepKind::PodCreated => "pod created",
            StepKind::Scheduled => "scheduled",
            StepKind::SandboxReady => "sandbox ready",
            StepKind::ImagePulled => "image pulled",
            StepKind::Started => "started",
            StepKind::Ready => "Ready",
            StepKind::InEndpointSlice => "in EndpointSlice",
            StepKind::Programmed => "programmed",
            StepKind::Resolvable => "name resolvable",
        }
    }
}

/// How precise a step's time is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Precision {
    /// `metav1.Time`: truncated to the second.
    Second,
    /// The writer's clock, to the nanosecond.
    Fine,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub kind: StepKind,
    /// The object the step is about (`pod/web-1`).
    pub object: String,
    /// Where it forks: the node, the slice, the container.
    pub detail: String,
    /// None: not happened (yet), or not reported.
    #[serde(serialize_with = "ser_time")]
    pub at: Option<Timestamp>,
    pub precision: Precision,
    /// Milliseconds since `accepted` (computed by [`Trace::finish`]).
    pub since_accepted_ms: Option<i64>,
}

fn ser_time<S: serde::Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&t.to_string()),
        None => s.serialize_none(),
    }
}

impl Step {
    pub fn new(kind: StepKind, object: impl Into<String>, at: Option<Timestamp>) -> Step {
        Step {
            kind,
            object: object.into(),
            detail: String::new(),
            at,
            precision: Precision::Second,
            since_accepted_ms: None,
        }
    }

    pub fn detail(mut self, d: impl Into<String>) -> Step {
        self.detail = d.into();
        self
    }

    pub fn fine(mut self) -> Step {
        self.precision = Precision::Fine;
        self
    }
}

/// A whole trace.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// `deployment/web`
    pub target: String,
    pub namespace: String,
    pub steps: Vec<Step>,
    /// What could not be read (a proxy that did not answer): the trace is partial.
    pub notes: Vec<String>,
}

impl Trace {
    /// Fills in the time since the `accepted` step, and lists steps that happen side by
    /// side (one pod programmed on every node) by time, the pending ones last.
    pub fn finish(mut self) -> Trace {
        for run in self
            .steps
            .chunk_by_mut(|a, b| a.kind == b.kind && a.object == b.object)
        {
            run.sort_by_key(|s| (s.at.is_none(), s.at));
        }
        let accepted = self
            .steps
            .iter()
            .find(|s| s.kind == StepKind::Accepted)
            .and_then(|s| s.at);
        for s in &mut self.steps {
            s.since_accepted_ms = match (accepted, s.at) {
                (Some(a), Some(t)) => Some(t.duration_since(a).as_millis() as i64),
                _ => None,
            };
        }
        self
    }

    /// The table `kubectl skiff trace` prints.
    pub fn table(&self) -> String {
        let rows: Vec<[String; 5]> = self
            .steps
            .iter()
            .map(|s| {
                [
                    s.kind.label().to_string(),
                    s.object.clone(),
                    s.detail.clone(),
                    s.since_accepted_ms
                        .map_or_else(|| "-".into(), |ms| format!("+{ms}")),
                    match (s.at, s.precision) {
                        (None, _) => "pending".into(),
                        (Some(t), Precision::Second) => {
                            t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
                        }
                        (Some(t), Precision::Fine) => {
                            t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
                        }
                    },
                ]
            })
            .collect();
        let header = ["STEP", "OBJECT", "WHERE", "MS", "TIME"];
        let mut width = header.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(header.map(String::from)).chain(rows) {
            let line = format!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let _ = writeln!(
            out,
            "MS: milliseconds since accepted. API times are whole seconds (metav1.Time); programmed and name resolvable times are the proxies' and DNS servers' clocks."
        );
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Option<Timestamp> {
        Some(s.parse().unwrap())
    }

    fn sample() -> Trace {
        Trace {
            target: "deployment/web".into(),
            namespace: "default".into(),
            steps: vec![
                Step::new(
                    StepKind::Accepted,
                    "deployment/web",
                    t("2026-12-02T10:00:00Z"),
                ),
                Step::new(StepKind::Scheduled, "pod/web-1", t("2026-12-02T10:00:01Z"))
                    .detail("node-1"),
                Step::new(
                    StepKind::Programmed,
                    "pod/web-1",
                    t("2026-12-02T10:00:02.250Z"),
                )
                .detail("node-2")
                .fine(),
                Step::new(StepKind::Programmed, "pod/web-1", None).detail("node-1"),
            ],
            notes: vec!["proxy on node-3 did not answer".into()],
        }
        .finish()
    }

    #[test]
    fn times_are_relative_to_accepted() {
        let tr = sample();
        let ms: Vec<Option<i64>> = tr.steps.iter().map(|s| s.since_accepted_ms).collect();
        assert_eq!(ms, [Some(0), Some(1000), Some(2250), None]);
    }

    #[test]
    fn the_table_has_one_aligned_line_per_step() {
        let text = sample().table();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("STEP"), "{text}");
        assert!(lines[1].starts_with("accepted"), "{text}");
        assert!(
            lines[2].contains("node-1") && lines[2].contains("+1000"),
            "{text}"
        );
        assert!(
            lines[3].ends_with("+2250  2026-12-02T10:00:02.250Z"),
            "{text}"
        );
        assert!(
            lines[4].ends_with("pending") && lines[4].contains(" - "),
            "{text}"
        );
        // The object column starts at the same offset on every line.
        let col = lines[0].find("OBJECT").unwrap();
        assert_eq!(&lines[2][col..col + 9], "pod/web-1");
        assert!(text.contains("note: proxy on node-3 did not answer"));
    }

    #[test]
    fn json_names_steps_and_times() {
        let v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["steps"][2]["kind"], "programmed");
        assert_eq!(v["steps"][2]["at"], "2026-12-02T10:00:02.25Z");
        assert_eq!(v["steps"][2]["precision"], "fine");
        assert_eq!(v["steps"][3]["at"], serde_json::Value::Null);
        assert_eq!(v["steps"][1]["sinceAcceptedMs"], 1000);
    }

    #[test]
    fn one_pods_steps_on_several_nodes_are_listed_by_time() {
        let tr = Trace {
            target: "pod/web-1".into(),
            namespace: "default".into(),
            steps: vec![
                Step::new(StepKind::Accepted, "pod/web-1", t("2026-12-02T10:00:00Z")),
                Step::new(StepKind::Programmed, "pod/web-1", None).detail("node-0"),
                Step::new(
                    StepKind::Programmed,
                    "pod/web-1",
                    t("2026-12-02T10:00:01.081Z"),
                )
                .detail("node-1"),
                Step::new(
                    StepKind::Programmed,
                    "pod/web-1",
                    t("2026-12-02T10:00:01.077Z"),
                )
                .detail("node-2"),
            ],
            notes: vec![],
        }
        .finish();
        let nodes: Vec<_> = tr.steps.iter().map(|s| s.detail.clone()).collect();
        assert_eq!(nodes, ["", "node-2", "node-1", "node-0"]);
    }

    #[test]
    fn steps_order_as_the_path() {
        assert!(StepKind::Accepted < StepKind::ReplicaSetCreated);
        assert!(StepKind::Ready < StepKind::InEndpointSlice);
        assert!(StepKind::InEndpointSlice < StepKind::Programmed);
        assert!(StepKind::Programmed < StepKind::Resolvable);
    }
}
