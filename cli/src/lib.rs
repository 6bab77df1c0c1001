//! `kubectl-skiff`, skiff's kubectl plugin (kubectl runs `kubectl-skiff` for `kubectl skiff`).
//!
//! Rooms: `trace` (the steps of a workload's path and how they print: pure, unit-tested),
//! `collect` (reading them from the API server, and from each node's service proxy through
//! the API server's pods/proxy).

pub mod collect;
pub mod trace;
