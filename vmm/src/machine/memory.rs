//! Guest RAM, split around the MMIO gap below 4 GiB: anonymous host memory,
//! or, when a vhost-user backend (virtiofsd) must map it too, one memfd
//! whose pages both processes share.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::FromRawFd;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

use super::snapshot::{data_extents, RegionLayout};

use crate::arch::x86_64::layout::{MMIO_GAP_END, MMIO_GAP_START};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot allocate {0} MiB of guest memory: {1}")]
    Allocate(u64, vm_memory::mmap::FromRangesError),
    #[error("cannot create {0} MiB of shareable guest memory (memfd): {1}")]
    Memfd(u64, io::Error),
    #[error("the snapshot's memory layout is not that of a {0} MiB guest")]
    Layout(u64),
    #[error("cannot map the snapshot's guest memory: {0}")]
    Map(String),
}

const PAGE: u64 = 4096;

/// Anonymous memory, private to the VMM; or a memfd a backend can map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    Private,
    Shared,
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

pub fn create(mem_size: u64, backing: Backing) -> Result<GuestMemoryMmap, Error> {
    let mib = mem_size >> 20;
    match backing {
        Backing::Private => GuestMemoryMmap::from_ranges(&ranges(mem_size)),
        Backing::Shared => {
            let file = memfd(mem_size).map_err(|e| Error::Memfd(mib, e))?;
            let mut offset = 0;
            let mut regions = Vec::new();
            for (addr, len) in ranges(mem_size) {
                let handle = file.try_clone().map_err(|e| Error::Memfd(mib, e))?;
                regions.push((addr, len, Some(FileOffset::new(handle, offset))));
                offset += len as u64;
            }
            GuestMemoryMmap::from_ranges_with_files(regions)
        }
    }
    .map_err(|e| Error::Allocate(mib, e))
}

/// A close-on-exec memfd of `size` bytes (sparse: pages are allocated as
/// the guest touches them, as with anonymous memory).
fn memfd(size: u64) -> io::Result<File> {
    const NAME: &CStr = c"mvm-guest-ram";
    // SAFETY: NAME is NUL-terminated; the flags are valid for memfd_create.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this fd and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

/// Refuses a saved layout that is not exactly that of a fresh guest of
/// `mem_size`.
fn check_layout(layout: &[RegionLayout], mem_size: u64) -> Result<(), Error> {
    let expected: Vec<(u64, u64)> = ranges(mem_size)
        .into_iter()
        .map(|(addr, len)| (addr.0, len as u64))
        .collect();
    let saved: Vec<(u64, u64)> = layout.iter().map(|r| (r.guest_addr, r.len)).collect();
    if saved != expected {
        return Err(Error::Layout(mem_size >> 20));
    }
    Ok(())
}

/// Guest RAM from a snapshot's memory file, mapped privately: a page is
/// read from the file when the guest first touches it, nothing up front,
/// and the guest's writes stay in this process (copy on write), never
/// reaching the file another VM may be restored from. The layout must be
/// exactly that of a fresh guest of `mem_size`.
pub fn from_snapshot(
    file: &File,
    layout: &[RegionLayout],
    mem_size: u64,
) -> Result<GuestMemoryMmap, Error> {
    check_layout(layout, mem_size)?;
    let mut regions = Vec::with_capacity(layout.len());
    for r in layout {
        let handle = file.try_clone().map_err(|e| Error::Map(e.to_string()))?;
        let mapping = MmapRegionBuilder::new(r.len as usize)
            .with_file_offset(FileOffset::new(handle, r.file_offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| Error::Map(e.to_string()))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(r.guest_addr))
            .ok_or_else(|| Error::Map(format!("region at {:#x} overflows", r.guest_addr)))?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| Error::Map(e.to_string()))
}

/// The parts of `region` (offsets into it: page-aligned, in order,
/// disjoint) that can hold bytes other than zero; the rest of it reads as
/// zeros. What a snapshot must read to save it:
///
/// - a shared file mapping (the memfd of `Backing::Shared`) is its file:
///   the file's data extents (`SEEK_DATA`/`SEEK_HOLE`; a swapped-out
///   shmem page is data too);
/// - anonymous private memory: the pages resident in this process
///   (`mincore`), a page never touched being zeros;
/// - a private mapping of a file (a restored machine without shares):
///   the resident pages, where the guest's writes are, and the file's
///   data extents, which untouched pages read.
///
/// `mincore` does not see a page that was swapped out, so where the host
/// has swap (`sysinfo`) a private region is read whole, as is any region
/// where a call fails.
pub fn data_ranges(region: &GuestRegionMmap) -> Vec<Range<u64>> {
    data_ranges_with(region, swap_configured())
}

fn data_ranges_with(region: &GuestRegionMmap, swap: bool) -> Vec<Range<u64>> {
    let len = region.len();
    let whole = vec![Range { start: 0, end: len }];
    let shared = region.flags() & libc::MAP_SHARED != 0;
    let of_file = |f: &FileOffset| -> io::Result<Vec<Range<u64>>> {
        let start = f.start();
        Ok(data_extents(f.file(), start, start + len)?
            .into_iter()
            .map(|e| {
                (e.start - start) / PAGE * PAGE..((e.end - start).div_ceil(PAGE) * PAGE).min(len)
            })
            .collect())
    };
    let ranges = match (region.file_offset(), shared) {
        (Some(f), true) => of_file(f),
        (_, true) => return whole,
        (_, false) if swap => return whole,
        (None, false) => resident(region),
        (Some(f), false) => resident(region).and_then(|mut r| {
            r.extend(of_file(f)?);
            Ok(r)
        }),
    };
    match ranges {
        Ok(r) => union(r),
        Err(_) => whole,
    }
}

/// The pages of `region` resident in this process (`mincore`), as ranges.
fn resident(region: &GuestRegionMmap) -> io::Result<Vec<Range<u64>>> {
    /// mincore is asked about this much at a time (a byte per page).
    const WINDOW: u64 = 1 << 30;
    let len = region.len();
    let base = region.as_ptr();
    let mut vec = vec![0u8; (WINDOW / PAGE) as usize];
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut at = 0u64;
    while at < len {
        let n = WINDOW.min(len - at);
        // SAFETY: [base + at, base + at + n) lies inside the region's
        // mapping, which `region` keeps alive; base is page-aligned (mmap)
        // and so is `at` (a multiple of WINDOW); `vec` has a byte for each
        // of its at most WINDOW / PAGE pages, which is all mincore writes.
        let rc =
            unsafe { libc::mincore(base.add(at as usize).cast(), n as usize, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, state) in vec[..n.div_ceil(PAGE) as usize].iter().enumerate() {
            if state & 1 == 0 {
                continue;
            }
            let page = at + i as u64 * PAGE;
            let end = (page + PAGE).min(len);
            match out.last_mut() {
                Some(last) if last.end == page => last.end = end,
                _ => out.push(page..end),
            }
        }
        at += n;
    }
    Ok(out)
}

/// `ranges` sorted, overlapping and touching ones merged.
fn union(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.into_iter().filter(|r| !r.is_empty()) {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Whether the host has swap space: then a private page may be out of
/// memory and still hold data, which `mincore` does not tell. Unknown
/// counts as yes.
fn swap_configured() -> bool {
    // SAFETY: sysinfo only fills the struct it is given, zeroed here (all
    // zeros is a valid `libc::sysinfo`).
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable `libc::sysinfo`.
    let rc = unsafe { libc::sysinfo(&mut info) };
    rc != 0 || info.totalswap != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use vm_memory::{Bytes, GuestMemoryBackend};

    use crate::machine::snapshot::layout;

    fn one(range: Range<u64>) -> Vec<Range<u64>> {
        vec![range]
    }

    fn total(ranges: &[Range<u64>]) -> u64 {
        ranges.iter().map(|r| r.end - r.start).sum()
    }

    #[test]
    fn what_a_snapshot_reads_of_each_kind_of_memory() {
        const MIB: u64 = 1 << 20;
        // Shared: the memfd's data extents, a page.
        let shared = create(64 * MIB, Backing::Shared).unwrap();
        shared.write_obj(7u8, GuestAddress(MIB + 5)).unwrap();
        let region = shared.iter().next().unwrap();
        assert_eq!(data_ranges_with(region, false), one(MIB..MIB + PAGE));
        assert_eq!(data_ranges_with(region, true), one(MIB..MIB + PAGE));

        // Anonymous: the resident pages (a huge page, perhaps), unless
        // the host swaps.
        let private = create(64 * MIB, Backing::Private).unwrap();
        private.write_obj(7u8, GuestAddress(MIB + 5)).unwrap();
        private.write_obj(7u8, GuestAddress(40 * MIB)).unwrap();
        let region = private.iter().next().unwrap();
        let ranges = data_ranges_with(region, false);
        assert!(ranges.iter().any(|r| r.contains(&MIB)), "{ranges:x?}");
        assert!(
            ranges.iter().any(|r| r.contains(&(40 * MIB))),
            "{ranges:x?}"
        );
        assert!(total(&ranges) <= 8 * MIB, "{ranges:x?}");
        assert_eq!(data_ranges_with(region, true), one(0..64 * MIB));

        // A private mapping of a file: its data and the guest's writes.
        let file = memfd(64 * MIB).unwrap();
        file.write_all_at(b"saved", 3 * MIB).unwrap();
        let layout = layout(&private);
        let restored = from_snapshot(&file, &layout, 64 * MIB).unwrap();
        restored.write_obj(9u8, GuestAddress(50 * MIB)).unwrap();
        let region = restored.iter().next().unwrap();
        let ranges = data_ranges_with(region, false);
        assert!(ranges.iter().any(|r| r.contains(&(3 * MIB))), "{ranges:x?}");
        assert!(
            ranges.iter().any(|r| r.contains(&(50 * MIB))),
            "{ranges:x?}"
        );
        assert!(total(&ranges) <= 8 * MIB, "{ranges:x?}");
        assert_eq!(data_ranges_with(region, true), one(0..64 * MIB));
    }

    #[test]
    fn ranges_are_merged_in_order() {
        assert_eq!(
            union(vec![8..12, 0..4, 4..6, 10..20, 30..30, 25..26]),
            [0..6, 8..20, 25..26]
        );
    }

    #[test]
    fn splits_around_the_gap() {
        assert_eq!(ranges(256 << 20), vec![(GuestAddress(0), 256 << 20)]);
        let r = ranges(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), 0xd000_0000));
        assert_eq!(r[1], (GuestAddress(1 << 32), (4 << 30) - 0xd000_0000));
    }

    #[test]
    fn shared_memory_is_file_backed_at_consecutive_offsets() {
        let mem = create(4 << 30, Backing::Shared).unwrap();
        let offsets: Vec<u64> = mem
            .iter()
            .map(|r| r.file_offset().expect("file-backed").start())
            .collect();
        assert_eq!(offsets, [0, 0xd000_0000]);
        mem.write_obj(0x5au8, GuestAddress(MMIO_GAP_END)).unwrap();
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(MMIO_GAP_END)).unwrap(),
            0x5a
        );
        let private = create(64 << 20, Backing::Private).unwrap();
        assert!(private.iter().all(|r| r.file_offset().is_none()));
    }
}
