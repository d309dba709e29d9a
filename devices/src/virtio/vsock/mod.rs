//! virtio-vsock in Firecracker's "hybrid" model: the guest sees a vsock
//! device (virtio 1.2 section 5.10); the host side is a Unix socket the VMM
//! listens on, not the host kernel's vsock.
//!
//! A host client connects to the Unix socket and writes `CONNECT <port>\n`.
//! The device sends OP_REQUEST from host CID 2 and a fresh host port
//! (counting up from 2^30) to guest port `<port>`. If the guest accepts
//! (OP_RESPONSE) the client reads `OK <host port>\n` and from then on the
//! socket is a byte stream to the guest's socket; if the guest refuses
//! (OP_RST) the socket is closed. Half-closes travel both ways (see
//! `connection.rs`), and flow control follows the spec's credit scheme, so
//! neither a slow guest nor a slow client makes the VMM buffer more than
//! [`defs::CONN_BUF_SIZE`] per connection.
//!
//! The host opens connections, except to the ports the VMM serves for
//! the guest ([`GuestPort`], e.g. the egress proxy's): a guest OP_REQUEST
//! to one of those is accepted when the device can connect to that port's
//! Unix socket, one stream per guest connection. Every other guest
//! OP_REQUEST is refused with OP_RST: the guest gets no channel to the
//! host but those.
//!
//! A host client in the VMM's own process can also be handed over without
//! the socket file: [`Dialer`] (a socket pair), so that the exec client,
//! once confined, needs no `connect`.
//!
//! Threads: the [`Vsock`] half sits behind the MMIO transport (vCPU
//! threads); the [`VsockHandler`] half is an event-loop subscriber that
//! owns the sockets and serves the queues. They share only the active
//! queues, under one Mutex.
//!
//! Writing to a client that has gone raises SIGPIPE; Rust programs ignore it
//! from startup, so the write fails with EPIPE and the connection is reset.

mod connection;
pub mod defs;
mod device;
#[cfg(test)]
mod dialer_tests;
#[cfg(test)]
mod guest_port_tests;
mod handler;
mod handshake;
mod header;
mod muxer;
#[cfg(test)]
mod test_driver;
#[cfg(test)]
mod tests;
mod transport_reset;
mod unix_connect;

use std::io;
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use device::Vsock;
pub use handler::{Dialer, VsockHandler};
pub use muxer::GuestPort;

use defs::{CID_ANY, HOST_CID, QUEUE_COUNT};
use device::Shared;
use muxer::Muxer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("vsock guest CID {0} is reserved: use a CID from 3 to 4294967294")]
    InvalidCid(u64),
    #[error("vsock needs {QUEUE_COUNT} queue eventfds, got {0}")]
    QueueEvents(usize),
    #[error("cannot create the vsock wakeup eventfd: {0}")]
    EventFd(io::Error),
    #[error("cannot make the vsock Unix socket non-blocking: {0}")]
    Listener(io::Error),
}

/// The device (for the MMIO transport) and its event-loop handler (for the
/// VMM's event loop). `listener` is the bound Unix socket host clients
/// connect to; `queue_evts` (rx, tx, event) are the eventfds the queue
/// notifications arrive on; `guest_ports` the host ports the guest may
/// connect to, each served by a Unix socket (none: today's sandbox).
pub fn new(
    guest_cid: u64,
    listener: UnixListener,
    queue_evts: Vec<EventFd>,
    guest_ports: Vec<GuestPort>,
) -> Result<(Vsock, VsockHandler), Error> {
    if guest_cid <= HOST_CID || guest_cid >= CID_ANY {
        return Err(Error::InvalidCid(guest_cid));
    }
    if queue_evts.len() != QUEUE_COUNT {
        return Err(Error::QueueEvents(queue_evts.len()));
    }
    listener.set_nonblocking(true).map_err(Error::Listener)?;
    let wake = EventFd::new(EFD_NONBLOCK).map_err(Error::EventFd)?;
    let shared = Arc::new(Mutex::new(Shared::default()));
    let device = Vsock::new(
        guest_cid,
        shared.clone(),
        wake.try_clone().map_err(Error::EventFd)?,
    );
    let handler = VsockHandler::new(
        shared,
        wake,
        queue_evts,
        listener,
        Muxer::new(guest_cid, guest_ports),
    );
    Ok((device, handler))
}
