//! iptables mode: the same daemon programs kube-proxy-style chains with iptables-restore.
//! It is the baseline skiff is measured against and the fallback where BPF is missing, so
//! it syncs the way kube-proxy does: nothing until the source has listed everything, then
//! one full sync (stale chains of a previous run removed), then partial syncs that rewrite
//! only the chains of changed services plus the KUBE-SERVICES dispatch chain (which, as in
//! kube-proxy, is O(services) per sync: that is the cost this baseline exists to show).

pub mod rules;

use crate::dataplane::{Dataplane, DataplaneError, Fill};
use crate::desired::{FrontendKey, Frontends};
use crate::model::{Family, ServiceName};
use rules::{
    render, Dispatch, FrontendRules, EXTERNAL_SERVICES_CHAIN, FIREWALL_CHAIN, JUMPS,
    NODEPORTS_CHAIN, SERVICES_CHAIN,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

struct Programmed {
    rules: FrontendRules,
    backends: usize,
}

#[derive(Default)]
pub struct Iptables {
    frontends: HashMap<FrontendKey, Programmed>,
    owned: HashMap<ServiceName, BTreeSet<FrontendKey>>,
    dirty: HashSet<FrontendKey>,
    stale: BTreeSet<(FamilyIdx, String)>,
    /// The source has listed everything: writing may start.
    ready: bool,
    /// The next write of each family is a full sync.
    full: [bool; 2],
    jumps_installed: [bool; 2],
}

/// Index per family (0: IPv4, 1: IPv6).
type FamilyIdx = usize;

fn family_idx(key: &FrontendKey) -> FamilyIdx {
    match Family::of(&key.ip) {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

const TOOLS: [(&str, &str, &str); 2] = [
    ("iptables", "iptables-restore", "iptables-save"),
    ("ip6tables", "ip6tables-restore", "ip6tables-save"),
];

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, DataplaneError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DataplaneError::Iptables(format!("starting {program}: {e}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| DataplaneError::Iptables(format!("writing to {program}: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| DataplaneError::Iptables(format!("waiting for {program}: {e}")))?;
    if !out.status.success() {
        return Err(DataplaneError::Iptables(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Iptables {
    pub fn new() -> Self {
        Iptables {
            full: [true, true],
            ..Default::default()
        }
    }

    fn install_jumps(&mut self, fam: FamilyIdx) -> Result<(), DataplaneError> {
        if self.jumps_installed[fam] {
            return Ok(());
        }
        let (tool, restore, _) = TOOLS[fam];
        // The chains must exist before a rule can jump to them.
        let declare = format!(
            "*filter\n:{SERVICES_CHAIN} - [0:0]\n:{EXTERNAL_SERVICES_CHAIN} - [0:0]\n:{FIREWALL_CHAIN} - [0:0]\nCOMMIT\n*nat\n:{SERVICES_CHAIN} - [0:0]\n:{} - [0:0]\nCOMMIT\n",
            rules::POSTROUTING_CHAIN
        );
        run(restore, &["-w", "--noflush"], Some(&declare))?;
        for (table, chain, target, extra) in JUMPS {
            let mut spec: Vec<&str> =
                vec!["-m", "comment", "--comment", "kubernetes service portals"];
            spec.extend(extra.split_whitespace());
            spec.extend(["-j", target]);
            let mut check = vec!["-w", "-t", table, "-C", chain];
            check.extend(&spec);
            if run(tool, &check, None).is_err() {
                let mut insert = vec!["-w", "-t", table, "-I", chain];
                insert.extend(&spec);
                run(tool, &insert, None)?;
            }
        }
        self.jumps_installed[fam] = true;
        Ok(())
    }

    /// Chains named like ours that exist in the kernel (for the full sync's cleanup).
    fn existing_chains(fam: FamilyIdx) -> Result<Vec<String>, DataplaneError> {
        let saved = run(TOOLS[fam].2, &["-t", "nat"], None)?;
        Ok(saved
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| {
                ["KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-"]
                    .iter()
                    .any(|p| c.starts_with(p))
            })
            .map(str::to_string)
            .collect())
    }

    fn write_family(&mut self, fam: FamilyIdx) -> Result<(), DataplaneError> {
        let full = self.full[fam];
        let dirty: Vec<FrontendKey> = if full {
            self.frontends
                .keys()
                .filter(|k| family_idx(k) == fam)
                .copied()
                .collect()
        } else {
            self.dirty
                .iter()
                .filter(|k| family_idx(k) == fam)
                .copied()
                .collect()
        };
        let mut stale: BTreeSet<String> = self
            .stale
            .iter()
            .filter(|(f, _)| *f == fam)
            .map(|(_, c)| c.clone())
            .collect();
        if !full && dirty.is_empty() && stale.is_empty() {
            return Ok(());
        }
        self.install_jumps(fam)?;
        let live: HashSet<&str> = dirty
            .iter()
            .filter_map(|k| self.frontends.get(k))
            .flat_map(|p| p.rules.chains.iter().map(|(c, _)| c.as_str()))
            .collect();
        if full {
            stale.extend(Self::existing_chains(fam)?);
        }
        stale.retain(|c| !live.contains(c.as_str()));

        // Every frontend of the family, in a stable order, for the dispatch chains.
        let all: BTreeMap<&FrontendKey, &Programmed> = self
            .frontends
            .iter()
            .filter(|(k, _)| family_idx(k) == fam)
            .collect();
        // The dispatch chains are rewritten whole at every sync (as kube-proxy does).
        let mut filter =
            format!("*filter\n:{SERVICES_CHAIN} - [0:0]\n:{EXTERNAL_SERVICES_CHAIN} - [0:0]\n");
        let mut nat_decl = format!(":{SERVICES_CHAIN} - [0:0]\n:{NODEPORTS_CHAIN} - [0:0]\n");
        let mut nat_rules = String::new();
        if full {
            for (chain, lines) in rules::filter_fixed_rules() {
                filter.push_str(&format!(":{chain} - [0:0]\n"));
                for l in lines {
                    filter.push_str(&l);
                    filter.push('\n');
                }
            }
            for (chain, lines) in rules::nat_fixed_rules() {
                nat_decl.push_str(&format!(":{chain} - [0:0]\n"));
                for l in lines {
                    nat_rules.push_str(&l);
                    nat_rules.push('\n');
                }
            }
        }
        let mut nodeports = String::new();
        for p in all.values() {
            let Some((d, rule)) = &p.rules.dispatch else {
                continue;
            };
            let target = match d {
                Dispatch::NatServices => &mut nat_rules,
                Dispatch::NatNodePorts => &mut nodeports,
                Dispatch::FilterServices | Dispatch::FilterExternal => &mut filter,
            };
            target.push_str(rule);
            target.push('\n');
        }
        nat_rules.push_str(&rules::nodeports_jump());
        nat_rules.push('\n');
        nat_rules.push_str(&nodeports);
        for key in &dirty {
            let Some(p) = self.frontends.get(key) else {
                continue;
            };
            for (chain, lines) in &p.rules.chains {
                nat_decl.push_str(&format!(":{chain} - [0:0]\n"));
                for l in lines {
                    nat_rules.push_str(l);
                    nat_rules.push('\n');
                }
            }
        }
        for chain in &stale {
            nat_decl.push_str(&format!(":{chain} - [0:0]\n"));
            nat_rules.push_str(&format!("-X {chain}\n"));
        }
        filter.push_str("COMMIT\n");
        let payload = format!("{filter}*nat\n{nat_decl}{nat_rules}COMMIT\n");
        run(TOOLS[fam].1, &["-w", "--noflush"], Some(&payload))?;
        self.full[fam] = false;
        self.dirty.retain(|k| family_idx(k) != fam);
        self.stale.retain(|(f, _)| *f != fam);
        Ok(())
    }
}

impl Dataplane for Iptables {
    fn update(&mut self, service: &ServiceName, frontends: &Frontends) -> Vec<DataplaneError> {
        let old = self.owned.remove(service).unwrap_or_default();
        for key in old.iter().filter(|k| !frontends.contains_key(k)) {
            if let Some(p) = self.frontends.remove(key) {
                for (chain, _) in p.rules.chains {
                    self.stale.insert((family_idx(key), chain));
                }
                self.dirty.insert(*key);
            }
        }
        for (key, d) in frontends {
            let comment = format!("{service}:{}", d.port_name);
            let rules = render(&comment, key, d);
            if let Some(p) = self.frontends.get(key) {
                if p.rules == rules {
                    continue;
                }
                let keep: HashSet<&String> = rules.chains.iter().map(|(c, _)| c).collect();
                for (chain, _) in &p.rules.chains {
                    if !keep.contains(chain) {
                        self.stale.insert((family_idx(key), chain.clone()));
                    }
                }
            }
            self.frontends.insert(
                *key,
                Programmed {
                    rules,
                    backends: d.backends.len(),
                },
            );
            self.dirty.insert(*key);
        }
        if !frontends.is_empty() {
            self.owned
                .insert(service.clone(), frontends.keys().copied().collect());
        }
        Vec::new()
    }

    fn flush(&mut self) -> Result<(), DataplaneError> {
        if !self.ready {
            return Ok(());
        }
        let mut result = Ok(());
        for fam in [0, 1] {
            let has_any = self.frontends.keys().any(|k| family_idx(k) == fam)
                || self.stale.iter().any(|(f, _)| *f == fam);
            // IPv6 is only touched once there is something IPv6 to do.
            if fam == 1 && !has_any {
                continue;
            }
            if let Err(e) = self.write_family(fam) {
                // Rewrite everything next time: the kernel state is unknown now.
                self.full[fam] = true;
                result = Err(e);
            }
        }
        result
    }

    fn initial_sync_done(&mut self) -> Result<(), DataplaneError> {
        self.ready = true;
        self.full = [true, true];
        Ok(())
    }

    fn fill(&self) -> Fill {
        Fill {
            frontends: self.frontends.len() as u64,
            backends: self.frontends.values().map(|p| p.backends as u64).sum(),
        }
    }
}
