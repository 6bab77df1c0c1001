//! A real node runtime for tests: a containerd of its own (data dir, socket, cgroup parent,
//! bridge and CNI network all unique to the test), torn down on drop, also on failure.

#![allow(dead_code)] // each test binary uses a different part of the fixture

use node::containerd::{Containerd, RuntimeSettings};
use node::cri::Cri;
use node::layout::Layout;
use node::names::NodeName;
use skiff_tests::registry::{self, PAUSE_IMAGE, REGISTRY};
use skiff_tests::subnet::{self, SubnetLease};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct TestRuntime {
    pub node: NodeName,
    pub layout: Layout,
    pub subnet: SubnetLease,
    pub containerd: Option<Containerd>,
    pub cri: Cri,
    dir: Option<tempfile::TempDir>,
}

impl TestRuntime {
    /// Starts containerd for a node named after `tag` and writes its CNI network.
    pub async fn start(tag: &str) -> TestRuntime {
        registry::require_images();
        static N: AtomicU32 = AtomicU32::new(0);
        let node = NodeName::new(format!(
            "t{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let dir = tempfile::Builder::new()
            .prefix("skn")
            .tempdir_in("/tmp")
            .unwrap();
        let layout = Layout::new(dir.path());
        let subnet = subnet::lease();
        node::cni::write_config(&layout, &node, subnet.cidr().parse().unwrap()).unwrap();
        let containerd = Containerd::start(layout.clone(), &settings())
            .await
            .unwrap();
        let cri = containerd.cri();
        TestRuntime {
            node,
            layout,
            subnet,
            containerd: Some(containerd),
            cri,
            dir: Some(dir),
        }
    }

    async fn teardown(&mut self) {
        if let Ok(sandboxes) = self.cri.list_pod_sandboxes(Default::default()).await {
            for s in sandboxes {
                let _ = self.cri.stop_pod_sandbox(&s.id).await;
                let _ = self.cri.remove_pod_sandbox(&s.id).await;
            }
        }
        if let Some(c) = self.containerd.take() {
            c.stop().await;
        }
        node::cni::remove_bridge(&self.node);
        node::cgroups::remove_tree(&self.node.cgroup_root());
    }
}

pub fn settings() -> RuntimeSettings {
    RuntimeSettings {
        sandbox_image: PAUSE_IMAGE.into(),
        insecure_registries: vec![REGISTRY.into()],
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        // Tests run on the multi-threaded runtime, so blocking here is allowed.
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(self.teardown()));
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}
