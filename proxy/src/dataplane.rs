//! The data path interface: what the daemon asks of the eBPF maps (sync engine) and of the
//! iptables baseline alike.

use crate::desired::{FrontendKey, Frontends};
use crate::model::ServiceName;

/// Which capacity ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    Services,
    Backends,
}

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("{capacity:?} map is full ({limit} entries): {frontend} not programmed")]
    Full {
        capacity: Capacity,
        limit: u32,
        frontend: FrontendKey,
    },
    #[error("writing the maps: {0}")]
    Write(String),
    #[error("iptables: {0}")]
    Iptables(String),
}

impl DataplaneError {
    /// A short label for the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            DataplaneError::Full { .. } => "map_full",
            DataplaneError::Write(_) => "map_write",
            DataplaneError::Iptables(_) => "iptables",
        }
    }
}

/// How much is programmed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fill {
    pub frontends: u64,
    pub backends: u64,
}

pub trait Dataplane {
    /// Programs one service's frontends (empty: the service is gone). A frontend that
    /// cannot be programmed is reported and never disturbs the others.
    fn update(&mut self, service: &ServiceName, frontends: &Frontends) -> Vec<DataplaneError>;
    /// Ends a batch of updates (iptables writes its rules here; maps are already written).
    fn flush(&mut self) -> Result<(), DataplaneError>;
    /// The source has listed everything: remove what a previous run left and no service
    /// claims any more.
    fn initial_sync_done(&mut self) -> Result<(), DataplaneError>;
    fn fill(&self) -> Fill;
}
