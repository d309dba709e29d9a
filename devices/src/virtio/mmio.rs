//! The virtio-mmio transport, version 2 (virtio 1.2 section 4.2): the
//! register window the guest driver programs, in front of a
//! [`VirtioDevice`].
//!
//! vCPU threads reach it through the MMIO bus, each access under the bus's
//! per-device Mutex. It negotiates features, collects each queue's size and
//! ring addresses, runs the status state machine and hands the queues to the
//! device at DRIVER_OK. Queue notifications normally never get here: the VMM
//! registers one ioeventfd per queue on [`NOTIFY_REG_OFFSET`] so KVM signals
//! the device's eventfd without leaving the kernel; a notify write that does
//! reach the bus signals the same eventfd.

use std::sync::Arc;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK,
    VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio as reg;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::device::{Activation, Interrupt, VirtioDevice};
use super::state::{QueueSnapshot, TransportSnapshot};
use crate::bus::BusDevice;
use crate::state::{DeviceState, Persist, RestoreError, SaveError};

/// "virt" in little endian.
const MAGIC_VALUE: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout; version 1 is the legacy one.
const MMIO_VERSION: u32 = 2;
/// No PCI vendor stands behind this device; drivers do not look at it.
const VENDOR_ID: u32 = 0;
/// Reading the length of a shared memory region that does not exist gives
/// all ones (4.2.2); this device has none.
const NO_SHM: u32 = u32::MAX;

/// Where QueueNotify sits: the VMM's ioeventfds match writes here, with the
/// queue index as datamatch.
pub const NOTIFY_REG_OFFSET: u64 = reg::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
const CONFIG_OFFSET: u64 = reg::VIRTIO_MMIO_CONFIG as u64;

// The register offsets as match patterns.
const MAGIC: u64 = reg::VIRTIO_MMIO_MAGIC_VALUE as u64;
const VERSION: u64 = reg::VIRTIO_MMIO_VERSION as u64;
const DEVICE_ID: u64 = reg::VIRTIO_MMIO_DEVICE_ID as u64;
const VENDOR: u64 = reg::VIRTIO_MMIO_VENDOR_ID as u64;
const DEVICE_FEATURES: u64 = reg::VIRTIO_MMIO_DEVICE_FEATURES as u64;
const DEVICE_FEATURES_SEL: u64 = reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
const DRIVER_FEATURES: u64 = reg::VIRTIO_MMIO_DRIVER_FEATURES as u64;
const DRIVER_FEATURES_SEL: u64 = reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
const QUEUE_SEL: u64 = reg::VIRTIO_MMIO_QUEUE_SEL as u64;
const QUEUE_NUM_MAX: u64 = reg::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
const QUEUE_NUM: u64 = reg::VIRTIO_MMIO_QUEUE_NUM as u64;
const QUEUE_READY: u64 = reg::VIRTIO_MMIO_QUEUE_READY as u64;
const QUEUE_NOTIFY: u64 = NOTIFY_REG_OFFSET;
const INTERRUPT_STATUS: u64 = reg::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
const INTERRUPT_ACK: u64 = reg::VIRTIO_MMIO_INTERRUPT_ACK as u64;
const STATUS: u64 = reg::VIRTIO_MMIO_STATUS as u64;
const QUEUE_DESC_LOW: u64 = reg::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
const QUEUE_DESC_HIGH: u64 = reg::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
const QUEUE_DRIVER_LOW: u64 = reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
const QUEUE_DRIVER_HIGH: u64 = reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
const QUEUE_DEVICE_LOW: u64 = reg::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
const QUEUE_DEVICE_HIGH: u64 = reg::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
const SHM_LEN_LOW: u64 = reg::VIRTIO_MMIO_SHM_LEN_LOW as u64;
const SHM_LEN_HIGH: u64 = reg::VIRTIO_MMIO_SHM_LEN_HIGH as u64;
const SHM_BASE_LOW: u64 = reg::VIRTIO_MMIO_SHM_BASE_LOW as u64;
const SHM_BASE_HIGH: u64 = reg::VIRTIO_MMIO_SHM_BASE_HIGH as u64;
const CONFIG_GENERATION: u64 = reg::VIRTIO_MMIO_CONFIG_GENERATION as u64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the device has {queues} queues but {evts} notify eventfds were given")]
    NotifyCount { queues: usize, evts: usize },
    #[error("the device declares an invalid queue size: {0}")]
    QueueSize(virtio_queue::Error),
}

pub struct MmioTransport<D: VirtioDevice> {
    device: D,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    /// One per queue, signalled for a QueueNotify write that reaches the bus.
    queue_evts: Vec<EventFd>,
    /// The driver's view of the queues; the device gets copies at DRIVER_OK.
    queues: Vec<Queue>,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    acked_features: u64,
    status: u32,
    /// Never changes: the only config field mvm's devices have is fixed.
    config_generation: u32,
}

impl<D: VirtioDevice> MmioTransport<D> {
    pub fn new(
        device: D,
        mem: GuestMemoryMmap,
        interrupt: Arc<Interrupt>,
        queue_evts: Vec<EventFd>,
    ) -> Result<Self, Error> {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| Queue::new(max))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::QueueSize)?;
        if queues.len() != queue_evts.len() {
            return Err(Error::NotifyCount {
                queues: queues.len(),
                evts: queue_evts.len(),
            });
        }
        Ok(Self {
            device,
            mem,
            interrupt,
            queue_evts,
            queues,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            acked_features: 0,
            status: 0,
            config_generation: 0,
        })
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device status the driver last set (plus NEEDS_RESET if the device
    /// could not start).
    pub fn status(&self) -> u32 {
        self.status
    }

    fn driver_ok(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0
    }

    /// The device runs: DRIVER_OK was accepted and did not end in
    /// NEEDS_RESET.
    fn device_running(&self) -> bool {
        self.driver_ok() && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
    }

    /// The registers, the queues (with the running device's ring
    /// positions) and the device's identity. A device that does not track
    /// its positions (`active_queues` is None: vhost-user, whose backend
    /// holds them) saves running only while they are still where the
    /// transport's own queues say, at 0; its `save` refuses otherwise.
    pub fn save(&self) -> Result<TransportSnapshot, SaveError> {
        let device = self.device.save()?;
        let live = self
            .device_running()
            .then(|| self.device.active_queues())
            .flatten();
        let queues = match live {
            Some(live) => live.into_iter().map(QueueSnapshot::from).collect(),
            None => self.queues.iter().map(|q| q.state().into()).collect(),
        };
        Ok(TransportSnapshot {
            device_type: self.device.device_type(),
            status: self.status,
            acked_features: self.acked_features,
            queue_select: self.queue_select,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.pending(),
            queues,
            device,
        })
    }

    /// A transport in front of `device` as `saved` left it. Everything in
    /// `saved` is checked against the device (type, queue count and
    /// sizes, identity, addresses within guest memory); a device that was
    /// running is activated again with the saved ring positions (for
    /// virtio-fs: its rings go to the new backend, at 0).
    pub fn restore(
        device: D,
        mem: GuestMemoryMmap,
        interrupt: Arc<Interrupt>,
        queue_evts: Vec<EventFd>,
        saved: &TransportSnapshot,
    ) -> Result<Self, RestoreError> {
        let kind = saved.device.kind();
        let invalid = |why: String| RestoreError::Invalid { device: kind, why };
        let mut t =
            Self::new(device, mem, interrupt, queue_evts).map_err(|e| invalid(e.to_string()))?;
        if saved.device_type != t.device.device_type() {
            return Err(RestoreError::Mismatch {
                device: kind,
                why: format!(
                    "device type {} saved, {} here",
                    saved.device_type,
                    t.device.device_type()
                ),
            });
        }
        t.device.check_snapshot(&saved.device)?;
        if saved.queues.len() != t.queues.len() {
            return Err(RestoreError::Mismatch {
                device: kind,
                why: format!(
                    "{} queues saved, {} here",
                    saved.queues.len(),
                    t.queues.len()
                ),
            });
        }
        if saved.acked_features & !t.device.features() != 0 {
            return Err(RestoreError::Mismatch {
                device: kind,
                why: format!(
                    "features {:#x} were acked, the device offers {:#x}",
                    saved.acked_features,
                    t.device.features()
                ),
            });
        }
        for (index, (queue, q)) in t.queues.iter_mut().zip(&saved.queues).enumerate() {
            if q.max_size != queue.max_size() {
                return Err(invalid(format!(
                    "queue {index} had maximum size {}, the device has {}",
                    q.max_size,
                    queue.max_size()
                )));
            }
            *queue = Queue::try_from(virtio_queue::QueueState::from(*q))
                .map_err(|e| invalid(format!("queue {index}: {e}")))?;
            if queue.ready() && !queue.is_valid(&t.mem) {
                return Err(invalid(format!("queue {index} lies outside guest memory")));
            }
        }
        t.queue_select = saved.queue_select;
        t.device_features_select = saved.device_features_select;
        t.driver_features_select = saved.driver_features_select;
        t.acked_features = saved.acked_features;
        t.config_generation = saved.config_generation;
        t.status = saved.status;
        t.interrupt.restore_pending(saved.interrupt_status);
        if t.device_running() {
            let activated = t.activate().and_then(|()| t.device.restored());
            activated.map_err(|e| RestoreError::Activate {
                device: kind,
                why: e.to_string(),
            })?;
        }
        Ok(t)
    }

    /// The selected queue while its configuration may still change: before
    /// DRIVER_OK and while the driver has not marked it ready.
    fn configurable_queue(&mut self) -> Option<&mut Queue> {
        if self.driver_ok() {
            return None;
        }
        self.queues
            .get_mut(self.queue_select as usize)
            .filter(|q| !q.ready())
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_select as usize)
    }

    fn features_acceptable(&self) -> bool {
        let offered = self.device.features();
        self.acked_features & !offered == 0 && self.acked_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn reset(&mut self) {
        self.device.reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.queue_select = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.acked_features = 0;
        self.status = 0;
        self.interrupt.clear();
    }

    fn activate(&mut self) -> Result<(), super::device::Error> {
        let queues = self
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| Queue::try_from(q.state()).map_err(|_| super::device::Error::BadQueue(i)))
            .collect::<Result<Vec<_>, _>>()?;
        self.device.activate(Activation {
            mem: self.mem.clone(),
            queues,
            interrupt: self.interrupt.clone(),
            acked_features: self.acked_features,
        })
    }

    /// Status writes (2.1, 3.1.1): 0 resets; otherwise the driver only adds
    /// bits. FEATURES_OK sticks only if the acked features are acceptable;
    /// DRIVER_OK starts the device, or sets NEEDS_RESET if it cannot start.
    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status;
        if value & old != old {
            // Clearing a bit without a reset is a driver bug; ignore it.
            return;
        }
        let added = value & !old;
        let mut new = value;
        if added & VIRTIO_CONFIG_S_FEATURES_OK != 0 && !self.features_acceptable() {
            new &= !VIRTIO_CONFIG_S_FEATURES_OK;
        }
        if added & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            if new & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
                new &= !VIRTIO_CONFIG_S_DRIVER_OK;
            } else if self.activate().is_err() {
                new |= VIRTIO_CONFIG_S_NEEDS_RESET;
                // The driver learns about NEEDS_RESET from a config interrupt;
                // if the irqfd cannot be written it finds out on its next
                // status read instead.
                let _ = self.interrupt.signal_config_change();
            }
        }
        self.status = new;
    }

    fn read_reg(&self, offset: u64) -> u32 {
        match offset {
            MAGIC => MAGIC_VALUE,
            VERSION => MMIO_VERSION,
            DEVICE_ID => self.device.device_type(),
            VENDOR => VENDOR_ID,
            DEVICE_FEATURES => match self.device_features_select {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size().into()),
            QUEUE_READY => self.selected_queue().map_or(0, |q| q.ready().into()),
            INTERRUPT_STATUS => self.interrupt.status(),
            STATUS => self.status,
            SHM_LEN_LOW | SHM_LEN_HIGH | SHM_BASE_LOW | SHM_BASE_HIGH => NO_SHM,
            CONFIG_GENERATION => self.config_generation,
            // Write-only or unknown registers read as zero.
            _ => 0,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        let features_writable = self.status & VIRTIO_CONFIG_S_DRIVER != 0
            && self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0;
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_select = value,
            DRIVER_FEATURES_SEL => self.driver_features_select = value,
            DRIVER_FEATURES if features_writable => {
                let value = u64::from(value);
                match self.driver_features_select {
                    0 => self.acked_features = (self.acked_features & !0xffff_ffff) | value,
                    1 => self.acked_features = (self.acked_features & 0xffff_ffff) | value << 32,
                    // No feature bits beyond 63 exist; acking one is ignored.
                    _ => {}
                }
            }
            QUEUE_SEL => self.queue_select = value,
            QUEUE_NUM => {
                if let Some(q) = self.configurable_queue() {
                    // An invalid size (not a power of two, above the maximum)
                    // is refused by the queue and leaves the old one.
                    q.set_size(value as u16);
                }
            }
            QUEUE_READY if !self.driver_ok() => {
                if let Some(q) = self.queues.get_mut(self.queue_select as usize) {
                    q.set_ready(value == 1);
                }
            }
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH
            | QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH => {
                if let Some(q) = self.configurable_queue() {
                    let (low, high) = if offset & 4 == 0 {
                        (Some(value), None)
                    } else {
                        (None, Some(value))
                    };
                    match offset {
                        QUEUE_DESC_LOW | QUEUE_DESC_HIGH => q.set_desc_table_address(low, high),
                        QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH => q.set_avail_ring_address(low, high),
                        _ => q.set_used_ring_address(low, high),
                    }
                }
            }
            QUEUE_NOTIFY => {
                if let Some(evt) = self.queue_evts.get(value as usize) {
                    // The counter only fails on overflow; the device's handler
                    // drains it, so a failed write means a wakeup is pending.
                    let _ = evt.write(1);
                }
            }
            INTERRUPT_ACK => self.interrupt.ack(value),
            STATUS => self.write_status(value),
            // Read-only registers, features outside the negotiation window,
            // queue setup after DRIVER_OK: ignored, as the spec asks.
            _ => {}
        }
    }
}

impl<D: VirtioDevice> Persist for MmioTransport<D> {
    fn save(&self) -> Result<DeviceState, SaveError> {
        MmioTransport::save(self).map(DeviceState::Virtio)
    }
}

impl<D: VirtioDevice> BusDevice for MmioTransport<D> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        // Registers are 32 bits wide and accessed as such (4.2.2.2); any
        // other access reads as zero.
        match <&mut [u8; 4]>::try_from(&mut *data) {
            Ok(word) if offset.is_multiple_of(4) => *word = self.read_reg(offset).to_le_bytes(),
            _ => data.fill(0),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.write_config(offset - CONFIG_OFFSET, data);
            return;
        }
        if let (Ok(word), true) = (<[u8; 4]>::try_from(data), offset.is_multiple_of(4)) {
            self.write_reg(offset, u32::from_le_bytes(word));
        }
    }
}

#[cfg(test)]
mod tests;
