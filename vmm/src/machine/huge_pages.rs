//! Transparent huge pages for guest RAM (docs/benchmarks.md, "Guest
//! memory").

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Asks for transparent huge pages under guest RAM, as QEMU and Cloud
/// Hypervisor do: where the host backs a 2 MiB range with one huge page,
/// KVM maps it to the guest in one go, so the guest's first touch of its
/// memory costs one fault per 2 MiB instead of one per 4 KiB page.
/// Anonymous memory gets them where THP is `always` or `madvise` (most
/// distributions); a memfd where `shmem_enabled` is `advise`, `always` or
/// `within_size` (not the usual default, `never`). A host without THP
/// refuses the advice, which changes nothing, so that is no error.
pub fn advise(mem: &GuestMemoryMmap) {
    for region in mem.iter() {
        // SAFETY: the range is exactly the region's own mapping, which
        // `mem` keeps alive; MADV_HUGEPAGE only sets a flag on it and
        // changes no contents.
        unsafe {
            libc::madvise(
                region.as_ptr().cast(),
                region.len() as usize,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::{create, Backing};
    use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    /// The VmFlags of this process's mapping that starts at `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{addr:x}-");
        let block = smaps
            .split('\n')
            .skip_while(|l| !l.starts_with(&head))
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap_or_else(|| panic!("no mapping at {addr:#x}"));
        block.to_string()
    }

    #[test]
    fn guest_ram_asks_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("skipped: this kernel has no transparent huge pages");
            return;
        }
        for backing in [Backing::Private, Backing::Shared] {
            let mem = create(64 << 20, backing).unwrap();
            let start = mem.iter().next().unwrap().as_ptr() as usize;
            let flags = vm_flags(start);
            assert!(
                flags.split_whitespace().any(|f| f == "hg"),
                "{backing:?}: {flags}"
            );
        }
        // The control: memory nobody advised has no such flag.
        let plain = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let flags = vm_flags(plain.iter().next().unwrap().as_ptr() as usize);
        assert!(!flags.split_whitespace().any(|f| f == "hg"), "{flags}");
    }
}
