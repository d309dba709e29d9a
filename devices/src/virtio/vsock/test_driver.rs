//! A pretend guest for unit tests: it drives the vsock device through the
//! MMIO transport the way Linux's virtio-mmio and vsock drivers do, with
//! virtio-queue's mock split queues as its rings, and runs the handler in a
//! real event-manager loop against real Unix sockets. No KVM involved.

use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use event_manager::{EventManager, SubscriberId, SubscriberOps};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio as reg;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::defs::{EVQ, HOST_CID, QUEUE_COUNT, RXQ, TXQ, TYPE_STREAM};
use super::{Vsock, VsockHandler};
use crate::bus::BusDevice;
use crate::virtio::{Interrupt, MmioTransport};

pub const GUEST_CID: u64 = 3;
pub const HDR_LEN: usize = 44;
/// Ring size the pretend driver picks (below the device's maximum).
const RING: u16 = 64;
/// Where each queue's rings and each buffer live in guest memory.
const RING_BASE: [u64; 3] = [0x0, 0x4000, 0x8000];
const BUF_BASE: u64 = 0x10_0000;
/// Per chain: header at the start, up to 64 KiB of data 4 KiB in.
const BUF_STRIDE: u64 = 0x1_2000;
pub const MEM_SIZE: usize = 0x100_0000;

/// One descriptor: guest address (None: the chain's own buffer area),
/// length, device-writable.
pub type Desc = (Option<u64>, u32, bool);

/// A vsock header, either direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hdr {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Hdr {
    /// A guest packet from `guest_port` to `host_port`.
    pub fn from_guest(guest_port: u32, host_port: u32, op: u16) -> Self {
        Self {
            src_cid: GUEST_CID,
            dst_cid: HOST_CID,
            src_port: guest_port,
            dst_port: host_port,
            type_: TYPE_STREAM,
            op,
            buf_alloc: 64 * 1024,
            ..Self::default()
        }
    }

    /// The same header with `flags` (an OP_SHUTDOWN's).
    pub fn with_flags(self, flags: u32) -> Self {
        Self { flags, ..self }
    }

    pub fn to_bytes(self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8; HDR_LEN]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Self {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }
}

/// A packet the device delivered into an RX buffer.
#[derive(Debug)]
pub struct Packet {
    pub hdr: Hdr,
    pub data: Vec<u8>,
    /// The length the device reported in the used ring.
    pub used_len: u32,
}

/// `struct virtio_vsock_event`'s size, and its one event's id.
const EVENT_LEN: u32 = 4;
pub const EVENT_TRANSPORT_RESET: Option<u32> = Some(0);
/// Event buffers the driver keeps posted.
const EVENT_BUFFERS: usize = 4;

/// Descriptors per chain at most.
const CHAIN: u16 = 4;
/// Chains in flight per queue: each takes CHAIN descriptors and one buffer
/// area, both fixed by its slot.
const SLOTS: u16 = RING / CHAIN;

struct Ring {
    q: MockSplitQueue<'static, GuestMemoryMmap>,
    queue: usize,
    free: Vec<u16>,
    used_seen: u16,
}

impl Ring {
    fn new(mem: &'static GuestMemoryMmap, queue: usize) -> Self {
        Self {
            q: MockSplitQueue::create(mem, GuestAddress(RING_BASE[queue]), RING),
            queue,
            free: (0..SLOTS).rev().collect(),
            used_seen: 0,
        }
    }

    /// The buffer area of the chain with head `head`: header at the start,
    /// data 4 KiB in.
    fn buf(&self, head: u16) -> u64 {
        BUF_BASE + (self.queue as u64 * u64::from(SLOTS) + u64::from(head / CHAIN)) * BUF_STRIDE
    }

    /// Puts a chain of one to CHAIN (address, length, device-writable)
    /// descriptors on the available ring; `None` addresses mean "this slot's
    /// header / data area". Returns the head index.
    fn push(&mut self, descs: &[Desc]) -> u16 {
        assert!((1..=usize::from(CHAIN)).contains(&descs.len()));
        let head = self.free.pop().expect("all descriptor slots in flight") * CHAIN;
        let area = self.buf(head);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, write))| {
                let addr = addr.unwrap_or(area + 0x1000 * i as u64);
                let mut flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
                if i + 1 < descs.len() {
                    flags |= VRING_DESC_F_NEXT as u16;
                }
                RawDescriptor::from(Descriptor::new(addr, len, flags, head + i as u16 + 1))
            })
            .collect();
        self.q.add_desc_chains(&raw, head).unwrap();
        head
    }

    /// Used entries the device added since the last call; their slots are
    /// free again.
    fn take_used(&mut self) -> Vec<(u16, u32)> {
        let idx = self.q.used().idx().load();
        let mut out = Vec::new();
        while self.used_seen != idx {
            let slot = usize::from(self.used_seen % RING);
            let elem = self.q.used().ring().ref_at(slot).unwrap().load();
            let head = elem.id() as u16;
            assert!(
                !self.free.contains(&(head / CHAIN)),
                "head {head} used twice"
            );
            self.free.push(head / CHAIN);
            out.push((head, elem.len()));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

pub struct Guest {
    pub mem: &'static GuestMemoryMmap,
    pub transport: MmioTransport<Vsock>,
    pub interrupt: Arc<Interrupt>,
    rings: Vec<Ring>,
    /// TX chains given back (head, length), taken by `tx_used`.
    tx_done: Vec<(u16, u32)>,
    em: EventManager<VsockHandler>,
    id: SubscriberId,
    addr: SocketAddr,
}

fn unique_addr() -> SocketAddr {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "mvm-vsock-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
}

/// A new device and handler with their own socket and eventfds.
struct Fresh {
    addr: SocketAddr,
    device: Vsock,
    handler: VsockHandler,
    transport_evts: Vec<EventFd>,
    interrupt: Arc<Interrupt>,
}

impl Fresh {
    fn new(guest_ports: Vec<super::GuestPort>) -> Self {
        let addr = unique_addr();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        let evts: Vec<EventFd> = (0..QUEUE_COUNT)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let transport_evts = evts.iter().map(|e| e.try_clone().unwrap()).collect();
        let (device, handler) = super::new(GUEST_CID, listener, evts, guest_ports).unwrap();
        let interrupt = Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap()));
        Self {
            addr,
            device,
            handler,
            transport_evts,
            interrupt,
        }
    }
}

impl Guest {
    /// A device whose driver has not started yet.
    pub fn new_unstarted() -> Self {
        Self::unstarted_serving(Vec::new())
    }

    /// A started device that accepts guest connections to `guest_ports`.
    pub fn serving(guest_ports: Vec<super::GuestPort>) -> Self {
        let mut g = Self::unstarted_serving(guest_ports);
        g.start_driver();
        g
    }

    fn unstarted_serving(guest_ports: Vec<super::GuestPort>) -> Self {
        // Leaked so the mock queues can borrow it for the whole test.
        let mem: &'static GuestMemoryMmap = Box::leak(Box::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap(),
        ));
        let Fresh {
            addr,
            device,
            handler,
            transport_evts: clones,
            interrupt,
        } = Fresh::new(guest_ports);
        let transport = MmioTransport::new(device, mem.clone(), interrupt.clone(), clones).unwrap();
        let mut em = EventManager::new().unwrap();
        let id = em.add_subscriber(handler);
        let rings = (0..QUEUE_COUNT).map(|q| Ring::new(mem, q)).collect();
        Self {
            mem,
            transport,
            interrupt,
            rings,
            tx_done: Vec::new(),
            em,
            id,
            addr,
        }
    }

    /// A device the driver has brought up, as Linux does at probe.
    pub fn new() -> Self {
        let mut g = Self::new_unstarted();
        g.start_driver();
        g
    }

    pub fn write_reg(&mut self, offset: u32, value: u32) {
        self.transport
            .write(u64::from(offset), &value.to_le_bytes());
    }

    pub fn read_reg(&mut self, offset: u32) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(u64::from(offset), &mut data);
        u32::from_le_bytes(data)
    }

    /// Reset, features, the three queues, DRIVER_OK.
    pub fn start_driver(&mut self) {
        self.start_driver_with_event_buffers(&[EVENT_LEN; EVENT_BUFFERS]);
    }

    /// [`Self::start_driver`] with event buffers of these lengths.
    pub fn start_driver_with_event_buffers(&mut self, lengths: &[u32]) {
        self.write_reg(reg::VIRTIO_MMIO_STATUS, 0);
        let mut status = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
        self.write_reg(reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write_reg(reg::VIRTIO_MMIO_DRIVER_FEATURES, 1); // VERSION_1
        status |= VIRTIO_CONFIG_S_FEATURES_OK;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
        for (i, ring) in std::mem::take(&mut self.rings).into_iter().enumerate() {
            let split = |a: GuestAddress| (a.0 as u32, (a.0 >> 32) as u32);
            let (dl, dh) = split(ring.q.desc_table_addr());
            let (al, ah) = split(ring.q.avail_addr());
            let (ul, uh) = split(ring.q.used_addr());
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_SEL, i as u32);
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_NUM, u32::from(RING));
            for (offset, value) in [
                (reg::VIRTIO_MMIO_QUEUE_DESC_LOW, dl),
                (reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, dh),
                (reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, al),
                (reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH, ah),
                (reg::VIRTIO_MMIO_QUEUE_USED_LOW, ul),
                (reg::VIRTIO_MMIO_QUEUE_USED_HIGH, uh),
            ] {
                self.write_reg(offset, value);
            }
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_READY, 1);
            self.rings.push(ring);
        }
        // Linux fills the event queue at probe; the device writes a
        // transport reset into one of these after a restore.
        for &len in lengths {
            self.rings[EVQ].push(&[(None, len, true)]);
        }
        status |= VIRTIO_CONFIG_S_DRIVER_OK;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
        assert_eq!(self.read_reg(reg::VIRTIO_MMIO_STATUS), status);
        self.pump();
    }

    /// Saves the device, then replaces it with a new device and handler
    /// (fresh eventfds, a new listening socket) restored from that state,
    /// as a restored VM would have; the driver side (rings, memory) stays.
    /// The driver then handles the device's transport reset as Linux does
    /// (each event taken, its buffer given back, the queue notified).
    pub fn save_and_restore(&mut self) {
        self.save_and_restore_unhandled();
        assert_eq!(self.handle_events(), [EVENT_TRANSPORT_RESET]);
    }

    /// [`Self::save_and_restore`] up to the events, which stay unhandled.
    pub fn save_and_restore_unhandled(&mut self) {
        let saved = self.transport.save().unwrap();
        let Fresh {
            addr,
            device,
            handler,
            transport_evts: clones,
            interrupt,
        } = Fresh::new(Vec::new());
        self.transport =
            MmioTransport::restore(device, self.mem.clone(), interrupt.clone(), clones, &saved)
                .unwrap();
        assert_eq!(self.transport.save().unwrap(), saved);
        self.interrupt = interrupt;
        self.em.remove_subscriber(self.id).unwrap();
        self.id = self.em.add_subscriber(handler);
        self.addr = addr;
        self.pump();
    }

    /// The events the device put in the event queue since the last call
    /// (their ids, or None for one of the wrong length), as the driver
    /// takes them: each buffer is given back and the queue notified.
    pub fn handle_events(&mut self) -> Vec<Option<u32>> {
        let used = self.rings[EVQ].take_used();
        let events: Vec<Option<u32>> = used
            .iter()
            .map(|&(head, len)| {
                let mut id = [0u8; 4];
                let area = self.rings[EVQ].buf(head);
                self.mem.read_slice(&mut id, GuestAddress(area)).unwrap();
                (len == EVENT_LEN).then_some(u32::from_le_bytes(id))
            })
            .collect();
        for _ in &used {
            self.rings[EVQ].push(&[(None, EVENT_LEN, true)]);
        }
        if !used.is_empty() {
            self.notify(EVQ);
        }
        events
    }

    /// Offers one more event buffer of `len` bytes.
    pub fn give_event_buffer(&mut self, len: u32) {
        self.rings[EVQ].push(&[(None, len, true)]);
        self.notify(EVQ);
    }

    /// Marks the event buffers' memory, so that a test sees what the
    /// device wrote there.
    pub fn scribble_on_event_buffers(&self) {
        for slot in 0..SLOTS {
            let area = self.rings[EVQ].buf(slot * CHAIN);
            self.poke(area, &[0xff; EVENT_LEN as usize]);
        }
    }

    /// Runs the device's event handler until nothing more happens.
    pub fn pump(&mut self) {
        for _ in 0..1000 {
            if self.em.run_with_timeout(0).unwrap() == 0 {
                return;
            }
        }
        panic!("the vsock handler never went idle");
    }

    pub fn handler(&mut self) -> &mut VsockHandler {
        self.em.subscriber_mut(self.id).unwrap()
    }

    /// A QueueNotify write, as the guest's driver does it.
    pub fn notify(&mut self, queue: usize) {
        self.write_reg(reg::VIRTIO_MMIO_QUEUE_NOTIFY, queue as u32);
        self.pump();
    }

    /// Offers `count` RX buffers (header + `data_len` bytes of data each).
    pub fn give_rx(&mut self, count: usize, data_len: u32) {
        for _ in 0..count {
            self.rings[RXQ].push(&[(None, HDR_LEN as u32, true), (None, data_len, true)]);
        }
        self.notify(RXQ);
    }

    /// Offers a raw RX chain (None: the slot's own buffer); returns its head.
    pub fn give_rx_chain(&mut self, descs: &[Desc]) -> u16 {
        let head = self.rings[RXQ].push(descs);
        self.notify(RXQ);
        head
    }

    /// Sends a packet (header descriptor, then a data descriptor if any).
    pub fn send(&mut self, mut hdr: Hdr, data: &[u8]) {
        hdr.len = data.len() as u32;
        let descs: &[Desc] = if data.is_empty() {
            &[(None, HDR_LEN as u32, false)]
        } else {
            &[
                (None, HDR_LEN as u32, false),
                (None, data.len() as u32, false),
            ]
        };
        self.send_chain_with(descs, &hdr.to_bytes(), data);
    }

    /// Sends a raw TX chain: `hdr` goes in the slot's header area, `data` in
    /// its data area, whatever the descriptors say.
    pub fn send_chain_with(&mut self, descs: &[Desc], hdr: &[u8], data: &[u8]) {
        let head = self.rings[TXQ].push(descs);
        let area = self.rings[TXQ].buf(head);
        self.poke(area, hdr);
        self.poke(area + 0x1000, data);
        self.notify(TXQ);
        let done = self.rings[TXQ].take_used();
        self.tx_done.extend(done);
    }

    /// The buffer area of RX chain `head` (its header starts there).
    pub fn rx_area(&self, head: u16) -> u64 {
        self.rings[RXQ].buf(head)
    }

    /// Writes bytes into guest memory.
    pub fn poke(&self, addr: u64, bytes: &[u8]) {
        self.mem.write_slice(bytes, GuestAddress(addr)).unwrap();
    }

    /// TX chains the device gave back since the last call (head, length).
    pub fn tx_used(&mut self) -> Vec<(u16, u32)> {
        std::mem::take(&mut self.tx_done)
    }

    /// Raw RX used entries since the last call (head, length).
    pub fn rx_used_raw(&mut self) -> Vec<(u16, u32)> {
        self.rings[RXQ].take_used()
    }

    /// Packets the device delivered since the last call.
    pub fn recv(&mut self) -> Vec<Packet> {
        let used = self.rings[RXQ].take_used();
        used.into_iter()
            .map(|(head, used_len)| {
                let area = self.rings[RXQ].buf(head);
                let mut raw = [0u8; HDR_LEN];
                self.mem.read_slice(&mut raw, GuestAddress(area)).unwrap();
                let hdr = Hdr::parse(&raw);
                let mut data = vec![0u8; hdr.len as usize];
                self.mem
                    .read_slice(&mut data, GuestAddress(area + 0x1000))
                    .unwrap();
                Packet {
                    hdr,
                    data,
                    used_len,
                }
            })
            .collect()
    }

    /// A host client handed to the device through its [`super::Dialer`].
    pub fn dialed_client(&mut self) -> UnixStream {
        let s = self.handler().dialer().unwrap().dial().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        self.pump();
        s
    }

    /// The device's Unix socket address (abstract).
    pub fn addr(&self) -> &SocketAddr {
        &self.addr
    }

    /// A host client connected to the device's Unix socket.
    pub fn client(&mut self) -> UnixStream {
        let s = UnixStream::connect_addr(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        self.pump();
        s
    }
}

/// Reads one `\n`-terminated line, byte by byte.
pub fn read_line(c: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8];
    while line.last() != Some(&b'\n') {
        assert_eq!(c.read(&mut b).unwrap(), 1, "EOF after {line:?}");
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}
