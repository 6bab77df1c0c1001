//! The controllers of kube-controller-manager, each a client of the API server only: shared
//! informers in, reconcile, writes back through the API. One room per controller:
//! [`deployment`], [`replicaset`], [`endpointslice`] and [`endpoints`] (with what both ask
//! of Services in [`serviceendpoints`]), [`garbagecollector`], [`namespace`] (both learn
//! what is served from [`discovery`]), [`nodelifecycle`] (with [`tainteviction`] and
//! [`podgc`]), [`nodeipam`], [`daemonset`], [`clusterroleaggregation`], [`servicelb`], [`job`] (with
//! [`ttlafterfinished`]), [`cronjob`], [`statefulset`] (with [`history`], the
//! ControllerRevisions it shares with DaemonSets), [`resourcequota`], [`serviceaccounts`] and
//! [`rootcacertpublisher`] (each namespace's identity for pods), [`csrapproving`] and
//! [`csrsigning`] (node client certificates through CertificateSigningRequests), [`hpa`]
//! (HorizontalPodAutoscalers on metrics.k8s.io), [`disruption_budget`] (PodDisruptionBudget
//! status for evictions), [`volumeprotection`] (claims and volumes kept while in use),
//! [`persistentvolume`] (the PersistentVolume binder: claims bound to volumes, external
//! provisioners asked, volumes released and reclaimed), [`attachdetach`] (VolumeAttachments
//! for the CSI volumes of drivers that must be attached to a pod's node);
//! [`pods`] holds what they
//! ask of pods; [`manager`] runs the enabled ones under leader election with health and
//! metrics; [`flags`] are the
//! controller-manager's command-line flags.
//!
//! [`run`] runs one leadership term: it builds the enabled controllers over one set of shared
//! informers, waits for the caches to sync, and reconciles until cancelled.

pub mod attachdetach;
pub mod clusterroleaggregation;
pub mod cronjob;
pub mod csrapproving;
pub mod csrsigning;
pub mod daemonset;
pub mod deployment;
pub mod discovery;
pub mod disruption;
pub mod disruption_budget;
pub mod endpoints;
pub mod endpointslice;
pub mod flags;
pub mod garbagecollector;
pub mod history;
pub mod hpa;
pub mod job;
pub mod manager;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod persistentvolume;
pub mod podgc;
pub mod pods;
pub mod replicaset;
pub mod resourcequota;
pub mod rootcacertpublisher;
pub mod serviceaccounts;
pub mod serviceendpoints;
pub mod servicelb;
pub mod statefulset;
pub mod tainteviction;
pub mod ttlafterfinished;
pub mod volumeprotection;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::runtime::owner::{self, BY_CONTROLLER_UID, ORPHANS_BY_NAMESPACE};
use crate::runtime::{Controller, EventSink, Informer, Informers, Metrics, Reconciler};
use kube::api::Api;
use kube::runtime::watcher;

/// A controller, by the short name kube-controller-manager also accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerName {
    Deployment,
    ReplicaSet,
    EndpointSlice,
    Endpoints,
    GarbageCollector,
    Namespace,
    NodeLifecycle,
    TaintEviction,
    PodGc,
    NodeIpam,
    DaemonSet,
    ClusterRoleAggregation,
    ServiceLb,
    Job,
    TtlAfterFinished,
    CronJob,
    StatefulSet,
    ResourceQuota,
    ServiceAccount,
    RootCaCertPublisher,
    CsrApproving,
    CsrSigning,
    HorizontalPodAutoscaler,
    DisruptionBudget,
    PvcProtection,
    PvProtection,
    PersistentVolumeBinder,
    AttachDetach,
}

impl ControllerName {
    pub const ALL: [ControllerName; 28] = [
        ControllerName::Deployment,
        ControllerName::ReplicaSet,
        ControllerName::EndpointSlice,
        ControllerName::Endpoints,
        ControllerName::GarbageCollector,
        ControllerName::Namespace,
        ControllerName::NodeLifecycle,
        ControllerName::TaintEviction,
        ControllerName::PodGc,
        ControllerName::NodeIpam,
        ControllerName::DaemonSet,
        ControllerName::ClusterRoleAggregation,
        ControllerName::ServiceLb,
        ControllerName::Job,
        ControllerName::TtlAfterFinished,
        ControllerName::CronJob,
        ControllerName::StatefulSet,
        ControllerName::ResourceQuota,
        ControllerName::ServiceAccount,
        ControllerName::RootCaCertPublisher,
        ControllerName::CsrApproving,
        ControllerName::CsrSigning,
        ControllerName::HorizontalPodAutoscaler,
        ControllerName::DisruptionBudget,
        ControllerName::PvcProtection,
        ControllerName::PvProtection,
        ControllerName::PersistentVolumeBinder,
        ControllerName::AttachDetach,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ControllerName::Deployment => "deployment",
            ControllerName::ReplicaSet => "replicaset",
            ControllerName::EndpointSlice => "endpointslice",
            ControllerName::Endpoints => "endpoint",
            ControllerName::GarbageCollector => "garbagecollector",
            ControllerName::Namespace => "namespace",
            ControllerName::NodeLifecycle => "nodelifecycle",
            ControllerName::TaintEviction => "taint-eviction-controller",
            ControllerName::PodGc => "podgc",
            ControllerName::NodeIpam => "nodeipam",
            ControllerName::DaemonSet => "daemonset",
            ControllerName::ClusterRoleAggregation => "clusterrole-aggregation",
            ControllerName::ServiceLb => "servicelb",
            ControllerName::Job => "job",
            ControllerName::TtlAfterFinished => "ttl-after-finished",
            ControllerName::CronJob => "cronjob",
            ControllerName::StatefulSet => "statefulset",
            ControllerName::ResourceQuota => "resourcequota",
            ControllerName::ServiceAccount => "serviceaccount",
            ControllerName::RootCaCertPublisher => "root-ca-cert-publisher",
            ControllerName::CsrApproving => "csrapproving",
            ControllerName::CsrSigning => "csrsigning",
            ControllerName::HorizontalPodAutoscaler => "horizontalpodautoscaling",
            ControllerName::DisruptionBudget => "disruption",
            ControllerName::PvcProtection => "pvc-protection",
            ControllerName::PvProtection => "pv-protection",
            ControllerName::PersistentVolumeBinder => "persistentvolume-binder",
            ControllerName::AttachDetach => "attachdetach",
        }
    }

    /// kube-controller-manager's long name (`deployment-controller`, ...).
    pub fn long_name(self) -> &'static str {
        match self {
            ControllerName::Deployment => "deployment-controller",
            ControllerName::ReplicaSet => "replicaset-controller",
            ControllerName::EndpointSlice => "endpointslice-controller",
            ControllerName::Endpoints => "endpoints-controller",
            ControllerName::GarbageCollector => "garbage-collector-controller",
            ControllerName::Namespace => "namespace-controller",
            ControllerName::NodeLifecycle => "node-lifecycle-controller",
            ControllerName::TaintEviction => "taint-eviction-controller",
            ControllerName::PodGc => "pod-garbage-collector-controller",
            ControllerName::NodeIpam => "node-ipam-controller",
            ControllerName::DaemonSet => "daemonset-controller",
            ControllerName::ClusterRoleAggregation => "clusterrole-aggregation-controller",
            ControllerName::ServiceLb => "service-lb-controller",
            ControllerName::Job => "job-controller",
            ControllerName::TtlAfterFinished => "ttl-after-finished-controller",
            ControllerName::CronJob => "cronjob-controller",
            ControllerName::StatefulSet => "statefulset-controller",
            ControllerName::ResourceQuota => "resourcequota-controller",
            ControllerName::ServiceAccount => "serviceaccount-controller",
            ControllerName::RootCaCertPublisher => "root-ca-certificate-publisher-controller",
            ControllerName::CsrApproving => "certificatesigningrequest-approving-controller",
            ControllerName::CsrSigning => "certificatesigningrequest-signing-controller",
            ControllerName::HorizontalPodAutoscaler => "horizontal-pod-autoscaler-controller",
            ControllerName::DisruptionBudget => "disruption-controller",
            ControllerName::PvcProtection => "persistentvolumeclaim-protection-controller",
            ControllerName::PvProtection => "persistentvolume-protection-controller",
            ControllerName::PersistentVolumeBinder => "persistentvolume-binder-controller",
            ControllerName::AttachDetach => "persistentvolume-attach-detach-controller",
        }
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ControllerName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ControllerName::ALL
            .into_iter()
            .find(|c| {
                c.as_str() == s
                    || c.long_name() == s
                    || (s == "endpoints" && *c == ControllerName::Endpoints)
            })
            .ok_or_else(|| {
                let known: Vec<&str> = ControllerName::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown controller {s:?} (known: {})", known.join(", "))
            })
    }
}

/// Parses kube-controller-manager's `--controllers` list: `*` for every controller, a name
/// to enable one, `-name` to disable one (e.g. `*,-nodeipam`).
pub fn parse_controllers(spec: &str) -> Result<BTreeSet<ControllerName>, String> {
    let mut enabled = BTreeSet::new();
    let mut disabled = BTreeSet::new();
    let mut star = false;
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            star = true;
        } else if let Some(name) = item.strip_prefix('-') {
            disabled.insert(name.parse::<ControllerName>()?);
        } else {
            enabled.insert(item.parse::<ControllerName>()?);
        }
    }
    if star {
        enabled.extend(ControllerName::ALL);
    }
    Ok(enabled.difference(&disabled).copied().collect())
}

/// The cluster's pod network (`--cluster-cidr`): an IPv4 CIDR with a prefix of 1 to 30.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterCidr(Ipv4Net);

impl ClusterCidr {
    pub fn net(&self) -> Ipv4Net {
        self.0
    }
}

impl FromStr for ClusterCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        crate::cidr::parse_ipv4(s, 1..=30).map(ClusterCidr)
    }
}

impl fmt::Display for ClusterCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Every setting of the controllers (kube-controller-manager's flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub enabled: BTreeSet<ControllerName>,
    /// Who writes the Events (source.host, reportingInstance).
    pub identity: String,
    pub concurrent_deployment_syncs: usize,
    pub concurrent_replicaset_syncs: usize,
    pub concurrent_endpoint_syncs: usize,
    pub concurrent_gc_syncs: usize,
    pub concurrent_daemonset_syncs: usize,
    pub concurrent_namespace_syncs: usize,
    pub concurrent_job_syncs: usize,
    pub concurrent_ttl_syncs: usize,
    pub concurrent_cron_job_syncs: usize,
    pub concurrent_statefulset_syncs: usize,
    /// The most endpoints in one EndpointSlice.
    pub max_endpoints_per_slice: usize,
    /// How often node health is checked.
    pub node_monitor_period: Duration,
    /// How long a node may go without renewing its Lease or status before it is unreachable.
    pub node_monitor_grace_period: Duration,
    /// The pod network nodes get their podCIDR from (None: node IPAM allocates nothing).
    pub cluster_cidr: Option<ClusterCidr>,
    pub node_cidr_mask_size: u8,
    /// Finished pods kept before the oldest are deleted (0: no limit).
    pub terminated_pod_gc_threshold: usize,
    /// Addresses LoadBalancer Services get (None: they stay pending).
    pub service_lb_pool: Option<servicelb::LbPool>,
    /// How fast unreachable nodes are tainted NoExecute, per zone and disruption state.
    pub eviction_rates: disruption::Rates,
    /// The CA bundle published to every namespace as `kube-root-ca.crt` (None: the
    /// publisher does not run).
    pub root_ca: Option<rootcacertpublisher::RootCa>,
    /// The CA that signs approved CertificateSigningRequests (None: csrsigning does not
    /// run).
    pub cluster_signing: Option<Arc<csrsigning::Signing>>,
    /// How often each HorizontalPodAutoscaler is synced.
    pub hpa_sync_period: Duration,
}

impl Default for Settings {
    /// kube-controller-manager's defaults (cluster CIDR 10.244.0.0/16 with /24 per node).
    fn default() -> Self {
        Settings {
            enabled: ControllerName::ALL.into_iter().collect(),
            identity: crate::runtime::leader::default_identity(),
            concurrent_deployment_syncs: 5,
            concurrent_replicaset_syncs: 5,
            concurrent_endpoint_syncs: 5,
            concurrent_gc_syncs: 20,
            concurrent_daemonset_syncs: 2,
            concurrent_namespace_syncs: 10,
            concurrent_job_syncs: 5,
            concurrent_ttl_syncs: 5,
            concurrent_cron_job_syncs: 5,
            concurrent_statefulset_syncs: 5,
            max_endpoints_per_slice: 100,
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: Duration::from_secs(40),
            cluster_cidr: Some(ClusterCidr(Ipv4Net::new_assert(
                std::net::Ipv4Addr::new(10, 244, 0, 0),
                16,
            ))),
            node_cidr_mask_size: 24,
            terminated_pod_gc_threshold: 12500,
            service_lb_pool: None,
            eviction_rates: disruption::Rates::default(),
            root_ca: None,
            cluster_signing: None,
            hpa_sync_period: hpa::DEFAULT_SYNC_PERIOD,
        }
    }
}

/// What every controller is built from.
pub struct Context {
    pub client: Client,
    pub informers: Arc<Informers>,
    pub events: EventSink,
    pub metrics: Metrics,
    pub settings: Arc<Settings>,
}

/// The pod indexes the controllers share: by controller uid, orphans by namespace, by node,
/// by label.
pub fn index_pods(pods: &Informer<Pod>) {
    pods.add_index(BY_CONTROLLER_UID, owner::index_by_controller_uid::<Pod>);
    pods.add_index(
        ORPHANS_BY_NAMESPACE,
        owner::index_orphans_by_namespace::<Pod>,
    );
    pods.add_index(pods::BY_NODE, pods::index_by_node);
    pods.add_index(pods::BY_LABEL, pods::index_by_label);
}

/// An informer of the objects named `name` in every namespace (one per namespace), of a
/// process's own: the shared informer of the kind would cache every object of it.
pub fn named_informer<K>(client: &Client, name: &str) -> Informer<K>
where
    K: crate::runtime::informer::Cached + kube::Resource<DynamicType = ()>,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    Informer::new(Api::all(client.clone()), config)
}

/// Runs `informer` (a process's own, not a shared one) and, once it has synced, `controller`,
/// until `token` is cancelled.
pub fn run_with_informer<K, R>(
    informer: Informer<K>,
    controller: Controller<R>,
    token: CancellationToken,
) -> BoxFuture<'static, ()>
where
    K: crate::runtime::informer::Cached + kube::Resource<DynamicType = ()>,
    R: Reconciler,
{
    let synced = informer.clone();
    Box::pin(async move {
        let run = async {
            tokio::select! {
                _ = synced.wait_synced() => {}
                _ = token.cancelled() => return,
            }
            controller.run(token.clone()).await;
        };
        futures::future::join(informer.run(token.clone()), run).await;
    })
}

/// Runs the enabled controllers until `token` is cancelled (one leadership term).
pub async fn run(
    client: Client,
    settings: Arc<Settings>,
    metrics: Metrics,
    token: CancellationToken,
) {
    let informers = Arc::new(Informers::new(client.clone()));
    let events = EventSink::start(
        client.clone(),
        settings.identity.clone(),
        token.child_token(),
    );
    let ctx = Context {
        client,
        informers: informers.clone(),
        events,
        metrics,
        settings: settings.clone(),
    };
    let on = |c: ControllerName| settings.enabled.contains(&c);
    let mut tasks: Vec<BoxFuture<'static, ()>> = Vec::new();
    let t = || token.clone();
    if on(ControllerName::ReplicaSet) {
        tasks.push(Box::pin(replicaset::build(&ctx).run(t())));
    }
    if on(ControllerName::Deployment) {
        tasks.push(Box::pin(deployment::build(&ctx).run(t())));
    }
    if on(ControllerName::EndpointSlice) {
        tasks.push(Box::pin(endpointslice::build(&ctx).run(t())));
    }
    if on(ControllerName::Endpoints) {
        tasks.push(Box::pin(endpoints::build(&ctx).run(t())));
    }
    if on(ControllerName::NodeLifecycle) {
        tasks.push(Box::pin(nodelifecycle::build(&ctx).run(t())));
    }
    if on(ControllerName::TaintEviction) {
        tasks.push(Box::pin(tainteviction::build(&ctx).run(t())));
    }
    if on(ControllerName::PodGc) {
        tasks.push(podgc::build(&ctx, t()));
    }
    if on(ControllerName::NodeIpam) {
        if let Some(c) = nodeipam::build(&ctx) {
            tasks.push(Box::pin(c.run(t())));
        }
    }
    if on(ControllerName::DaemonSet) {
        tasks.push(Box::pin(daemonset::build(&ctx).run(t())));
    }
    if on(ControllerName::ServiceLb) {
        if let Some(c) = servicelb::build(&ctx) {
            tasks.push(Box::pin(c.run(t())));
        }
    }
    if on(ControllerName::ClusterRoleAggregation) {
        tasks.push(Box::pin(clusterroleaggregation::build(&ctx).run(t())));
    }
    if on(ControllerName::ResourceQuota) {
        tasks.push(resourcequota::build(&ctx, t()));
    }
    if on(ControllerName::Job) {
        tasks.push(Box::pin(job::build(&ctx).run(t())));
    }
    if on(ControllerName::CronJob) {
        tasks.push(Box::pin(cronjob::build(&ctx).run(t())));
    }
    if on(ControllerName::StatefulSet) {
        tasks.push(Box::pin(statefulset::build(&ctx).run(t())));
    }
    if on(ControllerName::PvcProtection) {
        tasks.push(Box::pin(volumeprotection::build_pvc(&ctx).run(t())));
    }
    if on(ControllerName::PvProtection) {
        tasks.push(Box::pin(volumeprotection::build_pv(&ctx).run(t())));
    }
    if on(ControllerName::PersistentVolumeBinder) {
        tasks.push(Box::pin(persistentvolume::build(&ctx).run(t())));
    }
    if on(ControllerName::AttachDetach) {
        tasks.push(Box::pin(attachdetach::build(&ctx).run(t())));
    }
    if on(ControllerName::TtlAfterFinished) {
        tasks.push(Box::pin(ttlafterfinished::build(&ctx).run(t())));
    }
    if on(ControllerName::ServiceAccount) {
        tasks.push(serviceaccounts::build(&ctx, t()));
    }
    if on(ControllerName::RootCaCertPublisher) {
        tasks.extend(rootcacertpublisher::build(&ctx, t()));
    }
    if on(ControllerName::CsrApproving) {
        tasks.push(Box::pin(csrapproving::build(&ctx).run(t())));
    }
    if on(ControllerName::CsrSigning) {
        if let Some(c) = csrsigning::build(&ctx) {
            tasks.push(Box::pin(c.run(t())));
        }
    }
    if on(ControllerName::HorizontalPodAutoscaler) {
        tasks.push(Box::pin(hpa::build(&ctx).run(t())));
    }
    if on(ControllerName::DisruptionBudget) {
        tasks.push(Box::pin(disruption_budget::build(&ctx).run(t())));
    }
    if on(ControllerName::Namespace) {
        tasks.push(Box::pin(namespace::build(&ctx).run(t())));
    }
    if on(ControllerName::GarbageCollector) {
        // Its informers are its own (every resource the server serves, metadata only).
        tasks.push(garbagecollector::start(&ctx, t()));
    }
    informers.start(&token);
    tokio::select! {
        _ = informers.wait_synced() => tracing::info!("controller caches synced"),
        _ = token.cancelled() => {
            informers.join().await;
            return;
        }
    }
    futures::future::join_all(tasks).await;
    informers.join().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_flag_as_kube_controller_manager_reads_it() {
        assert_eq!(
            parse_controllers("*").unwrap().len(),
            ControllerName::ALL.len()
        );
        let some = parse_controllers("*,-nodeipam,-garbage-collector-controller").unwrap();
        assert!(!some.contains(&ControllerName::NodeIpam));
        assert!(!some.contains(&ControllerName::GarbageCollector));
        assert!(some.contains(&ControllerName::Deployment));
        let one = parse_controllers("replicaset-controller").unwrap();
        assert_eq!(
            one.into_iter().collect::<Vec<_>>(),
            vec![ControllerName::ReplicaSet]
        );
        assert!(parse_controllers("bogus").is_err());
    }

    #[test]
    fn cluster_cidr_parses_and_prints() {
        let c: ClusterCidr = "10.244.3.7/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.0.0/16");
        assert!("10.244.0.0".parse::<ClusterCidr>().is_err());
    }

    #[test]
    fn cluster_cidr_rejects_bad_input_with_the_value() {
        for bad in [
            "10.244.0.0/0",
            "10.244.0.0/31",
            "10.244.0.0/33",
            "10.244/16",
            "x",
            "",
        ] {
            let e = bad.parse::<ClusterCidr>().unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
