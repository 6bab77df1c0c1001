//! The proxy's kernel programs' own cost, from the kernel's run statistics
//! (`bpf_prog_info.run_cnt` and `run_time_ns`): how many times each attached program ran
//! during a measurement and the nanoseconds it spent per run, read by the bench itself.
//!
//! The kernel counts only while statistics are enabled. `BPF_ENABLE_STATS` turns them on for
//! as long as the returned descriptor is open, counted per holder (it is what
//! `kernel.bpf_stats_enabled` reports): nothing to restore afterwards, and a bench that
//! ends early cannot leave them on for the machine.
//!
//! Programs are found through the links the proxy pins under its bpffs directory
//! (`links/<program>` for the cgroup hooks, `links/<program>@<ifindex>` for the tc and XDP
//! programs of each node interface), so only this bench's proxy is measured, not another
//! proxy loaded on the machine at the same time.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Kernel statistics on while this lives.
pub struct Enabled(#[allow(dead_code)] OwnedFd);

pub fn enable() -> Result<Enabled> {
    let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("BPF_ENABLE_STATS (run time statistics of BPF programs)")?;
    Ok(Enabled(fd))
}

/// Runs and nanoseconds so far per program name (summed over its interfaces).
#[derive(Clone, Debug, Default)]
pub struct Snapshot(BTreeMap<String, (u64, u64)>);

/// Each program's runs and time per run between two snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cost {
    pub program: String,
    pub runs: u64,
    pub ns_per_run: f64,
}

/// The programs attached through the links pinned under `bpffs`.
pub fn snapshot(bpffs: &Path) -> Result<Snapshot> {
    let dir = bpffs.join("links");
    let mut ids: BTreeMap<u32, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        let program = file.split('@').next().unwrap_or(&file).to_string();
        let link = aya::programs::links::PinnedLink::from_pin(entry.path())
            .with_context(|| format!("opening the link {}", entry.path().display()))?;
        let info = aya::programs::links::FdLink::from(link)
            .info()
            .with_context(|| format!("reading the link {}", entry.path().display()))?;
        ids.insert(info.program_id(), program);
    }
    let mut out = BTreeMap::new();
    for info in aya::programs::loaded_programs() {
        let info = info.context("listing loaded BPF programs")?;
        if let Some(program) = ids.get(&info.id()) {
            let e: &mut (u64, u64) = out.entry(program.clone()).or_default();
            e.0 += info.run_count();
            e.1 += info.run_time().as_nanos() as u64;
        }
    }
    Ok(Snapshot(out))
}

/// What ran between `before` and `after`, programs that did not run left out.
pub fn costs(before: &Snapshot, after: &Snapshot) -> Vec<Cost> {
    after
        .0
        .iter()
        .filter_map(|(program, &(runs, ns))| {
            let (r0, n0) = before.0.get(program).copied().unwrap_or_default();
            let runs = runs.saturating_sub(r0);
            (runs > 0).then(|| Cost {
                program: program.clone(),
                runs,
                ns_per_run: ns.saturating_sub(n0) as f64 / runs as f64,
            })
        })
        .collect()
}

/// "skiff_tc_ingress 61 ns" and so on, short names, for a table cell.
pub fn cell(costs: &[Cost]) -> String {
    if costs.is_empty() {
        return "-".into();
    }
    costs
        .iter()
        .map(|c| {
            format!(
                "{} {:.0}",
                c.program.strip_prefix("skiff_").unwrap_or(&c.program),
                c.ns_per_run
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_differences_per_run() {
        let before = Snapshot(BTreeMap::from([
            ("skiff_tc_ingress".to_string(), (10, 1_000)),
            ("skiff_tc_egress".to_string(), (5, 500)),
        ]));
        let after = Snapshot(BTreeMap::from([
            ("skiff_tc_ingress".to_string(), (110, 7_000)),
            ("skiff_tc_egress".to_string(), (5, 500)),
            ("skiff_xdp".to_string(), (4, 200)),
        ]));
        let c = costs(&before, &after);
        assert_eq!(
            c,
            vec![
                Cost {
                    program: "skiff_tc_ingress".into(),
                    runs: 100,
                    ns_per_run: 60.0
                },
                Cost {
                    program: "skiff_xdp".into(),
                    runs: 4,
                    ns_per_run: 50.0
                },
            ]
        );
        assert_eq!(cell(&c), "tc_ingress 60, xdp 50");
        assert_eq!(cell(&[]), "-");
    }
}
