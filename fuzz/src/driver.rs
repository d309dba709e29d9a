//! A hostile guest driver: a fuzz input is a program of register accesses,
//! guest memory writes, descriptors and avail-ring entries, run against a
//! real device behind the real MMIO transport, with the device's handler in
//! a real event-manager loop, as a guest kernel that owns its driver would
//! drive it. Nothing here checks what the device answers: a panic, an
//! abort, a hang or a runaway allocation is the finding (libFuzzer's
//! `-timeout` and `-rss_limit_mb`); each target adds the invariants of its
//! own device.

use std::sync::Arc;

use event_manager::{EventManager, MutEventSubscriber, SubscriberId, SubscriberOps};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use mvm_devices::bus::BusDevice;
use mvm_devices::virtio::{Interrupt, MmioTransport, VirtioDevice};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio as reg;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest memory: small, so that most addresses the fuzzer picks land in it.
pub const MEM_SIZE: u64 = 1 << 20;
/// Each queue's rings start at `queue * QUEUE_STRIDE`: the descriptor table
/// there, the avail ring 4 KiB in, the used ring 8 KiB in (room for 256
/// entries each).
const QUEUE_STRIDE: u64 = 0x1_0000;
const AVAIL_OFFSET: u64 = 0x1000;
const USED_OFFSET: u64 = 0x2000;
/// The ring size `Start` sets up (a guest may set another with `Reg`).
const RING: u16 = 64;
/// Event-loop rounds per `Run`: a device that keeps itself busy longer than
/// this without the guest doing anything is a finding only if it hangs.
const RUN_ROUNDS: usize = 256;
/// The most bytes one `Poke` or `Access` moves.
const MAX_POKE: usize = 4096;

/// One step of the hostile driver.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// The driver's whole bring-up, as Linux does it at probe: reset,
    /// ACKNOWLEDGE, DRIVER, the features the device offers (with `mask`
    /// cleared), FEATURES_OK, every queue at its place, DRIVER_OK.
    Start { mask: u64 },
    /// A 32-bit register write (offset in words).
    Reg { word: u8, value: u32 },
    /// A write of any width at any offset, config space included.
    Access { offset: u16, bytes: Vec<u8> },
    /// A read of any width at any offset.
    Read { offset: u16, len: u8 },
    /// Status 0: the device reset, mid-traffic or not.
    Reset,
    /// Bytes anywhere in guest memory (or just past it).
    Poke { addr: u32, bytes: Vec<u8> },
    /// One descriptor in a queue's table.
    Desc {
        queue: u8,
        index: u8,
        addr: u32,
        len: u32,
        flags: u16,
        next: u16,
    },
    /// `head` made available in a queue's avail ring, its index moved on
    /// by `bump` (0 moves it by one; more jumps past entries never written).
    Avail { queue: u8, head: u16, bump: u8 },
    /// A QueueNotify write for `queue` (any number, also ones that do not
    /// exist).
    Notify { queue: u8 },
    /// The VMM's event loop runs the device's handler until it is idle.
    Run,
}

/// A device behind its transport, its handler in an event loop.
pub struct Driver<D: VirtioDevice, H: MutEventSubscriber> {
    pub mem: GuestMemoryMmap,
    pub transport: MmioTransport<D>,
    pub interrupt: Arc<Interrupt>,
    events: EventManager<H>,
    handler_id: SubscriberId,
    queue_count: usize,
}

/// Fresh guest memory, all zero.
pub fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
        .expect("guest memory for the fuzz driver")
}

/// `count` non-blocking eventfds and their clones (the device's and the
/// transport's ends of the queue notifications).
pub fn queue_events(count: usize) -> (Vec<EventFd>, Vec<EventFd>) {
    let evts: Vec<EventFd> = (0..count)
        .map(|_| EventFd::new(EFD_NONBLOCK).expect("eventfd"))
        .collect();
    let clones = evts
        .iter()
        .map(|e| e.try_clone().expect("eventfd clone"))
        .collect();
    (evts, clones)
}

impl<D: VirtioDevice, H: MutEventSubscriber> Driver<D, H> {
    /// `transport_evts` are the clones of the eventfds the handler watches.
    pub fn new(mem: GuestMemoryMmap, device: D, handler: H, transport_evts: Vec<EventFd>) -> Self {
        let queue_count = transport_evts.len();
        let interrupt = Arc::new(Interrupt::new(
            EventFd::new(EFD_NONBLOCK).expect("irq eventfd"),
        ));
        let transport = MmioTransport::new(device, mem.clone(), interrupt.clone(), transport_evts)
            .expect("the transport takes the device");
        let mut events = EventManager::new().expect("event manager");
        let handler_id = events.add_subscriber(handler);
        Self {
            mem,
            transport,
            interrupt,
            events,
            handler_id,
            queue_count,
        }
    }

    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Start { mask } => self.start(mask),
            Op::Reg { word, value } => self.write_reg(u32::from(word) * 4, value),
            Op::Access { offset, ref bytes } => {
                let bytes = &bytes[..bytes.len().min(MAX_POKE)];
                self.transport.write(u64::from(offset), bytes);
            }
            Op::Read { offset, len } => {
                let mut data = vec![0u8; usize::from(len)];
                self.transport.read(u64::from(offset), &mut data);
            }
            Op::Reset => self.write_reg(reg::VIRTIO_MMIO_STATUS, 0),
            Op::Poke { addr, ref bytes } => {
                let bytes = &bytes[..bytes.len().min(MAX_POKE)];
                // Past the end fails, as a DMA there would; that is fine.
                let _ = self
                    .mem
                    .write_slice(bytes, GuestAddress(u64::from(addr) % (MEM_SIZE + 0x1000)));
            }
            Op::Desc {
                queue,
                index,
                addr,
                len,
                flags,
                next,
            } => {
                let mut raw = [0u8; 16];
                raw[0..8].copy_from_slice(&guest_addr(addr).to_le_bytes());
                raw[8..12].copy_from_slice(&buffer_len(len).to_le_bytes());
                raw[12..14].copy_from_slice(&flags.to_le_bytes());
                raw[14..16].copy_from_slice(&next.to_le_bytes());
                let at = queue_base(queue) + 16 * u64::from(index);
                let _ = self.mem.write_slice(&raw, GuestAddress(at));
            }
            Op::Avail { queue, head, bump } => self.make_available(queue, head, bump),
            Op::Notify { queue } => {
                self.write_reg(reg::VIRTIO_MMIO_QUEUE_NOTIFY, u32::from(queue));
            }
            Op::Run => self.run(),
        }
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

    /// Runs the handler until it has nothing to do (or `RUN_ROUNDS`).
    pub fn run(&mut self) {
        for _ in 0..RUN_ROUNDS {
            match self.events.run_with_timeout(0) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    pub fn handler(&mut self) -> &mut H {
        self.events
            .subscriber_mut(self.handler_id)
            .expect("the handler is subscribed")
    }

    fn start(&mut self, mask: u64) {
        self.write_reg(reg::VIRTIO_MMIO_STATUS, 0);
        let mut status = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
        let mut offered = 0u64;
        for half in 0..2u32 {
            self.write_reg(reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, half);
            offered |= u64::from(self.read_reg(reg::VIRTIO_MMIO_DEVICE_FEATURES)) << (32 * half);
        }
        let acked = offered & !mask;
        for half in 0..2u32 {
            self.write_reg(reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, half);
            self.write_reg(
                reg::VIRTIO_MMIO_DRIVER_FEATURES,
                (acked >> (32 * half)) as u32,
            );
        }
        status |= VIRTIO_CONFIG_S_FEATURES_OK;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
        for q in 0..self.queue_count {
            let base = queue_base(q as u8);
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_SEL, q as u32);
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_NUM, u32::from(RING));
            for (offset, addr) in [
                (reg::VIRTIO_MMIO_QUEUE_DESC_LOW, base),
                (reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, base + AVAIL_OFFSET),
                (reg::VIRTIO_MMIO_QUEUE_USED_LOW, base + USED_OFFSET),
            ] {
                self.write_reg(offset, addr as u32);
                self.write_reg(offset + 4, (addr >> 32) as u32);
            }
            self.write_reg(reg::VIRTIO_MMIO_QUEUE_READY, 1);
        }
        status |= VIRTIO_CONFIG_S_DRIVER_OK;
        self.write_reg(reg::VIRTIO_MMIO_STATUS, status);
    }

    /// Writes `head` at the avail ring's next slot (for the ring size
    /// `Start` set) and moves its index on.
    fn make_available(&mut self, queue: u8, head: u16, bump: u8) {
        let avail = queue_base(queue) + AVAIL_OFFSET;
        let Ok(idx) = self.mem.read_obj::<u16>(GuestAddress(avail + 2)) else {
            return;
        };
        let slot = avail + 4 + 2 * u64::from(idx % RING);
        let _ = self.mem.write_obj(head, GuestAddress(slot));
        let step = if bump == 0 { 1 } else { u16::from(bump) };
        let _ = self
            .mem
            .write_obj(idx.wrapping_add(step), GuestAddress(avail + 2));
    }
}

/// Queues past the device's count still get rings (in memory nobody
/// reads), so a program written for another device stays meaningful.
fn queue_base(queue: u8) -> u64 {
    u64::from(queue % 8) * QUEUE_STRIDE
}

/// Mostly inside guest memory; with the top bit set, far outside it.
fn guest_addr(addr: u32) -> u64 {
    if addr & 0x8000_0000 == 0 {
        u64::from(addr) % MEM_SIZE
    } else {
        u64::from(addr) << 16
    }
}

/// Mostly up to 128 KiB; with the top bit set, anything.
fn buffer_len(len: u32) -> u32 {
    if len & 0x8000_0000 == 0 {
        len % 0x2_0000
    } else {
        len
    }
}
