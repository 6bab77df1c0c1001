//! Opening a pinned link and replacing its program atomically (BPF_LINK_UPDATE), the two
//! link commands aya 0.14 does not expose. With them a restarted proxy swaps in its
//! programs without a moment in which the cgroup has none.

pub use super::sys::{link_update as update, open_pinned};
