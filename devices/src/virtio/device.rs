//! What a virtio device shows its transport, and the interrupt line they
//! share.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueState};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::state::VirtioDeviceSnapshot;
use crate::state::{RestoreError, SaveError};

/// Why a device refused to start with what the driver set up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the device needs {expected} queues, the transport has {got}")]
    QueueCount { expected: usize, got: usize },
    #[error("queue {0} is not ready or lies outside guest memory")]
    BadQueue(usize),
    #[error("cannot wake the device's event handler: {0}")]
    Wake(String),
    #[error("the device backend failed: {0}")]
    Backend(String),
}

/// The device side of the InterruptStatus register plus the irqfd behind it.
/// Shared between the transport (vCPU threads read and acknowledge) and the
/// device's event handler (which raises): atomics, so neither waits on the
/// other's lock.
pub struct Interrupt {
    status: AtomicU32,
    /// Bits InterruptStatus always shows, acknowledged or not.
    sticky: u32,
    irqfd: EventFd,
}

impl Interrupt {
    pub fn new(irqfd: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            sticky: 0,
            irqfd,
        }
    }

    /// For a device whose backend signals the irqfd itself (vhost-user):
    /// the VMM never sees those interrupts, so the driver must always find
    /// the "used buffers" bit set. Linux's virtio-mmio driver then checks
    /// every queue on each interrupt, which is what it needs; an interrupt
    /// with nothing new is ignored.
    pub fn with_vring_always_set(irqfd: EventFd) -> Self {
        Self {
            sticky: VIRTIO_MMIO_INT_VRING,
            ..Self::new(irqfd)
        }
    }

    /// The device put buffers in a used ring.
    pub fn signal_used_queue(&self) -> io::Result<()> {
        self.raise(VIRTIO_MMIO_INT_VRING)
    }

    /// The device's configuration or status changed (e.g. DEVICE_NEEDS_RESET).
    pub fn signal_config_change(&self) -> io::Result<()> {
        self.raise(VIRTIO_MMIO_INT_CONFIG)
    }

    fn raise(&self, bit: u32) -> io::Result<()> {
        self.status.fetch_or(bit, Ordering::SeqCst);
        self.irqfd.write(1)
    }

    /// InterruptStatus as the driver reads it.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst) | self.sticky
    }

    /// InterruptACK: clears exactly the bits the driver saw, so a bit raised
    /// between its read and its ack stays pending.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    pub(crate) fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }

    /// The raised, unacknowledged bits (without the sticky ones), to save.
    pub(crate) fn pending(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Puts back saved pending bits without raising the interrupt again:
    /// the guest's interrupt controller state carries whether it was taken.
    pub(crate) fn restore_pending(&self, bits: u32) {
        self.status.store(bits, Ordering::SeqCst);
    }

    /// The irqfd: for tests that check an interrupt was (or was not) sent,
    /// and for backends that raise it themselves.
    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }
}

/// A driver read of `data.len()` bytes at `offset` of a device's config
/// space `config`; bytes past its end read as 0.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = start
            .checked_add(i)
            .and_then(|at| config.get(at))
            .copied()
            .unwrap_or(0);
    }
}

/// A started device's queues as the driver set them up, the memory they
/// live in and the interrupt to raise. The device half (vCPU threads:
/// activate, reset, save) and its event-loop handler share it behind a
/// mutex; holding the lock across a whole queue pass is what makes a
/// reset wait until the handler no longer touches the old rings.
pub struct Running<Q> {
    pub mem: GuestMemoryMmap,
    pub queues: Q,
    pub interrupt: Arc<Interrupt>,
}

/// The lock of what a device shares with its handler. A panic on the
/// other thread leaves the queues as consistent as they were; carrying on
/// beats taking the VMM down.
pub fn lock_shared<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a device gets when the driver sets DRIVER_OK.
pub struct Activation {
    pub mem: GuestMemoryMmap,
    /// One per queue the device declared, in order, as the driver set them up.
    pub queues: Vec<Queue>,
    pub interrupt: Arc<Interrupt>,
    pub acked_features: u64,
}

/// A device behind a virtio transport. The transport owns feature
/// negotiation, queue setup and the status state machine; the device says
/// what it offers and takes over the queues once the driver is done.
pub trait VirtioDevice: Send {
    /// The virtio device ID (5.x of the spec).
    fn device_type(&self) -> u32;
    /// The maximum size of each queue; the count is the device's queue count.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits offered, VIRTIO_F_VERSION_1 included.
    fn features(&self) -> u64;
    /// A driver read of the device configuration space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// A driver write of the device configuration space at `offset`.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: start serving the queues.
    fn activate(&mut self, activation: Activation) -> Result<(), Error>;
    /// The driver wrote 0 to Status: drop the queues and every piece of
    /// state the driver knew about. After this returns the device no longer
    /// touches guest memory through the old queues.
    fn reset(&mut self);
    /// What identifies this device in a snapshot; an error when its state
    /// cannot be captured (it lives in a backend process).
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError>;
    /// The queues as the running device has advanced them (after
    /// DRIVER_OK the device, not the transport, owns the ring positions);
    /// None while it is not running, and always for a device whose
    /// positions live in a backend process (virtio-fs): the transport then
    /// saves its own queues, and such a device's `save` must refuse once
    /// the rings have moved.
    fn active_queues(&self) -> Option<Vec<QueueState>>;
    /// Refuses a snapshot taken of another device (kind, CID, tag).
    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError>;
    /// The machine was restored from a snapshot and this device, running
    /// in it, activated again with its saved queues: it tells the driver
    /// what the restore changed behind its back (vsock: the host ends of
    /// its connections are gone). Most devices have nothing to say.
    fn restored(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn vring_always_set_survives_acks_config_does_not() {
        let irq = Interrupt::with_vring_always_set(EventFd::new(EFD_NONBLOCK).unwrap());
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING);
        irq.ack(VIRTIO_MMIO_INT_VRING);
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING);
        irq.signal_config_change().unwrap();
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG);
        irq.ack(VIRTIO_MMIO_INT_CONFIG | VIRTIO_MMIO_INT_VRING);
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING);
        let plain = Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap());
        assert_eq!(plain.status(), 0);
    }
}
