//! control-plane: the API server with its store, the controllers and the scheduler, as a
//! library; the binary in main.rs is a thin shell over it.

pub mod apiserver;
pub mod cidr;
pub mod controllers;
pub mod machinery;
pub mod pki;
pub mod resource_metrics;
pub mod runtime;
pub mod scheduler;
pub mod store;
