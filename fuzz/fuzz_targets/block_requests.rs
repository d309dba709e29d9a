//! The virtio-blk request parser: well-formed and malformed request chains
//! (any type, sector, segment count, lengths and directions, header and
//! status descriptors of any size and direction) on a started device.
//! Besides panics, hangs and runaway allocations, oracles: a request of
//! the plain shape Linux sends (a 16-byte header, whole-sector writable
//! segments, a 1-byte writable status) that reads inside the file must
//! come back OK with the file's bytes. On the read-only disk (an image
//! root) a write (whose header the device can read whole) is never
//! answered OK, and nothing ever writes the disk. On a writable disk (a
//! sandbox's) the file never changes length, a plain write inside it is
//! answered OK, and a plain write answered OK put exactly its data at its
//! sector.

#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use mvm_devices::virtio::block::{self, defs::*};
use mvm_fuzz::disk;
use mvm_fuzz::driver::{guest_memory, queue_events, Driver, Op};
use vm_memory::{Bytes, GuestAddress};

const HEADER_AT: u64 = 0x8_0000;
const STATUS_AT: u64 = 0x8_1000;
const DATA_AT: u64 = 0x9_0000;
/// Data segments lie back to back from DATA_AT up to here.
const DATA_END: u64 = 0xf_0000;
const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const MAX_REQUESTS: usize = 32;
const MAX_SEGMENTS: usize = 16;

/// Each shape is an enum whose first variant is what Linux sends, so that
/// plain requests (which the oracle checks) come up as often as odd ones.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum Kind {
    In,
    Out,
    Flush,
    GetId,
    Other(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Span {
    /// Whole sectors, device-writable (a read's data segment).
    Sectors(u8),
    Bytes {
        len: u16,
        writable: bool,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Sector {
    /// Inside the file or just past it.
    Near(u8),
    /// Where `sector * 512` overflows.
    Far(u8),
}

#[derive(Arbitrary, Debug)]
struct Request {
    kind: Kind,
    sector: Sector,
    /// The header descriptor: 16 device-readable bytes, or anything.
    header: Option<Span>,
    segments: Vec<Span>,
    /// The status descriptor: 1 device-writable byte, or anything.
    status: Option<Span>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// A sandbox's writable disk instead of the read-only root.
    writable: bool,
    extra_sectors: u8,
    requests: Vec<Request>,
}

impl Span {
    fn len(self) -> u32 {
        match self {
            Span::Sectors(n) => u32::from(n % 16) * SECTOR_SIZE as u32,
            Span::Bytes { len, .. } => u32::from(len),
        }
    }

    fn writable(self) -> bool {
        match self {
            Span::Sectors(_) => true,
            Span::Bytes { writable, .. } => writable,
        }
    }
}

impl Request {
    fn kind(&self) -> u32 {
        match self.kind {
            Kind::In => VIRTIO_BLK_T_IN,
            Kind::Out => VIRTIO_BLK_T_OUT,
            Kind::Flush => VIRTIO_BLK_T_FLUSH,
            Kind::GetId => VIRTIO_BLK_T_GET_ID,
            Kind::Other(k) => k,
        }
    }

    fn sector(&self) -> u64 {
        match self.sector {
            Sector::Near(s) => u64::from(s) % (disk::SECTORS + 4),
            Sector::Far(s) => u64::MAX - u64::from(s),
        }
    }

    fn header(&self) -> (u32, bool) {
        self.header
            .map_or((HEADER_LEN as u32, false), |s| (s.len(), s.writable()))
    }

    fn status(&self) -> (u32, bool) {
        self.status.map_or((1, true), |s| (s.len(), s.writable()))
    }

    fn segments(&self) -> impl Iterator<Item = Span> + '_ {
        self.segments.iter().take(MAX_SEGMENTS).copied()
    }

    fn data_len(&self) -> u64 {
        self.segments().map(|s| u64::from(s.len())).sum()
    }

    /// The shape Linux sends for a read of whole sectors inside the file.
    fn is_plain_read(&self) -> bool {
        self.kind == Kind::In
            && self.header.is_none()
            && self.status.is_none()
            && self.segments().count() > 0
            && self
                .segments()
                .all(|s| matches!(s, Span::Sectors(n) if n % 16 > 0))
            && matches!(self.sector, Sector::Near(_))
            && self.sector() * SECTOR_SIZE + self.data_len() <= disk::SECTORS * SECTOR_SIZE
            && DATA_AT + self.data_len() <= DATA_END
    }

    /// The shape Linux sends for a write: a 16-byte header, device-readable
    /// segments of whole sectors (the data, back to back from DATA_AT), a
    /// 1-byte writable status.
    fn is_plain_write(&self) -> bool {
        self.kind == Kind::Out
            && self.header.is_none()
            && self.status.is_none()
            && self.segments().count() > 0
            && self.segments().all(|s| {
                matches!(s, Span::Bytes { len, writable: false } if len > 0 && u64::from(len) % SECTOR_SIZE == 0)
            })
            && DATA_AT + self.data_len() <= DATA_END
    }

    /// Whether the device reads our type: the chain's first readable bytes
    /// are the header only when its descriptor is readable and whole.
    fn is_typed(&self) -> bool {
        let (len, writable) = self.header();
        !writable && len as usize >= HEADER_LEN
    }
}

fuzz_target!(|input: Input| {
    let file = disk::patterned();
    let check = file.try_clone().expect("dup the fuzz disk");
    let (evts, clones) = queue_events(QUEUE_COUNT);
    let sectors = disk::SECTORS + u64::from(input.extra_sectors);
    let (device, handler) = match input.writable {
        true => block::new_writable(file, "fuzz", evts),
        false => block::new_with_capacity(file, "fuzz", evts, sectors),
    }
    .expect("the block device");
    let mut driver = Driver::new(guest_memory(), device, handler, clones);
    driver.apply(&Op::Start { mask: 0 });
    for request in input.requests.iter().take(MAX_REQUESTS) {
        serve(&mut driver, request, &check, input.writable);
    }
    match input.writable {
        true => disk::assert_same_length(&check),
        false => disk::assert_unchanged(&check),
    }
});

fn serve<H: event_manager::MutEventSubscriber>(
    driver: &mut Driver<block::Block, H>,
    request: &Request,
    disk_file: &std::fs::File,
    writable: bool,
) {
    let mem = driver.mem.clone();
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&request.kind().to_le_bytes());
    header[8..16].copy_from_slice(&request.sector().to_le_bytes());
    mem.write_slice(&header, GuestAddress(HEADER_AT)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(STATUS_AT)).unwrap();
    // Descriptors 0..n: header, segments, status, chained.
    let (header_len, header_writable) = request.header();
    let mut descs = vec![(HEADER_AT, header_len, header_writable)];
    let mut at = DATA_AT;
    for s in request.segments() {
        descs.push((at.min(DATA_END), s.len(), s.writable()));
        at += u64::from(s.len());
    }
    let (status_len, status_writable) = request.status();
    descs.push((STATUS_AT, status_len, status_writable));
    let last = descs.len() - 1;
    for (i, &(addr, len, writable)) in descs.iter().enumerate() {
        let mut flags = if writable { VIRTQ_DESC_F_WRITE } else { 0 };
        if i < last {
            flags |= VIRTQ_DESC_F_NEXT;
        }
        driver.apply(&Op::Desc {
            queue: 0,
            index: i as u8,
            addr: addr as u32,
            len,
            flags,
            next: i as u16 + 1,
        });
    }
    driver.apply(&Op::Avail {
        queue: 0,
        head: 0,
        bump: 0,
    });
    driver.apply(&Op::Notify { queue: 0 });
    driver.apply(&Op::Run);
    let status: u8 = mem.read_obj(GuestAddress(STATUS_AT)).unwrap();
    if request.is_plain_read() {
        assert_eq!(
            status, VIRTIO_BLK_S_OK as u8,
            "a plain read failed: {request:?}"
        );
        let len = request.data_len() as usize;
        let mut got = vec![0u8; len];
        mem.read_slice(&mut got, GuestAddress(DATA_AT)).unwrap();
        let mut want = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(
            disk_file,
            &mut want,
            request.sector() * SECTOR_SIZE,
        )
        .unwrap();
        assert!(
            got == want,
            "a plain read returned other bytes: {request:?}"
        );
    }
    let written = request.is_typed() && request.kind == Kind::Out;
    if written && !writable {
        assert_ne!(status, VIRTIO_BLK_S_OK as u8, "a write was answered OK");
    }
    let len = request.data_len();
    let inside = matches!(request.sector, Sector::Near(_))
        && request.sector() * SECTOR_SIZE + len <= disk::SECTORS * SECTOR_SIZE;
    if writable && request.is_plain_write() && inside {
        assert_eq!(
            status, VIRTIO_BLK_S_OK as u8,
            "a plain write failed: {request:?}"
        );
    }
    if writable && request.is_plain_write() && status == VIRTIO_BLK_S_OK as u8 {
        let end = request
            .sector()
            .checked_mul(SECTOR_SIZE)
            .and_then(|s| s.checked_add(len));
        assert!(
            end.is_some_and(|e| e <= disk::SECTORS * SECTOR_SIZE),
            "a write past the disk was answered OK: {request:?}"
        );
        let mut sent = vec![0u8; len as usize];
        mem.read_slice(&mut sent, GuestAddress(DATA_AT)).unwrap();
        let mut on_disk = vec![0u8; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(
            disk_file,
            &mut on_disk,
            request.sector() * SECTOR_SIZE,
        )
        .unwrap();
        assert!(
            sent == on_disk,
            "a write answered OK left other bytes: {request:?}"
        );
    }
}
