//! A virtio-balloon device (virtio 1.2 section 5.5) for one thing only:
//! **free page reporting** (VIRTIO_BALLOON_F_FREE_PAGE_REPORTING), so that
//! memory a long-lived guest frees goes back to the host (docs/sandboxes.md).
//!
//! Linux's page_reporting hands the device blocks of free guest pages
//! (of pageblock order: 4 MiB on the guest kernel mvm builds, which has
//! no huge pages), up to 32 as the buffers of one chain on the reporting
//! queue, and does not reuse them
//! until the chain comes back used. The device frees each block's host
//! memory ([`discard`]: `MADV_DONTNEED` for private guest memory,
//! `MADV_REMOVE` for the shared memfd a vhost-user backend maps too); the
//! guest's next touch of those pages faults in zeros (or, for memory
//! mapped privately from a template, the template's page), which is all a
//! free page promises.
//!
//! The balloon itself is never inflated: `num_pages` stays 0, so the
//! driver never sends pages on the inflate queue; a driver that does
//! anyway gets its buffers back untouched. Statistics and free page
//! hinting are not offered, so the queues are inflate (0), deflate (1)
//! and reporting (2): Linux numbers only the queues it sets up (the
//! spec's table, which counts every optional queue, puts reporting at 4).
//!
//! Threads: [`Balloon`] sits behind the MMIO transport (vCPU threads);
//! [`BalloonHandler`] is the event-loop subscriber that serves the queues.
//! Chains are served synchronously, so none is in flight between events
//! and a snapshot needs only the ring positions and `actual`.

mod device;
pub mod discard;
mod handler;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use device::Balloon;
pub use handler::BalloonHandler;

use device::Shared;

/// inflate, deflate, reporting.
pub const QUEUE_COUNT: usize = 3;
/// Linux refuses a reporting queue shorter than PAGE_REPORTING_CAPACITY
/// (32): one report is at most that many blocks, one descriptor each.
pub const QUEUE_SIZE: u16 = 64;
/// The reporting queue's index (no stats or hinting queue before it).
pub const REPORTING_QUEUE: usize = 2;
/// VIRTIO_BALLOON_F_FREE_PAGE_REPORTING (virtio 1.2, 5.5.3).
pub const VIRTIO_BALLOON_F_FREE_PAGE_REPORTING: u32 = 5;
/// `struct virtio_balloon_config` up to `actual`: num_pages, actual (le32).
pub const CONFIG_LEN: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("virtio-balloon needs {QUEUE_COUNT} queue eventfds, got {0}")]
    QueueEvents(usize),
    #[error("cannot create the virtio-balloon wakeup eventfd: {0}")]
    EventFd(io::Error),
}

/// The device (for the MMIO transport) and its event-loop handler;
/// `queue_evts` holds the three queues' notification eventfds.
pub fn new(queue_evts: Vec<EventFd>) -> Result<(Balloon, BalloonHandler), Error> {
    let queue_evts: [EventFd; QUEUE_COUNT] = queue_evts
        .try_into()
        .map_err(|v: Vec<EventFd>| Error::QueueEvents(v.len()))?;
    let wake = EventFd::new(EFD_NONBLOCK).map_err(Error::EventFd)?;
    let shared: Arc<Mutex<Shared>> = Arc::new(Mutex::new(None));
    let device = Balloon::new(shared.clone(), wake.try_clone().map_err(Error::EventFd)?);
    let handler = BalloonHandler::new(shared, wake, queue_evts);
    Ok((device, handler))
}
