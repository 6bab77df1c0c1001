//! Resource metrics (CPU and memory of nodes, pods and containers): the Summary API the node
//! agent serves at `/stats/summary` (the kubelet's stats/v1alpha1 shape), shared by the node
//! agent that writes it and its readers.

pub mod summary;
