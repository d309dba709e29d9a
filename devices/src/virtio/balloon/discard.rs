//! Freeing the host memory behind a block of guest memory the driver
//! reported free. Every range is checked to lie, page-aligned, inside one
//! guest memory region before anything is freed: a driver can only ever
//! discard its own memory, and only whole pages of it.

use std::io;

use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
};

/// The guest's and the host's page size (x86_64).
pub const PAGE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the range {addr:#x}+{len:#x} is empty or not whole pages")]
    NotPages { addr: u64, len: u64 },
    #[error("the range {addr:#x}+{len:#x} is not inside one guest memory region")]
    OutsideMemory { addr: u64, len: u64 },
    #[error("madvise: {0}")]
    Madvise(io::Error),
}

/// Frees the host memory behind guest `addr..addr+len`: the guest's next
/// touch of it faults in a zero page (anonymous or shared memory) or the
/// page of the file it is privately mapped from (a template), never a
/// page of anything else.
pub fn discard(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Result<(), Refused> {
    if len == 0 || !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
        return Err(Refused::NotPages { addr, len });
    }
    let outside = || Refused::OutsideMemory { addr, len };
    let region = mem.find_region(GuestAddress(addr)).ok_or_else(outside)?;
    let offset = addr - region.start_addr().0;
    let end = offset.checked_add(len).ok_or_else(outside)?;
    if end > region.len() {
        return Err(outside());
    }
    let host = region
        .get_host_address(MemoryRegionAddress(offset))
        .map_err(|_| outside())?;
    // Shared guest memory is a memfd a vhost-user backend maps too:
    // MADV_REMOVE punches the hole in the file itself, so the pages go
    // for both mappings. That is right only because every shared guest
    // mapping is such a memfd (machine/memory.rs): a snapshot file is
    // always mapped privately, and must stay so. Private memory's pages
    // are this process's own: anonymous ones come back as zeros, those of
    // a privately mapped snapshot file as the file's bytes (the file is
    // never written).
    let advice = if region.flags() & libc::MAP_SHARED != 0 {
        libc::MADV_REMOVE
    } else {
        libc::MADV_DONTNEED
    };
    // SAFETY: host..host+len lies inside this region's mapping (checked
    // above), which lives as long as `mem`. Discarding changes only the
    // contents of guest pages, which Rust code reaches through volatile
    // accesses only (no reference into guest memory is held), and the
    // driver gave these pages up until the chain comes back used.
    let rc = unsafe { libc::madvise(host.cast(), len as usize, advice) };
    if rc != 0 {
        return Err(Refused::Madvise(io::Error::last_os_error()));
    }
    Ok(())
}
