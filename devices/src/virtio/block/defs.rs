//! virtio-blk constants: the spec's (through virtio-bindings) and mvm's
//! own bounds.

pub use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};

/// One request queue.
pub const QUEUE_COUNT: usize = 1;
pub const QUEUE_SIZE: u16 = 256;
/// Data descriptors per request the driver may use (the header and the
/// status byte take two more, and the chain must fit in the ring). Without
/// SEG_MAX Linux would send one segment per request.
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Block requests address 512-byte sectors, whatever the filesystem's
/// block size.
pub const SECTOR_SIZE: u64 = 512;
/// `struct virtio_blk_outhdr`: type, ioprio, sector.
pub const HEADER_LEN: usize = 16;
/// The GET_ID answer's length (VIRTIO_BLK_ID_BYTES).
pub const ID_BYTES: usize = 20;
/// The most data one request may move. Linux sends at most
/// `max_sectors_kb` (1280 KiB by default) per request; anything above this
/// is a driver the device does not trust, answered with IOERR before any
/// byte is read.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// Reads go through a buffer of this size, so a request costs no more
/// host memory than this whatever its length.
pub const READ_CHUNK: usize = 128 << 10;
/// `struct virtio_blk_config` up to seg_max: capacity (le64), size_max
/// (le32), seg_max (le32).
pub const CONFIG_LEN: usize = 16;
