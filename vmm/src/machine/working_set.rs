//! The pages a run from a template touches before its command: which
//! guest pages it wrote and which it only mapped, from the restore to the
//! agent's "machine set up" marker (`mvm_protocol::boot::
//! MARKER_MACHINE_SET_UP`). One restored run of a template records them;
//! the later ones map them ahead, before their vCPUs run
//! (docs/snapshots.md, "The pages a run touches first"). A cold boot's,
//! from its start to the same marker, are recorded and mapped ahead the
//! same way for the later cold boots of its machine ("The pages a boot
//! touches first"): there every page it touched is its own, private in
//! anonymous memory, shared in a memfd.
//!
//! Why: every run from one template does the same set-up from the same
//! memory (reconnect, clock, the image root and the shares mounted), so
//! it touches much the same pages. Left to the guest, each is an exit to
//! KVM at its first touch, and a template page that the guest reads and
//! then writes costs three: mapped read-only, copied at the write, and
//! the stale mapping dropped with a flush of the guest's TLB. Mapped
//! ahead, the written ones already copied, the guest runs through them.
//!
//! What it costs: the copies of the written pages are made up front, and
//! the pages are mapped whether this run needs them or not. Both are
//! bounded ([`MAX_SHARE`] of guest RAM), and a set is only ever a hint: a
//! wrong one changes what is mapped, never what the guest reads.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::memory::union;

const PAGE: u64 = 4096;
/// At most this share of guest RAM is mapped ahead (1/8: 64 MiB of the
/// default 512), whatever a set says.
pub const MAX_SHARE: u64 = 8;
/// `/proc/self/pagemap` entries read at once (64 KiB).
const ENTRIES_PER_READ: usize = 8192;
/// pagemap bits (Documentation/admin-guide/mm/pagemap.rst).
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;

/// Guest-physical page ranges, in order and apart, each list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingSet {
    /// The guest RAM it was recorded on (bytes): a set of another machine
    /// is not used.
    pub mem_size: u64,
    /// Pages the run wrote, that were the template's: its private copies.
    pub written: Vec<Range<u64>>,
    /// Pages it mapped otherwise: template pages it only read, and fresh
    /// pages (the template's holes, the virtio-fs windows) it touched.
    pub mapped: Vec<Range<u64>>,
}

impl WorkingSet {
    /// The pages of `mem` this process maps now, from its page table
    /// (`pagemap`, `/proc/self/pagemap` opened before confinement). Of a
    /// machine restored from a template ([`super::memory::from_snapshot`]),
    /// a page is mapped only once the guest (or a device) touched it: a
    /// private page (an anonymous copy) is one it wrote that was the
    /// template's; the rest are the template's own pages or fresh shared
    /// memory.
    pub fn record(mem: &GuestMemoryMmap, pagemap: &File) -> io::Result<WorkingSet> {
        let mut set = WorkingSet {
            mem_size: mem.iter().map(|r| r.len()).sum(),
            ..Default::default()
        };
        let mut entries = vec![0u8; ENTRIES_PER_READ * 8];
        for region in mem.iter() {
            let host = region.as_ptr() as u64;
            let pages = region.len() / PAGE;
            let mut page = 0;
            while page < pages {
                let n = (pages - page).min(ENTRIES_PER_READ as u64) as usize;
                pagemap.read_exact_at(&mut entries[..n * 8], (host / PAGE + page) * 8)?;
                for (i, entry) in entries[..n * 8].chunks_exact(8).enumerate() {
                    let entry = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
                    let at = region.start_addr().0 + (page + i as u64) * PAGE;
                    let list = match classify(entry) {
                        Some(Touch::Written) => &mut set.written,
                        Some(Touch::Mapped) => &mut set.mapped,
                        None => continue,
                    };
                    push_page(list, at);
                }
                page += n as u64;
            }
        }
        Ok(set)
    }

    /// A set read back from `bytes`, for a machine of `mem_size`; an
    /// error says what is wrong with it.
    pub fn parse(bytes: &[u8], mem_size: u64) -> Result<WorkingSet, String> {
        let set: WorkingSet = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if set.mem_size != mem_size {
            return Err(format!(
                "recorded on {} MiB of guest RAM, not {}",
                set.mem_size >> 20,
                mem_size >> 20
            ));
        }
        for list in [&set.written, &set.mapped] {
            let mut end = 0;
            for r in list {
                if r.start % PAGE != 0 || r.end % PAGE != 0 || r.start < end || r.end <= r.start {
                    return Err(format!(
                        "{:#x}..{:#x} is out of order or not whole pages",
                        r.start, r.end
                    ));
                }
                end = r.end;
            }
        }
        if set.len() > mem_size / MAX_SHARE {
            return Err(format!(
                "{} MiB is more than the 1/{MAX_SHARE} of guest RAM mapped ahead",
                set.len() >> 20
            ));
        }
        Ok(set)
    }

    /// Cuts the set to at most `max` bytes: written pages first (each
    /// saves the guest the most), then the others, in address order.
    pub fn truncate(&mut self, max: u64) {
        let mut left = max;
        for list in [&mut self.written, &mut self.mapped] {
            let mut kept = Vec::with_capacity(list.len());
            for r in list.drain(..) {
                let len = (r.end - r.start).min(left);
                if len == 0 {
                    break;
                }
                kept.push(r.start..r.start + len);
                left -= len;
            }
            *list = kept;
        }
    }

    /// Bytes in the set.
    pub fn len(&self) -> u64 {
        self.written
            .iter()
            .chain(&self.mapped)
            .map(|r| r.end - r.start)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the written pages of `mem` (a machine just restored or
    /// booted, no vCPU running yet) into this process now, or allocates
    /// them where they are not a template's (`MADV_POPULATE_WRITE`);
    /// returns every range of the set that lies in guest RAM, for KVM to
    /// map (`Machine::prefault`), and how many bytes were copied. A range
    /// outside guest RAM is left out; a copy that fails stops the copying
    /// (the guest then makes the rest itself, as without a set).
    pub fn map_ahead(&self, mem: &GuestMemoryMmap) -> (Vec<Range<u64>>, u64) {
        // Each range within one region, as a recorded one is.
        let inside = |r: &&Range<u64>| {
            mem.get_slice(GuestAddress(r.start), (r.end - r.start) as usize)
                .is_ok()
        };
        let mut copied = 0;
        for r in &self.written {
            let len = (r.end - r.start) as usize;
            let Ok(slice) = mem.get_slice(GuestAddress(r.start), len) else {
                continue;
            };
            let host = slice.ptr_guard_mut().as_ptr();
            // SAFETY: [host, host + len) lies inside one region's mapping
            // (get_slice checked it), which `mem` owns; populating only
            // faults its pages in for writing (a private copy of a
            // template page), as the guest's own write would, and changes
            // no byte of guest memory.
            if unsafe { libc::madvise(host.cast(), len, libc::MADV_POPULATE_WRITE) } != 0 {
                break;
            }
            copied += len as u64;
        }
        let ranges = self
            .written
            .iter()
            .chain(&self.mapped)
            .filter(inside)
            .cloned()
            .collect();
        (union(ranges), copied)
    }
}

enum Touch {
    Written,
    Mapped,
}

/// What a pagemap entry says of a page of guest RAM: not mapped (None),
/// a private copy (present or swapped, not file-backed or shared), or
/// mapped otherwise.
fn classify(entry: u64) -> Option<Touch> {
    match (
        entry & PRESENT != 0,
        entry & SWAPPED != 0,
        entry & FILE_OR_SHARED != 0,
    ) {
        (false, false, _) => None,
        (_, _, false) => Some(Touch::Written),
        (_, _, true) => Some(Touch::Mapped),
    }
}

fn push_page(list: &mut Vec<Range<u64>>, at: u64) {
    match list.last_mut() {
        Some(last) if last.end == at => last.end += PAGE,
        _ => list.push(at..at + PAGE),
    }
}

#[cfg(test)]
mod tests;
