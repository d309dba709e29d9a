//! Unit tests of `machine::memory`.

use super::*;
use std::fs;
use std::path::PathBuf;
use vm_memory::Bytes;

use crate::machine::snapshot::layout;

const MIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mvm-memory-{}-{name}", std::process::id()))
}

fn one(range: Range<u64>) -> Vec<Range<u64>> {
    vec![range]
}

fn total(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

/// A 4 GiB guest's memory file (two regions, around the gap) with data
/// at a few offsets, the rest holes; and those offsets with their bytes.
fn sparse_memory_file(file: &File) -> (Vec<RegionLayout>, Vec<(u64, Vec<u8>)>) {
    let layout = vec![
        RegionLayout {
            guest_addr: 0,
            len: 0xd000_0000,
            file_offset: 0,
        },
        RegionLayout {
            guest_addr: MMIO_GAP_END,
            len: (4 << 30) - 0xd000_0000,
            file_offset: 0xd000_0000,
        },
    ];
    file.set_len(4 << 30).unwrap();
    let data = vec![
        (0x1000, b"first page".to_vec()),
        // Across a page boundary.
        (0x0800_0ffc, vec![0xa5; 8]),
        // The second region's start, and the file's last bytes.
        (0xd000_0000, b"above the gap".to_vec()),
        ((4 << 30) - 3, vec![1, 2, 3]),
    ];
    for (at, bytes) in &data {
        file.write_all_at(bytes, *at).unwrap();
    }
    (layout, data)
}

/// A new file, already unlinked.
fn unlinked_file(name: &str) -> File {
    let path = scratch(name);
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

/// `mem` holds `data` at the file offsets of `layout`, and zeros around.
fn assert_holds(mem: &GuestMemoryMmap, layout: &[RegionLayout], data: &[(u64, Vec<u8>)]) {
    let guest = |offset: u64| {
        let r = layout
            .iter()
            .find(|r| (r.file_offset..r.file_offset + r.len).contains(&offset))
            .unwrap();
        GuestAddress(r.guest_addr + offset - r.file_offset)
    };
    for (at, bytes) in data {
        let mut got = vec![0u8; bytes.len()];
        mem.read_slice(&mut got, guest(*at)).unwrap();
        assert_eq!(&got, bytes, "at {at:#x}");
        let mut before = [0xffu8; 16];
        mem.read_slice(&mut before, guest(at - 16)).unwrap();
        assert_eq!(before, [0; 16], "zeros before {at:#x}");
    }
}

#[test]
fn a_snapshot_restores_into_shared_memory_that_holds_its_data_and_holes() {
    let file = unlinked_file("restore-shared");
    let (layout, data) = sparse_memory_file(&file);

    let (mem, copied_ranges) = from_snapshot_shared(&file, &layout, 4 << 30).unwrap();
    assert_eq!(layout, crate::machine::snapshot::layout(&mem));
    // The guest-physical ranges it reports copied: every byte of the
    // data, and no more than the data's pages.
    for (at, bytes) in &data {
        let r = layout
            .iter()
            .find(|r| (r.file_offset..r.file_offset + r.len).contains(at))
            .unwrap();
        let gpa = r.guest_addr + at - r.file_offset;
        let last = gpa + bytes.len() as u64 - 1;
        assert!(
            copied_ranges.iter().any(|c| c.contains(&gpa))
                && copied_ranges.iter().any(|c| c.contains(&last)),
            "{at:#x} at {gpa:#x} not in {copied_ranges:x?}"
        );
    }
    assert!(total(&copied_ranges) <= 5 * PAGE, "{copied_ranges:x?}");
    for region in mem.iter() {
        assert!(region.file_offset().is_some(), "file-backed");
        assert!(region.flags() & libc::MAP_SHARED != 0, "shared");
    }
    // Only the data was copied: the memfd's holes are the file's.
    // (Before reading it through the mapping, which fills holes.)
    let backing = mem.iter().next().unwrap().file_offset().unwrap().file();
    let copied = data_extents(backing, 0, 4 << 30).unwrap();
    assert!(total(&copied) <= 5 * PAGE, "copied {copied:x?}");
    assert_holds(&mem, &layout, &data);

    // Through the buffer, as where the kernel cannot copy (EXDEV);
    // and from another memfd, which the kernel can.
    let mem = create(4 << 30, Backing::Shared).unwrap();
    copy_into(&file, &layout, &mem, &mut Copier::new(false)).unwrap();
    assert_holds(&mem, &layout, &data);
    let source = memfd(4 << 30).unwrap();
    for (at, bytes) in &data {
        source.write_all_at(bytes, *at).unwrap();
    }
    let (mem, _) = from_snapshot_shared(&source, &layout, 4 << 30).unwrap();
    assert_holds(&mem, &layout, &data);

    assert!(matches!(
        from_snapshot_shared(&file, &layout, 2 << 30),
        Err(Error::Layout(2048))
    ));
}

#[test]
fn shared_windows_hold_the_snapshots_data_and_are_the_backends_pages() {
    let file = unlinked_file("restore-windows");
    let (layout, data) = sparse_memory_file(&file);
    let mem = from_snapshot(&file, &layout, 4 << 30).unwrap();
    // One window over the first data page, one over the second
    // region's start (whose data is at file offset 0xd000_0000).
    let windows = [0x1000..0x3000, MMIO_GAP_END..MMIO_GAP_END + PAGE];
    let shared = share_windows(&file, &layout, &mem, &windows).unwrap();
    let got: Vec<(Range<u64>, u64)> = shared
        .windows
        .iter()
        .map(|w| (w.guest.clone(), w.file_offset))
        .collect();
    assert_eq!(got, [(windows[0].clone(), 0), (windows[1].clone(), 0x2000)]);
    // The guest sees the snapshot's data everywhere, windows or not.
    assert_holds(&mem, &layout, &data);
    // The memfd holds a copy of the windows' data, nothing else.
    let mut first = [0u8; 10];
    shared.file.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(&first, b"first page");
    assert!(total(&data_extents(&shared.file, 0, 0x3000).unwrap()) <= 2 * PAGE);
    // A write in a window is the backend's to see, and the reverse.
    mem.write_obj(0x77u8, GuestAddress(0x2000)).unwrap();
    let mut byte = [0u8; 1];
    shared.file.read_exact_at(&mut byte, 0x1000).unwrap();
    assert_eq!(byte, [0x77]);
    shared.file.write_all_at(&[0x55], 0x2000).unwrap();
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(MMIO_GAP_END)).unwrap(),
        0x55
    );
    // A write outside stays private: not in the snapshot, not shared.
    mem.write_obj(0x66u8, GuestAddress(0x3000)).unwrap();
    file.read_exact_at(&mut byte, 0x3000).unwrap();
    assert_eq!(byte, [0]);
    assert_eq!(shared.file.metadata().unwrap().len(), 3 * PAGE);

    for bad in [0x1800..0x2000, 0xcfff_f000..0xd000_1000, 0x1000..0x1000] {
        assert!(
            share_windows(&file, &layout, &mem, std::slice::from_ref(&bad)).is_err(),
            "{bad:x?}"
        );
    }
}

#[test]
fn what_a_snapshot_reads_of_each_kind_of_memory() {
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
fn skipped_guest_ranges_are_cut_out_of_a_regions_ranges() {
    let got = without(
        0x1000_0000,
        vec![0..0x3000, 0x5000..0x6000, 0x8000..0xa000],
        &[
            0x1000_1000..0x1000_2000,
            0x1000_5000..0x1000_9000,
            0..0x1000,
        ],
    );
    assert_eq!(got, [0..0x1000, 0x2000..0x3000, 0x9000..0xa000]);
    assert_eq!(without(0, one(0..0x1000), &[]), one(0..0x1000));
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

/// The smaps header line of this process's mapping that holds `addr`.
fn mapping_of(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find(|l| {
            let (range, _) = l.split_once(' ').unwrap();
            let (lo, hi) = range.split_once('-').unwrap();
            let lo = usize::from_str_radix(lo, 16).unwrap();
            let hi = usize::from_str_radix(hi, 16).unwrap();
            (lo..hi).contains(&addr)
        })
        .unwrap_or_else(|| panic!("no mapping holds {addr:#x}"))
        .to_string()
}

/// A 64 MiB guest restored from a memory file (a real file, not a memfd:
/// the one kind of file a template is) that holds `data` (bytes at
/// offsets), the rest holes.
pub(crate) fn restored_64_mib(
    name: &str,
    data: &[(u64, &[u8])],
) -> (PathBuf, File, GuestMemoryMmap) {
    let path = scratch(name);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    file.set_len(64 * MIB).unwrap();
    for (at, bytes) in data {
        file.write_all_at(bytes, *at).unwrap();
    }
    let layout = layout(&create(64 * MIB, Backing::Private).unwrap());
    let mem = from_snapshot(&file, &layout, 64 * MIB).unwrap();
    (path, file, mem)
}

/// A restored guest's pages the template never held (its holes) are
/// fresh shared memory, not the file's: the guest's first read of such a
/// page then allocates the page it keeps, and its write costs no copy
/// (memory.rs, `map_holes`). Its data pages stay private mappings of the
/// file, and no write reaches the file.
#[test]
fn a_templates_holes_are_fresh_shared_memory_and_its_data_the_files() {
    let (path, file, mem) = restored_64_mib("holes", &[(3 * MIB + 16, b"saved")]);
    let host = |gpa: u64| mem.get_host_address(GuestAddress(gpa)).unwrap() as usize;

    let data = mapping_of(host(3 * MIB));
    let hole = mapping_of(host(40 * MIB));
    let name = path.to_str().unwrap();
    assert!(data.ends_with(name) && data.contains(" rw-p "), "{data}");
    assert!(
        hole.contains("memfd:mvm-guest-ram") && hole.contains(" rw-s "),
        "{hole}"
    );
    // The data page's own mapping is one page: the holes around it are
    // the memfd's.
    assert!(mapping_of(host(3 * MIB + PAGE)).contains("memfd:"));
    assert!(mapping_of(host(3 * MIB - PAGE)).contains("memfd:"));

    let mut saved = [0u8; 5];
    mem.read_slice(&mut saved, GuestAddress(3 * MIB + 16))
        .unwrap();
    assert_eq!(&saved, b"saved");
    assert_eq!(mem.read_obj::<u64>(GuestAddress(40 * MIB)).unwrap(), 0);
    mem.write_slice(b"guest", GuestAddress(3 * MIB + 16))
        .unwrap();
    mem.write_slice(b"guest", GuestAddress(40 * MIB)).unwrap();
    let mut on_disk = [0u8; 5];
    file.read_exact_at(&mut on_disk, 3 * MIB + 16).unwrap();
    assert_eq!(&on_disk, b"saved", "a write reached the template");
    let extents = data_extents(&file, 0, 64 * MIB).unwrap();
    assert!(
        extents.iter().all(|e| !e.contains(&(40 * MIB))),
        "the hole's page went into the template: {extents:x?}"
    );
    fs::remove_file(&path).unwrap();
}

/// Free page reporting on a restored guest frees what it maps: the
/// memfd's pages over the template's holes go from the memfd (not merely
/// unmapped), the private copy of a data page goes and the file's bytes
/// come back, in one reported block that spans both.
#[test]
fn discarding_a_restored_block_frees_its_fresh_pages_and_its_copies() {
    use mvm_devices::virtio::balloon::discard::discard;
    let (path, file, mem) = restored_64_mib("discard", &[(4 * MIB + PAGE, b"saved")]);
    drop(file);
    let resident = |gpa: u64| {
        let addr = mem.get_host_address(GuestAddress(gpa)).unwrap();
        let mut v = 0u8;
        // SAFETY: one page of a live mapping, one byte out.
        assert_eq!(
            unsafe { libc::mincore(addr.cast(), PAGE as usize, &mut v) },
            0
        );
        v & 1 == 1
    };
    mem.write_slice(b"guest", GuestAddress(4 * MIB)).unwrap();
    mem.write_slice(b"guest", GuestAddress(4 * MIB + PAGE))
        .unwrap();
    mem.write_slice(b"guest", GuestAddress(8 * MIB - PAGE))
        .unwrap();
    // The control: the probe sees both written hole pages.
    assert!(resident(4 * MIB) && resident(8 * MIB - PAGE));

    discard(&mem, 4 * MIB, 4 * MIB).unwrap();
    assert!(!resident(4 * MIB), "the memfd kept the first hole page");
    assert!(
        !resident(8 * MIB - PAGE),
        "the memfd kept the last hole page"
    );
    assert_eq!(mem.read_obj::<u64>(GuestAddress(4 * MIB)).unwrap(), 0);
    let mut back = [0u8; 5];
    mem.read_slice(&mut back, GuestAddress(4 * MIB + PAGE))
        .unwrap();
    assert_eq!(&back, b"saved", "the data page is the file's again");
    fs::remove_file(&path).unwrap();
}
