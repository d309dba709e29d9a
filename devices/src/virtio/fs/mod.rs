//! virtio-fs (virtio 1.2 section 5.11) as a vhost-user frontend: the guest
//! sees a virtio-fs device on virtio-mmio; the FUSE requests in its queues
//! are served by a separate `virtiofsd` process that maps guest memory
//! itself (the memory table, sent once at activation) and talks to the
//! queues directly.
//!
//! The VMM's part is small on purpose: it offers the backend's features,
//! answers config-space reads (the tag the guest mounts by) and hands the
//! backend the rings the driver set up. The queue-notify ioeventfds go to
//! the backend as its kick fds and the device's irqfd as its call fd (the
//! InterruptStatus register always shows "used buffers", see
//! [`Interrupt::with_vring_always_set`]), so neither a request nor its
//! completion passes through the VMM at all. Whatever the guest may do to a shared
//! directory is decided by virtiofsd (read-only, sandbox, uid translation);
//! see docs/security.md.
//!
//! Threads: [`VhostUserFs`] sits behind the MMIO transport (vCPU threads)
//! and speaks vhost-user synchronously during activation and reset;
//! [`FsHandler`] is an event-loop subscriber that reports a backend that
//! hung up.

pub mod defs;
mod device;
mod handler;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vhost::vhost_user::Frontend;
use vmm_sys_util::eventfd::EventFd;

pub use device::{BackendMemory, SharedWindow, VhostUserFs};
pub use handler::FsHandler;

use crate::virtio::Interrupt;
use defs::{QUEUE_COUNT, TAG_MAX_LEN};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("virtio-fs tag '{0}' must be 1 to {TAG_MAX_LEN} bytes")]
    BadTag(String),
    #[error("virtio-fs needs {QUEUE_COUNT} queue eventfds, got {0}")]
    QueueEvents(usize),
    #[error("cannot create a virtio-fs eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("the virtio-fs backend refused {step}: {source}")]
    Backend {
        step: &'static str,
        source: vhost::Error,
    },
    #[error("the virtio-fs backend lacks VIRTIO_F_VERSION_1")]
    NotModern,
}

/// Connects the device to a backend already listening on `stream`'s other
/// end: claims the backend (SET_OWNER), learns its features and returns the
/// device (for the MMIO transport) and its event-loop handler. `kick_evts`
/// are the queue-notify eventfds (hiprio, request); `interrupt` must come
/// from [`Interrupt::with_vring_always_set`], its irqfd goes to the backend;
/// `on_hangup` is what to do if the backend goes away while the VM runs
/// (called once, with the reason).
pub fn new(
    tag: &str,
    stream: UnixStream,
    kick_evts: Vec<EventFd>,
    interrupt: &Interrupt,
    on_hangup: Box<dyn FnMut(String) + Send>,
) -> Result<(VhostUserFs, FsHandler), Error> {
    if tag.is_empty() || tag.len() > TAG_MAX_LEN {
        return Err(Error::BadTag(tag.to_string()));
    }
    if kick_evts.len() != QUEUE_COUNT {
        return Err(Error::QueueEvents(kick_evts.len()));
    }
    let call_evt = interrupt.irqfd().try_clone().map_err(Error::EventFd)?;
    let frontend = Frontend::from_stream(stream, QUEUE_COUNT as u64);
    let socket_fd = frontend.as_raw_fd();
    let device = VhostUserFs::connect(tag, frontend, kick_evts, call_evt)?;
    let handler = FsHandler::new(socket_fd, on_hangup);
    Ok((device, handler))
}
