//! Resource metrics of this node, its pods and their containers, read from cgroups on a timer
//! (the kubelet's housekeeping: every 10 s) into a cache the API serves as `/stats/summary`
//! (the kubelet's Summary API) and `/metrics/resource` (Prometheus text with the kubelet's
//! metric names). Serving never touches the cgroup files, so a busy scraper costs nothing
//! but a clone of the last sample.
//!
//! - CPU: cumulative usage (`cpu.stat` usage_usec in the unified tree, else v1
//!   `cpuacct.usage`) and its rate over the sampling window (`usageNanoCores`).
//! - Memory: usage and working set = usage - inactive file pages, as cadvisor computes it
//!   (v2 `memory.current`/`memory.stat` inactive_file, else v1 `memory.usage_in_bytes`/
//!   `total_inactive_file`), and RSS (anon / total_rss).
//!
//! Node-level figures are the node's own cgroup subtree (`/skiff-<node>`), not the machine:
//! several skiff nodes may share one kernel, and each one's pods live under its subtree.
//! A pod's figures are its pod cgroup (`pod<uid>`, the sandbox included), a container's its
//! cgroup below it (named by the runtime's container id, cgroupfs layout).

use crate::agent::pods::PodIndex;
use crate::names::NodeName;
use control_plane::resource_metrics::summary::{
    ContainerStats, CpuStats, MemoryStats, NodeStats, PodReference, PodStats, Summary,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Where the cgroup hierarchies that hold CPU and memory accounting are mounted.
#[derive(Debug, Clone, Default)]
pub struct CgroupFs {
    /// The v2 tree (`/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on a
    /// hybrid one): `cpu.stat` is there for every cgroup, `memory.*` only when the memory
    /// controller is bound to v2.
    unified: Option<PathBuf>,
    /// The v1 `cpuacct` hierarchy (hybrid and v1 hosts).
    cpuacct: Option<PathBuf>,
    /// The v1 `memory` hierarchy (hybrid and v1 hosts).
    memory: Option<PathBuf>,
}

/// What one cgroup has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Nanoseconds of CPU since the cgroup was created.
    pub cpu_ns: Option<u64>,
    pub memory: Option<Memory>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub usage: u64,
    pub working_set: u64,
    pub rss: u64,
}

impl CgroupFs {
    /// The hierarchies mounted under `/sys/fs/cgroup`.
    pub fn detect() -> CgroupFs {
        CgroupFs::at(Path::new("/sys/fs/cgroup"))
    }

    /// The hierarchies under `root`, laid out as under `/sys/fs/cgroup`.
    pub fn at(root: &Path) -> CgroupFs {
        if root.join("cgroup.controllers").exists() {
            return CgroupFs {
                unified: Some(root.to_path_buf()),
                ..CgroupFs::default()
            };
        }
        let dir = |name: &str| Some(root.join(name)).filter(|p| p.is_dir());
        CgroupFs {
            unified: dir("unified").filter(|p| p.join("cgroup.controllers").exists()),
            cpuacct: dir("cpuacct").or_else(|| dir("cpu,cpuacct")),
            memory: dir("memory"),
        }
    }

    /// The usage of the cgroup `path` (e.g. `/skiff-n1/pod<uid>`); None where it is not
    /// there (not created yet, or gone).
    pub fn read(&self, path: &str) -> Usage {
        let rel = path.trim_start_matches('/');
        let file = |root: &Option<PathBuf>, name: &str| {
            root.as_ref()
                .and_then(|r| std::fs::read_to_string(r.join(rel).join(name)).ok())
        };
        let cpu_ns = file(&self.unified, "cpu.stat")
            .and_then(|s| keyed(&s, "usage_usec"))
            .map(|us| us.saturating_mul(1000))
            .or_else(|| file(&self.cpuacct, "cpuacct.usage").and_then(|s| s.trim().parse().ok()));
        let memory = match file(&self.unified, "memory.current") {
            Some(current) => current.trim().parse().ok().map(|usage| {
                let stat = file(&self.unified, "memory.stat").unwrap_or_default();
                Memory::of(usage, keyed(&stat, "inactive_file"), keyed(&stat, "anon"))
            }),
            None => file(&self.memory, "memory.usage_in_bytes")
                .and_then(|s| s.trim().parse().ok())
                .map(|usage| {
                    let stat = file(&self.memory, "memory.stat").unwrap_or_default();
                    Memory::of(
                        usage,
                        keyed(&stat, "total_inactive_file"),
                        keyed(&stat, "total_rss"),
                    )
                }),
        };
        Usage { cpu_ns, memory }
    }
}

impl Memory {
    fn of(usage: u64, inactive_file: Option<u64>, rss: Option<u64>) -> Memory {
        Memory {
            usage,
            working_set: usage.saturating_sub(inactive_file.unwrap_or(0)),
            rss: rss.unwrap_or(0),
        }
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` per line).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The last sample, shared by the sampler and the API.
pub type StatsCache = Arc<RwLock<Option<Arc<Summary>>>>;

/// What the sampler needs of a pod, copied out of the pod index so no lock is held while
/// files are read.
struct PodEntry {
    reference: PodReference,
    start_time: Option<Time>,
    /// (name, runtime id, started at) of each running container.
    containers: Vec<(String, String, Option<Time>)>,
}

/// Reads the cgroups of the node and its pods; keeps the previous CPU reading of each
/// cgroup for the rate.
pub struct Sampler {
    fs: CgroupFs,
    node: NodeName,
    pods: PodIndex,
    started: Time,
    /// Cgroup path -> (when, cumulative CPU ns) at the last sample; only cgroups still
    /// present are kept.
    previous: HashMap<String, (Instant, u64)>,
}

impl Sampler {
    pub fn new(fs: CgroupFs, node: NodeName, pods: PodIndex) -> Sampler {
        Sampler {
            fs,
            node,
            pods,
            started: Time(Timestamp::now()),
            previous: HashMap::new(),
        }
    }

    fn entries(&self) -> Vec<PodEntry> {
        let pods = self.pods.read().unwrap_or_else(|e| e.into_inner());
        pods.values()
            .filter_map(|p| {
                let status = p.status.as_ref();
                let containers = status
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| {
                        let running = c.state.as_ref()?.running.as_ref()?;
                        let id = c.container_id.as_deref()?;
                        let id = id.split_once("://").map_or(id, |(_, id)| id);
                        Some((c.name.clone(), id.to_string(), running.started_at.clone()))
                    })
                    .collect();
                Some(PodEntry {
                    reference: PodReference {
                        name: p.metadata.name.clone()?,
                        namespace: p.metadata.namespace.clone()?,
                        uid: p.metadata.uid.clone()?,
                    },
                    start_time: status.and_then(|s| s.start_time.clone()),
                    containers,
                })
            })
            .collect()
    }

    /// One sample of the node, every pod with a cgroup, and their running containers.
    pub fn sample(&mut self) -> Summary {
        let entries = self.entries();
        let now = Timestamp::now();
        let instant = Instant::now();
        let (fs, previous) = (&self.fs, &self.previous);
        let mut seen = HashMap::new();
        let mut stats = |path: String| -> (Option<CpuStats>, Option<MemoryStats>) {
            let usage = fs.read(&path);
            let cpu = usage.cpu_ns.map(|ns| {
                let rate = previous
                    .get(&path)
                    .and_then(|&(then, before)| nano_cores(before, ns, instant - then));
                seen.insert(path, (instant, ns));
                CpuStats {
                    time: Time(now),
                    usage_nano_cores: rate,
                    usage_core_nano_seconds: Some(ns),
                }
            });
            let memory = usage.memory.map(|m| MemoryStats {
                time: Time(now),
                usage_bytes: Some(m.usage),
                working_set_bytes: Some(m.working_set),
                rss_bytes: Some(m.rss),
            });
            (cpu, memory)
        };
        let (cpu, memory) = stats(self.node.cgroup_root());
        let node = NodeStats {
            node_name: self.node.to_string(),
            start_time: Some(self.started.clone()),
            cpu,
            memory,
        };
        let mut pods = Vec::new();
        for entry in entries {
            let pod_cgroup = self.node.pod_cgroup(&entry.reference.uid);
            let (cpu, memory) = stats(pod_cgroup.clone());
            if cpu.is_none() && memory.is_none() {
                // No cgroup (yet, or any more): nothing to say about this pod.
                continue;
            }
            let containers = entry
                .containers
                .into_iter()
                .filter_map(|(name, id, start_time)| {
                    let (cpu, memory) = stats(format!("{pod_cgroup}/{id}"));
                    (cpu.is_some() || memory.is_some()).then_some(ContainerStats {
                        name,
                        start_time,
                        cpu,
                        memory,
                    })
                })
                .collect();
            pods.push(PodStats {
                pod_ref: entry.reference,
                start_time: entry.start_time,
                containers,
                cpu,
                memory,
            });
        }
        pods.sort_by(|a, b| {
            (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
        });
        self.previous = seen;
        Summary { node, pods }
    }
}

/// The CPU rate between two readings, in billionths of a core; None when the window is
/// empty or the counter went back (a new cgroup under the same path).
fn nano_cores(before: u64, after: u64, window: Duration) -> Option<u64> {
    let used = after.checked_sub(before)?;
    let window = window.as_nanos();
    (window > 0).then(|| (u128::from(used) * 1_000_000_000 / window) as u64)
}

/// Samples every `every` into `cache` until `stop` (file reads on the blocking pool).
pub async fn run(sampler: Sampler, cache: StatsCache, every: Duration, stop: CancellationToken) {
    let sampler = Arc::new(Mutex::new(sampler));
    loop {
        let s = sampler.clone();
        let sampled = tokio::task::spawn_blocking(move || {
            s.lock().unwrap_or_else(|e| e.into_inner()).sample()
        })
        .await;
        match sampled {
            Ok(summary) => {
                *cache.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(summary))
            }
            Err(e) => tracing::warn!(error = %e, "sampling resource usage failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn millis(t: &Time) -> i64 {
    t.0.as_millisecond()
}

/// `/metrics/resource`: the kubelet's resource metrics (names, labels, types and
/// timestamps as the kubelet writes them) from one sample.
pub fn resource_metrics(summary: &Summary) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64, i64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, at) in rows {
            let _ = writeln!(out, "{name}{labels} {value} {at}");
        }
    };
    let pod_labels = |p: &PodStats| {
        format!(
            "namespace=\"{}\",pod=\"{}\"",
            label(&p.pod_ref.namespace),
            label(&p.pod_ref.name)
        )
    };
    let cpu = |c: &Option<CpuStats>| {
        c.as_ref().and_then(|c| {
            c.usage_core_nano_seconds
                .map(|ns| (ns as f64 / 1e9, millis(&c.time)))
        })
    };
    let mem = |m: &Option<MemoryStats>| {
        m.as_ref()
            .and_then(|m| m.working_set_bytes.map(|b| (b as f64, millis(&m.time))))
    };
    let containers = || {
        summary.pods.iter().flat_map(move |p| {
            p.containers.iter().map(move |c| {
                (
                    format!("{{container=\"{}\",{}}}", label(&c.name), pod_labels(p)),
                    c,
                )
            })
        })
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        containers()
            .filter_map(|(l, c)| cpu(&c.cpu).map(|(v, t)| (l, v, t)))
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        containers()
            .filter_map(|(l, c)| mem(&c.memory).map(|(v, t)| (l, v, t)))
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        containers()
            .filter_map(|(l, c)| {
                let s = c.start_time.as_ref()?;
                Some((l, s.0.as_second() as f64, millis(s)))
            })
            .collect(),
    );
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        cpu(&summary.node.cpu)
            .map(|(v, t)| (String::new(), v, t))
            .into_iter()
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        mem(&summary.node.memory)
            .map(|(v, t)| (String::new(), v, t))
            .into_iter()
            .collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        summary
            .pods
            .iter()
            .filter_map(|p| cpu(&p.cpu).map(|(v, t)| (format!("{{{}}}", pod_labels(p)), v, t)))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        summary
            .pods
            .iter()
            .filter_map(|p| mem(&p.memory).map(|(v, t)| (format!("{{{}}}", pod_labels(p)), v, t)))
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error 0"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn reads_a_pure_v2_tree() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "cgroup.controllers", "cpu memory");
        let pod = root.path().join("skiff-n1/podu1");
        write(&pod, "cpu.stat", "usage_usec 2500\nuser_usec 2000\n");
        write(&pod, "memory.current", "1000000\n");
        write(
            &pod,
            "memory.stat",
            "anon 300000\nfile 700000\ninactive_file 400000\n",
        );
        let fs = CgroupFs::at(root.path());
        assert_eq!(
            fs.read("/skiff-n1/podu1"),
            Usage {
                cpu_ns: Some(2_500_000),
                memory: Some(Memory {
                    usage: 1_000_000,
                    working_set: 600_000,
                    rss: 300_000
                }),
            }
        );
        assert_eq!(fs.read("/skiff-n1/gone"), Usage::default());
    }

    #[test]
    fn reads_a_hybrid_tree() {
        let root = tempfile::tempdir().unwrap();
        write(&root.path().join("unified"), "cgroup.controllers", "");
        // CPU from the unified tree's cpu.stat (always there), memory from v1.
        write(
            &root.path().join("unified/skiff-n1"),
            "cpu.stat",
            "usage_usec 7\n",
        );
        write(
            &root.path().join("cpuacct/skiff-n1"),
            "cpuacct.usage",
            "999\n",
        );
        let mem = root.path().join("memory/skiff-n1");
        write(&mem, "memory.usage_in_bytes", "5000\n");
        write(
            &mem,
            "memory.stat",
            "inactive_file 1\ntotal_rss 1500\ntotal_inactive_file 2000\n",
        );
        let fs = CgroupFs::at(root.path());
        let u = fs.read("/skiff-n1");
        assert_eq!(u.cpu_ns, Some(7000));
        assert_eq!(
            u.memory,
            Some(Memory {
                usage: 5000,
                working_set: 3000,
                rss: 1500
            })
        );
        // No unified tree: CPU from cpuacct.
        std::fs::remove_dir_all(root.path().join("unified")).unwrap();
        assert_eq!(
            CgroupFs::at(root.path()).read("/skiff-n1").cpu_ns,
            Some(999)
        );
    }

    #[test]
    fn rates_need_a_window_and_a_growing_counter() {
        let s = Duration::from_secs(2);
        assert_eq!(
            nano_cores(1_000_000_000, 2_000_000_000, s),
            Some(500_000_000)
        );
        assert_eq!(nano_cores(5, 4, s), None);
        assert_eq!(nano_cores(1, 2, Duration::ZERO), None);
    }

    #[test]
    fn samples_the_node_and_its_pods_with_rates() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "cgroup.controllers", "cpu memory");
        let node = root.path().join("skiff-n1");
        write(&node, "cpu.stat", "usage_usec 1000\n");
        write(&node.join("podu1"), "cpu.stat", "usage_usec 500\n");
        write(&node.join("podu1/c1"), "cpu.stat", "usage_usec 400\n");
        write(&node.join("podu1/c1"), "memory.current", "4096\n");
        let pods: PodIndex = Default::default();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "status": {"containerStatuses": [
                {"name": "app", "containerID": "containerd://c1", "image": "i", "imageID": "",
                 "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
                {"name": "waiting", "image": "i", "imageID": "", "ready": false,
                 "restartCount": 0, "state": {"waiting": {}}}
            ]}
        }))
        .unwrap();
        pods.write()
            .unwrap()
            .insert(("default".into(), "web".into()), pod);
        let mut sampler =
            Sampler::new(CgroupFs::at(root.path()), NodeName::new("n1"), pods.clone());
        let first = sampler.sample();
        assert_eq!(first.node.node_name, "n1");
        let cpu = first.node.cpu.clone().unwrap();
        assert_eq!(cpu.usage_core_nano_seconds, Some(1_000_000));
        assert_eq!(cpu.usage_nano_cores, None, "no rate from one sample");
        assert_eq!(first.pods.len(), 1);
        assert_eq!(first.pods[0].containers.len(), 1, "only running containers");
        let c = &first.pods[0].containers[0];
        assert_eq!(c.name, "app");
        assert_eq!(c.memory.as_ref().unwrap().working_set_bytes, Some(4096));

        write(&node, "cpu.stat", "usage_usec 2000000\n");
        std::thread::sleep(Duration::from_millis(20));
        let second = sampler.sample();
        let rate = second.node.cpu.as_ref().unwrap().usage_nano_cores.unwrap();
        assert!(rate > 0, "{rate}");

        let text = resource_metrics(&second);
        assert!(text.contains("# TYPE node_cpu_usage_seconds_total counter"));
        assert!(text.contains("node_cpu_usage_seconds_total 2 "), "{text}");
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 4096 "
        ));
        assert!(
            text.contains("pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 0.0005 ")
        );
        assert!(text.contains("container_start_time_seconds{container=\"app\""));
        assert!(text.ends_with("resource_scrape_error 0\n"));
    }
}
