//! Guest RAM: anonymous host memory, split around the MMIO gap below 4 GiB.

use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::arch::x86_64::layout::{MMIO_GAP_END, MMIO_GAP_START};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot allocate {0} MiB of guest memory: {1}")]
    Allocate(u64, vm_memory::mmap::FromRangesError),
}

/// RAM below the gap, and whatever does not fit there above 4 GiB.
pub fn ranges(mem_size: u64) -> Vec<(GuestAddress, usize)> {
    let low = mem_size.min(MMIO_GAP_START);
    let mut r = vec![(GuestAddress(0), low as usize)];
    if mem_size > MMIO_GAP_START {
        r.push((
            GuestAddress(MMIO_GAP_END),
            (mem_size - MMIO_GAP_START) as usize,
        ));
    }
    r
}

pub fn create(mem_size: u64) -> Result<GuestMemoryMmap, Error> {
    GuestMemoryMmap::from_ranges(&ranges(mem_size)).map_err(|e| Error::Allocate(mem_size >> 20, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_around_the_gap() {
        assert_eq!(ranges(256 << 20), vec![(GuestAddress(0), 256 << 20)]);
        let r = ranges(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), 0xd000_0000));
        assert_eq!(r[1], (GuestAddress(1 << 32), (4 << 30) - 0xd000_0000));
    }
}
