//! virtio-fs constants (virtio 1.2 section 5.11).

/// One high-priority queue (FORGET and interrupts) and one request queue.
pub const QUEUE_COUNT: usize = 2;
/// virtiofsd accepts up to 1024; the guest driver sizes its queues to this.
pub const QUEUE_SIZE: u16 = 1024;
/// `struct virtio_fs_config { u8 tag[36]; le32 num_request_queues; }`
pub const TAG_MAX_LEN: usize = 36;
pub const CONFIG_SIZE: usize = TAG_MAX_LEN + 4;
/// Request queues besides the hiprio queue.
pub const NUM_REQUEST_QUEUES: u32 = 1;
