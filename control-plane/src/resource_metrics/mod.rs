//! Resource metrics (CPU and memory of nodes, pods and containers): the Summary API the node
//! agent serves at `/stats/summary` (the kubelet's stats/v1alpha1 shape), shared by the node
//! agent that writes it and the API server that reads it, and the metrics.k8s.io kinds the
//! API server makes of it.

pub mod api;
pub mod summary;
