//! `proxy dump`: the pinned maps as a table, like `cilium service list`: each frontend
//! with its id, flags, counters and backends by slot.

use crate::loader::maps::{BpfMaps, MapsError};
use crate::sync::writer::{endpoint, frontend_key};
use proxy_common::{BackendKey, SVC_FLAG_AFFINITY_CLIENT_IP};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(
        "opening the pinned maps under {path} (is a proxy running with this --bpffs?): {source}"
    )]
    Open { path: String, source: MapsError },
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("writing: {0}")]
    Io(#[from] std::io::Error),
}

pub fn dump(bpffs: &Path, out: &mut impl Write) -> Result<(), DumpError> {
    let dir = crate::loader::maps_dir(bpffs);
    let maps = BpfMaps::open_pinned(&dir).map_err(|source| DumpError::Open {
        path: dir.display().to_string(),
        source,
    })?;
    let mut rows = BTreeMap::new();
    for (k, v) in maps.services()? {
        let name = frontend_key(&k).map_or_else(|| format!("{k:?}"), |f| f.to_string());
        rows.insert(v.id, (name, v));
    }
    writeln!(
        out,
        "{:<6} {:<40} {:<10} {:>12} {:>9}  BACKENDS",
        "ID", "FRONTEND", "FLAGS", "TRANSLATED", "REFUSED"
    )?;
    let mut total = 0;
    for (id, (name, v)) in &rows {
        let c = maps.counters(*id)?;
        let flags = if v.flags & SVC_FLAG_AFFINITY_CLIENT_IP != 0 {
            format!("affinity={}s", v.affinity_timeout_s)
        } else {
            "-".to_string()
        };
        let mut backends = Vec::new();
        for slot in 0..v.count {
            let b = maps.backend(&BackendKey { service: *id, slot })?;
            backends.push(match b.as_ref().and_then(endpoint) {
                Some(e) => format!("{slot}=>{e}"),
                None => format!("{slot}=>(empty!)"),
            });
        }
        total += v.count;
        let backends = if backends.is_empty() {
            "(none: refused)".to_string()
        } else {
            backends.join(", ")
        };
        writeln!(
            out,
            "{:<6} {:<40} {:<10} {:>12} {:>9}  {}",
            id, name, flags, c.translations, c.refused, backends
        )?;
    }
    writeln!(out, "{} frontends, {} backends", rows.len(), total)?;
    Ok(())
}
