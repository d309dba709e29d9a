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
    // SAFETY (every call): host + at .. + n lies inside this region's
    // mapping (host..host+len was checked above), which lives as long as
    // `mem`. Discarding changes only the contents of guest pages, which
    // Rust code reaches through volatile accesses only (no reference into
    // guest memory is held), and the driver gave these pages up until the
    // chain comes back used.
    let advise = |at: u64, n: u64, advice| unsafe {
        libc::madvise(host.add(at as usize).cast(), n as usize, advice) == 0
    };
    // Shared memory is a memfd (machine/memory.rs: all of a machine a
    // vhost-user backend maps, or a restored machine's fresh memory over
    // its template's holes): MADV_REMOVE punches the hole in the memfd
    // itself, so the pages go for every mapping of it. The kernel refuses
    // it for a private mapping, and stops at the first in the range:
    // EINVAL for anonymous memory, EACCES for a privately mapped template
    // file (which is never written). MADV_DONTNEED then frees this
    // process's private pages (anonymous ones come back as zeros, a
    // template's as the file's bytes); a template's range mixes the two,
    // so the memfd's pages there are found by halving it.
    if advise(0, len, libc::MADV_REMOVE) {
        return Ok(());
    }
    let mixed = io::Error::last_os_error().raw_os_error() == Some(libc::EACCES);
    if region.flags() & libc::MAP_SHARED != 0 || !advise(0, len, libc::MADV_DONTNEED) {
        return Err(Refused::Madvise(io::Error::last_os_error()));
    }
    if mixed {
        remove_shared(&advise, 0, len);
    }
    Ok(())
}

/// MADV_REMOVE on the shared parts of `at..at + len`, a range the kernel
/// refused it for as a whole: each half again, down to single pages. The
/// calls grow with the number of mappings in the range (a template's data
/// extents, fixed when it was restored), not with its length: two per
/// level for each boundary, ten levels for a 4 MiB block.
fn remove_shared(advise: &impl Fn(u64, u64, libc::c_int) -> bool, at: u64, len: u64) {
    if advise(at, len, libc::MADV_REMOVE) || len <= PAGE {
        return;
    }
    let half = len / PAGE / 2 * PAGE;
    remove_shared(advise, at, half);
    remove_shared(advise, at + half, len - half);
}
