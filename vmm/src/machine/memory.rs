//! Guest RAM, split around the MMIO gap below 4 GiB: anonymous host memory,
//! or, when a vhost-user backend (virtiofsd) must map it too, one memfd
//! whose pages both processes share.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use super::snapshot::RegionLayout;

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
    let expected: Vec<(u64, u64)> = ranges(mem_size)
        .into_iter()
        .map(|(addr, len)| (addr.0, len as u64))
        .collect();
    let saved: Vec<(u64, u64)> = layout.iter().map(|r| (r.guest_addr, r.len)).collect();
    if saved != expected {
        return Err(Error::Layout(mem_size >> 20));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

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
