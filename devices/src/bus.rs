//! An address bus (port I/O or MMIO) that routes guest accesses to devices.
//!
//! vCPU threads dispatch their I/O exits through it synchronously, so every
//! device sits behind its own `Mutex`: two vCPUs touching two devices do not
//! contend, two touching the same device are serialised.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A device reachable through a [`Bus`]. `offset` is relative to the start of
/// the range the device was inserted at.
pub trait BusDevice: Send {
    /// A guest read: fill `data` (its length is the access size).
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write of `data`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors from building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The new range overlaps one already on the bus.
    #[error("bus range {base:#x}+{len:#x} overlaps a device already there")]
    Overlap { base: u64, len: u64 },
    /// A range of length zero, or one that wraps past the end of the space.
    #[error("bus range {base:#x}+{len:#x} is empty or wraps around")]
    BadRange { base: u64, len: u64 },
}

struct Range {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Devices keyed by the first address of their range.
#[derive(Default)]
pub struct Bus {
    ranges: BTreeMap<u64, Range>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `device` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), Error> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(Error::BadRange { base, len })?;
        // The only candidates for overlap are the range starting at or below
        // `base` and the first range starting above it.
        let below = self.ranges.range(..=base).next_back();
        let above = self.ranges.range(base..).next();
        let overlaps_below = below.is_some_and(|(b, r)| b + r.len > base);
        let overlaps_above = above.is_some_and(|(b, _)| *b < end);
        if overlaps_below || overlaps_above {
            return Err(Error::Overlap { base, len });
        }
        self.ranges.insert(base, Range { len, device });
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &Range)> {
        let (base, range) = self.ranges.range(..=addr).next_back()?;
        (addr - base < range.len).then_some((addr - base, range))
    }

    /// Routes a read; returns false (and leaves `data` alone) if no device
    /// claims `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((offset, range)) => {
                lock(&range.device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Routes a write; returns false if no device claims `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((offset, range)) => {
                lock(&range.device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// A device whose lock was poisoned by a panicking vCPU thread is still
/// usable for the remaining teardown; the panic itself is reported elsewhere.
fn lock<'a>(device: &'a Mutex<dyn BusDevice + 'static>) -> MutexGuard<'a, dyn BusDevice + 'static> {
    device
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_offset_within_range() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new();
        bus.insert(dev.clone(), 0x3f8, 8).unwrap();
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fd, &mut data));
        assert_eq!(data, [5]);
        assert!(bus.write(0x3f8, &[0x41]));
        assert_eq!(dev.lock().unwrap().writes, vec![(0, vec![0x41])]);
    }

    #[test]
    fn unclaimed_addresses_are_reported() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Recorder::default())), 0x3f8, 8)
            .unwrap();
        let mut data = [0xaa];
        assert!(!bus.read(0x3f7, &mut data));
        assert!(!bus.read(0x400, &mut data));
        assert_eq!(data, [0xaa]);
        assert!(!bus.write(0x400, &[1]));
    }

    #[test]
    fn rejects_overlaps_and_bad_ranges() {
        let mut bus = Bus::new();
        let dev = || Arc::new(Mutex::new(Recorder::default()));
        bus.insert(dev(), 0x100, 0x10).unwrap();
        assert_eq!(
            bus.insert(dev(), 0x10f, 1),
            Err(Error::Overlap {
                base: 0x10f,
                len: 1
            })
        );
        assert_eq!(
            bus.insert(dev(), 0xf8, 0x10),
            Err(Error::Overlap {
                base: 0xf8,
                len: 0x10
            })
        );
        assert!(bus.insert(dev(), 0x110, 1).is_ok());
        assert!(bus.insert(dev(), 0xf0, 0x10).is_ok());
        assert_eq!(
            bus.insert(dev(), 0x200, 0),
            Err(Error::BadRange {
                base: 0x200,
                len: 0
            })
        );
        assert_eq!(
            bus.insert(dev(), u64::MAX, 2),
            Err(Error::BadRange {
                base: u64::MAX,
                len: 2
            })
        );
    }
}
