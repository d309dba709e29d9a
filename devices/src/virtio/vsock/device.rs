//! The vsock device as its transport sees it (device ID 19): features,
//! the guest CID in config space, and handing the queues to the event-loop
//! handler at activation.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{Queue, QueueState, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::defs::{QUEUE_COUNT, QUEUE_SIZES};
use super::transport_reset::TransportReset;
use crate::state::{RestoreError, SaveError};
use crate::virtio::device::{
    lock_shared, read_config_bytes, Activation, Error, Running, VirtioDevice,
};
use crate::virtio::state::VirtioDeviceSnapshot;

/// The running device's queues (see [`Running`]).
pub(super) type Active = Running<Vec<Queue>>;

#[derive(Default)]
pub(super) struct Shared {
    pub active: Option<Active>,
    /// Counts resets, so the handler knows the guest forgot its connections
    /// even if a new activation came before the handler ran.
    pub resets: u64,
    /// What a restored device owes its driver before any packet for the
    /// guest (`transport_reset.rs`).
    pub transport_reset: TransportReset,
}

pub(super) fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    lock_shared(shared)
}

pub struct Vsock {
    cid: u64,
    shared: Arc<Mutex<Shared>>,
    /// Wakes the handler after activate and reset.
    wake: EventFd,
}

impl Vsock {
    pub(super) fn new(cid: u64, shared: Arc<Mutex<Shared>>, wake: EventFd) -> Self {
        Self { cid, shared, wake }
    }

    pub fn cid(&self) -> u64 {
        self.cid
    }

    fn wake_handler(&self) -> Result<(), Error> {
        self.wake.write(1).map_err(|e| Error::Wake(e.to_string()))
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
    }

    /// `struct virtio_vsock_config { le64 guest_cid; }`
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let config = self.cid.to_le_bytes();
        read_config_bytes(&config, offset, data);
    }

    /// The config space is read-only.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, activation: Activation) -> Result<(), Error> {
        let Activation {
            mem,
            queues,
            interrupt,
            acked_features: _,
        } = activation;
        if queues.len() != QUEUE_COUNT {
            return Err(Error::QueueCount {
                expected: QUEUE_COUNT,
                got: queues.len(),
            });
        }
        if let Some(bad) = queues.iter().position(|q| !q.is_valid(&mem)) {
            return Err(Error::BadQueue(bad));
        }
        lock(&self.shared).active = Some(Active {
            mem,
            queues,
            interrupt,
        });
        self.wake_handler()
    }

    /// The CID is all that identifies the device. Host connections are
    /// not state: a restored device has none, and tells the guest so
    /// ([`VirtioDevice::restored`]).
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError> {
        Ok(VirtioDeviceSnapshot::Vsock { cid: self.cid })
    }

    fn active_queues(&self) -> Option<Vec<QueueState>> {
        lock(&self.shared)
            .active
            .as_ref()
            .map(|a| a.queues.iter().map(|q| q.state()).collect())
    }

    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError> {
        match saved {
            VirtioDeviceSnapshot::Vsock { cid } if *cid == self.cid => Ok(()),
            VirtioDeviceSnapshot::Vsock { cid } => Err(RestoreError::Mismatch {
                device: "vsock device",
                why: format!("guest CID {cid} saved, {} here", self.cid),
            }),
            other => Err(RestoreError::WrongKind {
                device: "vsock device",
                saved: other.kind(),
            }),
        }
    }

    /// The guest's connections may have outlived the snapshot in its
    /// memory; their host ends did not. The handler sends
    /// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET and holds every packet for the
    /// guest until the driver has handled it (`transport_reset.rs`).
    fn restored(&mut self) -> Result<(), Error> {
        lock(&self.shared).transport_reset = TransportReset::Owed;
        // If the wakeup cannot be written, one is already pending.
        let _ = self.wake_handler();
        Ok(())
    }

    fn reset(&mut self) {
        let mut shared = lock(&self.shared);
        shared.active = None;
        shared.resets += 1;
        // A driver that starts over has no connections to drop.
        shared.transport_reset = TransportReset::None;
        drop(shared);
        // If the wakeup cannot be written, one is already pending.
        let _ = self.wake_handler();
    }
}
