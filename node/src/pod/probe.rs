//! Container probes (startup, liveness, readiness): when each is due, how its consecutive
//! results cross the thresholds, and running one (httpGet, tcpSocket, exec).

use crate::cri::Cri;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

/// What the thresholds have decided so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Unknown,
    Success,
    Failure,
}

/// One probe of one running container.
#[derive(Debug, Clone)]
pub struct ProbeState {
    pub kind: ProbeKind,
    spec: Probe,
    next_at: Instant,
    successes: i32,
    failures: i32,
    pub verdict: Verdict,
}

fn secs(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(v.unwrap_or(default).max(0) as u64)
}

impl ProbeState {
    /// A probe for a container that started at `started`.
    pub fn new(kind: ProbeKind, spec: Probe, started: Instant) -> ProbeState {
        let next_at = started + secs(spec.initial_delay_seconds, 0);
        ProbeState {
            kind,
            spec,
            next_at,
            successes: 0,
            failures: 0,
            verdict: Verdict::Unknown,
        }
    }

    /// Starts over as if the container started at `at` (after a startup probe succeeds).
    pub fn rearm(&mut self, at: Instant) {
        *self = ProbeState::new(self.kind, self.spec.clone(), at);
    }

    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    pub fn timeout(&self) -> Duration {
        secs(self.spec.timeout_seconds, 1).max(Duration::from_secs(1))
    }

    /// Records one result at `now`; returns the verdict if it changed.
    pub fn record(&mut self, ok: bool, now: Instant) -> Option<Verdict> {
        self.next_at = now + secs(self.spec.period_seconds, 10).max(Duration::from_secs(1));
        let verdict = if ok {
            self.failures = 0;
            self.successes += 1;
            (self.successes >= self.spec.success_threshold.unwrap_or(1).max(1))
                .then_some(Verdict::Success)
        } else {
            self.successes = 0;
            self.failures += 1;
            (self.failures >= self.spec.failure_threshold.unwrap_or(3).max(1))
                .then_some(Verdict::Failure)
        };
        match verdict {
            Some(v) if v != self.verdict => {
                self.verdict = v;
                if v == Verdict::Failure {
                    // A liveness failure restarts the container; count afresh afterwards.
                    self.failures = 0;
                }
                Some(v)
            }
            _ => None,
        }
    }

    /// Runs the probe once against the container.
    pub async fn run(&self, target: &Target<'_>) -> Result<(), String> {
        let timeout = self.timeout();
        let p = &self.spec;
        if let Some(http) = &p.http_get {
            let host = http.host.clone().unwrap_or_else(|| target.ip.to_string());
            let port = port(&http.port, target.container)?;
            let path = http.path.clone().unwrap_or_else(|| "/".into());
            tokio::time::timeout(timeout, http_get(&host, port, &path))
                .await
                .map_err(|_| {
                    format!("Get \"http://{host}:{port}{path}\": context deadline exceeded")
                })?
        } else if let Some(tcp) = &p.tcp_socket {
            let host = tcp.host.clone().unwrap_or_else(|| target.ip.to_string());
            let port = port(&tcp.port, target.container)?;
            match tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), port)),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
                Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
            }
        } else if let Some(exec) = &p.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let out = tokio::time::timeout(
                timeout + Duration::from_secs(1),
                target.cri.exec_sync(target.container_id, cmd, timeout),
            )
            .await
            .map_err(|_| "command timed out".to_string())?
            .map_err(|e| e.message())?;
            if out.exit_code == 0 {
                Ok(())
            } else {
                let text = String::from_utf8_lossy(&out.stdout).to_string()
                    + &String::from_utf8_lossy(&out.stderr);
                Err(format!(
                    "command exited with {}: {}",
                    out.exit_code,
                    text.trim()
                ))
            }
        } else {
            Err("probe has no handler".into())
        }
    }
}

/// What a probe runs against.
pub struct Target<'a> {
    pub ip: &'a str,
    pub container: &'a Container,
    pub container_id: &'a str,
    pub cri: &'a Cri,
}

/// A numeric port, or a named one looked up in the container's ports.
pub fn port(p: &IntOrString, c: &Container) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("port {name:?} not found in the container's ports"))
        }
    }
}

/// An HTTP GET whose status 200-399 is success, as the kubelet's prober.
async fn http_get(host: &str, port: u16, path: &str) -> Result<(), String> {
    let url = format!("http://{host}:{port}{path}");
    let mut s = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let mut head = vec![0u8; 64];
    let n = s
        .read(&mut head)
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("Get \"{url}\": malformed HTTP response"))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        let spec = Probe {
            failure_threshold: Some(2),
            success_threshold: Some(1),
            period_seconds: Some(5),
            ..Default::default()
        };
        let t0 = Instant::now();
        let mut p = ProbeState::new(ProbeKind::Liveness, spec, t0);
        assert_eq!(p.next_at(), t0);
        assert_eq!(p.record(true, t0), Some(Verdict::Success));
        assert_eq!(p.next_at(), t0 + Duration::from_secs(5));
        assert_eq!(
            p.record(false, t0),
            None,
            "one failure is below the threshold"
        );
        assert_eq!(p.record(true, t0), None, "a success resets the count");
        assert_eq!(p.record(false, t0), None);
        assert_eq!(p.record(false, t0), Some(Verdict::Failure));
    }

    #[test]
    fn named_ports() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap();
        assert_eq!(port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(port(&IntOrString::Int(81), &c), Ok(81));
        assert!(port(&IntOrString::String("nope".into()), &c).is_err());
    }
}
