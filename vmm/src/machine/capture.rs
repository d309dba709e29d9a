//! A paused machine copied into this process's own memory, so that it can
//! go on at once and the copy be written as a snapshot afterwards: a
//! template's first run pauses its guest only for the copy, not for the
//! checksum and the writes (docs/snapshots.md).
//!
//! The copy holds the guest's pages that are not all zeros, in anonymous
//! memory of the guest's layout (untouched, the rest costs nothing), and
//! remembers where they are, so the writer reads only those.

use std::ops::Range;
use std::path::Path;

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

use super::memory;
use super::snapshot::{self, MachineState};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot allocate {0} MiB for a copy of guest memory: {1}")]
    Allocate(u64, vm_memory::mmap::FromRangesError),
    #[error("cannot copy guest memory at {addr:#x}: {why}")]
    Copy { addr: u64, why: String },
}

/// Ranges of guest memory, per region (offsets in the region).
pub type PerRegion = Vec<Vec<Range<u64>>>;

/// A machine's state and a copy of its RAM, taken while it was paused.
pub struct Capture {
    state: MachineState,
    mem: GuestMemoryMmap,
    /// Per region (in `mem`'s order), the ranges copied; the rest is zeros.
    data: PerRegion,
}

impl Capture {
    /// Copies `mem`'s non-zero pages (only where `memory::data_ranges`
    /// says data can be, less the guest-physical ranges `skip`, which
    /// hold nothing the guest needs again) beside `state`.
    pub fn take(
        state: MachineState,
        mem: &GuestMemoryMmap,
        skip: &[Range<u64>],
    ) -> Result<Capture, Error> {
        let (mem, data) = copy_data(mem, skip)?;
        Ok(Capture { state, mem, data })
    }

    /// The bytes copied.
    pub fn copied(&self) -> u64 {
        self.data.iter().flatten().map(|r| r.end - r.start).sum()
    }

    /// Writes the copy as a snapshot at `dir` (which must not exist), as
    /// `Machine::snapshot` would have written the machine at the pause.
    pub fn write(&self, dir: &Path) -> Result<(), snapshot::Error> {
        // One list of ranges per region of the layout, in its order (both
        // come from the same memory): anything else would save zeros.
        if self.data.len() != self.state.regions.len() {
            return Err(snapshot::Error::Memory {
                addr: 0,
                why: format!(
                    "the copy has {} regions, the machine {}",
                    self.data.len(),
                    self.state.regions.len()
                ),
            });
        }
        snapshot::write_with(dir, &self.state, &self.mem, &|index, _| {
            self.data[index].clone()
        })
    }
}

/// A copy of `mem`'s data (where `memory::data_ranges` says it can be) in
/// anonymous memory of its layout, and per region the ranges copied. The
/// copy's pages are made in one call per range (`MADV_POPULATE_WRITE`),
/// not one fault per page, and each range is one copy: the guest waits
/// for this. Zero pages in it are found when it is written, beside the run.
pub(in crate::machine) fn copy_data(
    mem: &GuestMemoryMmap,
    skip: &[Range<u64>],
) -> Result<(GuestMemoryMmap, PerRegion), Error> {
    let layout: Vec<(GuestAddress, usize)> = mem
        .iter()
        .map(|r| (r.start_addr(), r.len() as usize))
        .collect();
    let size: u64 = layout.iter().map(|(_, len)| *len as u64).sum();
    // No huge-page advice: a huge page would make a copied 4 KiB page cost
    // 2 MiB.
    let copy = GuestMemoryMmap::from_ranges(&layout).map_err(|e| Error::Allocate(size >> 20, e))?;
    let mut data = Vec::with_capacity(layout.len());
    for (from, to) in mem.iter().zip(copy.iter()) {
        let start = from.start_addr().0;
        let ranges = memory::data_ranges(from);
        let whole = ranges.len() == 1 && ranges[0] == (0..from.len());
        if whole && from.file_offset().is_none() {
            // Private memory read whole (the host has swap, so `mincore`
            // cannot say what holds data): most of it is the zero page,
            // and only what is not zeros is copied.
            data.push(memory::without(start, copy_nonzero(from, to)?, skip));
            continue;
        }
        let ranges = memory::without(start, ranges, skip);
        for range in &ranges {
            copy_range(from, to, range.clone())?;
        }
        data.push(ranges);
    }
    Ok((copy, data))
}

/// Copies `range` of region `from` to the same place in `to` (fresh
/// memory, whose pages it makes first).
fn copy_range(
    from: &GuestRegionMmap,
    to: &GuestRegionMmap,
    range: Range<u64>,
) -> Result<(), Error> {
    let at = MemoryRegionAddress(range.start);
    let len = (range.end - range.start) as usize;
    let fail = |e: vm_memory::GuestMemoryError| Error::Copy {
        addr: from.start_addr().0 + range.start,
        why: e.to_string(),
    };
    let dst = to.get_slice(at, len).map_err(fail)?;
    populate(dst.ptr_guard_mut().as_ptr(), len);
    let src = from.get_slice(at, len).map_err(fail)?;
    src.copy_to_volatile_slice(dst);
    Ok(())
}

/// Copies only the pages of `from` that are not all zeros; returns where
/// they are.
fn copy_nonzero(from: &GuestRegionMmap, to: &GuestRegionMmap) -> Result<Vec<Range<u64>>, Error> {
    const CHUNK: usize = 1 << 20;
    let mut buf = vec![0u8; CHUNK];
    let mut runs: Vec<Range<u64>> = Vec::new();
    let mut at = 0u64;
    while at < from.len() {
        let n = CHUNK.min((from.len() - at) as usize);
        from.read_slice(&mut buf[..n], MemoryRegionAddress(at))
            .map_err(|e| Error::Copy {
                addr: from.start_addr().0 + at,
                why: e.to_string(),
            })?;
        for run in snapshot::data_page_runs(&buf[..n]) {
            let (start, end) = (at + run.start as u64, at + run.end as u64);
            match runs.last_mut() {
                Some(last) if last.end == start => last.end = end,
                _ => runs.push(start..end),
            }
        }
        at += n as u64;
    }
    for run in &runs {
        copy_range(from, to, run.clone())?;
    }
    Ok(runs)
}

/// Makes the pages of `len` bytes at `addr` (fresh anonymous memory of
/// this process) in one call. Where the kernel cannot (before Linux 5.14)
/// the copy makes them one fault at a time, as without this.
fn populate(addr: *mut u8, len: usize) {
    // SAFETY: the range lies within a mapping this process owns (the
    // copy's region, alive for the call); MADV_POPULATE_WRITE only
    // allocates its pages and changes no contents.
    unsafe {
        libc::madvise(addr.cast(), len, libc::MADV_POPULATE_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::memory::{create, Backing};
    use vm_memory::Bytes;

    const PAGE: usize = 4096;

    /// The copy holds the guest's data where the guest had it, and stays
    /// as it was when the guest's memory changes after.
    #[test]
    fn a_copy_is_the_memory_at_the_pause() {
        for backing in [Backing::Private, Backing::Shared] {
            let mem = create(16 << 20, backing).unwrap();
            mem.write_slice(&[7u8; 10], GuestAddress(0x1000)).unwrap();
            mem.write_slice(&[9u8; PAGE], GuestAddress(0x5000)).unwrap();
            let found: Vec<_> = mem.iter().map(memory::data_ranges).collect();
            let (copy, data) = copy_data(&mem, &[]).unwrap();
            mem.write_slice(&[1u8; 4], GuestAddress(0x1000)).unwrap();
            // What the memory's own save reads (a huge page here is
            // resident whole), which holds both pages.
            assert_eq!(data, found, "{backing:?}");
            for page in [0x1000..0x2000, 0x5000..0x6000] {
                assert!(
                    data[0]
                        .iter()
                        .any(|r| r.start <= page.start && page.end <= r.end),
                    "{backing:?}: {data:?}"
                );
            }
            let mut got = [0u8; 10];
            copy.read_slice(&mut got, GuestAddress(0x1000)).unwrap();
            assert_eq!(
                got, [7u8; 10],
                "{backing:?}: the copy changed with the guest"
            );
            let mut page = vec![0u8; PAGE];
            copy.read_slice(&mut page, GuestAddress(0x5000)).unwrap();
            assert!(page.iter().all(|&b| b == 9));
        }
    }

    /// Memory read whole (a host with swap) is copied page by page, only
    /// what is not zeros: the copy of a mostly empty guest stays small.
    #[test]
    fn a_region_read_whole_copies_only_its_data_pages() {
        let mem = create(16 << 20, Backing::Private).unwrap();
        mem.write_slice(&[3u8; 8], GuestAddress(0x3000)).unwrap();
        mem.write_slice(&[4u8; 2 * PAGE], GuestAddress(0x9000))
            .unwrap();
        mem.write_slice(&[0u8; PAGE], GuestAddress(0xc000)).unwrap();
        let copy = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let (from, to) = (mem.iter().next().unwrap(), copy.iter().next().unwrap());
        let runs = copy_nonzero(from, to).unwrap();
        assert_eq!(runs, vec![0x3000..0x4000, 0x9000..0xb000]);
        let mut got = [0u8; 8];
        copy.read_slice(&mut got, GuestAddress(0x3000)).unwrap();
        assert_eq!(got, [3u8; 8]);
        let mut page = vec![0u8; PAGE];
        copy.read_slice(&mut page, GuestAddress(0xa000)).unwrap();
        assert!(page.iter().all(|&b| b == 4));
    }

    /// What a save leaves out (the bounce pool) is neither copied nor
    /// listed as data, so the snapshot has a hole there; the rest is.
    #[test]
    fn skipped_ranges_are_left_out_of_the_copy() {
        let mem = create(16 << 20, Backing::Shared).unwrap();
        mem.write_slice(&[7u8; PAGE], GuestAddress(0x1000)).unwrap();
        mem.write_slice(&[9u8; 2 * PAGE], GuestAddress(0x4000))
            .unwrap();
        let skip = 0x4000..0x5000;
        let (copy, data) = copy_data(&mem, std::slice::from_ref(&skip)).unwrap();
        let listed = |at: u64| data[0].iter().any(|r| r.contains(&at));
        assert!(listed(0x1000) && listed(0x5000), "{data:x?}");
        assert!(!listed(0x4000), "{data:x?}");
        let mut page = vec![1u8; PAGE];
        copy.read_slice(&mut page, GuestAddress(0x4000)).unwrap();
        assert!(page.iter().all(|&b| b == 0), "a skipped page was copied");
        copy.read_slice(&mut page, GuestAddress(0x5000)).unwrap();
        assert!(page.iter().all(|&b| b == 9));
    }
}
