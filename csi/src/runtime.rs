//! What the driver's controllers (the provisioner and the resizer in every node plugin, the
//! placement controller in the Deployment) share to run on the control plane's controller
//! runtime (`control_plane::runtime::Controller`: workers, per-key back-off, panics caught
//! and counted, `skiff_controller_*` metrics): their `run` functions end when their future is
//! dropped (an aborted task), which the runtime alone does not see.

use control_plane::runtime::queue::QueueKey;
use control_plane::runtime::WorkQueue;
use tokio_util::sync::CancellationToken;

/// Dropped with a controller's `run` future: cancels its token (informers, event sink, the
/// runtime's in-flight reconciles and sampler) and shuts its queue down (the runtime's idle
/// workers wait on the queue, not on the token), so nothing of the controller outlives it.
pub(crate) struct StopOnDrop<K: QueueKey> {
    pub token: CancellationToken,
    pub queue: WorkQueue<K>,
}

impl<K: QueueKey> Drop for StopOnDrop<K> {
    fn drop(&mut self) {
        self.token.cancel();
        self.queue.shut_down();
    }
}
