//! The block device minus KVM: request chains built on mock split queues
//! over real guest memory, a real file as the disk.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use event_manager::{EventManager, SubscriberOps};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::defs::*;
use super::request::Disk;
use crate::virtio::device::{Activation, Interrupt, VirtioDevice};
use crate::virtio::state::VirtioDeviceSnapshot;

const MEM_SIZE: usize = 32 << 20;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x20_0000;
const STATUS: u64 = 0x1f_0000;
/// 64 sectors, each filled with its own number so a read from the wrong
/// offset shows.
const DISK_SECTORS: u64 = 64;
const DISK_LEN: u64 = DISK_SECTORS * SECTOR_SIZE;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn disk_file() -> File {
    disk_file_of(DISK_SECTORS)
}

/// `sectors` sectors, sector s filled with the byte `s % 251 + 1` (never
/// 0, so zeros in place of data show).
fn patterned_file(sectors: u64) -> File {
    let mut f = tempfile();
    for s in 0..sectors {
        f.write_all(&[(s % 251 + 1) as u8; SECTOR_SIZE as usize])
            .unwrap();
    }
    f
}

fn disk_file_of(sectors: u64) -> File {
    let mut f = tempfile();
    for s in 0..sectors {
        f.write_all(&[s as u8; SECTOR_SIZE as usize]).unwrap();
    }
    f
}

fn tempfile() -> File {
    let path = std::env::temp_dir().join(format!(
        "mvm-blk-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

fn header(m: &GuestMemoryMmap, kind: u32, sector: u64) {
    let mut raw = [0u8; HEADER_LEN];
    raw[0..4].copy_from_slice(&kind.to_le_bytes());
    raw[8..16].copy_from_slice(&sector.to_le_bytes());
    m.write_slice(&raw, GuestAddress(HDR)).unwrap();
}

fn desc(addr: u64, len: u32, writable: bool) -> RawDescriptor {
    let flags = if writable {
        VRING_DESC_F_WRITE as u16
    } else {
        0
    };
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

/// Serves the chain `descs` (header at HDR written beforehand); returns
/// (used length, status byte).
fn serve(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> (u32, u8) {
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(m, QUEUE_SIZE);
    let chain = q.build_desc_chain(descs).unwrap();
    let mut disk = Disk::new(disk_file(), "mvm-root", DISK_LEN, DISK_SECTORS, false);
    let used = disk.serve(chain, m);
    (used, m.read_obj(GuestAddress(STATUS)).unwrap())
}

fn read_request(m: &GuestMemoryMmap, sector: u64, lens: &[u32]) -> (u32, u8) {
    serve(m, &read_chain(m, sector, lens))
}

/// An IN request at `sector` into data buffers of `lens` from DATA.
fn read_chain(m: &GuestMemoryMmap, sector: u64, lens: &[u32]) -> Vec<RawDescriptor> {
    header(m, VIRTIO_BLK_T_IN, sector);
    let mut descs = vec![desc(HDR, HEADER_LEN as u32, false)];
    let mut at = DATA;
    for &len in lens {
        descs.push(desc(at, len, true));
        at += u64::from(len);
    }
    descs.push(desc(STATUS, 1, true));
    descs
}

/// Serves `descs` from a disk of `file` (all of it) advertised as
/// `capacity` sectors; returns (used length, status byte).
fn serve_padded(
    m: &GuestMemoryMmap,
    file: File,
    capacity: u64,
    descs: &[RawDescriptor],
) -> (u32, u8) {
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let len = file.metadata().unwrap().len();
    let q = MockSplitQueue::new(m, QUEUE_SIZE);
    let chain = q.build_desc_chain(descs).unwrap();
    let mut disk = Disk::new(file, "mvm-root", len, capacity, false);
    let used = disk.serve(chain, m);
    (used, m.read_obj(GuestAddress(STATUS)).unwrap())
}

/// `len` bytes of guest memory from DATA.
fn data(m: &GuestMemoryMmap, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    got
}

#[test]
fn reads_the_sectors_asked_for_across_descriptors() {
    let m = mem();
    // Three data buffers of 1, 2 and 1 sectors from sector 5.
    let (used, status) = read_request(&m, 5, &[512, 1024, 512]);
    assert_eq!(status, VIRTIO_BLK_S_OK as u8);
    assert_eq!(used, 2048 + 1);
    let mut got = vec![0u8; 2048];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    for (i, chunk) in got.chunks(512).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == 5 + i as u8),
            "sector {} wrong",
            5 + i
        );
    }
}

#[test]
fn reads_outside_the_disk_fail_before_touching_memory() {
    let m = mem();
    m.write_slice(&[0xaa; 1024], GuestAddress(DATA)).unwrap();
    // The last sector and one past it; then a sector whose byte offset
    // overflows u64.
    for sector in [DISK_SECTORS - 1, u64::MAX / 256] {
        let (used, status) = read_request(&m, sector, &[1024]);
        assert_eq!(status, VIRTIO_BLK_S_IOERR as u8, "sector {sector}");
        assert_eq!(used, 1);
    }
    let mut got = [0u8; 1024];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got.iter().all(|&b| b == 0xaa));
    // The positive control: the same buffer at the last sector alone works.
    assert_eq!(
        read_request(&m, DISK_SECTORS - 1, &[512]).1,
        VIRTIO_BLK_S_OK as u8
    );
}

#[test]
fn partial_sectors_and_oversized_requests_are_io_errors() {
    let m = mem();
    assert_eq!(read_request(&m, 0, &[500]).1, VIRTIO_BLK_S_IOERR as u8);
    // A disk big enough that only the per-request bound can refuse.
    let big = tempfile();
    big.set_len(2 * MAX_REQUEST_BYTES as u64).unwrap();
    let sectors = 2 * MAX_REQUEST_BYTES as u64 / SECTOR_SIZE;
    let request = |len: u32| {
        header(&m, VIRTIO_BLK_T_IN, 0);
        m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let q = MockSplitQueue::new(&m, QUEUE_SIZE);
        let descs = [
            desc(HDR, HEADER_LEN as u32, false),
            desc(DATA, len, true),
            desc(STATUS, 1, true),
        ];
        let chain = q.build_desc_chain(&descs).unwrap();
        let mut disk = Disk::new(
            big.try_clone().unwrap(),
            "x",
            sectors * SECTOR_SIZE,
            sectors,
            false,
        );
        disk.serve(chain, &m);
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap()
    };
    assert_eq!(request(MAX_REQUEST_BYTES as u32), VIRTIO_BLK_S_OK as u8);
    let over = (MAX_REQUEST_BYTES + SECTOR_SIZE as usize) as u32;
    assert_eq!(request(over), VIRTIO_BLK_S_IOERR as u8);
}

#[test]
fn writes_are_refused_and_leave_the_file_alone() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_OUT, 0);
    m.write_slice(&[0x55; 512], GuestAddress(DATA)).unwrap();
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    let chain = q
        .build_desc_chain(&[
            desc(HDR, HEADER_LEN as u32, false),
            desc(DATA, 512, false),
            desc(STATUS, 1, true),
        ])
        .unwrap();
    let file = disk_file();
    let mut disk = Disk::new(
        file.try_clone().unwrap(),
        "x",
        DISK_LEN,
        DISK_SECTORS,
        false,
    );
    assert_eq!(disk.serve(chain, &m), 1);
    assert_eq!(
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_BLK_S_IOERR as u8
    );
    let mut first = [0u8; 512];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut first, 0).unwrap();
    assert!(first.iter().all(|&b| b == 0));
}

#[test]
fn get_id_flush_and_unknown_types() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_GET_ID, 0);
    m.write_slice(&[0xaa; ID_BYTES], GuestAddress(DATA))
        .unwrap();
    let descs = [
        desc(HDR, HEADER_LEN as u32, false),
        desc(DATA, ID_BYTES as u32, true),
        desc(STATUS, 1, true),
    ];
    assert_eq!(
        serve(&m, &descs),
        (ID_BYTES as u32 + 1, VIRTIO_BLK_S_OK as u8)
    );
    let mut id = [0u8; ID_BYTES];
    m.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..8], b"mvm-root");
    assert!(id[8..].iter().all(|&b| b == 0));

    let no_data = [desc(HDR, HEADER_LEN as u32, false), desc(STATUS, 1, true)];
    header(&m, VIRTIO_BLK_T_FLUSH, 0);
    assert_eq!(serve(&m, &no_data), (1, VIRTIO_BLK_S_OK as u8));
    header(&m, 11, 0); // DISCARD: not offered
    assert_eq!(serve(&m, &no_data), (1, VIRTIO_BLK_S_UNSUPP as u8));
}

#[test]
fn malformed_chains() {
    let m = mem();
    header(&m, VIRTIO_BLK_T_IN, 0);
    // A header shorter than 16 bytes.
    let short = [
        desc(HDR, 8, false),
        desc(DATA, 512, true),
        desc(STATUS, 1, true),
    ];
    assert_eq!(serve(&m, &short).1, VIRTIO_BLK_S_IOERR as u8);
    // No writable byte at all: nowhere for a status, used length 0.
    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    let chain = q
        .build_desc_chain(&[desc(HDR, HEADER_LEN as u32, false)])
        .unwrap();
    let mut disk = Disk::new(disk_file(), "x", DISK_LEN, DISK_SECTORS, false);
    assert_eq!(disk.serve(chain, &m), 0);
    // A data buffer that runs past the end of guest memory.
    let outside = [
        desc(HDR, HEADER_LEN as u32, false),
        desc(MEM_SIZE as u64 - 256, 512, true),
        desc(STATUS, 1, true),
    ];
    assert_eq!(serve(&m, &outside), (0, 0xff));
}

#[test]
fn the_handler_serves_the_queue_and_interrupts() {
    let m = mem();
    let queue_evt = EventFd::new(EFD_NONBLOCK).unwrap();
    let (mut dev, handler) = super::new(
        disk_file(),
        "mvm-root",
        vec![queue_evt.try_clone().unwrap()],
    )
    .unwrap();
    assert_ne!(dev.features() & (1 << VIRTIO_BLK_F_RO), 0);
    let mut cap = [0u8; 8];
    dev.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), DISK_SECTORS);
    let mut seg = [0u8; 4];
    dev.read_config(12, &mut seg);
    assert_eq!(u32::from_le_bytes(seg), SEG_MAX);

    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    header(&m, VIRTIO_BLK_T_IN, 3);
    q.add_desc_chains(
        &[
            RawDescriptor::from(SplitDescriptor::new(HDR, HEADER_LEN as u32, 1, 1)),
            RawDescriptor::from(SplitDescriptor::new(
                DATA,
                512,
                1 | VRING_DESC_F_WRITE as u16,
                2,
            )),
            RawDescriptor::from(SplitDescriptor::new(
                STATUS,
                1,
                VRING_DESC_F_WRITE as u16,
                0,
            )),
        ],
        0,
    )
    .unwrap();
    let queue: Queue = q.create_queue().unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let interrupt = Arc::new(Interrupt::new(irq.try_clone().unwrap()));
    let mut em = EventManager::<Box<dyn event_manager::MutEventSubscriber + Send>>::new().unwrap();
    em.add_subscriber(Box::new(handler));
    dev.activate(Activation {
        mem: m.clone(),
        queues: vec![queue],
        interrupt,
        acked_features: dev.features(),
    })
    .unwrap();
    em.run_with_timeout(1000).unwrap();
    assert_eq!(
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_BLK_S_OK as u8
    );
    assert_eq!(m.read_obj::<u8>(GuestAddress(DATA + 511)).unwrap(), 3);
    assert_eq!(irq.read().unwrap(), 1, "no interrupt after the request");
    let used = dev.active_queues().unwrap();
    assert_eq!(used[0].next_avail, 1);
    assert_eq!(used[0].next_used, 1);
    // Nothing more to do: the queue's eventfd wakes it, no interrupt.
    queue_evt.write(1).unwrap();
    em.run_with_timeout(1000).unwrap();
    assert!(irq.read().is_err());
    dev.reset();
    assert!(dev.active_queues().is_none());
}

#[test]
fn snapshots_name_the_disk_and_refuse_another() {
    let (dev, _h) = super::new(
        disk_file(),
        "mvm-root",
        vec![EventFd::new(EFD_NONBLOCK).unwrap()],
    )
    .unwrap();
    let saved = dev.save().unwrap();
    assert_eq!(
        saved,
        VirtioDeviceSnapshot::Block {
            id: "mvm-root".into(),
            sectors: DISK_SECTORS
        }
    );
    dev.check_snapshot(&saved).unwrap();
    let other = VirtioDeviceSnapshot::Block {
        id: "mvm-root".into(),
        sectors: DISK_SECTORS + 8,
    };
    assert!(dev.check_snapshot(&other).is_err());
    assert!(dev
        .check_snapshot(&VirtioDeviceSnapshot::Vsock { cid: 3 })
        .is_err());
}

#[test]
fn refuses_bad_disks() {
    let evt = || vec![EventFd::new(EFD_NONBLOCK).unwrap()];
    assert!(matches!(
        super::new(tempfile(), "x", evt()),
        Err(super::Error::Empty)
    ));
    let mut odd = tempfile();
    odd.write_all(&[0; 700]).unwrap();
    assert!(matches!(
        super::new(odd, "x", evt()),
        Err(super::Error::NotSectorAligned(700))
    ));
    assert!(matches!(
        super::new(disk_file(), "an-id-longer-than-twenty", evt()),
        Err(super::Error::IdTooLong(_))
    ));
}

/// The capacity of the padded disks below: the file's 64 sectors and 16
/// more that only exist as zeros.
const PADDED_SECTORS: u64 = DISK_SECTORS + 16;

#[test]
fn a_read_straddling_the_files_end_gives_its_data_then_zeros() {
    let m = mem();
    m.write_slice(&[0xaa; 2048], GuestAddress(DATA)).unwrap();
    // The file's last two sectors and the first two past its end, in
    // buffers that split both halves.
    let descs = read_chain(&m, DISK_SECTORS - 2, &[512, 1024, 512]);
    assert_eq!(
        serve_padded(&m, disk_file(), PADDED_SECTORS, &descs),
        (2048 + 1, VIRTIO_BLK_S_OK as u8)
    );
    let got = data(&m, 2048);
    assert!(got[..512].iter().all(|&b| b == DISK_SECTORS as u8 - 2));
    assert!(got[512..1024].iter().all(|&b| b == DISK_SECTORS as u8 - 1));
    assert!(got[1024..].iter().all(|&b| b == 0), "zeros past the file");
}

#[test]
fn a_read_straddling_the_files_end_in_a_later_chunk() {
    // A file of 1.5 chunks read whole in one request of 3 chunks: the
    // first chunk all file, the second half file, the third all zeros.
    let m = mem();
    let chunk = READ_CHUNK as u64;
    let file_sectors = chunk * 3 / 2 / SECTOR_SIZE;
    let len = 3 * READ_CHUNK;
    m.write_slice(&vec![0xaa; len], GuestAddress(DATA)).unwrap();
    let descs = read_chain(&m, 0, &[len as u32]);
    assert_eq!(
        serve_padded(&m, patterned_file(file_sectors), 4 * file_sectors, &descs),
        (len as u32 + 1, VIRTIO_BLK_S_OK as u8)
    );
    let got = data(&m, len);
    for (s, sector) in got.chunks(SECTOR_SIZE as usize).enumerate() {
        let s = s as u64;
        let want = if s < file_sectors {
            (s % 251 + 1) as u8
        } else {
            0
        };
        assert!(sector.iter().all(|&b| b == want), "sector {s}");
    }
}

#[test]
fn a_read_past_the_files_end_inside_the_capacity_is_zeros() {
    let m = mem();
    m.write_slice(&[0xaa; 1024], GuestAddress(DATA)).unwrap();
    // The capacity's last two sectors.
    let descs = read_chain(&m, PADDED_SECTORS - 2, &[1024]);
    assert_eq!(
        serve_padded(&m, disk_file(), PADDED_SECTORS, &descs),
        (1024 + 1, VIRTIO_BLK_S_OK as u8)
    );
    assert!(data(&m, 1024).iter().all(|&b| b == 0));
}

#[test]
fn a_read_past_the_capacity_is_an_io_error() {
    let m = mem();
    m.write_slice(&[0xaa; 1024], GuestAddress(DATA)).unwrap();
    // The capacity's last sector and one past it; one wholly past it.
    for sector in [PADDED_SECTORS - 1, PADDED_SECTORS] {
        let descs = read_chain(&m, sector, &[1024]);
        assert_eq!(
            serve_padded(&m, disk_file(), PADDED_SECTORS, &descs),
            (1, VIRTIO_BLK_S_IOERR as u8),
            "sector {sector}"
        );
    }
    assert!(
        data(&m, 1024).iter().all(|&b| b == 0xaa),
        "memory untouched"
    );
}

#[test]
fn a_file_that_shrank_is_still_an_io_error_not_zeros() {
    // Zeros stand in only for bytes past the length the file had when the
    // device was made; a short read inside it is the file shrinking.
    let m = mem();
    let file = disk_file();
    let descs = read_chain(&m, DISK_SECTORS - 1, &[512]);
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    let chain = q.build_desc_chain(&descs).unwrap();
    let mut disk = Disk::new(
        file.try_clone().unwrap(),
        "x",
        DISK_LEN,
        PADDED_SECTORS,
        false,
    );
    file.set_len(DISK_LEN - SECTOR_SIZE).unwrap();
    assert_eq!(disk.serve(chain, &m), 1);
    assert_eq!(
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_BLK_S_IOERR as u8
    );
}

#[test]
fn an_advertised_capacity_is_in_config_space_the_snapshot_and_the_handler() {
    let m = mem();
    let queue_evt = EventFd::new(EFD_NONBLOCK).unwrap();
    let (mut dev, handler) = super::new_with_capacity(
        disk_file(),
        "mvm-root",
        vec![queue_evt.try_clone().unwrap()],
        PADDED_SECTORS,
    )
    .unwrap();
    assert_eq!(dev.sectors(), PADDED_SECTORS);
    let mut cap = [0u8; 8];
    dev.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), PADDED_SECTORS);
    let saved = dev.save().unwrap();
    assert_eq!(
        saved,
        VirtioDeviceSnapshot::Block {
            id: "mvm-root".into(),
            sectors: PADDED_SECTORS
        }
    );
    dev.check_snapshot(&saved).unwrap();
    // A snapshot of a disk the file's size is another disk.
    let file_sized = VirtioDeviceSnapshot::Block {
        id: "mvm-root".into(),
        sectors: DISK_SECTORS,
    };
    assert!(dev.check_snapshot(&file_sized).is_err());
    // A template's disk restores over any file that fits the capacity.
    let (other, _h) = super::new_with_capacity(
        disk_file_of(8),
        "mvm-root",
        vec![EventFd::new(EFD_NONBLOCK).unwrap()],
        PADDED_SECTORS,
    )
    .unwrap();
    other.check_snapshot(&saved).unwrap();

    // The handler serves the sector the file does not have as zeros.
    m.write_slice(&[0xaa; 512], GuestAddress(DATA)).unwrap();
    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    header(&m, VIRTIO_BLK_T_IN, PADDED_SECTORS - 1);
    q.add_desc_chains(
        &[
            RawDescriptor::from(SplitDescriptor::new(HDR, HEADER_LEN as u32, 1, 1)),
            RawDescriptor::from(SplitDescriptor::new(
                DATA,
                512,
                1 | VRING_DESC_F_WRITE as u16,
                2,
            )),
            RawDescriptor::from(SplitDescriptor::new(
                STATUS,
                1,
                VRING_DESC_F_WRITE as u16,
                0,
            )),
        ],
        0,
    )
    .unwrap();
    let queue: Queue = q.create_queue().unwrap();
    let interrupt = Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap()));
    let mut em = EventManager::<Box<dyn event_manager::MutEventSubscriber + Send>>::new().unwrap();
    em.add_subscriber(Box::new(handler));
    dev.activate(Activation {
        mem: m.clone(),
        queues: vec![queue],
        interrupt,
        acked_features: dev.features(),
    })
    .unwrap();
    em.run_with_timeout(1000).unwrap();
    assert_eq!(
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_BLK_S_OK as u8
    );
    assert!(data(&m, 512).iter().all(|&b| b == 0));
}

#[test]
fn refuses_a_capacity_smaller_than_the_file_or_beyond_any_file() {
    let evt = || vec![EventFd::new(EFD_NONBLOCK).unwrap()];
    assert!(matches!(
        super::new_with_capacity(disk_file(), "x", evt(), DISK_SECTORS - 1),
        Err(super::Error::LargerThanCapacity {
            len: DISK_LEN,
            sectors
        }) if sectors == DISK_SECTORS - 1
    ));
    assert!(matches!(
        super::new_with_capacity(disk_file(), "x", evt(), u64::MAX / SECTOR_SIZE + 1),
        Err(super::Error::CapacityTooLarge(_))
    ));
    // Exactly the file's size is a plain disk.
    let (dev, _h) = super::new_with_capacity(disk_file(), "x", evt(), DISK_SECTORS).unwrap();
    assert_eq!(dev.sectors(), DISK_SECTORS);
    // The file's own checks still apply.
    assert!(matches!(
        super::new_with_capacity(tempfile(), "x", evt(), PADDED_SECTORS),
        Err(super::Error::Empty)
    ));
}

/// An OUT request writing `data` at `sector` through a writable disk over
/// `file`; returns (used length, status byte).
fn write_request(m: &GuestMemoryMmap, file: &File, sector: u64, data: &[u8]) -> (u32, u8) {
    header(m, VIRTIO_BLK_T_OUT, sector);
    m.write_slice(data, GuestAddress(DATA)).unwrap();
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(m, QUEUE_SIZE);
    let chain = q
        .build_desc_chain(&[
            desc(HDR, HEADER_LEN as u32, false),
            desc(DATA, data.len() as u32, false),
            desc(STATUS, 1, true),
        ])
        .unwrap();
    let mut disk = Disk::new(file.try_clone().unwrap(), "x", DISK_LEN, DISK_SECTORS, true);
    (
        disk.serve(chain, m),
        m.read_obj(GuestAddress(STATUS)).unwrap(),
    )
}

#[test]
fn a_writable_disk_writes_where_asked_and_reads_it_back() {
    let m = mem();
    let file = disk_file();
    let data: Vec<u8> = (0..1024).map(|i| (i % 200) as u8 + 7).collect();
    assert_eq!(
        write_request(&m, &file, 3, &data),
        (1, VIRTIO_BLK_S_OK as u8)
    );
    let mut back = vec![0u8; 1024];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 3 * SECTOR_SIZE).unwrap();
    assert_eq!(back, data);
    // The sectors around it are untouched.
    let mut before = [0u8; 512];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut before, 2 * SECTOR_SIZE).unwrap();
    assert!(before.iter().all(|&b| b == 2));
    let mut after = [0u8; 512];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut after, 5 * SECTOR_SIZE).unwrap();
    assert!(after.iter().all(|&b| b == 5));
    // FLUSH is served (fdatasync) on a writable disk.
    header(&m, VIRTIO_BLK_T_FLUSH, 0);
    m.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(&m, QUEUE_SIZE);
    let chain = q
        .build_desc_chain(&[desc(HDR, HEADER_LEN as u32, false), desc(STATUS, 1, true)])
        .unwrap();
    let mut disk = Disk::new(file, "x", DISK_LEN, DISK_SECTORS, true);
    assert_eq!(disk.serve(chain, &m), 1);
    assert_eq!(
        m.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_BLK_S_OK as u8
    );
}

#[test]
fn writes_outside_the_disk_or_of_partial_sectors_fail_before_touching_the_file() {
    let m = mem();
    let file = disk_file();
    let io_err = (1, VIRTIO_BLK_S_IOERR as u8);
    // The last sector and one past it; a partial sector; past the end.
    assert_eq!(
        write_request(&m, &file, DISK_SECTORS - 1, &[9; 1024]),
        io_err
    );
    assert_eq!(write_request(&m, &file, 0, &[9; 100]), io_err);
    assert_eq!(write_request(&m, &file, DISK_SECTORS, &[9; 512]), io_err);
    assert_eq!(write_request(&m, &file, u64::MAX / 256, &[9; 512]), io_err);
    assert_eq!(
        file.metadata().unwrap().len(),
        DISK_LEN,
        "the file did not grow"
    );
    let mut last = [0u8; 512];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut last, DISK_LEN - SECTOR_SIZE).unwrap();
    assert!(
        last.iter().all(|&b| b == (DISK_SECTORS - 1) as u8),
        "nothing was written"
    );
}

#[test]
fn a_writable_disk_offers_flush_not_read_only() {
    let (device, _) = super::new_writable(
        disk_file(),
        "mvm-disk",
        vec![EventFd::new(EFD_NONBLOCK).unwrap()],
    )
    .unwrap();
    let features = device.features();
    assert_ne!(features & (1 << VIRTIO_BLK_F_FLUSH), 0);
    assert_eq!(features & (1 << VIRTIO_BLK_F_RO), 0);
    let (ro, _) = super::new(
        disk_file(),
        "mvm-root",
        vec![EventFd::new(EFD_NONBLOCK).unwrap()],
    )
    .unwrap();
    assert_ne!(ro.features() & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(ro.features() & (1 << VIRTIO_BLK_F_FLUSH), 0);
}
