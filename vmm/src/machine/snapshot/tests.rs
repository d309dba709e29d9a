//! Writing and reading snapshots: round trips, holes, checksums and
//! damaged files.

use super::*;
use crate::machine::memory::{self, Backing};

const MIB: u64 = 1 << 20;

fn found(_: usize, region: &GuestRegionMmap) -> Vec<Range<u64>> {
    memory::data_ranges(region)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mvm-snapshot-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The checksum of a read of all of `mem`, as writing it used to: every
/// page that is not all zeros, with its offset in the file.
fn hash_of_everything(mem: &GuestMemoryMmap, regions: &[RegionLayout]) -> String {
    let mut hasher = XxHash3_128::new();
    let mut page = vec![0u8; PAGE];
    for r in regions {
        for at in (0..r.len).step_by(PAGE) {
            mem.read_slice(&mut page, GuestAddress(r.guest_addr + at))
                .unwrap();
            if page.iter().any(|&b| b != 0) {
                hash_page(&mut hasher, r.file_offset + at, &page);
            }
        }
    }
    hex128(hasher.finish_128())
}

/// Writes `mem`'s memory file and checks it: its length, each byte
/// against guest memory, data only at `data_pages` (file offsets), and
/// the checksum against reading everything and against the reader's.
fn saves_exactly(mem: &GuestMemoryMmap, name: &str, data_pages: &[u64]) {
    let dir = scratch(name);
    let path = dir.join(MEMORY);
    let regions = layout(mem);
    let (sha, len) = write_memory(&path, mem, &regions, &found).unwrap();
    assert_eq!(len, regions.iter().map(|r| r.len).sum::<u64>());

    let file = File::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap().len(), len);
    let saved = fs::read(&path).unwrap();
    for r in &regions {
        let mut guest = vec![0u8; r.len as usize];
        mem.read_slice(&mut guest, GuestAddress(r.guest_addr))
            .unwrap();
        let at = r.file_offset as usize;
        assert!(
            saved[at..at + guest.len()] == guest[..],
            "the memory file holds the region at {:#x}",
            r.guest_addr
        );
    }
    let pages: Vec<u64> = data_extents(&file, 0, len)
        .unwrap()
        .into_iter()
        .flat_map(|e| (e.start..e.end).step_by(PAGE))
        .collect();
    assert_eq!(pages, data_pages, "data only where memory is not zero");

    assert_eq!(sha, hash_of_everything(mem, &regions));
    assert_eq!(
        sha,
        hex128(hash_data_pages(&file, len).unwrap().finish_128())
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mostly_empty_shared_guest_is_saved_as_its_data_pages_and_holes() {
    let mem = memory::create(64 * MIB, Backing::Shared).unwrap();
    mem.write_slice(b"hello", GuestAddress(0x1000)).unwrap();
    // Across a page boundary.
    mem.write_slice(&[0x5a; 8], GuestAddress(2 * MIB + 4092))
        .unwrap();
    mem.write_obj(1u8, GuestAddress(64 * MIB - 1)).unwrap();
    // A page the memfd holds (data) but that is all zeros: a hole.
    mem.write_slice(&[0u8; PAGE], GuestAddress(5 * MIB))
        .unwrap();
    let region = mem.iter().next().unwrap();
    let visited: u64 = memory::data_ranges(region)
        .iter()
        .map(|r| r.end - r.start)
        .sum();
    assert_eq!(visited, 5 * PAGE as u64, "only the memfd's data is read");
    saves_exactly(
        &mem,
        "shared",
        &[0x1000, 2 * MIB, 2 * MIB + 0x1000, 64 * MIB - 0x1000],
    );
}

#[test]
fn an_anonymous_guest_is_saved_from_its_resident_pages() {
    let mem = memory::create(64 * MIB, Backing::Private).unwrap();
    mem.write_slice(b"hello", GuestAddress(0x1000)).unwrap();
    mem.write_slice(&[0x5a; 8], GuestAddress(30 * MIB + 4092))
        .unwrap();
    // Touched (resident) but zeros: a hole.
    mem.write_slice(&[0u8; PAGE], GuestAddress(40 * MIB))
        .unwrap();
    saves_exactly(&mem, "anonymous", &[0x1000, 30 * MIB, 30 * MIB + 0x1000]);
}

#[test]
fn a_restored_private_guest_saves_the_file_pages_it_did_not_touch_and_its_writes() {
    let before = memory::create(64 * MIB, Backing::Private).unwrap();
    before.write_slice(b"kept", GuestAddress(0x1000)).unwrap();
    before.write_slice(b"cleared", GuestAddress(MIB)).unwrap();
    let dir = scratch("restored-private");
    let path = dir.join(MEMORY);
    write_memory(&path, &before, &layout(&before), &found).unwrap();
    let file = File::open(&path).unwrap();
    let mem = memory::from_snapshot(&file, &layout(&before), 64 * MIB).unwrap();
    mem.write_slice(&[0u8; 16], GuestAddress(MIB)).unwrap();
    mem.write_slice(b"new", GuestAddress(20 * MIB)).unwrap();
    saves_exactly(&mem, "restored-private-again", &[0x1000, 20 * MIB]);
    fs::remove_dir_all(&dir).unwrap();
}

/// A template's first run writes a copy taken at the pause
/// (`machine::capture`): the file is the one the machine's own memory
/// would have given, byte for byte and checksum.
#[test]
fn a_copy_of_guest_memory_saves_the_same_file_as_the_memory() {
    for backing in [Backing::Private, Backing::Shared] {
        let mem = memory::create(64 * MIB, backing).unwrap();
        mem.write_slice(b"hello", GuestAddress(0x1000)).unwrap();
        mem.write_slice(&[0x5a; 8], GuestAddress(2 * MIB + 4092))
            .unwrap();
        mem.write_slice(&[0u8; PAGE], GuestAddress(5 * MIB))
            .unwrap();
        let regions = layout(&mem);
        let dir = scratch(&format!("copy-{backing:?}"));
        let (direct, direct_len) =
            write_memory(&dir.join("direct"), &mem, &regions, &found).unwrap();
        let (copy, data) = super::super::capture::copy_data(&mem, &[]).unwrap();
        let (copied, copied_len) = write_memory(&dir.join("copied"), &copy, &regions, &|i, _| {
            data[i].clone()
        })
        .unwrap();
        assert_eq!((copied, copied_len), (direct, direct_len), "{backing:?}");
        assert!(fs::read(dir.join("copied")).unwrap() == fs::read(dir.join("direct")).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn data_page_runs_join_neighbours_and_skip_zero_pages() {
    let mut buf = vec![0u8; 6 * PAGE];
    buf[PAGE] = 1;
    buf[3 * PAGE - 1] = 2;
    buf[5 * PAGE + 7] = 3;
    assert_eq!(
        data_page_runs(&buf),
        vec![PAGE..3 * PAGE, 5 * PAGE..6 * PAGE]
    );
    assert!(data_page_runs(&[0u8; 3 * PAGE]).is_empty());
}
