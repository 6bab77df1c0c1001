//! NodePort allocation from the node port range (default 30000-32767).

use std::ops::RangeInclusive;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    #[error("provided port is not in the valid range. The range of valid ports is {0}-{1}")]
    OutOfRange(u16, u16),
    #[error("provided port is already allocated")]
    Allocated,
    #[error("range is full")]
    Full,
}

pub struct PortAllocator {
    range: RangeInclusive<u16>,
    used: Vec<bool>,
}

impl PortAllocator {
    pub fn new(range: RangeInclusive<u16>) -> PortAllocator {
        let n = range.clone().count();
        PortAllocator {
            range,
            used: vec![false; n],
        }
    }

    fn slot(&self, port: u16) -> Result<usize, PortError> {
        if !self.range.contains(&port) {
            return Err(PortError::OutOfRange(
                *self.range.start(),
                *self.range.end(),
            ));
        }
        Ok((port - self.range.start()) as usize)
    }

    /// Whether `port` is in the range (the store says whether it is free).
    pub fn check_range(&self, port: u16) -> Result<(), PortError> {
        self.slot(port).map(|_| ())
    }

    /// Notes that `port` is held (by a claim in the store).
    pub fn mark(&mut self, port: u16) {
        if let Ok(s) = self.slot(port) {
            self.used[s] = true;
        }
    }

    pub fn range(&self) -> RangeInclusive<u16> {
        self.range.clone()
    }

    pub fn check(&self, port: u16) -> Result<(), PortError> {
        if self.used[self.slot(port)?] {
            return Err(PortError::Allocated);
        }
        Ok(())
    }

    pub fn allocate(&mut self, port: u16) -> Result<(), PortError> {
        self.check(port)?;
        let s = self.slot(port)?;
        self.used[s] = true;
        Ok(())
    }

    /// A free port other than `except`, left free (what a dry run shows).
    pub fn next_free(&self, except: &[u16]) -> Result<u16, PortError> {
        let n = self.used.len();
        let start = rand::random_range(0..n);
        (0..n)
            .map(|i| (start + i) % n)
            .map(|s| (s, self.range.start() + s as u16))
            .find(|(s, port)| !self.used[*s] && !except.contains(port))
            .map(|(_, port)| port)
            .ok_or(PortError::Full)
    }

    pub fn allocate_next(&mut self) -> Result<u16, PortError> {
        let port = self.next_free(&[])?;
        self.allocate(port)?;
        Ok(port)
    }

    pub fn release(&mut self, port: u16) {
        if let Ok(s) = self.slot(port) {
            self.used[s] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_each_port_once() {
        let mut a = PortAllocator::new(30000..=30002);
        let mut got: Vec<u16> = (0..3).map(|_| a.allocate_next().unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![30000, 30001, 30002]);
        assert_eq!(a.allocate_next(), Err(PortError::Full));
        a.release(30001);
        assert_eq!(a.allocate(30001), Ok(()));
        assert_eq!(a.allocate(30001), Err(PortError::Allocated));
        assert_eq!(a.allocate(80), Err(PortError::OutOfRange(30000, 30002)));
    }
}
