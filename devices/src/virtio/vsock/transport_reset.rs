//! The transport reset a restored device owes its driver (virtio 1.2
//! section 5.10.6.6, VIRTIO_VSOCK_EVENT_TRANSPORT_RESET): the host ends of
//! the guest's connections did not survive the snapshot (they are host
//! resources, never saved), so the guest must drop them before the host
//! opens new ones. Linux does, on the event: every connected socket is
//! closed with ECONNRESET, listening ones stay.
//!
//! Order matters: a host connection whose request the guest took before
//! it handled the event would be reset with the stale ones. So from the
//! restore until the driver has handled the event, no packet goes to the
//! guest. The driver says it has by giving the event's buffer back: Linux
//! refills the event queue (and notifies it) only after handling every
//! event it found there.

use std::io::Write;
use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::QueueT;

use super::defs::EVQ;
use super::device::Active;

/// `struct virtio_vsock_event { le32 id; }` with id 0.
const EVENT_TRANSPORT_RESET: [u8; 4] = 0u32.to_le_bytes();

/// Where a device stands with the transport reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum TransportReset {
    /// Nothing owed: a booted device, or the driver has handled the event.
    #[default]
    None,
    /// Restored: the event is to be sent as soon as the driver has a
    /// buffer for it; packets for the guest wait.
    Owed,
    /// Sent in the last of `given_back` buffers the device gave back,
    /// when the event queue's available index stood at `avail` (read
    /// before the first was given back); packets for the guest wait until
    /// the driver has put as many back (Linux refills each buffer after
    /// handling its event, in order).
    Sent {
        avail: Wrapping<u16>,
        given_back: u16,
    },
}

impl TransportReset {
    /// Whether packets may go to the guest.
    pub fn rx_allowed(self) -> bool {
        self == TransportReset::None
    }

    /// One step on the running device: sends the event when owed (and
    /// signals the queue), notices the driver's refill once sent.
    pub fn advance(self, active: &mut Active) -> Self {
        match self {
            TransportReset::None => self,
            TransportReset::Owed => send(active).unwrap_or(self),
            TransportReset::Sent { avail, given_back } => {
                let Active { mem, queues, .. } = active;
                match queues[EVQ].avail_idx(&*mem, Ordering::Acquire) {
                    Ok(now) if (now - avail).0 >= given_back => TransportReset::None,
                    _ => self,
                }
            }
        }
    }
}

/// Puts the event in the driver's first event buffer that can hold it;
/// None while the driver has no such buffer (a driver that offers one
/// notifies the queue, and the handler comes back). A buffer too short
/// for the event goes back empty, as the driver expects for one it
/// cannot use. The available index is read before any buffer goes back:
/// read after, it could already count the driver's refill, and the wait
/// for that refill would never end.
fn send(active: &mut Active) -> Option<TransportReset> {
    let Active {
        mem,
        queues,
        interrupt,
    } = active;
    let evq = &mut queues[EVQ];
    let avail = evq.avail_idx(&*mem, Ordering::Acquire).ok()?;
    let mut given_back = 0u16;
    let sent = loop {
        let Some(chain) = evq.pop_descriptor_chain(&*mem) else {
            break false;
        };
        let head = chain.head_index();
        let written = chain
            .writer(&*mem)
            .ok()
            .filter(|w| w.available_bytes() >= EVENT_TRANSPORT_RESET.len())
            .and_then(|mut w| w.write_all(&EVENT_TRANSPORT_RESET).ok())
            .is_some();
        let len = match written {
            true => EVENT_TRANSPORT_RESET.len() as u32,
            false => 0,
        };
        if evq.add_used(&*mem, head, len).is_err() {
            break false;
        }
        given_back += 1;
        if written {
            break true;
        }
    };
    if given_back > 0 {
        // The driver takes the buffers on this interrupt; a full irqfd
        // counter means one is pending anyway.
        let _ = interrupt.signal_used_queue();
    }
    // Buffers given back empty before the event's are refilled too: the
    // count covers them. Without the event sent, it is still owed.
    sent.then_some(TransportReset::Sent { avail, given_back })
}
