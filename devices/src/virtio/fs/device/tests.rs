//! The virtio-fs device behind a real MMIO transport, its backend played by
//! a thread on the other end of a socketpair that speaks just enough
//! vhost-user: it answers the requests that need an answer and reports
//! every request it got, so a test sees exactly what was handed over.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use vhost::vhost_user::message::FrontendReq;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio as reg;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestRegionMmap};
use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;
use crate::bus::BusDevice;
use crate::virtio::state::TransportSnapshot;
use crate::virtio::{Interrupt, MmioTransport};

const TAG: &str = "work";
const MEM_SIZE: usize = 0x10000;
/// VERSION_1, PROTOCOL_FEATURES, EVENT_IDX, and ACCESS_PLATFORM, which a
/// backend may offer and must still not be given (the guest's business).
const BACKEND_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << 30)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_F_ACCESS_PLATFORM);
const QUEUE_NUM: u16 = 16;
/// Each queue's descriptor table; its avail ring is at +0x400, its used
/// ring at +0x800.
const RING_BASES: [u64; QUEUE_COUNT] = [0x1000, 0x3000];
const ACK_DRIVER: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
const RUNNING: u32 = ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK;

fn avail_ring(queue: usize) -> GuestAddress {
    GuestAddress(RING_BASES[queue] + 0x400)
}

/// One request as the backend read it.
struct Msg {
    req: FrontendReq,
    body: Vec<u8>,
}

impl Msg {
    fn u32_at(&self, at: usize) -> Option<u32> {
        let raw = self.body.get(at..at + 4)?;
        Some(u32::from_le_bytes(raw.try_into().ok()?))
    }

    fn u64_at(&self, at: usize) -> Option<u64> {
        let raw = self.body.get(at..at + 8)?;
        Some(u64::from_le_bytes(raw.try_into().ok()?))
    }

    /// The ring index most ring requests start with.
    fn ring(&self) -> Option<u32> {
        self.u32_at(0)
    }
}

struct FakeBackend {
    requests: mpsc::Receiver<Msg>,
}

impl FakeBackend {
    /// The requests the backend got, up to and including the first `req`
    /// for ring `ring`.
    fn until(&self, req: FrontendReq, ring: u32) -> Vec<Msg> {
        let mut got = Vec::new();
        loop {
            let msg = self
                .requests
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("no {req:?} for ring {ring} reached the backend"));
            let done = msg.req == req && msg.ring() == Some(ring);
            got.push(msg);
            if done {
                return got;
            }
        }
    }

    fn nothing_more(&self) {
        let late = self.requests.recv_timeout(Duration::from_millis(100));
        assert!(
            late.is_err(),
            "unexpected request {:?}",
            late.map(|m| m.req)
        );
    }
}

/// The frontend's end of a socketpair whose other end is a fake backend.
fn fake_backend() -> (UnixStream, FakeBackend) {
    let (frontend, mut sock) = UnixStream::pair().unwrap();
    let (tx, requests) = mpsc::channel();
    std::thread::spawn(move || loop {
        // Header: request, flags, body size (le32 each). File descriptors
        // sent alongside are dropped unread.
        let mut hdr = [0u8; 12];
        if sock.read_exact(&mut hdr).is_err() {
            return;
        }
        let word = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap());
        let (code, size) = (word(0), word(8));
        let mut body = vec![0u8; size as usize];
        if sock.read_exact(&mut body).is_err() {
            return;
        }
        let req = FrontendReq::try_from(code).expect("a known request");
        let reply: Option<Vec<u8>> = match req {
            FrontendReq::GET_FEATURES => Some(BACKEND_FEATURES.to_le_bytes().to_vec()),
            FrontendReq::GET_PROTOCOL_FEATURES => Some(0u64.to_le_bytes().to_vec()),
            // The ring's index, position 0.
            FrontendReq::GET_VRING_BASE => Some([&body[..4], &[0; 4]].concat()),
            _ => None,
        };
        if let Some(reply) = reply {
            // Version 1, REPLY.
            let flags = 0x1u32 | 0x4;
            let mut out = Vec::new();
            out.extend_from_slice(&code.to_le_bytes());
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&(reply.len() as u32).to_le_bytes());
            out.extend_from_slice(&reply);
            if sock.write_all(&out).is_err() {
                return;
            }
        }
        if tx.send(Msg { req, body }).is_err() {
            return;
        }
    });
    (frontend, FakeBackend { requests })
}

/// A temporary file of `len` bytes, already unlinked.
fn memory_file(len: usize) -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "mvm-fs-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(len as u64).unwrap();
    f
}

/// Guest memory a backend can map: a shared mapping of a file.
fn shared_mem() -> GuestMemoryMmap {
    let file = FileOffset::new(memory_file(MEM_SIZE), 0);
    GuestMemoryMmap::from_ranges_with_files([(GuestAddress(0), MEM_SIZE, Some(file))]).unwrap()
}

/// Guest memory as a restore maps a snapshot: the file privately.
fn private_mem() -> GuestMemoryMmap {
    let mapping = MmapRegionBuilder::new(MEM_SIZE)
        .with_file_offset(FileOffset::new(memory_file(MEM_SIZE), 0))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
        .build()
        .unwrap();
    let region = GuestRegionMmap::new(mapping, GuestAddress(0)).unwrap();
    GuestMemoryMmap::from_regions(vec![region]).unwrap()
}

struct Fs {
    t: MmioTransport<VhostUserFs>,
    backend: FakeBackend,
}

fn eventfds() -> Vec<EventFd> {
    (0..QUEUE_COUNT)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect()
}

/// A device connected to a fresh fake backend, the connection's requests
/// already drained.
fn connect() -> (VhostUserFs, FakeBackend, Arc<Interrupt>) {
    let (stream, backend) = fake_backend();
    let interrupt = Arc::new(Interrupt::with_vring_always_set(
        EventFd::new(EFD_NONBLOCK).unwrap(),
    ));
    let (device, _handler) =
        crate::virtio::fs::new(TAG, stream, eventfds(), &interrupt, Box::new(|_| {})).unwrap();
    let connected = backend.until(FrontendReq::SET_PROTOCOL_FEATURES, 0);
    assert_eq!(connected[0].req, FrontendReq::SET_OWNER);
    (device, backend, interrupt)
}

/// A connected device behind the MMIO transport `make` builds around it.
fn fs_with<E>(
    mem: &GuestMemoryMmap,
    make: impl FnOnce(
        VhostUserFs,
        GuestMemoryMmap,
        Arc<Interrupt>,
        Vec<EventFd>,
    ) -> Result<MmioTransport<VhostUserFs>, E>,
) -> Result<Fs, E> {
    let (device, backend, interrupt) = connect();
    let t = make(device, mem.clone(), interrupt, eventfds())?;
    Ok(Fs { t, backend })
}

fn w(t: &mut MmioTransport<VhostUserFs>, offset: u32, value: u32) {
    t.write(u64::from(offset), &value.to_le_bytes());
}

/// What Linux's virtio_fs probe does: negotiates VERSION_1, sets up both
/// queues and sets DRIVER_OK, making no buffer available.
fn start_driver(t: &mut MmioTransport<VhostUserFs>) {
    w(t, reg::VIRTIO_MMIO_STATUS, ACK_DRIVER);
    w(t, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    w(t, reg::VIRTIO_MMIO_DRIVER_FEATURES, 1);
    start_driver_after_features(t);
}

/// A device whose driver started it over shared memory, the rings handed
/// to the backend.
fn running(mem: &GuestMemoryMmap) -> Fs {
    let mut fs = fs_with(mem, MmioTransport::new).unwrap();
    start_driver(&mut fs.t);
    assert_eq!(fs.t.status(), RUNNING);
    let got = assert_rings_handed_over(&fs.backend, mem);
    // All of guest memory, the file from its start.
    assert_eq!(memory_table(&got, mem), [(0, MEM_SIZE as u64, 0)]);
    fs
}

/// The backend got the memory table and, for every queue, its size, its
/// rings (at their host addresses in `mem`), position 0, both eventfds and
/// the enable, in that order.
fn assert_rings_handed_over(backend: &FakeBackend, mem: &GuestMemoryMmap) -> Vec<Msg> {
    let got = backend.until(FrontendReq::SET_VRING_ENABLE, QUEUE_COUNT as u32 - 1);
    let features = got
        .iter()
        .find(|m| m.req == FrontendReq::SET_FEATURES)
        .expect("SET_FEATURES");
    assert_eq!(
        features.u64_at(0),
        Some((1 << VIRTIO_F_VERSION_1) | (1 << 30)),
        "the acked features and PROTOCOL_FEATURES"
    );
    let table = got
        .iter()
        .position(|m| m.req == FrontendReq::SET_MEM_TABLE)
        .expect("SET_MEM_TABLE");
    let hva = |gpa: u64| mem.get_host_address(GuestAddress(gpa)).unwrap() as u64;
    for (queue, base) in RING_BASES.iter().enumerate() {
        let ring = |req: FrontendReq| {
            got.iter()
                .position(|m| m.req == req && m.ring() == Some(queue as u32))
                .unwrap_or_else(|| panic!("no {req:?} for queue {queue}"))
        };
        let order = [
            FrontendReq::SET_VRING_NUM,
            FrontendReq::SET_VRING_ADDR,
            FrontendReq::SET_VRING_BASE,
            FrontendReq::SET_VRING_CALL,
            FrontendReq::SET_VRING_KICK,
            FrontendReq::SET_VRING_ENABLE,
        ]
        .map(ring);
        assert!(order[0] > table, "queue {queue} before the memory table");
        assert!(order.is_sorted(), "queue {queue}: {order:?}");
        assert_eq!(got[order[0]].u32_at(4), Some(QUEUE_NUM.into()));
        let addr = &got[order[1]];
        assert_eq!(
            addr.u64_at(8),
            Some(hva(*base)),
            "queue {queue} descriptors"
        );
        assert_eq!(
            addr.u64_at(16),
            Some(hva(base + 0x800)),
            "queue {queue} used"
        );
        assert_eq!(
            addr.u64_at(24),
            Some(hva(base + 0x400)),
            "queue {queue} avail"
        );
        assert_eq!(got[order[2]].u32_at(4), Some(0), "queue {queue} position");
        assert_eq!(got[order[5]].u32_at(4), Some(1), "queue {queue} enabled");
    }
    got
}

/// The regions of a SET_MEM_TABLE (`u32 count, u32 padding`, then per
/// region guest address, size, user address, mmap offset): the first of
/// `got`.
fn memory_table(got: &[Msg], mem: &GuestMemoryMmap) -> Vec<(u64, u64, u64)> {
    let table = got
        .iter()
        .find(|m| m.req == FrontendReq::SET_MEM_TABLE)
        .expect("SET_MEM_TABLE");
    let count = table.u32_at(0).unwrap() as usize;
    (0..count)
        .map(|i| {
            let at = 8 + 32 * i;
            let field = |n: usize| table.u64_at(at + 8 * n).unwrap();
            let gpa = field(0);
            let hva = mem.get_host_address(GuestAddress(gpa)).unwrap() as u64;
            assert_eq!(field(2), hva, "region {i}: not where this process maps it");
            (gpa, field(1), field(3))
        })
        .collect()
}

#[test]
fn passes_through_only_ring_features() {
    assert_eq!(
        PASSED_THROUGH & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
        0
    );
    assert_ne!(PASSED_THROUGH & (1 << VIRTIO_F_VERSION_1), 0);
}

#[test]
fn a_started_device_no_request_crossed_saves_and_restores_onto_a_new_backend() {
    let mem = shared_mem();
    let fs = running(&mem);
    // The driver's avail flags (VRING_AVAIL_F_NO_INTERRUPT) are not the
    // index: a driver may set them without making a buffer available.
    mem.write_slice(&[1, 0], avail_ring(1)).unwrap();
    let saved = fs.t.save().expect("no request crossed the device");
    assert_eq!(saved.device, VirtioDeviceSnapshot::Fs { tag: TAG.into() });
    assert_eq!(saved.status, RUNNING);
    for (q, base) in saved.queues.iter().zip(RING_BASES) {
        assert_eq!(
            (q.ready, q.size, q.avail_ring),
            (true, QUEUE_NUM, base + 0x400)
        );
        assert_eq!((q.next_avail, q.next_used), (0, 0));
    }
    let json = serde_json::to_string(&saved).unwrap();
    let saved: TransportSnapshot = serde_json::from_str(&json).unwrap();

    // A new VMM process: a new virtiofsd, the same guest memory.
    let back = fs_with(&mem, |dev, mem, interrupt, evts| {
        MmioTransport::restore(dev, mem, interrupt, evts, &saved)
    })
    .unwrap();
    assert_eq!(back.t.status(), RUNNING, "running again, no NEEDS_RESET");
    assert_rings_handed_over(&back.backend, &mem);
    assert_eq!(back.t.save().unwrap(), saved, "save(restore(x)) == x");
    // The first backend heard nothing of it.
    fs.backend.nothing_more();
}

#[test]
fn a_started_device_a_request_crossed_is_refused() {
    for queue in 0..QUEUE_COUNT {
        let mem = shared_mem();
        let mut fs = running(&mem);
        assert!(fs.t.save().is_ok(), "the positive control");
        // The driver made one buffer available on `queue`.
        let idx = GuestAddress(avail_ring(queue).0 + 2);
        mem.write_slice(&1u16.to_le_bytes(), idx).unwrap();
        match fs.t.save() {
            Err(SaveError::Unsupported { device, why }) => {
                assert_eq!(device, "virtio-fs device");
                assert!(why.contains("a request has crossed it"), "{why}");
                assert!(why.contains(&format!("queue {queue}")), "{why}");
                assert!(why.contains("its ring state lives in virtiofsd"), "{why}");
            }
            other => panic!("queue {queue}: saved anyway: {other:?}"),
        }
        // A reset takes the rings back from the backend; the device then
        // saves again, not running.
        w(&mut fs.t, reg::VIRTIO_MMIO_STATUS, 0);
        let stopped = fs
            .backend
            .until(FrontendReq::GET_VRING_BASE, QUEUE_COUNT as u32 - 1);
        assert_eq!(stopped.len(), 2 * QUEUE_COUNT, "disable and stop each ring");
        let saved = fs.t.save().expect("a reset device saves");
        assert_eq!(saved.status, 0);
    }
}

#[test]
fn a_started_device_whose_backend_completed_a_request_is_refused() {
    // The avail index is a free-running u16: after 65536 buffers it is 0
    // again. The backend's first completion (used ring element 0) stays.
    for (queue, base) in RING_BASES.into_iter().enumerate() {
        let mem = shared_mem();
        let fs = running(&mem);
        let first_used = GuestAddress(base + 0x800 + 4);
        // id 0, len 16 (a FUSE reply's out header).
        mem.write_slice(&[0, 0, 0, 0, 16, 0, 0, 0], first_used)
            .unwrap();
        match fs.t.save() {
            Err(SaveError::Unsupported { why, .. }) => {
                assert!(why.contains("a request has crossed it"), "{why}");
                assert!(
                    why.contains(&format!("queue {queue}'s used ring has an entry")),
                    "{why}"
                );
            }
            other => panic!("queue {queue}: saved anyway: {other:?}"),
        }
    }
}

#[test]
fn a_private_mapping_is_never_handed_to_the_backend() {
    let mem = private_mem();
    let mut fs = fs_with(&mem, MmioTransport::new).unwrap();
    start_driver(&mut fs.t);
    assert_eq!(fs.t.status(), RUNNING | VIRTIO_CONFIG_S_NEEDS_RESET);
    // The device refused before anything reached the backend.
    fs.backend.nothing_more();

    // The reason, as the device gives it.
    let (mut device, backend, interrupt) = connect();
    let queues = RING_BASES
        .iter()
        .map(|&base| {
            let base = base as u32;
            let mut q = Queue::new(QUEUE_SIZE).unwrap();
            q.set_size(QUEUE_NUM);
            q.set_desc_table_address(Some(base), Some(0));
            q.set_avail_ring_address(Some(base + 0x400), Some(0));
            q.set_used_ring_address(Some(base + 0x800), Some(0));
            q.set_ready(true);
            q
        })
        .collect();
    let refused = device.activate(Activation {
        mem: mem.clone(),
        queues,
        interrupt,
        acked_features: 1 << VIRTIO_F_VERSION_1,
    });
    match refused {
        Err(Error::Backend(why)) => assert!(why.contains("private mapping"), "{why}"),
        other => panic!("a private mapping passed: {other:?}"),
    }
    backend.nothing_more();
    assert!(device.save().is_ok(), "not running");
}

#[test]
fn access_platform_is_offered_to_the_guest_and_kept_from_the_backend() {
    let (device, _backend, _interrupt) = connect();
    let offered = device.features();
    assert_ne!(offered & ACCESS_PLATFORM, 0, "the guest must bounce");
    assert_eq!(offered & (1 << 28), 0, "no indirect descriptors");

    // A driver that acks it (VERSION_1 and ACCESS_PLATFORM: bits 32, 33).
    let mem = shared_mem();
    let mut fs = fs_with(&mem, MmioTransport::new).unwrap();
    w(&mut fs.t, reg::VIRTIO_MMIO_STATUS, ACK_DRIVER);
    w(&mut fs.t, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    w(&mut fs.t, reg::VIRTIO_MMIO_DRIVER_FEATURES, 0b11);
    start_driver_after_features(&mut fs.t);
    assert_eq!(fs.t.status(), RUNNING);
    // assert_rings_handed_over checks SET_FEATURES: VERSION_1 and
    // PROTOCOL_FEATURES, nothing else.
    assert_rings_handed_over(&fs.backend, &mem);
}

/// [`start_driver`] from FEATURES_OK on, the features already written.
fn start_driver_after_features(t: &mut MmioTransport<VhostUserFs>) {
    w(
        t,
        reg::VIRTIO_MMIO_STATUS,
        ACK_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK,
    );
    for (sel, base) in RING_BASES.iter().enumerate() {
        let base = *base as u32;
        w(t, reg::VIRTIO_MMIO_QUEUE_SEL, sel as u32);
        w(t, reg::VIRTIO_MMIO_QUEUE_NUM, QUEUE_NUM.into());
        w(t, reg::VIRTIO_MMIO_QUEUE_DESC_LOW, base);
        w(t, reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, base + 0x400);
        w(t, reg::VIRTIO_MMIO_QUEUE_USED_LOW, base + 0x800);
        w(t, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    }
    w(t, reg::VIRTIO_MMIO_STATUS, RUNNING);
}

/// Shared windows of `file` at these guest-physical ranges, each at the
/// file offset of its guest address.
fn windows(file: std::fs::File, ranges: &[Range<u64>]) -> BackendMemory {
    BackendMemory {
        file: Arc::new(file),
        windows: ranges
            .iter()
            .map(|r| SharedWindow {
                guest: r.clone(),
                file_offset: r.start,
            })
            .collect(),
    }
}

#[test]
fn private_memory_with_shared_windows_hands_the_backend_only_the_windows() {
    let mem = private_mem();
    let mut fs = fs_with(&mem, |mut device, mem, interrupt, evts| {
        device.share_only(windows(
            memory_file(MEM_SIZE),
            std::slice::from_ref(&(0x1000..0x4000)),
        ));
        MmioTransport::new(device, mem, interrupt, evts)
    })
    .unwrap();
    start_driver(&mut fs.t);
    assert_eq!(fs.t.status(), RUNNING);
    let got = assert_rings_handed_over(&fs.backend, &mem);
    // The window alone (gpa, size, file offset), not the memory around.
    assert_eq!(memory_table(&got, &mem), [(0x1000, 0x3000, 0x1000)]);
}

#[test]
fn the_memory_table_of_shared_windows_is_the_windows() {
    let mem = private_mem();
    let shared = windows(memory_file(MEM_SIZE), &[0x1000..0x2000, 0x3000..0x5000]);
    let table = shared.table(&mem).unwrap();
    let hva = |gpa: u64| mem.get_host_address(GuestAddress(gpa)).unwrap() as u64;
    let got: Vec<(u64, u64, u64, u64)> = table
        .iter()
        .map(|r| {
            assert_eq!(r.mmap_handle, shared.file.as_raw_fd());
            (
                r.guest_phys_addr,
                r.memory_size,
                r.userspace_addr,
                r.mmap_offset,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0x1000, 0x1000, hva(0x1000), 0x1000),
            (0x3000, 0x2000, hva(0x3000), 0x3000)
        ]
    );
    let beyond = windows(
        memory_file(MEM_SIZE),
        std::slice::from_ref(&(0xf000..0x11000)),
    );
    assert!(beyond.table(&mem).is_err(), "a window past guest memory");
}

#[test]
fn rings_outside_the_shared_windows_are_refused_before_the_backend_hears() {
    let mem = private_mem();
    // Queue 1's rings (at 0x3000) lie outside.
    let mut fs = fs_with(&mem, |mut device, mem, interrupt, evts| {
        device.share_only(windows(
            memory_file(MEM_SIZE),
            std::slice::from_ref(&(0x1000..0x2000)),
        ));
        MmioTransport::new(device, mem, interrupt, evts)
    })
    .unwrap();
    start_driver(&mut fs.t);
    assert_eq!(fs.t.status(), RUNNING | VIRTIO_CONFIG_S_NEEDS_RESET);
    fs.backend.nothing_more();
}
