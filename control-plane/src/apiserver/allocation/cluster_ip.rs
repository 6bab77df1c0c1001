//! ClusterIP allocation from the service CIDR: a bitmap of the range, random first choice with
//! linear probing (as Kubernetes' allocator does), the network, broadcast and first addresses
//! reserved (the first is the `kubernetes` service's address by convention).

use ipnet::Ipv4Net;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// The service range (`--service-cluster-ip-range`, such as `10.96.0.0/12`): an IPv4 CIDR
/// with a prefix of 8 to 30 (at most 2^24 addresses, the size of the bitmap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr(Ipv4Net);

impl Cidr {
    /// The IP family of the range, as a Service's `ipFamilies` names it.
    pub fn family(&self) -> &'static str {
        "IPv4"
    }

    /// The range's first address after the network's: the `kubernetes` Service's.
    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.0.network()).wrapping_add(1))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.contains(&ip)
    }

    fn size(&self) -> u64 {
        1u64 << (32 - self.0.prefix_len())
    }

    /// The position of `ip` in the range (the bitmap's index).
    fn offset(&self, ip: Ipv4Addr) -> Option<usize> {
        self.contains(ip)
            .then(|| (u32::from(ip) - u32::from(self.0.network())) as usize)
    }

    /// The address at `offset` (less than `size`).
    fn at(&self, offset: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.0.network()) + offset as u32)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        crate::cidr::parse_ipv4(s, 8..=30).map(Cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why an address cannot be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IpError {
    #[error("provided IP is not in the valid range. The range of valid IPs is {0}")]
    OutOfRange(Cidr),
    #[error("provided IP is already allocated")]
    Allocated,
    #[error("range is full")]
    Full,
}

/// The allocated addresses of one CIDR.
pub struct IpAllocator {
    cidr: Cidr,
    used: Vec<u64>,
    count: usize,
}

impl IpAllocator {
    pub fn new(cidr: Cidr) -> IpAllocator {
        let size = cidr.size() as usize;
        let mut a = IpAllocator {
            cidr,
            used: vec![0; size.div_ceil(64)],
            count: 0,
        };
        // network, first (kubernetes service) and broadcast addresses
        for off in [0, 1, size - 1] {
            a.set(off);
        }
        a.count = 0;
        a
    }

    pub fn cidr(&self) -> Cidr {
        self.cidr
    }

    /// Addresses handed out.
    pub fn allocated(&self) -> usize {
        self.count
    }

    fn is_set(&self, off: usize) -> bool {
        self.used[off / 64] & (1 << (off % 64)) != 0
    }

    fn set(&mut self, off: usize) {
        self.used[off / 64] |= 1 << (off % 64);
        self.count += 1;
    }

    /// Marks a specific address as used.
    pub fn allocate(&mut self, ip: Ipv4Addr) -> Result<(), IpError> {
        let off = self.cidr.offset(ip).ok_or(IpError::OutOfRange(self.cidr))?;
        if self.is_set(off) {
            return Err(IpError::Allocated);
        }
        self.set(off);
        Ok(())
    }

    /// Whether `ip` is one this range could ever hand out (in the range, not reserved); the
    /// store says whether it is free.
    pub fn check_range(&self, ip: Ipv4Addr) -> Result<(), IpError> {
        let off = self.cidr.offset(ip).ok_or(IpError::OutOfRange(self.cidr))?;
        if self.reserved(off) {
            return Err(IpError::Allocated);
        }
        Ok(())
    }

    fn reserved(&self, off: usize) -> bool {
        [0, 1, self.cidr.size() as usize - 1].contains(&off)
    }

    /// Notes that `ip` is held (by a claim in the store); a no-op if already noted.
    pub fn mark(&mut self, ip: Ipv4Addr) {
        if let Some(off) = self.cidr.offset(ip) {
            if !self.is_set(off) {
                self.set(off);
            }
        }
    }

    /// Whether `ip` could be allocated now.
    pub fn check(&self, ip: Ipv4Addr) -> Result<(), IpError> {
        let off = self.cidr.offset(ip).ok_or(IpError::OutOfRange(self.cidr))?;
        if self.is_set(off) {
            return Err(IpError::Allocated);
        }
        Ok(())
    }

    /// A free address, left free (what a dry run shows).
    pub fn next_free(&self) -> Result<Ipv4Addr, IpError> {
        let size = self.cidr.size() as usize;
        let start = rand::random_range(0..size);
        (0..size)
            .map(|i| (start + i) % size)
            .find(|off| !self.is_set(*off))
            .map(|off| self.cidr.at(off))
            .ok_or(IpError::Full)
    }

    /// Any free address.
    pub fn allocate_next(&mut self) -> Result<Ipv4Addr, IpError> {
        let ip = self.next_free()?;
        self.allocate(ip)?;
        Ok(ip)
    }

    pub fn release(&mut self, ip: Ipv4Addr) {
        if let Some(off) = self.cidr.offset(ip) {
            if self.reserved(off) || !self.is_set(off) {
                return;
            }
            self.used[off / 64] &= !(1 << (off % 64));
            self.count -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_without_duplicates_until_full() {
        let mut a = IpAllocator::new("10.0.0.0/29".parse().unwrap());
        let mut got: Vec<Ipv4Addr> = (0..5).map(|_| a.allocate_next().unwrap()).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 5);
        assert!(!got.contains(&"10.0.0.0".parse().unwrap()));
        assert!(!got.contains(&"10.0.0.1".parse().unwrap()));
        assert!(!got.contains(&"10.0.0.7".parse().unwrap()));
        assert_eq!(a.allocate_next(), Err(IpError::Full));
        a.release(got[2]);
        assert_eq!(a.allocate_next(), Ok(got[2]));
        assert_eq!(a.allocated(), 5);
    }

    #[test]
    fn requested_addresses() {
        let mut a = IpAllocator::new("10.96.0.0/12".parse().unwrap());
        let ip: Ipv4Addr = "10.100.1.2".parse().unwrap();
        a.allocate(ip).unwrap();
        assert_eq!(a.allocate(ip), Err(IpError::Allocated));
        assert!(matches!(
            a.allocate("10.112.0.1".parse().unwrap()),
            Err(IpError::OutOfRange(_))
        ));
        a.release(ip);
        a.allocate(ip).unwrap();
        assert_eq!(a.cidr().to_string(), "10.96.0.0/12");
        assert!("10.96.0.0/33".parse::<Cidr>().is_err());
        assert!("10.96.0.0".parse::<Cidr>().is_err());
    }

    #[test]
    fn bad_ranges_are_refused_with_the_value() {
        for bad in [
            "10.96.0.0/7",
            "10.96.0.0/31",
            "10.96.0/12",
            "10.96.0.0/",
            "/12",
            "",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        let c: Cidr = "10.96.0.9/12".parse().unwrap();
        assert_eq!(c.to_string(), "10.96.0.0/12");
        assert!(c.contains("10.111.255.255".parse().unwrap()));
        assert!(!c.contains("10.112.0.0".parse().unwrap()));
    }
}
