//! The virtio-balloon device as its transport sees it (device ID 5):
//! free page reporting offered, `num_pages` 0 forever, `actual` kept as
//! the driver writes it, and the queues handed to the event-loop handler
//! at activation.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{Queue, QueueState, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{
    CONFIG_LEN, QUEUE_COUNT, QUEUE_SIZE, REPORTING_QUEUE, VIRTIO_BALLOON_F_FREE_PAGE_REPORTING,
};
use crate::state::{RestoreError, SaveError};
use crate::virtio::device::{
    lock_shared, read_config_bytes, Activation, Error, Running, VirtioDevice,
};
use crate::virtio::state::VirtioDeviceSnapshot;

/// The queues while the device runs (none before activation or after a
/// reset).
pub(super) type Shared = Option<Running<[Queue; QUEUE_COUNT]>>;

pub(super) fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    lock_shared(shared)
}

pub struct Balloon {
    /// The balloon's size in pages as the driver last reported it
    /// (`actual`); it stays 0 unless a driver inflates unasked.
    actual: u32,
    shared: Arc<Mutex<Shared>>,
    /// Wakes the handler after activate (reports may already be queued).
    wake: EventFd,
}

impl Balloon {
    pub(super) fn new(shared: Arc<Mutex<Shared>>, wake: EventFd) -> Self {
        Self {
            actual: 0,
            shared,
            wake,
        }
    }

    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut config = [0u8; CONFIG_LEN];
        // num_pages (bytes 0..4) stays 0: never asked to inflate.
        config[4..8].copy_from_slice(&self.actual.to_le_bytes());
        config
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; QUEUE_COUNT]
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config(), offset, data);
    }

    /// Only `actual` (bytes 4..8) is the driver's to write; a write that
    /// is not exactly it is ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if offset == 4 {
            if let Ok(bytes) = <[u8; 4]>::try_from(data) {
                self.actual = u32::from_le_bytes(bytes);
            }
        }
    }

    fn activate(&mut self, activation: Activation) -> Result<(), Error> {
        let Activation {
            mem,
            queues,
            interrupt,
            acked_features,
        } = activation;
        let got = queues.len();
        let queues: [Queue; QUEUE_COUNT] = queues.try_into().map_err(|_| Error::QueueCount {
            expected: QUEUE_COUNT,
            got,
        })?;
        // A driver that declined reporting (Linux does with page
        // poisoning or init_on_free) sets up only inflate and deflate;
        // the reporting queue then stays unready and is never served.
        let reporting = acked_features & (1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING) != 0;
        let needed = if reporting {
            QUEUE_COUNT
        } else {
            REPORTING_QUEUE
        };
        if let Some(bad) = queues.iter().take(needed).position(|q| !q.is_valid(&mem)) {
            return Err(Error::BadQueue(bad));
        }
        *lock(&self.shared) = Some(Running {
            mem,
            queues,
            interrupt,
        });
        self.wake.write(1).map_err(|e| Error::Wake(e.to_string()))
    }

    /// Nothing but the kind: chains are never in flight between events,
    /// so the ring positions (saved by the transport) are the device's
    /// state. `actual` is the driver's report to the host, which it never
    /// reads back; a restored device shows 0 until the driver writes it.
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError> {
        Ok(VirtioDeviceSnapshot::Balloon)
    }

    fn active_queues(&self) -> Option<Vec<QueueState>> {
        lock(&self.shared)
            .as_ref()
            .map(|a| a.queues.iter().map(|q| q.state()).collect())
    }

    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError> {
        match saved {
            VirtioDeviceSnapshot::Balloon => Ok(()),
            other => Err(RestoreError::WrongKind {
                device: "virtio-balloon device",
                saved: other.kind(),
            }),
        }
    }

    fn reset(&mut self) {
        *lock(&self.shared) = None;
    }
}
