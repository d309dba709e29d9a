//! Saved state of a virtio-mmio device: the transport's registers, each
//! queue's configuration and ring positions, and what identifies the
//! device behind it.

use serde::{Deserialize, Serialize};
use virtio_queue::QueueState;

/// One queue: what the driver configured and where the device is in its
/// rings. Mirrors virtio-queue's `QueueState` (which has no serde support);
/// a restore validates it through `Queue::try_from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
}

impl From<QueueState> for QueueSnapshot {
    fn from(q: QueueState) -> Self {
        Self {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
        }
    }
}

impl From<QueueSnapshot> for QueueState {
    fn from(q: QueueSnapshot) -> Self {
        Self {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
        }
    }
}

/// What identifies the device behind a transport. Connections and backend
/// sessions are host resources, not state: they are not saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioDeviceSnapshot {
    Vsock { cid: u64 },
    Fs { tag: String },
    Block { id: String, sectors: u64 },
    Balloon,
}

impl VirtioDeviceSnapshot {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Vsock { .. } => "vsock device",
            Self::Fs { .. } => "virtio-fs device",
            Self::Block { .. } => "virtio-blk device",
            Self::Balloon => "virtio-balloon device",
        }
    }
}

/// The virtio-mmio register file as the driver left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportSnapshot {
    pub device_type: u32,
    pub status: u32,
    pub acked_features: u64,
    pub queue_select: u32,
    pub device_features_select: u32,
    pub driver_features_select: u32,
    pub config_generation: u32,
    /// InterruptStatus bits raised and not yet acknowledged.
    pub interrupt_status: u32,
    pub queues: Vec<QueueSnapshot>,
    pub device: VirtioDeviceSnapshot,
}
