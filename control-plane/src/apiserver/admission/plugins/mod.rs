//! The built-in admission plugins, a file each; their order is [`super::Chain::new`]'s.

pub mod limit_ranger;
pub mod namespace_lifecycle;
pub mod node_restriction;
pub mod pod_security;
pub mod priority;
pub mod resource_quota;
pub mod service_account;
pub mod storage;
pub mod webhook;
