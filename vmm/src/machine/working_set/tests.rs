//! Unit tests of `machine::working_set`: what a restored guest's pages
//! look like in the page table once touched, and how a set is read back.

use super::*;
use std::fs;
use vm_memory::Bytes;

use crate::machine::memory::tests::restored_64_mib;

const MIB: u64 = 1 << 20;

/// One range, as a list (clippy reads `vec![a..b]` as a mistake).
fn one(range: std::ops::Range<u64>) -> Vec<std::ops::Range<u64>> {
    vec![range]
}

/// A 64 MiB guest restored from a template file with data in its pages
/// at 2 and 3 MiB, the rest holes.
fn restored(name: &str) -> (std::path::PathBuf, GuestMemoryMmap) {
    let data: [(u64, &[u8]); 2] = [(2 * MIB, b"two"), (3 * MIB, b"three")];
    let (path, _file, mem) = restored_64_mib(&format!("ws-{name}"), &data);
    (path, mem)
}

fn pagemap() -> File {
    File::open("/proc/self/pagemap").unwrap()
}

fn pages(at: u64, n: u64) -> Range<u64> {
    at..at + n * PAGE
}

/// A template page the guest wrote is recorded as written; one it only
/// read, and a hole it wrote or read, as mapped; untouched pages not at
/// all. Before any touch, nothing is recorded (the control: the restore
/// itself maps no page).
#[test]
fn records_what_the_guest_touched_and_how() {
    let (path, mem) = restored("record");
    let untouched = WorkingSet::record(&mem, &pagemap()).unwrap();
    assert!(untouched.is_empty(), "{untouched:x?}");
    assert_eq!(untouched.mem_size, 64 * MIB);

    mem.write_slice(b"guest", GuestAddress(2 * MIB)).unwrap();
    let mut read = [0u8; 5];
    mem.read_slice(&mut read, GuestAddress(3 * MIB)).unwrap();
    assert_eq!(&read, b"three");
    mem.write_slice(b"hole", GuestAddress(40 * MIB)).unwrap();
    mem.read_obj::<u64>(GuestAddress(41 * MIB)).unwrap();

    let set = WorkingSet::record(&mem, &pagemap()).unwrap();
    assert_eq!(set.written, vec![pages(2 * MIB, 1)]);
    // Reads map around the page (the kernel's fault-around), never
    // beyond the template page's own mapping or the hole's.
    assert!(
        set.mapped.iter().any(|r| r.contains(&(3 * MIB))),
        "{set:x?}"
    );
    assert!(
        set.mapped.iter().any(|r| r.contains(&(40 * MIB))),
        "{set:x?}"
    );
    assert!(
        set.mapped.iter().any(|r| r.contains(&(41 * MIB))),
        "{set:x?}"
    );
    assert!(
        !set.mapped.iter().any(|r| r.contains(&(2 * MIB))),
        "{set:x?}"
    );
    assert!(
        !set.mapped.iter().any(|r| r.contains(&(20 * MIB))),
        "{set:x?}"
    );
    fs::remove_file(&path).unwrap();
}

/// Mapping a set ahead makes private copies of its written pages (they
/// read as the template's bytes until the guest writes) and returns its
/// ranges for KVM; a range outside guest RAM is left out.
#[test]
fn mapping_ahead_copies_the_written_pages() {
    let (path, mem) = restored("ahead");
    let set = WorkingSet {
        mem_size: 64 * MIB,
        written: vec![pages(2 * MIB, 1), pages(128 * MIB, 1)],
        mapped: vec![pages(3 * MIB, 2)],
    };
    let (ranges, copied) = set.map_ahead(&mem);
    assert_eq!(ranges, vec![pages(2 * MIB, 1), pages(3 * MIB, 2)]);
    assert_eq!(copied, PAGE);
    let now = WorkingSet::record(&mem, &pagemap()).unwrap();
    assert_eq!(now.written, vec![pages(2 * MIB, 1)], "not copied: {now:x?}");
    let mut bytes = [0u8; 3];
    mem.read_slice(&mut bytes, GuestAddress(2 * MIB)).unwrap();
    assert_eq!(&bytes, b"two");
    fs::remove_file(&path).unwrap();
}

/// A booted guest's pages, as a cold boot records them: in anonymous
/// memory (a machine without shares) the ones it touched are its own
/// private pages, "written", and mapping them ahead on a fresh machine
/// allocates exactly those (before it, nothing: the control); in a memfd
/// (a machine with shares) they are shared, "mapped", and left for KVM
/// to map, which allocates them.
#[test]
fn a_boot_records_its_pages_and_the_next_gets_them_allocated() {
    use crate::machine::memory::{create, Backing};
    let touch = |mem: &GuestMemoryMmap| {
        mem.write_slice(b"kernel", GuestAddress(MIB)).unwrap();
        mem.write_obj(0u64, GuestAddress(50 * MIB)).unwrap();
    };
    let booted = create(64 * MIB, Backing::Private).unwrap();
    touch(&booted);
    let set = WorkingSet::record(&booted, &pagemap()).unwrap();
    // A page each, or the huge page around it where the host gives the
    // advised memory huge pages.
    let has = |list: &[Range<u64>], at: u64| list.iter().any(|r| r.contains(&at));
    assert!(
        has(&set.written, MIB) && has(&set.written, 50 * MIB),
        "{set:x?}"
    );
    assert!(!has(&set.written, 20 * MIB), "{set:x?}");
    assert!(set.mapped.is_empty(), "{set:x?}");

    let next = create(64 * MIB, Backing::Private).unwrap();
    assert!(WorkingSet::record(&next, &pagemap()).unwrap().is_empty());
    let (ranges, allocated) = set.map_ahead(&next);
    assert_eq!(ranges, set.written);
    assert_eq!(allocated, set.len());
    assert_eq!(WorkingSet::record(&next, &pagemap()).unwrap(), set);

    let shared = create(64 * MIB, Backing::Shared).unwrap();
    touch(&shared);
    let set = WorkingSet::record(&shared, &pagemap()).unwrap();
    assert!(set.written.is_empty(), "{set:x?}");
    assert!(
        has(&set.mapped, MIB) && has(&set.mapped, 50 * MIB),
        "{set:x?}"
    );
    assert!(!has(&set.mapped, 20 * MIB), "{set:x?}");
}

/// A set reads back as written; one of another machine, out of order,
/// not whole pages, or larger than the share mapped ahead does not.
#[test]
fn a_set_reads_back_only_when_it_fits() {
    let good = WorkingSet {
        mem_size: 64 * MIB,
        written: vec![pages(0, 1), pages(2 * MIB, 2)],
        mapped: vec![pages(MIB, 4)],
    };
    let bytes = serde_json::to_vec(&good).unwrap();
    assert_eq!(WorkingSet::parse(&bytes, 64 * MIB).unwrap(), good);
    assert!(WorkingSet::parse(&bytes, 128 * MIB).is_err());
    assert!(WorkingSet::parse(b"", 64 * MIB).is_err());
    assert!(WorkingSet::parse(&bytes[..bytes.len() / 2], 64 * MIB).is_err());

    let bad = |set: WorkingSet| WorkingSet::parse(&serde_json::to_vec(&set).unwrap(), 64 * MIB);
    let mut disordered = good.clone();
    disordered.written.reverse();
    assert!(bad(disordered).is_err());
    let mut partial = good.clone();
    partial.mapped = one(MIB..MIB + 100);
    assert!(bad(partial).is_err());
    let mut empty_range = good.clone();
    empty_range.mapped = one(MIB..MIB);
    assert!(bad(empty_range).is_err());
    let mut large = good.clone();
    large.mapped = one(0..64 * MIB / MAX_SHARE + PAGE);
    assert!(bad(large.clone()).is_err());
    large.mapped = one(0..64 * MIB / MAX_SHARE);
    large.written.clear();
    assert!(bad(large).is_ok(), "exactly the share fits");
}

/// Truncation keeps written pages first, then the others, in order.
#[test]
fn truncation_keeps_the_written_pages_first() {
    let mut set = WorkingSet {
        mem_size: 64 * MIB,
        written: vec![pages(0, 2), pages(MIB, 2)],
        mapped: vec![pages(2 * MIB, 4)],
    };
    set.truncate(5 * PAGE);
    assert_eq!(set.written, vec![pages(0, 2), pages(MIB, 2)]);
    assert_eq!(set.mapped, vec![pages(2 * MIB, 1)]);
    set.truncate(3 * PAGE);
    assert_eq!(set.written, vec![pages(0, 2), pages(MIB, 1)]);
    assert!(set.mapped.is_empty());
    assert_eq!(set.len(), 3 * PAGE);
}
