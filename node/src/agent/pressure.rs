//! The node's pressure conditions, from what the machine has left against kubelet-style hard
//! eviction thresholds (`--eviction-hard`): `memory.available` (MemAvailable), `nodefs.available`
//! and `nodefs.inodesFree` (the filesystem of the agent's data dir, where pods' volumes, logs
//! and containerd's images live), `pid.available` (pid_max minus the processes running).
//! Kubernetes' Linux defaults apply unless the flag says otherwise: memory.available<100Mi,
//! nodefs.available<10%, nodefs.inodesFree<5% (no PID threshold by default).
//! Observation reads /proc and statvfs; evaluation is pure and unit-tested.

use control_plane::machinery::quantity::Quantity;
use std::path::Path;
use std::str::FromStr;

/// What a threshold watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    PidAvailable,
}

impl Signal {
    fn parse(s: &str) -> Option<Signal> {
        Some(match s {
            "memory.available" => Signal::MemoryAvailable,
            "nodefs.available" => Signal::NodefsAvailable,
            "nodefs.inodesFree" => Signal::NodefsInodesFree,
            "pid.available" => Signal::PidAvailable,
            _ => return None,
        })
    }
}

/// A threshold's amount: absolute (bytes, inodes, pids) or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Absolute(i64),
    Percent(f64),
}

/// `signal<amount`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub amount: Amount,
}

/// The kubelet's Linux defaults for `--eviction-hard`.
pub const KUBELET_DEFAULTS: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%";

/// The hard eviction thresholds in force.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds(pub Vec<Threshold>);

impl Default for Thresholds {
    fn default() -> Thresholds {
        KUBELET_DEFAULTS.parse().expect("valid defaults")
    }
}

impl FromStr for Thresholds {
    type Err = String;

    /// `signal<amount[,signal<amount...]`; the amount a quantity (`100Mi`, `1000`) or `N%`.
    fn from_str(s: &str) -> Result<Thresholds, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, amount) = part
                .split_once('<')
                .ok_or_else(|| format!("{part:?}: expected signal<amount"))?;
            let signal = Signal::parse(name.trim()).ok_or_else(|| {
                format!(
                    "{name:?}: unknown signal (memory.available, nodefs.available, \
                     nodefs.inodesFree, pid.available)"
                )
            })?;
            let amount = amount.trim();
            let amount = match amount.strip_suffix('%') {
                Some(p) => {
                    let v: f64 = p
                        .parse()
                        .map_err(|_| format!("{amount:?}: bad percentage"))?;
                    if !(0.0..=100.0).contains(&v) {
                        return Err(format!("{amount:?}: a percentage is 0-100"));
                    }
                    Amount::Percent(v)
                }
                None => Amount::Absolute(
                    Quantity::parse(amount)
                        .map_err(|e| format!("{amount:?}: {e}"))?
                        .value(),
                ),
            };
            out.push(Threshold { signal, amount });
        }
        Ok(Thresholds(out))
    }
}

/// What is left and what there is, per signal.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    pub memory: (i64, i64),
    pub nodefs: (i64, i64),
    pub inodes: (i64, i64),
    pub pids: (i64, i64),
}

impl Observed {
    fn of(&self, s: Signal) -> (i64, i64) {
        match s {
            Signal::MemoryAvailable => self.memory,
            Signal::NodefsAvailable => self.nodefs,
            Signal::NodefsInodesFree => self.inodes,
            Signal::PidAvailable => self.pids,
        }
    }
}

/// Which pressure conditions hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// A threshold is crossed when what is left is below its amount (a capacity of 0, a signal
/// that could not be read, crosses nothing).
pub fn evaluate(thresholds: &Thresholds, seen: &Observed) -> Pressure {
    let mut p = Pressure::default();
    for t in &thresholds.0 {
        let (available, capacity) = seen.of(t.signal);
        if capacity <= 0 {
            continue;
        }
        let crossed = match t.amount {
            Amount::Absolute(a) => available < a,
            Amount::Percent(pc) => (available as f64) < capacity as f64 * pc / 100.0,
        };
        if crossed {
            match t.signal {
                Signal::MemoryAvailable => p.memory = true,
                Signal::NodefsAvailable | Signal::NodefsInodesFree => p.disk = true,
                Signal::PidAvailable => p.pid = true,
            }
        }
    }
    p
}

fn meminfo_kib(text: &str, key: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The machine now, with `data_dir`'s filesystem as nodefs.
pub fn observe(data_dir: &Path) -> Observed {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = (
        meminfo_kib(&meminfo, "MemAvailable:") * 1024,
        meminfo_kib(&meminfo, "MemTotal:") * 1024,
    );
    let (nodefs, inodes) = match nix::sys::statvfs::statvfs(data_dir) {
        Ok(st) => {
            let frag = st.fragment_size() as i64;
            (
                (
                    st.blocks_available() as i64 * frag,
                    st.blocks() as i64 * frag,
                ),
                (st.files_available() as i64, st.files() as i64),
            )
        }
        Err(_) => ((0, 0), (0, 0)),
    };
    let pid_max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    // /proc/loadavg's fourth field: running/total scheduling entities (threads included,
    // as they take pids too).
    let used: i64 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(3)
                .and_then(|f| f.split_once('/'))
                .and_then(|(_, total)| total.parse().ok())
        })
        .unwrap_or(0);
    Observed {
        memory,
        nodefs,
        inodes,
        pids: ((pid_max - used).max(0), pid_max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_syntax_and_refuses_nonsense() {
        let t: Thresholds = "memory.available<1Gi, nodefs.available<10%,pid.available<1000"
            .parse()
            .unwrap();
        assert_eq!(
            t.0,
            vec![
                Threshold {
                    signal: Signal::MemoryAvailable,
                    amount: Amount::Absolute(1 << 30)
                },
                Threshold {
                    signal: Signal::NodefsAvailable,
                    amount: Amount::Percent(10.0)
                },
                Threshold {
                    signal: Signal::PidAvailable,
                    amount: Amount::Absolute(1000)
                },
            ]
        );
        assert_eq!(Thresholds::default().0.len(), 3);
        for bad in [
            "memory.available>1Gi",
            "cpu.available<1",
            "nodefs.available<120%",
            "memory.available<lots",
        ] {
            assert!(bad.parse::<Thresholds>().is_err(), "{bad}");
        }
    }

    #[test]
    fn each_signal_raises_its_condition() {
        let t = Thresholds::default();
        let fine = Observed {
            memory: (4 << 30, 8 << 30),
            nodefs: (50, 100),
            inodes: (50, 100),
            pids: (30_000, 32_768),
        };
        assert_eq!(evaluate(&t, &fine), Pressure::default());
        let low_memory = Observed {
            memory: (50 << 20, 8 << 30),
            ..fine
        };
        assert!(evaluate(&t, &low_memory).memory);
        let full_disk = Observed {
            nodefs: (9, 100),
            ..fine
        };
        assert_eq!(
            evaluate(&t, &full_disk),
            Pressure {
                disk: true,
                ..Pressure::default()
            }
        );
        assert!(
            evaluate(
                &t,
                &Observed {
                    inodes: (4, 100),
                    ..fine
                }
            )
            .disk
        );
        let pid: Thresholds = "pid.available<10%".parse().unwrap();
        assert!(!evaluate(&pid, &fine).pid);
        assert!(
            evaluate(
                &pid,
                &Observed {
                    pids: (100, 32_768),
                    ..fine
                }
            )
            .pid
        );
        // Nothing known, nothing crossed.
        assert_eq!(evaluate(&t, &Observed::default()), Pressure::default());
    }

    #[test]
    fn observes_this_machine() {
        let o = observe(Path::new("/"));
        for (what, (available, capacity)) in
            [("memory", o.memory), ("nodefs", o.nodefs), ("pids", o.pids)]
        {
            assert!(
                capacity > 0 && (0..=capacity).contains(&available),
                "{what}: {o:?}"
            );
        }
    }
}
