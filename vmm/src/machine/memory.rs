//! Guest RAM, split around the MMIO gap below 4 GiB: anonymous host memory,
//! or, when a vhost-user backend (virtiofsd) must map it too, one memfd
//! whose pages both processes share.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use std::sync::Arc;

use mvm_devices::virtio::fs::{BackendMemory, SharedWindow};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap,
};

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
    #[error("cannot copy the snapshot's guest memory: {0}")]
    Copy(io::Error),
}

const PAGE: u64 = 4096;
/// Copied (without a kernel copy) in pieces this large.
const CHUNK: usize = 1 << 20;

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
    let mem = match backing {
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
    .map_err(|e| Error::Allocate(mib, e))?;
    super::huge_pages::advise(&mem);
    Ok(mem)
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
/// reaching the file another VM may be restored from. The file's holes
/// (pages the guest never wrote before the snapshot: most of its RAM)
/// are not mapped from the file but from a fresh memfd ([`map_holes`]).
/// The layout must be exactly that of a fresh guest of `mem_size`.
pub fn from_snapshot(
    file: &File,
    layout: &[RegionLayout],
    mem_size: u64,
) -> Result<GuestMemoryMmap, Error> {
    check_layout(layout, mem_size)?;
    let file_len = file
        .metadata()
        .map_err(|e| Error::Map(e.to_string()))?
        .len();
    let fresh = memfd(file_len).map_err(|e| Error::Memfd(mem_size >> 20, e))?;
    let mut regions = Vec::with_capacity(layout.len());
    for r in layout {
        let handle = file.try_clone().map_err(|e| Error::Map(e.to_string()))?;
        let mapping = MmapRegionBuilder::new(r.len as usize)
            .with_file_offset(FileOffset::new(handle, r.file_offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| Error::Map(e.to_string()))?;
        map_holes(file, r, mapping.as_ptr(), &fresh)?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(r.guest_addr))
            .ok_or_else(|| Error::Map(format!("region at {:#x} overflows", r.guest_addr)))?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| Error::Map(e.to_string()))
}

/// Maps `fresh`, a memfd at least as long as `file`, shared over the holes
/// of `file` in region `r`, whose private mapping of `file` starts at
/// `host`; each at its own file offset, so the memfd's pages stand exactly
/// for the file's missing ones (zeros until the guest writes them).
///
/// Why: the guest often reads a free page before it first writes it (its
/// DMA bounce buffers copy the destination in before the device fills
/// it). Mapped privately from the file, that read maps a page that is not
/// this process's own (the file's, or the zero page) read-only, and the
/// write then copies it: KVM must unmap the old page from the guest and
/// flush the guest's TLB, and the guest faults once more: three faults
/// and a TLB flush per page, measured (docs/snapshots.md), against one
/// fault for shared memory, whose first read already allocates the page
/// this process keeps. On tmpfs the read would also allocate the page in
/// the template file itself, which then grew with every restore.
fn map_holes(file: &File, r: &RegionLayout, host: *mut u8, fresh: &File) -> Result<(), Error> {
    let end = r.file_offset + r.len;
    let extents = data_extents(file, r.file_offset, end)
        .map_err(|e| Error::Map(format!("cannot find the template's holes: {e}")))?;
    let mut at = r.file_offset;
    let mut holes = Vec::with_capacity(extents.len() + 1);
    for extent in extents.iter().chain(std::iter::once(&(end..end))) {
        // A page that holds any data is the file's: round the hole inwards.
        let start = extent.start / PAGE * PAGE;
        if start > at {
            holes.push(at..start);
        }
        at = at.max(extent.end.div_ceil(PAGE) * PAGE);
    }
    for hole in holes {
        let len = (hole.end - hole.start) as usize;
        // SAFETY: hole lies inside r's file range (data_extents clips to
        // it, and the rounding stays between extents), so host + offset
        // .. + len lies inside the region's mapping, just made and owned
        // by the caller; MAP_FIXED replaces exactly those pages with as
        // many of the memfd's, readable and writable as before. Nothing
        // has touched the mapping yet and no vCPU exists to read it.
        let mapped = unsafe {
            libc::mmap(
                host.add((hole.start - r.file_offset) as usize).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fresh.as_raw_fd(),
                hole.start as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(Error::Map(format!(
                "cannot map fresh memory over the template's hole at {:#x}: {}",
                hole.start,
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Shares `windows` (page-aligned guest-physical ranges, each inside one
/// region) of `mem`, a snapshot's memory mapped privately
/// ([`from_snapshot`]), with a vhost-user backend: a new memfd holds a
/// copy of the file's data in them, and is mapped `MAP_SHARED` over the
/// same ranges of `mem`'s own mapping, so that the guest, this process
/// and the backend see the same pages there; the rest stays private.
/// Returns what the backend may map.
pub fn share_windows(
    file: &File,
    layout: &[RegionLayout],
    mem: &GuestMemoryMmap,
    windows: &[Range<u64>],
) -> Result<BackendMemory, Error> {
    let total: u64 = windows.iter().map(|w| w.end - w.start).sum();
    let shared = memfd(total).map_err(|e| Error::Memfd(total >> 20, e))?;
    let mut copier = Copier::new(true);
    let mut out = Vec::with_capacity(windows.len());
    let mut offset = 0u64;
    for w in windows {
        let len = w.end - w.start;
        let outside = || Error::Map(format!("{:#x}..{:#x} is not in guest RAM", w.start, w.end));
        if w.start % PAGE != 0 || len % PAGE != 0 || len == 0 {
            return Err(Error::Map(format!(
                "{:#x}..{:#x} is not whole pages",
                w.start, w.end
            )));
        }
        let r = layout
            .iter()
            .find(|r| r.guest_addr <= w.start && w.end <= r.guest_addr + r.len)
            .ok_or_else(outside)?;
        let from = r.file_offset + (w.start - r.guest_addr);
        for extent in data_extents(file, from, from + len).map_err(Error::Copy)? {
            let to = offset + (extent.start - from);
            copier
                .copy(file, extent.start, &shared, to, extent.end - extent.start)
                .map_err(Error::Copy)?;
        }
        let host = mem
            .get_slice(GuestAddress(w.start), len as usize)
            .map_err(|_| outside())?
            .ptr_guard_mut()
            .as_ptr();
        // SAFETY: [host, host + len) lies inside one region's mapping
        // (get_slice checked it), which `mem` owns and unmaps whole when
        // dropped; MAP_FIXED replaces exactly those pages with as many of
        // the memfd's, readable and writable as before, so every pointer
        // vm-memory holds stays valid. No vCPU runs yet and no device has
        // touched guest memory, so nothing is reading the old pages.
        let mapped = unsafe {
            libc::mmap(
                host.cast(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                shared.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(Error::Map(format!(
                "cannot share {:#x}..{:#x}: {}",
                w.start,
                w.end,
                io::Error::last_os_error()
            )));
        }
        out.push(SharedWindow {
            guest: w.clone(),
            file_offset: offset,
        });
        offset += len;
    }
    Ok(BackendMemory {
        file: Arc::new(shared),
        windows: out,
    })
}

/// Guest RAM from a snapshot's memory file for a machine whose memory a
/// vhost-user backend maps too: fresh shared memory, as
/// `create(mem_size, Backing::Shared)` makes it (a memfd), holding a copy
/// of the file's data extents at the same offsets; its holes stay holes.
/// This costs the machine its own copy of every data page up front (no
/// page is shared with other machines through the page cache); the copy is
/// done in the kernel where it can (`copy_file_range`), else through a
/// buffer. The layout must be exactly that of a fresh guest of `mem_size`.
/// Also returns the guest-physical ranges that were copied.
pub fn from_snapshot_shared(
    file: &File,
    layout: &[RegionLayout],
    mem_size: u64,
) -> Result<(GuestMemoryMmap, Vec<Range<u64>>), Error> {
    check_layout(layout, mem_size)?;
    let mem = create(mem_size, Backing::Shared)?;
    let copied = copy_into(file, layout, &mem, &mut Copier::new(true)).map_err(Error::Copy)?;
    Ok((mem, copied))
}

/// Copies `file`'s data extents, region by region, into `mem`'s backing
/// files; returns their guest-physical ranges.
fn copy_into(
    file: &File,
    layout: &[RegionLayout],
    mem: &GuestMemoryMmap,
    copier: &mut Copier,
) -> io::Result<Vec<Range<u64>>> {
    let mut copied = Vec::new();
    for r in layout {
        let dst = mem
            .find_region(GuestAddress(r.guest_addr))
            .and_then(|region| region.file_offset())
            .ok_or_else(|| {
                io::Error::other(format!("no file-backed region at {:#x}", r.guest_addr))
            })?;
        let end = r.file_offset.checked_add(r.len).ok_or_else(|| {
            io::Error::other(format!("the region at {:#x} overflows", r.guest_addr))
        })?;
        for extent in data_extents(file, r.file_offset, end)? {
            let to = dst.start() + (extent.start - r.file_offset);
            copier.copy(
                file,
                extent.start,
                dst.file(),
                to,
                extent.end - extent.start,
            )?;
            let at = r.guest_addr + (extent.start - r.file_offset);
            copied.push(at..at + (extent.end - extent.start));
        }
    }
    Ok(copied)
}

/// Copies ranges between files: `copy_file_range` while the kernel does
/// it for these two files, else (a snapshot on another filesystem than
/// the memfd: `EXDEV` since Linux 5.19) `pread`/`pwrite` through a buffer.
struct Copier {
    kernel: bool,
    buf: Vec<u8>,
}

impl Copier {
    fn new(kernel: bool) -> Self {
        Self {
            kernel,
            buf: Vec::new(),
        }
    }

    fn copy(&mut self, src: &File, from: u64, dst: &File, to: u64, len: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < len && self.kernel {
            let mut off_in = (from + done) as libc::loff_t;
            let mut off_out = (to + done) as libc::loff_t;
            let n = (len - done).min(isize::MAX as u64) as usize;
            // SAFETY: both fds are open and owned by `src` and `dst` for
            // the call; the two offsets are locals the kernel reads and
            // advances; no memory of this process is written otherwise.
            let copied = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    n,
                    0,
                )
            };
            if copied > 0 {
                done += copied as u64;
                continue;
            }
            if copied < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(
                        libc::EXDEV
                        | libc::EINVAL
                        | libc::ENOSYS
                        | libc::EOPNOTSUPP
                        | libc::EPERM
                        | libc::EBADF,
                    ) => {}
                    _ => return Err(e),
                }
            }
            // Not for these files (or the source ended early, which the
            // reads below then report): copy through the buffer.
            self.kernel = false;
        }
        while done < len {
            let n = CHUNK.min((len - done) as usize);
            if self.buf.len() < n {
                self.buf.resize(CHUNK, 0);
            }
            src.read_exact_at(&mut self.buf[..n], from + done)?;
            dst.write_all_at(&self.buf[..n], to + done)?;
            done += n as u64;
        }
        Ok(())
    }
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
pub(super) fn union(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
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

/// `ranges` (offsets in a region that starts at guest-physical
/// `region_start`) less the guest-physical ranges `skip`.
pub fn without(region_start: u64, ranges: Vec<Range<u64>>, skip: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = ranges;
    for s in skip {
        let (start, end) = (
            s.start.saturating_sub(region_start),
            s.end.saturating_sub(region_start),
        );
        out = out
            .into_iter()
            .flat_map(|r| {
                let before = r.start..r.end.min(start);
                let after = r.start.max(end)..r.end;
                [before, after].into_iter().filter(|p| !p.is_empty())
            })
            .collect();
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
pub(crate) mod tests;
