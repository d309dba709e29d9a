//! virtio-fs constants (virtio 1.2 section 5.11).

/// One high-priority queue (FORGET and interrupts) and one request queue.
pub const QUEUE_COUNT: usize = 2;
/// The guest driver sizes its queues to this (virtiofsd accepts up to
/// 1024). It bounds what a queue can have in flight, all of which a
/// machine that becomes a template bounces through its DMA pool
/// (`mvm_protocol::boot::BOUNCE_PARAM`): without indirect descriptors,
/// 256 buffers of a page each, 1 MiB; a request of 252 pages (1 MiB,
/// Linux's limit for this size) still fits.
pub const QUEUE_SIZE: u16 = 256;
/// `struct virtio_fs_config { u8 tag[36]; le32 num_request_queues; }`
pub const TAG_MAX_LEN: usize = 36;
pub const CONFIG_SIZE: usize = TAG_MAX_LEN + 4;
/// Request queues besides the hiprio queue.
pub const NUM_REQUEST_QUEUES: u32 = 1;
