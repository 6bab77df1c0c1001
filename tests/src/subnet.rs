//! Pod subnets for tests: each test that creates pod networks leases a /24 of its own from
//! 10.250.0.0/16, unique across concurrently running test processes (an flock on a file per
//! subnet, released when the lease drops or the process dies).

use std::fs::File;
use std::os::fd::AsRawFd;

const LEASE_DIR: &str = "/run/skiff-test-subnets";

/// A leased `10.250.N.0/24`.
pub struct SubnetLease {
    cidr: String,
    _lock: File,
}

impl SubnetLease {
    /// The subnet, e.g. `10.250.17.0/24`.
    pub fn cidr(&self) -> &str {
        &self.cidr
    }

    /// The `n` in `10.250.n.0/24`.
    pub fn octet(&self) -> u8 {
        self.cidr
            .split('.')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

/// Leases a free /24; panics if all 256 are taken.
pub fn lease() -> SubnetLease {
    std::fs::create_dir_all(LEASE_DIR).expect("creating the subnet lease dir");
    let start = std::process::id() as usize;
    for i in 0..256 {
        let n = (start + i * 37) % 256;
        let cidr = format!("10.250.{n}.0/24");
        let file =
            File::create(format!("{LEASE_DIR}/10.250.{n}.0")).expect("creating a lease file");
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return SubnetLease { cidr, _lock: file };
        }
    }
    panic!("no free test subnet in 10.250.0.0/16");
}
