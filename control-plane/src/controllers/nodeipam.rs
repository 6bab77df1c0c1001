//! Node IPAM (Kubernetes' range allocator): each Node gets `spec.podCIDR` (and `podCIDRs`),
//! a `/--node-cidr-mask-size` (24) block of `--cluster-cidr` (10.244.0.0/16), when it
//! registers. Which blocks are taken is derived from the Nodes themselves on start (so a
//! restarted controller never hands out a block twice) and released when a Node goes. One
//! worker, so two Nodes never race for a block.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{ClusterCidr, Context};
use crate::runtime::controller::api_code;
use crate::runtime::{
    Action, Change, Controller, EventType, Informer, ObjectKey, ReconcileError, Reconciler,
    Recorder, WorkQueue,
};

pub const NAME: &str = "nodeipam";

/// The blocks of a cluster CIDR, by index.
#[derive(Debug)]
pub struct Allocator {
    cluster: Ipv4Net,
    mask: u8,
    used: HashSet<u32>,
    next: u32,
}

impl Allocator {
    pub fn new(cluster: ClusterCidr, mask: u8) -> Result<Allocator, String> {
        let cluster = cluster.net();
        if mask < cluster.prefix_len() || mask > 30 {
            return Err(format!(
                "--node-cidr-mask-size {mask} does not fit in --cluster-cidr {cluster}"
            ));
        }
        Ok(Allocator {
            cluster,
            mask,
            used: HashSet::new(),
            next: 0,
        })
    }

    fn blocks(&self) -> u32 {
        1u32 << (self.mask - self.cluster.prefix_len()).min(31)
    }

    // Block i by arithmetic rather than ipnet's `subnets(mask).nth(i)`, which walks every
    // block before it.
    fn block(&self, i: u32) -> String {
        let base = u32::from(self.cluster.network()) + (i << (32 - self.mask));
        Ipv4Net::new_assert(Ipv4Addr::from(base), self.mask).to_string()
    }

    /// The index of `cidr` if it is one of our blocks.
    fn index(&self, cidr: &str) -> Option<u32> {
        let c = crate::cidr::parse_ipv4(cidr, self.mask..=self.mask).ok()?;
        self.cluster.contains(&c).then(|| {
            (u32::from(c.network()) - u32::from(self.cluster.network())) >> (32 - self.mask)
        })
    }

    /// Marks a block taken (a Node already has it); false if it is not ours.
    pub fn occupy(&mut self, cidr: &str) -> bool {
        match self.index(cidr) {
            Some(i) => {
                self.used.insert(i);
                true
            }
            None => false,
        }
    }

    pub fn release(&mut self, cidr: &str) {
        if let Some(i) = self.index(cidr) {
            self.used.remove(&i);
        }
    }

    /// The next free block, round-robin from the last one handed out.
    pub fn allocate(&mut self) -> Option<String> {
        let n = self.blocks();
        for k in 0..n {
            let i = (self.next + k) % n;
            if self.used.insert(i) {
                self.next = (i + 1) % n;
                return Some(self.block(i));
            }
        }
        None
    }
}

pub struct NodeIpamController {
    client: Client,
    nodes: Informer<Node>,
    allocator: Mutex<Allocator>,
    /// Whether the blocks of existing Nodes have been read (on the first reconcile, after
    /// the cache synced).
    loaded: Mutex<bool>,
    recorder: Recorder,
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    let mut v: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if let Some(c) = spec
        .and_then(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
    {
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// None when no cluster CIDR is configured (nothing to allocate).
pub fn build(ctx: &Context) -> Option<Controller<NodeIpamController>> {
    let cluster = ctx.settings.cluster_cidr?;
    let allocator = match Allocator::new(cluster, ctx.settings.node_cidr_mask_size) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "node IPAM disabled");
            return None;
        }
    };
    let nodes = ctx.informers.get::<Node>();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new();
    let ipam = Arc::new(NodeIpamController {
        client: ctx.client.clone(),
        nodes: nodes.clone(),
        allocator: Mutex::new(allocator),
        loaded: Mutex::new(false),
        recorder: ctx.events.recorder("cidrAllocator"),
    });
    let (q, me) = (queue.clone(), ipam.clone());
    nodes.on_change(move |c| match c {
        Change::Added(n) | Change::Updated { new: n, .. } => {
            if pod_cidrs(n).is_empty() {
                q.add(ObjectKey::of(n.as_ref()));
            }
        }
        Change::Deleted(n) => {
            let mut a = me.allocator();
            pod_cidrs(n).iter().for_each(|c| a.release(c));
        }
    });
    Some(Controller::new(NAME, ipam, queue, 1, ctx.metrics.clone()))
}

impl NodeIpamController {
    fn allocator(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.allocator.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load(&self) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if *loaded {
            return;
        }
        let mut a = self.allocator();
        for n in self.nodes.list() {
            for c in pod_cidrs(&n) {
                if !a.occupy(&c) {
                    tracing::warn!(node = %n.name_any(), cidr = %c, "node podCIDR is outside the cluster CIDR");
                }
            }
        }
        *loaded = true;
    }
}

impl Reconciler for NodeIpamController {
    type Key = ObjectKey;

    async fn reconcile(&self, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.load();
        let Some(node) = self.nodes.get(key) else {
            return Ok(Action::AwaitChange);
        };
        if !pod_cidrs(&node).is_empty() {
            return Ok(Action::AwaitChange);
        }
        let Some(cidr) = self.allocator().allocate() else {
            self.recorder.event(
                node.as_ref(),
                EventType::Normal,
                "CIDRNotAvailable",
                format!("Node {} status is now: CIDRNotAvailable", key.name),
            );
            return Err(ReconcileError::Retry("no pod CIDR block is free".into()));
        };
        let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
        let api: Api<Node> = Api::all(self.client.clone());
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(node = %key.name, %cidr, "pod CIDR allocated");
                Ok(Action::AwaitChange)
            }
            Err(e) => {
                self.allocator().release(&cidr);
                if api_code(&e) == Some(404) {
                    return Ok(Action::AwaitChange);
                }
                self.recorder.event(
                    node.as_ref(),
                    EventType::Warning,
                    "CIDRAssignmentFailed",
                    format!("Node {} status is now: CIDRAssignmentFailed", key.name),
                );
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_free_blocks_and_reuses_released_ones() {
        let mut a = Allocator::new("10.244.0.0/22".parse().unwrap(), 24).unwrap();
        assert!(a.occupy("10.244.1.0/24"));
        assert!(!a.occupy("10.250.0.0/24"));
        assert_eq!(a.allocate().as_deref(), Some("10.244.0.0/24"));
        assert_eq!(a.allocate().as_deref(), Some("10.244.2.0/24"));
        assert_eq!(a.allocate().as_deref(), Some("10.244.3.0/24"));
        assert_eq!(a.allocate(), None);
        a.release("10.244.2.0/24");
        assert_eq!(a.allocate().as_deref(), Some("10.244.2.0/24"));
        assert!(Allocator::new("10.244.0.0/16".parse().unwrap(), 8).is_err());
        // Not blocks of ours: another size, outside, or not a CIDR.
        for other in [
            "10.244.1.0/25",
            "10.244.0.0/22",
            "10.245.0.0/24",
            "10.244.1.0",
            "x",
        ] {
            assert!(!a.occupy(other), "{other}");
        }
    }
}
