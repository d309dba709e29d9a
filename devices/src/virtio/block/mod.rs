//! A virtio-blk device (virtio 1.2 section 5.2) over a host file: how the
//! guest gets its image root (docs/images.md), read-only, and a named
//! sandbox its disk (docs/sandboxes.md), writable.
//!
//! No maintained crate parses block requests, so this follows
//! Firecracker's `devices/virtio/block` as the model, cut down to what the
//! two need: IN (read), GET_ID, and on a writable disk OUT (`pwrite`) and
//! FLUSH (`fdatasync`). On a read-only disk OUT is refused with IOERR and
//! FLUSH is a no-op; every other type is UNSUPP. Every length the guest
//! gives is checked (request.rs) before a byte of the file is touched.
//!
//! The capacity the guest sees is normally the file's size. A device made
//! with [`new_with_capacity`] advertises more: the file lies at the disk's
//! start and every sector past its end (inside the capacity) reads as
//! zeros, so disks of one capacity look alike to the guest whatever file
//! is behind them (a VM template's root disk).
//!
//! Threads: the [`Block`] half sits behind the MMIO transport (vCPU
//! threads); the [`BlockHandler`] half is an event-loop subscriber that
//! serves the one request queue. Requests are served synchronously with
//! positional reads and writes (`pread`, `pwrite`) of the file, so none is
//! ever in flight between two events: a snapshot needs nothing but the
//! ring positions.

pub mod defs;
mod device;
mod handler;
mod request;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use device::Block;
pub use handler::BlockHandler;

use defs::{ID_BYTES, QUEUE_COUNT, SECTOR_SIZE};
use device::Shared;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the disk image cannot be read: {0}")]
    Metadata(io::Error),
    #[error("the disk image is {0} bytes, not a whole number of 512-byte sectors")]
    NotSectorAligned(u64),
    #[error("the disk image is empty")]
    Empty,
    #[error("the disk image is {len} bytes, more than the disk's capacity of {sectors} 512-byte sectors")]
    LargerThanCapacity { len: u64, sectors: u64 },
    #[error("a disk of {0} sectors is larger than any file can be")]
    CapacityTooLarge(u64),
    #[error("the disk id {0:?} is longer than {ID_BYTES} bytes")]
    IdTooLong(String),
    #[error("virtio-blk needs {QUEUE_COUNT} queue eventfd, got {0}")]
    QueueEvents(usize),
    #[error("cannot create the virtio-blk wakeup eventfd: {0}")]
    EventFd(io::Error),
}

/// The device (for the MMIO transport) and its event-loop handler. `file`
/// is the disk, opened read-only by the caller; `id` is what GET_ID
/// answers (the guest shows it as /sys/block/vdX/serial); `queue_evts`
/// holds the request queue's notification eventfd. The capacity is the
/// file's size.
pub fn new(file: File, id: &str, queue_evts: Vec<EventFd>) -> Result<(Block, BlockHandler), Error> {
    let len = image_len(&file)?;
    new_with_capacity(file, id, queue_evts, len / SECTOR_SIZE)
}

/// As [`new`], but the guest sees a disk of `sectors` 512-byte sectors,
/// at least the file's size: the file's bytes first, then zeros up to
/// the capacity. Reads past the capacity are I/O errors, as with [`new`].
/// The snapshot names this capacity, not the file's size.
pub fn new_with_capacity(
    file: File,
    id: &str,
    queue_evts: Vec<EventFd>,
    sectors: u64,
) -> Result<(Block, BlockHandler), Error> {
    let len = image_len(&file)?;
    if sectors.checked_mul(SECTOR_SIZE).is_none() {
        return Err(Error::CapacityTooLarge(sectors));
    }
    if len > sectors * SECTOR_SIZE {
        return Err(Error::LargerThanCapacity { len, sectors });
    }
    if id.len() > ID_BYTES {
        return Err(Error::IdTooLong(id.to_string()));
    }
    let [queue_evt]: [EventFd; QUEUE_COUNT] = queue_evts
        .try_into()
        .map_err(|v: Vec<EventFd>| Error::QueueEvents(v.len()))?;
    build(file, id, queue_evt, len, sectors, false)
}

/// A writable disk over `file` (opened read-write by the caller): the
/// capacity is the file's size, and the guest's writes go to the file.
pub fn new_writable(
    file: File,
    id: &str,
    queue_evts: Vec<EventFd>,
) -> Result<(Block, BlockHandler), Error> {
    let len = image_len(&file)?;
    if id.len() > ID_BYTES {
        return Err(Error::IdTooLong(id.to_string()));
    }
    let [queue_evt]: [EventFd; QUEUE_COUNT] = queue_evts
        .try_into()
        .map_err(|v: Vec<EventFd>| Error::QueueEvents(v.len()))?;
    build(file, id, queue_evt, len, len / SECTOR_SIZE, true)
}

fn build(
    file: File,
    id: &str,
    queue_evt: EventFd,
    len: u64,
    sectors: u64,
    writable: bool,
) -> Result<(Block, BlockHandler), Error> {
    let wake = EventFd::new(EFD_NONBLOCK).map_err(Error::EventFd)?;
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new(None));
    let device = Block::new(
        id.to_string(),
        sectors,
        writable,
        shared.clone(),
        wake.try_clone().map_err(Error::EventFd)?,
    );
    let disk = request::Disk::new(file, id, len, sectors, writable);
    let handler = BlockHandler::new(shared, wake, queue_evt, disk);
    Ok((device, handler))
}

/// The file's length: not empty, whole sectors.
fn image_len(file: &File) -> Result<u64, Error> {
    let len = file.metadata().map_err(Error::Metadata)?.len();
    if len == 0 {
        return Err(Error::Empty);
    }
    if !len.is_multiple_of(SECTOR_SIZE) {
        return Err(Error::NotSectorAligned(len));
    }
    Ok(len)
}
