//! The controller-manager's flags (kube-controller-manager's names and defaults), shared by
//! the `controller-manager` and `server` subcommands.

use std::time::Duration;

use clap::Args;

use super::{parse_controllers, ClusterCidr, Settings};
use crate::runtime::flags::parse_duration;

#[derive(Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Controllers to run: `*` for all, `name` to enable, `-name` to disable
    /// (e.g. `*,-nodeipam`).
    #[arg(long, default_value = "*")]
    pub controllers: String,
    /// How long a node may go without renewing its Lease or status before it is marked
    /// unreachable.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub node_monitor_grace_period: Duration,
    /// How often node health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub node_monitor_period: Duration,
    /// Nodes per second tainted NoExecute (their pods evicted) in a healthy zone, or in a
    /// zone where no node is Ready.
    #[arg(long, default_value_t = 0.1)]
    pub node_eviction_rate: f64,
    /// Nodes per second in a partially disrupted zone larger than
    /// --large-cluster-size-threshold (smaller ones stop).
    #[arg(long, default_value_t = 0.01)]
    pub secondary_node_eviction_rate: f64,
    /// The share of not-Ready nodes (more than 2) that makes a zone partially disrupted.
    #[arg(long, default_value_t = 0.55)]
    pub unhealthy_zone_threshold: f64,
    #[arg(long, default_value_t = 50)]
    pub large_cluster_size_threshold: usize,
    /// Give nodes a spec.podCIDR from --cluster-cidr.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allocate_node_cidrs: bool,
    /// The pod network nodes get their podCIDR blocks from.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: ClusterCidr,
    /// Prefix length of each node's podCIDR.
    #[arg(long, default_value_t = 24)]
    pub node_cidr_mask_size: u8,
    #[arg(long, default_value_t = 5)]
    pub concurrent_deployment_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_replicaset_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_service_endpoint_syncs: usize,
    #[arg(long, default_value_t = 20)]
    pub concurrent_gc_syncs: usize,
    #[arg(long, default_value_t = 2)]
    pub concurrent_daemonset_syncs: usize,
    #[arg(long, default_value_t = 10)]
    pub concurrent_namespace_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_job_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_ttl_after_finished_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_cron_job_syncs: usize,
    #[arg(long, default_value_t = 5)]
    pub concurrent_statefulset_syncs: usize,
    /// The most endpoints in one EndpointSlice.
    #[arg(long, default_value_t = 100)]
    pub max_endpoints_per_slice: usize,
    /// Finished pods kept before the oldest are deleted (0: keep all).
    #[arg(long, default_value_t = 12500)]
    pub terminated_pod_gc_threshold: usize,
    /// Addresses for LoadBalancer Services (`A.B.C.D-E.F.G.H` or a CIDR; unset: they stay
    /// pending, as on a cluster without a load balancer).
    #[arg(long)]
    pub service_lb_pool: Option<super::servicelb::LbPool>,
    /// The CA bundle published to every namespace as the `kube-root-ca.crt` ConfigMap
    /// (default: the certificate authority of the kubeconfig).
    #[arg(long)]
    pub root_ca_file: Option<std::path::PathBuf>,
    /// The CA certificate that signs approved CertificateSigningRequests (`control-plane
    /// server`: the cluster CA in its data directory).
    #[arg(long, requires = "cluster_signing_key_file")]
    pub cluster_signing_cert_file: Option<std::path::PathBuf>,
    /// The key of --cluster-signing-cert-file.
    #[arg(long, requires = "cluster_signing_cert_file")]
    pub cluster_signing_key_file: Option<std::path::PathBuf>,
    /// The longest certificate the signer issues (a request's expirationSeconds is capped
    /// by it).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    pub cluster_signing_duration: Duration,
    /// How often each HorizontalPodAutoscaler is synced.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub horizontal_pod_autoscaler_sync_period: Duration,
}

impl ControllerArgs {
    /// The signing CA of --cluster-signing-cert-file and --cluster-signing-key-file, else of
    /// `default` (cert, key) when given (None: csrsigning does not run).
    pub fn cluster_signing(
        &self,
        default: Option<(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Result<Option<std::sync::Arc<super::csrsigning::Signing>>, crate::pki::PkiError> {
        let files = match (
            &self.cluster_signing_cert_file,
            &self.cluster_signing_key_file,
        ) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            _ => default,
        };
        files
            .map(|(c, k)| {
                super::csrsigning::Signing::load(&c, &k, self.cluster_signing_duration)
                    .map(std::sync::Arc::new)
            })
            .transpose()
    }

    /// The settings these flags give, minus the controllers in `disabled`.
    pub fn settings(&self, disabled: &[super::ControllerName]) -> Result<Settings, String> {
        let mut enabled = parse_controllers(&self.controllers)?;
        for d in disabled {
            enabled.remove(d);
        }
        Ok(Settings {
            enabled,
            concurrent_deployment_syncs: self.concurrent_deployment_syncs,
            concurrent_replicaset_syncs: self.concurrent_replicaset_syncs,
            concurrent_endpoint_syncs: self.concurrent_service_endpoint_syncs,
            concurrent_gc_syncs: self.concurrent_gc_syncs,
            concurrent_daemonset_syncs: self.concurrent_daemonset_syncs,
            concurrent_namespace_syncs: self.concurrent_namespace_syncs,
            concurrent_job_syncs: self.concurrent_job_syncs,
            concurrent_ttl_syncs: self.concurrent_ttl_after_finished_syncs,
            concurrent_cron_job_syncs: self.concurrent_cron_job_syncs,
            concurrent_statefulset_syncs: self.concurrent_statefulset_syncs,
            max_endpoints_per_slice: self.max_endpoints_per_slice,
            node_monitor_period: self.node_monitor_period,
            node_monitor_grace_period: self.node_monitor_grace_period,
            cluster_cidr: self.allocate_node_cidrs.then_some(self.cluster_cidr),
            node_cidr_mask_size: self.node_cidr_mask_size,
            terminated_pod_gc_threshold: self.terminated_pod_gc_threshold,
            service_lb_pool: self.service_lb_pool,
            eviction_rates: super::disruption::Rates {
                node_eviction_rate: self.node_eviction_rate,
                secondary_node_eviction_rate: self.secondary_node_eviction_rate,
                unhealthy_zone_threshold: self.unhealthy_zone_threshold,
                large_cluster_size_threshold: self.large_cluster_size_threshold,
            },
            hpa_sync_period: self.horizontal_pod_autoscaler_sync_period,
            ..Settings::default()
        })
    }
}
